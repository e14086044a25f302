"""A window's verdict needs the live requests that could show a worse canary: the count is
what the live error rule needs to catch errors ``detect_ratio`` x production's at ``power``
(checked here against the rule itself, by simulation); a window short of it by its end ramps
its split within ``max_auto_share``, audited; one still short when it ends is **undecided**
-- withdrawn unproven, never ready by default, never open forever -- on SQLite and Postgres.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import numpy as np
import pytest

from loragate.registry.errors import IllegalTransition
from loragate.registry.records.adapters import utcnow
from loragate.registry.render.canary import canary_evidence_markdown
from loragate.registry.rules.canary import CanaryThresholds, CanaryWindow, SideStats, Verdict, WindowStatus
from loragate.registry.rules.live import LiveStats, judge_live
from loragate.registry.rules.live_side import LiveSide
from loragate.registry.rules.power import MIN_RAMP_STEP, Coverage, Detection, coverage, ramped_share, requests_needed
from loragate.registry.rules.sequential import ErrorEvidence
from loragate.registry.rules.verdict import judge
from loragate.registry.settings import Settings
from loragate.tasks.canary_moves import ramp_canary, withdraw_canary
from tests.support.moves import promote
from tests.support.registries import mark_validated, record_verdict

NAME = "acme/tiny-llama/support"
DAY = 86_400.0
TWO_X = Detection(ratio=2.0, power=0.8, alpha=0.0025, error_rate_floor=0.01, min_requests=100)


# -- how many requests: checked against the rule it sizes -----------------------------------


def caught_share(detection: Detection, share: float, production_rate: float, windows: int, seed: int) -> float:
    """The share of simulated 24 h windows (144 looks) in which the live error rule catches a
    canary failing ``detection.ratio`` x production's rate, given the requests it needs."""
    needed = requests_needed(detection, share, production_rate)
    assert needed is not None
    per_look = needed / share / 144
    rng = np.random.default_rng(seed)
    caught = 0
    for _ in range(windows):
        evidence, seen = ErrorEvidence.start(detection.alpha), np.zeros(4, dtype=int)
        for _ in range(144):
            c, p = rng.poisson(share * per_look), rng.poisson((1 - share) * per_look)
            step = (c, rng.binomial(c, production_rate * detection.ratio), p, rng.binomial(p, production_rate))
            seen += np.array(step)
            evidence = evidence.look(*(int(v) for v in seen))
            if evidence.worse:
                caught += 1
                break
    return caught / windows


@pytest.mark.parametrize(
    ("ratio", "share", "rate"), [(2.0, 0.01, 0.01), (3.0, 0.05, 0.02), (5.0, 0.10, 0.01)], ids=["2x", "3x", "5x"]
)
def test_the_requests_needed_let_the_live_error_rule_catch_the_effect_with_the_power(ratio, share, rate):
    detection = dataclasses.replace(TWO_X, ratio=ratio, min_requests=0)
    assert caught_share(detection, share, rate, windows=150, seed=int(ratio * 10)) >= detection.power - 0.05


def test_fewer_requests_are_needed_for_a_larger_effect_or_a_higher_error_rate_never_below_the_minimum():
    needed = {ratio: requests_needed(dataclasses.replace(TWO_X, ratio=ratio), 0.01, 0.01) for ratio in (1.5, 2, 3, 10)}
    assert needed[1.5] > needed[2] > needed[3] > needed[10] >= TWO_X.min_requests
    assert requests_needed(TWO_X, 0.01, 0.05) < requests_needed(TWO_X, 0.01, 0.01)
    # production failing less than the floor: sized for the floor's harm, not for 0.01 %
    assert requests_needed(TWO_X, 0.01, 0.0001) == requests_needed(TWO_X, 0.01, 0.01)
    assert requests_needed(dataclasses.replace(TWO_X, ratio=0.0), 0.01, 0.01) == TWO_X.min_requests


def test_a_canary_no_user_has_reached_yet_needs_what_its_window_share_needs_not_the_minimum():
    nobody = coverage(TWO_X, 0.10, canary_requests=0, production_requests=60, production_errors=0,
                      elapsed_s=HOUR, remaining_s=DAY)  # fmt: skip
    assert nobody.needed == requests_needed(TWO_X, 0.10, 0.0) and nobody.needed > 1000 and not nobody.met


def test_no_number_of_requests_decides_a_split_that_sends_every_request_to_the_canary():
    assert requests_needed(TWO_X, 1.0, 0.01) is None
    everyone = coverage(TWO_X, 0.5, canary_requests=900, production_requests=0, production_errors=0,
                        elapsed_s=3600, remaining_s=DAY)  # fmt: skip
    assert everyone.needed is None and not everyone.met and "no number of requests" in everyone.describe()


# -- the ramp ---------------------------------------------------------------------------------

HOUR = 3600.0


def short(share: float, canary: int, needed: int = 3000, projected: int | None = None) -> Coverage:
    return Coverage(needed, canary, canary * 24 if projected is None else projected, share, TWO_X.describe())


# (case, coverage, production requests, elapsed, remaining, cap, expected: None or (low, high))
RAMPS = [
    ("short-ramps-within-the-cap", short(0.01, 10), 990, HOUR, 23 * HOUR, 0.10, (0.015, 0.10)),
    ("far-short-stops-at-the-cap", short(0.01, 1), 99, HOUR, 23 * HOUR, 0.10, (0.10, 0.10)),
    # its users' buckets gave the canary none of its 1 %: the raise makes up for it, to the cap
    ("no-user-in-the-canarys-bucket-yet", short(0.01, 0, projected=0), 1000, HOUR, 23 * HOUR, 0.10, (0.10, 0.10)),
    ("at-the-cap-no-further", short(0.10, 10), 90, HOUR, 23 * HOUR, 0.10, None),
    ("a-dark-canary-is-not-ramped", short(0.0, 0), 990, HOUR, 23 * HOUR, 0.10, None),
    ("need-met", short(0.01, 3000), 297_000, HOUR, 23 * HOUR, 0.10, None),
    ("on-pace-to-meet-it", short(0.01, 200, projected=4800), 19_800, HOUR, 23 * HOUR, 0.10, None),
    ("too-young-to-project", short(0.01, 1), 99, 60.0, DAY - 60, 0.10, None),
    ("over", short(0.01, 10), 990, DAY, 0.0, 0.10, None),
    ("no-ramp-configured", short(0.01, 10), 990, HOUR, 23 * HOUR, 0.0, None),
]


@pytest.mark.parametrize(("case", "covered", "production", "elapsed", "remaining", "cap", "expected"), RAMPS,
                         ids=[r[0] for r in RAMPS])  # fmt: skip
def test_a_window_short_of_its_requests_ramps_within_its_cap_and_only_then(
    case, covered, production, elapsed, remaining, cap, expected
):
    got = ramped_share(TWO_X, covered, production, 10, elapsed, remaining, cap)
    if expected is None:
        assert got is None
    else:
        assert got is not None and expected[0] <= got <= expected[1] and got >= covered.share * MIN_RAMP_STEP - 1e-12


# -- the verdict --------------------------------------------------------------------------------

NOW = utcnow()
BANDS = CanaryThresholds(length_s=DAY, detect_ratio=2.0, min_live_requests=100, max_auto_share=0.1)
PROBE = SideStats(8, 0, 100.0, 120.0, latencies_ms=(100.0,) * 8)


def window(age_s: float, share: float = 0.01, thresholds: CanaryThresholds = BANDS) -> CanaryWindow:
    return CanaryWindow(1, NAME, "v2", WindowStatus.OPEN, NOW - timedelta(seconds=age_s), thresholds, share=share)


def live_judgement(canary_requests: int, age_s: float, share: float = 0.01):
    production_requests = int(canary_requests * (1 - share) / share)
    live = (
        LiveSide(canary_requests, latency_ms=(100.0,) * min(canary_requests, 50)),
        LiveSide(production_requests, production_requests // 100, latency_ms=(100.0,) * 50),
    )
    stats = LiveStats(*live, canary_version="v2", production_version="v1")
    return judge_live(BANDS, stats, share, elapsed_s=age_s, remaining_s=DAY - age_s)


# (case, canary requests, window age, expected verdict)
VERDICTS = [
    ("running-and-short-continues", 40, HOUR, Verdict.CONTINUE),
    ("over-and-short-is-undecided", 40, DAY + 1, Verdict.UNDECIDED),
    ("over-with-what-it-needs-is-ready", 4000, DAY + 1, Verdict.READY),
    ("running-with-what-it-needs-continues", 4000, HOUR, Verdict.CONTINUE),
]


@pytest.mark.parametrize(("case", "requests", "age", "expected"), VERDICTS, ids=[v[0] for v in VERDICTS])
def test_a_window_is_ready_only_with_the_requests_it_needs_and_ends_undecided_without(case, requests, age, expected):
    live = live_judgement(requests, age)
    verdict, _, reasons = judge(window(age), PROBE, PROBE, 0.0, [], NOW, live)
    assert verdict == expected, reasons
    if expected == Verdict.UNDECIDED:
        assert reasons[0] == "window over undecided: its live traffic could not decide it"
        assert any("canary requests needed to catch errors 2x production's at 80% power" in r for r in reasons)


def test_a_window_not_ready_for_another_reason_is_undecided_at_twice_its_length_not_before():
    gated = dataclasses.replace(BANDS, ab_gate=True, ab_error_margin=0.0, detect_ratio=0.0)
    for age, expected in ((DAY + 1, Verdict.CONTINUE), (2 * DAY + 1, Verdict.UNDECIDED)):
        live = live_judgement(4000, age)
        live.not_ready_reasons.append("A/B: the bar is not met")
        verdict, _, reasons = judge(window(age, thresholds=gated), PROBE, PROBE, 0.0, [], NOW, live)
        assert verdict == expected, reasons


# -- on a registry: the ramp, and the withdrawal of an undecided window -----------------------


@pytest.fixture
def settings(tmp_path, db_url) -> Settings:
    return Settings(
        home=tmp_path / "home",
        database_url=db_url,
        artifacts=str(tmp_path / "artifacts"),
        actor="tester",
        canary_share=0.01,
        canary_window_s=DAY,
    )


@pytest.fixture
def windowed(cataloged, seeded_bundles):
    """NAME's validated v1 on canary with a window at 1 %, as the settings open it."""
    registry, _ = cataloged
    v1 = registry.register_adapter(seeded_bundles[0], NAME).version.version_id
    mark_validated(registry, v1)
    promote(registry, v1, "canary")
    opened, _ = registry.open_canary_window(v1)
    return registry, v1, opened


def test_the_watch_ramps_a_short_window_audited_and_never_past_its_cap(windowed):
    registry, _, opened = windowed
    assert opened.thresholds.max_auto_share == 0.10 and opened.thresholds.detect_ratio == 2.0
    hour_in = dataclasses.replace(opened, opened_at=utcnow() - timedelta(hours=1))
    covered = coverage(opened.thresholds.detection, 0.01, 4, 396, 4, HOUR, DAY - HOUR)
    raised = ramp_canary(registry, hour_in, covered, (396, 4))
    assert raised is not None and raised.share == 0.10  # far short: the cap, not beyond
    (event,) = [e for e in registry.history(NAME) if e.action == "canary_share"]
    assert "auto-ramp 1.00% -> 10.00% (cap 10.00%)" in (event.reason or "")
    at_cap = dataclasses.replace(hour_in, share=raised.share)
    assert ramp_canary(registry, at_cap, dataclasses.replace(covered, share=0.10), (396, 4)) is None
    assert registry.canary_window(opened.id).share == 0.10


def test_a_ramp_the_registry_refuses_leaves_the_window_at_its_share_and_fails_nothing(windowed):
    registry, _, opened = windowed
    registry.close_canary_window(opened.id, WindowStatus.ROLLED_BACK, "ended meanwhile")
    hour_in = dataclasses.replace(opened, opened_at=utcnow() - timedelta(hours=1))
    covered = coverage(opened.thresholds.detection, 0.01, 4, 396, 4, HOUR, DAY - HOUR)
    said: list[str] = []
    assert ramp_canary(registry, hour_in, covered, (396, 4), said.append) is None
    assert registry.canary_window(opened.id).share == 0.01 and "not ramped" in said[-1]


def test_an_undecided_window_withdraws_its_version_unproven_and_may_be_canaried_again(windowed):
    registry, v1, opened = windowed
    reason = "canary undecided: live: 40 of 3358 canary requests needed"
    record_verdict(registry, opened.id, Verdict.UNDECIDED, reason)  # the evaluation ends it undecided
    closed = withdraw_canary(registry, opened, reason)
    assert closed.status == WindowStatus.UNDECIDED and closed.reason == reason
    assert registry.get_adapter(NAME).canary is None
    assert registry.active_canary_window(NAME) is None  # the routes read active windows only: no share
    shown = canary_evidence_markdown(closed, [])
    assert "status **undecided**" in shown and "withdrawn unproven" in shown and "40 of 3358" in shown
    with pytest.raises(IllegalTransition):  # a closed window never opens again, nor is it promoted
        registry.close_canary_window(opened.id, WindowStatus.READY, None)
    promote(registry, v1, "canary")  # deliberately canaried again: a new window
    again, created = registry.open_canary_window(v1)
    assert created and again.id != opened.id and again.status == WindowStatus.OPEN
