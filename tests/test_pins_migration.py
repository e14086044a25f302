"""Migration 0014 on SQLite and Postgres, up, down and up again with pins in place: the table
is created and dropped whole, its CHECK and foreign key hold (a pin goes with its adapter);
on Postgres the replica's database user reads the pinned names and nothing else of them and
writes none, and the fleet's user writes hot pins, never a person's (the rest of the role
matrix: tests/test_db_roles.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError

from loragate.registry.db import migrate

NAME = "acme/tiny-llama/support"
OTHER = "acme/tiny-llama/tickets"
REPLICA_READ = "SELECT adapter_name FROM adapter_pins"  # what the replicas run


@pytest.fixture
def pinned(cataloged, seeded_bundles, tmp_path):
    """NAME pinned by a person, OTHER hot (a production replica gives it room); the owner's engine."""
    from tests.support.registries import sql_engine

    registry, _ = cataloged
    registry.add_replica("http://10.0.0.9:8000", "tiny-llama", "production", str(tmp_path), max_loras=32)
    registry.register_adapter(seeded_bundles[0], NAME)
    registry.register_adapter(seeded_bundles[1], OTHER)
    registry.pin(NAME)
    registry.replace_hot_pins([OTHER])
    engine = sql_engine(registry)
    yield registry, engine
    engine.dispose()


def pins(engine: Engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text("SELECT adapter_name, source FROM adapter_pins ORDER BY 1"))]


def test_downgrade_drops_the_pins_and_upgrade_brings_an_empty_table_back_with_its_rules(pinned):
    _, engine = pinned
    assert pins(engine) == [(NAME, "operator"), (OTHER, "hot")]
    migrate.downgrade(engine, "0013")
    assert migrate.current_revision(engine) == "0013"
    assert "adapter_pins" not in inspect(engine).get_table_names()
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.HEAD
    assert pins(engine) == []
    with engine.begin() as conn:  # pinned_at defaults to now
        conn.execute(
            text("INSERT INTO adapter_pins (adapter_name, source, pinned_by) VALUES (:n, 'hot', 'x')"), {"n": NAME}
        )
        assert conn.execute(text("SELECT pinned_at FROM adapter_pins")).scalar() is not None
    for name, source in ((OTHER, "whim"), ("acme/tiny-llama/nobody", "hot")):  # the CHECK, the foreign key
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(
                text("INSERT INTO adapter_pins (adapter_name, source, pinned_by) VALUES (:n, :s, 'x')"),
                {"n": name, "s": source},
            )
    assert pins(engine) == [(NAME, "hot")]


def test_a_pin_goes_with_its_adapter(pinned):
    """ON DELETE CASCADE. The registry never deletes an adapter (0003's triggers refuse even
    the owner): only an owner who lifts that rule first can, and the pin then goes too."""
    registry, engine = pinned
    gone = "acme/tiny-llama/gone"
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO adapters (name, namespace, base, task, revision, created_at) "
                "VALUES (:n, 'acme', 'tiny-llama', 'gone', 0, CURRENT_TIMESTAMP)"
            ),
            {"n": gone},
        )
    registry.replace_hot_pins([gone])
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("ALTER TABLE adapters DISABLE TRIGGER adapters_identity"))
        else:
            conn.execute(text("DROP TRIGGER adapters_never_deleted"))
        conn.execute(text("DELETE FROM adapters WHERE name = :n"), {"n": gone})
    assert pins(engine) == [(NAME, "operator")]


# -- Postgres grants -------------------------------------------------------------------------


def as_user(url: str, user: str) -> Engine:
    return create_engine(make_url(url).set(username=user))


def attempt(engine: Engine, statement: str) -> int:
    """``statement`` in a transaction of its own, rolled back; the rows it read or touched."""
    with engine.connect() as conn:
        try:
            result = conn.execute(text(statement), {"n": NAME, "o": OTHER})
            return len(result.fetchall()) if result.returns_rows else result.rowcount
        finally:
            conn.rollback()


def refused_for_privilege(engine: Engine, statement: str) -> bool:
    with pytest.raises(DBAPIError) as refused:
        attempt(engine, statement)
    return getattr(refused.value.orig, "sqlstate", None) == "42501"


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize(
    "statement",
    [
        "SELECT * FROM adapter_pins",
        "SELECT source FROM adapter_pins",
        "SELECT pinned_by, pinned_at FROM adapter_pins",
        "SELECT adapter_name FROM adapter_pins WHERE source = 'hot'",
        "INSERT INTO adapter_pins (adapter_name, source, pinned_by) VALUES (:o, 'hot', 'replica')",
        "DELETE FROM adapter_pins",
        "UPDATE adapter_pins SET source = 'hot'",
        "TRUNCATE adapter_pins",
    ],
)
def test_the_replica_user_reads_the_pinned_names_and_nothing_else_and_writes_nothing(pinned, statement):
    registry, _ = pinned
    replica = as_user(registry.settings.database_url, "loragate_replica")
    try:
        assert attempt(replica, REPLICA_READ) == 2
        assert attempt(replica, "SELECT a.adapter_name FROM public.adapter_pins a") == 2  # schema-qualified too
        assert refused_for_privilege(replica, statement)
    finally:
        replica.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_downgrade_takes_the_replicas_read_away_and_upgrade_gives_it_back(pinned):
    registry, engine = pinned
    replica = as_user(registry.settings.database_url, "loragate_replica")
    try:
        migrate.downgrade(engine, "0013")
        with pytest.raises(DBAPIError):  # no such table
            attempt(replica, REPLICA_READ)
        migrate.upgrade(engine)
        assert attempt(replica, REPLICA_READ) == 0
        registry.pin(NAME)
        assert attempt(replica, REPLICA_READ) == 1
    finally:
        replica.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_the_application_as_the_fleet_user_replaces_hot_pins_but_never_a_persons(pinned, seeded_bundles):
    """What the traffic watch connects as: the hot set replaced, a person's pin left alone by
    the application, and refused by the database when asked directly."""
    from loragate.registry.errors import PermissionDenied
    from loragate.registry.service import Registry
    from tests.support.registries import IN_PROCESS

    registry, engine = pinned
    url = make_url(registry.settings.database_url).set(username="loragate_fleet")
    settings = registry.settings.model_copy(update={"database_url": url.render_as_string(hide_password=False)})
    with Registry.open(settings, principal=IN_PROCESS) as fleet:
        assert fleet.replace_hot_pins([NAME]) == ([], [OTHER])  # NAME is a person's: kept as it is
        assert fleet.replace_hot_pins([OTHER]) == ([OTHER], [])
        with pytest.raises(PermissionDenied, match="loragate_fleet"):
            fleet.unpin(NAME)
        with pytest.raises(PermissionDenied, match="loragate_fleet"):
            fleet.pin(OTHER)
    assert pins(engine) == [(NAME, "operator"), (OTHER, "hot")]
