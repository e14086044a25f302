"""The canary verdict on its probes (rules/verdict.py): fifty tenants of one good adapter are
not rolled back on one slow probe each while a consistently slower canary is, and back-to-back
pairs -- each golden prompt asked of canary and production moments apart -- let a host's
swinging load move both halves of a pair alike, so a slower canary is caught under it and a
first canary is judged against the bare base with LoRA's own cost in its band. Pure
functions: no replica, no store."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from loragate.registry.rules.canary import Observation, SideStats, Verdict
from loragate.registry.rules.verdict import judge, probe_latency_evidence
from tests.support.verdicts import EARLY, WINDOW, probe, spread, window

# -- the probes: 50 tenants' noise is no rollback, a slower canary is -------------------------


def observed(
    canary: SideStats, production: SideStats, pairs_ms: tuple = (), against_base: bool = False, looks: int = 2
) -> Verdict:
    """The verdict after ``looks`` observations of the same probes (or the first rollback),
    each keeping the sequential latency evidence for the next as the watch does."""
    dark, earlier = window(0.0), []
    for look in range(looks):
        at = EARLY + timedelta(seconds=5 * look)
        evidence = probe_latency_evidence(dark.thresholds, canary, production, pairs_ms, against_base, earlier)
        verdict, checks, _ = judge(
            dark, canary, production, 0.0, earlier, at, pairs_ms=pairs_ms, against_base=against_base,
            latency_evidence=evidence,
        )  # fmt: skip
        if verdict == Verdict.ROLLBACK:
            return verdict
        earlier.append(
            Observation(WINDOW, at, canary, production, 0.0, [], verdict, checks, [], pairs_ms=pairs_ms,
                        latency_evidence=evidence.as_dict())
        )  # fmt: skip
    return verdict


def two_observations(canary: SideStats, production: SideStats) -> Verdict:
    return observed(canary, production)


def test_fifty_tenants_of_one_good_adapter_are_not_rolled_back_on_one_slow_probe_each():
    # the burst: "p95_ms 1113 > 114.2 ... 2 observations in a row", 4 tenants of 50
    verdicts = []
    for tenant in range(50):
        production = probe(spread(16, 100.0, tenant))
        canary = probe([*spread(15, 100.0, tenant + 50), 1113.0])
        verdicts.append(two_observations(canary, production))
    assert verdicts.count(Verdict.ROLLBACK) == 0
    # without the samples (records older than the rank test) the same p95s did roll back
    bare = SideStats(16, 0, 100.0, 1113.0)
    assert two_observations(bare, SideStats(16, 0, 100.0, 114.2 / 1.1)) == Verdict.ROLLBACK


def test_a_consistently_slower_canary_is_rolled_back_on_probes():
    for tenant in range(5):
        production = probe(spread(16, 100.0, tenant))
        canary = probe(spread(16, 150.0, tenant + 50))
        assert two_observations(canary, production) == Verdict.ROLLBACK


# -- back-to-back pairs: a host's swinging load moves both halves of a pair alike -----------


def golden(i: int, seed: int) -> float:
    return ((i + seed) * 0.6180339887498949) % 1


def swinging_load(n: int, seed: int) -> list[float]:
    """Production's answers on a host whose load swings them between 1x and 8x."""
    return [round(100 * 8 ** golden(i, seed), 3) for i in range(n)]


def paired_with(production: list[float], factor: float, seed: int) -> list[float]:
    """The canary's answer to each of production's prompts, moments apart: ``factor`` times
    as slow, give or take 25 % either way (symmetric in the log)."""
    return [
        round(p * factor * math.exp(math.log(1.25) * (2 * golden(i, seed) - 1)), 3) for i, p in enumerate(production)
    ]


def paired_verdict(canary: list[float], production: list[float], pairs: bool = True, against_base=False) -> Verdict:
    """The verdict within four observations of the same 16 probe pairs: the sequential
    latency rule needs its evidence past 1/alpha (alpha 0.25 %) and the p95 out of band twice
    in a row."""
    pairs_ms = tuple(zip(canary, production, strict=True)) if pairs else ()
    return observed(probe(canary), probe(production), pairs_ms, against_base, looks=4)


@pytest.mark.parametrize(
    ("factor", "against_base", "rolled_back"),
    [
        (1.3, True, False),  # a first canary: LoRA's own cost against the bare base is in its band
        (1.3, False, True),  # the same against a production adapter is a slower version
        (3.0, True, True),  # a 3x-slow first canary is still caught
    ],
)
def test_a_first_canary_is_judged_against_the_bare_base_with_loras_own_cost_in_its_band(
    factor, against_base, rolled_back
):
    for tenant in range(5):
        production = swinging_load(16, tenant)
        canary = paired_with(production, factor, tenant + 50)
        verdict = paired_verdict(canary, production, against_base=against_base)
        assert (verdict == Verdict.ROLLBACK) is rolled_back, (tenant, verdict)


def test_a_canary_half_again_as_slow_under_a_swinging_load_is_rolled_back_on_its_pairs():
    paired, pooled = [], []
    for tenant in range(5):
        production = swinging_load(16, tenant)
        canary = paired_with(production, 1.5, tenant + 50)
        paired.append(paired_verdict(canary, production))
        pooled.append(paired_verdict(canary, production, pairs=False))
    assert paired == [Verdict.ROLLBACK] * 5
    # the same samples pooled: the load's swing drowns the difference for most tenants
    assert pooled.count(Verdict.ROLLBACK) <= 1


def test_fifty_good_tenants_under_a_swinging_load_are_not_rolled_back_on_their_pairs():
    verdicts = []
    for tenant in range(50):
        production = swinging_load(16, tenant)
        canary = paired_with(production, 1.0, tenant + 50)
        canary[-1] *= 10  # one answer caught behind a stall
        verdicts.append(paired_verdict(canary, production))
    assert verdicts.count(Verdict.ROLLBACK) == 0


def test_a_canary_slower_only_within_the_band_in_every_pair_is_not_rolled_back():
    # an adapter's LoRA arithmetic against a bare base: 5 % slower on every prompt, with the
    # p95 itself above 1.1 x production's (one answer caught behind a stall)
    for tenant in range(5):
        production = swinging_load(16, tenant)
        canary = [round(p * 1.05 * (1 + 0.02 * (2 * golden(i, tenant) - 1)), 3) for i, p in enumerate(production)]
        canary[-1] *= 10
        assert paired_verdict(canary, production) != Verdict.ROLLBACK
