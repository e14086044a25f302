"""What the benchmarks that drive real replicas share: a production and a canary vLLM
replica of one base, Postgres databases of their own, and printing (and keeping) the JSON
result."""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from kit.postgres import admin_engine, drop_database, pg_url
from loragate.local.replica import VllmReplica, start_replicas, stop_replicas
from loragate.local.replica_secrets import write_replica_secrets
from loragate.tasks.replicas import ADMIN_KEY_HEADER
from loragate.tasks.secret_files import ADMIN_KEY_FILE, HOME_REPLICA_SECRETS_DIR, REGISTRY_URL_FILE


@dataclass(frozen=True)
class ServingReplica:
    """A replica a benchmark registers in its fleet: one it started, or one already running."""

    url: str
    role: str
    adapter_dir: Path
    # its admin key and registry URL (loragate.local.replica_secrets.write_replica_secrets)
    secrets_dir: Path | None = None


def production_and_canary(
    base_dir: Path,
    served_name: str,
    adapter_dir: Path,
    logs: Path,
    secrets_dir: Path | None = None,
    owner_moves: bool = False,
) -> list[VllmReplica]:
    """A production and a canary replica (not started), sharing ``adapter_dir``; they go
    when the benchmark goes, even killed. ``owner_moves``: the benchmark's owner moves
    production in process, without a sign-off code."""
    return [
        VllmReplica(
            base_dir,
            served_name,
            adapter_dir=adapter_dir,
            role=role,
            secrets_dir=secrets_dir,
            log_path=logs / f"{role}.log",
            die_with_parent=True,
            owner_moves=owner_moves,
        )
        for role in ("production", "canary")
    ]


def production_replicas(
    base_dir: Path, served_name: str, count: int, adapter_dir: Path, secrets_dir: Path, logs: Path, prefix: str
) -> list[VllmReplica]:
    """``count`` production replicas (not started) sharing ``adapter_dir``, each logging to
    ``logs/<prefix>-<i>.log``, serving the benchmark owner's in-process moves; they go when
    the benchmark goes, even killed."""
    logs.mkdir(parents=True, exist_ok=True)
    return [
        VllmReplica(
            base_dir,
            served_name,
            adapter_dir=adapter_dir,
            secrets_dir=secrets_dir,
            die_with_parent=True,
            log_path=logs / f"{prefix}-{i}.log",
            owner_moves=True,
        )
        for i in range(count)
    ]


def replicas_obey(registry, directory: Path | None = None) -> tuple[Path, str]:
    """(the replicas' secrets directory, their admin key) for replicas a benchmark drives with
    ``registry``: the key already in ``directory`` (running replicas'), else the one its fleet
    control holds (``LORAGATE_REPLICA_ADMIN_KEY_FILE``), else a new one -- also under its home,
    where ``loragate`` finds it; the registry's URL. Whether they serve the benchmark owner's
    in-process moves is each replica process's own flag, set when it started
    (``production_replicas``), never written here."""
    from loragate.local.replica_secrets import replica_registry_url, write_replica_secrets
    from loragate.tasks.replicas import replica_admin_key

    held = directory / ADMIN_KEY_FILE if directory else None
    key = (held.read_text() if held and held.exists() else None) or replica_admin_key(registry.settings)
    key = key or secrets.token_urlsafe(32)
    url = replica_registry_url(registry.settings.database_url)
    own = write_replica_secrets(Path(registry.settings.home) / HOME_REPLICA_SECRETS_DIR, key, url)
    return (write_replica_secrets(directory, key, url) if directory else own), key


@contextmanager
def fleet_replica(
    registry,
    base_dir: Path,
    base_id: str,
    label: str,
    work: Path,
    slots: dict[str, int],
    traffic_env: dict[str, str],
) -> Iterator[tuple[VllmReplica, str]]:
    """One production replica of ``registry``'s fleet, serving the base pinned as ``base_id``,
    for one way of a benchmark: its own
    adapter directory, started with ``slots`` (``max_loras``, ``max_cpu_loras``) and the split's
    ``traffic_env``, added to the fleet with the slots it was started with (the fleet refuses a
    replica too small for the pins); stopped and removed when the way ends. Yields the replica
    and the fleet's admin key."""
    secrets_dir, admin_key = replicas_obey(registry, work / "replica-secrets")
    adapter_dir = work / f"adapters-{label}"
    replica = VllmReplica(
        base_dir,
        base_id,
        adapter_dir=adapter_dir,
        secrets_dir=secrets_dir,
        log_path=work / f"{label}.log",
        die_with_parent=True,
        owner_moves=True,
        max_loras=slots["max_loras"],
        max_cpu_loras=slots["max_cpu_loras"],
        traffic_env=traffic_env,
    )
    added = False
    try:
        start_replicas([replica])
        registry.add_replica(replica.url, base_id, "production", str(adapter_dir), max_loras=slots["max_loras"])
        added = True
        yield replica, admin_key
    finally:
        stop_replicas([replica])
        if added:
            registry.remove_replica(replica.url)


@contextmanager
def secrets_put_back(directory: Path | None) -> Iterator[None]:
    """Running replicas' secrets (``directory``) as they were before the run, put back when it
    ends: the run points them at its own registry, which it then deletes, and replicas keep
    reading the registry they are pointed at (their routes refresh) until told another."""
    names = (ADMIN_KEY_FILE, REGISTRY_URL_FILE)
    held = {n: (directory / n).read_text() if (directory / n).exists() else None for n in names} if directory else {}
    try:
        yield
    finally:
        if directory and held.get(ADMIN_KEY_FILE):
            key, url = (held[n] for n in names)
            write_replica_secrets(directory, key, url)


@contextmanager
def work_directory(prefix: str, deadline_s: float = 10.0) -> Iterator[Path]:
    """A scratch directory, removed when the run ends. A replica that opened the run's SQLite
    registry just before the removal may create its ``-wal``/``-shm`` files again behind it:
    the removal is tried again until the directory is gone, ``deadline_s`` at most."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        ends = time.monotonic() + deadline_s
        while path.exists():
            try:
                shutil.rmtree(path)
            except OSError:
                if time.monotonic() > ends:
                    raise
                time.sleep(0.2)


def emit(result: dict[str, Any], out: Path | None) -> None:
    """The result on stdout, and in ``out`` when given."""
    text = json.dumps(result, indent=1, default=dict)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    print(text)


def add_running_replica_arguments(parser: argparse.ArgumentParser) -> None:
    """``--production``, ``--adapter-dir``, ``--replica-secrets``: a running production replica
    for a one-replica benchmark to drive instead of starting its own (the smoke tests pass the
    test session's)."""
    parser.add_argument("--production", help="a running production replica to drive (else one is started)")
    parser.add_argument("--adapter-dir", type=Path, help="the running replica's adapter directory")
    parser.add_argument("--replica-secrets", type=Path, help="the running replica's secrets directory")


def check_running_replica_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    running = [args.production, args.adapter_dir, args.replica_secrets]
    if any(running) and not all(running):
        parser.error("--production, --adapter-dir and --replica-secrets go together")


def one_production_replica(
    args: argparse.Namespace, base_dir: Path, served_name: str, work: Path, secrets_dir: Path, **options: Any
) -> tuple[VllmReplica | None, str, Path]:
    """(the replica to start -- None for the running one ``args`` names --, its URL, its
    adapter directory): a new one under ``work`` reads ``secrets_dir`` and serves the benchmark
    owner's in-process moves; ``options`` go to ``VllmReplica``."""
    if args.production:
        return None, args.production, args.adapter_dir
    adapter_dir = work / "adapters"
    replica = VllmReplica(
        base_dir,
        served_name,
        adapter_dir=adapter_dir,
        secrets_dir=secrets_dir,
        log_path=work / "production.log",
        die_with_parent=True,
        owner_moves=True,
        **options,
    )
    return replica, replica.url, adapter_dir


def model_cards(url: str, admin_key: str) -> list[dict[str, Any]]:
    """The replica's ``/v1/models`` as the fleet reads it: with the key (a keyless read lists
    the base alone); [] when it cannot be read."""
    try:
        return httpx.get(f"{url}/v1/models", headers={ADMIN_KEY_HEADER: admin_key}, timeout=10).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError):
        return []


def serving_path(url: str, name: str, admin_key: str) -> str | None:
    """The path the replica serves ``name`` from (its model card's root), if it serves it."""
    return next((c["root"] for c in model_cards(url, admin_key) if c["id"] == name), None)


@dataclass
class Databases:
    """Postgres databases a benchmark creates on the test server, by label, dropped at its end."""

    names: dict[str, str]

    @classmethod
    def create(cls, bench: str, *labels: str) -> Databases:
        names = {label: f"loragate_bench_{bench}_{label}_{uuid.uuid4().hex[:6]}" for label in labels}
        with admin_engine().connect() as conn:
            for name in names.values():
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        return cls(names)

    def url(self, label: str) -> str:
        return pg_url(self.names[label])

    def prefect_url(self, label: str) -> str:
        """The URL a Prefect server takes: its async driver."""
        return self.url(label).replace("+psycopg", "+asyncpg")

    def drop(self) -> None:
        admin = admin_engine()
        for name in self.names.values():
            drop_database(admin, name)
