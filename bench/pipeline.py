"""From ``loragate.training.completed`` to the adapter serving on the canary replica, in one
run (docs/benchmarks/pipeline.md#event-to-serving-on-the-canary).

Each trial emits the training event for a freshly trained adapter of a new name and polls
the canary replica's ``/v1/models`` until it serves that version; then it reads the three
flow runs the event set off (register, shadow-validate, canary) and their task runs from
the Prefect API, and the validation report from the registry, and splits the time into:

  forward passes   the shadow validation's forward passes (adapter and bare base)
  validation other loading the base, the checks that are not forward passes
  register         the register task (hashing, checks, storing)
  fleet switch     the deploy-canary task (materialize, switch, verify served outputs)
  prefect          everything else: trigger -> flow run created -> picked up by a worker
                   -> flow process started (imports included) -> tasks orchestrated

Three configurations of the same local server, in the same run: worker and runner polls
lowered to 1 s (what ``make demo`` and the tests use) with the pipeline's workers (a warm
worker per pool: ``loragate/local/pipeline.POOLS``); the same with a process worker on every pool
(the peer: a process start per gate); and Prefect's default polls. The target is 8 s for
the whole minus the forward passes on the lowered configuration (issue 18).

    .venv/bin/python -m bench.pipeline [--trials 3] [--process-trials 2] [--default-trials 2] [--smoke]

Prints JSON on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from secrets import token_urlsafe
from typing import Any

from bench.harness import Databases, production_and_canary, serving_path
from kit.basekit import build_base
from kit.modelkit import train_adapter
from kit.tenant_tasks import write_golden_set
from loragate.local.pipeline import PipelineSecrets, start_pipeline
from loragate.local.prefect_local import PrefectServer, start_prefect_server, stop
from loragate.local.replica import start_replicas, stop_replicas
from loragate.local.replica_secrets import ADMIN_KEY_FILE, hand_admin_key, replica_registry_url, write_replica_secrets
from loragate.registry.rules.access import Principal, Role
from loragate.registry.rules.fleet import version_path
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from loragate.registry.storage.signing import generate_key_pair

TARGET_S = 8.0
# Prefect 3.8's own defaults, set explicitly so the worker does not inherit the lowered ones
DEFAULT_POLLS = {
    "PREFECT_WORKER_QUERY_SECONDS": "10",
    "PREFECT_WORKER_PREFETCH_SECONDS": "10",
    "PREFECT_RUNNER_POLL_FREQUENCY": "10",
}


def log(message: str) -> None:
    print(f"[pipeline bench] {message}", file=sys.stderr, flush=True)


def _seconds(a, b) -> float | None:
    return None if a is None or b is None else round((b - a).total_seconds(), 3)


def flow_breakdown(server: PrefectServer, since: float, name: str, version_id: str) -> dict[str, Any]:
    """The flow runs of one trial and where their time went, from the Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.settings import temporary_settings

    wanted = {
        "register": lambda p: p.get("name") == name,
        "shadow-validate": lambda p: True,
        "canary": lambda p: p.get("version_id") == version_id,
    }
    out: dict[str, Any] = {}
    with temporary_settings(server.client_settings()), get_client(sync_client=True) as client:
        runs = client.read_flow_runs(limit=200)
        for flow_name, matches in wanted.items():
            flow_id = client.read_flow_by_name(flow_name).id
            mine = sorted(
                (
                    r
                    for r in runs
                    if r.flow_id == flow_id and r.created and r.created.timestamp() >= since and matches(r.parameters)
                ),
                key=lambda r: r.created,
            )
            if not mine:
                continue
            run = mine[0]
            tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
            task_s = {t.name.rsplit("-", 1)[0]: _seconds(t.start_time, t.end_time) or 0.0 for t in tasks}
            out[flow_name] = {
                "created_s": round(run.created.timestamp() - since, 3),
                "pickup_s": _seconds(run.created, run.start_time),
                "run_s": _seconds(run.start_time, run.end_time),
                "tasks_s": task_s,
                "ended_s": round(run.end_time.timestamp() - since, 3) if run.end_time else None,
            }
    return out


def event_hops(server: PrefectServer, since: float, name: str) -> list[dict[str, Any]]:
    """Each event of the trial that set off a gate, and where its time went on the way to
    the next flow run: emitted (``occurred``, the emitter's clock) -> received by the server
    -> the deployment trigger fired (its ``action.triggered`` event) -> the run-deployment
    action done (``action.executed``: the flow run exists). Seconds from the trial's start."""
    from datetime import UTC, datetime

    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter
    from prefect.settings import temporary_settings

    from loragate.flows import events

    start = datetime.fromtimestamp(since - 1, tz=UTC)

    def page(names: list[str], **fields: Any) -> list[Any]:
        flt = EventFilter(occurred=EventOccurredFilter(since=start), event=EventNameFilter(name=names), **fields)
        return list(client.read_events(filter=flt, limit=50).events)  # the API's maximum

    def at(moment) -> float:
        return round(moment.timestamp() - since, 3)

    def read() -> list[dict[str, Any]]:
        announced = page([events.TRAINING_COMPLETED, events.REGISTERED, events.VALIDATED])
        mine = [e for e in announced if e.resource.get("prefect.resource.name") == name]
        actions = page(["prefect.automation.action.triggered", "prefect.automation.action.executed"])
        hops = []
        for event in sorted(mine, key=lambda e: e.occurred):
            caused = [a for a in actions if f"prefect.event.{event.id}" in {r.id for r in a.related}]
            fired = [a.occurred for a in caused if a.event.endswith(".triggered")]
            done = [a.occurred for a in caused if a.event.endswith(".executed")]
            hops.append(
                {
                    "event": event.event,
                    "occurred_s": at(event.occurred),
                    "received_s": at(event.received),
                    "trigger_fired_s": at(min(fired)) if fired else None,
                    "run_created_s": at(min(done)) if done else None,
                }
            )
        return hops

    # the server persists events in batches: the last hop's action events may still be on their way
    deadline = time.monotonic() + 20
    with temporary_settings(server.client_settings()), get_client(sync_client=True) as client:
        while True:
            hops = read()
            if (len(hops) == 3 and all(h["run_created_s"] is not None for h in hops)) or time.monotonic() > deadline:
                return hops
            time.sleep(1.0)


def trial(
    pipeline, registry: Registry, canary_url: str, adapter_dir: Path, bundle: Path, golden: Path, admin_key: str
) -> dict:
    from prefect.events.worker import EventsWorker
    from prefect.settings import temporary_settings

    from loragate.flows.events import announce_training_completed

    name = f"b{uuid.uuid4().hex[:6]}/tiny-llama/support"
    t0 = time.time()
    with temporary_settings(pipeline.server.client_settings()):
        announce_training_completed(str(bundle), name, {"bench": True}, str(golden))
        EventsWorker.drain_all(timeout=30, at_exit=False)
    deadline = time.monotonic() + 300
    while True:
        path = serving_path(canary_url, name, admin_key)
        if path is not None:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"{name} not served on the canary after 300 s (logs under {pipeline.server.home})")
        time.sleep(0.05)
    total = time.time() - t0
    version_id = Path(path).name
    assert path == version_path(str(adapter_dir), name, version_id)
    report = registry.validation_runs(version_id)[-1].report
    time.sleep(2)  # let the canary flow run finish and report its end
    flows = flow_breakdown(pipeline.server, t0, name, version_id)
    hops = event_hops(pipeline.server, t0, name)
    forward = report.timing.get("forward_s", 0.0) + report.timing.get("base_forward_s", 0.0)
    validate_task = flows.get("shadow-validate", {}).get("tasks_s", {}).get("shadow-validate", 0.0)
    register_task = flows.get("register", {}).get("tasks_s", {}).get("register-bundle", 0.0)
    switch_task = flows.get("canary", {}).get("tasks_s", {}).get("deploy-canary", 0.0)
    split = {
        "forward_passes_s": round(forward, 3),
        "validation_other_s": round(max(0.0, validate_task - forward), 3),
        "register_s": round(register_task, 3),
        "fleet_switch_s": round(switch_task, 3),
        "prefect_s": round(total - validate_task - register_task - switch_task, 3),
    }
    return {
        "name": name,
        "version_id": version_id,
        "event_to_canary_serving_s": round(total, 3),
        "minus_forward_passes_s": round(total - forward, 3),
        "split": split,
        "flows": flows,
        "event_hops": hops,
    }


def run_configuration(
    label,
    polls,
    trials,
    bundles,
    golden,
    base_dir,
    canary,
    replicas,
    out: Path,
    *,
    warm_workers: bool = True,
    prefect_on_postgres: bool = False,
) -> dict:
    home = out / label
    settings_env = {
        "LORAGATE_HOME": str(home),
        "LORAGATE_DATABASE_URL": f"sqlite:///{home / 'registry.db'}",
        "LORAGATE_ARTIFACTS": str(home / "artifacts"),
        "LORAGATE_ACTOR": "bench",
        "HF_HUB_OFFLINE": "1",
        "LORAGATE_CANARY_WINDOW_S": "3600",
        **polls,
    }
    settings = Settings(  # init writes the windows' thresholds from these: the pools' window length
        home=home,
        database_url=settings_env["LORAGATE_DATABASE_URL"],
        artifacts=settings_env["LORAGATE_ARTIFACTS"],
        canary_window_s=float(settings_env["LORAGATE_CANARY_WINDOW_S"]),
    )
    registry = Registry.open(settings, check_schema=False, principal=Principal.in_process("bench"))
    registry.init()
    registry.add_base(str(base_dir), "tiny-llama")
    # the replicas read this configuration's registry (no owner-moves: only the pipeline moves
    # versions, through the canary pool); the pools that switch them hold their admin key
    [replica_secrets] = {r.secrets_dir for r in replicas}
    admin_key = (replica_secrets / ADMIN_KEY_FILE).read_text()
    write_replica_secrets(replica_secrets, admin_key, replica_registry_url(settings.database_url))
    for r in replicas:
        registry.add_replica(r.url, "tiny-llama", r.role, str(r.adapter_dir))
    tokens = {role: registry.create_token(role.value, f"pipeline-{role.value}", pipeline=True)[1] for role in Role}
    key = generate_key_pair()
    registry.add_signing_key(key.public_pem, "signing", "pipeline")
    log(f"{label}: starting a Prefect server, deploying, starting workers")
    results = []
    # undone in reverse, whichever step fails: the workers, the server, its database, the registry
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(registry.close)
        t0 = time.monotonic()
        databases = Databases.create("pipeline", "prefect") if prefect_on_postgres else None
        if databases is not None:
            cleanup.callback(databases.drop)
        server = start_prefect_server(
            home / "prefect", database_url=databases.prefect_url("prefect") if databases else None
        )
        cleanup.callback(stop, server)
        secrets = PipelineSecrets(tokens, key.private_pem)
        pipeline = start_pipeline(
            home / "prefect", settings_env, secrets, evaluate_every_s=3600, server=server, warm_workers=warm_workers
        )
        cleanup.callback(pipeline.stop)
        hand_admin_key(pipeline.secret_dirs, admin_key)  # canary, release and fleet pools only
        setup_s = time.monotonic() - t0
        log(f"{label}: every pool's worker online after {pipeline.wait_for_workers():.1f} s")
        for i in range(trials):
            result = trial(pipeline, registry, canary.url, canary.adapter_dir, bundles[len(results)], golden, admin_key)
            log(
                f"{label} trial {i + 1}: {result['event_to_canary_serving_s']:.1f}s "
                f"({result['minus_forward_passes_s']:.1f}s minus forward passes) {result['split']}"
            )
            results.append(result)
    totals = [r["event_to_canary_serving_s"] for r in results]
    minus = [r["minus_forward_passes_s"] for r in results]
    return {
        "polls": polls or "lowered to 1 s (loragate/local/prefect_local.py FAST_POLL_ENV)",
        "workers": "warm where loragate/local/pipeline.POOLS says" if warm_workers else "a process worker per pool",
        "prefect_database": "postgres" if prefect_on_postgres else "sqlite",
        "server_deploy_workers_setup_s": round(setup_s, 1),
        "trials": results,
        "median_event_to_canary_serving_s": round(statistics.median(totals), 3),
        "median_minus_forward_passes_s": round(statistics.median(minus), 3),
        "median_split_s": {k: round(statistics.median(r["split"][k] for r in results), 3) for k in results[0]["split"]},
        "median_event_hop_s": hop_medians(results),
    }


def hop_medians(results: list[dict]) -> dict[str, dict[str, float]]:
    """Per announcing event, the median of each step on its way to the next flow run."""
    steps = {
        "to_server_s": ("occurred_s", "received_s"),
        "to_trigger_s": ("received_s", "trigger_fired_s"),
        "trigger_action_s": ("trigger_fired_s", "run_created_s"),
    }
    out: dict[str, dict[str, float]] = {}
    for name in {h["event"] for r in results for h in r["event_hops"]}:
        hops = [h for r in results for h in r["event_hops"] if h["event"] == name]
        out[name] = {
            step: round(statistics.median(h[b] - h[a] for h in hops if h[a] is not None and h[b] is not None), 3)
            for step, (a, b) in steps.items()
            if any(h[a] is not None and h[b] is not None for h in hops)
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--default-trials", type=int, default=2)
    parser.add_argument(
        "--process-trials", type=int, default=2, help="lowered polls, a process worker per pool (the peer)"
    )
    parser.add_argument(
        "--postgres-trials", type=int, default=3, help="lowered polls, warm workers, the Prefect server on Postgres"
    )
    parser.add_argument("--smoke", action="store_true", help="one trial, lowered polls only")
    args = parser.parse_args()
    if args.smoke:
        args.trials, args.default_trials, args.process_trials, args.postgres_trials = 1, 0, 0, 0
    out = Path(tempfile.mkdtemp(prefix="loragate-pipeline-bench-"))
    log(f"working under {out}")
    base_dir = build_base(out / "tiny-llama")
    golden = write_golden_set("support", out / "golden.jsonl")
    count = args.trials + args.default_trials + args.process_trials + args.postgres_trials
    bundles = [train_adapter(base_dir, "support", out / f"adapter-{i}", seed=100 + i) for i in range(count)]
    adapter_dir = out / "adapters"
    # each configuration's registry is its own: its URL is written there when it is made
    replica_secrets = write_replica_secrets(out / "replica-secrets", token_urlsafe(32))
    replicas = production_and_canary(base_dir, "tiny-llama", adapter_dir, out, replica_secrets)
    log("starting a production and a canary vLLM replica")
    start_replicas(replicas)
    canary = replicas[1]
    try:
        results: dict[str, Any] = {}
        used = 0
        for key, label, polls, trials, options in (
            ("lowered_polls", "lowered", {}, args.trials, {}),
            ("lowered_polls_prefect_on_postgres", "postgres", {}, args.postgres_trials, {"prefect_on_postgres": True}),
            ("lowered_polls_process_workers", "process", {}, args.process_trials, {"warm_workers": False}),
            ("default_polls", "default", DEFAULT_POLLS, args.default_trials, {}),
        ):
            if trials:
                batch = bundles[used : used + trials]
                results[key] = run_configuration(
                    label, polls, trials, batch, golden, base_dir, canary, replicas, out, **options
                )
                used += trials
    finally:
        stop_replicas(replicas)
    lowered = results["lowered_polls"]["median_minus_forward_passes_s"]
    on_postgres = results.get("lowered_polls_prefect_on_postgres", {}).get("median_minus_forward_passes_s")
    print(
        json.dumps(
            {
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "target_minus_forward_passes_s": TARGET_S,
                "target_met": lowered < TARGET_S,
                "target_met_prefect_on_postgres": None if on_postgres is None else on_postgres < TARGET_S,
                **results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
