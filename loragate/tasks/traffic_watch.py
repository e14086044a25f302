"""Alerts from live traffic: a tripped breaker, or an adapter falling back too often.

Every production replica's split keeps its breaker trips (each with an id of its own) and
each adapter's fallback rate over the last 15 minutes (``GET /loragate/traffic``). The
always-on watch (``watch_traffic``: the scheduled ``traffic-watch`` flow and ``loragate fleet
watch``) reads them for every adapter in production, whether or not a canary window is open,
and each canary evaluation for the adapters it judges; both turn them into alerts: a trip
of any version's breaker, a base whose answers were not the base's bytes (``fallback_mismatch``:
the replica's known-answer probe of the base), and an adapter's fallback rate above
``LORAGATE_FALLBACK_ALERT_RATE`` (5 %) on a replica once it has answered enough of that
adapter's requests for the rate to mean something; and, from the registry alone, a production
version older than ``LORAGATE_VERSION_AGE_ALERT_DAYS`` (30), once per version. An alert is recorded in the registry's
audit log (``traffic_alert``, listed by ``loragate status``): a trip once, ever (by its id:
an old trip still in a replica's list is not news); a fallback rate once per adapter and
replica in 15 minutes while it lasts. Only an alert recorded now is sent to Slack, so a trip
seen by the watch and an evaluation is one message. The same read gives each adapter's recent
requests, from which the watch re-chooses the hot pins (``tasks/hot_pins.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from loragate.registry.progress import Progress, quiet
from loragate.registry.records.adapters import utcnow
from loragate.registry.rules.fleet import AdapterPointers
from loragate.registry.service import Registry
from loragate.tasks.live_figures import LiveFigures, read_live_figures

# a fallback rate over fewer requests than this is noise, not an alert
MIN_REQUESTS_FOR_RATE = 20
# what a replica's split raises itself, each once by its id: a version's breaker tripped; a
# base that answered its known-answer probe otherwise while adapters ran (the plugin's base_probe)
REPLICA_ALERT_KINDS = frozenset({"breaker_open", "fallback_mismatch"})


@dataclass(frozen=True)
class TrafficAlert:
    name: str
    kind: str  # breaker_open | fallback_mismatch | fallback_rate | version_age
    version_id: str | None
    replica: str
    detail: str
    occurrence: str | None = None  # a trip's id on its replica: announced once, ever

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "version_id": self.version_id,
            "replica": self.replica,
            "detail": self.detail,
            "occurrence": self.occurrence,
        }


def alerts_in(documents: list[dict[str, Any]], name: str, fallback_alert_rate: float) -> list[TrafficAlert]:
    """The alerts the replicas' figures (one ``/loragate/traffic`` document each) raise for
    adapter ``name``: its versions' breaker trips, its fallbacks that were not the base's
    bytes and its own fallback rate."""
    found = []
    for document in documents:
        replica = str(document.get("replica", "?"))
        for trip in document.get("alerts", []):
            if trip.get("adapter") == name and trip.get("kind") in REPLICA_ALERT_KINDS:
                occurrence = trip.get("id")
                found.append(
                    TrafficAlert(
                        name,
                        str(trip.get("kind")),
                        trip.get("version"),
                        replica,
                        f"{trip.get('reason', '')} (at {trip.get('at', '?')})",
                        None if occurrence is None else str(occurrence)[:128],
                    )
                )
        recent = document.get("fallback_15m_by_adapter", {}).get(name, {})
        requests, fallbacks = int(recent.get("requests", 0)), int(recent.get("fallbacks", 0))
        if requests >= MIN_REQUESTS_FOR_RATE and fallbacks / requests > fallback_alert_rate:
            found.append(
                TrafficAlert(
                    name,
                    "fallback_rate",
                    None,
                    replica,
                    f"{fallbacks} of {requests} requests for {name} fell back in 15 minutes "
                    f"({fallbacks / requests:.1%} > {fallback_alert_rate:.0%})",
                )
            )
    return found


def aged_alerts(pointers: list[AdapterPointers], now: datetime, max_age_days: float) -> list[TrafficAlert]:
    """A production version older than ``max_age_days`` (``LORAGATE_VERSION_AGE_ALERT_DAYS``):
    what users get has not been retrained or confirmed for that long. Once per version, ever
    (its id is the occurrence): a new production version is news again, the same old one is not."""
    found = []
    for p in pointers:
        if p.production is None or p.production_since is None:
            continue
        age_days = (now - p.production_since).total_seconds() / 86400
        if age_days > max_age_days:
            found.append(
                TrafficAlert(
                    p.name,
                    "version_age",
                    p.production,
                    "registry",
                    f"production version {p.production} has served {p.name} for {age_days:.0f} days "
                    f"(> {max_age_days:g}), since {p.production_since.isoformat(timespec='seconds')}",
                    p.production,
                )
            )
    return found


def record_alerts(registry: Registry, alerts: list[TrafficAlert]) -> list[TrafficAlert]:
    """Record each alert in the audit log; returns those not recorded in the last 15
    minutes already (the ones to tell Slack about)."""
    return [
        a
        for a in alerts
        if registry.record_traffic_alert(
            a.name,
            a.kind,
            {"version_id": a.version_id, "replica": a.replica, "detail": a.detail}
            | ({"occurrence": a.occurrence} if a.occurrence else {}),
        )
    ]


@dataclass(frozen=True)
class FleetWatch:
    """One watch: the alerts recorded now, the replicas that could not be read, and the
    figures read (the adapters in production's part of each production replica's document),
    for the steps that use them too (``tasks/hot_pins.py``)."""

    alerts: list[TrafficAlert]
    unreadable: list[str]
    names: list[str]
    figures: LiveFigures


def watch_fleet(registry: Registry, progress: Progress = quiet) -> FleetWatch:
    """The traffic alerts of every adapter in production, canary window or not, from one
    read of each production replica (trips and fallback rates only), recorded; the alerts
    recorded now are the ones to announce."""
    pointers = [p for p in registry.adapter_pointers() if p.production]
    names = [p.name for p in pointers]
    figures = read_live_figures(registry, names, alerts_only=True)
    raised = record_alerts(registry, aged_alerts(pointers, utcnow(), registry.settings.version_age_alert_days))
    for name in names:
        raised += record_alerts(
            registry, alerts_in(figures.of(name).documents, name, registry.settings.fallback_alert_rate)
        )
    for alert in raised:
        progress(f"ALERT {alert.kind} {alert.name} on {alert.replica}: {alert.detail}")
    unreadable = sorted(figures.unreadable.values())
    for line in unreadable:
        progress(f"live figures unreadable: {line}")
    return FleetWatch(raised, unreadable, names, figures)


def watch_traffic(registry: Registry, progress: Progress = quiet) -> tuple[list[TrafficAlert], list[str]]:
    """``watch_fleet``'s alerts recorded now (to announce) and the replicas that could not be read."""
    watched = watch_fleet(registry, progress)
    return watched.alerts, watched.unreadable
