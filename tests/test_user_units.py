"""The user as the unit (``loragate/registry/rules/units.py``): the split keeps a sample of
each window entry's users with their requests and failures, the same users on every
replica; the reader merges the samples exactly; the design effect they give makes a window
whose failures cluster by user count its requests at what they are worth, so heavy users
cannot manufacture significance, and leaves a window whose failures do not as it was."""

from __future__ import annotations

import random

import numpy as np
import pytest
from loragate_resolver import live_stats, routing

from bench.verdict_users import UsersCase, users_window
from loragate.registry.errors import ReplicaError
from loragate.registry.render.canary import canary_evidence_markdown
from loragate.registry.rules.canary import CanaryThresholds, Observation, Verdict
from loragate.registry.rules.live import LiveStats, judge_live
from loragate.registry.rules.live_side import LiveSide
from loragate.registry.rules.sequential import ErrorEvidence, rule_alpha
from loragate.registry.rules.units import (
    SETTLED_FAILING_UNITS,
    UNITS,
    DesignEffect,
    Units,
    carried_by_one_user,
    design_effect,
)
from tests.support.split import NAME, FakeVllm, _split, ask, call
from tests.support.split import window as route_window
from tests.support.verdicts import LATE, WINDOW, probe, window

# -- what the split keeps ---------------------------------------------------------------------


def _units(split, version: str, window_id: int = 9) -> dict[str, list[int]]:
    return split.stats.of(NAME, version, window_id).as_dict()["units"]["counts"]


def test_a_users_requests_are_one_unit_and_each_request_without_a_user_is_its_own(split_env):
    split = _split(FakeVllm(), route_window(9, "c1", 0.0))
    for _ in range(5):
        ask(split, user="alice")
    for _ in range(3):
        call(split, body={"model": NAME, "prompt": "hi"})
    counts = sorted(_units(split, "p1").values())
    assert counts == [[1, 0], [1, 0], [1, 0], [5, 0]]


def test_a_charged_failure_is_its_users_and_a_shared_one_is_nobodys(split_env):
    split = _split(FakeVllm({f"{NAME}@c1": 500}), route_window(9, "c1", 1.0))
    for _ in range(2):  # the breaker opens at the second (LORAGATE_BREAKER_ERRORS)
        ask(split, user="bob")
    assert list(_units(split, "c1").values()) == [[2, 2]]
    shared = _split(FakeVllm({f"{NAME}@c1": 500, NAME: 500, "tiny-llama": 500}), route_window(9, "c1", 1.0))
    ask(shared, user="bob")
    assert list(_units(shared, "c1").values()) == [[1, 0]]


def test_requests_outside_a_window_keep_no_units_and_a_unit_names_no_user(split_env):
    split = _split(FakeVllm(), routing.Route(NAME, "p1"))
    ask(split, user="alice")
    assert "units" not in split.stats.of(NAME, "p1", None).as_dict()
    windowed = _split(FakeVllm(), route_window(9, "c1", 0.0))
    ask(windowed, user="alice")
    (key,) = _units(windowed, "p1")
    assert "alice" not in key and len(key) == 16
    # the unit is not the bucket: a report of units says nothing of who is in the canary's share
    route = route_window(9, "c1", 0.5)
    assert routing.unit(route, "alice") != int(routing.bucket(route.bucket_key, "alice") * 2**64)


def test_the_sample_stays_bounded_and_replicas_sampling_the_same_users_merge_exactly():
    rng = random.Random(7)
    replicas = [live_stats.UnitSample(), live_stats.UnitSample()]
    truth: dict[int, list[int]] = {}
    for _ in range(30_000):
        user = rng.randrange(5_000)
        unit = routing.unit(route_window(9, "c1", 0.5), f"user-{user}")
        assert unit is not None
        error = rng.random() < 0.05
        rng.choice(replicas).add(unit, error)  # a user's requests reach either replica
        counts = truth.setdefault(unit, [0, 0])
        counts[0], counts[1] = counts[0] + 1, counts[1] + int(error)
    assert all(len(r.counts) <= live_stats.UNITS for r in replicas) and UNITS == live_stats.UNITS
    merged = Units()
    for number, replica in enumerate(replicas):
        merged = merged.merge(Units.from_entry(replica.as_dict(), f"replica {number}"))
    assert merged.level >= 1 and 0 < len(merged.counts) <= UNITS
    assert all(truth[unit] == list(counts) for unit, counts in merged.counts.items())
    expected = {u for u in truth if merged.level == 0 or u >> (64 - merged.level) == 0}
    assert set(merged.counts) == expected  # every user of the sample, on whichever replica


@pytest.mark.parametrize(
    "units",
    [
        {"level": 65, "counts": {}},
        {"level": -1, "counts": {}},
        {"level": 0, "counts": {"zz" * 8: [1, 0]}},
        {"level": 0, "counts": {"ab": [1, 0]}},
        {"level": 0, "counts": {"a" * 16: [1, 2]}},
        {"level": 0, "counts": {"a" * 16: [-1, 0]}},
        {"level": 0, "counts": [1, 2]},
        {"counts": {}},
        "units",
    ],
)
def test_units_that_are_not_a_sample_are_refused_naming_the_entry(units):
    with pytest.raises(ReplicaError) as refused:
        LiveSide.from_entry({"requests": 1, "units": units}, "r1 versions[0]")
    assert refused.value.field == "r1 versions[0] units"


# -- the design effect --------------------------------------------------------------------------


def _zipf_users(rng: np.random.Generator, users: int, requests: int) -> np.ndarray:
    weights = 1.0 / np.arange(1, users + 1) ** 1.1
    return rng.poisson(weights / weights.sum() * requests)


def test_the_design_effect_is_about_one_for_independent_failures_and_large_where_users_fail_together():
    """Eight tenants of 2,000 Zipf users, a random 10 % in the canary (the ten busiest kept
    out: one of them would be the canary's whole side, a case of its own below)."""
    independent, clustered = [], []

    def effect(sent: np.ndarray, canary: np.ndarray, failures: np.ndarray) -> float:
        sides = [
            (list(zip(sent[s].tolist(), failures[s].tolist(), strict=True)), int(sent[s].sum()))
            for s in (canary, ~canary)
        ]
        return design_effect(sides).value

    for seed in range(8):
        rng = np.random.default_rng(seed)
        sent = _zipf_users(rng, 2_000, 50_000)
        canary = rng.random(2_000) < 0.10
        canary[:10] = False
        independent.append(effect(sent, canary, rng.binomial(sent, 0.01)))
        clustered.append(effect(sent, canary, rng.binomial(sent, rng.beta(0.2, 19.8, sent.size))))
    assert float(np.median(independent)) < 1.1 and max(independent) < 2
    assert float(np.median(clustered)) > 3 and min(clustered) > 2


def test_one_heavy_users_failures_are_worth_one_users_many_users_the_same_failures_are_not():
    """Thirty failures in 1,000 canary requests against production's 1 %: from thirty users,
    a canary failing 3x as often; from one user who sent 300 of the requests, one user."""
    thresholds = CanaryThresholds(length_s=86_400, false_rollback=0.01, detect_ratio=2.0)
    population = [(100, 1)] * 500 + [(100, 0)] * 450 + [(100, 2)] * 50  # users differ a little
    production = LiveSide(100_000, 1_050, units=Units(0, dict(enumerate(population)), True))

    def canary(units: list[tuple[int, int]]) -> LiveSide:
        return LiveSide(1_000, 30, units=Units(0, {10_000 + i: u for i, u in enumerate(units)}, True))

    spread = canary([(10, 1)] * 30 + [(10, 0)] * 70)
    heavy = canary([(300, 30)] + [(10, 0)] * 70)
    many = judge_live(thresholds, LiveStats(spread, production), 0.01)
    one = judge_live(thresholds, LiveStats(heavy, production), 0.01)
    assert many.rollback and many.clustering.value < 1.5
    assert not one.rollback and one.clustering.value > 5
    assert "count as one" in one.error_evidence.describe()
    assert one.coverage.needed is not None and many.coverage.needed is not None
    assert one.coverage.needed > many.coverage.needed  # the clustered window needs more
    # what a person signing it off reads: why nothing rolled back, and what the users cost
    kept = Observation(WINDOW, LATE, probe(), probe(), 0.0, [], Verdict.CONTINUE, one.monitors, [], live=one.as_dict())
    text = canary_evidence_markdown(window(), [kept])
    assert "- users' failures cluster: " in text and "count as one" in text


def test_no_single_user_decides_a_rollback_where_users_failures_cluster():
    """One canary user failing 30 of its 40 requests, fifty more failing one in twenty: the
    evidence crosses the threshold only with that one user's failures, and its users'
    failures cluster -- reported, not a rollback. Where failures do not cluster, the same
    user is as many units as its requests, and the guard stays out of the way."""
    thresholds = CanaryThresholds(length_s=86_400, false_rollback=0.01)
    population = [(100, 1)] * 500 + [(100, 0)] * 450 + [(100, 2)] * 50
    production = LiveSide(100_000, 1_050, units=Units(0, dict(enumerate(population)), True))
    users = [(40, 30)] + [(20, 1)] * 50
    canary = LiveSide(1_040, 80, units=Units(0, {10_000 + i: u for i, u in enumerate(users)}, True))
    judged = judge_live(thresholds, LiveStats(canary, production), 0.01)
    assert judged.error_evidence.worse and judged.clustering.value >= 1.25
    assert not judged.rollback and judged.monitors[0].in_band
    assert "only with one user's 30 failures in 40 requests" in " ".join(judged.reasons)
    counts = (1_040, 80, 100_000, 1_050)
    alpha = judged.error_evidence.alpha
    assert carried_by_one_user(counts, canary.units, judged.clustering, alpha) == (40, 30)
    # all thirty failures one user's: where users are shown not to cluster its requests are
    # as many units; where too few users failed to tell, no one user decides
    alone = Units(0, {10_000: (40, 30), **{10_001 + i: (20, 0) for i in range(50)}}, True)
    one_users = (1_040, 30, 100_000, 1_050)
    independent = DesignEffect(1.0, 0.0, 1_051, SETTLED_FAILING_UNITS)
    assert carried_by_one_user(one_users, alone, independent, alpha) is None
    unsettled = DesignEffect(1.0, 0.0, 1_051, SETTLED_FAILING_UNITS - 1)
    assert carried_by_one_user(one_users, alone, unsettled, alpha) == (40, 30)
    spread = Units(0, {10_000 + i: (20, 2) for i in range(52)}, True)  # no one user carries it
    assert carried_by_one_user((1_040, 104, 100_000, 1_050), spread, judged.clustering, alpha) is None


def test_an_older_replica_reporting_no_units_is_judged_as_before():
    thresholds = CanaryThresholds(length_s=86_400, false_rollback=0.01)
    live = LiveStats(LiveSide(1_000, 30), LiveSide(100_000, 1_000))
    judged = judge_live(thresholds, live, 0.01)
    assert judged.clustering.value == 1.0 and judged.rollback


def test_evidence_kept_before_the_design_effect_reads_as_independent_requests():
    kept = ErrorEvidence.start(0.01).look(100, 5, 10_000, 10).as_dict()
    del kept["design_effect"]
    assert ErrorEvidence.from_dict(kept, 0.01).design_effect == 1.0


# -- the rate it keeps, by simulation -------------------------------------------------------------


def test_zipf_users_whose_failures_cluster_roll_back_a_good_canary_rarely_where_counting_requests_would_often():
    """40 windows of 24 h x 144 looks at a 10 % share, 600 requests per 10 min from 2,000
    Zipf users whose error rates differ (``bench/verdict_users.py``): the rule counting
    requests as units withdraws about one good canary in four; loragate's, at its quarter of
    the 1 % budget, next to none."""
    rng = np.random.default_rng(17)
    runs = [users_window(UsersCase(600, 0.10, clustered=True), 144, 0.01, rng) for _ in range(40)]
    ours = sum(1 for r, _, _ in runs if r is not None)
    plain = sum(1 for _, p, _ in runs if p is not None)
    assert ours <= 1 and plain >= 6, (ours, plain)


def test_independent_failures_keep_their_power_a_2x_worse_canary_is_still_caught():
    rng = np.random.default_rng(18)
    runs = [users_window(UsersCase(600, 0.10, clustered=False, canary_ratio=2.0), 144, 0.01, rng) for _ in range(10)]
    assert sum(1 for r, _, _ in runs if r is not None) >= 9
    assert rule_alpha(0.01) == 0.0025
