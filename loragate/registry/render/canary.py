"""A canary window as a person signing it off reads it: the observations table's rows and
the window's evidence in markdown (the approval form's text, ``loragate canary show``).
Where an observation carries the live judgement, the probes' and the live requests' figures
stand side by side per side (with each side's format compliance where the golden set
declares an output schema), followed by the A/B lines (metric, both values, the difference
with its interval, the one-sided p, whether the bar is met)."""

from __future__ import annotations

from typing import Any

from loragate.registry.rules.canary import CanaryWindow, Observation, SideStats, WindowStatus


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _live_verdict(live: dict[str, Any] | None) -> str:
    if live is None:
        return "-"
    if live.get("rollback"):
        return "rollback"
    if live.get("latency_breach"):
        return "latency breach"
    return "not ready" if live.get("not_ready_reasons") else "in band"


def _live_side(live: dict[str, Any] | None, side: str) -> dict[str, Any]:
    return ((live or {}).get("stats") or {}).get(side) or {}


def observation_row(o: Observation) -> dict[str, Any]:
    """One row of the observations table artifact."""
    canary, production = _live_side(o.live, "canary"), _live_side(o.live, "production")

    def errors(side: dict[str, Any]) -> str:
        return f"{side['errors']}/{side['requests']}" if side else "-"

    return {
        "at": o.at.strftime("%H:%M:%S"),
        "canary errors": f"{o.canary.errors}/{o.canary.requests}",
        "production errors": f"{o.production.errors}/{o.production.requests}",
        "canary p50/p95 ms": f"{_ms(o.canary.p50_ms)}/{_ms(o.canary.p95_ms)}",
        "production p50/p95 ms": f"{_ms(o.production.p50_ms)}/{_ms(o.production.p95_ms)}",
        "canary live errors": errors(canary),
        "production live errors": errors(production),
        "canary live p95 ms": _ms(canary.get("p95_ms")),
        "production live p95 ms": _ms(production.get("p95_ms")),
        "golden drift": f"{o.drift:.3f}",
        "live verdict": _live_verdict(o.live),
        "verdict": o.verdict.value,
    }


def _probe_row(name: str, side: SideStats) -> str:
    return (
        f"| {name} | probes | {side.errors}/{side.requests} | {_ms(side.p50_ms)} | {_ms(side.p95_ms)} | - | - | - | - |"
    )


def _live_row(name: str, side: dict[str, Any]) -> str:
    if not side:
        return f"| {name} | live | - | - | - | - | - | - | - |"
    return (
        f"| {name} | live | {side['errors']}/{side['requests']} | {_ms(side.get('p50_ms'))} | {_ms(side.get('p95_ms'))}"
        f" | {_ms(side.get('p99_ms'))} | {_ms(side.get('ms_per_token_p95'))} | {_ms(side.get('ttft_p95_ms'))}"
        f" | {side.get('fallbacks', 0)} |"
    )


def _value(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if name.endswith("_rate") or name == "format_compliance" else f"{value:.1f}"


def _difference(metric: dict[str, Any]) -> str:
    name, difference = metric["name"], metric.get("difference")
    if difference is None:
        return "-"
    low, high = metric.get("low"), metric.get("high")
    bounds = f"[{_value(name, low) if low is not None else '-∞'}, {_value(name, high) if high is not None else '∞'}]"
    sign = "+" if difference >= 0 else ""
    return f"{sign}{_value(name, difference)} {bounds}"


def _bar(metric: dict[str, Any]) -> str:
    meets = metric.get("meets_bar")
    if meets is None:
        return "not measured"
    verdict = "yes" if meets else "no"
    return f"{verdict} (significantly worse)" if metric.get("worse") else verdict


def _format_row(name: str, f: dict[str, Any] | None) -> str:
    """A side's format compliance: sampled live answers satisfying the golden set's output
    schema, of those checked (in the errors column, the table's count column)."""
    if not f:
        return f"| {name} | format compliance | - | - | - | - | - | - | - |"
    rate = "-" if f.get("rate") is None else f"{f['rate']:.0%}"
    return f"| {name} | format compliance | {f['compliant']}/{f['checked']} ({rate}) | - | - | - | - | - | - |"


def live_evidence_lines(o: Observation, window: CanaryWindow) -> list[str]:
    """The live section of the evidence for one observation (empty without a live judgement)."""
    live = o.live
    if live is None:
        return []
    stats = live.get("stats") or {}
    ab = live.get("ab") or {}
    confidence = ab.get("confidence", window.thresholds.confidence)
    lines = [
        "",
        f"### Probes and live traffic at {o.at:%H:%M:%S} (share {live.get('share', window.share) * 100:g} %, "
        f"{stats.get('replicas', 0)} replica(s))",
        "",
        "| side | figures | errors | p50 ms | p95 ms | p99 ms | ms/token p95 | TTFT p95 ms | fallbacks |",
        "|---|---|---|---|---|---|---|---|---|",
        _probe_row("canary", o.canary),
        _live_row("canary", stats.get("canary") or {}),
        _probe_row("production", o.production),
        _live_row("production", stats.get("production") or {}),
    ]
    base = stats.get("base") or {}
    if base.get("requests"):
        lines.append(_live_row("base (fallbacks)", base))
    formats = live.get("format_compliance")
    if formats:
        lines += [_format_row(side, formats.get(side)) for side in ("canary", "production")]
    lines += [
        "",
        f"### A/B (live, {confidence:.0%} confidence; bar: "
        f"{'a gate' if window.thresholds.ab_gate else 'reported, not a gate'})",
        "",
        "| metric | canary | production | difference [interval] | p (worse) | meets bar |",
        "|---|---|---|---|---|---|",
    ]
    for m in ab.get("metrics", []):
        p = "-" if m.get("p_value") is None else f"{m['p_value']:.3g}"
        lines.append(
            f"| {m['name']} | {_value(m['name'], m.get('canary'))} | {_value(m['name'], m.get('production'))}"
            f" | {_difference(m)} | {p} | {_bar(m)} |"
        )
    lines.append("")
    lines.append(f"A/B bar: {'met' if ab.get('meets_bar') else 'not met'}; live verdict: {_live_verdict(live)}.")
    evidence = live.get("error_evidence")
    if evidence:
        lines.append(
            f"- live errors, sequential: evidence {evidence['e_value']:.3g}, rolls back at {evidence['threshold']:.3g} "
            f"(a version failing as production does reaches it in at most {evidence['alpha']:.2%} of windows)"
        )
    clustering = live.get("design_effect") or {}
    if clustering.get("value", 1.0) > 1.0:
        lines.append(
            f"- users' failures cluster: {clustering['value']:.3g} requests count as one "
            f"(intraclass correlation {clustering.get('rho', 0.0):.2g} over {clustering.get('units', 0)} "
            "sampled users; the need grows by as much)"
        )
    covered = live.get("coverage")
    if covered:
        lines.append(f"- {_coverage_line(covered)}")
    for reason in [*live.get("reasons", []), *live.get("not_ready_reasons", [])]:
        lines.append(f"- {reason}")
    return lines


def _coverage_line(covered: dict[str, Any]) -> str:
    """How far the live requests are from what the verdict needs (``rules/power.py``)."""
    needed = covered.get("needed")
    have = covered.get("canary_requests", 0)
    if needed is None:
        return f"live requests: {have} to the canary, but no number decides this split (production answered too few)"
    sized = f" to catch {covered['sized_for']}" if covered.get("sized_for") else ""
    state = "met" if covered.get("met") else f"about {covered.get('projected', 0)} by the window's end"
    return f"live requests: {have} of {needed} needed{sized} ({state})"


def canary_evidence_markdown(window: CanaryWindow, observations: list[Observation]) -> str:
    """The canary's record as a person signing it off reads it (the approval form's text)."""
    t = window.thresholds
    lines = [
        f"## Canary evidence: `{window.adapter_name}` → `{window.version_id}`",
        "",
        f"Window opened {window.opened_at:%Y-%m-%d %H:%M:%S} UTC for {t.length_s:g} s; "
        f"status **{window.status.value}**.",
        f"Bands: errors not more frequent than production's (sequential, at most "
        f"{t.false_rollback / 4:.2%} of good canaries withdrawn by it), p95 ≤ {t.p95_ratio:g}× production's "
        f"+ {t.p95_slack_ms:g} ms and slower by rank test (a first canary: {t.first_p95_ratio:g}× the base's), "
        f"golden drift ≤ {t.drift_epsilon:g}.",
    ]
    if window.share > 0:
        needs = f"at least {t.min_live_requests} live requests"
        if t.detection.on:
            needs += (
                f" and enough to catch {t.detection.describe()} (the split ramps up to "
                f"{t.max_auto_share * 100:g} % to get them; short at the end: undecided)"
            )
        lines.append(
            f"Live traffic: share {window.share * 100:g} %; errors not worse than production's, "
            f"p95 and ms-per-token p95 in the same band, at {t.confidence:.0%} confidence; {needs}; "
            f"A/B bar {'gates' if t.ab_gate else 'reported'} (error margin {t.ab_error_margin:g})."
        )
    if window.status == WindowStatus.UNDECIDED:
        lines += [
            "",
            "**Undecided:** the window ended without the live requests its verdict needs, and its version was "
            f"withdrawn unproven -- neither failed nor proven. {window.reason or ''}",
        ]
    lines += [
        "",
        "| at (UTC) | canary errors | prod errors | canary p95 ms | prod p95 ms | live errors c/p | drift | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o in observations[-12:]:
        row = observation_row(o)
        live = "-" if o.live is None else f"{row['canary live errors']} / {row['production live errors']}"
        lines.append(
            f"| {o.at:%H:%M:%S} | {o.canary.errors}/{o.canary.requests} | {o.production.errors}/{o.production.requests}"
            f" | {_ms(o.canary.p95_ms)} | {_ms(o.production.p95_ms)} | {live} | {o.drift:.3f} | {o.verdict.value} |"
        )
    if len(observations) > 12:
        lines.append(f"| … {len(observations) - 12} earlier observations | | | | | | | |")
    if observations:
        lines += live_evidence_lines(observations[-1], window)
        kept = observations[-1].probe_evidence
        if kept:
            lines += [
                "",
                f"Probe errors, sequential: evidence {kept['e_value']:.3g}, rolls back at {kept['threshold']:.3g}.",
            ]
        slower = observations[-1].latency_evidence
        if slower:
            lines.append(
                f"Probe latency, sequential: evidence {slower['e_value']:.3g} over {slower['looks']} observation(s), "
                f"a p95 out of band counts from {slower['threshold']:.3g}."
            )
        lines += ["", f"Last verdict: {'; '.join(observations[-1].reasons)}"]
    else:
        lines += ["", "No observations yet."]
    return "\n".join(lines)
