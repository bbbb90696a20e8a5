"""The statistics behind verdicts (analysis/stats.py): order-statistic intervals of a median,
bootstrap and pairwise spreads of a ratio, verdicts against a threshold and repeats to decide.

Pure Python and numpy, deterministic: no job is launched.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis import sequential, stats
from analysis.stats import (
    MIN_CI_SAMPLES,
    REFUTED,
    REPRODUCED,
    UNDECIDED,
    Spread,
    judge,
    median_ci,
    ratio_spread,
    repeats_for_precision,
    repeats_to_decide,
    spread_of,
    verdict,
    within,
)

ONE_TO_TEN = [float(i) for i in range(1, 11)]


# --- median_ci ---------------------------------------------------------------------------


def test_median_ci_order_statistics_n10():
    # binomial(10, 1/2): P(B < 2) = 11/1024 <= 0.025 < P(B < 3) = 56/1024, so j = 2
    assert median_ci(ONE_TO_TEN) == (2.0, 9.0)


def test_median_ci_order_statistics_n20():
    # P(B < 6) = 21700/2^20 = 0.0207 <= 0.025 < P(B < 7) = 60460/2^20: [x_(6), x_(15)]
    x = [float(i) for i in range(1, 21)]
    assert median_ci(x) == (6.0, 15.0)


def test_median_ci_unsorted_input():
    x = [7.0, 3.0, 10.0, 1.0, 9.0, 2.0, 8.0, 4.0, 6.0, 5.0]
    assert median_ci(x) == (2.0, 9.0)


def test_median_ci_six_is_min_max():
    assert MIN_CI_SAMPLES == 6
    assert median_ci([5.0, 1.0, 3.0, 4.0, 6.0, 2.0]) == (1.0, 6.0)


def test_median_ci_too_few_samples():
    assert median_ci([1.0, 2.0, 3.0, 4.0, 5.0]) is None


def test_median_ci_drops_nan():
    assert median_ci([math.nan, *ONE_TO_TEN, math.nan]) == (2.0, 9.0)
    # six values with one NaN leave five: too few
    assert median_ci([1.0, 2.0, math.nan, 3.0, 4.0, 5.0]) is None


def test_median_ci_other_confidence():
    # 99 %: alpha/2 = 0.005 < P(B < 1) = 1/64, so no interval from six samples
    assert median_ci([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], confidence=0.99) is None
    # 80 % on 1..10: P(B < 3) = 56/1024 = 0.0547 <= 0.1 < P(B < 4) = 176/1024
    assert median_ci(ONE_TO_TEN, confidence=0.80) == (3.0, 8.0)
    with pytest.raises(ValueError):
        median_ci(ONE_TO_TEN, confidence=1.5)


# --- spread_of ---------------------------------------------------------------------------


def test_spread_of_single():
    assert spread_of([3.5]) == Spread(3.5, 3.5, 3.5, "single", 1)


def test_spread_of_range():
    assert spread_of([3.0, 1.0, 2.0]) == Spread(2.0, 1.0, 3.0, "range", 3)
    assert spread_of([1.0, 2.0, 3.0, 4.0, math.nan]) == Spread(2.5, 1.0, 4.0, "range", 4)


def test_spread_of_ci():
    assert spread_of(ONE_TO_TEN) == Spread(5.5, 2.0, 9.0, "95% CI", 10)


def test_spread_of_empty():
    for empty in ([], [math.nan, math.nan]):
        s = spread_of(empty)
        assert s.kind == "none" and s.n == 0
        assert math.isnan(s.value) and math.isnan(s.lo) and math.isnan(s.hi)


# --- ratio_spread ------------------------------------------------------------------------


def test_ratio_spread_bootstrap_deterministic_and_covers_truth():
    den = np.linspace(9.0, 11.0, 15)
    num = 2.0 * den[::-1]  # true ratio of medians: 2
    a = ratio_spread(num, den, seed=7)
    b = ratio_spread(list(num), list(den), seed=7)
    assert a == b  # same seed, same interval
    assert a.kind == "95% CI" and a.n == 15
    assert a.value == pytest.approx(2.0)
    assert a.lo < 2.0 < a.hi
    assert 1.8 < a.lo and a.hi < 2.2


def test_ratio_spread_unequal_sizes_and_nan():
    den = [10.0, 10.5, 9.5, 10.2, 9.8, 10.1, 9.9, math.nan]
    num = [5.0, 5.2, 4.8, 5.1, 4.9, 5.05, 4.95, 5.0, 5.02]
    s = ratio_spread(num, den)
    assert s.kind == "95% CI"
    assert s.n == 7  # the smaller count, NaN dropped
    assert s.value == pytest.approx(5.0 / 10.0)
    assert s.lo <= 0.5 <= s.hi and s.hi - s.lo < 0.1


def test_ratio_spread_pairwise_range():
    s = ratio_spread([1.0, 2.0], [2.0, 4.0])
    assert s == Spread(0.5, 0.25, 1.0, "range", 2)


def test_ratio_spread_small_side_uses_range():
    # one side with enough samples, the other with three: still the pairwise range
    s = ratio_spread([float(i) for i in range(1, 9)], [2.0, 4.0, 8.0])
    assert s.kind == "range" and s.n == 3
    assert s.value == pytest.approx(4.5 / 4.0)
    assert (s.lo, s.hi) == (1.0 / 8.0, 8.0 / 2.0)


def test_ratio_spread_single_and_empty():
    assert ratio_spread([3.0], [2.0]) == Spread(1.5, 1.5, 1.5, "single", 1)
    assert ratio_spread([], [2.0]).kind == "none"


# --- judge -------------------------------------------------------------------------------


def test_judge_holds_below():
    s = spread_of(ONE_TO_TEN)  # 5.5, 95% CI 2-9
    assert judge(s, 10.0, holds_below=True) == REPRODUCED
    assert judge(s, 9.0, holds_below=True) == REPRODUCED  # inclusive at the threshold
    assert judge(s, 1.0, holds_below=True) == REFUTED
    assert judge(s, 5.0, holds_below=True) == UNDECIDED


def test_judge_holds_above():
    s = spread_of(ONE_TO_TEN)
    assert judge(s, 1.0, holds_below=False) == REPRODUCED
    assert judge(s, 2.0, holds_below=False) == REPRODUCED  # inclusive at the threshold
    assert judge(s, 10.0, holds_below=False) == REFUTED
    assert judge(s, 5.0, holds_below=False) == UNDECIDED


def test_judge_single_on_value():
    """``judge`` reads a spread as it stands (benchmarks.peer_fairness's goals); a claim's
    verdict no longer does (``verdict``, below)."""
    s = spread_of([0.5])
    assert judge(s, 0.6, holds_below=True) == REPRODUCED
    assert judge(s, 0.4, holds_below=True) == REFUTED
    assert judge(s, 0.4, holds_below=False) == REPRODUCED
    assert judge(s, 0.5, holds_below=False) == REPRODUCED


def test_judge_range_and_none():
    s = spread_of([0.55, 0.58, 0.61])
    assert judge(s, 0.7, holds_below=True) == REPRODUCED
    assert judge(s, 0.6, holds_below=True) == UNDECIDED
    assert judge(spread_of([]), 0.6, holds_below=True) == UNDECIDED


# --- verdict: a claim needs an interval of stated coverage ---------------------------------


def test_verdict_decides_on_a_confidence_interval():
    s = spread_of(ONE_TO_TEN)  # 5.5, 95% CI 2-9
    assert verdict(s, 10.0, holds_below=True) == REPRODUCED
    assert verdict(s, 9.0, holds_below=True) == REPRODUCED  # inclusive at the threshold
    assert verdict(s, 1.0, holds_below=True) == REFUTED
    assert verdict(s, 5.0, holds_below=True) == UNDECIDED
    assert verdict(s, 2.0, holds_below=False) == REPRODUCED
    assert verdict(Spread(0.5, 0.4, 0.6, "90% CI", 8), 0.7, holds_below=True) == REPRODUCED


def test_verdict_is_undecided_without_an_interval():
    # a range over 3 runs (75 % coverage of the median at best) and one run (none): what
    # judge takes as it stands is no verdict
    few = spread_of([0.55, 0.58, 0.61])
    assert judge(few, 0.7, holds_below=True) == REPRODUCED
    assert verdict(few, 0.7, holds_below=True) == UNDECIDED
    one = spread_of([0.5])
    assert judge(one, 0.6, holds_below=True) == REPRODUCED
    assert verdict(one, 0.6, holds_below=True) == UNDECIDED
    assert verdict(one, 0.4, holds_below=True) == UNDECIDED
    assert verdict(spread_of([]), 0.6, holds_below=True) == UNDECIDED


def test_the_ratio_rule_is_the_sequential_one():
    assert stats.decide is sequential.decide
    assert stats.decide_log_ratios is sequential.decide_log_ratios
    assert (stats.REPRODUCED, stats.UNDECIDED) == (sequential.REPRODUCED, sequential.UNDECIDED)
    d = stats.decide([0.5, 0.51, 0.49], [1.0, 1.0, 1.0], 0.7, holds_below=True)
    assert isinstance(d, stats.Decision) and d.verdict == REPRODUCED and d.n == 3
    # one run a side is no verdict, whatever its value
    assert stats.decide([0.5], [1.0], 0.7, holds_below=True).verdict == UNDECIDED


# --- repeats -----------------------------------------------------------------------------


def test_repeats_to_decide_straddling():
    s = Spread(1.0, 0.8, 1.3, "95% CI", 8)
    # half-width 0.3, gap 0.1: 8 * 3^2
    assert repeats_to_decide(s, 1.1, 8) == 72
    assert repeats_to_decide(s, 1.1) == 72  # n from the spread
    # gap 0.15 below: 8 * (0.3 / 0.15)^2
    assert repeats_to_decide(s, 0.85, 8) == 32


def test_repeats_to_decide_range_few_repeats():
    # half-width 0.05, gap 0.02: ceil(2 * 6.25) = 13
    assert repeats_to_decide(Spread(1.0, 0.95, 1.02, "range", 2), 0.98, 2) == 13
    # the formula gives ceil(2 * 1.5625) = 4: never below MIN_CI_SAMPLES
    assert repeats_to_decide(Spread(1.0, 0.9, 1.1, "range", 2), 0.92, 2) == MIN_CI_SAMPLES


def test_repeats_to_decide_none():
    s = Spread(1.0, 0.8, 1.3, "95% CI", 8)
    assert repeats_to_decide(s, 1.0, 8) is None  # value == threshold
    assert repeats_to_decide(s, 2.0, 8) is None  # already decided
    assert repeats_to_decide(spread_of([1.0]), 1.0, 1) is None  # one run on the threshold
    assert repeats_to_decide(spread_of([]), 1.0, 0) is None


def test_repeats_to_decide_below_an_interval_wants_the_runs_that_give_one():
    """A range over fewer than MIN_CI_SAMPLES runs is no interval, however narrow: wholly
    on one side of the threshold it is still undecided (C3's overlap, 0.45-0.45 over 2
    runs against 0.1, left --decide adding no run) and wants the runs that give one."""
    assert repeats_to_decide(Spread(0.45, 0.45, 0.45, "range", 2), 0.1) == MIN_CI_SAMPLES
    assert repeats_to_decide(spread_of([1.0]), 1.1, 1) == MIN_CI_SAMPLES  # one run
    assert repeats_to_decide(Spread(0.45, 0.44, 0.46, "range", 7), 0.1) == 8  # n + 1


def test_repeats_to_decide_then_decides():
    # shrinking the half-width by sqrt(n / n_needed) puts the threshold at the edge or out
    s = Spread(1.0, 0.8, 1.3, "95% CI", 8)
    need = repeats_to_decide(s, 1.1, 8)
    shrink = math.sqrt(8 / need)
    shrunk = Spread(1.0, 1.0 - 0.2 * shrink, 1.0 + 0.3 * shrink, "95% CI", need)
    assert judge(shrunk, 1.1, holds_below=True) == REPRODUCED


def test_repeats_for_precision():
    s = Spread(2.0, 1.75, 2.25, "95% CI", 8)  # half-width 12.5 % of the value
    assert s.half_width_share() == 0.125
    assert repeats_for_precision(s, 6.25, 8) == 32  # 8 * (12.5 / 6.25)^2
    assert repeats_for_precision(s, 25.0, 8) == 8  # already there: at least n
    assert repeats_for_precision(Spread(2.0, 1.75, 2.25, "range", 3), 25.0, 3) == MIN_CI_SAMPLES
    assert repeats_for_precision(spread_of([1.0]), 5.0, 1) == MIN_CI_SAMPLES
    with pytest.raises(ValueError):
        repeats_for_precision(Spread(0.0, -1.0, 1.0, "95% CI", 8), 5.0, 8)


def test_within():
    s = Spread(2.0, 1.75, 2.25, "95% CI", 8)
    assert within(s, 12.5)
    assert not within(s, 12.0)
    assert not within(Spread(2.0, 1.99, 2.01, "range", 3), 5.0)  # not a confidence interval
    assert not within(spread_of([2.0]), 5.0)


def test_half_width_share():
    assert Spread(2.0, 1.5, 2.25, "95% CI", 8).half_width_share() == 0.25  # larger half
    assert spread_of([3.0]).half_width_share() == 0.0
    assert Spread(0.0, -1.0, 1.0, "range", 3).half_width_share() == math.inf
    assert spread_of([]).half_width_share() == math.inf


# --- words -------------------------------------------------------------------------------


def test_words():
    assert Spread(0.58, 0.55, 0.61, "95% CI", 8).words() == "0.58 (95% CI 0.55-0.61, n=8)"
    assert Spread(0.58, 0.55, 0.61, "range", 3).words() == (
        "0.58 (range 0.55-0.61 over 3 repeats)")
    assert Spread(0.58, 0.58, 0.58, "single", 1).words() == "0.58 (one run)"
    assert Spread(0.5812, 0.55, 0.61, "95% CI", 8).words(".3f") == (
        "0.581 (95% CI 0.550-0.610, n=8)")
    assert spread_of([]).words() == "no data"
    assert Spread(-0.5, -0.75, -0.25, "range", 2).words() == (
        "-0.50 (range -0.75 to -0.25 over 2 repeats)")


def test_module_constants():
    assert (stats.REPRODUCED, stats.REFUTED, stats.UNDECIDED) == (
        "reproduced", "refuted", "undecided")
