"""The production replicas' live figures, read once per replica for the adapters asked about.

Each production replica's split keeps per (adapter, version, window) counters and samples,
its breaker trips and a per-adapter fallback rate (``GET /loragate/traffic``). A canary
evaluation of hundreds of windows, or the always-on traffic watch, reads every replica once
with the adapters it wants (``adapter=`` repeated, ``ADAPTERS_PER_READ`` a request; the watch
asks ``view=alerts``: no samples at all), never the whole document once per window; each
window or adapter then takes its own part (``LiveFigures.of``). A replica that cannot be read
is named with the cause, against every adapter of its base.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from loragate.registry.rules.fleet import Replica, ReplicaRole
from loragate.registry.rules.names import AdapterName
from loragate.registry.service import Registry
from loragate.tasks.replicas import replica_client
from loragate.tasks.routes import failures, on_each

# adapters named in one read: a query string well under any server's line limit
ADAPTERS_PER_READ = 64
# the URL the fleet read a document from, added to each adapter's part (``LiveFigures.of``):
# the replica's own ``replica`` field is its claim
READ_FROM = "read_from"


@dataclass(frozen=True)
class AdapterFigures:
    """One adapter's part of every production replica's document, and the replicas of its
    base that could not be read (each ``URL: cause``)."""

    documents: list[dict[str, Any]] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class LiveFigures:
    """Each production replica's document (only the adapters asked about), by replica URL."""

    documents: dict[str, dict[str, Any]]
    unreadable: dict[str, str]  # replica URL -> "URL: cause"
    replicas_of_base: dict[str, list[str]]

    def of(self, name: str) -> AdapterFigures:
        urls = self.replicas_of_base.get(AdapterName.parse(name).base, [])
        return AdapterFigures(
            [{**_part(self.documents[url], name), READ_FROM: url} for url in urls if url in self.documents],
            [self.unreadable[url] for url in urls if url in self.unreadable],
        )


def _part(document: dict[str, Any], name: str) -> dict[str, Any]:
    """``document`` with only ``name``'s versions, route, trips and fallback rate."""
    fallback = document.get("fallback_15m_by_adapter", {})
    return {
        **document,
        "versions": [v for v in document.get("versions", []) if v.get("adapter") == name],
        "routes": {k: v for k, v in document.get("routes", {}).items() if k == name},
        "alerts": [a for a in document.get("alerts", []) if a.get("adapter") == name],
        "fallback_15m_by_adapter": {name: fallback[name]} if name in fallback else {},
    }


def _merged(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One replica's document from its reads of several chunks of adapters."""
    merged = dict(parts[0])
    for key in ("versions", "alerts"):
        merged[key] = [entry for part in parts for entry in part.get(key, [])]
    for key in ("routes", "fallback_15m_by_adapter"):
        merged[key] = {k: v for part in parts for k, v in part.get(key, {}).items()}
    return merged


def _chunks(names: list[str]) -> list[list[str]]:
    return [names[i : i + ADAPTERS_PER_READ] for i in range(0, len(names), ADAPTERS_PER_READ)]


def read_live_figures(registry: Registry, names: Iterable[str], *, alerts_only: bool = False) -> LiveFigures:
    """Every production replica serving any of ``names`` read once (a request per
    ``ADAPTERS_PER_READ`` of its adapters), all replicas at once. ``alerts_only``: no
    per-version figures, only trips and fallback rates (``view=alerts``)."""
    wanted = sorted(set(names))
    by_base: dict[str, list[str]] = {}
    for name in wanted:
        by_base.setdefault(AdapterName.parse(name).base, []).append(name)
    replicas: list[Replica] = []
    replicas_of_base: dict[str, list[str]] = {}
    for base in by_base:
        production = [r for r in registry.list_replicas(base) if r.role == ReplicaRole.PRODUCTION]
        replicas += production
        replicas_of_base[base] = [r.url for r in production]
    bases_of = {r.url: r.base_model_id for r in replicas}

    def read(replica: Replica) -> dict[str, Any]:
        asked = by_base.get(bases_of[replica.url], [])
        with replica_client(registry, replica.url, retries=1) as client:
            parts = [client.traffic(chunk, alerts_only=alerts_only) for chunk in _chunks(asked)]
        return {**_merged(parts), "replica": replica.url}

    results = on_each(replicas, read)
    unreadable = {url: failures({url: r})[0] for url, r in results.items() if isinstance(r, BaseException)}
    return LiveFigures({u: r for u, r in results.items() if isinstance(r, dict)}, unreadable, replicas_of_base)
