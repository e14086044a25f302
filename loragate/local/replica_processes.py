"""Replicas that outlive the command that started them.

``loragate replicas up`` starts local vLLM replicas detached and returns; a later
``loragate replicas down``, another process, stops them. What connects the two is one PID
file per replica under ``$LORAGATE_HOME/replicas/`` (``<port>.json``, its log beside it as
``<port>.log``): the URL, the PID *and* the process's creation time. By the time ``down``
runs a replica may have died and its PID been handed to an unrelated process; the
creation time tells the two apart, and only the process we started is signalled
(``loragate.local.processes``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from loragate.local.processes import ProcessIdentity, Stopped, stop_process_tree
from loragate.local.replica import VllmReplica, start_replicas
from loragate.local.replica_config import DEFAULT_PYTHON, default_max_cpu_loras

# what a replica's command line holds, for records written before creation times were
LEGACY_MARKER = "vllm.entrypoints.openai.api_server"


@dataclass(frozen=True)
class RecordedReplica:
    """One replica started by ``loragate replicas up``, as its PID file holds it."""

    url: str
    port: int
    pid: int
    # None in records written before it was kept: the command line is checked instead
    create_time: float | None
    log: str
    base: str
    # the engine's adapter cache it was started with (the fleet does not record it: ``fleet
    # plan`` reads it here); None in records written before it was kept
    max_cpu_loras: int | None
    # the PID file itself (not written into it)
    path: Path = field(compare=False)

    def identity(self) -> ProcessIdentity | None:
        """The process this record names, or None when no such process can be confirmed."""
        if self.create_time is not None:
            return ProcessIdentity(self.pid, self.create_time)
        try:
            process = psutil.Process(self.pid)
            cmdline = process.cmdline()
            created = process.create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None
        ours = LEGACY_MARKER in cmdline and str(self.port) in cmdline
        return ProcessIdentity(self.pid, created) if ours else None

    def stop(self, grace_s: float = 30.0) -> Stopped:
        """Stop the replica if its PID still names it (see ``stop_process_tree``); the
        record stays until ``forget``."""
        identity = self.identity()
        if identity is None:
            return Stopped.PID_REUSED if psutil.pid_exists(self.pid) else Stopped.ALREADY_GONE
        return stop_process_tree(identity, grace_s)

    def forget(self) -> None:
        self.path.unlink(missing_ok=True)


def recorded_replicas(state_dir: Path, url: str | None = None) -> list[RecordedReplica]:
    """The replicas recorded under ``state_dir`` (all, or the one at ``url``), by port."""
    found = []
    for path in sorted(Path(state_dir).glob("*.json")):
        state = json.loads(path.read_text())
        state.setdefault("create_time", None)
        state.setdefault("max_cpu_loras", None)
        state.setdefault("port", int(path.stem))
        state["path"] = path
        record = RecordedReplica(**{k: state[k] for k in RecordedReplica.__dataclass_fields__})
        if url is None or record.url == url.rstrip("/"):
            found.append(record)
    return found


def record(state_dir: Path, replica: VllmReplica) -> RecordedReplica:
    """Write the PID file of a started replica (atomically: ``down`` may read it any time)."""
    assert replica.identity is not None
    entry = RecordedReplica(
        url=replica.url,
        port=replica.port,
        pid=replica.identity.pid,
        create_time=replica.identity.create_time,
        log=str(replica.log_path),
        base=replica.served_name,
        max_cpu_loras=replica.max_cpu_loras or default_max_cpu_loras(replica.max_loras),
        path=state_dir / f"{replica.port}.json",
    )
    scratch = entry.path.with_name(f".{entry.path.name}.{os.getpid()}")
    state = {k: v for k, v in asdict(entry).items() if k != "path"}
    scratch.write_text(json.dumps(state, indent=1))
    os.replace(scratch, entry.path)
    return entry


def start_recorded_replicas(
    state_dir: Path,
    model_dir: Path,
    served_name: str,
    count: int,
    *,
    adapter_dir: Path,
    role: str,
    max_lora_rank: int,
    max_loras: int,
    max_cpu_loras: int | None,
    python: Path = DEFAULT_PYTHON,
    timeout: float = 300.0,
    secrets_dir: Path | None = None,
    owner_moves: bool = False,
) -> list[RecordedReplica]:
    """Start ``count`` replicas of ``model_dir`` on free ports, wait until each answers, and
    record each; they keep running after this process exits. When one fails to start,
    all are stopped and none is recorded. ``owner_moves``: these processes alone also serve
    the registry owner's in-process moves (``VllmReplica.owner_moves``).

    Raises:
        ReplicaError: REPLICA_UNAVAILABLE when ``python`` cannot run vLLM, or a replica
            exits or does not answer within ``timeout``.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    replicas = [
        VllmReplica(
            model_dir,
            served_name,
            max_lora_rank=max_lora_rank,
            max_loras=max_loras,
            max_cpu_loras=max_cpu_loras,
            adapter_dir=adapter_dir,
            role=role,
            python=python,
            secrets_dir=secrets_dir,
            owner_moves=owner_moves,
        )
        for _ in range(count)
    ]
    for r in replicas:
        r.log_path = state_dir / f"{r.port}.log"
    # bound to the cores after those of the replicas started before
    start_replicas(replicas, timeout, first_cpu=len(recorded_replicas(state_dir)))
    return [record(state_dir, r) for r in replicas]
