"""``Registry.pointer_move`` and ``rollback_move``: claim, plan and verify on entering, the
switch of the replicas applied and audited under the adapter's lock, the block under it too,
one commit on leaving -- and one undo: a move that does not commit reverts its switch, once
-- on SQLite and on Postgres. The move opens only with a switch: these tests pass a
recording one (``tests/support/switches.py``) or the named seam ``NO_REPLICAS``."""

from __future__ import annotations

import pytest

from loragate.registry.db.pointers import ClaimedAdapter
from loragate.registry.errors import ConcurrentUpdate, ErrorCode, IllegalTransition
from loragate.registry.service.lifecycle import NO_REPLICAS
from tests.support.moves import promote, rollback
from tests.support.races import released_at_once
from tests.support.registries import IN_PROCESS, audit_count, mark_validated
from tests.support.switches import RecordingSwitch, SwitchFailed

NAME = "acme/tiny-llama/support"
SWITCHED = [{"replica": "http://replica:1", "name": NAME, "from": None, "to": "v", "version_id": "v"}]


def with_own_registry(settings, act):
    """``act(registry)`` on a registry of its own connection, for a racer."""
    from loragate.registry.service import Registry

    def run() -> None:
        with Registry.open(settings, check_schema=False, principal=IN_PROCESS) as mine:
            act(mine)

    return run


def _registered(registry, bundles, count: int, validated: bool = True) -> list[str]:
    ids = [registry.register_adapter(b, NAME).version.version_id for b in bundles[:count]]
    if validated:
        for v in ids:
            mark_validated(registry, v)
    return ids


def switched(version_id: str) -> list[dict]:
    return [{**SWITCHED[0], "to": version_id, "version_id": version_id}]


def test_a_pointer_move_commits_its_plan_and_its_switchs_report_together(cataloged, seeded_bundles):
    registry, _ = cataloged
    (v1,) = _registered(registry, seeded_bundles, 1)
    switch = RecordingSwitch(report=switched(v1))
    with registry.pointer_move(v1, "canary", switch=switch, reason="try it") as move:
        assert move.name == NAME and move.plan.pointer_changes
        assert switch.applied == [move.plan]  # applied on entering, under the lock
    assert registry.get_adapter(NAME).canary == v1
    last_two = registry.history(NAME)[-2:]
    assert [e.action for e in last_two] == ["promote", "deploy"]
    assert last_two[1].id == last_two[0].id + 1  # written in the move's transaction, right after it
    assert {e.reason for e in last_two} == {"try it"}
    assert switch.reverted == 0


@pytest.mark.parametrize("where", ["in_the_switch", "in_the_block_after_the_switch_applied"])
def test_an_error_in_a_pointer_move_reverts_its_switch_once_and_leaves_pointers_revision_and_audit_as_they_were(
    cataloged, seeded_bundles, where
):
    registry, _ = cataloged
    v1, v2 = _registered(registry, seeded_bundles, 2)
    promote(registry, v1, "canary")
    before = registry.get_adapter(NAME)
    events = audit_count(registry)
    switch = RecordingSwitch(report=SWITCHED, fails=where == "in_the_switch")
    with pytest.raises(SwitchFailed), registry.pointer_move(v2, "canary", switch=switch) as move:
        assert switch.applied == [move.plan]
        raise SwitchFailed
    after = registry.get_adapter(NAME)
    assert (after.canary, after.revision) == (before.canary, before.revision)
    assert registry.get_version(v2).stage == "staging"
    assert audit_count(registry) == events
    assert len(switch.applied) == 1 and switch.reverted == 1


def test_a_pointer_move_to_where_the_pointer_is_writes_nothing(cataloged, seeded_bundles):
    registry, _ = cataloged
    (v1,) = _registered(registry, seeded_bundles, 1)
    promote(registry, v1, "canary")
    before, events = registry.get_adapter(NAME), audit_count(registry)
    with registry.pointer_move(v1, "canary", switch=NO_REPLICAS) as move:
        assert move.plan.empty
    assert registry.get_adapter(NAME).revision == before.revision  # the claim's bump rolled back
    assert audit_count(registry) == events


def test_a_pointer_move_shows_the_pointers_as_read_under_its_lock(cataloged, seeded_bundles):
    registry, _ = cataloged
    v1, v2 = _registered(registry, seeded_bundles, 2)
    promote(registry, v1, "canary")
    promote(registry, v1, "production")
    with registry.pointer_move(v2, "canary", switch=NO_REPLICAS) as move:
        assert {p.value: v for p, v in move.pointers.items()} == {"production": v1}


def test_a_refused_pointer_move_never_runs_its_switch_or_block_and_reverts_the_switch_once(cataloged, seeded_bundles):
    """Reverted although never applied: what the caller changed ahead of the move (a
    promotion's every user sent to the canary) is undone by the same revert."""
    registry, _ = cataloged
    (v1,) = _registered(registry, seeded_bundles, 1, validated=False)
    ran = []
    switch = RecordingSwitch()
    with pytest.raises(IllegalTransition) as refused, registry.pointer_move(v1, "canary", switch=switch):
        ran.append(True)
    assert refused.value.code == ErrorCode.VALIDATION_REQUIRED
    assert ran == [] and registry.get_adapter(NAME).canary is None
    assert switch.applied == [] and switch.reverted == 1


def test_a_pointer_move_cannot_be_opened_without_the_switch_of_its_replicas(cataloged, seeded_bundles):
    registry, _ = cataloged
    v1, v2 = _registered(registry, seeded_bundles, 2)
    promote(registry, v1, "canary")
    promote(registry, v1, "production")
    before, events = registry.get_adapter(NAME), audit_count(registry)
    with pytest.raises(TypeError):
        registry.pointer_move(v2, "canary")
    with pytest.raises(TypeError):
        registry.rollback_move(NAME, "canary")
    with pytest.raises(TypeError, match="ReplicaSwitch"), registry.pointer_move(v2, "canary", switch=None):
        pass
    assert registry.get_adapter(NAME) == before and audit_count(registry) == events


def test_a_lost_compare_and_set_plans_the_move_again_before_its_switch_is_applied_once(
    cataloged, seeded_bundles, monkeypatch
):
    registry, _ = cataloged
    (v1,) = _registered(registry, seeded_bundles, 1)
    write = ClaimedAdapter.apply
    lost: list[bool] = []

    def lose_the_first(claim, plan, **kwargs):
        if not lost:
            lost.append(True)
            raise ConcurrentUpdate("another writer moved the same rows first")
        return write(claim, plan, **kwargs)

    monkeypatch.setattr(ClaimedAdapter, "apply", lose_the_first)
    switch = RecordingSwitch(report=switched(v1))
    with registry.pointer_move(v1, "canary", switch=switch) as move:
        pass
    assert lost == [True] and registry.get_adapter(NAME).canary == v1
    assert switch.applied == [move.plan] and switch.reverted == 0


def test_a_rollback_move_returns_production_and_an_error_in_it_returns_nothing(cataloged, seeded_bundles):
    registry, _ = cataloged
    v1, v2 = _registered(registry, seeded_bundles, 2)
    for v in (v1, v2):
        promote(registry, v, "canary")
        promote(registry, v, "production")
    failing = RecordingSwitch(fails=True)
    with pytest.raises(SwitchFailed), registry.rollback_move(NAME, "production", switch=failing):
        pass
    assert registry.get_adapter(NAME).production == v2 and failing.reverted == 1
    with registry.rollback_move(NAME, "production", switch=RecordingSwitch(report=SWITCHED)):
        pass
    assert registry.get_adapter(NAME).production == v1
    assert [e.action for e in registry.history(NAME)[-2:]] == ["rollback", "deploy"]


def test_concurrent_pointer_moves_replay_as_one_chain_each_with_its_audit(settings, tiny_base, seeded_bundles):
    """Four movers released at once by a barrier, each a separate connection: every move
    holds the adapter from its claim through its switch to its commit, so each move's audit
    is followed directly by its switch's, and each move starts from where the previous one left the pointer."""
    from loragate.registry.service import Registry

    with Registry.open(settings, check_schema=False, principal=IN_PROCESS) as registry:
        registry.init()
        registry.add_base(str(tiny_base), "tiny-llama")
        ids = _registered(registry, seeded_bundles, 4)

    def mover(version_id: str):
        def move_it(mine) -> None:
            with mine.pointer_move(version_id, "canary", switch=RecordingSwitch(report=switched(version_id))):
                pass

        return move_it

    assert released_at_once([with_own_registry(settings, mover(v)) for v in ids]) == []
    with Registry.open(settings, check_schema=False, principal=IN_PROCESS) as registry:
        events = [e for e in registry.history(NAME) if e.action in ("promote", "deploy")]
        final = registry.get_adapter(NAME).canary
    moves = events[0::2]
    assert [e.action for e in events] == ["promote", "deploy"] * len(ids)
    assert all(d.id == m.id + 1 and d.version_id == m.version_id for m, d in zip(moves, events[1::2], strict=True))
    assert sorted(m.version_id for m in moves) == sorted(ids)
    assert [m.from_value for m in moves] == [None] + [m.to_value for m in moves[:-1]]
    assert final == moves[-1].to_value


@pytest.mark.parametrize("stage", ["canary", "production"])
def test_a_stale_rollback_decision_never_undoes_the_move_that_landed_meanwhile(
    settings, tiny_base, seeded_bundles, stage
):
    """Eight callers released at once by a barrier: four act on a decision made while v2
    was at ``stage`` (roll it back, expecting v2), four move v3 there. In whatever order the
    database lets them in, v3 ends at ``stage`` and is never rolled back: a rollback that
    finds the stage moved on from v2 writes nothing (issue 18: a canary evaluation, or a
    failed promotion's restore, undid a promotion landing between its check and its act)."""
    from loragate.registry.service import Registry

    with Registry.open(settings, check_schema=False, principal=IN_PROCESS) as registry:
        registry.init()
        registry.add_base(str(tiny_base), "tiny-llama")
        v1, v2, v3 = _registered(registry, seeded_bundles, 3)
        promote(registry, v1, "canary")
        promote(registry, v1, "production")
        promote(registry, v2, "canary")
        if stage == "production":
            promote(registry, v2, "production")
            promote(registry, v3, "canary")
    racers = [
        (lambda r: rollback(r, NAME, stage, reason="stale decision", expected_version=v2))
        if i % 2
        else (lambda r: promote(r, v3, stage))
        for i in range(8)
    ]
    assert released_at_once([with_own_registry(settings, act) for act in racers]) == []
    with Registry.open(settings, check_schema=False, principal=IN_PROCESS) as registry:
        adapter = registry.get_adapter(NAME)
        rollbacks = [e for e in registry.history(NAME) if e.action == "rollback"]
        assert (adapter.canary if stage == "canary" else adapter.production) == v3
        assert registry.get_version(v3).stage == stage
        assert len(rollbacks) <= 1 and all(e.from_value == v2 for e in rollbacks)
