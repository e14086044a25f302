"""Latency sampling and summaries shared by the benchmarks, and waiting for a condition
within a deadline (stdlib only: it runs in both the project venv and the MLflow venv)."""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from typing import Any


def summarize(samples_ns: list[int]) -> dict[str, float | int]:
    """p50 / p90 / p99 (nearest rank), mean and max, in milliseconds."""
    ordered = sorted(samples_ns)
    n = len(ordered)

    def rank(q: float) -> float:
        return ordered[min(n - 1, max(0, math.ceil(q * n) - 1))] / 1e6

    return {
        "n": n,
        "p50_ms": round(rank(0.50), 4),
        "p90_ms": round(rank(0.90), 4),
        "p99_ms": round(rank(0.99), 4),
        "mean_ms": round(sum(ordered) / n / 1e6, 4),
        "max_ms": round(ordered[-1] / 1e6, 4),
    }


def measure(
    op: Callable[..., Any], next_args: Callable[[], tuple], samples: int, warmup: int
) -> dict[str, float | int]:
    """Call ``op(*next_args())`` ``warmup`` times untimed, then time ``samples`` calls.

    Only the call itself is inside the clock; choosing its arguments is not.
    """
    for _ in range(warmup):
        op(*next_args())
    gc.collect()
    timings = []
    for _ in range(samples):
        args = next_args()
        start = time.perf_counter_ns()
        op(*args)
        timings.append(time.perf_counter_ns() - start)
    return summarize(timings)


def spread(samples: list[float]) -> dict[str, Any]:
    """How many, and the first, median and last, in seconds (one decimal)."""
    if not samples:
        return {"n": 0}
    return {
        "n": len(samples),
        "first_s": round(min(samples), 1),
        "median_s": round(statistics.median(samples), 1),
        "last_s": round(max(samples), 1),
    }


def ratio(small: Any, large: Any) -> float | None:
    """large / small, where both are numbers and small is not 0."""
    if isinstance(small, int | float) and isinstance(large, int | float) and small:
        return round(large / small, 2)
    return None


def wait_for(what: str, check: Any, deadline_s: float, every_s: float = 0.5) -> float:
    """Seconds until ``check()`` holds, asked every ``every_s``; SystemExit naming ``what``
    once ``deadline_s`` has passed."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > deadline_s:
            raise SystemExit(f"bench: {what} not within {deadline_s:.0f} s")
        time.sleep(every_s)
    return time.monotonic() - t0
