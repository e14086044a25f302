"""The ``loragate`` command: the outermost face of the registry.

It parses arguments, calls the registry (and, for ``validate``, the validation tasks),
prints text or stable ``--json``, and translates typed errors into exit codes once, here:
0 ok, 1 a gate failed or the system failed, 2 bad input (nothing changed), 3 permission
denied. Error lines go to stderr as ``error: <code> [field]: <what>``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from registry.errors import InvalidInput, LoragateError, PermissionDenied
from registry.settings import Settings

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_DENIED = 3


def exit_code_for(error: LoragateError) -> int:
    if isinstance(error, PermissionDenied):
        return EXIT_DENIED
    if isinstance(error, InvalidInput):
        return EXIT_BAD_INPUT
    return EXIT_FAILED


def _progress_printer(args) -> Callable[[str], None]:
    show = args.progress or (args.progress is None and (sys.stderr.isatty() or os.environ.get("LORAGATE_PROGRESS") == "1"))
    if not show:
        return lambda _msg: None
    return lambda msg: print(f"… {msg}", file=sys.stderr, flush=True)


def _emit(args, payload: Any, text: str | Callable[[], str]) -> None:
    if args.json:
        print(json.dumps(payload, indent=2, sort_keys=True, default=str))
    else:
        print(text() if callable(text) else text)


def _registry(args, *, check_schema: bool = True):
    from registry.service import Registry

    return Registry.open(args.settings, check_schema=check_schema)


# -- commands -------------------------------------------------------------------


def cmd_init(args) -> int:
    reg = _registry(args, check_schema=False)
    reg.init()
    _emit(args, {"database_url": _redact(reg.settings.database_url), "artifacts": reg.artifacts.location, "schema": "head"},
          f"registry ready: {_redact(reg.settings.database_url)}, artifacts in {reg.artifacts.location}")
    return EXIT_OK


def cmd_base_add(args) -> int:
    reg = _registry(args)
    record, created = reg.add_base(args.source, args.id, args.revision)
    payload = {**record.summary(), "created": created}
    _emit(args, payload, f"{'pinned' if created else 'already pinned'} {record.base_model_id} commit {record.base_model_commit}")
    return EXIT_OK


def cmd_base_list(args) -> int:
    bases = _registry(args).store.bases()
    _emit(args, [b.summary() for b in bases],
          lambda: "\n".join(f"{b.base_model_id}\t{b.base_model_commit}\t{b.source_kind}\t{b.source}" for b in bases) or "(no base models)")
    return EXIT_OK


def cmd_register(args) -> int:
    reg = _registry(args)
    result = reg.register_adapter(Path(args.dir), args.name, progress=_progress_printer(args))
    v = result.version
    payload = {
        "version_id": v.version_id,
        "name": v.name,
        "created": result.created,
        "content_address": v.content_address,
        "weights_sha256": v.weights_sha256,
        "stage": v.stage,
        "validation_status": v.validation_status,
    }
    _emit(args, payload, v.version_id)
    return EXIT_OK


def _version_row(v) -> dict[str, Any]:
    return {
        "version_id": v.version_id,
        "name": v.name,
        "stage": v.stage,
        "validation_status": v.validation_status,
        "base_model_id": v.base_model_id,
        "base_model_commit": v.base_model_commit,
        "lora_rank": v.lora_rank,
        "created_at": v.created_at.isoformat(),
    }


def cmd_list(args) -> int:
    reg = _registry(args)
    if args.name:
        reg.store.get_adapter(args.name)
    versions = reg.store.list_versions(args.name)
    rows = [_version_row(v) for v in versions]
    _emit(args, rows, lambda: "\n".join(f"{r['version_id']}\t{r['name']}\t{r['stage']}\t{r['validation_status']}" for r in rows) or "(no versions)")
    return EXIT_OK


def cmd_show(args) -> int:
    info = _registry(args).describe_version(args.version)
    _emit(args, info, lambda: json.dumps(info, indent=2, sort_keys=True, default=str))
    return EXIT_OK


def cmd_history(args) -> int:
    events = _registry(args).store.history(args.name)
    rows = [e.as_dict() for e in events]

    def text() -> str:
        lines = []
        for e in events:
            what = e.action + (f" {e.stage}" if e.stage else "")
            move = f"{e.from_value or '-'} -> {e.to_value or '-'}"
            lines.append(f"{e.at:%Y-%m-%d %H:%M:%S}  {e.actor:<12} {what:<20} {move}" + (f"  ({e.reason})" if e.reason else ""))
        return "\n".join(lines)

    _emit(args, rows, text)
    return EXIT_OK


def cmd_resolve(args) -> int:
    version_id = _registry(args).resolve_stage(args.name, args.stage)
    _emit(args, {"name": args.name, "stage": args.stage, "version_id": version_id}, version_id)
    return EXIT_OK


def _plan_payload(name: str, plan) -> dict[str, Any]:
    return {
        "name": name,
        "action": plan.action,
        "changed": not plan.empty,
        "stage": plan.audit_stage.value if plan.audit_stage else None,
        "from": plan.audit_from,
        "to": plan.audit_to,
        "stage_changes": [[v, a.value, b.value] for v, a, b in plan.stage_changes],
    }


def cmd_promote(args) -> int:
    reg = _registry(args)
    name = reg.get_version(args.version).name
    plan = reg.promote(args.version, args.to, reason=args.reason)
    payload = _plan_payload(name, plan)
    _emit(args, payload, f"{name}: {args.to} -> {args.version}" if payload["changed"] else f"{name}: {args.version} already {args.to}")
    return EXIT_OK


def cmd_rollback(args) -> int:
    plan = _registry(args).rollback(args.name, args.stage, reason=args.reason)
    payload = _plan_payload(args.name, plan)
    _emit(args, payload, f"{args.name}: {args.stage} {plan.audit_from} rolled back" + (f", now {plan.audit_to}" if plan.audit_to else ""))
    return EXIT_OK


def cmd_materialize(args) -> int:
    dest = _registry(args).materialize(args.version, Path(args.dest))
    _emit(args, {"version_id": args.version, "path": str(dest)}, str(dest))
    return EXIT_OK


def cmd_golden_set(args) -> int:
    ref = _registry(args).attach_golden_set(args.name, Path(args.file))
    _emit(args, ref.as_dict(), f"{args.name}: golden set {ref.digest} ({ref.case_count} cases)")
    return EXIT_OK


def cmd_golden_show(args) -> int:
    ref, golden = _registry(args).golden_set(args.name)
    payload = {**ref.as_dict(), "cases": [c.as_dict() for c in golden.cases]}
    _emit(args, payload, lambda: golden.canonical_bytes().decode().rstrip("\n"))
    return EXIT_OK


def cmd_validate(args) -> int:
    from tasks.validation import ValidationPolicy, validate_versions

    reg = _registry(args)
    policy = ValidationPolicy.from_settings(reg.settings)
    if args.threshold is not None:
        policy = policy.with_(pass_threshold=args.threshold)
    reports = validate_versions(reg, args.versions, policy, progress=_progress_printer(args))
    all_passed = all(r["status"] == "passed" for r in reports)

    def text() -> str:
        lines = []
        for r in reports:
            lines.append(f"{r['version_id']}  {r['name']}  {r['status'].upper()}  {r['summary']}")
            lines.extend(f"    - {f}" for f in r["failures"])
        return "\n".join(lines)

    _emit(args, {"passed": all_passed, "reports": reports}, text)
    return EXIT_OK if all_passed else EXIT_FAILED


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


# -- parser -----------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output (stable, see README)")
    common.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress lines on stderr (default: when stderr is a terminal)")

    parser = argparse.ArgumentParser(prog="loragate", description="Registry and promotion gates for LoRA adapters served by vLLM.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("init", parents=[common], help="create or upgrade the schema and the artifact store")
    p.set_defaults(func=cmd_init)

    base = sub.add_parser("base", help="the base-model catalog").add_subparsers(dest="base_command", required=True)
    p = base.add_parser("add", parents=[common], help="pin a base model (local directory or cached HF id)")
    p.add_argument("source", help="a local model directory or a Hugging Face id in the local cache")
    p.add_argument("--id", required=True, help="catalog id, the <base> segment of adapter names")
    p.add_argument("--revision", help="40-hex commit, required for a Hugging Face id")
    p.set_defaults(func=cmd_base_add)
    p = base.add_parser("list", parents=[common], help="list pinned base models")
    p.set_defaults(func=cmd_base_list)

    p = sub.add_parser("register", parents=[common], help="register an adapter bundle as a new version")
    p.add_argument("dir", help="directory with adapter_model.safetensors, adapter_config.json, manifest.json")
    p.add_argument("--name", required=True, help="<namespace>/<base>/<task>")
    p.set_defaults(func=cmd_register)

    p = sub.add_parser("list", parents=[common], help="list versions")
    p.add_argument("--name", help="only this logical adapter")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("show", parents=[common], help="one version, its manifest and validation runs")
    p.add_argument("version")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("history", parents=[common], help="the audit log of a logical adapter")
    p.add_argument("name")
    p.set_defaults(func=cmd_history)

    p = sub.add_parser("resolve", parents=[common], help="the version a stage pointer names")
    p.add_argument("name")
    p.add_argument("--stage", default="production", choices=["canary", "production", "previous"])
    p.set_defaults(func=cmd_resolve)

    p = sub.add_parser("promote", parents=[common], help="move the canary or production pointer to a version")
    p.add_argument("version")
    p.add_argument("--to", required=True, choices=["canary", "production"])
    p.add_argument("--reason")
    p.set_defaults(func=cmd_promote)

    p = sub.add_parser("rollback", parents=[common], help="production back to previous, or withdraw the canary")
    p.add_argument("name")
    p.add_argument("--stage", default="production", choices=["canary", "production"])
    p.add_argument("--reason")
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser("materialize", parents=[common], help="write a version's verified bundle to a directory")
    p.add_argument("version")
    p.add_argument("dest")
    p.set_defaults(func=cmd_materialize)

    golden = sub.add_parser("golden", help="golden sets").add_subparsers(dest="golden_command", required=True)
    p = golden.add_parser("set", parents=[common], help="check and attach a golden set (JSONL) to an adapter")
    p.add_argument("name")
    p.add_argument("file")
    p.set_defaults(func=cmd_golden_set)
    p = golden.add_parser("show", parents=[common], help="the golden set attached to an adapter")
    p.add_argument("name")
    p.set_defaults(func=cmd_golden_show)

    p = sub.add_parser("validate", parents=[common], help="shadow-validate versions against their pinned base")
    p.add_argument("versions", nargs="+", metavar="VERSION")
    p.add_argument("--threshold", type=float, help="golden pass rate needed (default LORAGATE_VALIDATION_THRESHOLD or 0.8)")
    p.set_defaults(func=cmd_validate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.settings = Settings.from_env()
        return args.func(args)
    except LoragateError as e:
        if getattr(args, "json", False):
            print(json.dumps({"error": e.as_dict()}, sort_keys=True))
        print(f"error: {e.one_line()}", file=sys.stderr)
        return exit_code_for(e)


if __name__ == "__main__":
    sys.exit(main())
