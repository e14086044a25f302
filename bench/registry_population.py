"""What the registry benchmark (``bench/registry.py``) fills each layout with, and how
much: a synthetic fleet of adapters, ten versions each in fixed stages, up to the sizes a
scale names; and loragate's side of it, whole adapters bulk-inserted into the tables the
migrations made (bypassing register, whose throughput is measured on its own).

The tables filled are the code under test's (``bench/registry_code.py``): this tree's, or
an earlier revision's with ``--against``.
"""

from __future__ import annotations

import hashlib
import random
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, insert, select, text
from sqlalchemy.engine import Engine

from bench.registry_code import code_module

# the second name of each: an --against revision from before the registry's rooms (sub-packages)
_schema = code_module("db.schema", "schema")
adapter_versions, adapters, audit_events, stage_pointers = (
    _schema.adapter_versions,
    _schema.adapters,
    _schema.audit_events,
    _schema.stage_pointers,
)
AdapterVersion = code_module("records.adapters", "domain").AdapterVersion

BASE_ID = "tiny-llama"
VERSIONS_PER_ADAPTER = 10
PREVIOUS, PRODUCTION, CANDIDATES = 6, 7, (8, 9)  # 0-based positions within an adapter
EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
SEED = 20261121


@dataclass(frozen=True)
class Scale:
    sizes: tuple[int, ...]
    mlflow_sizes: tuple[int, ...]
    register_bundles: int
    samples: int
    move_samples: int
    warmup: int


FULL = Scale(
    sizes=(10_000, 100_000),
    mlflow_sizes=(10_000, 100_000),
    register_bundles=200,
    samples=5000,
    move_samples=2000,
    warmup=300,
)
QUICK = Scale(
    sizes=(1_000, 5_000), mlflow_sizes=(1_000,), register_bundles=40, samples=500, move_samples=300, warmup=50
)
# a run that only proves the benchmark still works (make test): no figure means anything
SMOKE = Scale(sizes=(100, 200), mlflow_sizes=(100,), register_bundles=4, samples=30, move_samples=20, warmup=3)
SCALES = {"full": FULL, "quick": QUICK, "smoke": SMOKE}


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def hex_digest(*parts: object) -> str:
    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()


# -- the synthetic fleet both layouts are filled with -------------------------------------


@dataclass(frozen=True)
class SyntheticVersion:
    version_id: str
    weights_sha256: str
    created_at: datetime
    stage: str
    previous: str | None


class Fleet:
    """Names and versions of the bulk adapters, and whose turn it is to be canary."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.production: dict[str, str] = {}
        self.candidates: dict[str, tuple[str, str]] = {}
        self.canary: dict[str, str] = {}

    @property
    def version_count(self) -> int:
        return len(self.names) * VERSIONS_PER_ADAPTER

    def add(self) -> tuple[str, list[SyntheticVersion]]:
        index = len(self.names)
        name = f"tenant{index:05d}/{BASE_ID}/support"
        versions, previous = [], None
        for position in range(VERSIONS_PER_ADAPTER):
            serial = index * VERSIONS_PER_ADAPTER + position
            created_at = EPOCH + timedelta(seconds=serial)  # one second apart: ids never collide
            weights = hex_digest("weights", serial)
            stage = "production" if position == PRODUCTION else "staging" if position in CANDIDATES else "retired"
            version = SyntheticVersion(
                f"{created_at:%Y%m%d_%H%M%S}_{weights[:12]}", weights, created_at, stage, previous
            )
            versions.append(version)
            previous = version.version_id
        self.names.append(name)
        self.production[name] = versions[PRODUCTION].version_id
        self.candidates[name] = (versions[CANDIDATES[0]].version_id, versions[CANDIDATES[1]].version_id)
        return name, versions

    def next_canary(self, rng: random.Random) -> tuple[str, str]:
        """A random adapter and the candidate that is not its canary now."""
        name = rng.choice(self.names)
        first, second = self.candidates[name]
        self.canary[name] = second if self.canary.get(name) == first else first
        return name, self.canary[name]


class BulkAdapters:
    """Whole adapters inserted straight into loragate's tables, bypassing register."""

    def __init__(self, engine: Engine, template: AdapterVersion, chunk: int = 500):
        self.engine = engine
        self.template = template
        self.chunk = chunk
        self.fleet = Fleet()

    def count(self) -> int:
        with self.engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(adapter_versions)).scalar_one()

    def fill_to(self, total_versions: int) -> None:
        missing = -(-(total_versions - self.count()) // VERSIONS_PER_ADAPTER)  # whole adapters, rounding up
        while missing > 0:
            batch = [self.fleet.add() for _ in range(min(self.chunk, missing))]
            with self.engine.begin() as conn:
                conn.execute(
                    insert(adapters),
                    [
                        {
                            "name": name,
                            "namespace": name.split("/")[0],
                            "base": BASE_ID,
                            "task": "support",
                            "revision": 0,
                            "created_at": EPOCH,
                        }
                        for name, _ in batch
                    ],
                )
                ids = dict(
                    conn.execute(
                        select(adapters.c.name, adapters.c.id).where(adapters.c.name.in_([n for n, _ in batch]))
                    ).all()
                )
                version_rows, pointer_rows, audit_rows = [], [], []
                for name, versions in batch:
                    version_rows += [self._version_row(ids[name], v) for v in versions]
                    audit_rows += [self._audit_row(name, v) for v in versions]
                    pointer_rows += [
                        {
                            "adapter_id": ids[name],
                            "stage": "previous",
                            "version_id": versions[PREVIOUS].version_id,
                            "moved_at": EPOCH,
                        },
                        {
                            "adapter_id": ids[name],
                            "stage": "production",
                            "version_id": versions[PRODUCTION].version_id,
                            "moved_at": EPOCH,
                        },
                    ]
                conn.execute(insert(adapter_versions), version_rows)
                conn.execute(insert(stage_pointers), pointer_rows)
                conn.execute(insert(audit_events), audit_rows)
            missing -= len(batch)
        if self.engine.dialect.name == "postgresql":
            # what autovacuum does shortly after a load like this one
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("VACUUM ANALYZE"))

    def _version_row(self, adapter_id: int, v: SyntheticVersion) -> dict:
        t = self.template
        manifest = {**t.manifest, "adapter_version": v.version_id, "previous_version": v.previous}
        # every bulk version stores the template's real blobs, so a promotion can verify them
        return {
            "version_id": v.version_id,
            "adapter_id": adapter_id,
            "content_address": "sha256:" + hex_digest("address", v.version_id),
            "identity_sha256": t.identity_sha256,
            "manifest_sha256": t.manifest_sha256,
            "weights_sha256": t.weights_sha256,
            "weights_size": t.weights_size,
            "adapter_config_sha256": t.adapter_config_sha256,
            "base_model_id": t.base_model_id,
            "base_model_commit": t.base_model_commit,
            "lora_rank": t.lora_rank,
            "stage": v.stage,
            "validation_status": "passed",
            "previous_version": v.previous,
            "manifest": manifest,
            "created_at": v.created_at,
            "created_by": "bench",
        }

    @staticmethod
    def _audit_row(name: str, v: SyntheticVersion) -> dict:
        return {
            "at": v.created_at,
            "actor": "bench",
            "action": "register",
            "adapter_name": name,
            "version_id": v.version_id,
            "stage": None,
            "from_value": None,
            "to_value": "staging",
            "reason": None,
            "details": {"weights_sha256": v.weights_sha256},
        }
