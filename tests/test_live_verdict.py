"""The canary verdict on live traffic (rules/live.py, rules/ab.py, rules/verdict.py): noise
is never a rollback, a canary really worse always is, and what the replicas report is
summed once per replica. Pure functions: no replica, no store. The verdict on the probes
alone, and on back-to-back pairs of them, is tests/test_probe_verdict.py's."""

from __future__ import annotations

import math
from typing import Any

import pytest

from loragate.registry.errors import ErrorCode, ReplicaError
from loragate.registry.render.canary import canary_evidence_markdown, observation_row
from loragate.registry.rules.canary import CanaryThresholds, Observation, SideStats, Verdict
from loragate.registry.rules.live import LiveJudgement, LiveStats, judge_live
from loragate.registry.rules.live_side import LiveSide
from loragate.registry.rules.verdict import judge
from tests.support.verdicts import ADAPTER, BANDS, CANARY, EARLY, LATE, PRODUCTION, WINDOW, probe, spread, window


def entry(version: str, requests: int = 0, errors: int = 0, window: int | None = WINDOW, **more: Any) -> dict:
    return {"adapter": ADAPTER, "version": version, "window": window, "requests": requests, "errors": errors, **more}


def document(replica: str, *entries: dict, alerts: list[dict] | None = None) -> dict:
    return {"replica": replica, "routes": {}, "versions": list(entries), "alerts": alerts or []}


def stats(*documents: dict, production: str | None = PRODUCTION) -> LiveStats:
    return LiveStats.from_replicas(list(documents), ADAPTER, WINDOW, CANARY, production)


def sides(canary: LiveSide, production: LiveSide, **more: Any) -> LiveStats:
    return LiveStats(canary, production, canary_version=CANARY, **more)


QUIET = LiveSide(requests=1000, latency_ms=tuple(spread(300, 100.0, 1)))

# -- errors: a test, not a comparison ---------------------------------------------------------

# (case, canary errors/requests, production errors/requests, rolls back)
ERRORS = [
    ("one-in-100-against-none-in-1000-is-noise", (1, 100), (0, 1000), False),
    ("ten-in-100-against-one-in-1000-is-worse", (10, 100), (1, 1000), True),
    ("the-same-rate-is-not-worse", (5, 500), (10, 1000), False),
    ("a-lower-rate-is-not-worse", (0, 200), (20, 1000), False),
    ("half-failing-is-worse", (50, 100), (10, 1000), True),
    ("no-production-traffic-is-no-comparison", (3, 100), (0, 0), False),
]


@pytest.mark.parametrize("case, canary, production, rolls_back", ERRORS, ids=[e[0] for e in ERRORS])
def test_live_errors_roll_back_only_when_significantly_worse(case, canary, production, rolls_back):
    live = sides(LiveSide(requests=canary[1], errors=canary[0]), LiveSide(requests=production[1], errors=production[0]))
    got = judge_live(BANDS, live, 0.01)
    assert got.rollback is rolls_back
    assert {m.name: m.in_band for m in got.monitors}["live_error_rate"] is not rolls_back
    assert any("live errors" in r for r in got.reasons) is rolls_back


# -- latency: above the ratio and slower by ranks ---------------------------------------------

# (case, canary latencies, production latencies, canary ms/token, production ms/token, breach)
LATENCY = [
    ("30-percent-slower-everywhere", spread(200, 130.0, 3), spread(200, 100.0), [], [], True),
    ("5-percent-slower-is-within-the-ratio", spread(200, 105.0, 3), spread(200, 100.0), [], [], False),
    ("the-same-speed", spread(200, 100.0, 3), spread(200, 100.0), [], [], False),
    (
        "one-slow-request-moves-the-p95-not-the-ranks",
        [*spread(19, 100.0, 3), 1113.0],
        spread(200, 100.0),
        [],
        [],
        False,
    ),
    (
        "per-token-30-percent-slower",
        spread(200, 100.0, 3),
        spread(200, 100.0),
        spread(200, 13.0),
        spread(200, 10.0),
        True,
    ),
    ("too-few-samples-to-tell", [140.0, 150.0], [100.0, 101.0], [], [], False),
]


@pytest.mark.parametrize(
    "case, canary, production, canary_tokens, production_tokens, breach", LATENCY, ids=[c[0] for c in LATENCY]
)
def test_live_latency_breaches_when_above_the_ratio_and_slower_by_rank(
    case, canary, production, canary_tokens, production_tokens, breach
):
    live = sides(
        LiveSide(requests=len(canary), latency_ms=tuple(canary), ms_per_token=tuple(canary_tokens)),
        LiveSide(requests=len(production), latency_ms=tuple(production), ms_per_token=tuple(production_tokens)),
    )
    got = judge_live(BANDS, live, 0.01)
    assert got.latency_breach is breach
    assert got.rollback is False, "latency alone waits for the streak"


def test_a_live_latency_breach_joins_the_probe_streak():
    slow = judge_live(BANDS, sides(LiveSide(200, latency_ms=tuple(spread(200, 150.0, 3))), QUIET), 0.01)
    first, checks, _ = judge(window(), probe(), probe(), 0.0, [], EARLY, slow)
    assert first == Verdict.CONTINUE
    earlier = [Observation(WINDOW, EARLY, probe(), probe(), 0.0, [], first, checks, [])]
    second, _, reasons = judge(window(), probe(), probe(), 0.0, earlier, LATE, slow)
    assert second == Verdict.ROLLBACK and "2 observations in a row" in reasons[-1]


# -- the breaker ------------------------------------------------------------------------------

BREAKERS = [
    ("a-trip-counted-by-a-replica", [entry(CANARY, 50, trips=3)], [], 3),
    ("an-alert-for-the-canary", [entry(CANARY, 50)], [{"kind": "breaker_open", "version": CANARY}], 1),
    (
        "an-alert-for-production-is-not-the-canary's",
        [entry(CANARY, 50)],
        [{"kind": "breaker_open", "version": "v1"}],
        0,
    ),
    (
        "an-alert-of-another-window",
        [entry(CANARY, 50)],
        [{"kind": "breaker_open", "version": CANARY, "window": 3}],
        0,
    ),
    ("no-trip", [entry(CANARY, 50)], [], 0),
]


@pytest.mark.parametrize("case, entries, alerts, trips", BREAKERS, ids=[b[0] for b in BREAKERS])
def test_a_tripped_canary_breaker_is_evidence_never_a_rollback_on_its_own(case, entries, alerts, trips):
    """A client can trip the canary's breaker (requests that look slow or fail in its
    bucket); the breaker has protected the users already. What rolls back is the error test."""
    alerts = [{"at": "2026-11-27T12:00:00+00:00", "adapter": ADAPTER, "window": WINDOW, **a} for a in alerts]
    live = stats(document("r1:8000", *entries, entry(PRODUCTION, 1000), alerts=alerts))
    got = judge_live(BANDS, live, 0.01)
    assert not got.rollback
    (breaker,) = [m for m in got.monitors if m.name == "live_breaker"]
    assert (breaker.value, breaker.in_band) == (trips, True)
    assert any("tripped" in r for r in got.reasons) is (trips > 0)
    verdict, _, _ = judge(window(), probe(), probe(), 0.0, [], LATE, got)
    assert verdict != Verdict.ROLLBACK


# -- readiness: enough live requests, and the A/B bar when it gates ---------------------------

READINESS = [
    ("too-few-live-requests", 0.01, 12, ["live: 12 of 100 requests needed"]),
    ("enough-live-requests", 0.01, 100, []),
    ("a-dark-canary-needs-none", 0.0, 0, []),
]


@pytest.mark.parametrize("case, share, requests, not_ready", READINESS, ids=[r[0] for r in READINESS])
def test_a_window_with_a_share_needs_its_live_minimum(case, share, requests, not_ready):
    live = sides(LiveSide(requests, latency_ms=tuple(spread(requests, 100.0, 5))), QUIET)
    got = judge_live(BANDS, live, share)
    assert got.not_ready_reasons == not_ready
    verdict, _, reasons = judge(window(share), probe(), probe(), 0.0, [], LATE, got)
    # over and short of its live requests: undecided, never ready by default
    assert verdict == (Verdict.UNDECIDED if not_ready else Verdict.READY)
    assert all(r in reasons for r in not_ready)


def test_a_window_with_a_share_and_no_live_figures_is_not_ready():
    verdict, _, reasons = judge(window(0.01), probe(), probe(), 0.0, [], LATE)
    assert verdict == Verdict.CONTINUE and any("no live figures" in r for r in reasons)
    assert judge(window(0.0), probe(), probe(), 0.0, [], LATE)[0] == Verdict.READY


def test_fallbacks_far_above_production_keep_a_window_from_ready():
    live = sides(LiveSide(200, fallbacks=40, latency_ms=tuple(spread(160, 100.0))), LiveSide(1000, fallbacks=2))
    got = judge_live(BANDS, live, 0.01)
    assert not got.rollback and any("fell back to the base 40 of 240" in r for r in got.not_ready_reasons)
    # a breaker keeping every request from the canary: more fallbacks than requests handled
    kept = judge_live(BANDS, sides(LiveSide(3, errors=3, fallbacks=500, trips=1), LiveSide(1000)), 0.01)
    assert kept.rollback and any("fell back to the base 500 of 503" in r for r in kept.not_ready_reasons)


GATED = CanaryThresholds(length_s=60, min_live_requests=100, ab_gate=True, ab_error_margin=0.01)
EQUAL_CANARY = LiveSide(3000, errors=3, accepted=4500, retried=500, latency_ms=tuple(spread(3000, 100.0, 9)))
EQUAL_PRODUCTION = LiveSide(30000, errors=30, accepted=45000, retried=5000, latency_ms=tuple(spread(3000, 100.0)))

# (case, thresholds, canary, production, blocked by the A/B bar)
AB_GATE = [
    ("gate-on-equal-and-enough-data-meets-the-bar", GATED, EQUAL_CANARY, EQUAL_PRODUCTION, False),
    ("gate-on-too-little-data-to-prove-it", GATED, LiveSide(100, latency_ms=tuple(spread(100, 100.0))), QUIET, True),
    ("gate-on-errors-beyond-the-margin", GATED, EQUAL_CANARY.merge(LiveSide(0, errors=120)), EQUAL_PRODUCTION, True),
    ("gate-off-reports-but-never-blocks", BANDS, LiveSide(100, latency_ms=tuple(spread(100, 100.0))), QUIET, False),
]


@pytest.mark.parametrize("case, thresholds, canary, production, blocked", AB_GATE, ids=[a[0] for a in AB_GATE])
def test_the_ab_bar_gates_readiness_only_when_set(case, thresholds, canary, production, blocked):
    got = judge_live(thresholds, sides(canary, production), 0.01)
    assert any(r.startswith("A/B:") for r in got.not_ready_reasons) is blocked
    assert got.ab.as_dict()["metrics"], "the A/B figures are reported either way"


def test_the_ab_report_states_each_metric_with_its_interval_and_p():
    report = judge_live(GATED, sides(EQUAL_CANARY, EQUAL_PRODUCTION), 0.01).ab
    by_name = {m.name: m for m in report.metrics}
    errors = by_name["error_rate"]
    assert errors.canary == pytest.approx(0.001) and errors.production == pytest.approx(0.001)
    assert errors.low is not None and errors.high is not None and errors.low < 0 < errors.high <= 0.01
    assert errors.p_value is not None and errors.p_value > 0.05 and not errors.worse and errors.meets_bar
    assert by_name["acceptance_rate"].meets_bar and by_name["latency_p95_ms"].meets_bar
    assert by_name["ttft_p95_ms"].meets_bar is None, "not measured: reported, gating nothing"
    assert report.meets_bar


# -- summing the replicas ---------------------------------------------------------------------


def test_figures_are_summed_across_replicas_once_each():
    first = document(
        "r1:8000",
        entry(CANARY, 10, 1, fallbacks=1, accepted=4, retried=1, latency_ms=[100.0, 110.0], trips=0),
        entry(PRODUCTION, 900, 2, latency_ms=[90.0]),
        entry("base", 5, 0),
        entry(CANARY, 99, 99, window=3),  # another window
        {**entry(CANARY, 99, 99), "adapter": "acme/tiny-llama/other"},  # another adapter
    )
    second = document(
        "r2:8000",
        entry(CANARY, 20, 2, accepted=6, latency_ms=[120.0], ms_per_token=[11.0], breaker="open"),
        entry(PRODUCTION, 1100, 3, latency_ms=[95.0]),
    )
    live = stats(first, second, first)  # r1 reported twice: counted once
    assert live.replicas == 2
    assert (live.canary.requests, live.canary.errors, live.canary.fallbacks) == (30, 3, 1)
    assert (live.canary.accepted, live.canary.retried, live.canary.routed) == (10, 1, 31)
    assert sorted(live.canary.latency_ms) == [100.0, 110.0, 120.0] and live.canary.breaker_open
    assert (live.production.requests, live.production.errors) == (2000, 5)
    assert live.base.requests == 5, "the base's answers are reported apart"


def test_without_a_production_version_the_base_is_production():
    live = stats(document("r1:8000", entry(CANARY, 10), entry("base", 500, 1)), production=None)
    assert live.production.requests == 500 and live.base.requests == 0


def test_side_percentiles_and_merge():
    side = LiveSide(100, latency_ms=tuple(float(i) for i in range(1, 101)))
    assert (side.p50_ms, side.p95_ms, side.p99_ms) == (50.0, 95.0, 99.0)
    merged = side.merge(LiveSide(10, 1, trips=1))
    assert (merged.requests, merged.errors, merged.trips, len(merged.latency_ms)) == (110, 1, 1, 100)
    assert LiveSide().error_rate is None and LiveSide().acceptance_rate is None


@pytest.mark.parametrize(
    "bad",
    [
        [{"replica": "r1", "versions": "many"}],
        [document("r1", entry(CANARY, "lots"))],
        [document("r1", entry(CANARY, 10, latency_ms=["slow"]))],
        [document("r1", entry(CANARY, -1))],
    ],
)
def test_a_report_that_is_not_one_is_refused_with_a_code(bad):
    with pytest.raises(ReplicaError) as caught:
        LiveStats.from_replicas(bad, ADAPTER, WINDOW, CANARY, PRODUCTION)
    assert caught.value.code == ErrorCode.REPLICA_REFUSED


# -- the record and the evidence ---------------------------------------------------------------


def live_judgement() -> LiveJudgement:
    return judge_live(GATED, sides(EQUAL_CANARY, EQUAL_PRODUCTION), 0.01)


def test_an_observation_keeps_the_live_judgement_and_old_records_still_load():
    got = live_judgement()
    o = Observation(WINDOW, LATE, probe(), probe(), 0.0, [], Verdict.READY, got.monitors, [], live=got.as_dict())
    stored = o.as_dict()
    assert stored["live"]["ab"]["meets_bar"] is True and stored["live"]["stats"]["canary"]["requests"] == 3000
    assert SideStats.from_dict(stored["canary"]) == o.canary
    old = {k: v for k, v in stored["canary"].items() if k != "latencies_ms"}
    assert SideStats.from_dict(old).latencies_ms == ()
    assert math.isfinite(stored["live"]["stats"]["canary"]["p95_ms"])


def test_the_evidence_shows_live_and_probe_figures_side_by_side_and_the_ab_lines():
    got = live_judgement()
    o = Observation(WINDOW, LATE, probe(), probe(), 0.0, [], Verdict.READY, got.monitors, ["ok"], live=got.as_dict())
    text = canary_evidence_markdown(window(), [o])
    assert "| live | 3/3000 |" in text and "| probes | 0/16 |" in text
    assert "| error_rate | 0.0010 | 0.0010 |" in text and "meets bar" in text
    row = observation_row(o)
    assert row["canary live errors"] == "3/3000" and row["live verdict"] == "in band"
    # the sequential error rule's statistic and its threshold, as the judgement kept them
    assert "- live errors, sequential: evidence " in text and "rolls back at 400 (" in text
