"""Registry benchmark: loragate's SQL store against a directory of JSON manifests and MLflow.

Run from the repository root::

    .venv/bin/python bench/registry.py            # 10k and 100k versions, several minutes
    .venv/bin/python bench/registry.py --quick    # 1k and 5k versions, a sanity check
    .venv/bin/python bench/registry.py --scale smoke --peers auto   # seconds: does it still run (make test)

Everything runs one thing at a time (the machine has two cores), in one process except
the MLflow peer:

1. loragate on Postgres (a fresh database, dropped at the end) and on SQLite (a temp file):

   * register throughput through the real path, ``Registry.register_adapter``: distinct
     bundles (one random adapter whose weights are rescaled a little per copy, so every
     weights file is a new version), then the same bundles again (the idempotent path);
   * resolve latency: ``store.resolve(name, "production")`` and ``Registry.resolve_stage``
     (which adds name and stage parsing) on random adapters;
   * pointer-move latency: ``Registry.promote(version, "canary")``, each random adapter's
     canary alternating between its two validated versions.

   Latencies are taken at each registry size. To get there quickly, whole adapters are
   bulk-inserted with SQLAlchemy Core into the tables the Alembic migrations created,
   bypassing register (whose throughput is measured on its own, above): 10 versions per
   adapter, the 7th is the ``previous`` pointer, the 8th ``production``, the 9th and 10th
   are in staging with validation passed; one register audit event per version.

2. The naive layout of the seed's stage 1: one JSON manifest per version at
   ``<namespace>/<task>/<version>.json`` holding its ``stage``. Resolving reads every
   manifest in the adapter's directory and picks the production one; a pointer move reads
   them too and rewrites the old and the new canary's files (each atomically by rename,
   the pair not). Same shape and sizes.

3. MLflow's model registry, the peer: ``bench/mlflow_peer.py`` runs in ``.venv-mlflow``
   (created from ``bench/requirements-mlflow.txt`` when missing) against its own fresh
   Postgres database and measures ``get_model_version_by_alias`` and
   ``set_registered_model_alias`` at the same sizes.

The JSON result goes to stdout and to ``bench/out/registry.json`` (``registry-quick.json``
with ``--quick``); progress goes to stderr. Targets for loragate: resolve p99 < 1 ms,
pointer move p99 < 3 ms, and each p99 at the largest size at most 1.5x its value at the
smallest ("roughly flat").
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import inspect
import json
import os
import platform
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
# The code under test: this tree, or (--against) an earlier revision's checkout driven by
# this same harness, so both sides are measured the same way.
CODE = Path(os.environ.get("LORAGATE_BENCH_CODE", ROOT)).resolve()
# Python puts this script's directory first on sys.path, where this file's name would
# shadow the registry package: look from the code's root instead (then this tree's, for bench/).
sys.path[0:1] = [str(CODE), str(ROOT)]
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model kit builds everything locally
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import psycopg  # noqa: E402
import sqlalchemy  # noqa: E402
from sqlalchemy import create_engine, func, insert, select, text  # noqa: E402
from sqlalchemy.engine import Engine, make_url  # noqa: E402

from bench.timing import measure, summarize  # noqa: E402
from registry.service import Registry  # noqa: E402

try:
    from registry.db.database import make_engine
    from registry.db.schema import adapter_versions, adapters, audit_events, stage_pointers
    from registry.db.store import SqlStore
    from registry.records.adapters import AdapterVersion
except ImportError:  # an --against revision from before the registry's rooms (sub-packages)
    from registry.domain import AdapterVersion  # type: ignore[no-redef]
    from registry.schema import adapter_versions, adapters, audit_events, stage_pointers  # type: ignore[no-redef]
    from registry.store import SqlStore, make_engine  # type: ignore[no-redef]
from registry.settings import Settings  # noqa: E402

OUT = BENCH / "out"
MLFLOW_VENV = ROOT / ".venv-mlflow"
PG_ADMIN_URL = os.environ.get("LORAGATE_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")

BASE_ID = "tiny-llama"
VERSIONS_PER_ADAPTER = 10
PREVIOUS, PRODUCTION, CANDIDATES = 6, 7, (8, 9)  # 0-based positions within an adapter
EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
SEED = 20261121

RESOLVE_TARGET_MS = 1.0
MOVE_TARGET_MS = 3.0
FLAT_RATIO = 1.5


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


# -- bundles for the real register path -------------------------------------------------


def make_bundles(root: Path, count: int) -> tuple[Path, list[Path]]:
    """A tiny base and ``count`` registrable bundles that differ only in their weights."""
    from infra.corpus import copy_bundle, edit_tensors
    from infra.modelkit import build_base, random_adapter

    base = build_base(root / BASE_ID)
    original = random_adapter(base, root / "adapter")
    bundles = []
    for i in range(count):
        dest = copy_bundle(original, root / f"bundle-{i:04d}")
        factor = 1.0 + (i + 1) * 1e-4  # finite, B stays non-zero, every file hashes differently
        edit_tensors(dest, lambda sd, factor=factor: {key: tensor * factor for key, tensor in sd.items()})
        bundles.append(dest)
    return base, bundles


def time_registrations(registry: Registry, bundles: list[Path], names: list[str], expect_created: bool) -> dict:
    timings = []
    for bundle, name in zip(bundles, names, strict=False):
        start = time.perf_counter_ns()
        result = registry.register_adapter(bundle, name)
        timings.append(time.perf_counter_ns() - start)
        if result.created != expect_created:
            raise RuntimeError(
                f"register of {bundle} under {name}: created={result.created}, expected {expect_created}"
            )
    return {"per_s": round(len(timings) / (sum(timings) / 1e9), 1), "latency": summarize(timings)}


def measure_register(registry: Registry, bundles: list[Path]) -> dict:
    """Throughput of new versions, then of the same bundles again; the first bundle warms up."""
    registry.register_adapter(bundles[0], f"warmup/{BASE_ID}/support")
    timed = bundles[1:]
    names = [f"register{i // VERSIONS_PER_ADAPTER:04d}/{BASE_ID}/support" for i in range(len(timed))]
    return {
        "bundles": len(timed),
        "new_version": time_registrations(registry, timed, names, expect_created=True),
        "identical_bundle_again": time_registrations(registry, timed, names, expect_created=False),
    }


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


# -- loragate ---------------------------------------------------------------------------


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


def postgres_floor(url: str, scale: Scale) -> dict:
    """What the server and the machine allow right now: a bare round trip and a bare durable
    commit through psycopg, no SQLAlchemy; other load on the machine shows up here first."""
    plain = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_floor (at timestamptz NOT NULL)")
        return {
            "select_1": measure(lambda: conn.execute("SELECT 1").fetchone(), tuple, scale.samples, scale.warmup),
            "insert_commit": measure(
                lambda: conn.execute("INSERT INTO bench_floor VALUES (now())"), tuple, scale.move_samples, scale.warmup
            ),
        }


def measure_loragate_at_size(
    registry: Registry, store: SqlStore, fleet: Fleet, scale: Scale, rng: random.Random
) -> dict:
    # the store's resolve: a repository of its own since the registry's rooms
    pointers = getattr(store, "pointers", store)

    def production() -> tuple:
        return rng.choice(fleet.names), "production"

    def canary_move() -> tuple:
        return fleet.next_canary(rng)[1], "canary"

    result = {
        "store_resolve": measure(pointers.resolve, production, scale.samples, scale.warmup),
        "registry_resolve_stage": measure(registry.resolve_stage, production, scale.samples, scale.warmup),
        "promote_canary": measure(registry.promote, canary_move, scale.move_samples, scale.warmup),
    }
    for name in rng.sample(sorted(fleet.canary), min(50, len(fleet.canary))):
        if (pointers.resolve(name, "production"), pointers.resolve(name, "canary")) != (
            fleet.production[name],
            fleet.canary[name],
        ):
            raise RuntimeError(f"pointers of {name} are not where the benchmark moved them")
    return result


def _open_in_process(settings: Settings) -> Registry:
    """The registry with every role, like any caller holding the database; the baseline side
    of a comparison may run code from before roles existed."""
    if "principal" not in inspect.signature(Registry.open).parameters:
        return Registry.open(settings, check_schema=False)
    try:
        from registry.rules.access import Principal
    except ImportError:  # before the registry's rooms
        from registry.access import Principal  # type: ignore[no-redef]

    return Registry.open(settings, check_schema=False, principal=Principal.in_process("bench"))


def bench_loragate(url: str, home: Path, base: Path, bundles: list[Path], scale: Scale) -> tuple[dict, dict]:
    """Register, then fill to each size and measure; returns the result and a registered manifest."""
    settings = Settings(home=home, database_url=url, artifacts=str(home / "artifacts"), actor="bench")
    registry = _open_in_process(settings)
    # the hot path of serving is the store's one-query resolve: timed on its own, beside Registry's
    store = SqlStore.from_url(settings.database)
    engine = make_engine(settings.database)
    try:
        registry.init()
        registry.add_base(str(base), BASE_ID)
        log(f"  registering {len(bundles) - 1} distinct bundles, then the same again")
        result = {"register": measure_register(registry, bundles), "sizes": {}}
        sample = registry.list_versions(f"warmup/{BASE_ID}/support")[0]
        population = BulkAdapters(engine, sample)
        rng = random.Random(SEED)
        for size in scale.sizes:
            started = time.perf_counter()
            population.fill_to(size)
            count = population.count()
            log(f"  {count} versions after {time.perf_counter() - started:.1f}s of bulk insert; measuring")
            measured = measure_loragate_at_size(registry, store, population.fleet, scale, rng)
            if engine.dialect.name == "postgresql":
                measured["postgres_floor"] = postgres_floor(url, scale)
                floor = measured["postgres_floor"]["insert_commit"]["p99_ms"]
                log(f"  bare INSERT+COMMIT p99 {floor} ms on the same server")
            resolve_p99, move_p99 = measured["store_resolve"]["p99_ms"], measured["promote_canary"]["p99_ms"]
            log(f"  resolve p99 {resolve_p99} ms, promote p99 {move_p99} ms")
            result["sizes"][str(size)] = {"versions": count, "bulk_adapters": len(population.fleet.names), **measured}
        return result, sample.manifest
    finally:
        registry.close()
        store.close()
        engine.dispose()


# -- the naive layout -------------------------------------------------------------------


class ManifestDirectory:
    """The seed's stage-1 layout: one JSON manifest per version, its stage written inside."""

    def __init__(self, root: Path, template: dict):
        self.root = root
        self.template = template
        self.fleet = Fleet()

    def _dir(self, name: str) -> Path:
        namespace, _, task = name.split("/")
        return self.root / namespace / task

    def fill_to(self, total_versions: int) -> None:
        while self.fleet.version_count < total_versions:
            name, versions = self.fleet.add()
            directory = self._dir(name)
            directory.mkdir(parents=True)
            for v in versions:
                manifest = {
                    **self.template,
                    "adapter_version": v.version_id,
                    "previous_version": v.previous,
                    "weights_sha256": v.weights_sha256,
                    "validation_status": "passed",
                    "stage": v.stage,
                }
                (directory / f"{v.version_id}.json").write_text(json.dumps(manifest))

    def _manifests(self, name: str) -> Iterator[tuple[Path, dict]]:
        for entry in os.scandir(self._dir(name)):
            with open(entry.path, "rb") as f:
                yield Path(entry.path), json.load(f)

    def resolve(self, name: str, stage: str) -> str | None:
        found = None
        for _, manifest in self._manifests(name):
            if manifest["stage"] == stage:
                found = manifest["adapter_version"]
        return found

    def promote(self, name: str, version_id: str, stage: str) -> None:
        changed = []
        for path, manifest in self._manifests(name):
            if manifest["adapter_version"] == version_id:
                if manifest["validation_status"] != "passed":
                    raise ValueError(f"{version_id} has not passed validation")
                changed.append((path, {**manifest, "stage": stage}))
            elif manifest["stage"] == stage:
                changed.append((path, {**manifest, "stage": "retired"}))
        for path, manifest in changed:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(manifest))
            os.replace(tmp, path)


def bench_naive(root: Path, template: dict, scale: Scale) -> dict:
    files = ManifestDirectory(root, template)
    rng = random.Random(SEED)
    result = {}
    for size in scale.sizes:
        started = time.perf_counter()
        files.fill_to(size)
        log(f"  {files.fleet.version_count} manifest files after {time.perf_counter() - started:.1f}s; measuring")

        def production() -> tuple:
            return rng.choice(files.fleet.names), "production"

        def canary_move() -> tuple:
            return *files.fleet.next_canary(rng), "canary"

        result[str(size)] = {
            "versions": files.fleet.version_count,
            "resolve": measure(files.resolve, production, scale.samples, scale.warmup),
            "pointer_move": measure(files.promote, canary_move, scale.move_samples, scale.warmup),
        }
    for name in rng.sample(sorted(files.fleet.canary), min(50, len(files.fleet.canary))):
        if files.resolve(name, "canary") != files.fleet.canary[name]:
            raise RuntimeError(f"canary manifest of {name} is not where the benchmark moved it")
    return result


# -- MLflow -----------------------------------------------------------------------------


def ensure_mlflow_venv() -> Path:
    python = MLFLOW_VENV / "bin" / "python"
    if not python.exists():
        log("creating .venv-mlflow")
        subprocess.run(["python3", "-m", "venv", str(MLFLOW_VENV)], check=True, stdout=sys.stderr)
    if subprocess.run([str(python), "-c", "import mlflow, psycopg2"], capture_output=True).returncode != 0:
        log("installing bench/requirements-mlflow.txt into .venv-mlflow")
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "-r", str(BENCH / "requirements-mlflow.txt")],
            check=True,
            stdout=sys.stderr,
        )
    return python


def bench_mlflow(scale: Scale) -> dict:
    try:
        python = ensure_mlflow_venv()
    except (OSError, subprocess.CalledProcessError) as e:
        return {"available": False, "reason": f"could not set up .venv-mlflow: {e}"}
    with fresh_postgres_database("mlflow_bench") as url:
        command = [
            str(python),
            str(BENCH / "mlflow_peer.py"),
            "--url",
            make_url(url).set(drivername="postgresql+psycopg2").render_as_string(hide_password=False),
            "--sizes",
            ",".join(map(str, scale.mlflow_sizes)),
            "--register-models",
            str(scale.register_bundles // VERSIONS_PER_ADAPTER),
            "--samples",
            str(scale.samples),
            "--move-samples",
            str(scale.move_samples),
            "--warmup",
            str(scale.warmup),
            "--seed",
            str(SEED),
        ]
        peer = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if peer.returncode != 0:
        return {"available": False, "reason": f"mlflow_peer.py exited with {peer.returncode}; its stderr is in the log"}
    return {"available": True, **json.loads(peer.stdout)}


# -- plumbing ---------------------------------------------------------------------------


@contextlib.contextmanager
def fresh_postgres_database(prefix: str) -> Iterator[str]:
    """A new, empty database for the duration of the block; dropped even on failure."""
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def _commit_of(root: Path) -> str | None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


def environment() -> dict:
    admin = create_engine(PG_ADMIN_URL)
    try:
        with admin.connect() as conn:
            pg = {
                key: conn.execute(text(f"SHOW {key}")).scalar()
                for key in ("server_version", "synchronous_commit", "fsync", "shared_buffers")
            }
    finally:
        admin.dispose()
    return {
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "sqlalchemy": sqlalchemy.__version__,
        "psycopg": psycopg.__version__,
        "sqlite": sqlite3.sqlite_version,
        "postgres": pg,
    }


def judge(loragate: dict) -> dict:
    verdicts = {}
    for backend, result in loragate.items():
        sizes = list(result["sizes"])
        resolve = [result["sizes"][s]["store_resolve"]["p99_ms"] for s in sizes]
        move = [result["sizes"][s]["promote_canary"]["p99_ms"] for s in sizes]
        verdicts[backend] = {
            "resolve_p50_ms": {s: result["sizes"][s]["store_resolve"]["p50_ms"] for s in sizes},
            "resolve_p99_ms": dict(zip(sizes, resolve, strict=False)),
            "pointer_move_p50_ms": {s: result["sizes"][s]["promote_canary"]["p50_ms"] for s in sizes},
            "pointer_move_p99_ms": dict(zip(sizes, move, strict=False)),
            f"resolve_p99_under_{RESOLVE_TARGET_MS:g}ms": max(resolve) < RESOLVE_TARGET_MS,
            f"pointer_move_p99_under_{MOVE_TARGET_MS:g}ms": max(move) < MOVE_TARGET_MS,
            "resolve_p99_growth": round(resolve[-1] / resolve[0], 2),
            "pointer_move_p99_growth": round(move[-1] / move[0], 2),
            "resolve_flat": resolve[-1] <= FLAT_RATIO * resolve[0],
            "pointer_move_flat": move[-1] <= FLAT_RATIO * move[0],
        }
    return verdicts


NOTES = [
    "register throughput goes through Registry.register_adapter (bundle snapshot, hashing, manifest and weights "
    "checks, content-addressed blob store in a local directory, one transaction), one call at a time, on the "
    "registry before bulk population",
    "bulk population bypasses register: adapters, versions, stage pointers and one audit event per version are "
    "inserted with SQLAlchemy Core into the Alembic-created tables; Postgres gets VACUUM ANALYZE after each load, "
    "as autovacuum would",
    "resolve and pointer-move samples pick adapters uniformly at random among the bulk adapters; the pointer move is "
    "Registry.promote(version, 'canary') on a version that passed validation, retiring the previous canary, audited",
    "latencies: time.perf_counter_ns around each call, after untimed warm-up calls, one caller, no concurrency; "
    "other processes on the machine (see load averages) can inflate the tails; "
    "loragate.postgres.sizes.*.postgres_floor is a bare psycopg SELECT 1 and a bare INSERT+COMMIT on the same "
    "server right after, the floor under any registry",
    "naive layout: the same shape as files; per-adapter directory scan (10 manifests per resolve), so its cost does "
    "not grow with the registry; writes are not fsynced and the two-file pointer move is not atomic as a pair",
    "MLflow: MlflowClient straight against Postgres (no tracking server); its first versions go through "
    "create_model_version, the rest are bulk-inserted into its own tables, copied from rows it wrote",
]


# -- the same benchmark against an earlier revision of the code ---------------------------

COMPARED = {
    "register_new_per_s": (lambda r: r["register"]["new_version"]["per_s"], "higher"),
    "register_again_per_s": (lambda r: r["register"]["identical_bundle_again"]["per_s"], "higher"),
}
COMPARED_AT_SIZE = {
    "resolve_p50_ms": (lambda s: s["store_resolve"]["p50_ms"], "lower"),
    "resolve_p99_ms": (lambda s: s["store_resolve"]["p99_ms"], "lower"),
    "move_p50_ms": (lambda s: s["promote_canary"]["p50_ms"], "lower"),
    "move_p99_ms": (lambda s: s["promote_canary"]["p99_ms"], "lower"),
}
COMPARE_TOLERANCE = 0.10


def _run_side(code: Path, scale_name: str, out: Path) -> dict:
    subprocess.run(
        [sys.executable, str(BENCH / "registry.py"), "--scale", scale_name, "--peers", "none", "--out", str(out)],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "LORAGATE_BENCH_CODE": str(code)},
    )
    return json.loads(out.read_text())["loragate"]


def _figures(runs: list[dict]) -> dict:
    """Median over rounds of every compared figure, by backend (and size)."""
    import statistics

    figures: dict = {}
    for backend in runs[0]:
        for key, (get, _) in COMPARED.items():
            figures[f"{backend}.{key}"] = statistics.median(get(r[backend]) for r in runs)
        for size in runs[0][backend]["sizes"]:
            for key, (get, _) in COMPARED_AT_SIZE.items():
                figures[f"{backend}.{size}.{key}"] = statistics.median(get(r[backend]["sizes"][size]) for r in runs)
    return figures


def compare_with_revision(revision: str, scale_name: str, rounds: int, out: Path | None) -> None:
    """Run this tree's loragate benchmark and REV's, alternating, and report the ratios.

    Both sides are ``--peers none`` runs of this harness on the same machine, databases and
    Python environment, one importing this tree's code, the other REV's (checked out in a
    temporary worktree); rounds alternate which side runs first.
    A figure is within tolerance when it is at most 10 % worse than REV's (median of rounds).
    """
    started = time.perf_counter()
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{revision}^{{commit}}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="loragate-bench-against-") as tmp:
        worktree = Path(tmp) / "before"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(worktree), commit], cwd=ROOT, check=True, capture_output=True
        )
        try:
            before, after = [], []
            sides = [("before", worktree, before), ("after", ROOT, after)]
            for i in range(rounds):
                # ABBA: neither side always runs first, after the other's database drop and load
                for side, root, runs in sides if i % 2 == 0 else reversed(sides):
                    log(f"round {i + 1}/{rounds}: {side} ({commit[:10] if side == 'before' else 'this tree'})")
                    runs.append(_run_side(root, scale_name, Path(tmp) / f"{side}-{i}.json"))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False)
    was, now = _figures(before), _figures(after)
    ratios = {}
    for key in was:
        direction = (COMPARED | COMPARED_AT_SIZE)[key.rsplit(".", 1)[-1]][1]
        worse = was[key] / now[key] if direction == "higher" else now[key] / was[key]
        ratios[key] = {"before": was[key], "after": now[key], "worse_by": round(worse - 1, 3)}
    result = {
        "benchmark": "loragate registry, this tree against an earlier revision",
        "against": commit,
        "scale": scale_name,
        "rounds": rounds,
        "tolerance": COMPARE_TOLERANCE,
        "figures": ratios,
        "within_tolerance": {k: v["worse_by"] <= COMPARE_TOLERANCE for k, v in ratios.items()},
        "wall_s": round(time.perf_counter() - started, 1),
    }
    target = out or OUT / f"registry-against-{commit[:10]}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result, indent=2) + "\n")
    log(f"done in {result['wall_s']}s; written to {target}")
    print(json.dumps(result, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Benchmark loragate's registry against JSON manifest files and MLflow."
    )
    parser.add_argument("--scale", choices=sorted(SCALES), default="full", help="full (default), quick or smoke")
    parser.add_argument("--quick", action="store_true", help="the same as --scale quick")
    parser.add_argument(
        "--peers",
        choices=["all", "none", "auto"],
        default="all",
        help="naive files and MLflow too (all), loragate only (none), or MLflow only if .venv-mlflow exists (auto)",
    )
    parser.add_argument("--out", type=Path, help="where the JSON goes (default bench/out/registry[-SCALE].json)")
    parser.add_argument(
        "--against",
        metavar="REV",
        help="compare loragate with the code at git revision REV in the same run (alternating, --rounds each)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side with --against (default 3)")
    args = parser.parse_args()
    scale_name = "quick" if args.quick else args.scale
    if args.against:
        compare_with_revision(args.against, scale_name, args.rounds, args.out)
        return
    scale = SCALES[scale_name]
    started = time.perf_counter()
    result = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "scale": asdict(scale),
        "environment": environment(),
        "code_under_test": {"root": str(CODE), "commit": _commit_of(CODE)},
        "targets": {
            "resolve_p99_ms": RESOLVE_TARGET_MS,
            "pointer_move_p99_ms": MOVE_TARGET_MS,
            "flat_p99_max_growth": FLAT_RATIO,
        },
        "notes": NOTES,
        "loragate": {},
    }
    with tempfile.TemporaryDirectory(prefix="loragate-bench-") as tmp:
        work = Path(tmp)
        log(f"building the tiny base and {scale.register_bundles + 1} bundles")
        base, bundles = make_bundles(work / "bundles", scale.register_bundles + 1)
        # the model kit's heap (torch, transformers) is no part of a registry process: keep
        # the collector from re-scanning it during the measurements
        gc.collect()
        gc.freeze()
        log("loragate on Postgres")
        with fresh_postgres_database("loragate_bench") as url:
            result["loragate"]["postgres"], manifest = bench_loragate(url, work / "postgres", base, bundles, scale)
        log("loragate on SQLite")
        sqlite_home = work / "sqlite"
        result["loragate"]["sqlite"], _ = bench_loragate(
            f"sqlite:///{sqlite_home / 'registry.db'}", sqlite_home, base, bundles, scale
        )
        if args.peers != "none":
            log("naive JSON manifest files")
            result["naive_files"] = bench_naive(work / "manifests", manifest, scale)
    if args.peers == "all" or (args.peers == "auto" and (MLFLOW_VENV / "bin" / "python").exists()):
        log("MLflow model registry")
        result["mlflow"] = bench_mlflow(scale)
    result["verdict"] = judge(result["loragate"])
    result["environment"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result["wall_s"] = round(time.perf_counter() - started, 1)

    out = args.out or OUT / ("registry.json" if scale is FULL else f"registry-{scale_name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"done in {result['wall_s']}s; written to {out}")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
