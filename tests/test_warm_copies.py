"""Warm copies have a lifecycle, on the session's real vLLM replicas: after every move each
production replica keeps at most the canary of an active window and the previous production
as ``name@version``, production itself under the plain name (``loragate/tasks/warm_copies.py``);
what a move leaves behind is unloaded once it commits, and what is left anyway -- a copy
loaded by hand -- is a stray that ``fleet status`` lists and ``fleet reconcile`` unloads.

Each test reads ``/v1/models`` of the replicas themselves. The replicas are shared by the
session's tests, so each looks only at its own adapter's names.
"""

from __future__ import annotations

import json

import httpx
import pytest

import loragate.tasks.fleet
from kit.corpus import bound_to
from loragate.registry.errors import ErrorCode, ReplicaError
from loragate.registry.rules.fleet import ActionKind, adapter_of, qualified_name, version_path
from loragate.registry.storage.resolver_index import adapter_entries, read_index, replace_entries
from loragate.tasks.canary_moves import deploy_canary, promote_canary
from loragate.tasks.fleet import rollback_and_switch
from loragate.tasks.reconcile import fleet_status, reconcile_fleet
from loragate.tasks.replicas import ReplicaClient
from loragate.tasks.warm_copies import settle_warm_copies
from tests.support.commands import main_with_tokens, role_tokens
from tests.support.fleet import SUPPORT_PROMPT, admin_client, make_fleet, record_passed, served
from tests.support.registries import mark_ready

pytestmark = pytest.mark.slow


@pytest.fixture
def live(tmp_path, replicas, replica_adapters, validated_adapters):
    """v1 in production on every replica; canaries get half of the live users once warm."""
    fleet = make_fleet(tmp_path, replicas, replica_adapters, validated_adapters, canary_share=0.5)
    fleet.promote(fleet.v1, "canary")
    fleet.promote(fleet.v1, "production")
    yield fleet
    fleet.registry.close()


def productions(fleet) -> list:
    return [r for r in fleet.replicas.values() if r.role == "production"]


def own(fleet, replica) -> dict[str, str]:
    """What the replica serves of this test's adapter, under any name: served name -> path."""
    return {name: path for name, path in served(replica).items() if adapter_of(name) == fleet.name}


def at(fleet, replica, version: str) -> str:
    return version_path(str(replica.adapter_dir), fleet.name, version)


def promote_live(fleet, version: str) -> str | None:
    """``version`` through the canary gate with live traffic: warm on every production
    replica, its window ready, then promoted as ``promote_canary`` does (all users to the
    warm canary, production moved, the replaced version kept warm); returns the replaced."""
    deployment = deploy_canary(fleet.registry, version)
    assert deployment.window.share == 0.5
    mark_ready(fleet.registry, deployment.window.id)
    _, previous, _ = promote_canary(fleet.registry, version, "signed off")
    return previous


def user_gets(replica, name: str) -> str:
    body = {"model": name, "prompt": SUPPORT_PROMPT, "max_tokens": 1, "temperature": 0, "user": "warm-copies"}
    answered = httpx.post(replica.url + "/v1/completions", json=body, timeout=60)
    assert answered.status_code == 200, answered.text
    return answered.headers["x-loragate-version"]


def drift_of(fleet, states) -> dict[str, list]:
    """Replica URL -> the drift of this test's adapter there."""
    return {s.replica.url: [a for a in s.actions if a.adapter == fleet.name] for s in states}


def test_two_promotions_in_a_row_leave_one_previous_warm_and_production_under_its_plain_name_only(live, tmp_path):
    fleet = live
    twin = bound_to(fleet.validated.support_bundle, tmp_path / "support-twin", training_git_commit="e" * 40)
    v3 = fleet.registry.register_adapter(twin, fleet.name).version.version_id
    record_passed(fleet.registry, v3, fleet.validated.support_report)  # v1's weights: v1's answers

    assert promote_live(fleet, fleet.v2) == fleet.v1
    for replica in productions(fleet):
        assert own(fleet, replica) == {
            fleet.name: at(fleet, replica, fleet.v2),
            qualified_name(fleet.name, fleet.v1): at(fleet, replica, fleet.v1),
        }

    assert promote_live(fleet, v3) == fleet.v2
    for replica in productions(fleet):
        # v1, two promotions back, is gone; v3 is served under the plain name only
        assert own(fleet, replica) == {
            fleet.name: at(fleet, replica, v3),
            qualified_name(fleet.name, fleet.v2): at(fleet, replica, fleet.v2),
        }
        assert user_gets(replica, fleet.name) == v3
    assert all(not actions for actions in drift_of(fleet, fleet_status(fleet.registry)).values())
    # each promotion's leftovers unloaded on both replicas once it committed, audited: the
    # promoted version's warm copy and, the second time, the version two promotions back
    settled = [e for e in fleet.registry.history(fleet.name) if e.action == "warm_copies"]
    unloaded = [e.details["served_as"] for e in settled if e.details["kind"] == "unload_stray"]
    assert sorted(unloaded) == sorted(qualified_name(fleet.name, v) for v in (fleet.v2, fleet.v1, v3) * 2)


def test_loragate_rollback_leaves_the_rolled_back_version_served_under_no_name_on_any_replica(
    live, monkeypatch, capsys
):
    fleet = live
    promote_live(fleet, fleet.v2)
    rolled_back = fleet.v2
    monkeypatch.setenv("LORAGATE_DATABASE_URL", fleet.registry.settings.database_url)
    monkeypatch.setenv("LORAGATE_ARTIFACTS", fleet.registry.settings.artifacts)
    monkeypatch.setenv("LORAGATE_HOME", str(fleet.registry.settings.home))

    rc = main_with_tokens(role_tokens(fleet.registry), ["rollback", fleet.name, "--json"])

    out = capsys.readouterr().out
    assert rc == 0, out
    assert {r["verified"] for r in json.loads(out)["replicas"] if r["role"] == "production"} == {
        "warm: a routing change"
    }
    for replica in fleet.replicas.values():
        paths = own(fleet, replica)
        assert at(fleet, replica, rolled_back) not in paths.values(), (replica.url, paths)
        assert paths == {fleet.name: at(fleet, replica, fleet.v1)}, (replica.url, paths)
    for replica in productions(fleet):
        assert user_gets(replica, fleet.name) == fleet.v1
        # not even the fleet's key reaches it by name: nothing serves it, the registry refuses it
        with admin_client(fleet.registry, replica.url, retries=0) as client, pytest.raises(ReplicaError) as refused:
            client.complete(qualified_name(fleet.name, rolled_back), SUPPORT_PROMPT, 1, admin=True)
        assert refused.value.code == ErrorCode.REPLICA_UNKNOWN_ADAPTER, refused.value.one_line()


def held(fleet):
    return next(a for a in fleet.registry.adapter_pointers() if a.name == fleet.name)


def digests(fleet):
    return fleet.registry.bundle_digests


def index_names(fleet, replica) -> str | None:
    entry = read_index(str(replica.adapter_dir)).get("roles", {}).get("production", {}).get(fleet.name)
    return entry.get("version") if isinstance(entry, dict) else None


def test_a_rollback_to_the_warm_previous_version_changes_no_replica_under_the_lock_and_users_move_before_the_plain_name(
    live, monkeypatch
):
    fleet = live
    promote_live(fleet, fleet.v2)
    under_lock: dict = {}
    before_settling: dict = {}
    apply, settle = loragate.tasks.fleet.FleetSwitch.apply, loragate.tasks.fleet.settle_warm_copies

    def apply_then_look(switch, plan):
        report = apply(switch, plan)
        for replica in productions(fleet):  # the move has not committed yet: the lock is held
            under_lock[replica.url] = (own(fleet, replica), index_names(fleet, replica))
        return report

    def look_then_settle(registry, name, progress):
        for replica in productions(fleet):  # committed and the routes pushed; the plain name not moved
            before_settling[replica.url] = (user_gets(replica, fleet.name), own(fleet, replica))
        return settle(registry, name, progress)

    monkeypatch.setattr(loragate.tasks.fleet.FleetSwitch, "apply", apply_then_look)
    monkeypatch.setattr(loragate.tasks.fleet, "settle_warm_copies", look_then_settle)

    rollback_and_switch(fleet.registry, fleet.name, "production", reason="bad answers")

    for replica in productions(fleet):
        plain_v2_warm_v1 = {
            fleet.name: at(fleet, replica, fleet.v2),
            qualified_name(fleet.name, fleet.v1): at(fleet, replica, fleet.v1),
        }
        assert under_lock[replica.url] == (plain_v2_warm_v1, fleet.v2)
        assert before_settling[replica.url] == (fleet.v1, plain_v2_warm_v1)
        # settled: the plain name on v1, the index naming it, v2 served under no name
        assert own(fleet, replica) == {fleet.name: at(fleet, replica, fleet.v1)}
        assert index_names(fleet, replica) == fleet.v1
        assert user_gets(replica, fleet.name) == fleet.v1


def test_settling_leaves_a_stale_plain_name_and_the_index_alone_while_a_replica_cannot_drop_it(live, monkeypatch):
    fleet = live
    promote_live(fleet, fleet.v2)
    first, *_ = productions(fleet)
    settle = loragate.tasks.fleet.settle_warm_copies
    monkeypatch.setattr(loragate.tasks.fleet, "settle_warm_copies", lambda registry, name, progress: [])
    rollback_and_switch(fleet.registry, fleet.name, "production", reason="bad answers")
    unload = ReplicaClient.unload

    def unreachable_first(client, name):
        if client.url == first.url.rstrip("/") and name == fleet.name:
            raise ReplicaError(f"replica {first.url} unreachable", code=ErrorCode.REPLICA_UNAVAILABLE)
        return unload(client, name)

    monkeypatch.setattr(ReplicaClient, "unload", unreachable_first)
    told: list[str] = []

    assert settle(fleet.registry, fleet.name, told.append) == []

    assert any(first.url in line and "reconcile" in line for line in told), told
    for replica in productions(fleet):
        # no replica has v2 under a name the index gives v1: the index still names v2
        assert index_names(fleet, replica) == fleet.v2
        assert user_gets(replica, fleet.name) == fleet.v1
    assert own(fleet, first)[fleet.name] == at(fleet, first, fleet.v2)

    # what fleet reconcile does first -- every index entry as the pointers say, then each
    # replica's actions -- leaves the first replica's plain name on v2 under an index naming
    # v1 for a while: its users still get v1's answers, never v2's under v1's name
    for adapter_dir, entries in adapter_entries(fleet.registry.list_replicas(), held(fleet), digests(fleet)).items():
        replace_entries(adapter_dir, fleet.name, entries)
    assert index_names(fleet, first) == fleet.v1
    with admin_client(fleet.registry, first.url) as client:
        v1_says = client.complete_many(qualified_name(fleet.name, fleet.v1), [SUPPORT_PROMPT], 8, admin=True)
        v2_says = client.complete_many(fleet.name, [SUPPORT_PROMPT], 8, admin=True)  # the plain name: v2's bytes
    assert v1_says != v2_says
    body = {"model": fleet.name, "prompt": SUPPORT_PROMPT, "max_tokens": 8, "temperature": 0, "user": "reconciling"}
    answered = httpx.post(first.url + "/v1/completions", json=body, timeout=60)
    assert answered.status_code == 200, answered.text
    assert answered.headers["x-loragate-version"] == fleet.v1
    assert [answered.json()["choices"][0]["text"]] == v1_says


def test_rolling_back_the_canary_leaves_no_warm_copy_of_it_on_any_production_replica(live):
    fleet = live
    deploy_canary(fleet.registry, fleet.v2)
    warm = qualified_name(fleet.name, fleet.v2)
    assert all(warm in own(fleet, r) for r in productions(fleet))

    rollback_and_switch(fleet.registry, fleet.name, "canary", reason="withdrawn")  # loragate rollback --stage canary

    for replica in productions(fleet):
        assert own(fleet, replica) == {fleet.name: at(fleet, replica, fleet.v1)}


def test_production_left_served_only_warm_is_loaded_under_its_plain_name_verified_before_the_copy_goes(live):
    fleet = live
    warm = qualified_name(fleet.name, fleet.v1)
    for replica in productions(fleet):  # what a move that only moved traffic leaves
        with admin_client(fleet.registry, replica.url) as client:
            client.load(warm, at(fleet, replica, fleet.v1))
            client.unload(fleet.name)
        assert own(fleet, replica) == {warm: at(fleet, replica, fleet.v1)}

    done = settle_warm_copies(fleet.registry, fleet.name)

    assert sorted((a["replica"], a["kind"], a["served_as"]) for a in done) == sorted(
        (r.url, kind, served_as)
        for r in productions(fleet)
        for kind, served_as in (("load_plain", fleet.name), ("unload_stray", warm))
    )
    for replica in productions(fleet):
        assert own(fleet, replica) == {fleet.name: at(fleet, replica, fleet.v1)}
        assert user_gets(replica, fleet.name) == fleet.v1
    assert [e.details["kind"] for e in fleet.registry.history(fleet.name) if e.action == "warm_copies"] == [
        a["kind"] for a in done
    ]


def test_a_warm_copy_loaded_by_hand_is_a_stray_fleet_status_lists_and_reconcile_unloads(live, monkeypatch, capsys):
    fleet = live
    replica = productions(fleet)[0]
    stray = qualified_name(fleet.name, fleet.v1)  # production's own version: the replicas let it load
    with admin_client(fleet.registry, replica.url) as client:
        client.load(stray, at(fleet, replica, fleet.v1))
    assert own(fleet, replica) == {fleet.name: at(fleet, replica, fleet.v1), stray: at(fleet, replica, fleet.v1)}

    monkeypatch.setenv("LORAGATE_DATABASE_URL", fleet.registry.settings.database_url)
    monkeypatch.setenv("LORAGATE_ARTIFACTS", fleet.registry.settings.artifacts)
    monkeypatch.setenv("LORAGATE_HOME", str(fleet.registry.settings.home))
    assert main_with_tokens(role_tokens(fleet.registry), ["fleet", "status", "--json"]) == 0
    listed = {s["url"]: s["drift"] for s in json.loads(capsys.readouterr().out)}
    assert [d for d in listed[replica.url] if fleet.name in d] == [
        f"{replica.url}: unload stray warm copy {stray} (served from {at(fleet, replica, fleet.v1)}: "
        f"{fleet.v1} is served under the plain name)"
    ]
    drift = drift_of(fleet, fleet_status(fleet.registry))
    assert [(a.kind, a.name) for a in drift[replica.url]] == [(ActionKind.UNLOAD_STRAY, stray)]

    reconcile_fleet(fleet.registry)

    assert own(fleet, replica) == {fleet.name: at(fleet, replica, fleet.v1)}
    assert all(not actions for actions in drift_of(fleet, fleet_status(fleet.registry)).values())
    (event,) = [e for e in fleet.registry.history(fleet.name) if e.action == "reconcile"]
    assert (event.details["kind"], event.details["served_as"]) == ("unload_stray", stray)
