"""The canary verdict on one observation: the probes' monitors (``rules/canary.py``) and, for
a window that takes live traffic, the live judgement of the same evaluation
(``rules/live.py``).

Probe errors more frequent than production's -- by the sequential test of
``rules/sequential.py`` over the window's observations, each failed probe asked again once --
or golden drift above epsilon (each differing answer read twice) roll the canary back at
once, as do worse live errors. A latency breach -- a probe's, or a live one the
rank test confirms -- must repeat ``latency_breaches`` observations in a row. Too few live
requests (or an unmet A/B bar, when it gates) keep the window from ready; it is ready for
sign-off once its length has passed with every monitor in band. A window over without the live
requests its verdict needs (``rules/power.py``) -- or still not ready at twice its length, for
any reason -- is **undecided**: withdrawn unproven, never ready by default, never open forever.
"""

from __future__ import annotations

from datetime import datetime

from loragate.registry.rules.canary import (
    LATENCY_MONITORS,
    CanaryThresholds,
    CanaryWindow,
    Monitor,
    Observation,
    Pairs,
    SideStats,
    Verdict,
    monitors,
    probe_band,
    probe_slower_p,
)
from loragate.registry.rules.live import LiveJudgement
from loragate.registry.rules.sequential import ErrorEvidence, LatencyEvidence, rule_alpha


def probe_error_evidence(
    thresholds: CanaryThresholds, canary: SideStats, production: SideStats, earlier: list[Observation]
) -> ErrorEvidence:
    """The sequential evidence that the canary's probes fail more often than production's,
    after this observation: each observation's probes are one interval
    (``rules/sequential.py``), at the probe error rule's quarter of ``false_rollback``. A
    failed probe was asked again once before it counted (``tasks/canary.py``)."""
    kept = next((o.probe_evidence for o in reversed(earlier) if o.probe_evidence), None)
    evidence = ErrorEvidence.from_dict(kept, rule_alpha(thresholds.false_rollback))
    seen = evidence.seen
    return evidence.look(
        seen[0] + canary.requests, seen[1] + canary.errors, seen[2] + production.requests, seen[3] + production.errors
    )


def probe_latency_evidence(
    thresholds: CanaryThresholds,
    canary: SideStats,
    production: SideStats,
    pairs_ms: Pairs,
    against_base: bool,
    earlier: list[Observation],
) -> LatencyEvidence:
    """The sequential evidence that the canary's probes are slower than the band allows,
    after this observation: its probes' rank test (``probe_slower_p``) calibrated into an
    e-value and multiplied into the window's (``rules/sequential.py``), at the probe latency
    rule's quarter of ``false_rollback``."""
    kept = next((o.latency_evidence for o in reversed(earlier) if o.latency_evidence), None)
    evidence = LatencyEvidence.from_dict(kept, rule_alpha(thresholds.false_rollback))
    ratio = probe_band(thresholds, against_base)
    return evidence.look(probe_slower_p(thresholds, canary, production, pairs_ms, ratio))


def _latency_breach(checks: list[Monitor]) -> bool:
    return any(m.name in LATENCY_MONITORS and not m.in_band for m in checks)


def judge(
    window: CanaryWindow,
    canary: SideStats,
    production: SideStats,
    drift: float,
    earlier: list[Observation],
    now: datetime,
    live: LiveJudgement | None = None,
    pairs_ms: Pairs = (),
    against_base: bool = False,
    probe_evidence: ErrorEvidence | None = None,
    latency_evidence: LatencyEvidence | None = None,
) -> tuple[Verdict, list[Monitor], list[str]]:
    """The verdict on one observation, given the window's earlier ones (oldest first) and,
    for a window that takes live traffic, the live judgement of the same evaluation, and
    the probes' back-to-back pairs; ``against_base``: the adapter has no production version,
    so production is the bare base and the probe latency band is the first canary's;
    ``probe_evidence``, ``latency_evidence``: this observation's ``probe_error_evidence`` and
    ``probe_latency_evidence`` (computed here when not given).

    Returns (verdict, monitors, reasons); reasons name every monitor out of band, or say
    why the window is not ready yet. A window with a share of live traffic and a minimum of
    live requests is not ready without a live judgement.
    """
    t = window.thresholds
    errors = probe_evidence or probe_error_evidence(t, canary, production, earlier)
    slower = latency_evidence or probe_latency_evidence(t, canary, production, pairs_ms, against_base, earlier)
    # no samples to test (records from before the rank test): the p95 alone decides, as it did
    tested = probe_slower_p(t, canary, production, pairs_ms, probe_band(t, against_base)) is not None
    checks = monitors(
        t, canary, production, drift, against_base, errors_worse=errors.worse, slower=slower.worse or not tested
    )
    by_name = {m.name: m for m in checks}
    if live is not None:
        checks += live.monitors
    reasons = [f"{m.describe()} (out of band)" for m in checks if not m.in_band]
    if errors.worse:
        reasons.append(f"probe errors worse than production's: {errors.describe()}")
    if not by_name["p95_ms"].in_band and slower.looks:
        reasons.append(f"probes slower than the band: {slower.describe()}")
    if live is not None:
        reasons += live.reasons
    if not by_name["error_rate"].in_band or not by_name["golden_drift"].in_band or (live and live.rollback):
        return Verdict.ROLLBACK, checks, reasons
    if _latency_breach(checks):
        streak = 1
        for previous in reversed(earlier):
            if _latency_breach(previous.monitors):
                streak += 1
            else:
                break
        if streak >= t.latency_breaches:
            return Verdict.ROLLBACK, checks, [*reasons, f"p95 out of band {streak} observations in a row"]
        return Verdict.CONTINUE, checks, [*reasons, f"p95 out of band {streak}/{t.latency_breaches} in a row"]
    if live is not None:
        not_ready = live.not_ready_reasons
    elif window.share > 0 and t.min_live_requests > 0:
        not_ready = [f"live: no live figures for a window at share {window.share:g}"]
    else:
        not_ready = []
    if now < window.ends_at:
        left = (window.ends_at - now).total_seconds()
        return Verdict.CONTINUE, checks, [f"in band; window ends in {left:.0f} s", *not_ready]
    if not_ready:
        short = live is not None and window.share > 0 and not live.coverage.met
        if short or now >= window.ends_at + (window.ends_at - window.opened_at):
            why = "its live traffic could not decide it" if short else "not ready for twice its length"
            return Verdict.UNDECIDED, checks, [f"window over undecided: {why}", *not_ready]
        return Verdict.CONTINUE, checks, ["window over but not ready", *not_ready]
    return Verdict.READY, checks, [f"in band for the whole window ({t.length_s:g} s)"]
