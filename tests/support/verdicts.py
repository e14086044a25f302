"""One canary window and its figures, fixed, for the verdict tests (``test_live_verdict``,
``test_probe_verdict``, ``test_user_units``): an adapter's window with the product's latency
bands, latencies spread around a centre without randomness, and a probe side's stats."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from loragate.registry.rules.canary import CanaryThresholds, CanaryWindow, SideStats, WindowStatus

ADAPTER, WINDOW, CANARY, PRODUCTION = "acme/tiny-llama/support", 7, "v2", "v1"
T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
EARLY, LATE = T0 + timedelta(seconds=30), T0 + timedelta(seconds=61)
BANDS = CanaryThresholds(length_s=60, p95_ratio=1.10, p95_slack_ms=0, min_live_requests=100)


def spread(n: int, centre: float, seed: int = 0) -> list[float]:
    """n latencies around ``centre`` (+-20 %), fixed: the golden ratio's fractional parts."""
    return [round(centre * (0.8 + 0.4 * (((i + seed) * 0.6180339887498949) % 1)), 3) for i in range(n)]


def window(share: float = 0.01, thresholds: CanaryThresholds = BANDS) -> CanaryWindow:
    return CanaryWindow(WINDOW, ADAPTER, CANARY, WindowStatus.OPEN, T0, thresholds, share=share)


def probe(latencies: list[float] | None = None) -> SideStats:
    return SideStats.from_samples(spread(16, 100.0) if latencies is None else latencies, [])
