"""The canary watch in the store, on SQLite and on Postgres: windows, observations and the
claim of a sign-off, and the CLI over them (the verdict as a pure function, every rule a
row: tests/test_canary_verdict.py; the sign-off itself: tests/test_approvals.py)."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from loragate.registry.db.schema import canary_windows
from loragate.registry.errors import IllegalTransition, InvalidInput, NotFound
from loragate.registry.rules.canary import Monitor, Observation, Verdict, WindowStatus
from loragate.registry.service import Registry
from loragate.registry.service.lifecycle import NO_REPLICAS
from loragate.tasks.canary import DEFERRED, evaluation_plan
from loragate.tasks.gates import observe_canary
from tests.support.moves import promote, rollback
from tests.support.registries import IN_PROCESS, mark_validated, sql_engine
from tests.test_canary_verdict import side

# -- the store ----------------------------------------------------------------------------


@pytest.fixture
def canaried(cataloged, seeded_bundles):
    """Two validated versions of one adapter, the first in canary."""
    registry, _ = cataloged
    name = "acme/tiny-llama/support"
    v1 = registry.register_adapter(seeded_bundles[0], name).version.version_id
    v2 = registry.register_adapter(seeded_bundles[1], name).version.version_id
    for v in (v1, v2):
        mark_validated(registry, v)
    promote(registry, v1, "canary")
    ALICE.append(registry.create_token("activation", "alice")[1])  # who signs off
    return registry, name, v1, v2


ALICE: list[str] = []


def observe(registry, window_id: int, verdict: Verdict) -> Observation:
    now = datetime.now(UTC)
    return registry.record_canary_observation(
        Observation(
            window_id,
            now,
            side(),
            side(),
            0.0,
            [],
            verdict,
            [Monitor("p95_ms", 1.0, 2.0, True)],
            ["why"],
            pairs_ms=((150.5, 100.25), (300.0, 210.0)),
        )
    )


def test_opening_a_window_twice_returns_the_same_window(canaried):
    registry, name, v1, _ = canaried
    first, created = registry.open_canary_window(v1)
    again, created_again = registry.open_canary_window(v1)
    assert (created, created_again) == (True, False) and again.id == first.id
    assert first.status == WindowStatus.OPEN and first.thresholds.length_s == registry.settings.canary_window_s
    assert [e.to_value for e in registry.history(name) if e.action == "canary_window"] == ["open"]


def test_only_the_current_canary_gets_a_window(canaried):
    registry, _, _, v2 = canaried
    with pytest.raises(IllegalTransition):
        registry.open_canary_window(v2)


def test_a_new_canary_supersedes_the_active_window(canaried):
    registry, _, v1, v2 = canaried
    old, _ = registry.open_canary_window(v1)
    promote(registry, v2, "canary")
    new, _ = registry.open_canary_window(v2)
    assert registry.canary_window(old.id).status == WindowStatus.SUPERSEDED
    assert [w.id for w in registry.canary_windows()] == [new.id]


def _new_canary(registry, name, v1, v2):
    promote(registry, v2, "canary", reason="the next canary")


def _withdrawn(registry, name, v1, v2):
    rollback(registry, name, "canary", reason="withdrawn")


def _promoted(registry, name, v1, v2):
    promote(registry, v1, "production", reason="promoted")


def _overridden(registry, name, v1, v2):
    promote(registry, v1, "production", reason="the fix is needed now", override=True)


@pytest.mark.parametrize(
    "move, ready, ended",
    [
        (_new_canary, False, WindowStatus.SUPERSEDED),
        (_new_canary, True, WindowStatus.SUPERSEDED),
        (_withdrawn, False, WindowStatus.ROLLED_BACK),
        (_withdrawn, True, WindowStatus.ROLLED_BACK),
        (_promoted, True, WindowStatus.PROMOTED),
        (_overridden, True, WindowStatus.PROMOTED),
        (_overridden, False, WindowStatus.SUPERSEDED),  # promoted before its window decided
    ],
    ids=lambda v: getattr(v, "__name__", None) or str(v),
)
def test_the_pointer_move_that_takes_the_canary_away_ends_its_window(canaried, move, ready, ended):
    registry, name, v1, v2 = canaried
    w, _ = registry.open_canary_window(v1)
    if ready:
        observe(registry, w.id, Verdict.READY)
    move(registry, name, v1, v2)
    closed = registry.canary_window(w.id)
    assert closed.status == ended and closed.closed_at is not None
    assert registry.canary_windows() == []
    last = [e for e in registry.history(name) if e.action == "canary_window"][-1]
    assert (last.version_id, last.to_value) == (v1, ended.value)


def test_a_window_opened_while_a_move_takes_the_canary_away_is_refused(canaried):
    """The opening reads the canary under the adapter's lock: held by a withdrawal, the
    opening waits for it and then finds no canary to open a window for."""
    registry, name, v1, _ = canaried
    opener = Registry.open(registry.settings, principal=IN_PROCESS)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            with registry.rollback_move(name, "canary", switch=NO_REPLICAS, reason="withdrawn") as move:
                assert not move.plan.empty
                opening = pool.submit(opener.open_canary_window, v1)
                with pytest.raises(concurrent.futures.TimeoutError):
                    opening.result(timeout=1.0)  # waits on the move's lock
            with pytest.raises(IllegalTransition):
                opening.result(timeout=30)
    finally:
        opener.close()
    assert registry.get_adapter(name).canary is None
    assert registry.canary_windows() == []


def test_a_ready_observation_moves_the_window_and_observations_round_trip(canaried):
    registry, _, v1, _ = canaried
    w, _ = registry.open_canary_window(v1)
    observe(registry, w.id, Verdict.CONTINUE)
    stored = observe(registry, w.id, Verdict.READY)
    assert registry.canary_window(w.id).status == WindowStatus.READY
    got = registry.canary_observations(w.id)
    assert [o.verdict for o in got] == [Verdict.CONTINUE, Verdict.READY]
    assert got[-1] == stored and got[-1].canary == side()


def _open_windows(registry, bundle, tenants) -> list[int]:
    ids = []
    for tenant in tenants:
        version_id = registry.register_adapter(bundle, f"{tenant}/tiny-llama/support").version.version_id
        mark_validated(registry, version_id)
        promote(registry, version_id, "canary")
        ids.append(registry.open_canary_window(version_id, share=0.0)[0].id)
    return ids


def test_an_evaluation_takes_windows_never_observed_first_then_the_least_recently_observed(cataloged, seeded_bundles):
    registry, _ = cataloged
    a, b, c = _open_windows(registry, seeded_bundles[0], ("a", "b", "c"))
    observe(registry, b, Verdict.CONTINUE)
    observe(registry, a, Verdict.CONTINUE)
    observe(registry, b, Verdict.CONTINUE)
    plan = evaluation_plan(registry, now=1000.0)
    assert [w.id for w in plan.windows] == [c, a, b]
    assert [w.id for w in registry.canary_windows((WindowStatus.OPEN,))] == [a, b, c]  # oldest first
    assert plan.at_once == registry.settings.canary_observed_at_once
    assert plan.start_by == 1000.0 + registry.settings.canary_evaluate_budget_s


def test_an_observation_started_past_the_evaluations_budget_is_deferred_and_touches_nothing(canaried):
    registry, _, v1, _ = canaried
    w, _ = registry.open_canary_window(v1)
    # no registry is opened: the task answers before it would connect
    assert observe_canary.fn(w.id, None, start_by=time.time() - 1) == DEFERRED
    assert registry.canary_observations(w.id) == []


def test_the_sign_off_is_claimed_by_one_run_only(canaried):
    registry, _, v1, _ = canaried
    w, _ = registry.open_canary_window(v1)
    assert registry.request_approval(w.id, "run-a").approval_flow_run_id == "run-a"
    assert registry.request_approval(w.id, "run-b").approval_flow_run_id == "run-a"
    assert registry.request_approval(w.id, "run-b", replacing="run-a").approval_flow_run_id == "run-b"


@pytest.mark.parametrize(
    "start, to",
    [
        (WindowStatus.OPEN, WindowStatus.PROMOTED),
        (WindowStatus.OPEN, WindowStatus.REJECTED),
        (WindowStatus.ROLLED_BACK, WindowStatus.READY),
        (WindowStatus.ROLLED_BACK, WindowStatus.PROMOTED),
    ],
)
def test_a_window_moves_only_along_its_table(canaried, start, to):
    registry, _, v1, _ = canaried
    w, _ = registry.open_canary_window(v1)
    if start != WindowStatus.OPEN:
        registry.close_canary_window(w.id, start, "set up")
    with pytest.raises(IllegalTransition):
        registry.close_canary_window(w.id, to, "not allowed")
    assert registry.canary_window(w.id).status == start
    assert registry.close_canary_window(w.id, start, "again").status == start  # already there: no-op


def test_unknown_windows_and_versions_are_not_found(canaried):
    registry, _, _, v2 = canaried
    with pytest.raises(NotFound):
        registry.canary_window(9999)
    with pytest.raises(NotFound):
        registry.latest_canary_window(v2)


# -- the CLI ------------------------------------------------------------------------------


def run_cli(registry, monkeypatch, *argv: str) -> int:
    from loragate.cli.main import main

    monkeypatch.setenv("LORAGATE_DATABASE_URL", registry.settings.database_url)
    monkeypatch.setenv("LORAGATE_ARTIFACTS", registry.settings.artifacts)
    monkeypatch.setenv("LORAGATE_TOKEN", ALICE[-1])
    return main(list(argv))


def test_approve_refuses_until_a_promotion_waits_and_changes_nothing(canaried, monkeypatch, capsys):
    registry, name, v1, v2 = canaried
    assert run_cli(registry, monkeypatch, "approve", v2, "--reviewer", "alice") == 2  # never canaried
    w, _ = registry.open_canary_window(v1)
    assert run_cli(registry, monkeypatch, "approve", v1, "--reviewer", "alice") == 2  # still observing
    observe(registry, w.id, Verdict.READY)
    before = registry.history(name)
    assert run_cli(registry, monkeypatch, "approve", v1, "--reviewer", "alice") == 2  # no run paused yet
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: illegal_transition [version]: no promotion waits for a sign-off")
    assert registry.history(name) == before


def test_canary_show_prints_the_evidence_and_list_the_active_windows(canaried, monkeypatch, capsys):
    import json

    registry, _, v1, _ = canaried
    w, _ = registry.open_canary_window(v1)
    observe(registry, w.id, Verdict.CONTINUE)
    capsys.readouterr()
    assert run_cli(registry, monkeypatch, "canary", "show", v1) == 0
    assert f"Canary evidence: `acme/tiny-llama/support` → `{v1}`" in capsys.readouterr().out
    assert run_cli(registry, monkeypatch, "--json", "canary", "list") == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(x["version_id"], x["status"]) for x in listed] == [(v1, "open")]


def test_attaching_the_same_golden_set_again_records_nothing(canaried, tmp_path):
    from kit.tenant_tasks import write_golden_set

    registry, name, _, _ = canaried
    path = write_golden_set("support", tmp_path / "golden.jsonl")
    first = registry.attach_golden_set(name, path)
    events = len(registry.history(name))
    again = registry.attach_golden_set(name, path)
    assert again == first and len(registry.history(name)) == events
    other = write_golden_set("tickets", tmp_path / "other.jsonl")
    assert registry.attach_golden_set(name, other).digest != first.digest  # a new set is recorded
    assert len(registry.history(name)) == events + 1


def test_the_probe_set_is_jsonl_of_prompts_and_a_bad_one_names_the_setting(tmp_path):
    from loragate.tasks.canary import Probe, load_probe_set

    assert load_probe_set(None) == []
    good = tmp_path / "probes.jsonl"
    good.write_text('{"prompt": "hello", "max_tokens": 4}\n\n{"prompt": "bye"}\n')
    assert load_probe_set(str(good)) == [Probe("hello", 4), Probe("bye", 16)]
    for bad in ('{"max_tokens": 4}\n', "not json\n", '{"prompt": "x", "max_tokens": "many"}\n'):
        path = tmp_path / "bad.jsonl"
        path.write_text(bad)
        with pytest.raises(InvalidInput) as e:
            load_probe_set(str(path))
        assert e.value.field == "LORAGATE_CANARY_PROBE_SET" and "line 1" in e.value.message
    with pytest.raises(InvalidInput) as e:
        load_probe_set(str(tmp_path / "missing.jsonl"))
    assert e.value.field == "LORAGATE_CANARY_PROBE_SET"


def test_racing_openings_of_a_window_leave_one_active_window(canaried):
    """Eight openings at once (the canary flow re-run, a duplicated event): one window is
    created, every call gets it, and the database holds one active window per adapter."""
    registry, name, v1, _ = canaried
    racers = 8
    registries = [Registry.open(registry.settings, principal=IN_PROCESS) for _ in range(racers)]
    barrier = threading.Barrier(racers)

    def race(r: Registry):
        barrier.wait()
        return r.open_canary_window(v1)

    try:
        with concurrent.futures.ThreadPoolExecutor(racers) as pool:
            opened = list(pool.map(race, registries))
    finally:
        for r in registries:
            r.close()
    assert len({w.id for w, _ in opened}) == 1 and sum(created for _, created in opened) == 1
    assert len(registry.canary_windows()) == 1
    assert [e.to_value for e in registry.history(name) if e.action == "canary_window"] == ["open"]


def test_the_database_refuses_a_second_active_window_for_an_adapter(canaried):
    registry, name, v1, _ = canaried
    registry.open_canary_window(v1)
    with sql_engine(registry).connect() as conn, pytest.raises(IntegrityError):
        conn.execute(
            insert(canary_windows).values(
                adapter_name=name, version_id=v1, status="ready", opened_at=datetime.now(UTC), thresholds={}
            )
        )


def test_the_migration_settles_windows_already_doubled(canaried):
    """Windows doubled before 0008 (issue 18's race): all but the newest active one of an
    adapter are superseded, so the index can be built."""
    from loragate.registry.db import migrate

    registry, name, v1, _ = canaried
    engine = sql_engine(registry)
    try:
        migrate.downgrade(engine, "0007")
        with engine.begin() as conn:
            for status in ("open", "ready", "open"):
                row = {"adapter_name": name, "version_id": v1, "opened_at": datetime.now(UTC), "thresholds": {}}
                conn.execute(insert(canary_windows).values(status=status, **row))
        migrate.upgrade(engine)
        with engine.connect() as conn:
            statuses = [r.status for r in conn.execute(select(canary_windows).order_by(canary_windows.c.id))]
    finally:
        engine.dispose()
    assert statuses == ["superseded", "superseded", "open"]
