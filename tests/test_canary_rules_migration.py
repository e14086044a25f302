"""Migration 0012 on SQLite and Postgres, up, down and up again with windows in place: each
window opened before it gets a bucket key of its own, the database's cap starts at 50 %, and
the downgrade removes both (and, on Postgres, the rules' triggers), keeping every window.
"""

from __future__ import annotations

import re

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine

from loragate.registry.db import migrate
from loragate.registry.rules.canary import WindowStatus
from tests.support.moves import promote
from tests.support.registries import mark_validated, sql_engine

NAME = "acme/tiny-llama/support"
TRIGGERS = ("canary_windows_rules", "adapter_versions_enter_staging")


@pytest.fixture
def windowed(cataloged, seeded_bundles):
    """A closed window and an open one of NAME's canary."""
    registry, _ = cataloged
    v1 = registry.register_adapter(seeded_bundles[0], NAME).version.version_id
    mark_validated(registry, v1)
    promote(registry, v1, "canary")
    first, _ = registry.open_canary_window(v1)
    registry.close_canary_window(first.id, WindowStatus.ROLLED_BACK, "migration test")
    registry.open_canary_window(v1)
    engine = sql_engine(registry)
    yield engine
    engine.dispose()


def keys(engine: Engine) -> dict[int, str]:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT id, bucket_key FROM canary_windows")).all())


def triggers(engine: Engine) -> set[str]:
    if engine.dialect.name != "postgresql":
        return set()
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT tgname FROM pg_trigger WHERE tgname = ANY(:names)"), {"names": list(TRIGGERS)}
        )
        return {r.tgname for r in found}


def distinct_keys(found: dict[int, str]) -> bool:
    return len(set(found.values())) == len(found) and all(re.fullmatch(r"[0-9a-f]{64}", k) for k in found.values())


def test_downgrade_drops_keys_cap_and_rules_keeping_the_windows_and_upgrade_draws_new_keys(windowed):
    engine = windowed
    before = keys(engine)
    assert len(before) == 2 and distinct_keys(before)
    migrate.downgrade(engine, "0011")
    assert migrate.current_revision(engine) == "0011"
    assert "registry_limits" not in inspect(engine).get_table_names()
    assert "bucket_key" not in {c["name"] for c in inspect(engine).get_columns("canary_windows")}
    assert triggers(engine) == set()
    with engine.connect() as conn:
        statuses = dict(conn.execute(text("SELECT id, status FROM canary_windows")).all())
    assert sorted(statuses.values()) == ["open", "rolled_back"]

    migrate.upgrade(engine)
    after = keys(engine)
    assert set(after) == set(before) and distinct_keys(after) and not set(after.values()) & set(before.values())
    with engine.connect() as conn:
        assert conn.execute(text("SELECT id, canary_max_share FROM registry_limits")).all() == [(1, 0.5)]
    if engine.dialect.name == "postgresql":
        assert triggers(engine) == set(TRIGGERS)
