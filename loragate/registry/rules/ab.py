"""The A/B evidence: per metric, how the canary's live figures compare with production's.

Each metric states both sides' values, the difference canary - production with its
two-sided interval at the window's confidence, the one-sided p-value of "the canary is
worse", and two answers:

- ``worse``: the canary is significantly worse (p < 1 - confidence);
- ``meets_bar``: the canary is shown *non-inferior* -- the interval's bound on the bad side
  stays within the metric's margin. Errors: upper bound of the difference <= the error
  margin (``ab_error_margin``); acceptance: lower bound >= -margin; a latency percentile:
  upper bound <= production's value x (p95_ratio - 1) + p95_slack_ms, the seed's "+10 %".

The bar is proven, not presumed: with too few samples the interval is wide (or unbounded)
and the bar is not met. A two-sided interval at 95 % bounds each side at 97.5 %, so "meets
the bar" holds at least at the stated confidence. Proportions are tested with Fisher's exact
test and bounded with Newcombe's interval; latency with the Mann-Whitney rank test on the
whole distribution and the percentile's distribution-free order-statistic intervals;
errors on counts over the window's design effect where users' failures cluster
(``rules/units.py``: the split randomises users, so that is the interval's unit)
(each side at 1 - (1 - confidence)/2, combined: conservative). A metric nobody measured
(no feedback, no streaming) is reported and gates nothing; errors and end-to-end latency
are always required. ``format_compliance`` (the share of sampled answers that satisfy the
golden set's output schema, ``rules/formats.py``) is a proportion like acceptance, present
only where the golden set declares a schema.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from loragate.registry.rules.canary import CanaryThresholds, percentile
from loragate.registry.rules.significance import (
    fisher_exact_greater,
    mann_whitney_greater,
    newcombe_difference,
    quantile_interval,
)

if TYPE_CHECKING:
    from loragate.registry.rules.formats import FormatCompliance
    from loragate.registry.rules.live_side import LiveSide

# what a gate needs measured; the others gate only when measured
REQUIRED = ("error_rate", "latency_p50_ms", "latency_p95_ms")


@dataclass(frozen=True)
class ABMetric:
    name: str
    canary: float | None
    production: float | None
    difference: float | None  # canary - production
    low: float | None  # the interval on the difference (None: unbounded or not measured)
    high: float | None
    p_value: float | None  # one-sided: the canary is worse
    worse: bool
    meets_bar: bool | None  # None: not measured on both sides
    margin: float | None  # how much worse the bar allows
    samples: tuple[int, int] = (0, 0)  # canary, production
    superiority: float | None = None  # latency: P(a canary request is slower than a production one)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "samples": list(self.samples)}


@dataclass(frozen=True)
class ABReport:
    metrics: list[ABMetric]
    confidence: float

    @property
    def meets_bar(self) -> bool:
        """Every measured metric meets its bar and every required one was measured."""
        by_name = {m.name: m for m in self.metrics}
        if any(by_name[name].meets_bar is None for name in REQUIRED if name in by_name):
            return False
        return all(m.meets_bar is not False for m in self.metrics)

    def failing(self) -> list[str]:
        """One line per metric keeping the overall bar from being met."""
        lines = []
        for m in self.metrics:
            if m.meets_bar is None and m.name in REQUIRED:
                lines.append(f"A/B: {m.name} not measured on both sides")
            elif m.meets_bar is False:
                bound = "unbounded" if m.high is None or m.low is None else f"[{m.low:.4g}, {m.high:.4g}]"
                lines.append(f"A/B: {m.name} difference {bound} not within {m.margin:.4g} at {self.confidence:g}")
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {
            "confidence": self.confidence,
            "meets_bar": self.meets_bar,
            "metrics": [m.as_dict() for m in self.metrics],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ABReport:
        metrics = [ABMetric(**{**m, "samples": tuple(m.get("samples", (0, 0)))}) for m in data.get("metrics", [])]
        return cls(metrics, float(data.get("confidence", 0.95)))


def _proportion(
    name: str,
    canary: tuple[int, int],
    production: tuple[int, int],
    t: CanaryThresholds,
    higher_is_worse: bool,
    design_effect: float = 1.0,
) -> ABMetric:
    """The interval and test on the counts as many independent ones as they are worth
    (``design_effect`` requests as one); the values as counted."""
    (xc, nc), (xp, np_) = canary, production
    alpha = 1 - t.confidence
    d = max(1.0, design_effect)
    ec, enc, ep, enp = (round(v / d) for v in (xc, nc, xp, np_))
    interval = newcombe_difference(ec, enc, ep, enp, t.confidence)
    test = fisher_exact_greater(ec, enc, ep, enp) if higher_is_worse else fisher_exact_greater(ep, enp, ec, enc)
    if interval is None or test is None:
        return ABMetric(
            name, xc / nc if nc else None, xp / np_ if np_ else None, None, None, None, None, False, None,
            t.ab_error_margin, (nc, np_),
        )  # fmt: skip
    _, low, high = interval
    difference = xc / nc - xp / np_
    meets = high <= t.ab_error_margin if higher_is_worse else low >= -t.ab_error_margin
    return ABMetric(
        name, xc / nc, xp / np_, difference, low, high, test.p_value, test.p_value < alpha, meets,
        t.ab_error_margin, (nc, np_),
    )  # fmt: skip


def _latency(name: str, canary: list[float], production: list[float], q: float, t: CanaryThresholds) -> ABMetric:
    alpha = 1 - t.confidence
    c_value, p_value_ms = percentile(canary, q), percentile(production, q)
    test = mann_whitney_greater(canary, production)
    if test is None or c_value is None or p_value_ms is None:
        return ABMetric(
            name, c_value, p_value_ms, None, None, None, None, False, None, None, (len(canary), len(production))
        )
    margin = p_value_ms * (t.p95_ratio - 1) + t.p95_slack_ms
    each = 1 - alpha / 2  # two intervals combined keep the stated confidence
    c_low, c_high = quantile_interval(canary, q / 100, each)
    p_low, p_high = quantile_interval(production, q / 100, each)
    low = None if c_low is None or p_high is None else c_low - p_high
    high = None if c_high is None or p_low is None else c_high - p_low
    return ABMetric(
        name, c_value, p_value_ms, c_value - p_value_ms, low, high, test.p_value, test.p_value < alpha,
        high is not None and high <= margin, margin, (len(canary), len(production)), test.superiority,
    )  # fmt: skip


def compare(
    thresholds: CanaryThresholds,
    canary: LiveSide,
    production: LiveSide,
    formats: dict[str, FormatCompliance | None] | None = None,
    design_effect: float = 1.0,
) -> ABReport:
    """The A/B report of the canary's live figures against production's; with ``formats``
    (each side's format compliance, where a schema is declared) also ``format_compliance``."""
    t = thresholds
    metrics = [
        _proportion(
            "error_rate",
            (canary.errors, canary.requests),
            (production.errors, production.requests),
            t,
            True,
            design_effect,
        ),  # fmt: skip
        _proportion(
            "acceptance_rate",
            (canary.accepted, canary.accepted + canary.retried),
            (production.accepted, production.accepted + production.retried),
            t,
            False,
        ),
        _latency("latency_p50_ms", list(canary.latency_ms), list(production.latency_ms), 50, t),
        _latency("latency_p95_ms", list(canary.latency_ms), list(production.latency_ms), 95, t),
        _latency("ms_per_token_p95", list(canary.ms_per_token), list(production.ms_per_token), 95, t),
        _latency("ttft_p95_ms", list(canary.ttft_ms), list(production.ttft_ms), 95, t),
    ]
    if formats is not None:
        c, p = formats.get("canary"), formats.get("production")
        if c is not None and p is not None:
            metrics.append(
                _proportion("format_compliance", (c.compliant, c.checked), (p.compliant, p.checked), t, False)
            )
    return ABReport(metrics, t.confidence)
