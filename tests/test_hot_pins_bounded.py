"""The hot pins are bounded whoever writes them (migration 0016): the traffic watch's
``replace_hot_pins`` refuses more hot pins of a base than its limit leaves, and on Postgres
every role's database user is held to the limit ``loragate init`` wrote -- a raw INSERT of
one pin too many is refused, two writers racing for the last room get one pin between them,
and a person's pin is not bounded by it. The application is stricter (it counts a person's
pins and the warm copies too): tests/test_pins.py."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from loragate.registry.db import migrate
from loragate.registry.errors import ErrorCode, InvalidInput
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from tests.support.registries import IN_PROCESS, audit_count, sql_engine
from tests.test_db_roles import db_user_url

TASKS = ("a", "b", "c", "d", "e", "f", "g")
NAMES = [f"acme/tiny-llama/{t}" for t in TASKS]
INSERT_HOT = text("INSERT INTO adapter_pins (adapter_name, source, pinned_by) VALUES (:n, 'hot', 'probe')")
INSERT_PERSONS = text("INSERT INTO adapter_pins (adapter_name, source, pinned_by) VALUES (:n, 'operator', 'probe')")


def with_tenants(registry: Registry, seeded_bundles, tmp_path) -> Registry:
    """Seven adapters of tiny-llama, none pinned; one production replica of 3 slots, so the
    base has room for 2 hot pins (its slots less one free; no warm copy)."""
    for n, name in enumerate(NAMES):
        registry.register_adapter(seeded_bundles[n % len(seeded_bundles)], name)
    registry.add_replica("http://127.0.0.1:9", "tiny-llama", "production", str(tmp_path / "a"), max_loras=3)
    return registry


@pytest.fixture
def tenants(cataloged, seeded_bundles, tmp_path) -> Registry:
    """``with_tenants`` on SQLite and on Postgres."""
    return with_tenants(cataloged[0], seeded_bundles, tmp_path)


def hot(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.execute(text("SELECT adapter_name FROM adapter_pins WHERE source = 'hot' ORDER BY 1")).scalars()
        )


def test_the_watch_replaces_hot_pins_only_within_the_limit_and_a_refusal_changes_nothing(tenants):
    assert tenants.hot_pin_limits() == {"tiny-llama": 2}
    assert tenants.replace_hot_pins(NAMES[:2]) == (NAMES[:2], [])
    before = audit_count(tenants)
    with pytest.raises(InvalidInput) as refused:
        tenants.replace_hot_pins(NAMES)  # 7 names against a limit of 2
    assert (refused.value.code, refused.value.field) == (ErrorCode.HOT_PINS_OVER_LIMIT, "names")
    assert "7 hot pins of base tiny-llama, its limit is 2" in refused.value.message
    assert sorted(p.name for p in tenants.pins()) == NAMES[:2] and audit_count(tenants) == before


def test_a_process_whose_setting_is_above_the_databases_limit_is_held_to_the_lower(tenants):
    lowered = tenants.settings.model_copy(update={"hot_pins": 1})
    with Registry.open(lowered, principal=IN_PROCESS) as owner:
        owner.init()  # the operator's limit, written to the database
    assert tenants.hot_pin_limits() == {"tiny-llama": 1}  # its own setting says 10


@pytest.fixture
def on_postgres(pg_template, tiny_base, seeded_bundles, tmp_path):
    """``with_tenants`` on Postgres alone (SQLite has no users: there the application holds
    the rule), the owner's engine and the fleet's and admin's users'."""
    settings = Settings(
        home=tmp_path / "home", database_url=pg_template(), artifacts=str(tmp_path / "artifacts"), actor="tester"
    )
    registry = Registry.open(settings, check_schema=False, principal=IN_PROCESS)
    registry.init()
    registry.add_base(str(tiny_base), "tiny-llama")
    tenants = with_tenants(registry, seeded_bundles, tmp_path)
    owner = sql_engine(tenants)
    users = {r: create_engine(db_user_url(settings.database_url, r)) for r in ("fleet", "admin")}
    yield tenants, owner, users
    for engine in (owner, *users.values()):
        engine.dispose()
    registry.close()


@pytest.mark.parametrize("role", ["fleet", "admin"])
def test_no_roles_user_inserts_a_hot_pin_beyond_the_limit(on_postgres, role):
    _, owner, users = on_postgres
    with users[role].begin() as conn:
        for name in NAMES[:2]:
            conn.execute(INSERT_HOT, {"n": name})
    with pytest.raises(DBAPIError) as refused, users[role].begin() as conn:
        conn.execute(INSERT_HOT, {"n": NAMES[2]})
    assert getattr(refused.value.orig, "sqlstate", None) == "42501"
    assert "has 2 hot pins and a limit of 2" in str(refused.value.orig)
    assert hot(owner) == NAMES[:2]


def test_a_persons_pins_are_not_bounded_by_the_hot_limit_but_none_turns_hot_beyond_it(on_postgres):
    _, owner, users = on_postgres
    with users["admin"].begin() as conn:
        for name in NAMES[:4]:
            conn.execute(INSERT_PERSONS, {"n": name})
        for name in NAMES[:2]:
            conn.execute(text("UPDATE adapter_pins SET source = 'hot' WHERE adapter_name = :n"), {"n": name})
    with pytest.raises(DBAPIError) as refused, users["admin"].begin() as conn:
        conn.execute(text("UPDATE adapter_pins SET source = 'hot' WHERE adapter_name = :n"), {"n": NAMES[2]})
    assert getattr(refused.value.orig, "sqlstate", None) == "42501"
    with owner.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM adapter_pins WHERE source = 'operator'")).scalar() == 2
    assert hot(owner) == NAMES[:2]


def test_two_writers_racing_for_the_last_room_get_one_hot_pin_between_them(on_postgres):
    """Each round two fleet users insert a different hot pin at once with one slot left: the
    lock the bound takes serialises them, so one commits and the other is refused."""
    tenants, owner, users = on_postgres
    racer = create_engine(db_user_url(tenants.settings.database_url, "fleet"))
    try:
        for round_ in range(5):
            with owner.begin() as conn:
                conn.execute(text("DELETE FROM adapter_pins"))
                conn.execute(INSERT_HOT, {"n": NAMES[0]})
            barrier = threading.Barrier(2)
            outcomes: list[str] = []

            def insert(engine: Engine, name: str, barrier=barrier, outcomes=outcomes) -> None:
                with engine.connect() as conn:
                    try:
                        barrier.wait()
                        conn.execute(INSERT_HOT, {"n": name})
                        conn.commit()
                        outcomes.append("pinned")
                    except DBAPIError as e:
                        outcomes.append(getattr(e.orig, "sqlstate", None) or "other")

            threads = [
                threading.Thread(target=insert, args=(engine, name))
                for engine, name in ((users["fleet"], NAMES[1]), (racer, NAMES[2]))
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(outcomes) == ["42501", "pinned"], f"round {round_}: {outcomes}"
            assert len(hot(owner)) == 2
    finally:
        racer.dispose()


def test_migration_0016_goes_down_giving_fleet_the_replicas_back_and_up_taking_them_again(on_postgres):
    tenants, owner, users = on_postgres
    add = text(
        "INSERT INTO replicas (url, base_model_id, base_model_commit, role, adapter_dir, max_lora_rank, max_loras, "
        "served_model_name, created_at, created_by) SELECT 'http://127.0.0.1:10', base_model_id, base_model_commit, "
        "'production', '/srv', 16, 4, 'x', now(), 'probe' FROM base_models"
    )
    migrate.downgrade(owner, "0015")
    try:
        with users["fleet"].begin() as conn:  # 0010's grant, back
            conn.execute(add)
            for name in NAMES:  # and no bound
                conn.execute(INSERT_HOT, {"n": name})
        with owner.begin() as conn:
            conn.execute(text("DELETE FROM adapter_pins"))
            conn.execute(text("DELETE FROM replicas WHERE url = 'http://127.0.0.1:10'"))
    finally:
        migrate.upgrade(owner)
    assert migrate.current_revision(owner) == migrate.HEAD
    with pytest.raises(DBAPIError) as refused, users["fleet"].begin() as conn:
        conn.execute(add)
    assert getattr(refused.value.orig, "sqlstate", None) == "42501"
    assert tenants.replace_hot_pins(NAMES[:2]) == (NAMES[:2], [])
