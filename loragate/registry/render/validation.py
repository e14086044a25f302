"""A validation report as a person deciding reads it: one table row (the Prefect UI's
artifact, the CLI's table) and the evidence in markdown (checks, slices, the scan)."""

from __future__ import annotations

from loragate.registry.records.reports import ValidationReport


def report_row(report: ValidationReport) -> dict[str, str]:
    """The report as one row of a table (the Prefect UI, the CLI)."""
    golden = report.checks.get("golden")
    figures = golden.figures if golden else {}
    return {
        "version": report.version_id or "-",
        "adapter": report.name,
        "status": report.status.value,
        "golden": f"{figures['passed']}/{figures['total']}" if golden else "-",
        "regression": report.regression.describe() if report.regression else "-",
        "scan": report.scan.describe() if report.scan else "-",
        "failures": "; ".join(report.failures) or "-",
    }


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def validation_evidence_markdown(report: ValidationReport) -> str:
    """The report for a person deciding: checks, the slices against production, the scan."""
    lines = [
        f"### Validation of `{report.version_id or report.name}`: {report.status.value}",
        "",
        report.summary,
        "",
        "| check | result | why |",
        "|---|---|---|",
    ]
    failed = {f.split(":", 1)[0]: f.split(":", 1)[1].strip() for f in report.failures}
    for name, check in report.checks.items():
        why = failed.get(name) or str(check.figures.get("skipped", ""))
        lines.append(f"| {name} | {'ok' if check.ok else 'FAILED'} | {_cell(why)} |")
    regression = report.regression
    if regression is not None:
        lines += ["", "#### Against production"]
        if regression.skipped is not None:
            lines += ["", f"Skipped: {regression.skipped}."]
        else:
            lines += [
                "",
                f"Production `{regression.production_version}`, epsilon {regression.epsilon:g}.",
                "",
                "| slice | cases | production | this version | regressed | failing cases | common n-grams |",
                "|---|---|---|---|---|---|---|",
            ]
            for c in regression.changes:
                ngrams = ", ".join(f"{g.text} ({g.failing}/{len(c.failing_cases)})" for g in c.common_ngrams)
                lines.append(
                    f"| {_cell(c.slice)} | {c.cases} | {c.before:.2f} | {c.after:.2f} | "
                    f"{'**yes**' if c.regressed else 'no'} | {_cell(', '.join(c.failing_cases)) or '-'} | "
                    f"{_cell(ngrams) or '-'} |"
                )
    scan = report.scan
    if scan is not None:
        lines += ["", f"#### Weight scan: **{scan.action}** ({scan.scanner}, policy {scan.policy})", ""]
        lines += [f"- {r.code}: {_cell(r.message)}" for r in scan.reasons]
        if scan.limits:
            lines.append(f"- confidence {scan.confidence}; limited by: {'; '.join(scan.limits)}")
        if scan.under_review:
            lines += ["", "Production needs an explicit acknowledgement of this review."]
    return "\n".join(lines)
