"""What the verdict benchmark's simulations share: a window of 24 h evaluated every 600 s,
and a share of windows stated with Wilson's 95 % interval."""

from __future__ import annotations

from typing import Any

from loragate.registry.rules.significance import wilson_interval

LOOKS = 144
LOOK_S = 600


def proportion(hits: int, windows: int, counted: str = "count") -> dict[str, Any]:
    """``hits`` of ``windows`` with Wilson's 95 % interval; ``counted`` names the count."""
    low, high = wilson_interval(hits, windows, 0.95) or (0.0, 1.0)
    return {"windows": windows, counted: hits, "share": hits / windows, "ci95": [low, high]}
