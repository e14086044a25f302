"""Migration 0013 on SQLite and Postgres, up, down and up again with windows in place: the
database accepts ``undecided`` only from an open window (Postgres' rules trigger, for the
roles' users); the downgrade turns undecided windows into ``rolled_back`` ones, saying so,
and refuses the status again; every other window and constraint is kept as it was."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from loragate.registry.db import migrate
from loragate.registry.rules.canary import Verdict, WindowStatus
from tests.support.moves import promote
from tests.support.registries import mark_validated, record_verdict, sql_engine

NAME = "acme/tiny-llama/support"


@pytest.fixture
def windowed(cataloged, seeded_bundles):
    """An undecided window, a rolled-back one and an open one of NAME's canary."""
    registry, _ = cataloged
    v1 = registry.register_adapter(seeded_bundles[0], NAME).version.version_id
    mark_validated(registry, v1)
    promote(registry, v1, "canary")
    undecided, _ = registry.open_canary_window(v1)
    record_verdict(registry, undecided.id, Verdict.UNDECIDED, "12 of 3358 canary requests")
    rolled_back, _ = registry.open_canary_window(v1)
    registry.close_canary_window(rolled_back.id, WindowStatus.ROLLED_BACK, "out of band")
    registry.open_canary_window(v1)
    engine = sql_engine(registry)
    yield engine
    engine.dispose()


def windows(engine: Engine) -> list[tuple[str, str | None]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text("SELECT status, reason FROM canary_windows ORDER BY id")).all()]


def set_status(engine: Engine, status: str) -> None:
    with engine.begin() as conn:
        conn.execute(text("UPDATE canary_windows SET status = :s WHERE status = 'open'"), {"s": status})


def test_downgrade_turns_undecided_into_rolled_back_and_refuses_it_and_upgrade_accepts_it_again(windowed):
    engine = windowed
    assert [s for s, _ in windows(engine)] == ["undecided", "rolled_back", "open"]
    migrate.downgrade(engine, "0012")
    assert migrate.current_revision(engine) == "0012"
    (first, first_reason), second, third = windows(engine)
    assert (
        first == "rolled_back" and first_reason == "undecided (migration 0013 downgraded): 12 of 3358 canary requests"
    )
    assert second == ("rolled_back", "out of band") and third == ("open", None)
    with pytest.raises(IntegrityError):
        set_status(engine, "undecided")
    assert [s for s, _ in windows(engine)][-1] == "open"

    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.HEAD
    set_status(engine, "undecided")
    assert [s for s, _ in windows(engine)] == ["rolled_back", "rolled_back", "undecided"]


def test_the_database_still_refuses_a_status_no_window_has(windowed):
    with pytest.raises(IntegrityError):
        set_status(windowed, "forgotten")
    assert [s for s, _ in windows(windowed)][-1] == "open"


def test_a_downgrade_to_before_the_share_column_still_drops_it_after_0013(windowed):
    """0013 rewrites SQLite's stored table in place, so 0011's column constraint stays a
    column constraint its downgrade can drop."""
    migrate.downgrade(windowed, "0010")
    assert migrate.current_revision(windowed) == "0010"
    migrate.upgrade(windowed)
    assert migrate.current_revision(windowed) == migrate.HEAD
