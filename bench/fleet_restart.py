"""A replica's restart to its first correct answer for the name (``bench/fleet.py``'s
``restart`` section): with the loragate resolver, against reconcile alone (no resolver, one
reconcile pass as soon as the replica answers) and against restarting with
``--lora-modules`` at the version, and the failed requests a client saw meanwhile.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.fleet_setup import Setup, log
from loragate.local.replica import VllmReplica
from loragate.registry.errors import ReplicaError
from loragate.registry.rules.fleet import version_path
from loragate.tasks.reconcile import reconcile_fleet
from loragate.tasks.replicas import ReplicaClient

FIRST_CORRECT_DEADLINE_S = 60.0


def first_correct(url: str, setup: Setup, expected: str, before: Callable[[], object] | None = None) -> dict[str, Any]:
    """From the moment the server answers: ask for the name until it answers ``expected``."""
    failed = 0
    started = time.perf_counter()
    if before is not None:
        threading.Thread(target=before, daemon=True).start()
    with ReplicaClient(url, retries=0) as client:
        while True:
            if time.perf_counter() - started > FIRST_CORRECT_DEADLINE_S:
                raise SystemExit(f"bench: {url} did not answer {expected!r} for {setup.name} within a minute")
            try:
                if client.complete(setup.name, setup.prompt, setup.max_tokens).text.strip() == expected:
                    break
            except ReplicaError:
                failed += 1
                time.sleep(0.02)
    return {"after_ready_s": round(time.perf_counter() - started, 3), "failed_requests": failed}


def restart_to_correct(
    replica: VllmReplica, setup: Setup, how: str, make: Callable[[], VllmReplica]
) -> tuple[VllmReplica, dict[str, Any]]:
    expected = setup.answers[setup.production()]
    started = time.perf_counter()
    replica.stop()
    fresh = make()
    fresh.start()
    ready = time.perf_counter() - started
    before = (lambda: reconcile_fleet(setup.registry)) if how == "reconcile alone" else None
    answer = first_correct(fresh.url, setup, expected, before)
    result = {"ready_s": round(ready, 2), **answer, "total_s": round(ready + answer["after_ready_s"], 2)}
    log(f"restart, {how}: {result}")
    return fresh, result


def bench_restarts(setup: Setup, replica: VllmReplica, adapter_dir: Path) -> tuple[VllmReplica, dict[str, Any]]:
    production = setup.production()
    path = version_path(str(adapter_dir), setup.name, production)

    # the original's settings, read once: each restart below replaces ``replica``
    fields = {
        "model_dir": replica.model_dir,
        "served_name": replica.served_name,
        "port": replica.port,
        "adapter_dir": replica.adapter_dir,
        "omp_cpus": replica.omp_cpus,
        "die_with_parent": True,
        "log_path": replica.log_path,
    }

    def like(**changes: Any) -> Callable[[], VllmReplica]:
        return lambda: VllmReplica(**{**fields, **changes})

    results = {}
    replica, results["lora_modules_baseline"] = restart_to_correct(
        replica, setup, "--lora-modules", like(adapter_dir=None, lora_modules={setup.name: path})
    )
    replica, results["reconcile_alone"] = restart_to_correct(replica, setup, "reconcile alone", like(adapter_dir=None))
    replica, results["resolver"] = restart_to_correct(replica, setup, "resolver", like())
    return replica, results
