"""An always-valid test that the canary fails more often than production, however often the
window is looked at.

Between two looks each side answered some requests and some of them failed. Given how many
failed on both sides together (``n``), how many of those were the canary's is, if both
versions fail alike and requests fail independently, hypergeometric; if the canary's odds of
failing are ``psi`` times production's, it is Fisher's noncentral hypergeometric. The product
over the intervals of that likelihood ratio, averaged over a prior on ``psi``, is a
nonnegative martingale with mean 1 while the versions fail alike, so by Ville's inequality
the chance that it *ever* reaches ``1 / alpha`` is at most ``alpha`` -- whatever the number of
looks, whenever they are taken, whatever the share does between them. That is the rate this
rule guarantees: a version that fails as production does is rolled back by it in at most
``alpha`` of its windows. What it assumes: requests fail independently of one another.
Where they do not -- the split randomises users, and a user's requests can fail together --
each odds ratio's log likelihood ratio is divided by the window's design effect
(``rules/units.py``) before the mixture: Rao and Scott's first-order correction, applied to
the whole window's evidence at each look with the effect its users show by then, so a user
who keeps failing in interval after interval is counted as the one unit it is.

The state between looks is the cumulative counts last seen and the log likelihood ratio per
``psi``, kept on each observation (``ErrorEvidence.as_dict``). A look whose counts went down
(a replica restarted and lost its counters) adds nothing and starts the next interval from
what it saw; a look that could not read every replica is not taken (``judge_live``).
Skipping an interval for a reason that is not its outcome keeps the guarantee.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from loragate.registry.rules.significance import log_choose

# the prior over the canary's odds ratio of failing against production's: equal weights, from
# a 25 % worse canary to one that fails nearly every request (three failures of three)
ODDS_RATIOS: tuple[float, ...] = (1.25, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 100.0)
# the rules that can roll a canary back share the operator's false-rollback budget equally:
# live errors, live latency, probe errors and probe latency (``docs/live-traffic.md``)
ROLLBACK_RULES = 4


def rule_alpha(false_rollback: float) -> float:
    """The live error rule's share of ``LORAGATE_CANARY_FALSE_ROLLBACK``."""
    return false_rollback / ROLLBACK_RULES


def _log_sum_exp(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def interval_log_lr(
    canary_requests: int, canary_errors: int, production_requests: int, production_errors: int
) -> list[float]:
    """log of the likelihood ratio of one interval's split of failures, per odds ratio in
    ``ODDS_RATIOS``: Fisher's noncentral hypergeometric at ``psi`` over the central one.
    An interval with no failure, or no request on a side, says nothing (0 for each)."""
    a, b = canary_requests, production_requests
    n, x = canary_errors + production_errors, canary_errors
    if n == 0 or a == 0 or b == 0:
        return [0.0] * len(ODDS_RATIOS)
    low, high = max(0, n - b), min(a, n)
    weights = [log_choose(a, y) + log_choose(b, n - y) for y in range(low, high + 1)]
    central = _log_sum_exp(weights)
    out = []
    for psi in ODDS_RATIOS:
        log_psi = math.log(psi)
        tilted = _log_sum_exp([w + (low + i) * log_psi for i, w in enumerate(weights)])
        out.append(x * log_psi - (tilted - central))
    return out


@dataclass(frozen=True)
class ErrorEvidence:
    """The evidence that the canary fails more often than production, after one look."""

    seen: tuple[int, int, int, int]  # cumulative (canary requests, errors, production requests, errors)
    log_lr: tuple[float, ...]  # per odds ratio, summed over the intervals, every request as one
    alpha: float
    design_effect: float = 1.0  # the last look's: each log likelihood ratio is divided by it

    @property
    def e_value(self) -> float:
        """The mixture's likelihood ratio, each odds ratio's over the design effect: the
        statistic compared with ``threshold``."""
        d = max(1.0, self.design_effect)
        return sum(math.exp(min(v / d, 700.0)) for v in self.log_lr) / len(self.log_lr)

    @property
    def threshold(self) -> float:
        return 1.0 / self.alpha

    @property
    def worse(self) -> bool:
        return self.e_value >= self.threshold

    def describe(self) -> str:
        text = f"sequential evidence {self.e_value:.3g} (rolls back at {self.threshold:.3g}, alpha {self.alpha:.2g}"
        if self.design_effect > 1.0:
            text += f"; users' failures cluster: {self.design_effect:.3g} requests count as one"
        return text + ")"

    def as_dict(self) -> dict[str, Any]:
        return {
            "seen": list(self.seen),
            "log_lr": [round(v, 9) for v in self.log_lr],
            "alpha": self.alpha,
            "e_value": self.e_value,
            "threshold": self.threshold,
            "design_effect": self.design_effect,
        }

    @classmethod
    def start(cls, alpha: float) -> ErrorEvidence:
        return cls((0, 0, 0, 0), (0.0,) * len(ODDS_RATIOS), alpha)

    @classmethod
    def from_dict(cls, data: Any, alpha: float) -> ErrorEvidence:
        """The state an earlier observation kept; a fresh start where it kept none (an
        observation from before this rule, or a malformed one)."""
        try:
            seen = tuple(int(v) for v in data["seen"])
            log_lr = tuple(float(v) for v in data["log_lr"])
        except (KeyError, TypeError, ValueError):
            return cls.start(alpha)
        if len(seen) != 4 or len(log_lr) != len(ODDS_RATIOS):
            return cls.start(alpha)
        kept = data.get("design_effect")
        design = float(kept) if isinstance(kept, int | float) and kept >= 1.0 else 1.0
        return cls((seen[0], seen[1], seen[2], seen[3]), log_lr, alpha, design)

    def look(
        self,
        canary_requests: int,
        canary_errors: int,
        production_requests: int,
        production_errors: int,
        design_effect: float = 1.0,
    ) -> ErrorEvidence:
        """The evidence after a look at the window's cumulative counts, its users'
        failures clustering by ``design_effect`` (``rules/units.py``; 1: independent)."""
        now = (canary_requests, canary_errors, production_requests, production_errors)
        step = [n - s for n, s in zip(now, self.seen, strict=True)]
        errors_within = step[1] <= step[0] and step[3] <= step[2]
        design = max(1.0, design_effect)
        if min(step) < 0 or not errors_within:  # counters reset: this interval is skipped
            return ErrorEvidence(now, self.log_lr, self.alpha, design)
        added = interval_log_lr(*step)
        return ErrorEvidence(now, tuple(v + d for v, d in zip(self.log_lr, added, strict=True)), self.alpha, design)


def calibrated(p_value: float) -> float:
    """An e-value from a p-value: the mixture calibrator (the mean over kappa in (0, 1) of
    kappa p^(kappa - 1)), averaged with 1 so a look that shows nothing costs the evidence at
    most half, not all of it. Its mean is at most 1 wherever the p-value is valid."""
    p = min(max(p_value, 1e-300), 1.0)
    if p >= 1.0 - 1e-12:
        return 0.75  # the calibrator's limit at 1 is 1/2
    log_p = math.log(p)
    return (1.0 + (1.0 - p + p * log_p) / (p * log_p * log_p)) / 2.0


@dataclass(frozen=True)
class LatencyEvidence:
    """The evidence that the canary's probes are slower than the band allows, over the
    window's observations: each observation's probes are fresh pairs, so the product of
    their calibrated p-values (``calibrated``) is a nonnegative supermartingale while the
    canary is within the band, and by Ville's inequality it reaches ``1 / alpha`` in at most
    ``alpha`` of windows, however many observations there are."""

    log_e: float
    looks: int
    alpha: float

    @property
    def e_value(self) -> float:
        return math.exp(min(self.log_e, 700.0))

    @property
    def threshold(self) -> float:
        return 1.0 / self.alpha

    @property
    def worse(self) -> bool:
        return self.e_value >= self.threshold

    def look(self, p_value: float | None) -> LatencyEvidence:
        """After one observation's test (None: it had nothing to test; the evidence stays)."""
        if p_value is None:
            return self
        return LatencyEvidence(self.log_e + math.log(calibrated(p_value)), self.looks + 1, self.alpha)

    def describe(self) -> str:
        return f"latency evidence {self.e_value:.3g} (breaches at {self.threshold:.3g}, alpha {self.alpha:.2g})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "log_e": round(self.log_e, 9),
            "looks": self.looks,
            "alpha": self.alpha,
            "e_value": self.e_value,
            "threshold": self.threshold,
        }

    @classmethod
    def from_dict(cls, data: Any, alpha: float) -> LatencyEvidence:
        """The state an earlier observation kept; a fresh start where it kept none."""
        try:
            return cls(float(data["log_e"]), int(data["looks"]), alpha)
        except (KeyError, TypeError, ValueError):
            return cls(0.0, 0, alpha)


def spent_alpha(alpha: float, look: int) -> float:
    """The level of a test repeated on cumulative samples at the ``look``-th evaluation
    (1-based): ``alpha / (k (k + 1))``, which sums to ``alpha`` over every look there could
    be -- a union bound, valid however the looks' samples overlap."""
    k = max(1, look)
    return alpha / (k * (k + 1))
