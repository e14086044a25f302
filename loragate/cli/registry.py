"""Commands over the registry's versions and pointers: init, register, list, show,
history, resolve, promote, rollback, materialize."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loragate.cli.output import ADMIN_TOKEN_FILE, EXIT_OK, emit, open_registry, progress_printer, write_secret_file
from loragate.registry.rules.text import printable

if TYPE_CHECKING:  # annotations only: the records are pydantic, imported when a command runs
    from loragate.registry.records.adapters import AdapterVersion
    from loragate.registry.rules.lifecycle import Plan


def cmd_init(args: argparse.Namespace) -> int:
    with open_registry(args, check_schema=False) as reg:
        issued = reg.init()
        url, artifacts = reg.settings.database_url_redacted, reg.artifacts_location
    token_file = None
    if issued is not None:
        token_file = write_secret_file(args.settings.home / ADMIN_TOKEN_FILE, issued.token)
    text = f"registry ready: {url}, artifacts in {artifacts}"
    if token_file is not None:
        text += f"\nfirst admin token written to {token_file} (mode 0600): loragate token create --role ..."
    emit(
        args,
        {
            "database_url": url,
            "artifacts": artifacts,
            "schema": "head",
            "admin_token_file": str(token_file) if token_file else None,
        },
        text,
    )
    return EXIT_OK


def cmd_register(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        result = reg.register_adapter(Path(args.dir), args.name, progress=progress_printer(args))
    v = result.version
    payload = {
        "version_id": v.version_id,
        "name": v.name,
        "created": result.created,
        "content_address": v.content_address,
        "weights_sha256": v.weights_sha256,
        "stage": v.stage.value,
        "validation_status": v.validation_status.value,
    }
    emit(args, payload, v.version_id)
    return EXIT_OK


def _version_row(v: AdapterVersion) -> dict[str, Any]:
    return {
        "version_id": v.version_id,
        "name": v.name,
        "stage": v.stage.value,
        "validation_status": v.validation_status.value,
        "base_model_id": v.base_model_id,
        "base_model_commit": v.base_model_commit,
        "lora_rank": v.lora_rank,
        "created_at": v.created_at.isoformat(),
    }


def cmd_list(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        rows = [_version_row(v) for v in reg.list_versions(args.name)]
    emit(
        args,
        rows,
        lambda: (
            "\n".join(f"{r['version_id']}\t{r['name']}\t{r['stage']}\t{r['validation_status']}" for r in rows)
            or "(no versions)"
        ),
    )
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        info = reg.describe_version(args.version)
    emit(args, info, lambda: json.dumps(info, indent=2, sort_keys=True, default=str))
    return EXIT_OK


def cmd_history(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        events = reg.history(args.name)

    def text() -> str:
        lines = []
        for e in events:
            # escaped: text stored before the registry refused control characters, or
            # written by hand into the database, must not forge lines on a terminal
            what = e.action + (f" {e.stage}" if e.stage else "")
            move = f"{printable(e.from_value) or '-'} -> {printable(e.to_value) or '-'}"
            reason = f"  ({printable(e.reason)})" if e.reason else ""
            lines.append(f"{e.at:%Y-%m-%d %H:%M:%S}  {printable(e.actor):<12} {printable(what):<20} {move}{reason}")
        return "\n".join(lines)

    emit(args, [e.as_dict() for e in events], text)
    return EXIT_OK


def cmd_resolve(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        version_id = reg.resolve_stage(args.name, args.stage)
    emit(args, {"name": args.name, "stage": args.stage, "version_id": version_id}, version_id)
    return EXIT_OK


def _plan_payload(name: str, plan: Plan) -> dict[str, Any]:
    return {
        "name": name,
        "action": plan.action,
        "changed": not plan.empty,
        "stage": plan.audit_stage.value if plan.audit_stage else None,
        "from": plan.audit_from,
        "to": plan.audit_to,
        "stage_changes": [[v, a.value, b.value] for v, a, b in plan.stage_changes],
    }


def _deployed(report: list[dict[str, Any]]) -> str:
    """The replicas a move switched, a line each; a canary warmed on production as
    ``name@version`` (``served_as``) says so."""
    return "".join(
        f"\n  {r['replica']}: warm as {r['served_as']} ({r['verified']})"
        if "served_as" in r
        else f"\n  {r['replica']}: {r['from'] or '-'} -> {r['to'] or '-'} ({r['verified'] or 'unloaded'})"
        for r in report
    )


def _with_window(payload: dict[str, Any], text: str, window: Any) -> tuple[dict[str, Any], str]:
    """A canary move's window (opened, or closed by a withdrawal) in the payload and the text."""
    if window is None:
        return payload, text
    payload = {**payload, "window": {"id": window.id, "status": window.status.value, "share": window.share}}
    return payload, f"{text}\n  canary window {window.id}: {window.status.value}, {window.share:.2%} of live requests"


def announce_override(name: str, version_id: str, window_id: int, reason: str) -> None:
    """A person's override on the Prefect event feed, beside the audit log's record: the
    users live in the Prefect UI. Only where a Prefect server is configured (a shell
    without one has the audit log alone); sent before the command returns, within 10 s."""
    import os

    if not os.environ.get("PREFECT_API_URL"):
        return
    from prefect.events.worker import EventsWorker

    from loragate.flows.events import CANARY_OVERRIDDEN, announce

    announce(CANARY_OVERRIDDEN, name, version_id=version_id, window_id=window_id, reason=reason)
    EventsWorker.drain_all(timeout=10, at_exit=False)


def cmd_promote(args: argparse.Namespace) -> int:
    from loragate.registry.rules.canary import WindowStatus
    from loragate.tasks.canary_moves import CanaryDeployment, promote_to_production, put_on_canary

    window = None
    with open_registry(args) as reg:
        name = reg.get_version(args.version).name
        if args.to == "canary":
            # the canary gate's own move: the window and the live split open with the pointer
            moved = put_on_canary(reg, args.version, reason=args.reason, progress=progress_printer(args))
            if isinstance(moved, CanaryDeployment):
                plan, report, window = moved.plan, moved.replicas, moved.window
            else:
                plan, report = moved
        else:
            plan, report, window = promote_to_production(
                reg,
                args.version,
                reason=args.reason,
                progress=progress_printer(args),
                acknowledge_scan_review=args.acknowledge_scan_review,
                override=args.override,
            )
    if args.override and window is not None and window.status == WindowStatus.SUPERSEDED:
        announce_override(name, args.version, window.id, args.reason)
    payload = {**_plan_payload(name, plan), "replicas": report}
    text = f"{name}: {args.to} -> {args.version}" if payload["changed"] else f"{name}: {args.version} already {args.to}"
    emit(args, *_with_window(payload, text + _deployed(report), window))
    return EXIT_OK


def cmd_rollback(args: argparse.Namespace) -> int:
    from loragate.tasks.canary_moves import withdraw_adapter_canary
    from loragate.tasks.fleet import rollback_and_switch

    window = None
    with open_registry(args) as reg:
        if args.stage == "canary":
            # as the watch withdraws it: 0 % on every replica first, its warm copy unloaded,
            # its window closed
            plan, report, window = withdraw_adapter_canary(
                reg, args.name, reason=args.reason, progress=progress_printer(args)
            )
        else:
            plan, report = rollback_and_switch(
                reg, args.name, args.stage, reason=args.reason, progress=progress_printer(args)
            )
    now = f", now {plan.audit_to}" if plan.audit_to else ""
    text = f"{args.name}: {args.stage} {plan.audit_from} rolled back{now}" + _deployed(report)
    emit(args, *_with_window({**_plan_payload(args.name, plan), "replicas": report}, text, window))
    return EXIT_OK


def cmd_materialize(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        dest = reg.materialize(args.version, Path(args.dest))
    emit(args, {"version_id": args.version, "path": str(dest)}, str(dest))
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("init", parents=[common], help="create or upgrade the schema and the artifact store")
    p.set_defaults(func=cmd_init)

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
    p.add_argument(
        "--acknowledge-scan-review",
        action="store_true",
        help="promote to production a version whose weight scan asked for review (recorded in the audit log)",
    )
    p.add_argument(
        "--override",
        action="store_true",
        help="promote to production a canary whose window has not decided yet: needs --reason; the audit log "
        "and the Prefect event feed record both",
    )
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
