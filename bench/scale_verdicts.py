"""What bench/scale.py's canary watch decided over a burst: how many of the good tenants
(all the same good adapter) were rolled back and why -- noise, since they are all alike --
and whether the slow control tenant (the same adapter answered ``CONTROL_SLOWDOWN`` x slower,
bench/delay_proxy.py) was rolled back, as a really slower canary must be.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from loragate.registry.rules.canary import LATENCY_MONITORS, CanaryWindow, Observation, WindowStatus

# the slow control tenant: its canary answers this many times as slowly as the same adapter
# would (bench/delay_proxy.py says why on the wire, and why a factor: the probes must see it)
CONTROL_SLOWDOWN = 3.0


def verdicts(
    windows: list[CanaryWindow],
    observations: dict[int, list[Observation]],
    control: str,
    proxies: Any,
) -> dict[str, Any]:
    """What the canary watch decided: the good tenants rolled back (and why), the slow
    control's fate, and every observation's verdict and reasons."""

    def fate(w: CanaryWindow) -> dict[str, Any]:
        return {
            "status": w.status.value,
            "reason": w.reason,
            "observations": [
                {
                    "verdict": o.verdict.value,
                    "reasons": o.reasons,
                    "canary_p95_ms": o.canary.p95_ms,
                    "production_p95_ms": o.production.p95_ms,
                    "samples": [len(o.canary.latencies_ms), len(o.production.latencies_ms)],
                    # how far the sequential latency rule got: its e-value against 1/alpha
                    "latency_evidence": (o.latency_evidence or {}).get("e_value"),
                    "pair_ratio_median": _median_ratio(o.pairs_ms),
                }
                for o in observations.get(w.id, [])
            ],
        }

    good = [w for w in windows if w.adapter_name != control]
    slow = [w for w in windows if w.adapter_name == control]
    rolled = [w for w in good if w.status == WindowStatus.ROLLED_BACK]
    # a good one that breached once and then came back in band: the streak and the rank
    # test at work
    breached = [
        w.adapter_name
        for w in good
        if any(_latency_out(o) for o in observations.get(w.id, [])) and w.status != WindowStatus.ROLLED_BACK
    ]
    control_fate = fate(slow[0]) if slow else {"status": "no window"}
    return {
        "summary": {
            "good_tenants": len(good),
            "good_rolled_back": len(rolled),
            "good_states": dict(Counter(w.status.value for w in good)),
            "good_breached_once_then_in_band": len(breached),
            "slow_control_rolled_back": control_fate["status"] == WindowStatus.ROLLED_BACK.value,
        },
        "thresholds": windows[0].thresholds.as_dict() if windows else None,
        "good_rolled_back": {w.adapter_name: fate(w) for w in rolled},
        # "in band; window ends in 836 s" counted as "in band"
        "good_verdict_reasons": dict(
            Counter(r.split(" (")[0].split(";")[0] for w in good for o in observations.get(w.id, []) for r in o.reasons)
        ),
        "good_margin": _margin([o for w in good for o in observations.get(w.id, [])]),
        "slow_control": {
            "name": control,
            "slowdown": CONTROL_SLOWDOWN,
            "requests_delayed": sum(p.delayed for p in proxies),
            **control_fate,
        },
    }


def _margin(observed: list[Observation]) -> dict[str, Any]:
    """How far from a rollback the good tenants stayed: their observations' median pair
    ratios and the largest latency evidence any reached (a rollback needs 1/alpha)."""
    ratios = sorted(r for o in observed if (r := _median_ratio(o.pairs_ms)) is not None)
    evidence = [e for o in observed if (e := (o.latency_evidence or {}).get("e_value")) is not None]
    return {
        "observations": len(observed),
        "pair_ratio_median": ratios[len(ratios) // 2] if ratios else None,
        "pair_ratio_max": ratios[-1] if ratios else None,
        "latency_evidence_max": max(evidence) if evidence else None,
    }


def _latency_out(o: Observation) -> bool:
    return any(m.name in LATENCY_MONITORS and not m.in_band for m in o.monitors)


def _median_ratio(pairs: Any) -> float | None:
    """The median of an observation's canary/reference latency ratios, pair by pair."""
    ratios = sorted(c / r for c, r in pairs or () if r > 0)
    return round(ratios[len(ratios) // 2], 3) if ratios else None
