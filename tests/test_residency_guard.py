"""The residency guard on its own (``loragate_resolver.residency``), on an injected clock: hits,
cold loads and the LRU's eviction order; refusals for minimum residency, the eviction cap
(which recovers 60 s after the evictions it counts) and a cache full of pins; pinned names
never evicted, whatever the storm; the model corrected from the engine's list; figures bounded
whatever the spread of names; settings from the environment. Through the split:
tests/test_residency_split_units.py."""

from __future__ import annotations

import json
import logging
import math
import random

import pytest
from loragate_resolver import residency
from loragate_resolver.residency import COLD_SAMPLES, COUNTED, IDLE_S, ResidencyGuard

from tests.support import split as _plugin_on_the_path  # noqa: F401  # puts the plugin on sys.path


class Clock:
    def __init__(self, at: float = 0.0) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


def guard(capacity: int | None = 2, min_residency_s: float = 0.0, evictions: int = 100) -> tuple[ResidencyGuard, Clock]:
    clock = Clock()
    return ResidencyGuard(capacity, min_residency_s, evictions, clock), clock


def kinds(g: ResidencyGuard, names: str) -> list[tuple[str, str | None, str | None]]:
    return [(a.kind, a.evicted, a.reason) for a in (g.admit(n) for n in names.split())]


# -- hits, cold loads, the LRU ------------------------------------------------------------------


def test_a_resident_name_is_a_hit_and_a_new_one_cold_while_there_is_room():
    g, _ = guard(capacity=2)
    assert kinds(g, "a b a b") == [("cold", None, None), ("cold", None, None), ("hit", None, None), ("hit", None, None)]
    assert g.resident() == ["a", "b"]


def test_a_full_cache_evicts_its_least_recently_used_name_and_a_hit_makes_a_name_the_most_recent():
    g, _ = guard(capacity=2)
    assert [a.evicted for a in (g.admit(n) for n in ["a", "b", "a", "c", "d"])] == [None, None, None, "b", "a"]
    assert g.resident() == ["c", "d"]
    assert g.figures()["adapters"]["a"] == {"hits": 1, "misses": 1, "refused": 0, "evictions": 1}


# -- refusals -----------------------------------------------------------------------------------

# (capacity, min residency, evictions a minute, pinned, (seconds from the start, name) admitted
# in turn, the last admission's (kind, evicted, reason))
REFUSALS = [
    ("every-unpinned-resident-used-within-the-minimum", 2, 30.0, 5, (), [(0, "a"), (0, "b"), (29, "c")],
     ("refused", None, "min_residency")),
    ("the-least-recent-old-enough-goes-the-newer-stays", 2, 30.0, 5, (), [(0, "a"), (20, "b"), (30, "c")],
     ("cold", "a", None)),
    ("a-pinned-least-recent-name-is-passed-over", 2, 30.0, 5, ("a",), [(0, "a"), (1, "b"), (40, "c")],
     ("cold", "b", None)),
    ("the-trailing-minute-holds-the-cap-already", 1, 0.0, 2, (), [(0, "a"), (1, "b"), (2, "c"), (3, "d")],
     ("refused", None, "eviction_cap")),
    ("a-tenant-that-had-its-share-of-the-cap-is-refused-while-it-has-room", 1, 0.0, 4, (),
     [(0, "a"), (1, "b"), (2, "c"), (3, "d"), (4, "b")], ("refused", None, "eviction_cap")),
    ("and-a-tenant-short-of-its-share-still-loads", 1, 0.0, 4, (),
     [(0, "a"), (1, "b"), (2, "c"), (3, "d"), (4, "b"), (5, "a")], ("cold", "d", None)),
    ("a-copy-counts-to-its-adapters-share-of-the-cap", 1, 0.0, 2, (), [(0, "a"), (1, "b"), (2, "b@v2")],
     ("refused", None, "eviction_cap")),
    ("past-its-share-a-resident-used-just-now-goes-and-one-loaded-within-the-minimum-stays", 2, 30.0, 5, (),
     [(0, "a"), (40, "b"), (41, "a"), (42, "c")], ("cold", "a", None)),
    ("a-tenant-over-its-share-of-the-slots-is-protected-only-after-its-load", 2, 30.0, 5, (),
     [(0, "a@v1"), (0, "a@v2"), (40, "a@v1"), (40, "a@v2"), (41, "c")], ("cold", "a@v1", None)),
    ("within-its-share-a-tenant-keeps-its-slot-while-used-and-one-over-its-share-gives", 3, 30.0, 5, (),
     [(0, "a"), (0, "b"), (0, "b@v2"), (40, "a"), (40, "b"), (40, "b@v2"), (41, "c")], ("cold", "b", None)),
    ("tenants-within-their-share-keep-their-slots-while-used", 2, 30.0, 5, (),
     [(0, "a"), (0, "b"), (40, "a"), (40, "b"), (41, "a@v2")], ("refused", None, "min_residency")),
    ("every-resident-pinned", 2, 0.0, 5, ("a", "b"), [(0, "a"), (0, "b"), (99, "c")],
     ("refused", None, "pinned_full")),
    ("a-pin-not-yet-admitted-takes-no-room", 2, 0.0, 5, ("p",), [(0, "a"), (0, "b")],
     ("cold", None, None)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("capacity", "min_residency_s", "evictions", "pinned", "admitted", "last"),
    [case[1:] for case in REFUSALS],
    ids=[case[0] for case in REFUSALS],
)
def test_a_cold_load_is_refused_only_where_no_resident_may_go(
    capacity, min_residency_s, evictions, pinned, admitted, last
):
    g, clock = guard(capacity, min_residency_s, evictions)
    g.set_pinned(pinned)
    for at, name in admitted:
        clock.at = at
        admission = g.admit(name)
    assert (admission.kind, admission.evicted, admission.reason) == last
    if last[0] == "refused":
        assert len(g.resident()) == capacity and admitted[-1][1] not in g.resident()
        assert g.figures()["adapters"][admitted[-1][1]]["refused"] == 1


def test_the_eviction_cap_recovers_60_seconds_after_the_evictions_it_counts():
    g, clock = guard(capacity=1, evictions=2)
    assert kinds(g, "a b") == [("cold", None, None), ("cold", "a", None)]  # b's eviction
    clock.at = 30.0
    assert g.admit("a").evicted == "b"  # a's
    clock.at = 59.9
    assert g.admit("b").reason == "eviction_cap" and g.evictions_last_minute() == 2
    clock.at = 60.0
    assert (g.admit("b").evicted, g.evictions_last_minute()) == ("a", 2)  # the one at 30 s still counts
    assert g.admit("a").reason == "eviction_cap"
    clock.at = 90.0
    assert g.admit("a").kind == "cold"


@pytest.mark.parametrize("seed", range(3))
def test_a_flood_over_four_adapters_never_sends_a_fifth_tenant_to_the_base_for_long(seed):
    """The pentest's replica: 4 slots, the defaults (30 s, 5 a minute); a client's one-token
    requests over 4 adapters every 0.36 s (192 in 70 s), and after its first minute a victim
    asking every 7 s. The flood cannot spend the victim's share of the cap: more than half the
    victim's requests find its adapter and it never waits a minute for it, where the
    replica-wide rules refused it every time (95 of 95 here), and the cap still holds."""
    rng = random.Random(seed)
    g, clock = guard(capacity=4, min_residency_s=30.0, evictions=5)
    flood = [f"flood-{i}" for i in range(4)]
    victim_kinds, refused_since, longest = [], None, 0.0
    for step in range(2000):  # 12 minutes
        clock.at = step * 0.36
        g.admit(rng.choice(flood))
        if step >= 200 and step % 19 == 0:
            kind = g.admit("victim").kind
            victim_kinds.append(kind)
            if kind == "refused":
                refused_since = clock.at if refused_since is None else refused_since
                longest = max(longest, clock.at - refused_since)
            else:
                refused_since = None
    assert victim_kinds.count("refused") / len(victim_kinds) < 0.5 and longest < 60.0
    assert g.evictions_last_minute() <= 5


def test_a_request_with_no_later_version_is_never_refused_and_evicts_as_the_engine_would():
    g, clock = guard(capacity=2, min_residency_s=30.0, evictions=0)
    g.set_pinned({"a"})
    g.admit("a")
    g.admit("b")
    assert g.admit("c").reason == "min_residency"
    forced = g.admit("c", refuse=False)
    assert (forced.kind, forced.evicted) == ("cold", "b") and g.resident() == ["a", "c"]


@pytest.mark.parametrize("seed", range(3))
def test_a_pinned_name_is_never_evicted_in_a_storm_of_1000_cold_requests_over_100_names(seed):
    rng = random.Random(seed)
    g, clock = guard(capacity=4, min_residency_s=30.0, evictions=5)
    g.set_pinned({"hot-0", "hot-1"})
    g.admit("hot-0")
    g.admit("hot-1")
    outcomes = {"hit": 0, "cold": 0, "refused": 0}
    for i in range(1000):
        clock.at = i * 0.5
        name = f"n{rng.randrange(100)}"
        admission = g.admit(name, refuse=rng.random() > 0.1)  # now and then a last version, never refused
        outcomes[admission.kind] += 1
        assert admission.evicted not in ("hot-0", "hot-1")
        assert {"hot-0", "hot-1"} <= set(g.resident())
    assert outcomes["refused"] > 0 and outcomes["cold"] > 0
    adapters = g.figures()["adapters"]
    assert adapters["hot-0"]["evictions"] == adapters["hot-1"]["evictions"] == 0


def test_with_no_known_capacity_nothing_is_refused():
    g, _ = guard(capacity=None, min_residency_s=30.0, evictions=0)
    assert {g.admit(f"n{i}").kind for i in range(50)} == {"cold"}
    assert g.admit("n0").kind == "hit"


# -- the engine's truth ----------------------------------------------------------------------


def test_reconcile_drops_names_the_engine_lost_and_adds_its_own_as_the_least_recent():
    g, clock = guard(capacity=3, min_residency_s=30.0)
    clock.at = 100.0
    for name in ("a", "b"):
        g.admit(name)
    g.reconcile(["b", "x"])  # the engine evicted a; x came in by another route
    assert g.resident() == ["x", "b"]
    g.admit("c")
    assert g.admit("d").evicted == "x"  # joined with no known use: old enough, and the least recent


def test_reconcile_keeps_a_name_admitted_within_its_grace_though_the_engine_does_not_list_it_yet():
    g, clock = guard(capacity=3)
    g.admit("a")
    clock.at = 5.0
    g.admit("b")
    clock.at = 12.0
    g.reconcile([], grace_s=10.0)
    assert g.resident() == ["b"]


def test_forget_takes_a_name_out_without_counting_an_eviction():
    g, _ = guard(capacity=2)
    g.admit("a")
    g.forget(["a", "never-seen"])
    assert g.resident() == [] and g.figures()["evictions_last_minute"] == 0


# -- figures -----------------------------------------------------------------------------------


def test_the_figures_say_the_settings_the_rates_and_the_cold_loads():
    g, _ = guard(capacity=2)
    g.set_pinned(["b", "a"])
    kinds(g, "a a b c")
    for ms in range(1, 101):
        g.record_cold_load("c", ms / 1000)
    figures = g.figures()
    assert {k: figures[k] for k in ("capacity", "resident", "pinned", "hit_rate", "evictions_last_minute")} == {
        "capacity": 2,
        "resident": 2,
        "pinned": ["a", "b"],
        "hit_rate": 0.25,
        "evictions_last_minute": 0,
    }
    assert figures["totals"] == {"hits": 1, "misses": 2, "refused": 1, "evictions": 0}
    assert (figures["cold_load_p50_ms"], figures["cold_load_p99_ms"]) == (51.0, 100.0)
    assert json.loads(json.dumps(figures)) == figures


def test_the_figures_stay_bounded_after_10000_names_and_idle_names_are_pruned():
    g, clock = guard(capacity=4, evictions=10**6)
    for i in range(10_000):
        clock.at = i / 100
        g.admit(f"tenant-{i}/base/task")
        g.record_cold_load(f"tenant-{i}/base/task", 0.001 * (i % 7))
    figures = g.figures()
    assert len(figures["adapters"]) == COUNTED and "tenant-9999/base/task" in figures["adapters"]
    assert figures["cold_loads"] == COLD_SAMPLES and len(json.dumps(figures)) < 150_000
    clock.at += IDLE_S
    g.admit("fresh")
    g.prune()
    assert set(g.figures()["adapters"]) == {"fresh", "tenant-9996/base/task"}  # the one it evicted
    assert len(g.resident()) == 4  # residents are bounded by the capacity, not pruned


def test_a_cold_load_time_that_is_no_time_is_not_kept():
    g, _ = guard()
    for seconds in (math.nan, -1.0, math.inf):
        g.record_cold_load("a", seconds)
    assert g.figures()["cold_loads"] == 0


# -- settings --------------------------------------------------------------------------------

SETTINGS = [
    ({}, (30.0, 5), False),
    ({"LORAGATE_MIN_RESIDENCY_S": "45.5", "LORAGATE_EVICTIONS_PER_MINUTE": "12"}, (45.5, 12), False),
    ({"LORAGATE_MIN_RESIDENCY_S": "0", "LORAGATE_EVICTIONS_PER_MINUTE": "0"}, (0.0, 0), False),
    ({"LORAGATE_MIN_RESIDENCY_S": " ", "LORAGATE_EVICTIONS_PER_MINUTE": ""}, (30.0, 5), False),
    ({"LORAGATE_MIN_RESIDENCY_S": "soon"}, (30.0, 5), True),
    ({"LORAGATE_MIN_RESIDENCY_S": "-1"}, (30.0, 5), True),
    ({"LORAGATE_MIN_RESIDENCY_S": "nan"}, (30.0, 5), True),
    ({"LORAGATE_MIN_RESIDENCY_S": "inf"}, (30.0, 5), True),
    ({"LORAGATE_EVICTIONS_PER_MINUTE": "2.5"}, (30.0, 5), True),
    ({"LORAGATE_EVICTIONS_PER_MINUTE": "-3"}, (30.0, 5), True),
]


@pytest.mark.parametrize(("environ", "expected", "warned"), SETTINGS)
def test_settings_come_from_the_environment_and_an_invalid_one_is_logged_and_defaulted(
    environ, expected, warned, caplog
):
    with caplog.at_level(logging.WARNING, logger="loragate_resolver.residency"):
        assert residency.settings(environ) == expected
    assert bool(caplog.records) == warned
    built = residency.from_environment(3, environ)
    assert (built.capacity, built.min_residency_s, built.evictions_per_minute) == (3, *expected)
