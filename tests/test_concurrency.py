"""Concurrent registers of one adapter: one linear lineage, and nobody fails for being second.

Threads sharing a Registry (SQLite and Postgres) and separate ``loragate register``
processes (Postgres) register distinct bundles under one name at once. Every version must
name a different predecessor, the chain from the first version must reach all of them,
and the stored manifest blobs must say the same as the rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kit.corpus import copy_bundle, edit_tensors

NAME = "acme/tiny-llama/support"


@pytest.fixture(scope="session")
def distinct_bundles(kit, random_bundle) -> list[Path]:
    """32 registrable bundles that differ only in their weights."""
    bundles = []
    for i in range(32):
        dest = copy_bundle(random_bundle, kit / f"distinct-{i:02d}")
        edit_tensors(dest, lambda sd, f=1.0 + (i + 1) * 1e-3: {k: v * f for k, v in sd.items()})
        bundles.append(dest)
    return bundles


def assert_one_linear_chain(registry, name: str, count: int, tmp_path: Path) -> None:
    versions = registry.list_versions(name)
    assert len(versions) == count
    successor = {}
    for v in versions:
        assert v.previous_version not in successor, f"fork: two versions follow {v.previous_version}"
        successor[v.previous_version] = v
    chain, current = [], successor.get(None)
    while current is not None:
        chain.append(current.version_id)
        current = successor.get(current.version_id)
    assert len(chain) == count, "the chain from the first version does not reach every version"
    created = [registry.get_version(v).created_at for v in chain]
    assert created == sorted(created)
    for v in versions:
        # what was written into the stored manifest is the lineage the row holds
        stored = registry.materialize(v.version_id, tmp_path / "lineage" / v.version_id)
        manifest = json.loads((stored / "manifest.json").read_text())
        assert (manifest["adapter_version"], manifest["previous_version"]) == (v.version_id, v.previous_version)


def test_threads_registering_one_adapter_form_one_chain(cataloged, distinct_bundles, tmp_path):
    registry, _ = cataloged
    errors: list[BaseException] = []
    created: list[bool] = []

    def worker(k: int) -> None:
        try:
            for j in range(4):
                created.append(registry.register_adapter(distinct_bundles[k * 4 + j], NAME).created)
        except BaseException as e:  # surfaced by the assert below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and created == [True] * 32
    assert_one_linear_chain(registry, NAME, 32, tmp_path)


def test_the_same_bundle_raced_from_many_threads_is_one_version(cataloged, random_bundle):
    registry, _ = cataloged
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(registry.register_adapter(random_bundle, NAME)))
        for _ in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.version.version_id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert len(registry.list_versions(NAME)) == 1


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_concurrent_cli_registers_all_succeed_in_one_chain(cataloged, distinct_bundles, tmp_path):
    registry, _ = cataloged
    env = {
        **os.environ,
        "LORAGATE_DATABASE_URL": registry.settings.database_url,
        "LORAGATE_ARTIFACTS": registry.settings.artifacts,
        "LORAGATE_ACTOR": "ci",
        "LORAGATE_TOKEN": registry.create_token("training", "trainer")[1],
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "loragate.cli.main", "register", str(b), "--name", NAME, "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for b in distinct_bundles
    ]
    outcomes = [(p.wait(timeout=300), p.stdout.read(), p.stderr.read()) for p in procs]
    failed = [(rc, err.strip()[-300:]) for rc, _, err in outcomes if rc != 0]
    assert failed == []
    assert all(json.loads(out)["created"] for _, out, _ in outcomes)
    assert_one_linear_chain(registry, NAME, len(distinct_bundles), tmp_path)
