"""Migration 0011: ``canary_windows.share`` is added in place on SQLite and Postgres, checked
by the database, removed by a real downgrade; on Postgres the replica's database user reads
the split's columns and writes none, and only the roles that move canary windows change a
share (the rest of the role matrix: tests/test_db_roles.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError

from loragate.registry.db import migrate
from tests.support.moves import promote
from tests.support.registries import mark_validated, sql_engine

NAME = "acme/tiny-llama/support"


@pytest.fixture
def windowed(cataloged, seeded_bundles):
    """A registry whose adapter's canary has an active window (the configured share)."""
    registry, _ = cataloged
    v1 = registry.register_adapter(seeded_bundles[0], NAME).version.version_id
    mark_validated(registry, v1)
    promote(registry, v1, "canary")
    window, _ = registry.open_canary_window(v1)
    engine = sql_engine(registry)
    yield registry, window.id, engine
    engine.dispose()


def share_of(engine: Engine, window_id: int) -> float:
    with engine.connect() as conn:
        return conn.execute(text("SELECT share FROM canary_windows WHERE id = :w"), {"w": window_id}).scalar_one()


def columns(engine: Engine) -> set[str]:
    return {c["name"] for c in inspect(engine).get_columns("canary_windows")}


@pytest.mark.parametrize("share", [-0.01, 1.01, 2.0])
def test_the_database_refuses_a_share_outside_zero_to_one(windowed, share):
    _, window_id, engine = windowed
    before = share_of(engine, window_id)
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(text("UPDATE canary_windows SET share = :s WHERE id = :w"), {"s": share, "w": window_id})
    assert share_of(engine, window_id) == before


def test_downgrade_drops_the_share_keeping_the_window_and_upgrade_adds_it_back_as_zero(windowed):
    _, window_id, engine = windowed
    with engine.begin() as conn:
        conn.execute(text("UPDATE canary_windows SET share = 0.25 WHERE id = :w"), {"w": window_id})
    assert "share" in columns(engine) and share_of(engine, window_id) == 0.25
    migrate.downgrade(engine, "0010")
    assert "share" not in columns(engine) and migrate.current_revision(engine) == "0010"
    with engine.connect() as conn:  # the window itself is kept, in place
        assert conn.execute(text("SELECT status FROM canary_windows WHERE id = :w"), {"w": window_id}).scalar() == (
            "open"
        )
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.HEAD
    assert share_of(engine, window_id) == 0.0  # existing windows start with no live traffic
    with pytest.raises(IntegrityError), engine.begin() as conn:  # the CHECK is back too
        conn.execute(text("UPDATE canary_windows SET share = 1.5 WHERE id = :w"), {"w": window_id})


# -- Postgres grants -------------------------------------------------------------------------

SPLIT_READ = "SELECT id, adapter_name, version_id, status, share FROM canary_windows WHERE id = :w"
SET_SHARE = "UPDATE canary_windows SET share = 0.5 WHERE id = :w"


def as_user(url: str, user: str) -> Engine:
    return create_engine(make_url(url).set(username=user))


def attempt(engine: Engine, statement: str, window_id: int) -> int:
    """``statement`` in a transaction of its own, rolled back; the rows it touched."""
    with engine.connect() as conn:
        try:
            result = conn.execute(text(statement), {"w": window_id})
            return len(result.fetchall()) if result.returns_rows else result.rowcount
        finally:
            conn.rollback()


def refused_for_privilege(engine: Engine, statement: str, window_id: int) -> bool:
    with pytest.raises(DBAPIError) as refused:
        attempt(engine, statement, window_id)
    return getattr(refused.value.orig, "sqlstate", None) == "42501"


# (database user, may read the split's columns, may change a share)
GRANTS = [
    ("loragate_replica", True, False),
    ("loragate_signing", True, True),
    ("loragate_activation", True, True),
    ("loragate_training", True, False),
    ("loragate_admin", True, False),
    ("loragate_fleet", True, False),
]


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize(("user", "reads", "writes"), GRANTS, ids=[g[0] for g in GRANTS])
def test_who_reads_and_who_changes_a_canary_share(windowed, user, reads, writes):
    registry, window_id, _ = windowed
    engine = as_user(registry.settings.database_url, user)
    try:
        assert attempt(engine, SPLIT_READ, window_id) == (1 if reads else 0)
        if writes:
            assert attempt(engine, SET_SHARE, window_id) == 1
        else:
            assert refused_for_privilege(engine, SET_SHARE, window_id)
    finally:
        engine.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize(
    "statement",
    [
        "SELECT thresholds FROM canary_windows WHERE id = :w",
        "SELECT reason FROM canary_windows WHERE id = :w",
        "UPDATE canary_windows SET status = 'promoted' WHERE id = :w",
    ],
)
def test_the_replica_user_reads_only_the_split_columns_of_a_window(windowed, statement):
    registry, window_id, _ = windowed
    engine = as_user(registry.settings.database_url, "loragate_replica")
    try:
        assert refused_for_privilege(engine, statement, window_id)
    finally:
        engine.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_downgrade_revokes_the_share_grants_and_upgrade_restores_them(windowed):
    registry, window_id, engine = windowed
    replica = as_user(registry.settings.database_url, "loragate_replica")
    try:
        migrate.downgrade(engine, "0010")
        assert refused_for_privilege(replica, "SELECT id FROM canary_windows WHERE id = :w", window_id)
        migrate.upgrade(engine)
        assert attempt(replica, SPLIT_READ, window_id) == 1
    finally:
        replica.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_the_application_as_each_database_user_changes_a_share_and_records_alerts_within_its_grants(windowed):
    """What the real code paths write: signing and activation change a share (up to the
    cap: above it, migration 0012's rules, tests/test_canary_rules_in_sql.py), the fleet
    records a traffic alert (its advisory lock and insert need no grant beyond the audit
    log's) but cannot change a share -- the database refuses it, whatever the application
    was told."""
    from loragate.registry.errors import PermissionDenied
    from loragate.registry.service import Registry
    from tests.support.registries import IN_PROCESS

    registry, window_id, engine = windowed

    def as_role(role: str) -> Registry:
        url = make_url(registry.settings.database_url).set(username=f"loragate_{role}")
        settings = registry.settings.model_copy(update={"database_url": url.render_as_string(hide_password=False)})
        return Registry.open(settings, principal=IN_PROCESS)

    for role, share in (("signing", 0.3), ("activation", 0.45)):
        with as_role(role) as acting:
            assert acting.set_canary_share(NAME, share, reason=role).share == share
    with as_role("fleet") as fleet:
        assert fleet.record_traffic_alert(NAME, "fallback_rate", {"replica": "http://r:1"}) is True
        assert fleet.record_traffic_alert(NAME, "fallback_rate", {"replica": "http://r:1"}) is False
        with pytest.raises(PermissionDenied, match="loragate_fleet"):
            fleet.set_canary_share(NAME, 0.9)
    assert share_of(engine, window_id) == 0.45
