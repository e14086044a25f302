"""Prefect wrappers of the live-traffic reads: the canary evaluation's one read of every
production replica for all its windows, and the always-on traffic watch (``traffic_watch``)
with the hot pins it re-chooses from the same read (``hot_pins``). Each acts with the least
role that does its writes: the evaluation as activation, the watch and the hot pins as the
fleet."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from loragate.registry.rules.access import Role
from loragate.tasks.credentials import registry_as
from loragate.tasks.gates import RETRY_DELAYS_S, outage_only
from loragate.tasks.hot_pins import recent_requests, repin_hot
from loragate.tasks.live_figures import LiveFigures, read_live_figures
from loragate.tasks.traffic_watch import watch_fleet


@task(
    cache_policy=NO_CACHE,
    name="read-live-figures",
    retries=2,
    retry_delay_seconds=RETRY_DELAYS_S,
    retry_condition_fn=outage_only,
)
def read_canary_figures(names: list[str]) -> LiveFigures:
    """Every production replica serving any of ``names`` read once (a replica that cannot be
    read is named in the figures, not an error: the windows judge without it)."""
    with registry_as(Role.ACTIVATION) as registry:
        return read_live_figures(registry, names)


@task(
    cache_policy=NO_CACHE,
    name="watch-traffic",
    retries=2,
    retry_delay_seconds=RETRY_DELAYS_S,
    retry_condition_fn=outage_only,
)
def watch_fleet_traffic() -> dict[str, Any]:
    """The traffic alerts of every adapter in production recorded now, the replicas that
    could not be read, each adapter's requests of the last 15 minutes and the bases whose
    replicas were not all read (``hot_pins.recent_requests``)."""
    with registry_as(Role.FLEET) as registry:
        watched = watch_fleet(registry, progress=get_run_logger().info)
    requests, unread_bases = recent_requests(watched.figures, watched.names)
    return {
        "alerts": [a.as_dict() for a in watched.alerts],
        "unreadable": watched.unreadable,
        "requests": requests,
        "unread_bases": unread_bases,
    }


@task(
    cache_policy=NO_CACHE,
    name="repin-hot",
    retries=2,
    retry_delay_seconds=RETRY_DELAYS_S,
    retry_condition_fn=outage_only,
)
def repin_hot_adapters(requests: dict[str, int], unread_bases: list[str]) -> dict[str, Any]:
    """Each base's busiest adapters pinned hot, replacing the hot pins when they changed
    (the same set again changes nothing: safe to retry)."""
    with registry_as(Role.FLEET) as registry:
        return repin_hot(registry, requests, unread_bases, progress=get_run_logger().info).as_dict()
