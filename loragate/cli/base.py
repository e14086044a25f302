"""``loragate base``: the base-model catalog."""

from __future__ import annotations

import argparse

from loragate.cli.output import EXIT_OK, emit, open_registry


def cmd_base_add(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        record, created = reg.add_base(args.source, args.id, args.revision)
    verb = "pinned" if created else "already pinned"
    emit(
        args,
        {**record.summary(), "created": created},
        f"{verb} {record.base_model_id} commit {record.base_model_commit}",
    )
    return EXIT_OK


def cmd_base_list(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        bases = reg.list_bases()
    emit(
        args,
        [b.summary() for b in bases],
        lambda: (
            "\n".join(f"{b.base_model_id}\t{b.base_model_commit}\t{b.source_kind}\t{b.source}" for b in bases)
            or "(no base models)"
        ),
    )
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    base = sub.add_parser("base", help="the base-model catalog").add_subparsers(dest="base_command", required=True)
    p = base.add_parser("add", parents=[common], help="pin a base model (local directory or cached HF id)")
    p.add_argument("source", help="a local model directory or a Hugging Face id in the local cache")
    p.add_argument("--id", required=True, help="catalog id, the <base> segment of adapter names")
    p.add_argument("--revision", help="40-hex commit, required for a Hugging Face id")
    p.set_defaults(func=cmd_base_add)
    p = base.add_parser("list", parents=[common], help="list pinned base models")
    p.set_defaults(func=cmd_base_list)
