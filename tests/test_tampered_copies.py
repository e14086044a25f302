"""A replica serves only bytes that verify, on real vLLM replicas: one byte flipped in the
copy production replicas load (in place, its mtime put back) is reported by ``fleet status``
as drift naming the file, refused by the resolver when a replica asks for the name again
(as after a restart: never garbage; the client gets the base model's answer, labelled), and
repaired by ``fleet reconcile`` -- quarantined, materialized afresh, reloaded on every
replica that served it, answers verified. A clean fleet is checked again without reading a byte.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kit.tamper import flip_a_byte
from loragate.registry.rules.fleet import ActionKind
from loragate.registry.storage.copies import QUARANTINE_DIR, cache_file
from loragate.tasks import reconcile
from loragate.tasks.reconcile import CopyChecker, fleet_status, reconcile_fleet
from loragate.tasks.replicas import ReplicaClient
from tests.support.fleet import SUPPORT_PROMPT, admin_client, answer, served

pytestmark = pytest.mark.slow

WEIGHTS = "adapter_model.safetensors"


def own_actions(fleet, url: str):
    state = next(s for s in fleet_status(fleet.registry) if s.replica.url == url)
    return [a for a in state.actions if a.name == fleet.name]


def test_a_tampered_copy_is_reported_refused_by_the_resolver_and_repaired_by_reconcile(fleet):
    fleet.promote(fleet.v1, "canary")
    fleet.promote(fleet.v1, "production")
    expected = fleet.registry.expected_outputs(fleet.v1)
    assert expected is not None
    good = expected[1]["support-0"].strip()
    prod_a, prod_b = fleet.replicas["prod-a"], fleet.replicas["prod-b"]
    copy = Path(fleet.path(fleet.v1))
    assert all(not own_actions(fleet, r.url) for r in (prod_a, prod_b)), "in sync before"

    flip_a_byte(copy / WEIGHTS)

    # status: drift on both production replicas (they share the adapter directory), naming the file
    for replica in (prod_a, prod_b):
        [action] = own_actions(fleet, replica.url)
        assert action.kind == ActionKind.REPAIR and action.damaged == (WEIGHTS,)
        assert WEIGHTS in action.describe() and str(copy) in action.describe()

    # the resolver: a replica that asks for the name again (as after a restart) is refused
    with admin_client(fleet.registry, prod_a.url) as client:
        client.unload(fleet.name)
    # ... and its client answered by the base model, with the header saying so (the split)
    with ReplicaClient(prod_a.url) as user:
        fell_back = user.complete(fleet.name, SUPPORT_PROMPT, 8)
    assert (fell_back.version, fell_back.fallback) == ("base", "production_failed:404")
    assert fleet.name not in served(prod_a), "the tampered copy was never loaded"
    assert "refusing" in Path(prod_a.log_path).read_text(errors="replace")

    # reconcile: quarantined, fetched afresh, loaded where it was missing, reloaded and
    # verified where it was served
    states = reconcile_fleet(fleet.registry)
    assert all(not s.error for s in states if s.replica.url in (prod_a.url, prod_b.url))
    quarantined = list((Path(prod_a.adapter_dir) / QUARANTINE_DIR).glob(f"*{fleet.v1}*"))
    assert len(quarantined) == 1 and (quarantined[0] / WEIGHTS).read_bytes() != (copy / WEIGHTS).read_bytes()
    for replica in (prod_a, prod_b):
        assert served(replica)[fleet.name] == str(copy)
        assert answer(replica.url, fleet.name) == good
        assert not own_actions(fleet, replica.url), "in sync after"
    events = [e for e in fleet.registry.history(fleet.name) if e.action == "reconcile"]
    assert any(WEIGHTS in str(e.details) and "quarantined" in str(e.details) for e in events)

    # a clean fleet checked again reads no byte: stat stamps answer
    checker = CopyChecker(fleet.registry)
    fleet_status(fleet.registry, checker)
    assert checker.hashed == 0
    # kept where loragate runs, never on the adapter volume a replica host can write
    assert cache_file(fleet.registry.settings.home, prod_a.adapter_dir).is_file()
    assert not list(Path(prod_a.adapter_dir).glob("*verified*"))


def test_a_user_whose_request_loads_the_repaired_copy_before_reconcile_does_fails_nothing(fleet, monkeypatch):
    """A replica that refused the damaged copy serves no copy; once reconcile has fetched a
    fresh one, a user's request can reach the replica before reconcile's own load, and the
    resolver loads the fresh copy for it. Reconcile's load then finds the name loaded from
    the path it wanted: converged, not failed."""
    fleet.promote(fleet.v1, "canary")
    fleet.promote(fleet.v1, "production")
    expected = fleet.registry.expected_outputs(fleet.v1)
    assert expected is not None
    prod_a = fleet.replicas["prod-a"]
    copy = Path(fleet.path(fleet.v1))
    flip_a_byte(copy / WEIGHTS)
    with admin_client(fleet.registry, prod_a.url) as client:
        client.unload(fleet.name)  # as after the resolver refused the damaged copy

    users_answers = []
    fetch_afresh = reconcile.materialize_for

    def fetched_then_a_user_asks(registry, replica, placement):
        fetch_afresh(registry, replica, placement)
        if replica.url == prod_a.url:
            users_answers.append(answer(prod_a.url, fleet.name))

    monkeypatch.setattr(reconcile, "materialize_for", fetched_then_a_user_asks)
    states = reconcile_fleet(fleet.registry)

    assert users_answers == [expected[1]["support-0"].strip()], "the user was served the fresh copy"
    assert next(s for s in states if s.replica.url == prod_a.url).error is None
    assert served(prod_a)[fleet.name] == str(copy)
    assert not own_actions(fleet, prod_a.url), "in sync after"
