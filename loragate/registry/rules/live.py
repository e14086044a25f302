"""The live half of a canary verdict: what real requests said about canary and production.

Each production replica counts, per adapter, version and canary window, the requests it
answered (``GET /loragate/traffic``; one version's figures: ``rules/live_side.py``);
``LiveStats.from_replicas`` sums one such document per replica into a canary side and a
production side. Entries of version ``"base"`` (the base answering for the adapter) are
reported apart, since a version's own ``fallbacks`` already says which side fell back.

``judge_live`` turns them into monitors. Both sides are served by the same replicas at the
same moments, so what differs is the version -- but live counts are small at a 1 % share,
so every rule is a test, never a bare comparison: one error in 100 against none in 1000 is
noise, ten is not. Worse errors roll back, decided by a sequential test whose error rate
holds however often the window is looked at (``rules/sequential.py``), on requests counted
at what they are worth where a user's failures cluster (``rules/units.py``: the split
randomises users, not requests). A
tripped breaker is evidence, never a rollback on its own: it has already protected the users
(they got the fallback), and a client can trip it -- a few requests that look slow or fail
in the canary's bucket -- while a canary that really fails shows it in its error test. A p95
(or per-token p95) above ``ratio x production + slack`` that the rank test confirms is a
latency breach for the streak rule; too few live requests, or (with the A/B gate on) an
unmet bar, keep the window from becoming ready. Where the golden set declares an output
schema, the sampled answers' format compliance is reported per version and compared as an
A/B metric.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from loragate.registry.errors import ReplicaError
from loragate.registry.rules.ab import ABReport, compare
from loragate.registry.rules.canary import CanaryThresholds, Monitor, percentile
from loragate.registry.rules.formats import FormatCheck, FormatCompliance, measure
from loragate.registry.rules.live_side import LiveSide
from loragate.registry.rules.power import Coverage, coverage
from loragate.registry.rules.sequential import ErrorEvidence, rule_alpha, spent_alpha
from loragate.registry.rules.significance import fisher_exact_greater, mann_whitney_greater
from loragate.registry.rules.units import DesignEffect, carried_by_one_user, design_effect

BASE = "base"  # the version of an entry the base model answered


class Feedback:
    """A side's tenant feedback over replicas, each request id counted once however many
    replicas it was sent to: entries carry ``feedback`` (nonce -> ``a`` or ``r``); an entry
    without it (a replica of an older plugin) adds its counts as they are."""

    def __init__(self) -> None:
        self.ids: dict[str, str] = {}
        self.accepted = self.retried = 0

    def add(self, entry: dict[str, Any], where: str) -> None:
        """Raises:
        ReplicaError: REPLICA_REFUSED, a ``feedback`` that is not nonce -> a/r.
        """
        given = entry.get("feedback")
        if given is None:
            self.accepted += int(entry.get("accepted") or 0)
            self.retried += int(entry.get("retried") or 0)
            return
        if not isinstance(given, dict) or not all(isinstance(k, str) and v in ("a", "r") for k, v in given.items()):
            raise ReplicaError(f"{where} of a traffic report holds feedback that is not nonce -> a/r", field=where)
        for nonce, outcome in given.items():
            self.ids.setdefault(nonce, outcome)  # the first replica's, in name order

    def counted(self, side: LiveSide) -> LiveSide:
        accepted = self.accepted + sum(1 for o in self.ids.values() if o == "a")
        retried = self.retried + sum(1 for o in self.ids.values() if o == "r")
        return dataclasses.replace(side, accepted=accepted, retried=retried)


@dataclass(frozen=True)
class LiveStats:
    """A window's live figures: the canary version's, production's, the base's answers for
    the adapter, and the breaker alerts of its versions."""

    canary: LiveSide
    production: LiveSide
    base: LiveSide = field(default_factory=LiveSide)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    replicas: int = 0
    canary_version: str | None = None
    production_version: str | None = None  # None: the base answers for the adapter

    @classmethod
    def from_replicas(
        cls,
        documents: Iterable[dict[str, Any]],
        adapter: str,
        window_id: int,
        canary_version: str,
        production_version: str | None,
    ) -> LiveStats:
        """Sum the traffic documents of the production replicas (one per replica; a replica
        reported twice counts once, its last document) for one adapter's window.

        Production is the production version's entries of the window, or the base's while
        the adapter has no production version.

        Raises:
            ReplicaError: REPLICA_REFUSED for a document or entry that is not a traffic report.
        """
        latest: dict[str, dict[str, Any]] = {}
        for number, document in enumerate(documents):
            if not isinstance(document, dict) or not isinstance(document.get("versions", []), list):
                raise ReplicaError(f"traffic report {number} is not an object with a versions list", field="versions")
            latest[str(document.get("replica", f"#{number}"))] = document
        production_key = production_version or BASE
        # the side each version's entries count for: the canary, production (the base while
        # the adapter has none), and the base apart when it answers for a production version
        side_of = {canary_version: "canary", production_key: "production"}
        side_of.setdefault(BASE, "base")
        sides = {side: LiveSide() for side in ("canary", "production", "base")}
        feedback = {side: Feedback() for side in sides}
        alerts = []
        for name, document in sorted(latest.items()):
            for index, entry in enumerate(document.get("versions") or []):
                if not isinstance(entry, dict) or entry.get("adapter") != adapter or entry.get("window") != window_id:
                    continue
                version = entry.get("version")
                side = side_of.get(version) if isinstance(version, str) else None
                if side is None:
                    continue
                where = f"{name} versions[{index}]"
                sides[side] = sides[side].merge(LiveSide.from_entry(entry, where))
                feedback[side].add(entry, where)
            for alert in document.get("alerts") or []:
                if (
                    isinstance(alert, dict)
                    and alert.get("adapter") == adapter
                    and alert.get("window") in (window_id, None)
                ):
                    alerts.append({**alert, "replica": name})
        canary, production, base = (feedback[k].counted(sides[k]) for k in ("canary", "production", "base"))
        return cls(canary, production, base, alerts, len(latest), canary_version, production_version)

    @property
    def canary_trips(self) -> int:
        """Breaker trips of the canary: counted by the replicas, or alerted."""
        alerted = sum(
            1 for a in self.alerts if a.get("kind") == "breaker_open" and a.get("version") == self.canary_version
        )
        return max(self.canary.trips, alerted)

    def summary(self) -> dict[str, Any]:
        return {
            "replicas": self.replicas,
            "canary": self.canary.summary(),
            "production": self.production.summary(),
            "base": self.base.summary(),
            "alerts": self.alerts,
            "canary_version": self.canary_version,
        }


@dataclass(frozen=True)
class LiveJudgement:
    """What the live figures say about one evaluation of a window (``judge`` folds it in)."""

    monitors: list[Monitor]
    error_evidence: ErrorEvidence
    rollback: bool
    latency_breach: bool
    not_ready_reasons: list[str]
    ab: ABReport
    stats: LiveStats
    share: float
    coverage: Coverage  # the live requests the window needs, and its progress
    reasons: list[str] = field(default_factory=list)  # why it rolls back or breaches, with p
    clustering: DesignEffect = field(default_factory=DesignEffect)  # of both sides' users
    # side ("canary", "production") -> its sampled answers' compliance; None: no schema declared
    format_compliance: dict[str, FormatCompliance] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The JSON-able record kept on the observation (``Observation.live``)."""
        return {
            "share": self.share,
            "coverage": self.coverage.as_dict(),
            "design_effect": self.clustering.as_dict(),
            "stats": self.stats.summary(),
            "monitors": [m.as_dict() for m in self.monitors],
            "error_evidence": self.error_evidence.as_dict(),
            "rollback": self.rollback,
            "latency_breach": self.latency_breach,
            "not_ready_reasons": self.not_ready_reasons,
            "reasons": self.reasons,
            "ab": self.ab.as_dict(),
            "format_compliance": None
            if self.format_compliance is None
            else {side: f.as_dict() for side, f in self.format_compliance.items()},
        }


def _latency_monitor(
    name: str, canary: list[float], production: list[float], t: CanaryThresholds, alpha: float
) -> tuple[Monitor, str | None]:
    """A p95 above ratio x production + slack is a breach only if the rank test says the
    canary is slower too, at ``alpha``: one slow sample moves a p95, not the ranks."""
    c95, p95 = percentile(canary, 95), percentile(production, 95)
    if c95 is None or p95 is None:
        return Monitor(name, c95, None, True), None
    bound = p95 * t.p95_ratio + t.p95_slack_ms
    test = mann_whitney_greater(canary, production)
    slower = test is not None and test.p_value < alpha
    if test is None or c95 <= bound or not slower:
        return Monitor(name, c95, bound, True), None
    return Monitor(name, c95, bound, False), (
        f"{name} {c95:.4g} > {bound:.4g} and slower by rank test "
        f"(p={test.p_value:.2g} < {alpha:.2g}, P(slower)={test.superiority:.2f})"
    )


def judge_live(
    thresholds: CanaryThresholds,
    live: LiveStats,
    share: float,
    format_check: FormatCheck | None = None,
    previous: dict[str, Any] | None = None,
    every_replica: bool = True,
    elapsed_s: float = 0.0,
    remaining_s: float = 0.0,
    look: int = 1,
) -> LiveJudgement:
    """The live monitors of one evaluation of a window opened at ``share``; ``previous``, the
    error evidence the window's last judgement kept (``LiveJudgement.error_evidence``). With
    a replica's figures missing (``every_replica`` False) the evidence stays as it was: the
    sums dropped by that replica's counts, which come back with it, and counting them again
    when they do would count its requests twice.

    - ``live_error_rate``: out of band (ROLLBACK) when the sequential evidence that the canary
      fails more often than production reaches its threshold (``rules/sequential.py``): a
      version that fails as production does is rolled back by it in at most
      ``false_rollback / 4`` of windows, however often they are evaluated -- each request
      counted as ``1 / design effect`` of one, the effect estimated on both sides' sampled
      users (``rules/units.py``), which the need and the A/B error interval use too -- and
      never on one user's failures alone (``carried_by_one_user``: reported, in band);
    - ``live_breaker``: the canary's breaker trips (counted by a replica, or a
      ``breaker_open`` alert for the canary version), reported as evidence and in band: a
      trip is never a rollback on its own (module docstring);
    - ``live_p95_ms``, ``live_ms_per_token_p95``: out of band (a latency breach, for the
      streak rule) when above ratio x production + slack and the rank test finds the canary
      slower at this ``look``'s level (the window's ``look``-th live judgement, 1-based): the
      live latency rule's quarter of ``false_rollback``, halved between the two tests, spent
      as ``alpha / (k (k + 1))`` at look k -- the samples are cumulative, so the looks' tests
      are not independent, and the union bound holds whatever they share;
    - not ready while a canary with a share answered fewer live requests than it needs
      (``rules/power.py``: enough to catch errors ``detect_ratio`` x production's at
      ``power``, and at least ``min_live_requests``; ``elapsed_s`` and ``remaining_s`` of the
      window project its pace -- a dark canary, share 0, is exempt), its fallbacks are
      significantly more frequent than production's, or (``ab_gate``) the A/B bar is not met;
    - ``format_check`` (``formats.schema_check`` of the golden set's schemas; None: no
      schema, not measured): each side's sampled answers' format compliance, reported and
      compared in the A/B report (``format_compliance``).
    """
    t = thresholds
    alpha = 1 - t.confidence
    c, p = live.canary, live.production
    reasons: list[str] = []
    evidence = ErrorEvidence.from_dict(previous, rule_alpha(t.false_rollback))
    clustering = design_effect([(c.units.counts.values(), c.requests), (p.units.counts.values(), p.requests)])
    if every_replica:
        evidence = evidence.look(c.requests, c.errors, p.requests, p.errors, clustering.value)
    errors_worse = evidence.worse
    carried = None
    if errors_worse:
        carried = carried_by_one_user((c.requests, c.errors, p.requests, p.errors), c.units, clustering, evidence.alpha)
        errors_worse = carried is None
    if carried is not None:
        reasons.append(
            f"live errors {c.errors}/{c.requests} reach the rule's threshold only with one user's "
            f"{carried[1]} failures in {carried[0]} requests: one user is one unit, not a rollback (evidence)"
        )
    if errors_worse:
        reasons.append(
            f"live errors {c.errors}/{c.requests} worse than production's {p.errors}/{p.requests}: "
            + evidence.describe()
        )
    trips = live.canary_trips
    if trips:
        reasons.append(f"the canary's circuit breaker tripped {trips} time(s): its users got the fallback (evidence)")
    # the live latency rule's quarter of the budget, half to each of its two tests, spent over
    # the window's looks (their samples overlap: a union bound, not a product)
    latency_alpha = spent_alpha(rule_alpha(t.false_rollback) / 2, look)
    p95, p95_reason = _latency_monitor("live_p95_ms", list(c.latency_ms), list(p.latency_ms), t, latency_alpha)
    per_token, per_token_reason = _latency_monitor(
        "live_ms_per_token_p95", list(c.ms_per_token), list(p.ms_per_token), t, latency_alpha
    )
    reasons += [r for r in (p95_reason, per_token_reason) if r]
    checks = [
        Monitor("live_error_rate", c.error_rate, p.error_rate, not errors_worse),
        Monitor("live_breaker", float(trips), 0.0, True),
        p95,
        per_token,
    ]
    covered = coverage(t.detection, share, c.requests, p.requests, p.errors, elapsed_s, remaining_s, clustering.value)
    not_ready = []
    if share > 0 and not covered.met:
        not_ready.append(covered.describe())
    fallbacks = fisher_exact_greater(c.fallbacks, c.routed, p.fallbacks, p.routed)
    if fallbacks is not None and fallbacks.p_value < alpha:
        not_ready.append(
            f"live: the canary fell back to the base {c.fallbacks} of {c.routed} times "
            f"against production's {p.fallbacks} of {p.routed} (p={fallbacks.p_value:.2g})"
        )
    formats = None
    if format_check is not None:
        formats = {
            "canary": measure(live.canary_version, c.samples, format_check),
            "production": measure(live.production_version or BASE, p.samples, format_check),
        }
    ab = compare(t, c, p, formats, clustering.value)
    if t.ab_gate and not ab.meets_bar:
        not_ready += ab.failing()
    return LiveJudgement(
        monitors=checks,
        error_evidence=evidence,
        rollback=errors_worse,
        latency_breach=not p95.in_band or not per_token.in_band,
        not_ready_reasons=not_ready,
        ab=ab,
        stats=live,
        share=share,
        coverage=covered,
        reasons=reasons,
        clustering=clustering,
        format_compliance=None if formats is None else {k: v for k, v in formats.items() if v is not None},
    )
