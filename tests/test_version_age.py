"""A production version older than ``LORAGATE_VERSION_AGE_ALERT_DAYS`` is an alert of the
always-on watch (``tasks/traffic_watch.aged_alerts``), from the registry alone: when the
production pointer last moved (``AdapterPointers.production_since``, on SQLite and Postgres),
announced once per version -- a newer production version is news again, the same old one is not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update

from loragate.registry.db.schema import stage_pointers
from loragate.registry.rules.fleet import AdapterPointers
from loragate.tasks.traffic_watch import aged_alerts, watch_fleet
from tests.support.moves import promote
from tests.support.registries import mark_validated

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
NAME = "acme/tiny-llama/support"


@pytest.mark.parametrize(
    ("days", "production", "alerts"),
    [
        (29.9, "v1", 0),  # within the seeds' 30 days
        (30.1, "v1", 1),
        (400.0, "v1", 1),
        (400.0, None, 0),  # nothing in production: nothing users get is old
    ],
)
def test_only_a_production_version_older_than_the_limit_is_an_alert(days, production, alerts):
    pointers = [AdapterPointers(NAME, "tiny-llama", None, production, None, NOW - timedelta(days=days))]
    found = aged_alerts(pointers, NOW, 30.0)
    assert len(found) == alerts
    if found:
        assert found[0].kind == "version_age" and found[0].version_id == "v1" and found[0].occurrence == "v1"
        assert f"{days:.0f} days" in found[0].detail


def test_a_version_that_has_never_moved_to_production_has_no_age():
    assert aged_alerts([AdapterPointers(NAME, "tiny-llama", "v1", None)], NOW, 30.0) == []


@pytest.fixture
def in_production(cataloged, seeded_bundles):
    registry, _ = cataloged
    version = registry.register_adapter(seeded_bundles[0], NAME).version.version_id
    mark_validated(registry, version)
    promote(registry, version, "canary")
    promote(registry, version, "production")
    return registry, version


def test_production_since_is_when_the_production_pointer_moved(in_production):
    registry, version = in_production
    (pointers,) = registry.adapter_pointers()
    assert pointers.production == version and pointers.production_since is not None
    assert abs((datetime.now(UTC) - pointers.production_since).total_seconds()) < 120


def test_an_old_production_version_is_announced_once_by_the_watch(in_production):
    registry, version = in_production
    with registry._store.db.write() as conn:  # the pointer moved 40 days ago
        conn.execute(update(stage_pointers).values(moved_at=datetime.now(UTC) - timedelta(days=40)))
    first = watch_fleet(registry)
    assert [(a.kind, a.name, a.version_id) for a in first.alerts] == [("version_age", NAME, version)]
    assert watch_fleet(registry).alerts == []
