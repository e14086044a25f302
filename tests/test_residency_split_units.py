"""The residency guard inside the live split, over the fake vLLM and a fake engine
(tests/support/split.py): a replica over its eviction cap answers from the base with the
fallback header, charged to no version; the last version of a chain is never refused; a
cold attempt is timed; pinned adapters are pinned once, within ``capacity - 1``, and stay
resident through a storm; a pin whose name moved to a new id is released; the figures carry
``residency``; the pins are read with the routes, and an older registry pins nothing. The
guard alone: tests/test_residency_guard.py."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import sys
import types

import loragate_resolver
import pytest
from loragate_resolver import engine_cache, registry_reader, routing
from loragate_resolver.engine_cache import STALE_PIN_S, EngineCache
from loragate_resolver.residency import ResidencyGuard
from prometheus_client import REGISTRY

from tests.support.split import KEY, NAME, FakeEngine, FakeVllm, _split, ask, call

ADMIN = [(b"x-loragate-admin-key", KEY.encode())]
BASE = "tiny-llama"


class Clock:
    def __init__(self, at: float = 0.0) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


def adapters(count: int, prefix: str) -> list[str]:
    return [f"{prefix}-{i}/tiny-llama/task" for i in range(count)]


def replica(names, capacity, min_residency_s=0.0, evictions=100, pins=(), role="production"):
    """A split routing ``names`` (production p1 each) over a fake engine of ``capacity``,
    its guard and pins on a clock the test moves."""
    engine = FakeEngine(capacity)
    app = FakeVllm(engine=engine)
    split = _split(app, None)
    split.role = role
    split.routes = {n: routing.Route(n, "p1") for n in names}
    clock = Clock()
    split.guard = ResidencyGuard(None, min_residency_s, evictions, clock)
    split.engine_cache = EngineCache(clock)
    split.pins = list(pins)
    return split, app, engine, clock


def served(name: str) -> str:
    """The split's name for p1: the plain name where the index names p1 (NAME), else qualified."""
    return name if name == NAME else f"{name}@p1"


def sample(family: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(family, labels) or 0.0


@pytest.fixture
def pinnable(monkeypatch):
    monkeypatch.setattr(loragate_resolver, "_pins_off_the_gpu", True)


def tend(split) -> None:
    """The engine asked now, whatever ``TEND_EVERY_S`` says (``due`` is tested on its own)."""
    split.engine_cache._tended_at = split.engine_cache._tended_for = None
    asyncio.run(split.engine_cache.tend(split))


# -- the guard in the chain -----------------------------------------------------------------


def test_a_replica_over_its_eviction_cap_answers_from_the_base_with_the_fallback_header_charged_to_no_version(
    split_env,
):
    names = [NAME, *adapters(3, "cap")]
    split, app, engine, _ = replica(names, capacity=2, evictions=1)
    refused = names[3]
    before = sample("loragate_fallbacks_total", adapter=refused, reason="production_residency:eviction_cap")
    for name in names[:3]:  # two cold loads fill the cache, the third evicts: the cap of 1 is reached
        assert ask(split, model=name, app=engine.app)[1][b"x-loragate-version"] == b"p1"
    status, headers, _ = ask(split, model=refused, app=engine.app)
    assert status == 200 and app.asked[-1] == BASE
    assert headers[b"x-loragate-version"] == b"base"
    assert headers[b"x-loragate-fallback"] == b"production_residency:eviction_cap"
    assert (refused, "p1", None) not in split.stats.versions  # no version is charged
    assert split.stats.versions[(refused, "base", None)].requests == 1
    # answered by the base: demand the pins count, as a request the adapter answered would be
    assert split.figures()["fallback_15m_by_adapter"][refused] == {"requests": 1, "fallbacks": 1, "pinning": 1}
    assert sample("loragate_fallbacks_total", adapter=refused, reason="production_residency:eviction_cap") == before + 1
    assert served(refused) not in engine.lora_requests  # vLLM never saw it


def test_a_refused_canary_goes_on_to_production_and_a_version_with_no_later_one_is_never_refused(split_env):
    split, app, engine, _ = replica([NAME], capacity=1, min_residency_s=30.0)
    split.routes[NAME] = routing.Route(NAME, "p1", 9, "c1", 1.0, "b" * 64)  # everyone to the canary
    split.base_name = None  # production is the chain's last version
    first = ask(split, app=engine.app)[1]
    assert first[b"x-loragate-version"] == b"c1" and split.guard.resident() == [f"{NAME}@c1"]
    _, headers, _ = ask(split, user="bob", app=engine.app)  # c1 hit; production would evict it within 30 s
    assert headers[b"x-loragate-version"] == b"c1"
    split.guard.forget([f"{NAME}@c1"])
    split.guard.admit("someone-else@x")  # the cache full of a name used just now
    _, headers, _ = ask(split, user="carol", app=engine.app)
    assert (
        headers[b"x-loragate-version"] == b"p1" and headers[b"x-loragate-fallback"] == b"canary_residency:min_residency"
    )
    assert app.asked[-1] == NAME  # production, the last version, was sent though the cache was full


def test_a_canary_replicas_one_version_is_never_refused(split_env):
    split, app, engine, _ = replica(adapters(3, "canary-role"), capacity=1, evictions=0, role="canary")
    for name in split.routes:
        status, headers, _ = ask(split, model=name, app=engine.app)
        assert status == 200 and b"x-loragate-fallback" not in headers
    assert split.guard.figures()["totals"]["refused"] == 0


def test_a_cold_attempt_is_timed_and_its_first_token_counted_cold_then_warm(split_env):
    name = adapters(1, "timed")[0]
    split, _, engine, _ = replica([name], capacity=4)
    ask(split, model=name, app=engine.app, stream=True)
    ask(split, model=name, app=engine.app, stream=True)
    figures = split.figures()["residency"]
    assert figures["cold_loads"] == 1 and figures["cold_load_p50_ms"] is not None
    assert figures["adapters"][served(name)] == {"hits": 1, "misses": 1, "refused": 0, "evictions": 0}
    for residency in ("cold", "warm"):
        count = sample("loragate_first_token_by_residency_seconds_count", adapter=name, residency=residency)
        assert count == 1
    assert sample("loragate_lora_cache_total", adapter=name, outcome="cold") == 1
    assert sample("loragate_lora_cold_load_seconds_count", adapter=name) == 1


def test_a_version_answering_404_leaves_the_guards_model(split_env):
    name = adapters(1, "gone")[0]
    split, app, engine, _ = replica([name], capacity=4)
    app.statuses[served(name)] = 404
    assert ask(split, model=name, app=engine.app)[1][b"x-loragate-version"] == b"base"
    assert split.guard.resident() == []


def test_the_capacity_is_the_engines_max_cpu_loras_taken_from_the_apps_state(split_env):
    split, _, engine, _ = replica([NAME], capacity=3)
    assert split.guard.capacity is None  # no request seen: nothing known, nothing refused
    ask(split, app=engine.app)
    assert split.guard.capacity == 3 and split.app_state is engine.app.state


# -- pins -----------------------------------------------------------------------------------


def test_a_pinned_adapter_is_pinned_once_and_stays_resident_through_a_storm(split_env, pinnable):
    others = adapters(40, "storm")
    split, _, engine, clock = replica([NAME, *others], capacity=4, evictions=10**6, pins=[NAME])
    engine_cache.adopt(split, engine.app)
    tend(split)  # not loaded yet: nothing to pin, and it takes no room in the guard
    assert engine.pin_calls == [] and split.guard.pinned() == {NAME}
    ask(split, app=engine.app)
    tend(split)
    hot = engine.lora_requests[NAME].lora_int_id
    assert engine.pin_calls == [hot]
    for i in range(400):
        clock.at = i
        status, headers, _ = ask(split, model=others[(i * 7) % len(others)], app=engine.app)
        assert status == 200 and headers[b"x-loragate-version"] == b"p1"
        if i % 50 == 0:
            tend(split)
        assert hot in engine.registered and NAME in split.guard.resident()
    assert engine.pin_calls == [hot]  # once per (name, id)
    assert split.figures()["residency"]["adapters"][NAME]["evictions"] == 0


def test_at_most_capacity_less_one_ids_are_pinned_and_a_pin_kept_since_counts(split_env, pinnable, caplog):
    names = adapters(3, "budget")
    split, _, engine, _ = replica(names, capacity=3, pins=names)
    for name in names:
        ask(split, model=name, app=engine.app)
    with caplog.at_level(logging.WARNING, logger="loragate_resolver.engine_cache"):
        tend(split)
        tend(split)
    assert len(engine.pinned) == 2 and split.guard.pinned() == {served(n) for n in names[:2]}
    assert len([r for r in caplog.records if "not pinned" in r.getMessage()]) == 1  # once, not every read
    split.pins = [names[2]]  # unpinned in the registry: the engine keeps both pins (no unpin)
    tend(split)
    assert split.guard.pinned() == set() and len(engine.pinned) == 2


def test_a_pin_whose_name_was_loaded_again_under_a_new_id_is_released_after_a_while(split_env, pinnable):
    split, _, engine, clock = replica([NAME], capacity=4, pins=[NAME])
    ask(split, app=engine.app)
    tend(split)
    old = engine.lora_requests[NAME].lora_int_id
    engine.unload(NAME)  # a switch: unload, then a fresh load under a new id
    ask(split, app=engine.app)
    new = engine.lora_requests[NAME].lora_int_id
    tend(split)
    assert engine.pinned == {old, new}
    clock.at = STALE_PIN_S
    tend(split)
    assert engine.pinned == {new} and old not in engine.registered and split.engine_cache.ids == {new: NAME}


def test_the_engine_is_asked_only_after_requests_or_a_pin_change_and_at_most_every_fifteen_seconds(split_env):
    """Each call wakes vLLM's worker into a second of spinning: asked at every routes read, an
    idle replica's worker burned half a core."""
    split, _, engine, clock = replica([NAME], capacity=4)
    engine_cache.adopt(split, engine.app)
    calls = []
    original = engine.list_loras

    async def counted():
        calls.append(clock.at)
        return await original()

    engine.list_loras = counted

    def read_routes_every_second(seconds):
        for _ in range(seconds):
            clock.at += 1
            asyncio.run(split.engine_cache.tend(split))

    read_routes_every_second(120)
    assert len(calls) == 1  # once at the start, then idle: never again
    ask(split, app=engine.app)
    read_routes_every_second(60)
    assert len(calls) == 2 and calls[1] - calls[0] >= engine_cache.TEND_EVERY_S
    split.pins = [NAME]
    read_routes_every_second(60)
    assert len(calls) == 3


def test_nothing_is_pinned_where_vllms_pins_would_take_gpu_slots(split_env, monkeypatch):
    monkeypatch.setattr(loragate_resolver, "_pins_off_the_gpu", False)
    split, _, engine, _ = replica([NAME], capacity=4, pins=[NAME])
    ask(split, app=engine.app)
    tend(split)
    assert engine.pin_calls == [] and split.guard.pinned() == set()


def test_the_plugin_pins_in_the_cpu_cache_only(monkeypatch):
    calls: list[str] = []

    class LRUCacheLoRAModelManager:  # vLLM 0.32's, as far as pinning goes
        def pin_adapter(self, lora_id):
            self._pin_lora_in_cpu_cache(lora_id)
            self._pin_lora_in_gpu_cache(lora_id)
            return True

        def _pin_lora_in_cpu_cache(self, lora_id):
            calls.append("cpu")

        def _pin_lora_in_gpu_cache(self, lora_id):
            calls.append("gpu")

    module = types.ModuleType("vllm.lora.model_manager")
    module.LRUCacheLoRAModelManager = LRUCacheLoRAModelManager  # type: ignore[attr-defined]
    for name in ("vllm", "vllm.lora"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.lora.model_manager", module)
    monkeypatch.setattr(loragate_resolver, "_pins_off_the_gpu", False)
    loragate_resolver.pin_in_the_cpu_cache_only()
    loragate_resolver.pin_in_the_cpu_cache_only()  # applied once
    assert LRUCacheLoRAModelManager().pin_adapter(7) is True and calls == ["cpu"]
    assert loragate_resolver.pins_off_the_gpu()


def test_an_engine_that_does_not_answer_in_time_costs_the_read_its_deadline_only(split_env, monkeypatch, caplog):
    split, _, engine, _ = replica([NAME], capacity=4)
    ask(split, app=engine.app)

    async def never() -> set[int]:
        await asyncio.sleep(3600)
        return set()

    engine.list_loras = never  # type: ignore[method-assign]
    monkeypatch.setattr(engine_cache, "DEADLINE_S", 0.05)
    with caplog.at_level(logging.WARNING, logger="loragate_resolver.engine_cache"):
        tend(split)  # returns, raises nothing
    assert any("not tended" in r.getMessage() for r in caplog.records)


# -- the figures ------------------------------------------------------------------------------


def test_the_figures_document_carries_residency_filtered_like_the_rest(split_env):
    names = adapters(2, "figures")
    split, _, engine, _ = replica(names, capacity=4)
    for name in names:
        ask(split, model=name, app=engine.app)
    status, _, body = call(split, path="/loragate/traffic", method="GET", headers=ADMIN)
    document = json.loads(body)
    assert status == 200 and document["residency"]["capacity"] == 4
    assert set(document["residency"]["adapters"]) == {served(n) for n in names}
    query = b"adapter=" + names[0].replace("/", "%2F").encode()
    only = json.loads(call(split, path="/loragate/traffic", method="GET", headers=ADMIN, query=query)[2])
    assert set(only["residency"]["adapters"]) == {served(names[0])}
    alerts = json.loads(call(split, path="/loragate/traffic", method="GET", headers=ADMIN, query=b"view=alerts")[2])
    assert "adapters" not in alerts["residency"] and alerts["residency"]["resident"] == 2


# -- the pins in the registry ----------------------------------------------------------------


def registry(tmp_path, pins: str | None) -> str:
    """A secrets directory naming a SQLite registry with the tables the routes read, and
    ``pins``: the adapter_pins table's DDL (None: an older registry without it)."""
    path = tmp_path / "registry.db"
    with sqlite3.connect(path) as db:
        db.executescript(
            """CREATE TABLE adapters (id INTEGER, name TEXT);
            CREATE TABLE stage_pointers (adapter_id INTEGER, version_id TEXT, stage TEXT);
            CREATE TABLE canary_windows (id INTEGER, adapter_name TEXT, version_id TEXT, share REAL,
                                         bucket_key TEXT, status TEXT);
            INSERT INTO adapters VALUES (1, 'a/b/c'), (2, 'd/e/f');
            INSERT INTO stage_pointers VALUES (1, 'v1', 'production'), (2, 'v2', 'production');"""
        )
        if pins is not None:
            db.executescript(pins)
    secrets = tmp_path / "replica-secrets"
    secrets.mkdir()
    (secrets / "registry-url").write_text(f"sqlite:///{path}")
    return str(secrets)


PIN_TABLES = [
    ("an-older-registry", None, []),
    (
        "pinned-names",
        "CREATE TABLE adapter_pins (adapter_name TEXT, pinned_by TEXT);"
        "INSERT INTO adapter_pins VALUES ('d/e/f', 'x'), ('a/b/c', 'y'), ('a/b/c', 'z');",
        ["a/b/c", "d/e/f"],
    ),
]


@pytest.mark.parametrize(("ddl", "pins"), [c[1:] for c in PIN_TABLES], ids=[c[0] for c in PIN_TABLES])
def test_the_pins_are_read_with_the_routes_and_an_older_registry_pins_nothing(tmp_path, ddl, pins):
    rows = registry_reader.routes_with_pins(registry(tmp_path, ddl))
    assert sorted(rows.production) == [("a/b/c", "v1"), ("d/e/f", "v2")] and rows.windows == []
    assert (rows.pins, rows.pins_error) == (pins, None)


def test_a_pin_table_that_cannot_be_read_is_an_error_beside_the_routes_and_the_split_keeps_its_pins(
    tmp_path, split_env, monkeypatch, caplog
):
    secrets = registry(tmp_path, "CREATE TABLE adapter_pins (other TEXT);")
    rows = registry_reader.routes_with_pins(secrets)
    assert rows.production and rows.pins is None and rows.pins_error.code == "pins_unreadable"
    assert registry_reader.routes(secrets) == (rows.production, rows.windows)  # the routes as ever
    split = _split(FakeVllm(), None)
    split.pins = ["kept/x/y"]
    split.secrets_dir = secrets
    with caplog.at_level(logging.WARNING):
        assert asyncio.run(split._read()) and asyncio.run(split._read())
    assert split.pins == ["kept/x/y"] and set(split.routes) == {"a/b/c", "d/e/f"}
    assert len([r for r in caplog.records if "pins not read" in r.getMessage()]) == 1
