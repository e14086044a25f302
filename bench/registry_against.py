"""``python -m bench.registry --against REV``: the same benchmark on this tree's code and on an
earlier revision's, alternating on the same machine, databases and Python environment, and
the ratio of every compared figure."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.registry_population import log

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
OUT = BENCH / "out"

COMPARED = {
    "register_new_per_s": (lambda r: r["register"]["new_version"]["per_s"], "higher"),
    "register_again_per_s": (lambda r: r["register"]["identical_bundle_again"]["per_s"], "higher"),
}
COMPARED_AT_SIZE = {
    "resolve_p50_ms": (lambda s: s["store_resolve"]["p50_ms"], "lower"),
    "resolve_p99_ms": (lambda s: s["store_resolve"]["p99_ms"], "lower"),
    "move_p50_ms": (lambda s: s["promote_canary"]["p50_ms"], "lower"),
    "move_p99_ms": (lambda s: s["promote_canary"]["p99_ms"], "lower"),
}
COMPARE_TOLERANCE = 0.10


def _run_side(code: Path, scale_name: str, out: Path) -> dict:
    subprocess.run(
        [sys.executable, "-m", "bench.registry", "--scale", scale_name, "--peers", "none", "--out", str(out)],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "LORAGATE_BENCH_CODE": str(code)},
    )
    return json.loads(out.read_text())["loragate"]


def _figures(runs: list[dict]) -> dict:
    """Median over rounds of every compared figure, by backend (and size)."""
    figures: dict = {}
    for backend in runs[0]:
        for key, (get, _) in COMPARED.items():
            figures[f"{backend}.{key}"] = statistics.median(get(r[backend]) for r in runs)
        for size in runs[0][backend]["sizes"]:
            for key, (get, _) in COMPARED_AT_SIZE.items():
                figures[f"{backend}.{size}.{key}"] = statistics.median(get(r[backend]["sizes"][size]) for r in runs)
    return figures


def compare_with_revision(revision: str, scale_name: str, rounds: int, out: Path | None) -> None:
    """Run this tree's loragate benchmark and REV's, alternating, and report the ratios.

    Both sides are ``--peers none`` runs of this harness on the same machine, databases and
    Python environment, one importing this tree's code, the other REV's (checked out in a
    temporary worktree; ``bench/registry_code.py`` finds its registry, in the ``loragate``
    package or, before the move into it, at the top); rounds alternate which side runs first.
    A figure is within tolerance when it is at most 10 % worse than REV's (median of rounds).
    """
    started = time.perf_counter()
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{revision}^{{commit}}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="loragate-bench-against-") as tmp:
        worktree = Path(tmp) / "before"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(worktree), commit], cwd=ROOT, check=True, capture_output=True
        )
        try:
            before, after = [], []
            sides = [("before", worktree, before), ("after", ROOT, after)]
            for i in range(rounds):
                # ABBA: neither side always runs first, after the other's database drop and load
                for side, root, runs in sides if i % 2 == 0 else reversed(sides):
                    log(f"round {i + 1}/{rounds}: {side} ({commit[:10] if side == 'before' else 'this tree'})")
                    runs.append(_run_side(root, scale_name, Path(tmp) / f"{side}-{i}.json"))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False)
    was, now = _figures(before), _figures(after)
    ratios = {}
    for key in was:
        direction = (COMPARED | COMPARED_AT_SIZE)[key.rsplit(".", 1)[-1]][1]
        worse = was[key] / now[key] if direction == "higher" else now[key] / was[key]
        ratios[key] = {"before": was[key], "after": now[key], "worse_by": round(worse - 1, 3)}
    result = {
        "benchmark": "loragate registry, this tree against an earlier revision",
        "against": commit,
        "scale": scale_name,
        "rounds": rounds,
        "tolerance": COMPARE_TOLERANCE,
        "figures": ratios,
        "within_tolerance": {k: v["worse_by"] <= COMPARE_TOLERANCE for k, v in ratios.items()},
        "wall_s": round(time.perf_counter() - started, 1),
    }
    target = out or OUT / f"registry-against-{commit[:10]}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result, indent=2) + "\n")
    log(f"done in {result['wall_s']}s; written to {target}")
    print(json.dumps(result, indent=2))
