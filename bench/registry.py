"""Registry benchmark: loragate's SQL store against a directory of JSON manifests and MLflow.

Run from the repository root::

    .venv/bin/python -m bench.registry            # 10k and 100k versions, several minutes
    .venv/bin/python -m bench.registry --quick    # 1k and 5k versions, a sanity check
    .venv/bin/python -m bench.registry --scale smoke --peers auto   # seconds: does it still run (make test)

Everything runs one thing at a time (the machine has two cores), in one process except
the MLflow peer:

1. loragate on Postgres (a fresh database, dropped at the end) and on SQLite (a temp file):

   * register throughput through the real path, ``Registry.register_adapter``: distinct
     bundles (one random adapter whose weights are rescaled a little per copy, so every
     weights file is a new version), then the same bundles again (the idempotent path);
   * resolve latency: ``store.resolve(name, "production")`` and ``Registry.resolve_stage``
     (which adds name and stage parsing) on random adapters;
   * pointer-move latency: ``Registry.pointer_move(version, "canary", switch=NO_REPLICAS)``
     (the move with the switch of a registry with no replicas: nothing to switch), each random
     adapter's canary alternating between its two validated versions.

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

3. MLflow's model registry, the peer: ``bench.mlflow_peer`` runs in ``.venv-mlflow``
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
import gc
import inspect
import json
import os
import platform
import random
import sqlite3
import subprocess
import tempfile
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import sqlalchemy
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from bench.registry_against import compare_with_revision
from bench.registry_code import CODE, code_module
from bench.registry_peers import MLFLOW_VENV, PG_ADMIN_URL, bench_mlflow, bench_naive, fresh_postgres_database
from bench.registry_population import (
    BASE_ID,
    FULL,
    SCALES,
    SEED,
    VERSIONS_PER_ADAPTER,
    BulkAdapters,
    Fleet,
    Scale,
    log,
)
from bench.timing import measure, summarize

# the code under test (this tree's, or with --against an earlier revision's: bench/registry_code.py);
# the second name of each: a revision from before the registry's rooms (sub-packages)
Registry = code_module("service").Registry
SqlStore = code_module("db.store", "store").SqlStore
make_engine = code_module("db.database", "store").make_engine
Settings = code_module("settings").Settings
# the move's seam for a registry with no replicas; None on a revision from before the move
# took its switch
NO_REPLICAS = getattr(code_module("service.lifecycle", "service"), "NO_REPLICAS", None)

BENCH = Path(__file__).resolve().parent
OUT = BENCH / "out"

RESOLVE_TARGET_MS = 1.0
MOVE_TARGET_MS = 3.0
FLAT_RATIO = 1.5


# -- bundles for the real register path -------------------------------------------------


def make_bundles(root: Path, count: int) -> tuple[Path, list[Path]]:
    """A tiny base and ``count`` registrable bundles that differ only in their weights."""
    from kit.basekit import build_base
    from kit.corpus import copy_bundle, edit_tensors
    from kit.modelkit import random_adapter

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

    def promote(version_id: str, to: str) -> object:
        """The store's pointer move with no replicas to switch (``NO_REPLICAS``); a revision
        from before the move took its switch opens it bare, one from before the move became
        a context manager only has ``Registry.promote``."""
        if not hasattr(registry, "pointer_move"):
            return registry.promote(version_id, to)
        if NO_REPLICAS is None:
            with registry.pointer_move(version_id, to) as move:
                return move.plan
        with registry.pointer_move(version_id, to, switch=NO_REPLICAS) as move:
            return move.plan

    result = {
        "store_resolve": measure(pointers.resolve, production, scale.samples, scale.warmup),
        "registry_resolve_stage": measure(registry.resolve_stage, production, scale.samples, scale.warmup),
        "promote_canary": measure(promote, canary_move, scale.move_samples, scale.warmup),
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
    Principal = code_module("rules.access", "access").Principal  # the second: before the registry's rooms
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
    "Registry.pointer_move(version, 'canary') on a version that passed validation, retiring the previous canary, "
    "audited",
    "latencies: time.perf_counter_ns around each call, after untimed warm-up calls, one caller, no concurrency; "
    "other processes on the machine (see load averages) can inflate the tails; "
    "loragate.postgres.sizes.*.postgres_floor is a bare psycopg SELECT 1 and a bare INSERT+COMMIT on the same "
    "server right after, the floor under any registry",
    "naive layout: the same shape as files; per-adapter directory scan (10 manifests per resolve), so its cost does "
    "not grow with the registry; writes are not fsynced and the two-file pointer move is not atomic as a pair",
    "MLflow: MlflowClient straight against Postgres (no tracking server); its first versions go through "
    "create_model_version, the rest are bulk-inserted into its own tables, copied from rows it wrote",
]


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
