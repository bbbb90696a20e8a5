"""The decide-then-stop rule for ratio claims (``analysis.sequential``): decisions both ways,
its looks and cap, its t quantiles, and its error rate and coverage by seeded simulation."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from analysis import sequential as sq
from analysis import stats
from tests.conftest import ROOT


@pytest.mark.parametrize("p,df,want", [(0.975, 2, 4.303), (0.975, 5, 2.571),
                                       (0.975, 10, 2.228), (0.995, 3, 5.841)])
def test_t_quantiles_match_the_tables(p, df, want):
    assert sq.t_quantile(p, df) == pytest.approx(want, abs=5e-4)


def test_decides_both_ways_on_paired_runs():
    b = [1.0, 1.01, 0.99, 1.0]
    d = sq.decide([0.61, 0.60, 0.59, 0.60], b, 0.7, holds_below=True)
    assert d.verdict == stats.REPRODUCED and d.n == 4 and d.wants == 0
    assert d.lo < 0.6 < d.hi <= 0.7
    assert d.words().startswith("reproduced (4 runs a side: 95% CS 0.5")
    d = sq.decide([0.81, 0.80, 0.79, 0.80], b, 0.7, holds_below=True)
    assert d.verdict == stats.REFUTED and d.lo >= 0.7
    # the same figures against a ">=" claim: the verdicts swap
    assert sq.decide([0.81, 0.80, 0.79, 0.80], b, 0.7, holds_below=False).verdict \
        == stats.REPRODUCED


def test_undecided_below_the_first_look_and_at_the_cap():
    d = sq.decide([0.5, 0.5], [1.0, 1.0], 0.7, holds_below=True)  # 2 runs: no look yet
    assert d.verdict == stats.UNDECIDED and d.n == 2 and d.wants == 1
    assert "3 before the first look" in d.words()
    rng = np.random.default_rng(1)
    a = list(0.7 * np.exp(rng.normal(0, 0.1, 14)))  # at the threshold, noisy: never decided
    d = sq.decide(a, [1.0] * 14, 0.7, holds_below=True)
    assert d.verdict == stats.UNDECIDED and d.n == sq.MAX_RUNS and d.wants == 0
    d = sq.decide(a[:5], [1.0] * 5, 0.7, holds_below=True)
    assert d.verdict == stats.UNDECIDED and d.wants == 1


def test_spending_adds_up_to_alpha_and_splits_over_k():
    assert sum(sq.spending(0.95).values()) == pytest.approx(0.05)
    assert sum(sq.spending(0.95, k=3).values()) == pytest.approx(0.05 / 3)


@pytest.mark.parametrize("ratio,cv,drift,k", [(1.00, 0.03, True, 3), (1.00, 0.15, True, 1),
                                              (0.98, 0.08, True, 3), (1.02, 0.03, False, 1)])
def test_simulated_wrong_decisions_stay_below_five_percent(ratio, cv, drift, k):
    """2,000 seeded studies a cell: P(wrong) <= 5 % plus 2 binomial standard errors of a 5 %
    rate at 2,000 (0.98 %); coverage at the stop >= 95 % less the same."""
    c = sq.simulate_cell(np.random.default_rng(7), 2000, ratio, cv, drift, k)
    assert c["wrong"] <= 0.05 + 0.0098, c
    assert c["coverage"] >= 0.95 - 0.0098, c


def test_a_clear_claim_is_decided_with_fewer_runs_than_a_fixed_six():
    c = sq.simulate_cell(np.random.default_rng(3), 2000, 0.80, 0.03, False, 1)
    assert c["reproduced"] >= 0.95 and c["runs_mean"] < sq.FIXED, c


@pytest.mark.parametrize("bad", ["0", "x"])
def test_bad_study_count_exits_2_naming_the_flag(bad):
    res = subprocess.run([sys.executable, "-m", "analysis.sequential", "--simulate",
                          "--studies", bad], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and "--studies" in res.stderr and not res.stdout
