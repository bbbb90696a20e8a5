"""The decide-then-stop rule for ratio claims (``analysis.sequential``): its t quantiles, its
decisions both ways on hand-made runs, no verdict below 3 runs a side and none past the cap,
best of k, and its wrong-decision rate and coverage by seeded simulation; the CLI's bad input.

Pure Python and numpy, deterministic: the simulation is seeded per cell.
"""

from __future__ import annotations

import math
import subprocess

import numpy as np
import pytest

from analysis import sequential as sq
from analysis import stats
from tests.conftest import PY, ROOT

BASE = [1.0, 1.01, 0.99, 1.0]


# --- Student's t ---------------------------------------------------------------------------


@pytest.mark.parametrize("q,df,want", [
    # two-sided 95 %, 99 % and 99.5 % points of Student's t (NIST/SEMATECH e-Handbook of
    # Statistical Methods, table 1.3.6.7.2; Abramowitz & Stegun table 26.10)
    (0.975, 1, 12.706205), (0.975, 2, 4.302653), (0.975, 5, 2.570582),
    (0.975, 10, 2.228139), (0.975, 22, 2.073873), (0.995, 3, 5.840909),
    (0.995, 10, 3.169273), (0.9975, 2, 14.089047),
])
def test_t_quantiles_match_the_tables(q, df, want):
    assert sq.t_quantile(q, df) == pytest.approx(want, abs=2e-6)


def test_incomplete_beta_at_known_points():
    assert sq.betainc(1.0, 1.0, 0.3) == pytest.approx(0.3)  # uniform
    assert sq.betainc(2.5, 2.5, 0.5) == pytest.approx(0.5)  # symmetric
    assert sq.betainc(2.0, 3.0, 0.0) == 0.0 and sq.betainc(2.0, 3.0, 1.0) == 1.0
    # df = 2 has a closed form: P(|T| > t) = 1 - t / sqrt(t^2 + 2)
    assert sq.t_two_sided(3.0, 2) == pytest.approx(1 - 3 / math.sqrt(11))
    with pytest.raises(ValueError):
        sq.t_quantile(0.4, 5)


def test_spending_adds_up_to_alpha_in_proportion_to_the_runs_and_splits_over_k():
    shares = sq.spending()
    assert list(shares) == list(range(3, 13))
    assert sum(shares.values()) == pytest.approx(0.05)
    assert shares[12] == pytest.approx(4 * shares[3])
    assert sum(sq.spending(0.95, k=3).values()) == pytest.approx(0.05 / 3)
    # the interval widens for the pick: the same look at k = 3 has the larger t
    assert sq.critical_t(6, 3) > sq.critical_t(6, 1) > sq.fixed_t(6, 1)


# --- decisions -------------------------------------------------------------------------


def test_decides_both_ways_on_paired_runs():
    d = sq.decide([0.61, 0.60, 0.59, 0.60], BASE, 0.7, holds_below=True)
    assert d.verdict == stats.REPRODUCED and d.wants == 0 and d.coverage == 0.95
    assert d.lo < 0.6 < d.hi <= 0.7
    assert d.words() == f"0.60 (95% CI {d.lo:.2f}-{d.hi:.2f}, n={d.n} a side)"
    d = sq.decide([0.81, 0.80, 0.79, 0.80], BASE, 0.7, holds_below=True)
    assert d.verdict == stats.REFUTED and d.lo > 0.7
    # the same figures against a ">=" claim: the verdicts swap
    assert sq.decide([0.81, 0.80, 0.79, 0.80], BASE, 0.7, holds_below=False).verdict \
        == stats.REPRODUCED
    assert sq.decide([0.61, 0.60, 0.59, 0.60], BASE, 0.7, holds_below=False).verdict \
        == stats.REFUTED


def test_a_ratio_claim_and_its_mirror_agree():
    a, b = [0.62, 0.66, 0.58, 0.61, 0.64], [1.0, 1.05, 0.97, 1.02, 0.99]
    for thr in (0.5, 0.6, 0.64, 0.7, 0.8):
        below = sq.decide(a, b, thr, holds_below=True)
        mirror = sq.decide(b, a, 1 / thr, holds_below=False)
        assert below.verdict == mirror.verdict and below.n == mirror.n
        assert below.lo == pytest.approx(1 / mirror.hi)


def test_the_first_deciding_look_stands_and_wants_nothing_more():
    # 8 rounds, clearly below 0.7 from the start: decided at the first look, 3 runs a side
    a = [0.50, 0.51, 0.50, 0.52, 0.50, 0.53, 0.48, 0.50]
    d = sq.decide(a, [1.0] * 8, 0.7, holds_below=True)
    assert (d.verdict, d.n, d.runs, d.wants) == (stats.REPRODUCED, 3, 8, 0)
    assert sq.runs_to_decide(d, 0.7) is None  # decided


def test_undecided_below_the_first_look():
    for runs, wants in ((0, 3), (1, 2), (2, 1)):
        d = sq.decide([0.5, 0.6][:runs], [1.0, 1.0][:runs], 0.7, holds_below=True)
        assert d.verdict == stats.UNDECIDED and d.coverage is None
        assert (d.n, d.runs, d.wants) == (runs, runs, wants)
    assert sq.decide([], [], 0.7, True).words() == "undecided (no runs)"
    assert sq.decide([0.5], [1.0], 0.7, True).words() == "undecided (1 run: 0.50)"
    # two runs a side wholly below the threshold: still no verdict, the range shown
    d = sq.decide([0.5, 0.6], [1.0, 1.0], 0.7, True)
    assert d.words() == "undecided (2 runs: range 0.50-0.60)"


def test_undecided_at_the_cap_wants_nothing_and_below_it_one_more():
    rng = np.random.default_rng(1)
    a = list(0.7 * np.exp(rng.normal(0, 0.1, 14)))  # at the threshold, noisy
    d = sq.decide(a, [1.0] * 14, 0.7, holds_below=True)
    # the last look reads every pair there is, at the cap's share of alpha
    assert d.verdict == stats.UNDECIDED and (d.n, d.runs, d.wants) == (14, 14, 0)
    d = sq.decide(a[:5], [1.0] * 5, 0.7, holds_below=True)
    assert d.verdict == stats.UNDECIDED and (d.n, d.wants) == (5, 1) and d.coverage == 0.95
    assert d.lo < 0.7 < d.hi


def test_best_of_k_widens_the_interval():
    a, b = [0.60, 0.63, 0.61, 0.62], [1.0, 1.0, 1.0, 1.0]
    one, three = (sq.decide(a, b, 0.7, True, k=k) for k in (1, 3))
    assert one.verdict == stats.REPRODUCED and one.n == 4
    assert three.verdict == stats.UNDECIDED and three.hi > one.hi and three.wants == 1
    assert three.words().endswith(", best of 3)")
    # 5 runs a side would decide it if the mean and spread held
    assert sq.runs_to_decide(three, 0.7) == 5


def test_pairs_follow_the_run_order_and_a_failed_run_drops_its_pair():
    # a drift of +-30 % shared by both runs of a round cancels in the pair
    drift = [1.0, 1.3, 0.7, 1.2]
    d = sq.decide([0.5 * x for x in drift], drift, 0.7, True)
    assert d.verdict == stats.REPRODUCED and d.value == pytest.approx(0.5)
    d = sq.decide([0.5, math.nan, 0.5, 0.5, 0.5], [1.0, 1.0, math.nan, 1.0, 1.0], 0.7, True)
    assert d.runs == 3 and d.n == 3
    # the longer side's extra runs wait for their pair
    assert sq.decide([0.5] * 5, [1.0] * 3, 0.7, True).runs == 3
    for bad in ([0.0, 0.5, 0.5], [-1.0, 0.5, 0.5], [math.inf, 0.5, 0.5]):
        with pytest.raises(ValueError):
            sq.decide(bad, [1.0] * 3, 0.7, True)
    with pytest.raises(ValueError):
        sq.decide([0.5] * 3, [1.0] * 3, 0.0, True)
    with pytest.raises(ValueError):
        sq.decide([0.5] * 3, [1.0] * 3, 0.7, True, k=0)


# --- the simulation --------------------------------------------------------------------


@pytest.mark.parametrize("ratio,cv,noise,k", [
    (1.00, 0.03, "ar1", 3), (1.00, 0.15, "ar1", 1), (1.00, 0.08, "iid", 1),
    (0.98, 0.08, "ar1", 3), (1.02, 0.03, "iid", 1), (0.95, 0.15, "ar1", 1),
])
def test_simulated_wrong_decisions_at_most_5_percent_and_coverage_at_least_95(
        ratio, cv, noise, k):
    """2,000 seeded studies a cell. The goal is asserted as it stands: at 10,000 studies the
    grid's worst wrong-decision rate is about 2.7 % and its lowest coverage about 97.3 %
    (both at the threshold itself, k = 1), and the binomial standard error of such a rate
    at 2,000 studies is sqrt(0.027 x 0.973 / 2000) = 0.36 %, so 5 % and 95 % lie more than
    6 standard errors away: a seed that failed here would be a change in the rule, not
    chance."""
    c = sq.simulate_cell(ratio, cv, noise, k, 2000, seed=0)
    assert c.wrong <= 0.05, c
    assert c.covered >= 0.95, c
    assert c.reproduced + c.refuted + c.undecided == pytest.approx(1.0)


def test_a_fixed_six_runs_a_side_is_wrong_more_often_at_the_threshold():
    # the same interval looked at once is an exact 95 % interval: about 5 % of decisions at
    # the threshold are wrong (the rule spends its 5 % over ten looks and wins back less)
    c = sq.simulate_cell(1.00, 0.08, "iid", 1, 2000, seed=0)
    assert 0.035 <= c.fixed_wrong <= 0.065 and c.wrong < c.fixed_wrong


def test_a_clear_claim_is_decided_with_fewer_runs_than_a_fixed_six():
    c = sq.simulate_cell(0.80, 0.03, "ar1", 1, 2000, seed=0)
    assert c.reproduced >= 0.99 and c.runs_mean < sq.FIXED_RUNS and c.runs_p95 <= 5, c


def test_a_cell_gives_the_same_rates_alone_and_in_a_grid():
    grid = sq.simulate(200, seed=3, ratios=(0.95, 1.0), cvs=(0.08,), noises=("ar1",), ks=(3,))
    assert grid[1] == sq.simulate_cell(1.0, 0.08, "ar1", 3, 200, seed=3)
    lines = sq.table(grid, 200, 3)
    assert all(ln.startswith("#") for ln in lines[:5]) and not lines[5].startswith("#")
    assert len([ln for ln in lines if not ln.startswith("#")]) == 2
    assert lines[-1].startswith("# goal (wrong decisions <= 5% in every cell")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "analysis.sequential", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args,flag", [
    (["--simulate", "--studies", "0"], "--studies"),
    (["--simulate", "--studies", "x"], "--studies"),
    (["--simulate", "--studies", "1.5"], "--studies"),
    (["--simulate", "--seed", "-1"], "--seed"),
    ([], "--simulate"),
])
def test_bad_input_exits_2_with_one_line_naming_the_flag(args, flag):
    res = _cli(*args)
    assert res.returncode == 2 and not res.stdout, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and "Traceback" not in res.stderr


def test_the_cli_prints_the_table():
    res = _cli("--simulate", "--studies", "20", "--seed", "1")
    assert res.returncode == 0, res.stderr
    rows = [ln for ln in res.stdout.splitlines() if not ln.startswith("#")]
    assert len(rows) == len(sq.RATIOS) * len(sq.CVS) * len(sq.NOISES) * len(sq.KS)
    assert "20 studies a cell, seed 1" in res.stdout
