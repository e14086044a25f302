"""A production replica restarted with K adapters in production (``bench/scale.py``'s
restart section).

For each K: a fresh Postgres registry with K tenants' versions in production (validated
once, the report recorded for each, signed), a fresh production replica added to the
fleet and reconciled (K loads: what a reconcile costs on an empty replica), ``fleet
status`` on the synced fleet, then the replica restarted: time until every adapter
answers a completion with its production version (the resolver loads each on its first
request, from the index reconcile wrote), and a reconcile afterwards (what is left for
it to do).
"""

from __future__ import annotations

import concurrent.futures
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.harness import replicas_obey
from kit.postgres import admin_engine, drop_database, pg_url
from loragate.local.replica import VllmReplica, start_replicas, stop_replicas
from loragate.registry.records.adapters import utcnow
from loragate.registry.rules.access import Principal
from loragate.registry.rules.fleet import version_path
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from loragate.registry.storage.signing import generate_key_pair
from loragate.tasks.fleet import promote_and_switch
from loragate.tasks.reconcile import fleet_status, reconcile_fleet
from loragate.tasks.replicas import ADMIN_KEY_HEADER
from loragate.tasks.validation import ValidationPolicy, validate_versions

BASE_ID = "tiny-llama"
ANSWER_DEADLINE_S = 600.0
CLIENTS = 4


def _log(message: str) -> None:
    import sys

    print(f"[bench/scale restart] {message}", file=sys.stderr, flush=True)


def registry_with_production(
    work: Path,
    base_dir: Path,
    bundle: Path,
    golden: Path,
    k: int,
    others: Sequence[tuple[Path, Path]] = (),
    prefix: str = "r",
) -> tuple[Registry, str]:
    """A Postgres registry with ``k`` adapters in production, ``<prefix>NNNN/tiny-llama/support``:
    adapter ``i`` registers the ``i % n``-th of ``(bundle, golden)`` and ``others`` (a bundle
    and its golden set each, another behaviour each), each bundle validated once."""
    behaviours = [(bundle, golden), *others]
    database = f"loragate_bench_restart_{k}_{uuid.uuid4().hex[:6]}"
    with admin_engine().connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{database}"')
    home = work / f"restart-{k}"
    settings = Settings(home=home, database_url=pg_url(database), artifacts=str(home / "artifacts"), actor="bench")
    registry = Registry.open(settings, check_schema=False, principal=Principal.in_process("bench"))
    registry.init()
    registry.add_base(str(base_dir), BASE_ID)
    key = generate_key_pair()
    registry.add_signing_key(key.public_pem, "signing", "bench")
    reports: dict[int, Any] = {}
    for i in range(k):
        name = f"{prefix}{i:04d}/{BASE_ID}/support"
        which = i % len(behaviours)
        version_id = registry.register_adapter(behaviours[which][0], name).version.version_id
        registry.attach_golden_set(name, behaviours[which][1])
        if which not in reports:  # one validation a bundle: its tenants' versions are the same bytes
            reports[which] = validate_versions(registry, [version_id], ValidationPolicy.from_settings(settings))[0]
        else:
            now = utcnow()
            update = {"version_id": version_id, "name": name, "run_id": None}
            registry.record_validation(version_id, reports[which].model_copy(update=update), now, now)
        registry.sign_version(version_id, key.private_pem)
        promote_and_switch(registry, version_id, "canary")
        promote_and_switch(registry, version_id, "production")
    return registry, database


def _answers_with_production(url: str, name: str, path: str, deadline: float, admin_key: str) -> float:
    """Seconds until ``name`` answers a completion and is served from ``path``."""
    t0 = time.monotonic()
    with httpx.Client(base_url=url, timeout=60) as client:
        while time.monotonic() < deadline:
            try:
                done = client.post("/v1/completions", json={"model": name, "prompt": "hi", "max_tokens": 1})
                keyed = {ADMIN_KEY_HEADER: admin_key}  # a keyless read lists the base alone
                cards = client.get("/v1/models", headers=keyed).json()["data"] if done.status_code == 200 else []
            except (httpx.HTTPError, ValueError, KeyError):
                cards = []
            if any(c["id"] == name and c.get("root") == path for c in cards):
                return time.monotonic() - t0
            time.sleep(0.2)
    raise TimeoutError(f"{name} did not answer from {path}")


def restart_case(base_dir: Path, bundle: Path, golden: Path, work: Path, k: int) -> dict[str, Any]:
    _log(f"K={k}: {k} tenants in production")
    t0 = time.monotonic()
    registry, database = registry_with_production(work, base_dir, bundle, golden, k)
    setup_s = time.monotonic() - t0
    adapter_dir = work / f"restart-{k}-adapters"
    secrets_dir, admin_key = replicas_obey(registry, work / f"restart-{k}-secrets")
    # the slots ``loragate fleet plan`` computes for K: with fewer cache entries than
    # adapters the residency guard answers most of them from the base after a restart, at its
    # 5 evictions a minute, and the replica is not sized for its fleet
    slots = registry.residency_plan(BASE_ID).settings()
    replica = VllmReplica(
        base_dir,
        BASE_ID,
        adapter_dir=adapter_dir,
        secrets_dir=secrets_dir,
        log_path=work / f"restart-{k}.log",
        die_with_parent=True,
        owner_moves=True,
        max_loras=slots["max_loras"],
        max_cpu_loras=slots["max_cpu_loras"],
    )
    try:
        start_replicas([replica])
        registry.add_replica(replica.url, BASE_ID, "production", str(adapter_dir))
        t = time.monotonic()
        states = reconcile_fleet(registry)
        first_reconcile = {"s": round(time.monotonic() - t, 2), "actions": sum(len(s.actions) for s in states)}
        t = time.monotonic()
        status = fleet_status(registry)
        status_s = time.monotonic() - t
        in_sync = all(s.reachable and not s.actions for s in status)
        _log(f"K={k}: reconcile {first_reconcile}, fleet status {status_s:.3f}s (in sync: {in_sync}); restarting")
        replica.restart()
        paths = {a.name: version_path(str(adapter_dir), a.name, a.production) for a in registry.adapter_pointers()}
        deadline = time.monotonic() + ANSWER_DEADLINE_S
        t = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
            firsts = list(
                pool.map(lambda n: _answers_with_production(replica.url, n, paths[n], deadline, admin_key), paths)
            )
        all_answer_s = time.monotonic() - t
        t = time.monotonic()
        states = reconcile_fleet(registry)
        after = {"s": round(time.monotonic() - t, 2), "actions": sum(len(s.actions) for s in states)}
        _log(f"K={k}: all {len(paths)} answer with production after {all_answer_s:.1f}s; reconcile after {after}")
        return {
            "adapters": k,
            "slots": {"max_loras": slots["max_loras"], "max_cpu_loras": slots["max_cpu_loras"]},
            "setup_s": round(setup_s, 1),
            "reconcile_empty_replica": first_reconcile,
            "fleet_status_s": round(status_s, 3),
            "fleet_in_sync": in_sync,
            "restart_all_answer_production_s": round(all_answer_s, 1),
            "answering": len(firsts),
            "clients": CLIENTS,
            "reconcile_after_restart": after,
        }
    finally:
        stop_replicas([replica])
        registry.close()
        drop_database(admin_engine(), database)


def bench_restart(base_dir: Path, bundle: Path, golden: Path, work: Path, sizes: list[int]) -> dict[str, Any]:
    return {str(k): restart_case(base_dir, bundle, golden, work, k) for k in sizes}
