"""The live error rule with users as the unit: Zipf users whose failures cluster, simulated.

A tenant of ``USERS`` sticky users whose activity follows Zipf's law (s = 1.1: the busiest
user sends about an eighth of the requests), each user's requests Poisson per 600 s look,
24 h at a share (1 %, or the ramp's 10 %), each user in the canary while its bucket is below
the share. In an ``independent`` window every request fails on its own at 1 %; in a
``clustered`` one each user has an error rate of its own (Beta, mean 1 %, concentration 20:
most users near 0, a few failing one request in ten), the same on either version -- a heavy
user who fails often and lands in the canary's bucket is chance, not the canary. A worse
canary doubles the rate of each of its users. Each side's units are sampled as the replicas
sample them (``rules/units.py``: by hash, at most ``UNITS`` a side), and loragate's rule
divides its evidence by the design effect and lets no single user decide where failures
cluster; the peer in the same run is the same rule counting every request as one -- what it
was before users were the unit.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.verdict_windows import LOOK_S, proportion
from loragate.registry.rules.sequential import ErrorEvidence, rule_alpha
from loragate.registry.rules.units import HASH_BITS, UNITS, Units, carried_by_one_user, design_effect, kept

USERS = 2000
ZIPF_S = 1.1
CONCENTRATION = 20.0  # of the users' error rates (Beta): the smaller, the more they cluster


@dataclass(frozen=True)
class UsersCase:
    per_look: int
    share: float
    clustered: bool
    canary_ratio: float = 1.0

    @property
    def label(self) -> dict[str, Any]:
        return {
            "users": USERS,
            "requests_per_10_min": self.per_look,
            "share": self.share,
            "failures": "clustered by user" if self.clustered else "independent",
            "canary_error_ratio": self.canary_ratio,
        }


def _depths(hashes: np.ndarray) -> np.ndarray:
    """Per user, the deepest level its hash is kept at (``rules/units.kept``)."""
    return np.array([next(lv for lv in range(HASH_BITS, -1, -1) if kept(int(h), lv)) for h in hashes])


def _sampled(depths: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """The users a side's replicas keep: the lowest level at which at most ``UNITS`` are."""
    level = 0
    while (chosen := seen & (depths >= level)).sum() > UNITS:
        level += 1
    return chosen


def users_window(
    case: UsersCase, looks: int, false_rollback: float, rng: np.random.Generator
) -> tuple[int | None, int | None, float]:
    """One window: the look loragate's rule rolled it back at, the peer's (None: never), and
    the last design effect."""
    weights = 1.0 / np.arange(1, USERS + 1) ** ZIPF_S
    weights /= weights.sum()
    rates = np.full(USERS, 0.01)
    if case.clustered:
        rates = rng.beta(0.01 * CONCENTRATION, 0.99 * CONCENTRATION, USERS)
    in_canary = rng.random(USERS) < case.share
    rates = np.where(in_canary, np.minimum(1.0, rates * case.canary_ratio), rates)
    hashes = rng.integers(0, 2**63, USERS, dtype=np.int64).astype(np.uint64) * 2 + rng.integers(0, 2, USERS).astype(
        np.uint64
    )
    depths = _depths(hashes)
    requests, failures = np.zeros(USERS, dtype=np.int64), np.zeros(USERS, dtype=np.int64)
    alpha = rule_alpha(false_rollback)
    ours, peer = ErrorEvidence.start(alpha), ErrorEvidence.start(alpha)
    rule = plain = None
    effect = 1.0
    for look in range(1, looks + 1):
        sent = rng.poisson(weights * case.per_look)
        requests += sent
        failures += rng.binomial(sent, rates)
        counts = (
            int(requests[in_canary].sum()),
            int(failures[in_canary].sum()),
            int(requests[~in_canary].sum()),
            int(failures[~in_canary].sum()),
        )
        if rule is None:
            seen = requests > 0
            sides = []
            for side in (in_canary, ~in_canary):
                chosen = _sampled(depths[side], seen[side])
                pairs = list(zip(requests[side][chosen].tolist(), failures[side][chosen].tolist(), strict=True))
                sides.append((pairs, int(requests[side].sum())))
            clustering = design_effect(sides)
            effect = clustering.value
            ours = ours.look(*counts, effect)
            canary_units = Units(0, dict(enumerate(sides[0][0])), True)
            carried = ours.worse and carried_by_one_user(counts, canary_units, clustering, alpha) is not None
            rule = look if ours.worse and not carried else None
        if plain is None:
            peer = peer.look(*counts)
            plain = look if peer.worse else None
        if rule is not None and plain is not None:
            break
    return rule, plain, effect


def users_case(case: UsersCase, windows: int, looks: int, false_rollback: float, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    runs = [users_window(case, looks, false_rollback, rng) for _ in range(windows)]
    ours = [r for r, _, _ in runs if r is not None]
    plain = [p for _, p, _ in runs if p is not None]
    return {
        **case.label,
        "loragate": proportion(len(ours), windows, "rolled_back"),
        "median_hours_to_rollback": statistics.median(ours) * LOOK_S / 3600 if ours else None,
        "requests_as_units": proportion(len(plain), windows, "rolled_back"),
        "median_design_effect": statistics.median(e for _, _, e in runs),
    }


def users_rows(windows: int, looks: int, false_rollback: float, seed: int, smoke: bool) -> list[dict[str, Any]]:
    """At a 1 % share and 6,000 requests per 10 min, and at the ramp's 10 % and 600."""
    traffic = ((600, 0.10),) if smoke else ((6000, 0.01), (600, 0.10))
    return [
        users_case(UsersCase(per_look, share, clustered, ratio), windows, looks, false_rollback, seed)
        for per_look, share in traffic
        for clustered in (False, True)
        for ratio in (1.0, 2.0)
    ]
