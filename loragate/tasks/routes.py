"""Which version users get on each production replica, as the fleet sees and steers it.

Each production replica's traffic split reads the routing table (production pointers, the
active canary window and its share) from the registry within a second; ``push_routes`` makes
every replica read it now, so a withdrawn canary or a rollback gets 0 % at once, and
``confirm_version`` proves, replica by replica, which version a user gets: the
``x-loragate-version`` header of a one-token request sent as a user.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from loragate.registry.errors import DeployFailed, LoragateError, ReplicaError
from loragate.registry.fan_out import fan_out
from loragate.registry.progress import Progress, quiet
from loragate.registry.rules.fleet import Replica, ReplicaRole, qualified_name, version_path
from loragate.registry.rules.names import AdapterName
from loragate.registry.service import Registry
from loragate.tasks.replicas import replica_client

T = TypeVar("T")
# the user a confirmation request is sent as: any fixed key, so every replica decides alike
CONFIRM_USER = "loragate-confirm"


def production_replicas(registry: Registry, name: str) -> list[Replica]:
    base = AdapterName.parse(name).base
    return [r for r in registry.list_replicas(base) if r.role == ReplicaRole.PRODUCTION]


def stage_replicas(registry: Registry, name: str) -> tuple[list[Replica], list[Replica]]:
    """The replicas of ``name``'s base: (canary, production)."""
    base = AdapterName.parse(name).base
    replicas = registry.list_replicas(base)
    return (
        [r for r in replicas if r.role == ReplicaRole.CANARY],
        [r for r in replicas if r.role == ReplicaRole.PRODUCTION],
    )


def on_each(replicas: Iterable[Replica], work: Callable[[Replica], T]) -> dict[str, T | BaseException]:
    """``work`` on every replica at once (``fan_out``); replica URL -> its result, or the
    error it raised, in the order they finished."""
    return {replica.url: outcome for replica, outcome in fan_out(replicas, work)}


def failures(results: dict[str, Any]) -> list[str]:
    return [
        f"{url}: {e.one_line() if isinstance(e, LoragateError) else f'{type(e).__name__}: {e}'}"
        for url, e in sorted(results.items())
        if isinstance(e, BaseException)
    ]


def serves_warm(registry: Registry, replica: Replica, name: str, version_id: str) -> bool:
    """Whether ``replica`` serves ``version_id`` as ``name@version_id`` from its path now."""
    path = version_path(replica.adapter_dir, name, version_id)
    with replica_client(registry, replica.url, retries=1) as client:
        return client.served_adapters().get(qualified_name(name, version_id)) == path


# -- routes --------------------------------------------------------------------------------


def push_routes(registry: Registry, name: str, progress: Progress = quiet) -> list[str]:
    """Every production replica reads the routing table now; returns the replicas that could
    not be told (they read it within their own refresh interval anyway)."""

    def push(replica: Replica) -> dict[str, Any]:
        with replica_client(registry, replica.url, retries=1) as client:
            return client.refresh_routes()

    failed = failures(on_each(production_replicas(registry, name), push))
    for failure in failed:
        progress(f"routes not pushed to {failure}")
    return failed


def confirm_version(
    registry: Registry, name: str, version_id: str, deadline_s: float = 10.0, progress: Progress = quiet
) -> dict[str, float]:
    """Wait until every production replica answers users of ``name`` with ``version_id``
    (the ``x-loragate-version`` header of a one-token request); replica URL -> seconds it
    took.

    Raises:
        DeployFailed: a replica still answered with another version after ``deadline_s``.
    """
    started = time.monotonic()

    def confirm(replica: Replica) -> float:
        seen: str | None = None
        with replica_client(registry, replica.url, retries=0) as client:
            while True:
                try:
                    seen = client.complete(name, ".", 1, user=CONFIRM_USER).version
                except ReplicaError as e:
                    seen = e.code.value
                if seen == version_id:
                    return round(time.monotonic() - started, 3)
                if time.monotonic() - started > deadline_s:
                    raise DeployFailed(f"{replica.url} still answers {name} with {seen}, not {version_id}")
                time.sleep(0.05)

    results = on_each(production_replicas(registry, name), confirm)
    failed = failures(results)
    if failed:
        raise DeployFailed(f"{name} not confirmed on every replica within {deadline_s:g} s: {'; '.join(failed)}")
    confirmed = {url: float(s) for url, s in results.items() if isinstance(s, float)}
    progress(f"{name}: users get {version_id} on {len(confirmed)} replica(s)")
    return confirmed
