"""The peer side of the registry benchmark: MLflow's model registry on Postgres.

Runs inside ``.venv-mlflow`` (MLflow's pins clash with the project's) as
``python -m bench.mlflow_peer`` from the repository root, started by ``bench.registry`` with
the URL of an empty database that the caller creates and drops. It imports nothing of the
project but ``bench`` itself and ``bench.timing``, both standard library only.
It talks to Postgres through ``MlflowClient`` directly, with no tracking server, and
prints one JSON object to stdout (progress goes to stderr).

Shape, mirroring loragate's: registered models of 10 versions, a ``production`` alias on
each. The versions of the first ``--register-models`` models go through
``MlflowClient.create_model_version`` (timed: metadata only, MLflow neither hashes nor
checks an artifact). The rest are bulk-inserted into MLflow's own ``registered_models``,
``model_versions`` and ``registered_model_aliases`` tables, each row copied from one the
client wrote, because creating 100k versions through the client takes too long.

Measured at every size: ``get_model_version_by_alias(name, "production")`` on random
models, and ``set_registered_model_alias(name, "canary", v)`` alternating each model's
alias between its two newest versions.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import mlflow
import sqlalchemy as sa
from mlflow import MlflowClient

from bench.timing import measure, summarize

VERSIONS_PER_MODEL = 10
PRODUCTION = 8  # 1-based version numbers: 8 is production, 9 and 10 take turns as canary
CANDIDATES = (9, 10)


def log(message: str) -> None:
    print(f"[mlflow] {message}", file=sys.stderr, flush=True)


def model_name(index: int) -> str:
    # MLflow names may not contain "/": loragate's tenant/base/task with dots instead
    return f"tenant{index:05d}.tiny-llama.support"


class Population:
    """MLflow's registry filled model by model, through the client or straight into its tables."""

    def __init__(self, url: str, client: MlflowClient):
        self.client = client
        self.engine = sa.create_engine(url)
        tables = sa.MetaData()
        tables.reflect(self.engine, only=["registered_models", "model_versions", "registered_model_aliases"])
        self.models = tables.tables["registered_models"]
        self.versions = tables.tables["model_versions"]
        self.aliases = tables.tables["registered_model_aliases"]
        self.names: list[str] = []

    def register_through_client(self, models: int) -> dict:
        """Create ``models`` models of full shape with the client, timing each create_model_version."""
        timings = []
        started = time.perf_counter_ns()
        for _ in range(models):
            name = model_name(len(self.names))
            self.client.create_registered_model(name)
            self.names.append(name)
            for number in range(1, VERSIONS_PER_MODEL + 1):
                t0 = time.perf_counter_ns()
                self.client.create_model_version(name, source=f"s3://bench/{name}/{number}")
                timings.append(time.perf_counter_ns() - t0)
            self.client.set_registered_model_alias(name, "production", str(PRODUCTION))
        return {
            "versions": len(timings),
            "create_model_version_per_s": round(len(timings) / (sum(timings) / 1e9), 1),
            "create_model_version_latency": summarize(timings),
            "wall_s": round((time.perf_counter_ns() - started) / 1e9, 2),
        }

    def count(self) -> int:
        with self.engine.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(self.versions)).scalar_one()

    def fill_to(self, total: int, chunk: int = 1000) -> None:
        """Bulk-insert whole models until ``total`` versions exist."""
        with self.engine.connect() as conn:
            model_row = dict(conn.execute(sa.select(self.models).limit(1)).mappings().one())
            version_row = dict(conn.execute(sa.select(self.versions).limit(1)).mappings().one())
            alias_row = dict(conn.execute(sa.select(self.aliases).limit(1)).mappings().one())
        missing = -(-(total - self.count()) // VERSIONS_PER_MODEL)  # whole models, rounding up
        now_ms = int(time.time() * 1000)
        while missing > 0:
            batch = [model_name(len(self.names) + i) for i in range(min(chunk, missing))]
            with self.engine.begin() as conn:
                conn.execute(
                    self.models.insert(),
                    [{**model_row, "name": n, "creation_time": now_ms, "last_updated_time": now_ms} for n in batch],
                )
                conn.execute(
                    self.versions.insert(),
                    [
                        {
                            **version_row,
                            "name": n,
                            "version": v,
                            "source": f"s3://bench/{n}/{v}",
                            "storage_location": f"s3://bench/{n}/{v}",
                            "creation_time": now_ms,
                            "last_updated_time": now_ms,
                        }
                        for n in batch
                        for v in range(1, VERSIONS_PER_MODEL + 1)
                    ],
                )
                conn.execute(
                    self.aliases.insert(),
                    [{**alias_row, "name": n, "alias": "production", "version": PRODUCTION} for n in batch],
                )
            self.names.extend(batch)
            missing -= len(batch)
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("VACUUM ANALYZE"))  # as autovacuum would after such a load


def measure_at_size(
    client: MlflowClient, names: list[str], samples: int, move_samples: int, warmup: int, seed: int
) -> dict:
    rng = random.Random(seed)
    lookup = measure(client.get_model_version_by_alias, lambda: (rng.choice(names), "production"), samples, warmup)
    canary: dict[str, int] = {}

    def next_move() -> tuple:
        name = rng.choice(names)
        target = CANDIDATES[1] if canary.get(name) == CANDIDATES[0] else CANDIDATES[0]
        canary[name] = target
        return name, "canary", str(target)

    move = measure(client.set_registered_model_alias, next_move, move_samples, warmup)
    for name in rng.sample(sorted(canary), min(20, len(canary))):
        assert int(client.get_model_version_by_alias(name, "canary").version) == canary[name]
    return {"models": len(names), "get_model_version_by_alias": lookup, "set_registered_model_alias": move}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="SQLAlchemy URL of an empty Postgres database")
    parser.add_argument("--sizes", required=True, help="comma-separated version counts, ascending")
    parser.add_argument(
        "--register-models", type=int, required=True, help="models whose versions are created through the client"
    )
    parser.add_argument("--samples", type=int, required=True)
    parser.add_argument("--move-samples", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    log(f"MLflow {mlflow.__version__}: creating its schema")
    client = MlflowClient(tracking_uri=args.url, registry_uri=args.url)
    client.search_registered_models(max_results=1)  # the store migrates an empty database on first use
    population = Population(args.url, client)
    log(f"creating {args.register_models} x {VERSIONS_PER_MODEL} versions through MlflowClient")
    result = {
        "mlflow_version": mlflow.__version__,
        "register": population.register_through_client(args.register_models),
        "sizes": {},
    }
    for size in map(int, args.sizes.split(",")):
        log(f"bulk-inserting up to {size} versions")
        started = time.perf_counter()
        population.fill_to(size)
        count = population.count()
        log(f"  {count} versions in {time.perf_counter() - started:.1f}s; measuring")
        result["sizes"][str(size)] = {
            "versions": count,
            **measure_at_size(client, population.names, args.samples, args.move_samples, args.warmup, args.seed),
        }
    population.engine.dispose()
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
