"""Prefect wrappers of the live-traffic reads: the canary evaluation's one read of every
production replica for all its windows, and the always-on traffic watch (``traffic_watch``).
Both act with the least role that records a traffic alert: the evaluation as activation,
the watch as the fleet."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from loragate.registry.rules.access import Role
from loragate.tasks.credentials import registry_as
from loragate.tasks.gates import RETRY_DELAYS_S, outage_only
from loragate.tasks.live_figures import LiveFigures, read_live_figures
from loragate.tasks.traffic_watch import watch_traffic


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
    """The traffic alerts of every adapter in production recorded now, and the replicas
    that could not be read."""
    with registry_as(Role.FLEET) as registry:
        raised, unreadable = watch_traffic(registry, progress=get_run_logger().info)
    return {"alerts": [a.as_dict() for a in raised], "unreadable": unreadable}
