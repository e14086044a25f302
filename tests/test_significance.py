"""The significance figures of the live verdict against a table of known cases.

Every reference value below was computed with scipy 1.17.1 and statsmodels 0.15.0 (in a
scratch environment; the registry runs without them):

- Fisher: ``scipy.stats.fisher_exact([[x1, n1 - x1], [x2, n2 - x2]], alternative="greater")``
- pooled z: ``statsmodels.stats.proportion.proportions_ztest([x1, x2], [n1, n2], alternative="larger")``
  (nan, shown as None, where both rates are 0 or 1: ours answers z = 0, p = 1)
- Wilson: ``proportion_confint(x, n, alpha, method="wilson")``
- Newcombe: ``confint_proportions_2indep(x1, n1, x2, n2, method="newcomb", compare="diff")``
- Mann-Whitney: ``scipy.stats.mannwhitneyu(a, b, alternative="greater", use_continuity=True,
  method=...)`` with the method named in the row
- Wilcoxon signed-rank: ``scipy.stats.wilcoxon(d, alternative="greater", correction=True,
  zero_method="wilcox", method=...)`` with the method named in the row
- quantile intervals: ``scipy.stats.quantile_test(x, q=0, p=q).confidence_interval(c)``
"""

from __future__ import annotations

import math

import pytest

from loragate.registry.rules.significance import (
    fisher_exact_greater,
    mann_whitney_greater,
    newcombe_difference,
    quantile_interval,
    two_proportion_z,
    two_sided_z,
    wilcoxon_greater,
    wilson_interval,
)

TOLERANCE = 1e-6


def golden_sample(n: int, seed: int) -> list[float]:
    """A fixed, exponential-looking sample without a random generator (the golden ratio's
    fractional parts through the exponential's inverse cdf, mean 100)."""
    return [round(-100 * math.log(1 - ((i + seed) * 0.6180339887498949) % 1), 3) for i in range(n)]


SAMPLES = {
    "shifted-16-16": ([v + 40 for v in golden_sample(16, 1)], golden_sample(16, 40)),
    "small-5-7": (golden_sample(5, 3), golden_sample(7, 9)),
    "scaled-40-30": ([v * 1.3 for v in golden_sample(40, 5)], golden_sample(30, 77)),
    "normal-60-50": (golden_sample(60, 11), golden_sample(50, 200)),
    "ties-10-12": ([round(v / 60) for v in golden_sample(10, 2)], [round(v / 60) for v in golden_sample(12, 31)]),
    "ties-100-100": ([round(v / 50) for v in golden_sample(100, 7)], [round(v / 60) for v in golden_sample(100, 300)]),
    "ties-shifted-80-90": (
        [round(v / 50) + 1 for v in golden_sample(80, 13)],
        [round(v / 50) for v in golden_sample(90, 400)],
    ),
    "outlier-16-16": ([100.0 + i for i in range(15)] + [1113.0], [100.5 + i for i in range(16)]),
    "slower-16-16": ([150.0 + 1.5 * i for i in range(16)], [100.0 + i for i in range(16)]),
    "one-one": ([2.0], [1.0]),
}


# fmt: off
# (x1, n1, x2, n2), Fisher p, z, z's p,
#     Wilson interval of x1/n1 (low, high), Newcombe interval of x1/n1 - x2/n2 (low, high)
PROPORTIONS = [
    ((1, 100, 0, 1000), 0.0909090909091, 3.16371603989, 0.000778843470961,
        0.00176743206414, 0.0544861961787, 0.000921494873862, 0.0544861961787),
    ((10, 100, 1, 1000), 2.56722552069e-10, 9.48683298051, 1.1908000822e-21,
        0.0552291370607, 0.174365661505, 0.0539890733414, 0.173370220431),
    ((5, 100, 10, 1000), 0.00807096385953, 3.28848477333, 0.000503641164809,
        0.0215436791544, 0.111750469232, 0.0103552792394, 0.101918552716),
    ((3, 20, 1, 20), 0.302494802495, 1.05409255339, 0.145920272572,
        0.0523687458962, 0.360418864741, -0.110182499157, 0.314398773064),
    ((60, 10000, 400, 100000), 0.00307590564775, 2.95502428331, 0.00156322220871,
        0.00466452289345, 0.00771486749678, 0.000602792910834, 0.00375488168184),
    ((7, 7, 0, 3), 0.00833333333333, 3.16227766017, 0.000782701129001,
        0.645669564933, 1, 0.336050473391, 1),
    ((0, 10, 5, 10), 1, -2.58198889747, 0.995088362746,
        0, 0.277532799863, -0.763406909487, -0.11736746745),
    ((2, 1000, 1, 1000), 0.5, 0.577783769641, 0.281705057195,
        0.000548643588121, 0.00726280786349, -0.00386413258143, 0.00632683982186),
    ((12, 400, 9, 600), 0.0826732363433, 1.62067482743, 0.0525436974988,
        0.0172430209651, 0.0516985357091, -0.00339993729076, 0.0378271095012),
    ((0, 50, 0, 50), 1, None, None,
        0, 0.0713475991334, -0.0713475991334, 0.0713475991334),
    ((50, 50, 50, 50), 1, None, None,
        0.928652400867, 1, -0.0713475991334, 0.0713475991334),
]
# fmt: on
# (x, n), Wilson interval at 90 %
WILSON_90 = [
    ((0, 10), 0, 0.212941970083),
    ((10, 10), 0.787058029917, 1),
    ((3, 17), 0.0728144665471, 0.368966978069),
    ((250, 1000), 0.228171768989, 0.273177352631),
]
# sample pair (SAMPLES), U, one-sided p, scipy's method
RANKS = [
    ("shifted-16-16", 159.0, 0.127113636164, "exact"),
    ("small-5-7", 21.0, 0.319444444444, "exact"),
    ("scaled-40-30", 689.0, 0.147816887362, "exact"),
    ("normal-60-50", 1525.0, 0.441536981393, "asymptotic"),
    ("ties-10-12", 62.0, 0.459375603486, "asymptotic"),
    ("ties-100-100", 5380.5, 0.169696384915, "asymptotic"),
    ("ties-shifted-80-90", 4928.0, 1.18611581885e-05, "asymptotic"),
    ("outlier-16-16", 121.0, 0.609778424147, "exact"),
    ("slower-16-16", 256.0, 1.66367097752e-09, "exact"),
    ("one-one", 1.0, 0.5, "exact"),
]


def paired(n: int, first: int, second: int, shift: float = 0.0) -> list[float]:
    return [a - b + shift for a, b in zip(golden_sample(n, first), golden_sample(n, second), strict=True)]


# differences, W+, p, scipy's method
SIGNED_RANKS = [
    ("shifted-16", paired(16, 1, 40, 60), 106.0, 0.02532958984375, "exact"),
    ("null-12", paired(12, 3, 9), 47.0, 0.28466796875, "exact"),
    (
        "log-ratio-30",
        [math.log((a * 1.2 + 1) / (b + 1)) for a, b in zip(golden_sample(30, 5), golden_sample(30, 77), strict=True)],
        291.0,
        0.11832617223262787,
        "exact",
    ),
    ("normal-60", paired(60, 2, 33, 30), 971.0, 0.3414280044150732, "approx"),
    ("ties-10", [1, 1, 2, 2, -1, 3, 3, 3, -2, 4], 48.0, 0.019955831939763816, "approx"),
    ("zeros-9", [0, 0, 1.5, 2.5, -0.5, 3.5, 4.5, -5.5, 6.5], 21.0, 0.1484375, "exact"),
]
# n, quantile, confidence, interval of golden_sample(n, n)
QUANTILES = [
    (100, 0.95, 0.95, 228.862, 577.454),
    (300, 0.95, 0.975, 250.953, 379.546),
    (50, 0.5, 0.95, 43.471, 103.379),
    (20, 0.5, 0.975, 24.179, 150.098),
    (1000, 0.99, 0.95, 402.292, 563.835),
    (10, 0.95, 0.95, 135.73, None),
]


def close(got: float | None, want: float | None) -> bool:
    if want is None:
        return got is None
    return got is not None and math.isclose(got, want, rel_tol=TOLERANCE, abs_tol=1e-12)


@pytest.mark.parametrize("counts, fisher, z, z_p, w_low, w_high, n_low, n_high", PROPORTIONS, ids=str)
def test_proportion_figures_match_scipy_and_statsmodels(counts, fisher, z, z_p, w_low, w_high, n_low, n_high):
    x1, n1, x2, n2 = counts
    exact = fisher_exact_greater(x1, n1, x2, n2)
    assert exact is not None and close(exact.p_value, fisher)
    normal = two_proportion_z(x1, n1, x2, n2)
    assert normal is not None
    if z is None:  # both rates 0 or both 1: no evidence, not nan
        assert (normal.statistic, normal.p_value) == (0.0, 1.0)
    else:
        assert close(normal.statistic, z) and close(normal.p_value, z_p)
    assert wilson_interval(x1, n1) == pytest.approx((w_low, w_high), abs=TOLERANCE)
    difference = newcombe_difference(x1, n1, x2, n2)
    assert difference is not None
    assert difference[0] == pytest.approx(x1 / n1 - x2 / n2)
    assert difference[1:] == pytest.approx((n_low, n_high), abs=TOLERANCE)


@pytest.mark.parametrize("counts, low, high", WILSON_90, ids=str)
def test_wilson_follows_the_confidence(counts, low, high):
    assert wilson_interval(*counts, confidence=0.90) == pytest.approx((low, high), abs=TOLERANCE)


@pytest.mark.parametrize("name, u, p, method", RANKS, ids=[r[0] for r in RANKS])
def test_mann_whitney_matches_scipy(name, u, p, method):
    a, b = SAMPLES[name]
    got = mann_whitney_greater(a, b)
    assert got is not None
    assert got.u == u and close(got.p_value, p)
    assert got.method == {"exact": "exact", "asymptotic": "normal"}[method]
    assert got.superiority == pytest.approx(u / (len(a) * len(b)))


@pytest.mark.parametrize("name, differences, w, p, method", SIGNED_RANKS, ids=[r[0] for r in SIGNED_RANKS])
def test_wilcoxon_signed_rank_matches_scipy(name, differences, w, p, method):
    got = wilcoxon_greater(differences)
    assert got is not None
    assert got.w == w and close(got.p_value, p)
    assert got.method == {"exact": "exact", "approx": "normal"}[method]


def test_the_exact_signed_rank_distribution_sums_to_every_sign_pattern():
    # every difference positive: exactly one of the 2^n sign patterns is as extreme
    got = wilcoxon_greater([float(i) for i in range(1, 11)])
    assert got is not None and got.p_value == pytest.approx(1 / 2**10)


@pytest.mark.parametrize("n, q, confidence, low, high", QUANTILES, ids=str)
def test_quantile_intervals_match_scipy(n, q, confidence, low, high):
    assert quantile_interval(golden_sample(n, n), q, confidence) == (low, high)


def test_the_noise_case_of_the_issue_is_not_significant_and_ten_errors_are():
    # 1 error in 100 against 0 in 1000: the z-test calls it significant, the exact test does not
    one = fisher_exact_greater(1, 100, 0, 1000)
    ten = fisher_exact_greater(10, 100, 1, 1000)
    assert one is not None and ten is not None
    assert one.p_value > 0.05 and ten.p_value < 1e-6


# -- edges: nothing to compare is None, never an exception ----------------------------------

NONE_CASES = [
    ("fisher, empty canary", lambda: fisher_exact_greater(0, 0, 1, 10)),
    ("fisher, empty production", lambda: fisher_exact_greater(1, 10, 0, 0)),
    ("z, empty side", lambda: two_proportion_z(0, 0, 0, 0)),
    ("wilson, no trials", lambda: wilson_interval(0, 0)),
    ("newcombe, empty side", lambda: newcombe_difference(1, 10, 0, 0)),
    ("fisher, more events than trials", lambda: fisher_exact_greater(11, 10, 0, 10)),
    ("z, a negative count", lambda: two_proportion_z(-1, 10, 0, 10)),
    ("wilson, more events than trials", lambda: wilson_interval(3, 2)),
    ("rank test, empty a", lambda: mann_whitney_greater([], [1.0])),
    ("rank test, empty b", lambda: mann_whitney_greater([1.0], [])),
    ("signed-rank test, no pairs", lambda: wilcoxon_greater([])),
    ("signed-rank test, only zeros", lambda: wilcoxon_greater([0.0, 0.0])),
]


@pytest.mark.parametrize("case, call", NONE_CASES, ids=[c[0] for c in NONE_CASES])
def test_an_empty_or_impossible_side_gives_no_result(case, call):
    assert call() is None


def test_an_empty_sample_has_no_quantile_interval():
    assert quantile_interval([], 0.95) == (None, None)


def test_all_ties_are_no_evidence():
    got = mann_whitney_greater([5.0] * 8, [5.0] * 12)
    assert got is not None and got.p_value == 1.0 and got.superiority == 0.5


def test_zero_counts_on_both_sides_are_no_evidence():
    for test in (fisher_exact_greater(0, 100, 0, 1000), two_proportion_z(0, 100, 0, 1000)):
        assert test is not None and test.p_value == 1.0


def test_the_exact_rank_distribution_sums_to_every_ordering():
    # P(U >= 0) is 1, and the most extreme U has exactly one ordering out of C(m+n, m)
    lowest = mann_whitney_greater([1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0])
    highest = mann_whitney_greater([4.0, 5.0, 6.0, 7.0], [1.0, 2.0, 3.0])
    assert lowest is not None and lowest.p_value == 1.0
    assert highest is not None and highest.p_value == pytest.approx(1 / math.comb(7, 3))


def test_the_normal_quantile_of_a_95_percent_interval():
    assert two_sided_z(0.95) == pytest.approx(1.959963984540054, abs=1e-12)
