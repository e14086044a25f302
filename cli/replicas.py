"""``loragate replicas``: local vLLM CPU replicas, started and stopped by loragate.

``up`` builds ``.venv-vllm`` when missing, starts N replicas of a catalogued base on free
ports in parallel, waits until they answer, adds them to the fleet and loads what the
pointers say; ``down`` stops the ones it started, by PID (kept under
``$LORAGATE_HOME/replicas/``), and removes them from the fleet.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from cli.output import EXIT_OK, emit, open_registry, progress_printer
from registry.errors import ErrorCode, InvalidInput, NotFound


def _state_dir(args: argparse.Namespace) -> Path:
    return Path(args.settings.home) / "replicas"


def cmd_replicas_up(args: argparse.Namespace) -> int:
    from infra.replica import VllmReplica, build_vllm_venv, start_replicas
    from registry.intake.catalog import base_directory
    from tasks.fleet import reconcile_fleet

    progress = progress_printer(args)
    if args.count < 1:
        raise InvalidInput("--count must be at least 1", code=ErrorCode.INVALID_SETTING, field="count")
    with open_registry(args) as reg:
        pins = [b for b in reg.list_bases(args.base) if args.commit in (None, b.base_model_commit)]
        if len(pins) != 1:
            raise InvalidInput(
                f"base {args.base} is pinned at {len(pins)} matching commit(s): name one with --commit",
                code=ErrorCode.UNKNOWN_BASE,
                field="base",
            )
        base = pins[0]
        model_dir = base_directory(base, reg.settings.hf_cache_dir)
        progress("building .venv-vllm if missing (about 2 minutes the first time)")
        with open(os.devnull, "w") as devnull:
            build_vllm_venv(log=sys.stderr if args.progress else devnull)
        adapter_dir = Path(args.adapter_dir or Path(args.settings.home) / "adapters").absolute()
        logs = _state_dir(args)
        logs.mkdir(parents=True, exist_ok=True)
        replicas = [
            VllmReplica(
                model_dir,
                base.base_model_id,
                max_lora_rank=args.max_lora_rank,
                max_loras=args.max_loras,
                max_cpu_loras=args.max_cpu_loras,
                adapter_dir=adapter_dir,
                role=args.role,
            )
            for _ in range(args.count)
        ]
        for r in replicas:
            r.log_path = logs / f"{r.port}.log"
        progress(f"starting {args.count} vLLM replica(s) of {base.label}")
        # bound to cores after those of replicas started before
        start_replicas(replicas, first_cpu=len(list(logs.glob("*.json"))))
        for r in replicas:
            assert r.process is not None
            state = {"pid": r.process.pid, "url": r.url, "log": str(r.log_path), "base": base.base_model_id}
            (logs / f"{r.port}.json").write_text(json.dumps(state))
            reg.add_replica(
                r.url,
                base.base_model_id,
                args.role,
                str(adapter_dir),
                base_model_commit=base.base_model_commit,
                max_lora_rank=args.max_lora_rank,
                max_loras=args.max_loras,
            )
            progress(f"{r.url} answers (pid {r.process.pid}, log {r.log_path})")
        reconcile_fleet(reg, progress=progress)
    urls = [r.url for r in replicas]
    emit(args, {"urls": urls, "role": args.role, "adapter_dir": str(adapter_dir)}, "\n".join(urls))
    return EXIT_OK


def cmd_replicas_down(args: argparse.Namespace) -> int:
    from infra.replica import stop_pid

    stopped = []
    with open_registry(args) as reg:
        for state_file in sorted(_state_dir(args).glob("*.json")):
            state = json.loads(state_file.read_text())
            if args.url and state["url"] != args.url.rstrip("/"):
                continue
            stop_pid(int(state["pid"]))
            with contextlib.suppress(NotFound):  # removed from the fleet already
                reg.remove_replica(state["url"])
            state_file.unlink()
            stopped.append(state["url"])
    emit(args, {"stopped": stopped}, "\n".join(stopped) or "(no replicas started by loragate)")
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
    p.add_argument("--max-lora-rank", type=int, default=16)
    p.add_argument("--max-loras", type=int, default=4)
    p.add_argument(
        "--max-cpu-loras",
        type=int,
        help="the engine's adapter cache (default 4 x --max-loras: each switch leaves an entry there)",
    )
    p.set_defaults(func=cmd_replicas_up)
    p = replicas.add_parser("down", parents=[common], help="stop the replicas loragate started")
    p.add_argument("--url", help="only this one")
    p.set_defaults(func=cmd_replicas_down)
