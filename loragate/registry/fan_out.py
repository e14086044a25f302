"""Fan-out: the same work on many things at once -- on every replica of a stage a switch,
a load, a read of its figures; every replica process started or stopped -- each in a
thread of its own, and only then the outcome, once all of them have finished.

Nothing is cancelled when one fails: every piece of work runs to its end (a replica half
switched must be known to be so before anything is put back), and each one's result or the
error it raised is handed back, for its caller to judge -- all or nothing (the fleet
switch), best effort (a warm copy unloaded), one error raised (replicas started).
It lives at the bottom of the layers so the tasks and the local processes share one.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def fan_out(items: Iterable[T], work: Callable[[T], R]) -> list[tuple[T, R | BaseException]]:
    """``work`` on every item at once, one thread each; waits for all, then returns each item
    with its result or the error it raised, in the order they finished."""
    items = list(items)
    if not items:
        return []
    outcomes: list[tuple[T, R | BaseException]] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(items)) as pool:
        futures = {pool.submit(work, item): item for item in items}
        for future in concurrent.futures.as_completed(futures):
            error = future.exception()
            outcomes.append((futures[future], error if error is not None else future.result()))
    return outcomes
