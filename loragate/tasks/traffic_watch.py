"""Alerts from live traffic: a tripped breaker, or a replica falling back too often.

Every production replica's split keeps its breaker trips and its fallback rate over the
last 15 minutes (``GET /loragate/traffic``). Each canary evaluation reads them and turns
them into alerts: a trip of any version's breaker, and a fallback rate above
``LORAGATE_FALLBACK_ALERT_RATE`` (5 %) once a replica has answered enough requests for the
rate to mean something. An alert is recorded in the registry's audit log (``traffic_alert``,
listed by ``loragate status``) once per adapter, kind, version and replica in 15 minutes;
only an alert recorded now is sent to Slack, so a trip seen by two evaluations is one
message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loragate.registry.service import Registry

# a fallback rate over fewer requests than this is noise, not an alert
MIN_REQUESTS_FOR_RATE = 20


@dataclass(frozen=True)
class TrafficAlert:
    name: str
    kind: str  # breaker_open | fallback_rate
    version_id: str | None
    replica: str
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "version_id": self.version_id,
            "replica": self.replica,
            "detail": self.detail,
        }


def alerts_in(documents: list[dict[str, Any]], name: str, fallback_alert_rate: float) -> list[TrafficAlert]:
    """The alerts the replicas' figures (one ``/loragate/traffic`` document each) raise for
    adapter ``name``."""
    found = []
    for document in documents:
        replica = str(document.get("replica", "?"))
        for trip in document.get("alerts", []):
            if trip.get("adapter") == name and trip.get("kind") == "breaker_open":
                found.append(
                    TrafficAlert(name, "breaker_open", trip.get("version"), replica, str(trip.get("reason", "")))
                )
        recent = document.get("fallback_15m", {})
        requests, fallbacks = int(recent.get("requests", 0)), int(recent.get("fallbacks", 0))
        if requests >= MIN_REQUESTS_FOR_RATE and fallbacks / requests > fallback_alert_rate:
            found.append(
                TrafficAlert(
                    name,
                    "fallback_rate",
                    None,
                    replica,
                    f"{fallbacks} of {requests} requests fell back in 15 minutes "
                    f"({fallbacks / requests:.1%} > {fallback_alert_rate:.0%})",
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
            a.name, a.kind, {"version_id": a.version_id, "replica": a.replica, "detail": a.detail}
        )
    ]
