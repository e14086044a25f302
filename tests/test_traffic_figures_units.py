"""The replica's figures document (``GET /loragate/traffic``) outside vLLM, over the fake ASGI
app: what a query keeps (``adapter``, ``view=alerts``) and refuses, the fallback rate per
adapter, alert ids, the figures staying bounded however many windows pass (``LiveStats.prune``)
and the document written off the event loop. The split's routing and counting:
tests/test_traffic_split_units.py."""

from __future__ import annotations

import asyncio
import json
import threading
from array import array

import pytest
from loragate_resolver import figures, registry_reader, routing
from loragate_resolver.fallbacks import BUCKETS
from loragate_resolver.fallbacks import USERS_KEPT as FALLBACK_USERS_KEPT
from loragate_resolver.live_stats import (
    ENDED_WINDOW_KEEP_S,
    ENDED_WINDOWS_KEPT,
    OUTSIDE_SAMPLES,
    SAMPLES,
    LiveStats,
)
from loragate_resolver.residency import ResidencyGuard

from tests.support.split import BUCKET_KEY, KEY, NAME, FakeVllm, _split, ask, call, window

OTHER = "acme/tiny-llama/other"
ADMIN = [(b"x-loragate-admin-key", KEY.encode())]


def traffic(split, query: bytes = b"") -> tuple[int, dict]:
    status, _, body = call(split, path="/loragate/traffic", method="GET", headers=ADMIN, query=query)
    return status, json.loads(body)


def two_adapters(split_env) -> object:
    """NAME in window 9 whose canary c1 fails (its breaker trips), OTHER on production q1."""
    split_env.write_text(json.dumps({"c1": {"error": True}}))
    split = _split(FakeVllm(), window(9, "c1", 1.0))
    split.routes[OTHER] = routing.Route(OTHER, "q1")
    for i in range(3):
        ask(split, user=f"n{i}")
        ask(split, user=f"o{i}", model=OTHER)
    return split


class Clock:
    def __init__(self, at: float = 1_000_000.0) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


class Refusing(FakeVllm):
    """Every version and the base refuse every request with 400: the client's own fault."""

    def __init__(self) -> None:
        super().__init__()
        self.statuses = type("EveryName", (dict,), {"get": lambda self, key, default=None: 400})()


def test_pinning_counts_answered_requests_at_most_five_a_user_over_15_minutes(split_env):
    split = _split(FakeVllm(), routing.Route(NAME, "p1"))
    split.routes[OTHER] = routing.Route(OTHER, "q1")
    for _ in range(60):
        ask(split, user="flood")  # one caller's flood: five of its requests count
    for i in range(3):
        ask(split, user=f"real-{i}", model=OTHER)
    split.app = Refusing()
    for i in range(60):  # answered by no version: 60 free 400s buy nothing
        assert ask(split, user=f"free-{i}")[0] == 400
    rates = split.figures()["fallback_15m_by_adapter"]
    assert (rates[NAME]["requests"], rates[NAME]["pinning"]) == (120, 5)
    assert rates[OTHER]["pinning"] == 3


def test_pinning_demand_forgets_requests_older_than_15_minutes_and_stays_bounded_in_users():
    wall = Clock(60 * 100_000.0)
    stats = LiveStats(clock=wall)
    for i in range(FALLBACK_USERS_KEPT + 100):
        stats.finished(NAME, False, f"u{i}", answered=True)
    assert len(stats.pinning.users[NAME]) == FALLBACK_USERS_KEPT
    assert stats.fallback_rates()[NAME]["pinning"] == FALLBACK_USERS_KEPT
    wall.at += 10 * 60
    stats.finished(NAME, False, "late", answered=True)
    stats.finished(NAME, False, "late", answered=False)  # an unanswered request counts for nothing
    wall.at += 5 * 60 + 1
    assert stats.fallback_rates()[NAME]["pinning"] == 1
    wall.at += 15 * 60
    stats.prune({})
    assert stats.pinning.users == {}


# -- the query -------------------------------------------------------------------------------


def test_a_filtered_read_holds_only_the_adapters_asked_for(split_env):
    split = two_adapters(split_env)
    status, only_other = traffic(split, b"adapter=" + OTHER.replace("/", "%2F").encode())
    assert status == 200
    assert {v["adapter"] for v in only_other["versions"]} == {OTHER}
    assert set(only_other["routes"]) == {OTHER} and only_other["alerts"] == []
    assert set(only_other["fallback_15m_by_adapter"]) == {OTHER}
    _, only_name = traffic(split, f"adapter={NAME}".encode())
    assert {v["adapter"] for v in only_name["versions"]} == {NAME} and set(only_name["routes"]) == {NAME}
    assert [(a["kind"], a["adapter"]) for a in only_name["alerts"]] == [("breaker_open", NAME)]
    _, both = traffic(split, f"adapter={NAME}&adapter={OTHER}".encode())
    assert both["versions"] == traffic(split)[1]["versions"] and set(both["routes"]) == {NAME, OTHER}
    _, unseen = traffic(split, b"adapter=nobody%2Fhas%2Fthis")  # not seen here yet: no figures, no error
    assert (unseen["versions"], unseen["routes"], unseen["alerts"]) == ([], {}, [])


def test_the_alerts_view_has_no_versions_but_every_adapters_alerts_and_fallback_rates(split_env):
    split = two_adapters(split_env)
    status, watched = traffic(split, b"view=alerts")
    assert status == 200 and watched["versions"] == []
    assert [a["adapter"] for a in watched["alerts"]] == [NAME]
    assert set(watched["fallback_15m_by_adapter"]) == {NAME, OTHER}
    assert watched["fallback_15m"] == traffic(split)[1]["fallback_15m"]


@pytest.mark.parametrize(
    ("query", "param"),
    [
        (b"view=everything", "view"),
        (b"view=alerts&view=alerts", "view"),
        (b"colour=red", "colour"),
        (b"adapter=", "adapter"),
        (b"adapter", None),  # no value at all
        (b"adapter=%ff", None),  # not UTF-8 once decoded
        (b"adapter=\xff", None),  # not UTF-8 as sent
    ],
)
def test_a_query_the_figures_do_not_take_is_a_400_that_says_why(split_env, query, param):
    split = _split(FakeVllm(), routing.Route(NAME, "p1"))
    status, refused = traffic(split, query)
    assert status == 400 and refused["error"]["type"] == "BadRequestError"
    assert refused["error"]["param"] == param and refused["error"]["message"]


def test_no_query_serves_the_whole_document_as_the_sync_figures_give_it(split_env):
    split = two_adapters(split_env)
    status, served = traffic(split)
    assert status == 200 and served == {**split.figures(), "replica": "h:1"}
    assert set(served) >= {"versions", "routes", "alerts", "fallback_15m", "fallback_15m_by_adapter", "kept"}


# -- fallback rates --------------------------------------------------------------------------


def test_one_adapter_falling_back_does_not_show_on_another(split_env):
    split = two_adapters(split_env)
    rates = split.figures()["fallback_15m_by_adapter"]
    assert rates == {
        NAME: {"requests": 3, "fallbacks": 3, "pinning": 3},
        OTHER: {"requests": 3, "fallbacks": 0, "pinning": 3},
    }
    assert split.figures()["fallback_15m"] == {"requests": 6, "fallbacks": 3}  # the replica's sum, as before


def test_fallback_minutes_older_than_15_are_dropped_and_at_most_15_kept_per_adapter():
    wall = Clock(60 * 100_000.0)
    stats = LiveStats(clock=wall)
    stats.finished(NAME, True)
    wall.at += (BUCKETS - 1) * 60  # the 15th minute: still in
    stats.finished(OTHER, False)
    assert stats.fallback_rates() == {
        NAME: {"requests": 1, "fallbacks": 1, "pinning": 0},
        OTHER: {"requests": 1, "fallbacks": 0, "pinning": 0},
    }
    wall.at += 60
    assert stats.fallback_rates() == {OTHER: {"requests": 1, "fallbacks": 0, "pinning": 0}}
    assert stats.fallback_rate() == {"requests": 1, "fallbacks": 0}
    for _ in range(100):  # a busy adapter, minute after minute
        stats.finished(OTHER, False)
        wall.at += 60
    assert len(stats.fallbacks.buckets[OTHER]) <= BUCKETS
    stats.prune({})
    assert NAME not in stats.fallbacks.buckets  # no request in 15 minutes: gone
    wall.at += 20 * 60
    stats.prune({})
    assert stats.fallbacks.buckets == {} and stats.fallback_rate() == {"requests": 0, "fallbacks": 0}


# -- alerts ----------------------------------------------------------------------------------


def test_an_alerts_id_differs_between_trips_and_processes_and_is_stable_across_reads(split_env):
    split = two_adapters(split_env)
    split.stats.alert("breaker_open", OTHER, "q1", None, "second trip")
    first = [a["id"] for a in traffic(split)[1]["alerts"]]
    assert len(first) == len(set(first)) == 2
    assert first == [a["id"] for a in traffic(split, b"view=alerts")[1]["alerts"]]
    assert {"at", "kind", "adapter", "version", "window", "reason"} <= set(traffic(split)[1]["alerts"][0])
    restarted = LiveStats().alert("breaker_open", NAME, "c1", 9, "again")
    assert restarted["id"] not in first  # a restarted replica's first trip is a new one


# -- bounded memory --------------------------------------------------------------------------


def test_samples_are_c_doubles_and_fewer_outside_a_window_where_productions_p99_still_comes():
    stats = LiveStats()
    for i in range(OUTSIDE_SAMPLES + 100):
        stats.answered(NAME, "p1", None, error=False, latency_ms=1.0, ttft_ms=None, ms_per_token=float(i % 100))
        stats.answered(NAME, "p1", 4, error=False, latency_ms=1.0, ttft_ms=None, ms_per_token=1.0)
    outside, inside = stats.of(NAME, "p1", None), stats.of(NAME, "p1", 4)
    assert isinstance(outside.ms_per_token.values, array) and outside.ms_per_token.values.typecode == "d"
    assert len(outside.ms_per_token) == OUTSIDE_SAMPLES and inside.ms_per_token.size == SAMPLES
    assert stats.production_p99(NAME, "p1") is not None


def test_unrouted_versions_and_their_closed_breakers_go_once_idle_and_routed_ones_stay(split_env):
    split = _split(FakeVllm(), routing.Route(NAME, "p0"))
    mono = Clock(0.0)
    split.stats = LiveStats(monotonic=mono)
    ask(split)
    split.routes = {NAME: routing.Route(NAME, "p1")}  # p0 is no longer production
    ask(split)
    mono.at += ENDED_WINDOW_KEEP_S - 1
    split.prune()
    assert {(a, v) for a, v, _ in split.stats.versions} == {(NAME, "p0"), (NAME, "p1")}
    mono.at += 1
    split.prune()
    assert set(split.stats.versions) == {(NAME, "p1", None)}  # routed: kept however idle
    assert set(split.breakers) == {(NAME, "p1")}


def test_the_figures_stay_bounded_after_1000_windows_and_the_active_window_is_always_kept(split_env, monkeypatch):
    split = _split(FakeVllm(), routing.Route(NAME, "p1"))
    wall, mono = Clock(), Clock(0.0)
    split.stats = LiveStats(clock=wall, monotonic=mono)
    table: dict = {}
    split.guard = ResidencyGuard(None, clock=mono)
    monkeypatch.setattr(registry_reader, "routes_with_pins", lambda _: registry_reader.RouteRows(*table["rows"], []))
    sizes, most_entries, created = [], 0, set()

    async def request(path: str, body: dict | None, method: str = "POST") -> tuple[int, bytes]:
        sent: list[dict] = []
        raw = json.dumps(body).encode() if body else b""

        async def receive():
            return {"type": "http.request", "body": raw, "more_body": False}

        async def send(message):
            sent.append(message)

        headers = [] if body else ADMIN  # a client's request; the fleet's read of the figures
        scope = {"type": "http", "method": method, "path": path, "query_string": b"", "headers": headers}
        await split(scope, receive, send)
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

    async def windows() -> None:  # one loop for all of them: a thousand asyncio.run cost seconds
        nonlocal most_entries
        for window_id in range(1000):
            table["rows"] = ([(NAME, "p1")], [(window_id, NAME, f"c{window_id}", 0.5, BUCKET_KEY)])
            assert await split.refresh()  # a routes read: the prune
            for user in (f"a{window_id}", f"b{window_id}"):
                assert (await request("/v1/completions", {"model": NAME, "prompt": "hi", "user": user}))[0] == 200
            # windows a second apart, then a minute apart: the cap binds first, then the idle time
            step = 1.0 if window_id < 500 else 60.0
            wall.at, mono.at = wall.at + step, mono.at + step
            created.update(split.stats.versions)
            most_entries = max(most_entries, len(split.stats.versions))
            assert any(w == window_id for _, _, w in split.stats.versions)
            if window_id % 50 == 49:
                status, body = await request("/loragate/traffic", None, "GET")
                document = json.loads(body)
                assert status == 200 and any(v["window"] == window_id for v in document["versions"])
                sizes.append(len(body))
                assert sum(len(v["units"]["counts"]) for v in document["versions"]) <= 2 * (ENDED_WINDOWS_KEPT + 2)

    asyncio.run(windows())
    assert most_entries <= ENDED_WINDOWS_KEPT + 2  # the active window's sides on top of the cap
    assert max(sizes) < 100_000 and len(split.breakers) <= ENDED_WINDOWS_KEPT + 3
    # a minute apart, only the windows of the last 15 minutes are kept
    kept = split.figures()["kept"]
    assert kept["entries"] <= 2 * (ENDED_WINDOW_KEEP_S // 60 + 1)
    assert kept["ended_windows_dropped"] == len(created) - kept["entries"]


# -- off the event loop ----------------------------------------------------------------------


def test_the_document_is_written_off_the_event_loop_while_other_requests_keep_running(split_env, monkeypatch):
    split = _split(FakeVllm(), routing.Route(NAME, "p1"))
    entries = 60
    for window_id in range(entries):  # full reservoirs: the document of a busy replica
        stats = split.stats.of(NAME, f"v{window_id}", window_id)
        for reservoir in (stats.latency_ms, stats.ttft_ms, stats.ms_per_token):
            reservoir.values = array("d", range(SAMPLES))
    dumped: list[tuple[int, object]] = []  # (thread, what one json.dumps call wrote)

    class RecordedJson:
        @staticmethod
        def dumps(payload):
            dumped.append((threading.get_ident(), payload))
            return json.dumps(payload)

    monkeypatch.setattr(figures, "json", RecordedJson)

    async def serve_while_streaming():
        ticks, done = 0, False

        async def other_request():
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0)

        streaming = asyncio.create_task(other_request())
        await asyncio.sleep(0)
        status, body = await figures.serve(split, {"query_string": b""})
        done = True
        await streaming
        return status, body, ticks, threading.get_ident()

    status, body, ticks, loop_thread = asyncio.run(serve_while_streaming())
    assert status == 200 and len(json.loads(body)["versions"]) == entries
    assert dumped and loop_thread not in {thread for thread, _ in dumped}
    # json.dumps holds the GIL until it returns: no call writes more than one entry's samples
    assert all("versions" not in payload for _, payload in dumped) and len(dumped) == entries + 1
    assert ticks >= entries // figures.YIELD_EVERY  # scheduled while the entries were copied, and after
