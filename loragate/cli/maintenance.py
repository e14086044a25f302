"""``loragate gc``: what crashed writes left behind, reported and removed."""

from __future__ import annotations

import argparse

from loragate.cli.output import EXIT_OK, emit, open_registry


def cmd_gc(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        report = reg.gc(dry_run=args.dry_run)

    def text() -> str:
        verb = "would remove" if args.dry_run else "removed"
        lines = [f"{verb} {len(report.litter)} scratch entries and {len(report.orphans)} orphan blobs"]
        lines += [f"  {item.path}  {item.bytes} bytes, {item.why}" for item in report.litter]
        lines += [f"  {blob.digest}  {blob.size} bytes, no version refers to it" for blob in report.orphans]
        if not args.dry_run:
            lines.append(f"freed {report.freed_bytes} bytes")
        return "\n".join(lines)

    emit(args, report.as_dict(), text)
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "gc",
        parents=[common],
        help="remove scratch files of crashed writes and blobs no version refers to (safe while others register)",
    )
    p.add_argument("--dry-run", action="store_true", help="report only")
    p.set_defaults(func=cmd_gc)
