"""The fleet's reads of the replicas' live figures (``tasks/live_figures.py``) and the alerts
they raise (``tasks/traffic_watch.py``), over a real registry whose replicas' figures a test
writes: one read per production replica however many windows or adapters, each adapter
judged on its own part. The replica's side of the document: tests/test_traffic_figures_units.py;
on real replicas: tests/test_traffic_watch.py."""

from __future__ import annotations

import pytest

from loragate.registry.errors import ErrorCode, ReplicaError
from loragate.registry.rules.fleet import AdapterPointers
from loragate.tasks import live_figures
from loragate.tasks.replicas import ReplicaClient
from loragate.tasks.traffic_watch import alerts_in, watch_traffic

PRODUCTION = ["http://127.0.0.1:9101", "http://127.0.0.1:9102"]
CANARY = "http://127.0.0.1:9201"
NAMES = [f"acme/tiny-llama/tenant-{i:03d}" for i in range(130)]


@pytest.fixture
def fleet(cataloged, tmp_path):
    registry, _ = cataloged
    for url in PRODUCTION:
        registry.add_replica(url, "tiny-llama", "production", str(tmp_path / "adapters"))
    registry.add_replica(CANARY, "tiny-llama", "canary", str(tmp_path / "adapters"))
    return registry


@pytest.fixture
def replicas_figures(monkeypatch):
    """Each replica answers ``GET /loragate/traffic`` with one version entry per adapter
    asked; the reads are recorded, and a replica named in ``down`` is unreachable."""
    reads: list[tuple[str, tuple[str, ...], bool]] = []
    down: set[str] = set()

    def traffic(client, adapters=None, *, alerts_only=False):
        reads.append((client.url, tuple(adapters or ()), alerts_only))
        if client.url in down:
            raise ReplicaError(f"replica {client.url} unreachable", code=ErrorCode.REPLICA_UNAVAILABLE, field="url")
        return {
            "versions": [] if alerts_only else [{"adapter": a, "version": "v1", "window": 3} for a in adapters],
            "routes": {a: {"production": "v1"} for a in adapters},
            "alerts": [
                {"adapter": a, "kind": "breaker_open", "version": "v1", "id": f"{client.url}-1"} for a in adapters[:1]
            ],
            "fallback_15m_by_adapter": {a: {"requests": 100, "fallbacks": 1} for a in adapters},
        }

    monkeypatch.setattr(ReplicaClient, "traffic", traffic)
    return reads, down


def test_each_production_replica_is_read_once_per_64_adapters_however_many_windows(fleet, replicas_figures):
    reads, _ = replicas_figures
    figures = live_figures.read_live_figures(fleet, NAMES + NAMES[:10])  # a name twice: asked once
    assert sorted({url for url, _, _ in reads}) == PRODUCTION  # never the canary replica
    for url in PRODUCTION:
        chunks = [asked for u, asked, _ in reads if u == url]
        assert [len(c) for c in chunks] == [64, 64, 2]
        assert sorted(a for c in chunks for a in c) == NAMES
    part = figures.of(NAMES[70])
    assert len(part.documents) == 2 and not part.unreadable
    for document in part.documents:
        assert [v["adapter"] for v in document["versions"]] == [NAMES[70]]
        assert set(document["routes"]) == set(document["fallback_15m_by_adapter"]) == {NAMES[70]}
        assert document["replica"] in PRODUCTION


def test_an_unreadable_replica_is_named_for_every_adapter_of_its_base_and_the_others_still_read(
    fleet, replicas_figures
):
    _, down = replicas_figures
    down.add(PRODUCTION[1])
    figures = live_figures.read_live_figures(fleet, NAMES[:3])
    for name in NAMES[:3]:
        part = figures.of(name)
        assert [d["replica"] for d in part.documents] == [PRODUCTION[0]]
        assert len(part.unreadable) == 1 and part.unreadable[0].startswith(f"{PRODUCTION[1]}: ")


def test_an_adapter_of_another_base_has_no_figures_from_these_replicas(fleet, replicas_figures):
    figures = live_figures.read_live_figures(fleet, NAMES[:2])
    assert figures.of("acme/other-llama/support").documents == []


def _document(rates: dict[str, tuple[int, int]], trips: list[dict] | None = None) -> dict:
    return {
        "replica": PRODUCTION[0],
        "alerts": trips or [],
        "fallback_15m": {"requests": sum(r for r, _ in rates.values()), "fallbacks": sum(f for _, f in rates.values())},
        "fallback_15m_by_adapter": {name: {"requests": r, "fallbacks": f} for name, (r, f) in rates.items()},
    }


@pytest.mark.parametrize(
    ("rates", "alerted"),
    [
        # the replica-wide rate is 10 %: once it was charged to whichever adapter was judged
        ({NAMES[0]: (100, 20), NAMES[1]: (100, 0)}, {NAMES[0]}),
        ({NAMES[0]: (100, 5), NAMES[1]: (100, 5)}, set()),  # at the rate, not above it
        ({NAMES[0]: (19, 19)}, set()),  # too few requests for a rate
        ({NAMES[0]: (20, 2), NAMES[1]: (1000, 60)}, {NAMES[0], NAMES[1]}),
    ],
)
def test_a_fallback_rate_alert_is_the_adapters_own_rate(rates, alerted):
    document = _document(rates)
    raised = {a.name for name in rates for a in alerts_in([document], name, 0.05) if a.kind == "fallback_rate"}
    assert raised == alerted


def test_a_trip_alert_carries_the_trips_id_and_time():
    trip = {
        "adapter": NAMES[0],
        "kind": "breaker_open",
        "version": "v2",
        "id": "ab12-7",
        "at": "2026-11-29T08:00:00+00:00",
    }
    (alert,) = alerts_in([_document({}, [trip])], NAMES[0], 0.05)
    assert (alert.kind, alert.version_id, alert.occurrence) == ("breaker_open", "v2", "ab12-7")
    assert "2026-11-29T08:00:00" in alert.detail
    assert alerts_in([_document({}, [trip])], NAMES[1], 0.05) == []


def test_the_watch_reads_only_alerts_of_adapters_in_production_and_announces_a_trip_once(
    fleet, replicas_figures, monkeypatch
):
    reads, _ = replicas_figures
    in_production = AdapterPointers(NAMES[0], "tiny-llama", canary=None, production="v1")
    only_on_canary = AdapterPointers(NAMES[1], "tiny-llama", canary="v1", production=None)
    monkeypatch.setattr(fleet, "adapter_pointers", lambda base=None: [in_production, only_on_canary])
    first, unreadable = watch_traffic(fleet)
    assert not unreadable and {(a.kind, a.replica) for a in first} == {("breaker_open", url) for url in PRODUCTION}
    assert {asked for _, asked, _ in reads} == {(NAMES[0],)} and all(alerts_only for _, _, alerts_only in reads)
    again, _ = watch_traffic(fleet)
    assert again == []  # the same trips: already announced
