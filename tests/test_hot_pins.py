"""The traffic watch's hot pins (``tasks/hot_pins.py``) over a real registry (SQLite and
Postgres) whose production replicas' figures a test writes: each adapter's pinning demand of
the last 15 minutes (answered requests, at most five a user) summed over the production
replicas, never its raw request count, the busiest pinned within what each
replica's slots leave beside a person's pins, the pins replaced only when the set changed,
a base with an unreadable replica left as it was; ``loragate fleet watch`` does the same."""

from __future__ import annotations

import json

import pytest

from loragate.registry.errors import ErrorCode, ReplicaError
from loragate.registry.service import Registry
from loragate.tasks.hot_pins import recent_requests, repin_hot
from loragate.tasks.replicas import ReplicaClient
from loragate.tasks.traffic_watch import watch_fleet
from tests.support.commands import main_with_tokens, role_tokens
from tests.support.moves import promote
from tests.support.registries import audit_count, mark_validated

PRODUCTION = ["http://127.0.0.1:9101", "http://127.0.0.1:9102"]
CANARY = "http://127.0.0.1:9201"
SUPPORT, TICKETS, BILLING, SEARCH = (f"acme/tiny-llama/{t}" for t in ("support", "tickets", "billing", "search"))
# per production replica: each adapter's answered requests of the last 15 minutes, five a user at most
BUSY = {SUPPORT: 10, TICKETS: 50, BILLING: 20, SEARCH: 0}


@pytest.fixture
def fleet(cataloged, seeded_bundles, tmp_path) -> Registry:
    """Four adapters in production; two production replicas of 3 slots (no warm copy: 2 may
    be pinned) and a canary replica."""
    registry, _ = cataloged
    for bundle, name in zip(seeded_bundles, BUSY, strict=True):
        version = registry.register_adapter(bundle, name).version.version_id
        mark_validated(registry, version)
        promote(registry, version, "canary")
        promote(registry, version, "production")
    for url in PRODUCTION:
        registry.add_replica(url, "tiny-llama", "production", str(tmp_path / "adapters"), max_loras=3)
    registry.add_replica(CANARY, "tiny-llama", "canary", str(tmp_path / "adapters"))
    return registry


@pytest.fixture
def figures(monkeypatch):
    """Each replica answers ``GET /loragate/traffic`` with the requests in ``counts``; a
    replica named in ``down`` is unreachable; the replicas read are recorded."""
    counts = dict(BUSY)
    down: set[str] = set()
    read: list[str] = []

    def traffic(client, adapters=None, *, alerts_only=False):
        read.append(client.url)
        if client.url in down:
            raise ReplicaError(f"replica {client.url} unreachable", code=ErrorCode.REPLICA_UNAVAILABLE, field="url")
        # the raw request count is a flood's: ten times the demand, and never what pins
        rates = {
            a: {"requests": 10 * counts[a], "fallbacks": 0, "pinning": counts[a]} for a in adapters if counts.get(a)
        }
        return {"versions": [], "routes": {}, "alerts": [], "fallback_15m_by_adapter": rates}

    monkeypatch.setattr(ReplicaClient, "traffic", traffic)
    return counts, down, read


def watch_and_repin(registry: Registry):
    watched = watch_fleet(registry)
    return repin_hot(registry, *recent_requests(watched.figures, watched.names))


def hot(registry: Registry) -> list[str]:
    return sorted(p.name for p in registry.pins() if p.source == "hot")


def test_pinning_demand_is_summed_over_the_production_replicas_only(fleet, figures):
    _, down, read = figures
    watched = watch_fleet(fleet)
    assert sorted(set(read)) == PRODUCTION
    assert recent_requests(watched.figures, watched.names) == ({SUPPORT: 20, TICKETS: 100, BILLING: 40, SEARCH: 0}, [])
    down.add(PRODUCTION[1])
    watched = watch_fleet(fleet)
    assert recent_requests(watched.figures, watched.names) == (
        {SUPPORT: 10, TICKETS: 50, BILLING: 20, SEARCH: 0},
        ["tiny-llama"],
    )


def test_the_busiest_are_pinned_within_the_slots_a_persons_pins_leave_and_only_changes_are_written(fleet, figures):
    counts, _, _ = figures
    assert fleet.hot_pin_limits() == {"tiny-llama": 2}  # 3 slots - 0 warm - 1 free
    first = watch_and_repin(fleet)
    assert (first.hot, first.added, first.removed) == ([BILLING, TICKETS], [BILLING, TICKETS], [])
    assert hot(fleet) == [BILLING, TICKETS]
    before = audit_count(fleet)
    again = watch_and_repin(fleet)
    assert (again.added, again.removed) == ([], []) and audit_count(fleet) == before  # the same set: no write
    fleet.pin(SUPPORT)  # a person's pin takes one of the two
    third = watch_and_repin(fleet)
    assert (third.added, third.removed) == ([], [BILLING]) and hot(fleet) == [TICKETS]
    counts[SEARCH] = 500
    assert watch_and_repin(fleet).added == [SEARCH] and hot(fleet) == [SEARCH]
    plan = fleet.residency_plan("tiny-llama", memory=False)
    assert plan.pinned == 2 and plan.floor <= 3 - 1  # one slot left on each production replica


def test_a_base_with_an_unreadable_replica_keeps_its_hot_pins_and_idle_adapters_lose_theirs(fleet, figures):
    counts, down, _ = figures
    watch_and_repin(fleet)
    assert hot(fleet) == [BILLING, TICKETS]
    down.add(PRODUCTION[0])
    for name in counts:
        counts[name] = 0
    kept = watch_and_repin(fleet)
    assert (kept.added, kept.removed, kept.kept_unread) == ([], [], ["tiny-llama"]) and hot(fleet) == [BILLING, TICKETS]
    down.clear()
    gone = watch_and_repin(fleet)
    assert gone.removed == [BILLING, TICKETS] and hot(fleet) == []


def test_hot_pins_off_pins_nothing_hot(fleet, figures):
    with Registry.open(fleet.settings.model_copy(update={"hot_pins": 0}), principal=fleet.principal) as off:
        assert watch_and_repin(off).hot == [] and hot(off) == []


def test_fleet_watch_re_chooses_the_hot_pins_once(fleet, figures, monkeypatch, capsys):
    monkeypatch.setenv("LORAGATE_DATABASE_URL", fleet.settings.database_url)
    monkeypatch.setenv("LORAGATE_ARTIFACTS", fleet.settings.artifacts)
    assert main_with_tokens(role_tokens(fleet), ["fleet", "watch", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["alerts"] == [] and shown["unreadable"] == []
    assert shown["hot_pins"] == {
        "hot": [BILLING, TICKETS],
        "added": [BILLING, TICKETS],
        "removed": [],
        "kept_unread": [],
    }
    assert main_with_tokens(role_tokens(fleet), ["fleet", "watch"]) == 0
    assert capsys.readouterr().out.strip() == "no new traffic alert"
    [event] = [e for e in fleet.history(TICKETS) if e.action == "pin"]
    assert event.actor.startswith("fleet-tests (fleet token") and event.to_value == "hot"
