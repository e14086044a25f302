"""A canary window as a person signing it off reads it: the observations table's rows and
the window's evidence in markdown (the approval form's text)."""

from __future__ import annotations

from typing import Any

from registry.rules.canary import CanaryWindow, Observation


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def observation_row(o: Observation) -> dict[str, Any]:
    """One row of the observations table artifact."""
    return {
        "at": o.at.strftime("%H:%M:%S"),
        "canary errors": f"{o.canary.errors}/{o.canary.requests}",
        "production errors": f"{o.production.errors}/{o.production.requests}",
        "canary p50/p95 ms": f"{_ms(o.canary.p50_ms)}/{_ms(o.canary.p95_ms)}",
        "production p50/p95 ms": f"{_ms(o.production.p50_ms)}/{_ms(o.production.p95_ms)}",
        "golden drift": f"{o.drift:.3f}",
        "verdict": o.verdict.value,
    }


def canary_evidence_markdown(window: CanaryWindow, observations: list[Observation]) -> str:
    """The canary's record as a person signing it off reads it (the approval form's text)."""
    t = window.thresholds
    lines = [
        f"## Canary evidence: `{window.adapter_name}` → `{window.version_id}`",
        "",
        f"Window opened {window.opened_at:%Y-%m-%d %H:%M:%S} UTC for {t.length_s:g} s; "
        f"status **{window.status.value}**.",
        f"Bands: errors ≤ production's, p95 ≤ {t.p95_ratio:g}× production's + {t.p95_slack_ms:g} ms, "
        f"golden drift ≤ {t.drift_epsilon:g}.",
        "",
        "| at (UTC) | canary errors | prod errors | canary p95 ms | prod p95 ms | drift | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in observations[-12:]:
        lines.append(
            f"| {o.at:%H:%M:%S} | {o.canary.errors}/{o.canary.requests} | {o.production.errors}/{o.production.requests}"
            f" | {_ms(o.canary.p95_ms)} | {_ms(o.production.p95_ms)} | {o.drift:.3f} | {o.verdict.value} |"
        )
    if len(observations) > 12:
        lines.append(f"| … {len(observations) - 12} earlier observations | | | | | | |")
    if observations:
        lines += ["", f"Last verdict: {'; '.join(observations[-1].reasons)}"]
    else:
        lines += ["", "No observations yet."]
    return "\n".join(lines)
