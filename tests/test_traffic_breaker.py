"""The live split's circuit breaker per version on one replica, clocked by the test: errors or
slow answers in a row open it, a success in between resets the count, after the cooldown
one request probes (half-open) and its outcome closes or reopens it, and a probe that never
reports does not hold it forever. The middleware's use of it: tests/test_traffic_split_units.py."""

from __future__ import annotations

import sys
from pathlib import Path

PLUGIN_DIR = Path(__file__).resolve().parents[1] / "infra" / "vllm_plugin"
if str(PLUGIN_DIR) not in sys.path:
    sys.path.insert(0, str(PLUGIN_DIR))
from loragate_resolver.breaker import CLOSED, HALF_OPEN, OPEN, Breaker, Limits  # noqa: E402


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_errors_in_a_row_open_the_breaker_and_a_success_in_between_resets_the_count():
    clock, limits = Clock(), Limits(errors=3, slow=2, cooldown_s=10)
    breaker = Breaker(clock)
    assert [breaker.record(False, False, limits) for _ in range(2)] == [None, None]
    assert breaker.record(True, False, limits) is None
    assert [breaker.record(False, False, limits) is not None for _ in range(3)] == [False, False, True]
    assert breaker.state(limits) == OPEN and not breaker.allow(limits) and breaker.trips == 1


def test_slow_answers_in_a_row_open_the_breaker():
    limits = Limits(errors=3, slow=2, cooldown_s=10)
    breaker = Breaker(Clock())
    assert breaker.record(True, True, limits) is None
    assert "slower" in (breaker.record(True, True, limits) or "")


def test_after_the_cooldown_one_request_probes_and_its_outcome_closes_or_reopens():
    clock, limits = Clock(), Limits(errors=1, slow=1, cooldown_s=10)
    breaker = Breaker(clock)
    breaker.record(False, False, limits)
    clock.now += 10
    assert breaker.state(limits) == HALF_OPEN
    assert breaker.allow(limits) and not breaker.allow(limits)  # one probe at a time
    assert breaker.record(False, False, limits) is not None and breaker.trips == 2
    assert breaker.state(limits) == OPEN
    clock.now += 10
    assert breaker.allow(limits)
    assert breaker.record(True, False, limits) is None
    assert breaker.state(limits) == CLOSED and breaker.allow(limits)


def test_a_probe_that_never_reports_does_not_hold_the_breaker_forever():
    clock, limits = Clock(), Limits(errors=1, slow=1, cooldown_s=10)
    breaker = Breaker(clock)
    breaker.record(False, False, limits)
    clock.now += 10
    assert breaker.allow(limits)
    clock.now += 11
    assert breaker.allow(limits)
