"""``loragate validate``: shadow validation of registered versions.

It runs the plain functions of ``tasks.validation`` (not the Prefect task), so the command
never pays for importing Prefect.
"""

from __future__ import annotations

import argparse

from cli.output import EXIT_FAILED, EXIT_OK, emit, open_registry, progress_printer


def cmd_validate(args: argparse.Namespace) -> int:
    from tasks.validation import ValidationPolicy, validate_versions

    policy = ValidationPolicy.from_settings(args.settings, pass_threshold=args.threshold)
    with open_registry(args) as reg:
        reports = validate_versions(reg, args.versions, policy, progress=progress_printer(args))
    all_passed = all(r.passed for r in reports)

    def text() -> str:
        lines = []
        for r in reports:
            lines.append(f"{r.version_id}  {r.name}  {r.status.value.upper()}  {r.summary}")
            lines.extend(f"    - {f}" for f in r.failures)
        return "\n".join(lines)

    emit(args, {"passed": all_passed, "reports": [r.to_json() for r in reports]}, text)
    return EXIT_OK if all_passed else EXIT_FAILED


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("validate", parents=[common], help="shadow-validate versions against their pinned base")
    p.add_argument("versions", nargs="+", metavar="VERSION")
    p.add_argument(
        "--threshold", type=float, help="golden pass rate needed (default LORAGATE_VALIDATION_THRESHOLD or 0.8)"
    )
    p.set_defaults(func=cmd_validate)
