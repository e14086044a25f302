"""``loragate rollback`` on an idle fleet of two production replicas, for
``bench/cli_start.py --fleet-runs N``: what the command costs a user when it does real work,
imports included, on each side of the comparison.

One registry (SQLite, made by this tree) holds one adapter name with two signed, validated
versions (``bench/fleet_setup.py``); two vLLM CPU replicas serve it. A timed run is a fresh
process of one side's CLI, ``rollback NAME --json`` with an activation token, until every
replica is verified on the previous version; the promotion back is done in this process and
not timed. Sides alternate ABBA after one untimed warm-up each.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench.fleet_setup import BASE_ID, LOGS, build_setup, log, promote_back, use_fleet
from bench.harness import production_replicas, replicas_obey
from loragate.local.replica import start_replicas, stop_replicas
from loragate.tasks.fleet import promote_and_switch

REPLICAS = 2


def cli_module(code: Path) -> str:
    """The CLI's module on that side: ``loragate.cli.main``, or ``cli.main`` before the package moved."""
    return "loragate.cli.main" if (code / "loragate" / "cli" / "main.py").is_file() else "cli.main"


def run_command(code: Path, env: dict[str, str], argv: list[str], timeout_s: float = 120) -> float:
    """Wall seconds of ``python -m <cli module> *argv`` in ``code``, a fresh process."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", cli_module(code), *argv],
        cwd=code,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"loragate {' '.join(argv)} in {code} exited {proc.returncode}: {proc.stderr.strip()}")
    return elapsed


def bench_fleet_rollback(sides: dict[str, Path], runs: int, work: Path) -> dict[str, list[float]]:
    """Seconds of each side's ``loragate rollback`` on the idle 2-replica fleet, ``runs`` each."""
    setup = build_setup(work, None)
    secrets_dir, _ = replicas_obey(setup.registry)
    adapter_dir = work / "adapters"
    replicas = production_replicas(setup.base, BASE_ID, REPLICAS, adapter_dir, secrets_dir, LOGS, "cli-rollback")
    log(f"starting {REPLICAS} vLLM replicas for loragate rollback")
    start_replicas(replicas)
    try:
        use_fleet(setup, [r.url for r in replicas], adapter_dir)
        for version in (setup.v1, setup.v2):  # production v2, previous v1
            promote_and_switch(setup.registry, version, "canary")
            promote_and_switch(setup.registry, version, "production")
        token = setup.registry.create_token("activation", "bench-cli-rollback")[1]
        envs = {
            side: {**os.environ, **setup.env(), "PYTHONPATH": str(code), "LORAGATE_TOKEN": token}
            for side, code in sides.items()
        }
        samples: dict[str, list[float]] = {side: [] for side in sides}
        order = list(sides)
        for i in range(runs + 1):
            for side in order if i % 2 == 0 else reversed(order):
                took = run_command(sides[side], envs[side], ["rollback", setup.name, "--json"], timeout_s=300)
                promote_back(setup)
                if i:  # the first round is each side's warm-up (bytecode, page cache)
                    samples[side].append(took)
            done = ", ".join(f"{s} {v[-1]:.2f}s" for s, v in samples.items() if v) if i else "warm-up"
            log(f"rollback round {i}/{runs}: {done}")
        return samples
    finally:
        stop_replicas(replicas)
        setup.registry.close()
