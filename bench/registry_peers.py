"""The registry benchmark's peers (``bench/registry.py``): the seed's stage-1 layout, a
JSON manifest file per version, and MLflow's model registry in a venv of its own, each
measured at the same sizes as loragate."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from bench.registry_population import SEED, VERSIONS_PER_ADAPTER, Fleet, Scale, log
from bench.timing import measure

BENCH = Path(__file__).resolve().parent
MLFLOW_VENV = BENCH.parent / ".venv-mlflow"
PG_ADMIN_URL = os.environ.get("LORAGATE_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


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
            "-m",
            "bench.mlflow_peer",
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
        # from the repository root, where ``bench`` imports (its package and bench.timing are stdlib only)
        peer = subprocess.run(command, cwd=BENCH.parent, stdout=subprocess.PIPE, text=True)
    if peer.returncode != 0:
        return {
            "available": False,
            "reason": f"bench.mlflow_peer exited with {peer.returncode}; its stderr is in the log",
        }
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
