"""tokenmix.stats against R's printed t.test output (official/r_ttest.py), scipy called here, rliable's probability
of improvement (official/rliable.py) and hand-worked numbers."""
import math

import numpy as np
import pytest
from scipy import stats as st

from official import r_ttest as R
from official import rliable
from tokenmix.stats import (PAPER_EFFECTS, adjust, compare, min_detectable, power, probability_of_improvement,
                            seeds_needed, summarize, summary_from_stats)

pytestmark = pytest.mark.timeout(60)


def test_summary_hand_worked():
    s = summarize([1.0, 2.0, 3.0])
    # mean 2; squared deviations 1 + 0 + 1 = 2, / (n-1) = 1 -> std 1; se = 1/sqrt(3)
    assert (s.n, s.mean, s.std) == (3, 2.0, 1.0)
    assert s.se == pytest.approx(0.5773502692)
    s = summarize([84.0, 86.0])  # mean 85; deviations 1, 1 -> var 2 -> std 1.41421; se = 1.41421/sqrt(2) = 1
    assert s.mean == 85.0 and s.std == pytest.approx(1.4142135624) and s.se == pytest.approx(1.0)


def test_summary_single_seed_and_missing_values():
    s = summarize([70.0])
    assert (s.n, s.mean, s.std, s.se) == (1, 70.0, None, None)
    s = summarize([None, float("nan"), 4.0, 6.0], seeds=[0, 1, 2, 3])  # unmeasured / NaN seeds do not count
    assert (s.n, s.mean, s.seeds) == (2, 5.0, (2, 3))
    assert summarize([]) is None and summarize([None]) is None


def test_welch_matches_r_on_sleep_and_mtcars():
    d = compare(summarize(R.SLEEP_GROUP1), summarize(R.SLEEP_GROUP2))
    w = R.SLEEP_WELCH
    assert d.test == "Welch" and d.delta == pytest.approx(w["means"][0] - w["means"][1])
    assert d.df == pytest.approx(w["df"], abs=5e-4) and d.p == pytest.approx(w["p"], abs=5e-6)
    assert d.ci == pytest.approx(w["ci"], abs=5e-8)
    auto = [m for m, a in zip(R.MTCARS_MPG, R.MTCARS_AM) if a == 0]
    manual = [m for m, a in zip(R.MTCARS_MPG, R.MTCARS_AM) if a == 1]
    d, w = compare(summarize(auto), summarize(manual)), R.MTCARS_WELCH
    assert (len(auto), len(manual)) == (19, 13)
    assert d.delta == pytest.approx(w["means"][0] - w["means"][1], abs=1e-5)
    assert d.df == pytest.approx(w["df"], abs=5e-4) and d.p == pytest.approx(w["p"], abs=5e-7)
    assert d.ci == pytest.approx(w["ci"], abs=5e-7)
    t = d.delta / math.sqrt(summarize(auto).se ** 2 + summarize(manual).se ** 2)
    assert t == pytest.approx(w["t"], abs=5e-5)


def test_paired_matches_r_on_sleep_when_seeds_agree():
    ids = list(range(1, 11))
    a, b = summarize(R.SLEEP_GROUP1, ids), summarize(R.SLEEP_GROUP2, ids[::-1])  # b's seeds in another order
    b = summarize([R.SLEEP_GROUP2[i - 1] for i in b.seeds], b.seeds)  # same pairs, listed in reverse
    d, p = compare(a, b, paired=True), R.SLEEP_PAIRED
    assert d.test == "paired" and d.delta == pytest.approx(p["mean_difference"])
    assert d.df == p["df"] and d.p == pytest.approx(p["p"], abs=5e-7) and d.ci == pytest.approx(p["ci"], abs=5e-8)
    # not asked for, or seeds that differ: Welch
    assert compare(a, b).test == "Welch"
    assert compare(a, summarize(R.SLEEP_GROUP2, [i + 10 for i in ids]), paired=True).test == "Welch"


@pytest.mark.parametrize("x, y", [([84.0, 86.0], [80.0, 82.0]),       # n = 2
                                  ([10.0, 12.0, 14.0], [9.0, 9.1]),    # unequal variances and n
                                  ([10.0, 12.0, 14.0], [9.0, 9.0]),    # a zero-sd side
                                  ([1.0, 2.0, 2.0, 3.0], [2.0, 2.0, 3.0])])  # ties
def test_welch_equals_scipy_on_small_cases(x, y):
    d, r = compare(summarize(x), summarize(y)), st.ttest_ind(x, y, equal_var=False)
    assert d.test == "Welch" and d.p == pytest.approx(r.pvalue, rel=1e-12) and d.df == pytest.approx(r.df)
    assert d.ci == pytest.approx(tuple(r.confidence_interval()), rel=1e-12)


def test_zero_sd_ties_undecided_and_paired_fallback():
    # a zero-sd side, hand-worked: a = 10, 12, 14 (se 2/√3), b = 9, 9 (se 0): t = 3/(2/√3) = 2.598 on df = 2
    d = compare(summarize([10.0, 12.0, 14.0]), summarize([9.0, 9.0]))
    assert d.df == pytest.approx(2.0) and d.p == pytest.approx(2 * st.t.sf(3 / (2 / math.sqrt(3)), 2))
    # both sides constant: scipy's 0/0 (nan, or p = 0 for different values) is no test; never significant
    tie = compare(summarize([5.0, 5.0]), summarize([5.0, 5.0, 5.0]))
    apart = compare(summarize([5.0, 5.0]), summarize([4.0, 4.0]))
    assert (tie.test, tie.p, apart.test, apart.p, apart.delta) == ("tie", None, "no spread", None, 1.0)
    assert compare(summarize([5.0]), summarize([1.0, 2.0])).test == "undecided"
    # paired differences all equal (1, 1, 1): the paired t is 0/0, Welch is used
    d = compare(summarize([2.0, 3.0, 5.0], [0, 1, 2]), summarize([1.0, 2.0, 4.0], [0, 1, 2]), paired=True)
    assert d.test == "Welch" and d.p == pytest.approx(st.ttest_ind([2, 3, 5], [1, 2, 4], equal_var=False).pvalue)
    assert not any(x.significant for x in adjust({1: tie, 2: apart}).values())


def test_benjamini_hochberg_hand_worked():
    # p sorted 0.01, 0.03, 0.04, 0.2 (m = 4): p·m/rank = 0.04, 0.06, 0.0533, 0.2 -> running min from the top:
    # 0.04, 0.0533, 0.0533, 0.2
    ds = {k: compare(summarize([0.0, 1.0]), summarize([0.0, 2.0])) for k in "abcde"}
    from dataclasses import replace
    ds = {k: replace(d, p=p) for (k, d), p in zip(ds.items(), [0.01, 0.04, 0.03, 0.2, None])}
    q = adjust(ds)
    assert [q[k].p_adj for k in "abcd"] == pytest.approx([0.04, 0.16 / 3, 0.16 / 3, 0.2]) and q["e"].p_adj is None
    assert [q[k].significant for k in "abcde"] == [True, False, False, False, False]


def test_minimum_detectable_effect_and_seeds():
    # the figures: VOC seed sd 3.74, 3 seeds a side -> 11.5; 10 seeds -> 5.0
    assert min_detectable(3.74, 3, 3) == pytest.approx(11.49, abs=0.01)
    assert min_detectable(3.74, 10, 10) == pytest.approx(4.96, abs=0.01)
    # power by simulation: t-tests on normal draws with the MDE as the true effect reject 80 % of the time
    rng = np.random.default_rng(0)
    x, y = rng.normal(min_detectable(1.0, 4, 4), 1.0, (20000, 4)), rng.normal(0.0, 1.0, (20000, 4))
    assert (st.ttest_ind(x, y, axis=1).pvalue < 0.05).mean() == pytest.approx(0.8, abs=0.01)
    # large n: the normal approximation (z_0.975 + z_0.8) * sd * sqrt(2 / n)
    assert min_detectable(1.0, 2000, 2000) == pytest.approx((1.959964 + 0.841621) * math.sqrt(2 / 2000), rel=1e-3)
    n = seeds_needed(PAPER_EFFECTS["voc_miou"], 3.74)
    assert power(5.98, 3.74, n, n) >= 0.8 > power(5.98, 3.74, n - 1, n - 1) and n == 8
    assert seeds_needed(1.0, 0.0) is None and min_detectable(0.0, 3, 3) is None and seeds_needed(0.0, 1.0) is None and seeds_needed(1e-6, 1.0) is None


def test_from_stats_equals_scipy_ttest_ind_from_stats():
    # docs/examples/lazy-study/supervised.md, lastvit VOC mIoU: the p = 0.091 on 2.2 df
    d = compare(summary_from_stats(45.62, 0.27, 3), summary_from_stats(47.65, 1.19, 3))
    r = st.ttest_ind_from_stats(45.62, 0.27, 3, 47.65, 1.19, 3, equal_var=False)
    assert d.p == pytest.approx(r.pvalue, rel=1e-9) and d.p == pytest.approx(0.0914, abs=1e-4)
    assert d.df == pytest.approx(2.205, abs=1e-3)


def test_probability_of_improvement_against_rliable():
    x = np.array([[0.7, 1.9, 10.0], [-1.6, 0.8, 12.0], [0.8, 1.1, 14.0]])  # runs x tasks, ties in task 0
    y = np.array([[0.8, 0.1, 10.0], [-0.1, 1.1, 12.0], [3.4, 4.4, 14.0], [2.0, 5.5, 14.0]])
    got = probability_of_improvement(x.T, y.T, resamples=4000)
    assert got[0] == pytest.approx(rliable.probability_of_improvement(x, y), abs=1e-12)
    rng = np.random.default_rng(1)
    lo, hi = rliable.percentile_interval(x, y, 4000, rng)
    assert got[1] == pytest.approx(lo, abs=0.03) and got[2] == pytest.approx(hi, abs=0.03)
    # identical columns: 0.5 (rliable's special case), a single-seed task leaves the average
    assert probability_of_improvement([[1.0, 2.0]], [[1.0, 2.0]])[0] == 0.5
    assert probability_of_improvement([[1.0]], [[0.0]]) is None
