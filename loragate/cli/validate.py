"""``loragate validate``: shadow validation of registered versions.

It runs the plain functions of ``loragate.tasks.validation`` (not the Prefect task), so the command
never pays for importing Prefect.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from loragate.cli.output import EXIT_FAILED, EXIT_OK, emit, open_registry, progress_printer

if TYPE_CHECKING:  # pydantic records: imported when a validation runs
    from loragate.registry.records.reports import ValidationReport


def cmd_validate(args: argparse.Namespace) -> int:
    from loragate.tasks.validation import ValidationPolicy, validate_versions

    policy = ValidationPolicy.from_settings(
        args.settings, pass_threshold=args.threshold, regression_epsilon=args.regression_epsilon
    )
    with open_registry(args) as reg:
        reports = validate_versions(reg, args.versions, policy, progress=progress_printer(args))
    all_passed = all(r.passed for r in reports)
    emit(args, {"passed": all_passed, "reports": [r.to_json() for r in reports]}, lambda: validation_table(reports))
    return EXIT_OK if all_passed else EXIT_FAILED


def _regression_cell(report: ValidationReport) -> str:
    r = report.regression
    if r is None:
        return "-"
    if r.skipped is not None:
        return "skipped"
    regressed = r.regressed
    return f"{len(regressed)} regressed" if regressed else f"ok vs {r.production_version}"


def validation_table(reports: list[ValidationReport]) -> str:
    """One row per version, then what failed, each regressed slice and the scan's reasons."""
    from loragate.registry.render.validation import report_row

    rows = [("VERSION", "ADAPTER", "STATUS", "GOLDEN", "REGRESSION", "SCAN")]
    for r in reports:
        row = report_row(r)
        rows.append(
            (
                row["version"],
                row["adapter"],
                r.status.value,
                row["golden"],
                _regression_cell(r),
                r.scan.action if r.scan else "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    for r in reports:
        notes = [f"  - {f}" for f in r.failures]
        if r.regression is not None and r.regression.skipped is not None:
            notes.append(f"  - regression skipped: {r.regression.skipped}")
        if r.scan is not None and r.scan.under_review:
            notes.append(f"  - weight scan asks for review: {r.scan.describe()}")
        if notes:
            lines += [f"{r.version_id or r.name}:", *notes]
    return "\n".join(lines)


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("validate", parents=[common], help="shadow-validate versions against their pinned base")
    p.add_argument("versions", nargs="+", metavar="VERSION")
    p.add_argument(
        "--threshold", type=float, help="golden pass rate needed (default LORAGATE_VALIDATION_THRESHOLD or 0.8)"
    )
    p.add_argument(
        "--regression-epsilon",
        type=float,
        help="largest pass-rate drop against production, overall or per slice (default "
        "LORAGATE_REGRESSION_EPSILON or 0)",
    )
    p.set_defaults(func=cmd_validate)
