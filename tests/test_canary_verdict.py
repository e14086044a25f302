"""The canary verdict as a pure function, every rule a row: the bands, probe errors carried
from one observation to the next, a window ready only after its whole length, where a
sign-off or promotion may start, nearest-rank percentiles and the evidence a person reads
(the watch in the store: tests/test_canary.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from loragate.registry.errors import IllegalTransition
from loragate.registry.render.canary import canary_evidence_markdown
from loragate.registry.rules.canary import (
    CanaryThresholds,
    CanaryWindow,
    Monitor,
    Observation,
    SideStats,
    Verdict,
    WindowStatus,
    percentile,
)
from loragate.registry.rules.verdict import judge, probe_error_evidence

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
BANDS = CanaryThresholds(length_s=60, p95_ratio=1.10, p95_slack_ms=5, drift_epsilon=0.1, latency_breaches=2)


def window(status: WindowStatus = WindowStatus.OPEN) -> CanaryWindow:
    return CanaryWindow(1, "acme/tiny-llama/support", "v1", status, T0, BANDS)


def side(errors: int = 0, p95: float | None = 100.0, requests: int = 20) -> SideStats:
    return SideStats(requests, errors, None if p95 is None else p95 / 2, p95)


def slow(at: datetime) -> Observation:
    checks = [Monitor("p95_ms", 200.0, 115.0, False)]
    return Observation(1, at, side(p95=200), side(), 0.0, [], Verdict.CONTINUE, checks, [])


LATE, EARLY = T0 + timedelta(seconds=61), T0 + timedelta(seconds=30)

# (case, canary, production, drift, earlier observations, now, verdict, monitors out of band)
VERDICTS = [
    ("in-band-window-running", side(), side(), 0.0, [], EARLY, Verdict.CONTINUE, []),
    ("in-band-window-over", side(), side(), 0.0, [], LATE, Verdict.READY, []),
    ("p95-within-ratio-plus-slack", side(p95=114), side(p95=100), 0.0, [], LATE, Verdict.READY, []),
    # one probe error of 20 against none is noise for the sequential rule; 12 of 20 is not
    ("one-probe-error-is-noise", side(errors=1), side(), 0.0, [], EARLY, Verdict.CONTINUE, []),
    ("many-more-errors-than-production", side(errors=12), side(), 0.0, [], EARLY, Verdict.ROLLBACK, ["error_rate"]),
    ("errors-equal-to-production", side(errors=1), side(errors=1), 0.0, [], LATE, Verdict.READY, []),
    ("drift-above-epsilon", side(), side(), 0.25, [], EARLY, Verdict.ROLLBACK, ["golden_drift"]),
    ("drift-at-epsilon", side(), side(), 0.1, [], LATE, Verdict.READY, []),
    ("one-slow-observation-is-noise", side(p95=200), side(), 0.0, [], LATE, Verdict.CONTINUE, ["p95_ms"]),
    ("slow-twice-in-a-row", side(p95=200), side(), 0.0, [slow(EARLY)], LATE, Verdict.ROLLBACK, ["p95_ms"]),
    (
        "every-canary-request-failed",
        side(errors=20, p95=None),
        side(),
        0.0,
        [],
        EARLY,
        Verdict.ROLLBACK,
        ["error_rate", "p95_ms"],
    ),
    ("errors-beat-a-late-window", side(errors=12), side(), 0.0, [], LATE, Verdict.ROLLBACK, ["error_rate"]),
]


@pytest.mark.parametrize(
    "case, canary, production, drift, earlier, now, verdict, out", VERDICTS, ids=[v[0] for v in VERDICTS]
)
def test_the_verdict_follows_the_bands(case, canary, production, drift, earlier, now, verdict, out):
    got, checks, reasons = judge(window(), canary, production, drift, earlier, now)
    assert got == verdict
    assert sorted(m.name for m in checks if not m.in_band) == sorted(out)
    assert reasons, "every verdict says why"


def test_probe_errors_accumulate_over_the_windows_observations():
    """A few failing probes each time are noise once, evidence after a few observations: the
    probe error rule carries its evidence from one observation to the next."""
    verdicts, earlier = [], []
    for i in range(6):
        at = EARLY + timedelta(seconds=i)
        verdict, checks, _ = judge(window(), side(errors=6), side(), 0.0, earlier, at)
        evidence = probe_error_evidence(window().thresholds, side(errors=6), side(), earlier)
        earlier.append(
            Observation(1, at, side(errors=6), side(), 0.0, [], verdict, checks, [], probe_evidence=evidence.as_dict())
        )
        verdicts.append(verdict)
    assert verdicts[0] == Verdict.CONTINUE and Verdict.ROLLBACK in verdicts


def test_a_window_is_ready_only_after_its_whole_length():
    got, _, reasons = judge(window(), side(), side(), 0.0, [], T0 + timedelta(seconds=59))
    assert got == Verdict.CONTINUE and "ends in" in reasons[0]


PROMOTION_STARTS = [
    # (window status, the adapter's production, a re-run?, or refused)
    (WindowStatus.READY, None, False),
    (WindowStatus.READY, "v0", False),
    (WindowStatus.PROMOTED, "v1", True),
    (WindowStatus.PROMOTED, "v2", IllegalTransition),  # promoted once, since moved on
    (WindowStatus.OPEN, None, IllegalTransition),
    (WindowStatus.ROLLED_BACK, "v0", IllegalTransition),
]


@pytest.mark.parametrize(("status", "production", "outcome"), PROMOTION_STARTS)
def test_a_sign_off_or_promotion_starts_from_a_ready_window_or_finds_itself_done(status, production, outcome):
    """One rule for the promote flow's sign-off and the move itself."""
    if outcome is IllegalTransition:
        with pytest.raises(IllegalTransition) as refused:
            window(status).promoted_already(production)
        assert refused.value.field == "version_id"
    else:
        assert window(status).promoted_already(production) is outcome


def test_percentiles_are_nearest_rank():
    assert percentile([], 95) is None
    assert percentile([5.0], 95) == 5.0
    assert percentile([float(i) for i in range(1, 101)], 95) == 95.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0


def test_evidence_names_the_bands_and_each_observation():
    o = Observation(1, LATE, side(), side(), 0.0, [], Verdict.READY, [], ["in band for the whole window (60 s)"])
    text = canary_evidence_markdown(window(WindowStatus.READY), [o])
    assert "p95 ≤ 1.1× production's + 5 ms" in text and "golden drift ≤ 0.1" in text
    assert "| ready |" in text and "in band for the whole window" in text
