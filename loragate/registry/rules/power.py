"""How many live canary requests a window needs before its verdict means something, and the
share that gets them in time.

A window that ends ready has shown the canary is not worse -- but only as far as its traffic
could show it. The live error rule (``rules/sequential.py``) catches a canary failing
``detect_ratio`` times as often as production with probability ``power`` once the canary
has answered about ``requests_needed`` requests; before that, "in band" means "too few
requests to tell". So a window is ready only with that many, and when its traffic will not
bring them by the window's end the split ramps -- never past the operator's
``LORAGATE_CANARY_MAX_AUTO_SHARE`` -- and a window that still falls short ends
**undecided**: not promoted as if proven, not "not ready" forever.

The count is Wald's approximation for the rule's own test: given how many requests failed on
both sides, each failure is the canary's with probability ``q0`` (its share of the requests)
if the versions fail alike, ``q1`` if the canary fails ``detect_ratio`` times as often. The
mixture's log likelihood ratio grows by KL(q1 || q0) per failure, less the log of the
prior's weight on the nearest odds ratio; it must reach log(1 / alpha) with probability
``power`` (a normal bound on its spread). Production's error rate is what it has shown, but
at least ``detect_error_rate``: a window is sized for harm that matters, not for telling
0.02 % from 0.01 %. Where users' failures cluster the rule counts each request as less
than one (``rules/units.py``), and the need grows by the same design effect.
``bench/verdict.py`` checks the count against the rule by simulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from loragate.registry.rules.sequential import ODDS_RATIOS

# a ramp step asks for this much more than the projection says is enough: traffic is not flat
RAMP_MARGIN = 1.25
# a share is not raised by less than this factor: one audited step, not a creep of tiny ones
MIN_RAMP_STEP = 1.5
# a projection needs this much of the window behind it (and one request) to say anything
MIN_ELAPSED_FRACTION = 0.02


@dataclass(frozen=True)
class Detection:
    """What a window must be able to detect: a canary failing ``ratio`` times as often as
    production, with probability ``power``, by the rule at ``alpha``; ``ratio`` 0 turns the
    requirement off (``min_requests`` alone)."""

    ratio: float
    power: float
    alpha: float
    error_rate_floor: float
    min_requests: int = 0

    @property
    def on(self) -> bool:
        return self.ratio > 1.0

    def describe(self) -> str:
        return f"errors {self.ratio:g}x production's at {self.power:.0%} power" if self.on else ""


def _failures_needed(q0: float, q1: float, power: float, alpha: float) -> float:
    """Failures (both sides together) before the mixture crosses 1/alpha with ``power``."""
    step_canary, step_production = math.log(q1 / q0), math.log((1 - q1) / (1 - q0))
    mean = q1 * step_canary + (1 - q1) * step_production  # KL(q1 || q0) per failure
    spread = math.sqrt(q1 * (1 - q1)) * (step_canary - step_production)
    target = math.log(1 / alpha) + math.log(len(ODDS_RATIOS))  # the prior's equal weights
    z = NormalDist().inv_cdf(power)
    root = (z * spread + math.sqrt((z * spread) ** 2 + 4 * mean * target)) / (2 * mean)
    return root * root


def requests_needed(detection: Detection, share: float, production_error_rate: float) -> int | None:
    """Live canary requests the window needs, at ``share`` of the adapter's requests and
    production failing at ``production_error_rate`` (the floor where it shows less); at least
    ``min_requests``. None: no count suffices -- every request goes to the canary (a 100 %
    share, or one user holding all the traffic), so there is nothing to compare with."""
    if not detection.on:
        return detection.min_requests
    if share >= 1.0:
        return None
    if share <= 0.0:
        return detection.min_requests  # a dark canary: no live requests to count
    rate = min(max(production_error_rate, detection.error_rate_floor), 0.5 / detection.ratio)
    q0 = share
    q1 = detection.ratio * share / (detection.ratio * share + 1 - share)
    if q1 >= 1.0 or q1 - q0 < 1e-12:
        return None
    failures = _failures_needed(q0, q1, detection.power, detection.alpha)
    canary_requests = failures * q1 / (detection.ratio * rate)
    return max(detection.min_requests, math.ceil(canary_requests))


@dataclass(frozen=True)
class Coverage:
    """Where a window stands against what it needs: shown on every evaluation."""

    needed: int | None  # None: no count suffices at this split (``requests_needed``)
    canary_requests: int
    projected: int  # canary requests by the window's end: the adapter's pace so far at this share
    share: float
    # what the need is sized for ("errors 2x production's at 80 % power"); "": the minimum only
    sized_for: str = ""
    design_effect: float = 1.0  # requests that count as one (``rules/units.py``), in ``needed``

    @property
    def met(self) -> bool:
        return self.needed is not None and self.canary_requests >= self.needed

    def describe(self) -> str:
        if self.needed is None:
            return (
                f"live: {self.canary_requests} canary requests and production answered "
                f"{'none' if self.share >= 1 else 'too few'} to compare with: no number of requests decides this split"
            )
        if not self.sized_for:
            return f"live: {self.canary_requests} of {self.needed} requests needed"
        clustered = (
            f"; users' failures cluster, {self.design_effect:.3g} requests count as one"
            if self.design_effect > 1.0
            else ""
        )
        return (
            f"live: {self.canary_requests} of {self.needed} canary requests needed to catch {self.sized_for} "
            f"(about {self.projected} by the window's end at {self.share:.2%} of requests{clustered})"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "needed": self.needed,
            "canary_requests": self.canary_requests,
            "projected": self.projected,
            "share": self.share,
            "sized_for": self.sized_for,
            "design_effect": self.design_effect,
            "met": self.met,
        }


def realised_share(canary_requests: int, production_requests: int, share: float) -> float:
    """The share the canary actually got, once there is traffic: sticky users make it differ
    from the window's (a heavy user is all in one bucket)."""
    total = canary_requests + production_requests
    return canary_requests / total if total else share


def coverage(
    detection: Detection,
    share: float,
    canary_requests: int,
    production_requests: int,
    production_errors: int,
    elapsed_s: float,
    remaining_s: float,
    design_effect: float = 1.0,
) -> Coverage:
    """The window's coverage after ``elapsed_s`` of its length, ``remaining_s`` left; the need
    ``design_effect`` times the independent requests' (``rules/units.py``)."""
    rate = production_errors / production_requests if production_requests else 0.0
    realised = realised_share(canary_requests, production_requests, share)
    if detection.on and canary_requests and not production_requests:
        needed = None
    else:
        # the realised share once both sides have answered; before the canary's first request
        # (sticky users: none of them in its bucket yet) the window's own
        sized_at = realised if canary_requests and production_requests else share
        needed = _clustered(requests_needed(detection, sized_at, rate), detection, design_effect)
    # the adapter's pace so far at the share it has now -- or at the share its users gave the
    # canary, where sticky users gave it less (twenty users at 10 % may hold none of them)
    pace = (canary_requests + production_requests) / elapsed_s if elapsed_s > 0 else 0.0
    projected = canary_requests + math.floor(pace * min(share, realised) * max(remaining_s, 0.0))
    return Coverage(needed, canary_requests, projected, share, detection.describe(), max(1.0, design_effect))


def _clustered(needed: int | None, detection: Detection, design_effect: float) -> int | None:
    """The need where each request counts as ``1 / design_effect`` of one (the minimum is
    a count of requests, not of independent ones: it stays)."""
    if needed is None or not detection.on or design_effect <= 1.0:
        return needed
    return max(detection.min_requests, math.ceil(needed * design_effect))


def ramped_share(
    detection: Detection,
    now: Coverage,
    production_requests: int,
    production_errors: int,
    elapsed_s: float,
    remaining_s: float,
    cap: float,
) -> float | None:
    """The share that brings the needed requests by the window's end, at the adapter's pace
    so far, with a margin -- at most ``cap``; None where no raise is due: the need is met or
    will be, the share is 0 (a dark canary) or already at the cap, the window is over, too
    young to project, or no share can decide it."""
    if now.needed is None or now.met or now.projected >= now.needed:
        return None
    if now.share <= 0 or now.share >= cap or remaining_s <= 0:
        return None
    length = elapsed_s + remaining_s
    all_requests = now.canary_requests + production_requests
    if all_requests == 0 or elapsed_s < MIN_ELAPSED_FRACTION * length:
        return None
    pace = all_requests / elapsed_s  # the adapter's requests per second, both sides
    rate = production_errors / production_requests if production_requests else 0.0
    # the part of the share the users' buckets turned into requests so far (sticky users: a
    # few may hold none of it, or all), so the raise makes up for it
    efficiency = min(1.0, realised_share(now.canary_requests, production_requests, now.share) / now.share)
    if efficiency <= 0.0:
        return cap
    wanted = now.share
    for _ in range(4):  # the need grows a little with the share: settle it
        needed = _clustered(requests_needed(detection, wanted, rate), detection, now.design_effect)
        if needed is None:
            return cap
        wanted = RAMP_MARGIN * (needed - now.canary_requests) / (pace * remaining_s * efficiency)
    raised = min(cap, max(wanted, now.share * MIN_RAMP_STEP))
    return raised if raised > now.share else None
