"""The canary watch: a window in which a canary must stay in band before sign-off.

Deploying a version to the canary replicas opens a **window** (start, length, thresholds,
kept in the registry so a later change of settings does not move the goalposts of a running
canary). Each scheduled evaluation sends the same prompts through the canary and the
production replicas and records an **observation**: per side the error rate and latency
p50/p95, and the canary's *golden drift* -- the share of golden prompts it answers
differently from what shadow validation recorded for the version.

This module is pure, like ``lifecycle``: the window, its thresholds, each side's probe
figures and the monitors they make. A p95 above ``ratio x production + slack`` is out of
band only when a rank test says the canary is slower too (one slow sample moves a p95 of
16, not the ranks). The probes go in back-to-back pairs (the canary, then production, on
the same prompt), so the test is Wilcoxon's signed-rank test on each pair's log ratio
beyond log(ratio): a host's load shifts both halves of a pair alike, where it drowns a
difference between two pooled samples (Mann-Whitney, kept for observations with too few
pairs). The verdict on an observation -- with the ones before it and, for a window that
takes live traffic, the live judgement -- is ``rules/verdict.py``'s.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from loragate.registry.errors import ErrorCode, IllegalTransition
from loragate.registry.rules.power import Detection
from loragate.registry.rules.sequential import rule_alpha
from loragate.registry.rules.significance import mann_whitney_greater, wilcoxon_greater


class WindowStatus(StrEnum):
    OPEN = "open"  # observing
    READY = "ready"  # in band for its whole length: waiting for a sign-off
    PROMOTED = "promoted"
    REJECTED = "rejected"  # a person said no
    ROLLED_BACK = "rolled_back"  # a monitor went out of band
    SUPERSEDED = "superseded"  # another version of the adapter entered canary
    # over without the live requests a verdict needs (``rules/power.py``): withdrawn, unproven
    UNDECIDED = "undecided"


# where each status may go; a move already made is a no-op, never an error
WINDOW_MOVES: dict[WindowStatus, frozenset[WindowStatus]] = {
    WindowStatus.OPEN: frozenset(
        {WindowStatus.READY, WindowStatus.ROLLED_BACK, WindowStatus.SUPERSEDED, WindowStatus.UNDECIDED}
    ),
    WindowStatus.READY: frozenset(
        {WindowStatus.PROMOTED, WindowStatus.REJECTED, WindowStatus.ROLLED_BACK, WindowStatus.SUPERSEDED}
    ),
    # a promotion whose transaction rolled back: production went back to the version before
    WindowStatus.PROMOTED: frozenset({WindowStatus.ROLLED_BACK}),
}
ACTIVE = (WindowStatus.OPEN, WindowStatus.READY)


def window_end(status: WindowStatus, *, promoted: bool, withdrawn: bool) -> WindowStatus:
    """How an active window ends when its version stops being the adapter's canary, decided
    in the pointer move's own transaction: promoted to production (a ready window
    ``promoted``; one still observing ``superseded``, promoted before its window decided),
    withdrawn (``rolled_back``), or replaced by another version (``superseded``)."""
    if promoted:
        return WindowStatus.PROMOTED if status == WindowStatus.READY else WindowStatus.SUPERSEDED
    return WindowStatus.ROLLED_BACK if withdrawn else WindowStatus.SUPERSEDED


Pairs = tuple[tuple[float, float], ...]


class Verdict(StrEnum):
    CONTINUE = "continue"
    ROLLBACK = "rollback"
    READY = "ready"
    UNDECIDED = "undecided"  # over, and its traffic could not decide it (``rules/power.py``)


# the window moves only a verdict makes, stored with its observation in one statement (on
# Postgres the evaluator's function, migration 0015): no other caller moves a window there
VERDICT_MOVES: dict[Verdict, WindowStatus] = {
    Verdict.READY: WindowStatus.READY,
    Verdict.UNDECIDED: WindowStatus.UNDECIDED,
}


def override_required(window_id: int, version_id: str) -> IllegalTransition:
    """The refusal of production for a version whose window is still observing: only a
    person's explicit override, with a reason, promotes past a verdict not given yet."""
    return IllegalTransition(
        f"canary window {window_id} of {version_id} is still observing: production before its verdict is "
        "an override (--override with a --reason)",
        code=ErrorCode.OVERRIDE_REQUIRED,
        field="override",
    )


@dataclass(frozen=True)
class CanaryThresholds:
    length_s: float
    p95_ratio: float = 1.10
    p95_slack_ms: float = 0.0
    # the band of a first canary, whose production is the bare base (LoRA's own cost)
    first_p95_ratio: float = 1.5
    drift_epsilon: float = 0.05
    latency_breaches: int = 2
    # live traffic (rules/live.py): the minimum live canary requests before ready, the
    # confidence of the live tests, and whether the A/B bar gates readiness
    min_live_requests: int = 0
    confidence: float = 0.95
    ab_gate: bool = False
    ab_error_margin: float = 0.01
    # the chance a version as good as production is ever rolled back in its window, shared
    # by the rules that can roll back (rules/sequential.py); windows opened before it: 1 %
    false_rollback: float = 0.01
    # what the live traffic must be able to detect before ready (``rules/power.py``): errors
    # ``detect_ratio`` x production's (at least ``detect_error_rate``) at ``power``; windows
    # opened before it: 0, the minimum of live requests alone. The split ramps up to
    # ``max_auto_share`` (0: never) to get there by the window's end
    detect_ratio: float = 0.0
    power: float = 0.8
    detect_error_rate: float = 0.01
    max_auto_share: float = 0.0

    @property
    def detection(self) -> Detection:
        return Detection(
            self.detect_ratio,
            self.power,
            rule_alpha(self.false_rollback),
            self.detect_error_rate,
            self.min_live_requests,
        )

    @classmethod
    def from_settings(cls, settings: Any) -> CanaryThresholds:
        return cls(
            length_s=settings.canary_window_s,
            p95_ratio=settings.canary_p95_ratio,
            p95_slack_ms=settings.canary_p95_slack_ms,
            first_p95_ratio=settings.canary_first_p95_ratio,
            drift_epsilon=settings.canary_drift_epsilon,
            latency_breaches=settings.canary_latency_breaches,
            min_live_requests=settings.canary_min_live_requests,
            confidence=settings.canary_confidence,
            ab_gate=settings.canary_ab_gate,
            ab_error_margin=settings.canary_ab_error_margin,
            false_rollback=settings.canary_false_rollback,
            detect_ratio=settings.canary_detect_ratio,
            power=settings.canary_power,
            detect_error_rate=settings.canary_detect_error_rate,
            # never past the cap a window is held to without a person
            max_auto_share=min(settings.canary_max_auto_share, settings.canary_max_share),
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CanaryThresholds:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class SideStats:
    """What one side (the canary or production replicas) did in one observation."""

    requests: int
    errors: int
    p50_ms: float | None
    p95_ms: float | None
    error_kinds: dict[str, int] = field(default_factory=dict)
    # the answered requests' latencies, for the rank test (empty in records older than it)
    latencies_ms: tuple[float, ...] = ()

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @classmethod
    def from_samples(cls, latencies_ms: list[float], errors: list[str]) -> SideStats:
        kinds: dict[str, int] = {}
        for kind in errors:
            kinds[kind] = kinds.get(kind, 0) + 1
        return cls(
            requests=len(latencies_ms) + len(errors),
            errors=len(errors),
            p50_ms=percentile(latencies_ms, 50),
            p95_ms=percentile(latencies_ms, 95),
            error_kinds=kinds,
            latencies_ms=tuple(round(v, 3) for v in latencies_ms),
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "latencies_ms": list(self.latencies_ms), "error_rate": round(self.error_rate, 4)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SideStats:
        return cls(
            data["requests"],
            data["errors"],
            data["p50_ms"],
            data["p95_ms"],
            dict(data.get("error_kinds", {})),
            tuple(float(v) for v in data.get("latencies_ms") or ()),
        )


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return round(ordered[rank - 1], 3)


@dataclass(frozen=True)
class Monitor:
    name: str
    value: float | None
    bound: float | None
    in_band: bool

    def describe(self) -> str:
        value = "n/a" if self.value is None else f"{self.value:.4g}"
        bound = "n/a" if self.bound is None else f"{self.bound:.4g}"
        return f"{self.name} {value} {'<=' if self.in_band else '>'} {bound}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# monitors whose breach counts towards the latency streak (probe and live)
LATENCY_MONITORS = frozenset({"p95_ms", "live_p95_ms", "live_ms_per_token_p95"})


# fewer back-to-back pairs than this: the pooled samples' rank test instead
MIN_PAIRS = 8


def probe_slower_p(
    thresholds: CanaryThresholds, canary: SideStats, production: SideStats, pairs_ms: Pairs = (), ratio: float = 0.0
) -> float | None:
    """The one-sided p-value that the canary's probes are slower than ``ratio`` x
    production's (the band's ``p95_ratio`` unless given): the signed-rank test on the pairs'
    log ratios beyond log(ratio) where there are MIN_PAIRS of them, else Mann-Whitney on the
    pooled samples; None where neither side has samples to test."""
    # beyond the band, pair by pair: slower than ratio x production, not merely slower (an
    # adapter's own LoRA arithmetic makes it a little slower than a bare base, every time)
    ratio = ratio or thresholds.p95_ratio
    margin = math.log(ratio) if ratio > 0 else 0.0
    ratios = [math.log(c / p) - margin for c, p in pairs_ms if c > 0 and p > 0]
    if len(ratios) >= MIN_PAIRS:
        paired = wilcoxon_greater(ratios)
        return 1.0 if paired is None else paired.p_value
    if not canary.latencies_ms or not production.latencies_ms:
        return None
    test = mann_whitney_greater(list(canary.latencies_ms), list(production.latencies_ms))
    return 1.0 if test is None else test.p_value


def probe_band(thresholds: CanaryThresholds, against_base: bool) -> float:
    """The probe latency band's ratio: a first canary's (against the bare base) or the usual."""
    return thresholds.first_p95_ratio if against_base else thresholds.p95_ratio


def monitors(
    thresholds: CanaryThresholds,
    canary: SideStats,
    production: SideStats,
    drift: float,
    against_base: bool = False,
    errors_worse: bool | None = None,
    slower: bool = True,
) -> list[Monitor]:
    """The three monitors of one observation, each with its bound. The p95 is out of band
    above its bound only when the canary is ``slower`` too: the sequential latency rule's
    decision over the window's observations (``rules/verdict.py``). ``against_base``:
    production is the bare base (a first canary), and the band is ``first_p95_ratio``.
    ``errors_worse``: the sequential probe error rule's decision; None, a bare comparison of
    this observation's rates (records from before that rule)."""
    p95_bound = None
    p95_in_band = True
    if canary.p95_ms is not None and production.p95_ms is not None:
        p95_bound = production.p95_ms * probe_band(thresholds, against_base) + thresholds.p95_slack_ms
        p95_in_band = canary.p95_ms <= p95_bound or not slower
    elif canary.p95_ms is None and canary.requests:
        p95_in_band = False  # every canary request failed: no latency to judge, and that is not in band
    return [
        Monitor(
            "error_rate",
            canary.error_rate,
            production.error_rate,
            not errors_worse if errors_worse is not None else canary.error_rate <= production.error_rate,
        ),
        Monitor("p95_ms", canary.p95_ms, p95_bound, p95_in_band),
        Monitor("golden_drift", drift, thresholds.drift_epsilon, drift <= thresholds.drift_epsilon),
    ]


@dataclass(frozen=True)
class CanaryWindow:
    id: int
    adapter_name: str
    version_id: str
    status: WindowStatus
    opened_at: datetime
    thresholds: CanaryThresholds
    closed_at: datetime | None = None
    reason: str | None = None
    approval_flow_run_id: str | None = None
    # share of the adapter's live requests the canary answers (0: a dark canary, probes only)
    share: float = 0.0

    @property
    def ends_at(self) -> datetime:
        return self.opened_at + timedelta(seconds=self.thresholds.length_s)

    def promoted_already(self, production: str | None) -> bool:
        """Whether a sign-off or a promotion of this window finds its work done: the window
        was promoted and its version is production (a re-run). Otherwise the window must be
        ready, which is what both the sign-off and the move itself start from.

        Raises:
            IllegalTransition: the window is neither promoted to production nor ready.
        """
        if self.status == WindowStatus.PROMOTED and production == self.version_id:
            return True
        if self.status != WindowStatus.READY:
            raise IllegalTransition(
                f"{self.version_id}'s canary window is {self.status.value}, not ready for promotion", field="version_id"
            )
        return False

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "adapter_name": self.adapter_name,
            "version_id": self.version_id,
            "status": self.status.value,
            "opened_at": self.opened_at.isoformat(),
            "ends_at": self.ends_at.isoformat(),
            "thresholds": self.thresholds.as_dict(),
            "closed_at": self.closed_at.isoformat() if self.closed_at else None,
            "reason": self.reason,
            "approval_flow_run_id": self.approval_flow_run_id,
            "share": self.share,
        }


@dataclass(frozen=True)
class Observation:
    window_id: int
    at: datetime
    canary: SideStats
    production: SideStats
    drift: float
    drifted_cases: list[str]
    verdict: Verdict
    monitors: list[Monitor]
    reasons: list[str]
    id: int | None = None
    # the live judgement of this evaluation (LiveJudgement.as_dict()); None: probes only
    live: dict[str, Any] | None = None
    # (canary ms, production ms) of each probe both sides answered, back to back; the
    # reference generated as many tokens as the canary's answer (``tasks/canary.py``)
    pairs_ms: Pairs = ()
    # the sequential evidence that the canary's probes fail more often than production's, over
    # the window's observations up to this one (ErrorEvidence.as_dict()); None in older records
    probe_evidence: dict[str, Any] | None = None
    # the sequential evidence that the canary's probes are slower than the band allows, over
    # the window's observations (LatencyEvidence.as_dict()); None in older records
    latency_evidence: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "window_id": self.window_id,
            "at": self.at.isoformat(),
            "canary": self.canary.as_dict(),
            "production": self.production.as_dict(),
            "drift": self.drift,
            "drifted_cases": self.drifted_cases,
            "verdict": self.verdict.value,
            "monitors": [m.as_dict() for m in self.monitors],
            "reasons": self.reasons,
            "live": self.live,
            "pairs_ms": [list(pair) for pair in self.pairs_ms],
            "probe_evidence": self.probe_evidence,
            "latency_evidence": self.latency_evidence,
        }
