"""``loragate fleet``: the serving fleet -- add, remove, list, status (drift), reconcile,
watch (the live-traffic alerts of every adapter in production, read once from each
production replica, and the hot pins re-chosen from the same read: what the scheduled
``traffic-watch`` flow does every minute), plan (the slots and cache each base's replicas
need, and whether each replica's hold them), and pin, unpin, pins (the adapters every
production replica keeps loaded)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from loragate.cli.output import EXIT_FAILED, EXIT_OK, emit, open_registry, progress_printer


def cmd_fleet_add(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        replica, created = reg.add_replica(
            args.url,
            args.base,
            args.role,
            args.adapter_dir,
            base_model_commit=args.commit,
            max_lora_rank=args.max_lora_rank,
            max_loras=args.max_loras,
            served_model_name=args.served_name,
        )
    emit(args, {**replica.as_dict(), "created": created}, f"{'added' if created else 'already in'} {replica.url}")
    return EXIT_OK


def cmd_fleet_remove(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        replica = reg.remove_replica(args.url)
    emit(args, replica.as_dict(), f"removed {replica.url}")
    return EXIT_OK


def cmd_fleet_list(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        replicas = reg.list_replicas(args.base)
    emit(
        args,
        [r.as_dict() for r in replicas],
        lambda: (
            "\n".join(f"{r.url}\t{r.base_model_id}\t{r.role.value}\t{r.adapter_dir}" for r in replicas)
            or "(no replicas)"
        ),
    )
    return EXIT_OK


def _states_text(states) -> str:
    lines = []
    for s in states:
        status = "unreachable" if not s.reachable else "in sync" if not s.actions else f"{len(s.actions)} drift"
        lines.append(f"{s.replica.url}  {s.replica.role.value:<10} {status}" + (f"  ({s.error})" if s.error else ""))
        lines.extend(f"    - {a.describe()}" for a in s.actions)
        lines.extend(f"    + {d}" for d in s.done)
    return "\n".join(lines) or "(no replicas)"


def cmd_fleet_status(args: argparse.Namespace) -> int:
    from loragate.tasks.reconcile import fleet_status

    with open_registry(args) as reg:
        states = fleet_status(reg)
    emit(args, [s.as_dict() for s in states], lambda: _states_text(states))
    return EXIT_OK


def cmd_fleet_reconcile(args: argparse.Namespace) -> int:
    from loragate.tasks.reconcile import reconcile_fleet

    with open_registry(args) as reg:
        states = reconcile_fleet(reg, progress=progress_printer(args))
    emit(args, [s.as_dict() for s in states], lambda: _states_text(states))
    return EXIT_OK if all(s.reachable and not s.error for s in states) else EXIT_FAILED


def cmd_fleet_watch(args: argparse.Namespace) -> int:
    from loragate.tasks.hot_pins import recent_requests, repin_hot
    from loragate.tasks.traffic_watch import watch_fleet

    progress = progress_printer(args)
    with open_registry(args) as reg:
        watched = watch_fleet(reg, progress=progress)
        hot = repin_hot(reg, *recent_requests(watched.figures, watched.names), progress=progress)
    lines = [f"ALERT {a.kind} {a.name} on {a.replica}: {a.detail}" for a in watched.alerts]
    lines += [f"unreadable: {line}" for line in watched.unreadable]
    lines += [f"hot pin: {name}" for name in hot.added] + [f"hot pin removed: {name}" for name in hot.removed]
    emit(
        args,
        {"alerts": [a.as_dict() for a in watched.alerts], "unreadable": watched.unreadable, "hot_pins": hot.as_dict()},
        lambda: "\n".join(lines) or "no new traffic alert",
    )
    return EXIT_FAILED if watched.unreadable else EXIT_OK


def cmd_fleet_pin(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        pin, changed = reg.pin(args.name)
    emit(args, {**pin.as_dict(), "changed": changed}, f"{'pinned' if changed else 'already pinned'} {pin.name}")
    return EXIT_OK


def cmd_fleet_unpin(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        pin = reg.unpin(args.name)
    emit(args, pin.as_dict(), f"unpinned {pin.name} (was {pin.source.value})")
    return EXIT_OK


def cmd_fleet_pins(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        pins = reg.pins()
    emit(
        args,
        [p.as_dict() for p in pins],
        lambda: (
            "\n".join(f"{p.name}\t{p.source.value}\t{p.pinned_by}\t{p.pinned_at.isoformat()}" for p in pins)
            or "(no pinned adapters)"
        ),
    )
    return EXIT_OK


def cmd_fleet_plan(args: argparse.Namespace) -> int:
    from loragate.local.replica_processes import recorded_replicas

    # the fleet does not record a replica's --max-cpu-loras: only those loragate started know it
    started = {r.url: r.max_cpu_loras for r in recorded_replicas(Path(args.settings.home) / "replicas")}
    bases, lines = [], []
    with open_registry(args) as reg:
        ids = [args.base] if args.base else sorted({b.base_model_id for b in reg.list_bases()})
        for base in ids:
            plans = {role: reg.residency_plan(base, role=role) for role in ("production", "canary")}
            checks = []
            for r in reg.list_replicas(base):
                plan = plans[r.role.value]
                cpu = started.get(r.url)
                shortfalls = plan.shortfalls(r.max_loras, r.max_lora_rank, cpu)
                checks.append(
                    {
                        "url": r.url,
                        "role": r.role.value,
                        "max_loras": r.max_loras,
                        "max_lora_rank": r.max_lora_rank,
                        "max_cpu_loras": cpu,
                        "slot_bytes": plan.slot_bytes(r.max_lora_rank),
                        "holds": not shortfalls,
                        "shortfalls": [{"field": f.field, "message": f.message} for f in shortfalls],
                    }
                )
            bases.append({**plans["production"].as_dict(), "canary": plans["canary"].as_dict(), "replicas": checks})
            lines += _plan_lines(plans["production"], checks)
    emit(args, bases, lambda: "\n".join(lines) or "(no pinned base)")
    return EXIT_OK if all(c["holds"] for b in bases for c in b["replicas"]) else EXIT_FAILED


def _plan_lines(plan: Any, checks: list[dict[str, Any]]) -> list[str]:
    from loragate.registry.rules.residency import human_bytes

    settings = plan.settings()
    lines = [
        f"{plan.base_model_id}: {len(plan.served)} in production, {len(plan.warm)} warm, {plan.pinned} pinned"
        f" -> max_loras >= {plan.max_loras}, max_cpu_loras >= {plan.max_cpu_loras}, max_lora_rank >= {plan.max_rank}"
        f" (start with --max-loras {settings['max_loras']} --max-cpu-loras {settings['max_cpu_loras']}"
        f" --max-lora-rank {settings['max_lora_rank']})",
        f"  host memory of what production keeps: {human_bytes(plan.cpu_bytes)}"
        + (f" ({plan.shape_note})" if plan.shape_note else ""),
    ]
    for r in plan.residents:
        targets = r.target_modules if isinstance(r.target_modules, str) else ",".join(r.target_modules)
        lines.append(
            f"  {r.name}  {r.version_id}  {r.residence.value:<6}  rank {r.lora_rank}  {targets}  {human_bytes(r.bytes)}"
        )
    for c in checks:
        slots = f"{c['max_loras']} slots x {human_bytes(c['slot_bytes'])}"
        cpu = (
            "max_cpu_loras not recorded in the fleet"
            if c["max_cpu_loras"] is None
            else f"max_cpu_loras {c['max_cpu_loras']}"
        )
        verdict = "holds it" if c["holds"] else "does NOT hold it: " + "; ".join(f["message"] for f in c["shortfalls"])
        lines.append(f"  {c['url']}  {c['role']:<10}  {slots}, rank {c['max_lora_rank']}, {cpu}: {verdict}")
    if not checks:
        lines.append("  (no replicas)")
    return lines


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    fleet = sub.add_parser("fleet", help="the serving fleet").add_subparsers(dest="fleet_command", required=True)
    p = fleet.add_parser("add", parents=[common], help="add a vLLM replica of a pinned base")
    p.add_argument("url", help="the replica's OpenAI-compatible server, http://host:port")
    p.add_argument("--base", required=True, help="catalog id of the base it serves")
    p.add_argument("--commit", help="the base's commit (needed when several are pinned)")
    p.add_argument("--role", required=True, choices=["canary", "production"])
    p.add_argument("--adapter-dir", required=True, help="where loragate puts bundles, as the replica sees it")
    p.add_argument("--max-lora-rank", type=int, default=16, help="the replica's --max-lora-rank")
    p.add_argument("--max-loras", type=int, default=4, help="the replica's --max-loras")
    p.add_argument("--served-name", help="its --served-model-name (default: the base id)")
    p.set_defaults(func=cmd_fleet_add)
    p = fleet.add_parser("remove", parents=[common], help="remove a replica from the fleet")
    p.add_argument("url")
    p.set_defaults(func=cmd_fleet_remove)
    p = fleet.add_parser("list", parents=[common], help="the replicas in the fleet")
    p.add_argument("--base")
    p.set_defaults(func=cmd_fleet_list)
    p = fleet.add_parser("status", parents=[common], help="what each replica serves against what it should")
    p.set_defaults(func=cmd_fleet_status)
    p = fleet.add_parser("reconcile", parents=[common], help="make every replica serve what the pointers say")
    p.set_defaults(func=cmd_fleet_reconcile)
    p = fleet.add_parser(
        "watch",
        parents=[common],
        help="raise the live-traffic alerts of every adapter in production and re-choose the hot pins, once",
    )
    p.set_defaults(func=cmd_fleet_watch)
    p = fleet.add_parser("pin", parents=[common], help="keep an adapter loaded on every production replica")
    p.add_argument("name", help="the adapter, <namespace>/<base>/<task>")
    p.set_defaults(func=cmd_fleet_pin)
    p = fleet.add_parser("unpin", parents=[common], help="remove an adapter's pin (a person's or a hot one)")
    p.add_argument("name", help="the adapter, <namespace>/<base>/<task>")
    p.set_defaults(func=cmd_fleet_unpin)
    p = fleet.add_parser("pins", parents=[common], help="the pinned adapters: a person's and the hot ones")
    p.set_defaults(func=cmd_fleet_pins)
    p = fleet.add_parser(
        "plan",
        parents=[common],
        help="the slots and adapter cache each base needs; whether each replica holds them",
    )
    p.add_argument("--base", help="only this base (default: every pinned base)")
    p.set_defaults(func=cmd_fleet_plan)
