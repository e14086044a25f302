"""Hot pins: each base's busiest adapters pinned on its production replicas, re-chosen from
the figures the traffic watch reads every minute (``tasks/traffic_watch.py``).

An adapter's recent requests: what each production replica of its base reports for it in
``fallback_15m_by_adapter[name].pinning`` -- the requests the replica's split finished for the
adapter over its last 15 minutes that some version or the base answered, at most five of each
user's (a refused request, or one caller's flood, buys no slot) -- summed over those replicas.
The watch reads them already (``view=alerts``): no read more. From them ``choose_hot``
(``rules/pinning.py``) picks each base's hot set within its limit (``Registry.hot_pin_limits``)
beside the operator's pins of its adapters in production, and the registry's hot pins are
replaced only when the set changed. A base one of
whose production replicas could not be read keeps its hot pins as they are: its counts are
partial, and a fleet that could not be read at all must not lose every pin at once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from loragate.registry.progress import Progress, quiet
from loragate.registry.rules.names import AdapterName
from loragate.registry.rules.pinning import PinSource, choose_hot
from loragate.registry.service import Registry
from loragate.tasks.live_figures import LiveFigures


@dataclass(frozen=True)
class HotPins:
    """What one re-choice did: the hot set now, the pins added and removed (both empty when
    the set had not changed), and the bases whose hot pins were kept unread."""

    hot: list[str]
    added: list[str]
    removed: list[str]
    kept_unread: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"hot": self.hot, "added": self.added, "removed": self.removed, "kept_unread": self.kept_unread}


def recent_requests(figures: LiveFigures, names: Iterable[str]) -> tuple[dict[str, int], list[str]]:
    """Each adapter's pinning demand over the last 15 minutes (answered requests, at most five
    a user), summed over the production replicas of its base that were read, and the bases
    of which a production replica was not."""
    requests: dict[str, int] = {}
    unread: set[str] = set()
    for name in names:
        part = figures.of(name)
        if part.unreadable:
            unread.add(AdapterName.parse(name).base)
        counts = (d.get("fallback_15m_by_adapter", {}).get(name, {}).get("pinning", 0) for d in part.documents)
        requests[name] = sum(int(c) for c in counts)
    return requests, sorted(unread)


def repin_hot(
    registry: Registry, requests: Mapping[str, int], unread_bases: Collection[str] = (), progress: Progress = quiet
) -> HotPins:
    """Choose each base's hot pins from ``requests`` (adapter -> recent requests) and replace
    the registry's when they changed; the bases in ``unread_bases`` keep theirs."""
    pins = registry.pins()
    operator = {p.name for p in pins if p.source == PinSource.OPERATOR}
    hot = {p.name for p in pins if p.source == PinSource.HOT}
    in_production: dict[str, set[str]] = {}
    for pointers in registry.adapter_pointers():
        if pointers.production:
            in_production.setdefault(pointers.base_model_id, set()).add(pointers.name)
    unread = set(unread_bases)
    chosen = {name for name in hot if AdapterName.parse(name).base in unread}
    for base, limit in registry.hot_pin_limits().items():
        if base in unread:
            continue
        names = in_production.get(base, set())
        chosen.update(choose_hot({n: requests.get(n, 0) for n in names}, operator & names, limit))
    kept = sorted(unread & {AdapterName.parse(name).base for name in hot})
    if chosen == hot:
        return HotPins(sorted(chosen), [], [], kept)
    added, removed = registry.replace_hot_pins(sorted(chosen))
    for name in added:
        progress(f"hot pin: {name}")
    for name in removed:
        progress(f"hot pin removed: {name}")
    return HotPins(sorted(chosen), added, removed, kept)
