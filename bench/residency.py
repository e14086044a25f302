"""Adapter residency on one production replica (``docs/benchmarks/residency.md``): K adapters
in production on one base, a Zipf workload over A of them (the top 10 about 60 % of
requests), the same registry, workload and seed for each way the replica is set up:

- ``lru_today``: vLLM's plain LRU with today's slots (4 slots, 16 cache entries), no guard;
- ``planned``: the slots ``loragate fleet plan`` computes for the fleet, no guard;
- ``planned_pinned_guarded``: the planned slots, the top 10 pinned, the guard's defaults
  (30 s minimum residency, 5 evictions a minute);
- ``today_pinned_guarded``: today's slots, as many of the top adapters pinned as they leave
  (``rules/pinning.hot_limit``: 4 slots - 1 = 3), the guard's defaults -- memory too small
  for the spread, where the guard and the pins must do the work.

Each way: a fresh replica, reconciled (K loads), the pins applied and waited for, then the
workload; hit rate, time to first token p95 warm and cold, cold-load p50/p99 (the replica's
own figure), evictions per minute, the base's share and the pinned adapters' cold loads after
their first answer. ``--smoke``: 8 adapters, 60 requests, the last way only.

    .venv/bin/python -m bench.residency [--adapters 1000] [--active 200] [--requests 2000]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path
from typing import Any

import httpx

from bench import residency_workload as workload
from bench.harness import emit, fleet_replica, work_directory
from bench.scale_restart import registry_with_production
from kit.basekit import build_base
from kit.modelkit import train_adapter
from kit.postgres import admin_engine, drop_database
from kit.tenant_tasks import write_golden_set
from loragate.registry.rules.pinning import hot_limit
from loragate.registry.service import Registry
from loragate.tasks.reconcile import reconcile_fleet

BASE_ID = "tiny-llama"
TODAY = {"max_loras": 4, "max_cpu_loras": 16}
GUARD_OFF = {"LORAGATE_MIN_RESIDENCY_S": "0", "LORAGATE_EVICTIONS_PER_MINUTE": "1000000"}
GUARD_DEFAULTS: dict[str, str] = {}
PINNED = 10
SMOKE_SLOTS = {"max_loras": 2, "max_cpu_loras": 4}
SMOKE_PINNED = 2
SMOKE_GUARD = {"LORAGATE_MIN_RESIDENCY_S": "0"}
SEED = 7
PIN_DEADLINE_S = 120.0


def log(message: str) -> None:
    import sys

    print(f"[bench/residency] {message}", file=sys.stderr, flush=True)


def ways(smoke: bool) -> dict[str, dict[str, Any]]:
    if smoke:
        # a cache of 4 for 8 adapters, 2 of them pinned, no minimum residency: evictions up to
        # the cap, then the base -- the pins and the cap at work in a minute
        return {"today_pinned_guarded": {"slots": SMOKE_SLOTS, "env": SMOKE_GUARD, "pins": True}}
    return {
        "lru_today": {"slots": TODAY, "env": GUARD_OFF, "pins": False},
        "planned": {"slots": None, "env": GUARD_OFF, "pins": False},
        "planned_pinned_guarded": {"slots": None, "env": GUARD_DEFAULTS, "pins": True},
        "today_pinned_guarded": {
            "slots": TODAY,
            "env": GUARD_DEFAULTS,
            "pins": True,
            "pin_limit": hot_limit(PINNED, [TODAY["max_loras"]], 0),
        },
    }


def planned_slots(registry: Registry) -> dict[str, int]:
    """What ``loragate fleet plan`` says production replicas of the base need now (the pins
    the registry holds counted)."""
    settings = registry.residency_plan(BASE_ID).settings()
    return {"max_loras": settings["max_loras"], "max_cpu_loras": settings["max_cpu_loras"]}


def residency_figures(url: str, admin_key: str) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=60, headers={workload.ADMIN_HEADER: admin_key}) as admin:
        return admin.get("/loragate/traffic", params={"view": "alerts"}).json().get("residency") or {}


def wait_pinned(url: str, admin_key: str, names: set[str], deadline_s: float = PIN_DEADLINE_S) -> float:
    """Seconds until the replica's guard lists every one of ``names`` as pinned: each is
    asked once (the engine pins only what it holds), then the figures read until then."""
    started = time.monotonic()
    with httpx.Client(base_url=url, timeout=60) as client:
        for name in sorted(names):
            client.post("/v1/completions", json={"model": name, "prompt": "hi", "max_tokens": 1, "user": "pin"})
    while time.monotonic() - started < deadline_s:
        if names <= set(residency_figures(url, admin_key).get("pinned") or ()):
            return round(time.monotonic() - started, 1)
        time.sleep(1.0)
    raise TimeoutError(f"the replica did not pin {sorted(names)} within {deadline_s:.0f} s")


def one_way(
    registry: Registry,
    base_dir: Path,
    label: str,
    setup: dict[str, Any],
    order: list[str],
    hot: list[str],
    work: Path,
) -> dict[str, Any]:
    pinned = set(hot[: setup.get("pin_limit", len(hot))]) if setup["pins"] else set()
    for name in pinned:
        registry.pin(name)
    slots = setup["slots"] or planned_slots(registry)
    try:
        with fleet_replica(registry, base_dir, BASE_ID, label, work, slots, setup["env"]) as (replica, admin_key):
            t = time.monotonic()
            reconcile_fleet(registry)
            reconcile_s = round(time.monotonic() - t, 1)
            pin_s = wait_pinned(replica.url, admin_key, pinned) if pinned else None
            log(f"{label}: reconciled in {reconcile_s} s, pinned in {pin_s} s; {len(order)} requests")
            ran = workload.run(replica.url, admin_key, order)
            figures = residency_figures(replica.url, admin_key)
            result = {
                "slots": slots,
                "guard": {k: figures.get(k) for k in ("min_residency_s", "evictions_per_minute")},
                "evictions_last_minute": figures.get("evictions_last_minute"),
                "reconcile_s": reconcile_s,
                "pinned_after_s": pin_s,
                **workload.summary(ran, pinned, figures),
            }
            log(f"{label}: {result}")
            return result
    finally:
        for name in pinned:
            registry.unpin(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--adapters", type=int, default=1000)
    parser.add_argument("--active", type=int, default=200)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--smoke", action="store_true", help="8 adapters, 60 requests, the guarded way only")
    parser.add_argument("--base", type=Path, help="the tiny base (else one is built)")
    parser.add_argument("--bundle", type=Path, help="a trained support adapter of the base (else one is trained)")
    parser.add_argument("--ways", nargs="+", help="only these ways (default: all)")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    if args.smoke:
        args.adapters, args.active, args.requests = 8, 8, 60
    if not 0 < args.active <= args.adapters:
        parser.error("--active must be between 1 and --adapters")
    wall = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "residency",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "smoke": args.smoke,
        "adapters": args.adapters,
        "active": args.active,
    }
    with work_directory("loragate-bench-residency-") as work:
        base_dir = args.base or build_base(work / "tiny-llama")
        golden = write_golden_set("support", work / "golden.jsonl")
        bundle = args.bundle or train_adapter(base_dir, "support", work / "support")
        t = time.monotonic()
        registry, database = registry_with_production(work, base_dir, bundle, golden, args.adapters)
        result["setup_s"] = round(time.monotonic() - t, 1)
        try:
            names = sorted(a.name for a in registry.adapter_pointers())
            active = names[: args.active]  # ranked hottest first
            order = workload.schedule(active, args.requests, SEED)
            hot = active[: SMOKE_PINNED if args.smoke else PINNED]
            weights = workload.zipf_weights(len(active))
            result["workload"] = {
                "requests": args.requests,
                "zipf_exponent": workload.ZIPF_EXPONENT,
                "top_10_share": round(workload.top_share(weights, 10), 3),
                "seed": SEED,
            }
            result["ways"] = {}
            for label, setup in ways(args.smoke).items():
                if args.ways and label not in args.ways:
                    continue
                try:
                    result["ways"][label] = one_way(registry, base_dir, label, setup, order, hot, work)
                except Exception as e:  # one way that cannot run is a figure; the others still run
                    if args.smoke:
                        raise
                    log(f"{label}: {type(e).__name__}: {e}")
                    result["ways"][label] = {"error": f"{type(e).__name__}: {e}"}
        finally:
            registry.close()
            drop_database(admin_engine(), database)
    result["wall_s"] = round(time.perf_counter() - wall, 1)
    emit(result, args.out)


if __name__ == "__main__":
    main()
