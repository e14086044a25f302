"""What the benchmarks that drive real replicas share: a production and a canary vLLM
replica of one base, Postgres databases of their own, and printing (and keeping) the JSON
result."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from infra.replica import VllmReplica
from tests.support.postgres import admin_engine, drop_database, pg_url


@dataclass(frozen=True)
class ServingReplica:
    """A replica a benchmark registers in its fleet: one it started, or one already running."""

    url: str
    role: str
    adapter_dir: Path


def production_and_canary(base_dir: Path, served_name: str, adapter_dir: Path, logs: Path) -> list[VllmReplica]:
    """A production and a canary replica (not started), sharing ``adapter_dir``; they go
    when the benchmark goes, even killed."""
    return [
        VllmReplica(
            base_dir,
            served_name,
            adapter_dir=adapter_dir,
            role=role,
            log_path=logs / f"{role}.log",
            die_with_parent=True,
        )
        for role in ("production", "canary")
    ]


def emit(result: dict[str, Any], out: Path | None) -> None:
    """The result on stdout, and in ``out`` when given."""
    text = json.dumps(result, indent=1, default=dict)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    print(text)


def serving_path(url: str, name: str) -> str | None:
    """The path the replica serves ``name`` from (its model card's root), if it serves it."""
    try:
        cards = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError):
        return None
    return next((c["root"] for c in cards if c["id"] == name), None)


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
