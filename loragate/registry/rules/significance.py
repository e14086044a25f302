"""The statistics of a live verdict, in pure Python (the registry carries no numpy/scipy).

Two questions are asked of a canary against production: *is it worse?* (a one-sided test,
whose p-value rolls back or not) and *by how much at most?* (an interval on the difference,
whose bound says whether the canary meets production's bar). Proportions (errors,
acceptance) get Fisher's exact test, the pooled two-proportion z-test, Wilson's interval
and Newcombe's interval on the difference; latencies get the Mann-Whitney rank test, or
Wilcoxon's signed-rank test where they come in back-to-back pairs, each exact for small
samples without ties, otherwise the normal approximation with tie and continuity
corrections. Every function answers None where there is nothing to compare (an empty side),
never an exception. Reference values (scipy, statsmodels): tests/test_significance.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

_NORMAL = NormalDist()
# the exact distribution of U is counted while it is this cheap (m * n polynomial terms)
EXACT_MAX_CELLS = 2500
# the exact distribution of W+ is counted up to this many pairs (scipy's own bound)
EXACT_MAX_PAIRS = 50


def normal_sf(z: float) -> float:
    """P(Z >= z) for a standard normal Z, accurate far into the tail (erfc, not 1 - cdf)."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def two_sided_z(confidence: float) -> float:
    """The normal quantile of a two-sided interval at ``confidence`` (0.95 -> 1.959964)."""
    return _NORMAL.inv_cdf(0.5 + confidence / 2.0)


@dataclass(frozen=True)
class ProportionTest:
    """A one-sided test of "a's rate is higher than b's": the statistic and its p-value."""

    statistic: float
    p_value: float
    method: str  # "z" (pooled normal approximation) or "exact" (Fisher)


def _counts(x1: int, n1: int, x2: int, n2: int) -> bool:
    """Whether both sides are event counts out of at least one trial."""
    return 0 <= x1 <= n1 and 0 <= x2 <= n2 and n1 > 0 and n2 > 0


def two_proportion_z(x1: int, n1: int, x2: int, n2: int) -> ProportionTest | None:
    """Pooled two-proportion z-test, one-sided: is x1/n1 higher than x2/n2?

    z = (p1 - p2) / sqrt(p (1 - p) (1/n1 + 1/n2)) with the pooled p = (x1 + x2) / (n1 + n2);
    the p-value is P(Z >= z). With no events or only events on both sides the rates are
    equal and there is no evidence: z = 0, p = 1. None when a side has no trials (or more
    events than trials). Rare events
    make it overconfident (1/100 against 0/1000 gives z = 3.2): decide with
    ``fisher_exact_greater`` there.
    """
    if not _counts(x1, n1, x2, n2):
        return None
    pooled = (x1 + x2) / (n1 + n2)
    variance = pooled * (1 - pooled) * (1 / n1 + 1 / n2)
    if variance <= 0:
        return ProportionTest(0.0, 1.0, "z")
    z = (x1 / n1 - x2 / n2) / math.sqrt(variance)
    return ProportionTest(z, normal_sf(z), "z")


def log_choose(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def fisher_exact_greater(x1: int, n1: int, x2: int, n2: int) -> ProportionTest | None:
    """Fisher's exact test, one-sided: is x1/n1 higher than x2/n2?

    Given the events of both sides together, the p-value is the hypergeometric probability
    that side 1 holds x1 of them or more -- exact at any count, so a single error among few
    requests is never "significant" (1/100 against 0/1000: p = 0.091). The statistic is
    the difference of the rates. None when a side has no trials (or more events than trials).
    """
    if not _counts(x1, n1, x2, n2):
        return None
    total, events = n1 + n2, x1 + x2
    low, high = max(0, events - n2), min(events, n1)
    denominator = log_choose(total, n1)
    mode = (n1 + 1) * (events + 1) // (total + 2)
    terms: list[float] = []
    peak = 0.0
    for k in range(max(low, x1), high + 1):
        term = math.exp(log_choose(events, k) + log_choose(total - events, n1 - k) - denominator)
        terms.append(term)
        peak = max(peak, term)
        # from the mode on the terms only shrink: stop once they no longer change the sum
        if k >= mode and term < 1e-17 * peak:
            break
    return ProportionTest(x1 / n1 - x2 / n2, min(1.0, math.fsum(terms)), "exact")


def wilson_interval(x: int, n: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """Wilson's score interval for the proportion x/n (two-sided, no continuity correction).

    Unlike the Wald interval it stays inside [0, 1] and is not empty at x = 0 or x = n.
    None when n = 0 (or x is not a count out of n).
    """
    if not 0 <= x <= n or n <= 0:
        return None
    z = two_sided_z(confidence)
    p = x / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_difference(
    x1: int, n1: int, x2: int, n2: int, confidence: float = 0.95
) -> tuple[float, float, float] | None:
    """Newcombe's hybrid score interval for p1 - p2 (his method 10): (difference, low, high).

    Built from each side's Wilson interval, so it behaves at zero counts where the Wald
    interval collapses. None when a side has no trials.
    """
    first, second = wilson_interval(x1, n1, confidence), wilson_interval(x2, n2, confidence)
    if first is None or second is None:
        return None
    p1, p2 = x1 / n1, x2 / n2
    (l1, u1), (l2, u2) = first, second
    difference = p1 - p2
    low = difference - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    high = difference + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return difference, low, high


@dataclass(frozen=True)
class RankTest:
    """Mann-Whitney U of sample a against sample b, one-sided "a tends to be larger".

    ``u`` counts the pairs (a_i, b_j) with a_i > b_j, ties as one half; ``superiority`` is
    u / (m n), the probability that a random a exceeds a random b (0.5: no tendency).
    ``z`` is the continuity-corrected normal statistic (None for the exact method).
    """

    u: float
    z: float | None
    p_value: float
    superiority: float
    method: str  # "exact" or "normal"


def _ranks(values: list[float]) -> tuple[list[float], list[int]]:
    """Mid-ranks (1-based) of ``values`` in their order, and the sizes of the tie groups."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    ties = []
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        ties.append(j - i + 1)
        i = j + 1
    return ranks, ties


def _u_counts(m: int, n: int) -> list[int]:
    """How many of the C(m+n, m) orderings give each U = 0..mn (no ties).

    These are the coefficients of the Gaussian binomial [m+n, m]_q, built as the product
    over i = 1..m of (1 - q^(n+i)) / (1 - q^i), every partial product a polynomial.
    """
    coefficients = [0] * (m * n + 1)
    coefficients[0] = 1
    for i in range(1, m + 1):
        for k in range(len(coefficients) - 1, n + i - 1, -1):
            coefficients[k] -= coefficients[k - n - i]
        for k in range(i, len(coefficients)):
            coefficients[k] += coefficients[k - i]
    return coefficients


def mann_whitney_greater(a: list[float], b: list[float]) -> RankTest | None:
    """Mann-Whitney U test, one-sided: do values of ``a`` tend to be larger than ``b``'s?

    Without ties and with m n <= EXACT_MAX_CELLS the p-value is P(U >= u) under the exact
    null distribution; otherwise the normal approximation, its variance corrected for ties
    and its statistic z = (u - mn/2 - 1/2) / sigma corrected for continuity (scipy's
    ``mannwhitneyu(a, b, alternative="greater")``). When every value ties there is no
    evidence either way: z = 0, p = 1. None when a sample is empty.
    """
    m, n = len(a), len(b)
    if m == 0 or n == 0:
        return None
    ranks, ties = _ranks([*a, *b])
    u = math.fsum(ranks[:m]) - m * (m + 1) / 2
    superiority = u / (m * n)
    if all(t == 1 for t in ties) and m * n <= EXACT_MAX_CELLS:
        counts = _u_counts(m, n)
        at_least = sum(counts[math.ceil(u) :])
        return RankTest(u, None, min(1.0, at_least / math.comb(m + n, m)), superiority, "exact")
    total = m + n
    tie_term = sum(t**3 - t for t in ties) / (total * (total - 1))
    variance = m * n / 12 * ((total + 1) - tie_term)
    if variance <= 0:
        return RankTest(u, 0.0, 1.0, superiority, "normal")
    z = (u - m * n / 2 - 0.5) / math.sqrt(variance)
    return RankTest(u, z, normal_sf(z), superiority, "normal")


@dataclass(frozen=True)
class SignedRankTest:
    """Wilcoxon's signed-rank test of paired differences, one-sided "the differences tend to
    be above zero". ``w`` is the sum of the ranks of |d| over the positive differences (ties
    as mid-ranks) among the ``n`` non-zero ones; ``z`` as in ``RankTest``."""

    w: float
    n: int
    z: float | None
    p_value: float
    method: str  # "exact" or "normal"


def _w_counts(n: int) -> list[int]:
    """How many of the 2^n sign patterns give each W+ = 0..n(n+1)/2 (no ties)."""
    counts = [1] + [0] * (n * (n + 1) // 2)
    for rank in range(1, n + 1):
        for total in range(len(counts) - 1, rank - 1, -1):
            counts[total] += counts[total - rank]
    return counts


def wilcoxon_greater(differences: list[float]) -> SignedRankTest | None:
    """Wilcoxon's signed-rank test, one-sided: do the paired ``differences`` tend to be
    positive? Zeros are dropped (scipy's ``zero_method="wilcox"``). Without ties and with at
    most EXACT_MAX_PAIRS pairs the p-value is P(W+ >= w) under the exact null distribution;
    otherwise the normal approximation, its variance corrected for ties and corrected for
    continuity (scipy's ``wilcoxon(d, alternative="greater", correction=True)``). None when
    no difference is non-zero.
    """
    nonzero = [d for d in differences if d != 0]
    n = len(nonzero)
    if n == 0:
        return None
    ranks, ties = _ranks([abs(d) for d in nonzero])
    w = math.fsum(r for r, d in zip(ranks, nonzero, strict=True) if d > 0)
    if all(t == 1 for t in ties) and n <= EXACT_MAX_PAIRS:
        counts = _w_counts(n)
        return SignedRankTest(w, n, None, min(1.0, sum(counts[math.ceil(w) :]) / 2**n), "exact")
    mean = n * (n + 1) / 4
    variance = n * (n + 1) * (2 * n + 1) / 24 - sum(t**3 - t for t in ties) / 48
    if variance <= 0:
        return SignedRankTest(w, n, 0.0, 1.0, "normal")
    z = (w - mean - 0.5) / math.sqrt(variance)
    return SignedRankTest(w, n, z, normal_sf(z), "normal")


def _binomial_cdfs(n: int, q: float) -> list[float]:
    """P(B <= k) for k = 0..n, B ~ Binomial(n, q), 0 < q < 1."""
    log_q, log_r = math.log(q), math.log1p(-q)
    pmf = [math.exp(log_choose(n, k) + k * log_q + (n - k) * log_r) for k in range(n + 1)]
    cdfs, running = [], 0.0
    for p in pmf:
        running += p
        cdfs.append(min(1.0, running))
    return cdfs


def quantile_interval(values: list[float], q: float, confidence: float = 0.95) -> tuple[float | None, float | None]:
    """A distribution-free interval for the q-quantile (0 < q < 1) of what ``values`` sample.

    Between the order statistics x_(l) and x_(u) (1-based) lies the quantile with probability
    P(l <= B < u), B ~ Binomial(n, q) the samples below it; l is the largest rank and u the
    smallest whose tail outside holds at most (1 - confidence) / 2 each, so the coverage is at
    least ``confidence`` whatever the distribution. A bound that needs a rank outside 1..n is
    None: 100 samples cannot bound a p95 from above at 95 %.
    """
    n = len(values)
    if n == 0:
        return None, None
    tail = (1 - confidence) / 2
    cdfs = _binomial_cdfs(n, q)
    ordered = sorted(values)
    low_rank = max((k for k in range(1, n + 1) if cdfs[k - 1] <= tail), default=0)
    high_rank = min((k for k in range(1, n + 1) if 1 - cdfs[k - 1] <= tail), default=n + 1)
    low = ordered[low_rank - 1] if low_rank >= 1 else None
    high = ordered[high_rank - 1] if high_rank <= n else None
    return low, high
