"""``loragate golden``: golden sets attached to logical adapters."""

from __future__ import annotations

import argparse
from pathlib import Path

from loragate.cli.output import EXIT_OK, emit, open_registry


def cmd_golden_set(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        ref = reg.attach_golden_set(args.name, Path(args.file))
    emit(args, ref.as_dict(), f"{args.name}: golden set {ref.digest} ({ref.case_count} cases)")
    return EXIT_OK


def cmd_golden_show(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        ref, golden = reg.golden_set(args.name)
    payload = {**ref.as_dict(), "cases": [c.as_dict() for c in golden.cases]}
    emit(args, payload, lambda: golden.canonical_bytes().decode().rstrip("\n"))
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    golden = sub.add_parser("golden", help="golden sets").add_subparsers(dest="golden_command", required=True)
    p = golden.add_parser("set", parents=[common], help="check and attach a golden set (JSONL) to an adapter")
    p.add_argument("name")
    p.add_argument("file")
    p.set_defaults(func=cmd_golden_set)
    p = golden.add_parser("show", parents=[common], help="the golden set attached to an adapter")
    p.add_argument("name")
    p.set_defaults(func=cmd_golden_show)
