"""A replica obeys only the fleet: on the session's real vLLM replicas, the runtime LoRA API
(load, unload, in-place load) needs the fleet's admin key, a client's key never counts, and
even with the admin key a load is only of bytes the registry recorded for a version this role
may serve (every other state-changing route: tests/test_replica_surface.py). Inference needs
no admin key. The resolver, asked for a name a volume writer re-pointed at a validated but
unapproved version, refuses it (and the traffic split answers the client from production's
own path instead)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from kit.tamper import flip_a_byte
from loragate.local.replica_secrets import ADMIN_KEY_FILE
from loragate.registry.errors import ReplicaError
from loragate.registry.rules.fleet import version_path
from loragate.registry.storage.resolver_index import index_entry, replace_entries
from loragate.tasks.replicas import ADMIN_KEY_HEADER, ReplicaClient
from tests.support.fleet import SUPPORT_PROMPT, admin_client, answer, served

pytestmark = pytest.mark.slow


@pytest.fixture
def live(fleet):
    """v1 in production on every replica; v2 validated and signed, in staging."""
    fleet.promote(fleet.v1, "canary")
    fleet.promote(fleet.v1, "production")
    return fleet


def _refused(call) -> int:
    with pytest.raises(ReplicaError) as refused:
        call()
    return refused.value.status


def test_a_replica_refuses_loads_and_unloads_without_the_fleets_admin_key_and_keeps_serving(live):
    url = live.replicas["prod-a"].url
    before = answer(url, live.name)
    with ReplicaClient(url) as anyone:
        assert _refused(lambda: anyone.load(live.name, live.path(live.v1), inplace=True)) == 401
        assert _refused(lambda: anyone.unload(live.name)) == 401
        assert _refused(lambda: anyone.load(live.name.replace("/support", "/new"), live.path(live.v1))) == 401
        # vLLM's other state-changing routes are closed to everyone (tests/test_replica_surface.py)
        assert anyone._http.post("/adapters", json={"name": "x", "src": "/tmp"}).status_code == 403
    # a client's own key (vLLM's --api-key is a Bearer token) is not the admin key, even when
    # it is the admin key's very text: only the fleet's header counts
    key = (live.replicas["prod-a"].secrets_dir / ADMIN_KEY_FILE).read_text()
    answered = httpx.post(
        url + "/v1/unload_lora_adapter", json={"lora_name": live.name}, headers={"Authorization": f"Bearer {key}"}
    )
    assert answered.status_code == 401
    assert set(answered.json()["error"]) == {"message", "type", "param", "code"}
    wrong_key = {ADMIN_KEY_HEADER: "x" * 43}
    assert (
        httpx.post(url + "/v1/unload_lora_adapter", json={"lora_name": live.name}, headers=wrong_key).status_code == 401
    )
    # inference needs no admin key, and production serves what it served
    assert answer(url, live.name) == before
    assert live.name in served(live.replicas["prod-a"])


def test_with_the_admin_key_a_load_of_bytes_the_registry_did_not_record_is_refused(live, support_bundle):
    replica = live.replicas["prod-a"]
    before = answer(replica.url, live.name)
    adapter_dir = replica.adapter_dir
    # the production version's bytes, one flipped, in a copy of its own
    tampered = live.registry.materialize(live.v1, adapter_dir / "forged" / live.v1)
    flip_a_byte(tampered / "adapter_model.safetensors")
    with admin_client(live.registry, replica.url) as fleet:
        assert _refused(lambda: fleet.load(live.name, str(tampered), inplace=True)) == 403
        # good weights at a path the registry does not own
        assert _refused(lambda: fleet.load(live.name, str(support_bundle), inplace=True)) == 403
        # a version production may not serve: validated and signed, but no one signed it off
        # (in staging: not even the canary the owner-moves replica would take)
        unapproved = live.registry.materialize(live.v2, adapter_dir / "elsewhere" / live.v2)
        assert _refused(lambda: fleet.load(live.name, str(unapproved), inplace=True)) == 403
        # the fleet's own load of what the registry placed still works
        fleet.load(live.name, live.path(live.v1), inplace=True)
    assert answer(replica.url, live.name) == before


def test_the_resolver_refuses_a_production_entry_a_volume_writer_pointed_at_an_unapproved_version(live):
    replica = live.replicas["prod-a"]
    adapter_dir = str(replica.adapter_dir)
    before = answer(replica.url, live.name)
    v2_path = version_path(adapter_dir, live.name, live.v2)
    live.registry.materialize(live.v2, Path(v2_path))
    # what the canary pool could write: production's entry naming v2 (validated, in staging:
    # not the canary even an owner-moves replica takes), its digests and all
    forged = {"production": index_entry(live.v2, v2_path, live.registry.bundle_digests(live.v2))}
    entries = replace_entries(adapter_dir, live.name, forged)
    try:
        with admin_client(live.registry, replica.url) as fleet:
            fleet.unload(live.name)  # as a switch or a restart would: the resolver is asked next
        # the forged entry is never served; the client is not refused either: the traffic
        # split answers from production's own path (name@version), as the registry says
        with ReplicaClient(replica.url) as client:
            answered = client.complete(live.name, SUPPORT_PROMPT, 32)
        assert (answered.version, answered.text.strip()) == (live.v1, before)
        assert live.name not in served(replica)
    finally:
        replace_entries(adapter_dir, live.name, entries)
    assert answer(replica.url, live.name) == before  # the real entry resolves again


def test_inference_needs_no_admin_key(live):
    with ReplicaClient(live.replicas["canary"].url) as client:
        assert client.complete(live.name, SUPPORT_PROMPT, 8).text
        assert client.complete("tiny-llama", SUPPORT_PROMPT, 4).text is not None
