"""study.stats against hand-worked numbers."""
import math

import pytest

from study.stats import compare, summarize


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
    s = summarize([None, float("nan"), 4.0, 6.0])  # unmeasured / NaN seeds do not count
    assert (s.n, s.mean) == (2, 5.0)
    assert summarize([]) is None and summarize([None]) is None


def test_difference_outside_and_inside_noise():
    # a: 84, 86 (mean 85, se 1); b: 80, 82 (mean 81, se 1) -> delta 4, se_delta sqrt(1 + 1) = 1.41421
    # 2 se = 2.828 < 4 -> outside the noise
    d = compare(summarize([84.0, 86.0]), summarize([80.0, 82.0]))
    assert d.delta == 4.0 and d.se == pytest.approx(math.sqrt(2)) and d.inside_noise is False
    # b: 82, 84 (mean 83, se 1) -> delta 2 < 2.828 -> inside
    d = compare(summarize([84.0, 86.0]), summarize([82.0, 84.0]))
    assert d.delta == 2.0 and d.inside_noise is True
    # unequal spreads: a = 10, 12, 14 (mean 12, std 2, se 2/sqrt3 = 1.1547); b = 9, 9 (mean 9, se 0)
    # delta 3, se 1.1547, 2 se = 2.309 < 3 -> outside
    d = compare(summarize([10.0, 12.0, 14.0]), summarize([9.0, 9.0]))
    assert d.delta == 3.0 and d.se == pytest.approx(1.1547005384) and d.inside_noise is False
    # lower is better does not change the rule: negative delta of the same size is judged the same
    d = compare(summarize([9.0, 9.0]), summarize([10.0, 12.0, 14.0]))
    assert d.delta == -3.0 and d.inside_noise is False


def test_difference_undecided_with_one_seed():
    d = compare(summarize([5.0]), summarize([1.0, 2.0]))
    assert d.delta == pytest.approx(3.5) and d.se is None and d.inside_noise is None
