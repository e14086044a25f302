"""One retry policy for every loop that tries again: a bounded number of attempts with a
linear back-off, retrying only the errors the caller names, re-raising the last one as it
was (never a ``RetryError``). Built on tenacity, so a reader sees the policy, not a loop.

Which failures are worth another try is written here once per kind, by error class or
code (never by message text), and each kind has its policy, named after what it tolerates:

- a **concurrent update** (``ConcurrentUpdate``: another writer moved the same rows first):
  read again and try again, ``tolerating_concurrent_updates`` -- the SQL store's
  compare-and-set writes and the pointer move's planning, before its replicas are switched;
- an **unavailable replica** (``replica_unavailable``: unreachable or answering 5xx): it may
  be up again at the next try, ``tolerating_unavailable_replicas`` -- the replica client's
  idempotent requests and the fleet switch's per-replica switch;
- an **outage** (``Unavailable``: the database or the artifact store; or an unavailable
  replica): the Prefect gates' retry condition (``tasks/gates.py``).

A refusal (bad input, a permission, a replica's 4xx) is never retried: it would be refused
again. The database's own connection loop (refused while full or restarting) retries until
a deadline instead (``until_deadline``).
"""

from __future__ import annotations

from collections.abc import Callable

from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_incrementing, wait_random

from loragate.registry.errors import ConcurrentUpdate, ErrorCode, ReplicaError, Unavailable

# a lost compare-and-set settles within a few tries: the winner's transaction is short
CONCURRENT_UPDATE_ATTEMPTS = 8
CONCURRENT_UPDATE_STEP_S = 0.002


def policy(attempts: int, *, step_s: float, retry_if: Callable[[BaseException], bool]) -> Retrying:
    """``attempts`` tries in all, waiting ``step_s``, ``2 * step_s``, ... between them, while
    ``retry_if`` says the error is worth another try; the last error is raised as it was."""
    return Retrying(
        stop=stop_after_attempt(max(1, attempts)),
        wait=wait_incrementing(start=step_s, increment=step_s),
        retry=retry_if_exception(retry_if),
        reraise=True,
    )


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


# -- the failures worth another try ------------------------------------------------------


def is_concurrent_update(error: BaseException) -> bool:
    """Another writer moved the same rows first: reading again settles it."""
    return isinstance(error, ConcurrentUpdate)


def is_replica_unavailable(error: BaseException) -> bool:
    """A replica unreachable or answering 5xx: another try, or another replica, may answer.
    A 4xx would only be refused again."""
    return isinstance(error, ReplicaError) and error.code == ErrorCode.REPLICA_UNAVAILABLE


def is_outage(error: BaseException) -> bool:
    """Something down rather than something refused: the registry's database or artifact
    store, or a replica."""
    return isinstance(error, Unavailable) or is_replica_unavailable(error)


# -- their policies ----------------------------------------------------------------------


def tolerating_concurrent_updates() -> Retrying:
    """The whole read-decide-write again after a lost compare-and-set, a few times."""
    return policy(CONCURRENT_UPDATE_ATTEMPTS, step_s=CONCURRENT_UPDATE_STEP_S, retry_if=is_concurrent_update)


def tolerating_unavailable_replicas(attempts: int, *, step_s: float) -> Retrying:
    """``attempts`` tries in all while the replica is unavailable; what it refused is raised
    at once."""
    return policy(attempts, step_s=step_s, retry_if=is_replica_unavailable)
