"""Crashed writes leave no litter for long: SIGTERM cleans up on the way out, the next write
sweeps what ``kill -9`` left, and ``loragate gc`` reports and removes it -- safely while
others register.

The kills are real: a ``loragate register`` subprocess is held inside its upload by an S3
endpoint that accepts connections and never answers, then sent SIGTERM or SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from kit.http_faults import silent_endpoint
from loragate.registry.digests import digest_of_hex, sha256_bytes
from loragate.registry.storage.scratch import scratch_name
from tests.support.moves import promote
from tests.support.registries import artifact_store, mark_validated

NAME = "acme/tiny-llama/support"


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def ours(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.lstrip(".").startswith("loragate-"))


@pytest.fixture
def silent_s3():
    """An endpoint that accepts and never answers: a register waits inside its upload."""
    with silent_endpoint() as url:
        yield url


@pytest.fixture
def s3_cli(tmp_path, s3_location, s3_endpoint, tiny_base):
    """A registry on S3 and the environment of a CLI that uses it, with its own TMPDIR."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {
        **os.environ,
        "LORAGATE_HOME": str(tmp_path / "home"),
        "LORAGATE_ARTIFACTS": s3_location,
        "LORAGATE_S3_ENDPOINT_URL": s3_endpoint,
        "LORAGATE_ACTOR": "ci",
        "TMPDIR": str(scratch),
    }
    env.pop("LORAGATE_DATABASE_URL", None)
    subprocess.run(
        [sys.executable, "-m", "loragate.cli.main", "init"], env=env, check=True, capture_output=True, timeout=120
    )
    admin = (tmp_path / "home" / "admin.token").read_text().strip()
    subprocess.run(
        [sys.executable, "-m", "loragate.cli.main", "base", "add", str(tiny_base), "--id", "tiny-llama"],
        env={**env, "LORAGATE_TOKEN": admin},
        check=True,
        capture_output=True,
        timeout=120,
    )
    trainer = subprocess.run(
        [sys.executable, "-m", "loragate.cli.main", "token", "create", "--role", "training", "--holder", "trainer"],
        env={**env, "LORAGATE_TOKEN": admin},
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.strip()
    return {**env, "LORAGATE_TOKEN": trainer}, scratch


def start_stuck_register(env: dict, bundle: Path, endpoint: str, scratch: Path) -> subprocess.Popen:
    stuck_env = {**env, "LORAGATE_S3_ENDPOINT_URL": endpoint, "LORAGATE_S3_READ_TIMEOUT_S": "120"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "loragate.cli.main", "register", str(bundle), "--name", NAME],
        env=stuck_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not ours(scratch):  # the snapshot exists: it is inside register, waiting on S3
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "register never took its snapshot"
        time.sleep(0.05)
    time.sleep(0.5)  # past the snapshot, into the upload
    return proc


def test_sigterm_during_a_register_leaves_no_scratch_behind(s3_cli, random_bundle, silent_s3):
    env, scratch = s3_cli
    proc = start_stuck_register(env, random_bundle, silent_s3, scratch)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert ours(scratch) == []


def test_the_next_register_sweeps_what_a_killed_one_left(s3_cli, random_bundle, seeded_bundles, silent_s3):
    env, scratch = s3_cli
    proc = start_stuck_register(env, random_bundle, silent_s3, scratch)
    proc.kill()
    proc.wait(timeout=30)
    left = ours(scratch)
    assert left and all(f"-{proc.pid}-" in name for name in left)  # kill -9: nothing could clean up
    done = subprocess.run(
        [sys.executable, "-m", "loragate.cli.main", "register", str(seeded_bundles[0]), "--name", NAME],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert ours(scratch) == []


def test_a_local_write_sweeps_gone_and_stale_writers_but_not_live_ones(cataloged, random_bundle):
    registry, _ = cataloged
    incoming = Path(registry.settings.artifacts) / "incoming"
    gone = incoming / f"{scratch_name('incoming').replace(f'-{os.getpid()}-', f'-{dead_pid()}-')}x1"
    stale = incoming / f"{scratch_name('incoming')}x2"
    live = incoming / f"{scratch_name('incoming')}x3"
    for path in (gone, stale, live):
        path.write_bytes(b"half a blob")
    old = time.time() - registry.settings.litter_age_s - 60
    os.utime(stale, (old, old))
    registry.register_adapter(random_bundle, NAME)
    assert sorted(p.name for p in incoming.iterdir()) == [live.name]


@pytest.fixture
def litter(cataloged, random_bundle, monkeypatch, tmp_path):
    """A registry with one version, an old orphan blob, a young one, and crashed writers' scratch."""
    registry, _ = cataloged
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    version = registry.register_adapter(random_bundle, NAME).version
    store = artifact_store(registry)
    old_orphan, young_orphan = b"an orphan from a register that died", b"a blob of a register in flight"
    for data in (old_orphan, young_orphan):
        store.put_bytes(digest_of_hex(sha256_bytes(data)), data)
    old = time.time() - registry.settings.litter_age_s - 60
    old_path = store.root / "blobs" / "sha256" / sha256_bytes(old_orphan)[:2] / sha256_bytes(old_orphan)
    os.utime(old_path, (old, old))
    crashed = tmp_path / "tmp" / f"{scratch_name('bundle').replace(f'-{os.getpid()}-', f'-{dead_pid()}-')}abc"
    crashed.mkdir()
    (crashed / "adapter_model.safetensors").write_bytes(b"x" * 1000)
    return (
        registry,
        version,
        digest_of_hex(sha256_bytes(old_orphan)),
        digest_of_hex(sha256_bytes(young_orphan)),
        crashed,
    )


def test_gc_reports_then_removes_litter_and_old_orphans_only(litter, capsys, monkeypatch):
    from loragate.cli.main import main

    registry, version, old_orphan, young_orphan, crashed = litter
    for key in ("LORAGATE_DATABASE_URL", "LORAGATE_ARTIFACTS"):
        monkeypatch.setenv(key, getattr(registry.settings, key.removeprefix("LORAGATE_").lower()))
    store = artifact_store(registry)
    monkeypatch.setenv("LORAGATE_TOKEN", registry.create_token("admin", "janitor")[1])

    assert main(["gc", "--dry-run", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [b["digest"] for b in report["orphan_blobs"]] == [old_orphan]
    assert [item["path"] for item in report["litter"]] == [str(crashed)]
    assert store.exists(old_orphan) and crashed.exists()  # a dry run removes nothing

    assert main(["gc", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["removed"] and report["freed_bytes"] >= 1000
    assert not store.exists(old_orphan) and not crashed.exists()
    assert store.exists(young_orphan)  # younger than the litter age: perhaps a register in flight
    registry.verify_blobs(version.version_id)


def test_gc_running_while_others_register_removes_nothing_they_need(cataloged, seeded_bundles, random_bundle):
    registry, _ = cataloged
    stop = threading.Event()
    errors: list[BaseException] = []

    def collect() -> None:
        while not stop.is_set():
            try:
                registry.gc()
            except BaseException as e:  # surfaced below
                errors.append(e)

    collector = threading.Thread(target=collect)
    collector.start()
    try:
        versions = [registry.register_adapter(b, NAME).version for b in [random_bundle, *seeded_bundles]]
        for v in versions:
            mark_validated(registry, v.version_id)
    finally:
        stop.set()
        collector.join()
    assert errors == []
    for v in versions:
        registry.verify_blobs(v.version_id)
    promote(registry, versions[-1].version_id, "canary")
