"""The user as the unit: how much a window's requests are worth when a user's fail together.

The split randomises users, not requests: a user's requests all go to one version, so a
heavy user whose requests fail together (a bad integration, a burst at an overloaded
moment) makes one version's count of failures move in lumps, and a test that counts
requests as independent finds "worse" in lumps it did not earn. Each production replica
therefore keeps, per window and version, the requests and counted failures of a sample of
its users (``units``: a user's keyed hash -> (requests, failures); a request without a user
is a unit of its own). The sample is chosen by the hash itself -- the units whose hash has
``level`` leading zero bits, the level raised one step whenever more than ``UNITS`` are kept
-- so every replica samples the same users, and the reader merges them exactly: the highest
level any replica reached, each unit's counts summed over replicas.

From the sample, ``design_effect`` is the design effect of the difference of the failure
rates: how many times its variance, with users as clusters, exceeds what it would be were
the requests independent (Kish's ``1 + rho (n_w - 1)`` per side, the users' intraclass
correlation ``rho`` estimated on both sides' sampled users), never below 1. The error rule
divides its evidence by it (``rules/sequential.py``), so a window whose failures cluster
by user needs as many more requests as the clustering costs, and one whose failures do not
is judged as before. Where they cluster, no single user decides a rollback
(``carried_by_one_user``): early in a window the clustering is barely estimated.

What this assumes: users are independent of one another and the sample's users are like
the rest (the hash is blind to behaviour). The design effect is estimated, so the rate it
keeps is asymptotic, checked by simulation (``bench/verdict_users.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from loragate.registry.errors import ReplicaError
from loragate.registry.rules.sequential import ErrorEvidence

UNITS = 1024  # the plugin's cap per window and version (``live_stats.UNITS``)
HASH_BITS = 64
# a side's own clustering is estimated only where its requests are spread at least this
# widely (one over the sum of the users' squared shares): fewer clusters say too little
MIN_EFFECTIVE_USERS = 5
# a design effect from this up says users' failures cluster (under independent failures the
# estimate is within a few percent of 1)
CLUSTERED = 1.25
# the design effect is trusted once this many distinct users have failed: before that it
# rests on a handful of failures, and a heavy user's look as independent as anyone's
SETTLED_FAILING_UNITS = 20


def kept(key: int, level: int) -> bool:
    """Whether the unit hashed to ``key`` is in the sample at ``level``."""
    return level <= 0 or key >> (HASH_BITS - level) == 0


@dataclass(frozen=True)
class Units:
    """One side's sample of users: ``level`` and unit hash -> (requests, failures)."""

    level: int = 0
    counts: dict[int, tuple[int, int]] = field(default_factory=dict)
    reported: bool = False  # False: no replica reported units (an older plugin)

    def merge(self, other: Units) -> Units:
        """Both samples as one: the coarser level, each unit's counts summed."""
        level = max(self.level, other.level)
        merged: dict[int, tuple[int, int]] = {}
        for source in (self.counts, other.counts):
            for key, (requests, failures) in source.items():
                if kept(key, level):
                    had = merged.get(key, (0, 0))
                    merged[key] = (had[0] + requests, had[1] + failures)
        return Units(level, merged, self.reported or other.reported)

    @property
    def sampled_share(self) -> float:
        """The share of all units the sample stands for."""
        return 2.0**-self.level

    @classmethod
    def from_entry(cls, data: Any, where: str) -> Units:
        """A replica's ``units`` (``{"level": L, "counts": {hex: [requests, failures]}}``);
        none reported where the entry has none.

        Raises:
            ReplicaError: REPLICA_REFUSED naming ``where`` for units that are not that.
        """
        if data is None:
            return cls()
        try:
            level = int(data["level"])
            counts = {}
            for key, pair in dict(data["counts"]).items():
                requests, failures = (int(v) for v in pair)
                if not (0 <= failures <= requests) or len(key) != HASH_BITS // 4:
                    raise ValueError(key)
                counts[int(key, 16)] = (requests, failures)
        except (KeyError, TypeError, ValueError) as e:
            raise ReplicaError(
                f"{where} of a traffic report holds units that are not level + counts", field=where
            ) from e
        if not 0 <= level <= HASH_BITS:
            raise ReplicaError(f"{where} of a traffic report holds a units level out of range", field=where)
        return cls(level, {k: v for k, v in counts.items() if kept(k, level)}, True)

    def summary(self) -> dict[str, Any]:
        return {"sampled": len(self.counts), "sampled_share": self.sampled_share, "reported": self.reported}


@dataclass(frozen=True)
class DesignEffect:
    """How many requests count as one: ``value`` >= 1, the intraclass correlation ``rho``
    it came from, the users it was estimated on and how many of them failed."""

    value: float = 1.0
    rho: float = 0.0
    units: int = 0
    failing_units: int = 0

    @property
    def settled(self) -> bool:
        """Whether enough users failed for the effect to say failures do not cluster."""
        return self.failing_units >= SETTLED_FAILING_UNITS

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "rho": self.rho, "units": self.units, "failing_units": self.failing_units}


def design_effect(sides: Iterable[tuple[Iterable[tuple[int, int]], int]]) -> DesignEffect:
    """The design effect of the difference of the sides' failure rates; each side given as
    its sampled units' (requests, failures) and its requests in all.

    Users' failure rates differ by a variance ``sigma^2`` around the side's rate ``p``; a
    user's failures then vary by ``n p (1 - p) + n (n - 1) sigma^2``, so a side's rate
    varies ``1 + rho (n_w - 1)`` times as much as were its requests independent (Kish), with
    ``rho = sigma^2 / (p (1 - p))`` the intraclass correlation and ``n_w`` the side's
    request-weighted mean requests per user. ``rho`` is estimated on every sampled user of
    both sides (residuals about each side's own rate, so a worse canary does not inflate
    it): the canary's few users could not show their own clustering -- one heavy user is all
    of its side, and about its own rate nothing varies -- but they cluster as users do.
    A side whose own users show more clustering than that (the canary failing some users
    far more than others) takes its own cluster-robust effect: the larger of the two. The
    difference's variance weighs each side by one over its requests, so the canary's
    ``n_w`` counts as much as it does in the test, not as little as its share. 1 where
    nothing failed or no user sent two requests."""
    excess = spread = 0.0
    weighted: list[tuple[float, float, int]] = []  # per side: n_w, its own effect, requests in all
    units = failing = 0
    for pairs_in, requests_in_all in sides:
        pairs = [(n, f) for n, f in pairs_in if n > 0]
        sampled = sum(n for n, _ in pairs)
        if not pairs or sampled == 0:
            continue
        squares = sum(n * n for n, _ in pairs)
        rate = sum(f for _, f in pairs) / sampled
        residuals = sum((f - rate * n) ** 2 for n, f in pairs)
        excess += residuals - rate * (1 - rate) * sampled  # what independent failures leave out
        spread += (squares - sampled) * rate * (1 - rate)
        weighted.append(
            (squares / sampled, _own_effect(residuals, squares, sampled, rate), max(requests_in_all, sampled))
        )
        units += len(pairs)
        failing += sum(1 for _, f in pairs if f > 0)
    if spread <= 0 or not weighted:
        return DesignEffect(1.0, 0.0, units, failing)
    rho = min(1.0, max(0.0, excess / spread))
    clustered = sum(max(1 + rho * (n_w - 1), own) / requests for n_w, own, requests in weighted)
    independent = sum(1 / requests for _, _, requests in weighted)
    return DesignEffect(max(1.0, clustered / independent), rho, units, failing)


def _own_effect(residuals: float, squares: int, requests: int, rate: float) -> float:
    """A side's design effect from its own users alone (the cluster-robust variance over the
    independent one; the residuals' sum of squares has mean ``rate (1 - rate) (N - sum n^2 /
    N)`` when requests fail independently, hence the correction). 1 where its requests are
    in too few users' hands (``MIN_EFFECTIVE_USERS``) -- about its own rate little varies,
    and Kish's effect has to speak."""
    concentration = squares / (requests * requests)
    if concentration * MIN_EFFECTIVE_USERS > 1 or rate <= 0.0 or rate >= 1.0:
        return 1.0
    return residuals / (1 - concentration) / (rate * (1 - rate) * requests)


def carried_by_one_user(
    counts: tuple[int, int, int, int], canary: Units, design: DesignEffect, alpha: float
) -> tuple[int, int] | None:
    """The (requests, failures) of the canary's user whose failures alone carry the error
    rule's verdict -- the window's cumulative ``counts`` (canary requests, failures,
    production requests, failures) without that user's no longer reach the rule's threshold
    at ``alpha`` -- or None where the verdict stands without its heaviest-failing user, no
    user of the canary's is known, or the window's users are shown not to cluster (``design``
    below ``CLUSTERED`` and ``settled``: where failures are independent, a heavy user's
    requests are as many units, and leaving one out would only cost the rule its power).
    Where they cluster, or too few users have failed to tell, no single user decides a
    rollback: one user is one unit, however many requests it sends."""
    failing = [pair for pair in canary.counts.values() if pair[1] > 0]
    if not failing or (design.value < CLUSTERED and design.settled):
        return None
    requests, failures = max(failing, key=lambda pair: (pair[1], pair[0]))
    rest = ErrorEvidence.start(alpha).look(
        counts[0] - requests, counts[1] - failures, counts[2], counts[3], design.value
    )
    return None if rest.worse else (requests, failures)
