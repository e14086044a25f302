"""Pinned adapters: those every production replica of their base keeps loaded in a slot,
whatever the traffic -- a person's choice (``operator``: ``loragate fleet pin``) or the
traffic watch's (``hot``: the busiest adapters of the last 15 minutes, re-chosen every minute).

How many a base may have (``hot_limit``): ``LORAGATE_HOT_PINS``, and never more than every
production replica of the base can give up while still holding its warm copies and one slot
more. With ``max_loras`` the smallest production replica's slots and W its warm copies (the
residency plan's), the limit is min(``LORAGATE_HOT_PINS``, max_loras - W - 1): pinned + W <=
max_loras - 1, so the plan's floor (pinned + warm) fits every production replica and at least
one slot stays free for an adapter neither pinned nor warm, the working set's minimum. A base
with no production replica has no room (0).

The hot set (``choose_hot``) fills what the operator's pins leave of that limit with the
adapters with the most recent requests, ties broken by name, never one with none. A person's
pins are always kept, even beyond the limit: they are a decision, not a guess (the limit
then leaves no hot pin). Pure, like ``residency``: the registry gathers the inputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


class PinSource(StrEnum):
    OPERATOR = "operator"  # a person pinned it: only a person unpins it
    HOT = "hot"  # the traffic watch chose it from recent requests


@dataclass(frozen=True)
class Pin:
    """One pinned adapter, why, by whom and since when."""

    name: str
    source: PinSource
    pinned_by: str
    pinned_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source.value,
            "pinned_by": self.pinned_by,
            "pinned_at": self.pinned_at.isoformat(),
        }


def hot_limit(setting: int, replica_slots: Iterable[int], warm: int) -> int:
    """The most adapters of one base pinned at once (operator pins included): ``setting``
    (``LORAGATE_HOT_PINS``; 0: none) and at most min(``replica_slots``) - ``warm`` - 1, the
    slots its smallest production replica has left beside its warm copies and one free slot
    (module docstring). 0 for a base without production replicas."""
    slots = min(replica_slots, default=0)
    if setting <= 0 or slots <= 0:
        return 0
    return max(0, min(setting, slots - warm - 1))


def choose_hot(requests_by_adapter: Mapping[str, int], operator_pinned: Set[str], limit: int) -> list[str]:
    """The adapters to pin hot, busiest first: those with the most recent requests (ties by
    name; none with no request), as many as ``limit`` leaves beside the ``operator_pinned``
    ones (never one of them: a person's pin stays a person's)."""
    room = max(0, limit - len(operator_pinned))
    busy = [name for name, count in requests_by_adapter.items() if count > 0 and name not in operator_pinned]
    return sorted(busy, key=lambda name: (-requests_by_adapter[name], name))[:room]
