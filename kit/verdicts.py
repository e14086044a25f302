"""A canary verdict recorded as the evaluation records one, without probing a replica: the
only way a window becomes ``ready`` or ``undecided`` (migration 0015). For the tests and the
benchmarks that need a window past its verdict."""

from __future__ import annotations

from datetime import UTC, datetime

from loragate.registry.rules.canary import Monitor, Observation, SideStats, Verdict
from loragate.registry.service import Registry


def record_verdict(registry: Registry, window_id: int, verdict: Verdict, reason: str) -> None:
    """The evaluation's observation of open window ``window_id`` with ``verdict``, on two
    sides alike and in band."""
    side = SideStats(20, 0, 50.0, 100.0)
    monitors = [Monitor("p95_ms", 1.0, 2.0, True)]
    registry.record_canary_observation(
        Observation(window_id, datetime.now(UTC), side, side, 0.0, [], verdict, monitors, [reason])
    )
