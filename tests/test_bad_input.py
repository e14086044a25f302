"""Bad input is refused with a typed error, exit code 2, and changes nothing.

Each case mutates a copy of a real, registrable bundle (or the name, or a limit) and
runs ``loragate register`` in-process. The registry already holds a base and a version,
so "nothing changed" is checked against real content: every row of every table, the
SQLite file bytes, and every file of the artifact store. The cases that break the weights
are ``tests/support/bad_weights.py``'s, those that break the manifest, the adapter config
or their JSON ``tests/support/bad_metadata.py``'s, and the mutations they apply
``tests/support/bundle_mutations.py``'s; the bad names and limits are here.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from loragate.cli.main import main
from loragate.registry.errors import ErrorCode
from tests.support.bad_metadata import METADATA_CASES
from tests.support.bad_weights import WEIGHT_CASES
from tests.support.bundle_mutations import NAME, WEIGHTS, symlink_outside, weights_is_directory
from tests.support.registries import IN_PROCESS, registry_snapshot

# (case id, mutation, name, extra env, expected code, expected field)
CASES = [
    *WEIGHT_CASES,
    *METADATA_CASES,
    # names
    ("name-dotdot", None, "../x", {}, ErrorCode.INVALID_NAME, "name"),
    ("name-double-slash", None, "a//b", {}, ErrorCode.INVALID_NAME, "name"),
    ("name-traversal-segment", None, "acme/../support", {}, ErrorCode.INVALID_NAME, "name"),
    ("name-uppercase", None, "Acme/tiny-llama/support", {}, ErrorCode.INVALID_NAME, "name"),
    ("name-four-segments", None, "acme/tiny-llama/support/v2", {}, ErrorCode.INVALID_NAME, "name"),
    ("name-leading-slash", None, "/acme/tiny-llama", {}, ErrorCode.INVALID_NAME, "name"),
    ("name-base-not-manifest-base", None, "acme/tiny-llama2/support", {}, ErrorCode.MANIFEST_MISMATCH, "base_model_id"),
    # limits and files
    ("weights-over-limit", None, NAME, {"LORAGATE_MAX_WEIGHTS_BYTES": "1000"}, ErrorCode.TOO_LARGE, WEIGHTS),
    ("json-file-over-limit", None, NAME, {"LORAGATE_MAX_JSON_BYTES": "64"}, ErrorCode.TOO_LARGE, "adapter_config.json"),
    ("rank-above-fleet-max", None, NAME, {"LORAGATE_MAX_LORA_RANK": "1"}, ErrorCode.RANK_LIMIT, "lora_rank"),
    ("symlink-escaping-bundle", symlink_outside, NAME, {}, ErrorCode.INVALID_BUNDLE, WEIGHTS),
    ("weights-is-a-directory", weights_is_directory, NAME, {}, ErrorCode.INVALID_BUNDLE, WEIGHTS),
    (
        "missing-adapter-config",
        lambda d: (d / "adapter_config.json").unlink(),
        NAME,
        {},
        ErrorCode.INVALID_BUNDLE,
        "adapter_config.json",
    ),
    ("missing-bundle-dir", lambda d: shutil.rmtree(d), NAME, {}, ErrorCode.INVALID_BUNDLE, "bundle"),
]


# -- the registry under test and its snapshot ----------------------------------------


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def populated(request, tmp_path_factory, tiny_base, random_bundle, seeded_bundles):
    from loragate.registry.service import Registry
    from loragate.registry.settings import Settings

    root = tmp_path_factory.mktemp(f"bad-input-{request.param}")
    url = f"sqlite:///{root / 'registry.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_template")()
    settings = Settings(home=root, database_url=url, artifacts=str(root / "artifacts"), actor="tester")
    registry = Registry.open(settings, check_schema=False, principal=IN_PROCESS)
    registry.init()
    registry.add_base(str(tiny_base), "tiny-llama")
    registry.register_adapter(seeded_bundles[0], NAME)
    trainer = registry.create_token("training", "trainer")[1]
    registry.close()
    env = {
        "LORAGATE_DATABASE_URL": url,
        "LORAGATE_ARTIFACTS": str(root / "artifacts"),
        "LORAGATE_ACTOR": "tester",
        "LORAGATE_TOKEN": trainer,
    }
    return settings, env


def snapshot(settings) -> dict:
    return registry_snapshot(settings)


@pytest.mark.parametrize("case_id, mutate, name, extra_env, code, field", CASES, ids=[c[0] for c in CASES])
def test_bad_register_exits_2_with_typed_error_and_changes_nothing(
    populated, random_bundle, tmp_path, monkeypatch, capsys, case_id, mutate, name, extra_env, code, field
):
    settings, env = populated
    bundle = tmp_path / "bundle"
    shutil.copytree(random_bundle, bundle)
    if mutate is not None:
        mutate(bundle)
    for k, v in {**env, **extra_env}.items():
        monkeypatch.setenv(k, v)
    before = snapshot(settings)

    rc = main(["register", str(bundle), "--name", name, "--json"])

    out, err = capsys.readouterr()
    assert rc == 2
    error = json.loads(out)["error"]
    assert error["code"] == code.value
    assert error["field"] == field
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {code.value} [{field}]: ")
    assert snapshot(settings) == before


def test_the_unmutated_bundle_registers(populated, random_bundle, monkeypatch, capsys):
    """The fixture every bad case mutates is itself good: the failures above are real."""
    settings, env = populated
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    rc = main(["register", str(random_bundle), "--name", "control/tiny-llama/support", "--json"])
    assert rc == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["created"] is True


def test_there_are_at_least_thirty_cases():
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", ["adapter_model.safetensors", "adapter_config.json", "manifest.json"])
def test_a_fifo_in_a_bundle_is_refused_without_blocking(populated, random_bundle, tmp_path, name):
    """Opening a FIFO for reading waits for a writer forever: the CLI must not."""
    import subprocess
    import sys

    settings, env = populated
    bundle = tmp_path / "bundle"
    shutil.copytree(random_bundle, bundle)
    (bundle / name).unlink()
    os.mkfifo(bundle / name)
    before = snapshot(settings)
    proc = subprocess.run(
        [sys.executable, "-m", "loragate.cli.main", "register", str(bundle), "--name", NAME, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert proc.returncode == 2, proc.stderr
    assert json.loads(proc.stdout)["error"]["field"] == name
    assert "FIFO" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert snapshot(settings) == before


def test_a_fifo_as_golden_set_is_refused_without_blocking(populated, tmp_path):
    import subprocess
    import sys

    settings, env = populated
    fifo = tmp_path / "golden.jsonl"
    os.mkfifo(fifo)
    proc = subprocess.run(
        [sys.executable, "-m", "loragate.cli.main", "golden", "set", NAME, str(fifo), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["code"] == "invalid_golden_set"
