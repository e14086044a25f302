"""One retry policy for every loop that tries again: a bounded number of attempts with a
linear back-off, retrying only the errors the caller names, re-raising the last one as it
was (never a ``RetryError``). Built on tenacity, so a reader sees the policy, not a loop.

Used by the SQL store (a lost compare-and-set; a connection the database refuses while
it is full or restarting), the replica client (a refused or 5xx request) and the fleet
switch (an unreachable replica).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_incrementing, wait_random

T = TypeVar("T")


def policy(attempts: int, *, step_s: float, retry_if: Callable[[BaseException], bool]) -> Retrying:
    """``attempts`` tries in all, waiting ``step_s``, ``2 * step_s``, ... between them, while
    ``retry_if`` says the error is worth another try; the last error is raised as it was."""
    return Retrying(
        stop=stop_after_attempt(max(1, attempts)),
        wait=wait_incrementing(start=step_s, increment=step_s),
        retry=retry_if_exception(retry_if),
        reraise=True,
    )


def call_with_retries(
    fn: Callable[[], T], attempts: int, *, step_s: float, retry_if: Callable[[BaseException], bool]
) -> T:
    """``fn()`` under ``policy``; returns its first result."""
    return policy(attempts, step_s=step_s, retry_if=retry_if)(fn)


def until_deadline(deadline_s: float, *, step_s: float, retry_if: Callable[[BaseException], bool]) -> Retrying:
    """Tries until ``deadline_s`` seconds have passed since the first one, waiting a growing
    step plus up to ``step_s`` of jitter (many callers refused at once do not come back in
    step), while ``retry_if`` says the error is worth another try; the last error is raised
    as it was."""
    return Retrying(
        stop=stop_after_delay(deadline_s),
        wait=wait_incrementing(start=step_s, increment=step_s, max=10 * step_s) + wait_random(0, step_s),
        retry=retry_if_exception(retry_if),
        reraise=True,
    )
