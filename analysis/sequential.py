"""A ratio claim decided from as few runs as decide it, then stopped: a confidence sequence.

    python -m analysis.sequential --simulate                  # the grid, 10,000 studies a cell
    python -m analysis.sequential --simulate --studies 2000 --seed 1

A claim "ratio <= threshold" (or ">=") compares one figure of two sides (a scheme
and its baseline, one batch and another); a run's figure is already a median over
its steps. Judged on the range of a few runs' pairwise ratios
(``analysis.stats.ratio_spread`` below 6 a side), a 2-run study covers the true
ratio about 66 % of the time; judged on one run's value, not at all. The rule
(``decide``):

1. **Unit: one pair of runs.** The repeat loop runs rounds, each one run of every
   side in a shuffled order; the i-th run of one side (in run order) is paired
   with the i-th of the other. The machine drifts across a session (load, page
   cache, thermal state; AR(1) noise over the run order, rho = 0.5, in the
   simulation); two runs of one round share most of it, so it cancels in the
   pair's log-ratio ``d_i = log(a_i / b_i)``, where a ratio of the two sides'
   medians keeps it. A sweep that shuffles all its repeats at once (``launch.sweep``)
   pairs runs farther apart and cancels less; the rounds are the design.
2. **Statistic: the mean of the paired log-ratios**, ``exp(mean d)`` the
   geometric-mean ratio, rather than the log of the ratio of medians. Under
   noise symmetric in the log (log-normal run times, multiplicative: a 5 % slower
   host is 5 % on both sides) they estimate the same ratio, but the mean pairs
   its runs (the drift cancels; a ratio of medians cannot pair), needs about
   2/pi = 64 % of a median's runs for one precision, and has an exact interval
   from 3 runs: **Student's t on the d_i**, where a median has no order-statistic
   interval below 6 runs (``analysis.stats.MIN_CI_SAMPLES``) and a sign test on
   3 pairs reaches 75 % at best.
3. **Looks and alpha spending.** Looks at n = 3, 4, ..., 12 runs a side
   (``LOOKS``); look n spends ``alpha_n`` of alpha = 0.05 in proportion to n
   (``spending``: 0.002 at 3, 0.008 at 12), so the early looks, with their wide t
   quantiles, take little. The shares combine by the union bound, not by the
   exact group-sequential integral: ``sum alpha_n = alpha``, so every look's
   interval ``mean d +- t(1 - alpha_n / 2, n - 1) s / sqrt(n)`` covers the true
   log-ratio at once with probability at least 95 %, whichever look the data stop
   at and however the looks depend on each other: a confidence sequence in the
   Bonferroni form (Howard et al., "Time-uniform, nonparametric, nonasymptotic
   confidence sequences", Ann. Statist. 2021, give tighter ones). Measured on the
   grid (10,000 studies a cell): a Pocock-type spending ``alpha ln(1 + (e - 1)
   n / 12)``, a third of alpha at the first look, decides the clearest cells
   sooner (3.1 against 3.8 runs a side at 0.80 x threshold, CV 3 %) but fewer
   studies overall (35.3 % against 38.4 %: more stay undecided at 12 at CV 15 %).
4. **Best of k.** Where the claim's figure is the best of k variants (the fastest
   algorithm, the better mitigation), each look's alpha is divided by k
   (Bonferroni over the k comparisons the pick made) rather than judging on runs
   that did not make the pick: all k x 10 intervals cover at once with 95 %, so
   the picked one's does, whatever picked it, and no run is spent on the pick.
   The simulation's k = 3 cells draw three variants of one true ratio and pick the
   best-looking at each look: the least favourable case for the winner's curse.
5. **Decision at a look:** reproduced where the whole interval lies on the claim's
   side of the threshold (the threshold itself holds), refuted where it lies
   wholly on the other side; else undecided, wanting one more run a side, until
   12 (``MAX_RUNS``). Below 3 runs a side there is no interval and no verdict:
   undecided, with the range of the paired ratios to look at.

``python -m analysis.sequential --simulate`` checks it by a seeded simulation
(``simulate``): true ratio = threshold x 0.80, 0.95, 0.98, 1.00, 1.02, 1.05,
1.25; run-to-run CV 3, 8 and 15 %; noise i.i.d. or AR(1) over the run order; k = 1
and 3. It prints P(reproduced), P(refuted), P(undecided), P(wrong decision), the
runs a side used (mean, 95th percentile) and the coverage of the interval where
the study stopped, beside the same interval looked at once at a fixed 6 runs a
side. Goal: wrong decisions at most 5 % in every cell, coverage at least 95 %.

Pure Python and numpy: the t quantiles come from the regularized incomplete beta
function (``t_quantile``), no scipy.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analysis.cli import UsageError, entry, parser

PROG = "analysis.sequential"

REPRODUCED, REFUTED, UNDECIDED = "reproduced", "refuted", "undecided"

#: fewest runs a side at the first look: the t interval needs two degrees of freedom to
#: be of any use (t(0.975, 1) = 12.7)
FIRST_LOOK = 3
#: most runs a side: the last look; undecided there is undecided for good
MAX_RUNS = 12
#: the runs a side at which the rule looks
LOOKS = tuple(range(FIRST_LOOK, MAX_RUNS + 1))
#: the coverage every look's interval states: 1 - alpha over all looks together
CONFIDENCE = 0.95
#: the fixed design the simulation compares with: one look at 6 runs a side
FIXED_RUNS = 6


# -- Student's t, from the regularized incomplete beta function -----------------------

def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function, by the modified Lentz
    method (Press et al., Numerical Recipes, 3rd ed., section 6.4, ``betacf``)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                   -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            step = d * c
            h *= step
        if abs(step - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    # the fraction converges fast for x < (a + 1) / (a + b + 2); else by I_x(a,b) = 1 - I_1-x(b,a)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_two_sided(t: float, df: int) -> float:
    """P(|T| > t) for Student's t with ``df`` degrees of freedom: I_{df/(df+t^2)}(df/2, 1/2)."""
    return betainc(df / 2.0, 0.5, df / (df + t * t))


@functools.cache
def t_quantile(q: float, df: int) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom, for 0.5 < q < 1: the
    t with P(|T| > t) = 2 (1 - q), by bisection on ``t_two_sided`` (to 1e-12 relative)."""
    if not 0.5 < q < 1.0:
        raise ValueError(f"q must be in (0.5, 1), not {q!r}")
    if df < 1:
        raise ValueError(f"df must be at least 1, not {df!r}")
    tail = 2.0 * (1.0 - q)
    lo, hi = 0.0, 1.0
    while t_two_sided(hi, df) > tail:
        lo, hi = hi, hi * 2.0
    while hi - lo > 1e-12 * hi:
        mid = (lo + hi) / 2.0
        if t_two_sided(mid, df) > tail:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


# -- the design ----------------------------------------------------------------------

def spending(confidence: float = CONFIDENCE, k: int = 1) -> dict[int, float]:
    """Each look's share of alpha = 1 - ``confidence`` (look n -> alpha_n), in proportion to
    its runs a side n and divided by the ``k`` variants a best-of-k pick compared: the
    shares sum to alpha / k. With the defaults: 0.0020 at 3 runs a side, 0.0080 at 12."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), not {confidence!r}")
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k!r}")
    alpha, total = 1.0 - confidence, sum(LOOKS)
    return {n: alpha * n / total / k for n in LOOKS}


@functools.cache
def critical_t(n: int, k: int = 1) -> float:
    """The t multiplier of the interval at look ``n`` (runs a side) for the best of ``k``:
    ``t(1 - alpha_n / 2, n - 1)``, alpha_n ``spending``'s at k; beyond the cap, the cap's
    share at n - 1 degrees of freedom (the last look reads every run there is)."""
    share = spending(CONFIDENCE, k)[min(n, MAX_RUNS)]
    return t_quantile(1.0 - share / 2.0, n - 1)


@functools.cache
def fixed_t(n: int = FIXED_RUNS, k: int = 1) -> float:
    """The t multiplier of the same interval at a fixed ``n`` runs a side, looked at once:
    ``t(1 - alpha / (2 k), n - 1)``."""
    return t_quantile(1.0 - (1.0 - CONFIDENCE) / (2.0 * k), n - 1)


def _side(lo: float, hi: float, threshold: float, holds_below: bool) -> str:
    """REPRODUCED, REFUTED or UNDECIDED for an interval against the threshold (inclusive on
    the claim's side)."""
    if holds_below:
        return REPRODUCED if hi <= threshold else REFUTED if lo > threshold else UNDECIDED
    return REPRODUCED if lo >= threshold else REFUTED if hi < threshold else UNDECIDED


def _fmt(x: float, fmt: str) -> str:
    return format(x, fmt)


@dataclass(frozen=True)
class Decision:
    """A ratio claim's verdict at the runs there are.

    ``verdict``: reproduced, refuted or undecided; ``value``: the geometric-mean ratio of
    the paired runs the verdict read; ``lo``, ``hi``: its interval, of ``coverage`` (0.95:
    every look together), or with ``coverage`` None the min-max of the paired ratios
    below the first look (no interval yet); ``n``: the runs a side the verdict read (the
    first decisive look, else every pair there is); ``runs``: the pairs there are;
    ``wants``: the runs a side to add before the next look (0 when decided or at the
    cap); ``k``: the variants the figure is the best of; ``log_sd``: the standard
    deviation of the paired log-ratios read (NaN below 2 pairs), for ``runs_to_decide``."""

    verdict: str
    value: float
    lo: float
    hi: float
    coverage: float | None
    n: int
    runs: int
    wants: int
    k: int = 1
    log_sd: float = math.nan

    def words(self, fmt: str = ".2f", unit: str = "") -> str:
        """The verdict's figure as a report states it: "0.58 (95% CI 0.55-0.61, n=4 a
        side)", "... best of 3" where k > 1; with no interval yet "undecided (2 runs:
        range 0.55-0.80)", "undecided (1 run: 0.60)", "undecided (no runs)"."""
        if self.runs == 0:
            return "undecided (no runs)"
        if self.coverage is None:
            if self.runs == 1:
                return f"undecided (1 run: {_fmt(self.value, fmt)}{unit})"
            return (f"undecided ({self.runs} runs: range {_fmt(self.lo, fmt)}-"
                    f"{_fmt(self.hi, fmt)}{unit})")
        best = f", best of {self.k}" if self.k > 1 else ""
        return (f"{_fmt(self.value, fmt)}{unit} ({self.coverage * 100:g}% CI "
                f"{_fmt(self.lo, fmt)}-{_fmt(self.hi, fmt)}, n={self.n} a side{best})")


def _paired_logs(num: Sequence[float], den: Sequence[float]) -> np.ndarray:
    """log(num_i / den_i) for the pairs in run order: as many as the shorter side has, a
    pair with a NaN (a failed run) dropped. ValueError for a figure that is not a positive
    finite number (no log-ratio)."""
    a = np.asarray(list(num), dtype=float).ravel()
    b = np.asarray(list(den), dtype=float).ravel()
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    keep = ~(np.isnan(a) | np.isnan(b))
    a, b = a[keep], b[keep]
    if np.any(~np.isfinite(a)) or np.any(~np.isfinite(b)) or np.any(a <= 0) or np.any(b <= 0):
        raise ValueError("a ratio claim needs positive finite figures on both sides")
    return np.log(a) - np.log(b)


def _look(d: np.ndarray, n: int, k: int) -> tuple[int, float, float, float, float]:
    """(pairs read, mean, lo, hi, sd) of the log-ratio at look ``n``: the first ``n``
    pairs, or all of them at the cap's look."""
    x = d if n >= MAX_RUNS else d[:n]
    m, sd = float(x.mean()), float(x.std(ddof=1))
    half = critical_t(len(x), k) * sd / math.sqrt(len(x))
    return len(x), m, m - half, m + half, sd


def decide_log_ratios(log_ratios: Sequence[float], threshold: float, holds_below: bool,
                      k: int = 1) -> Decision:
    """The verdict on paired log-ratios ``log(a_i / b_i)`` in run order (``decide`` pairs
    runs; a study over seeds pairs by seed) against a claim "ratio <= threshold"
    (``holds_below``) or ">= threshold", the figure the best of ``k``.

    Replays the looks at 3, 4, ... runs a side up to the pairs there are (at most 12; the
    last look reads every pair from 12 on): the first whose interval lies wholly on one
    side of the threshold decides, and wants nothing more. Every look's interval covers
    the true ratio at once with 95 % (``spending``), so a verdict from any look is
    right with 95 %, the one the repeat loop stopped at included. Undecided wants one
    more run a side until 12; below 3 pairs, as many as reach the first look. NaNs are
    dropped."""
    if not threshold > 0 or not math.isfinite(threshold):
        raise ValueError(f"threshold must be a positive number, not {threshold!r}")
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k!r}")
    d = np.asarray(list(log_ratios), dtype=float).ravel()
    d = d[~np.isnan(d)]
    if np.any(~np.isfinite(d)):
        raise ValueError("log-ratios must be finite (a figure of 0 or inf has no log)")
    runs, log_thr = len(d), math.log(threshold)
    if runs < FIRST_LOOK:
        if runs == 0:
            return Decision(UNDECIDED, math.nan, math.nan, math.nan, None, 0, 0, FIRST_LOOK, k)
        sd = float(d.std(ddof=1)) if runs > 1 else math.nan
        return Decision(UNDECIDED, float(np.exp(d.mean())), float(np.exp(d.min())),
                        float(np.exp(d.max())), None, runs, runs, FIRST_LOOK - runs, k, sd)
    last = min(runs, MAX_RUNS)
    for n in range(FIRST_LOOK, last + 1):
        used, m, lo, hi, sd = _look(d, n, k)
        verdict = _side(lo, hi, log_thr, holds_below)
        if verdict != UNDECIDED or n == last:
            wants = 0 if verdict != UNDECIDED or runs >= MAX_RUNS else 1
            return Decision(verdict, math.exp(m), math.exp(lo), math.exp(hi), CONFIDENCE,
                            used, runs, wants, k, sd)
    raise AssertionError("unreachable: the last look returns")


def decide(num: Sequence[float], den: Sequence[float], threshold: float, holds_below: bool,
           k: int = 1) -> Decision:
    """The verdict on the claim "num / den <= threshold" (``holds_below``) or ">= threshold"
    from two sides' run figures in run order, the i-th run of each side paired
    (``decide_log_ratios``): the ratio is the geometric mean of the paired ratios, the
    ratio of the sides' medians where run noise is log-normal; ``k``: the variants the
    figure is the best of. This is
    what the runner's repeat loop calls after each round: ``Decision.wants`` runs a side
    more, 0 when decided or at the cap. Figures must be positive; NaN (a failed run)
    drops its pair."""
    return decide_log_ratios(_paired_logs(num, den), threshold, holds_below, k)


def runs_to_decide(decision: Decision, threshold: float) -> int | None:
    """About how many runs a side would decide an undecided claim if the mean and the
    spread of its paired log-ratios held: the first look n after the runs there are (from
    3, at most 12) whose half-width ``critical_t(n, k) s / sqrt(n)`` no longer reaches
    the threshold. None when it is decided, when there is no spread yet (fewer than 2
    pairs), or when no look up to 12 would decide at this spread."""
    if decision.verdict != UNDECIDED or math.isnan(decision.log_sd):
        return None
    gap = abs(math.log(decision.value) - math.log(threshold))
    for n in range(max(FIRST_LOOK, decision.runs + 1), MAX_RUNS + 1):
        if critical_t(n, decision.k) * decision.log_sd / math.sqrt(n) < gap:
            return n
    return None


# -- the simulation -------------------------------------------------------------------

#: true ratio / threshold in the simulated studies
RATIOS = (0.80, 0.95, 0.98, 1.00, 1.02, 1.05, 1.25)
#: run-to-run coefficient of variation of a run's figure
CVS = (0.03, 0.08, 0.15)
#: run-order noise: independent, or drifting as AR(1) with this correlation per run
NOISES = ("iid", "ar1")
DRIFT_RHO = 0.5
#: the variants a simulated figure is the best of
KS = (1, 3)


@dataclass(frozen=True)
class Cell:
    """One simulated cell's rates over its studies: the rule's, and the same interval's at
    a fixed 6 runs a side (``fixed_*``). ``wrong``: a decision against the truth (at the
    threshold any decision; below it refuted, above it reproduced, for "<="); ``covered``:
    the interval where the study stopped holds the true ratio."""

    ratio: float
    cv: float
    noise: str
    k: int
    reproduced: float
    refuted: float
    undecided: float
    wrong: float
    runs_mean: float
    runs_p95: float
    covered: float
    fixed_wrong: float
    fixed_decided: float
    fixed_covered: float


def _noise(rng: np.random.Generator, studies: int, slots: int, sigma: float,
           noise: str) -> np.ndarray:
    """Log-noise of each run slot in run order: i.i.d. normal, or a stationary AR(1)."""
    z = rng.standard_normal((studies, slots))
    if noise == "iid":
        return sigma * z
    e = np.empty_like(z)
    e[:, 0] = sigma * z[:, 0]
    innovation = sigma * math.sqrt(1.0 - DRIFT_RHO ** 2)
    for t in range(1, slots):
        e[:, t] = DRIFT_RHO * e[:, t - 1] + innovation * z[:, t]
    return e


def simulate_cell(ratio: float, cv: float, noise: str, k: int, studies: int,
                  seed: int) -> Cell:
    """``studies`` seeded studies of the claim "ratio <= threshold" at true ratio
    ``ratio`` x threshold (the threshold cancels in the log-ratio: it is 1 here).

    Each study runs 12 rounds, each one run of the k variants (all of the true ratio) and
    one of the baseline in a shuffled order; a run's log figure is its side's log plus
    log-normal noise of CV ``cv`` (i.i.d. or AR(1) over the run order). At each look the
    variant with the lowest mean log-ratio is picked and judged with the rule's interval
    at k; the study stops at its first decision."""
    rng = np.random.default_rng([seed, round(ratio * 1000), round(cv * 1000),
                                 NOISES.index(noise), k])
    sigma = math.sqrt(math.log1p(cv * cv))
    per_round = k + 1
    e = _noise(rng, studies, MAX_RUNS * per_round, sigma, noise)
    # the slot of side j (variants 0..k-1, baseline k) in each round: a shuffled order
    order = np.argsort(rng.random((studies, MAX_RUNS, per_round)), axis=2)
    slot = order + per_round * np.arange(MAX_RUNS)[None, :, None]
    logs = np.take_along_axis(e, slot.reshape(studies, -1), axis=1).reshape(
        studies, MAX_RUNS, per_round)
    d = logs[:, :, :k] - logs[:, :, k:] + math.log(ratio)  # (studies, round, variant)
    n = np.arange(1, MAX_RUNS + 1)[None, :, None]
    csum, csq = np.cumsum(d, axis=1), np.cumsum(d * d, axis=1)
    mean = csum / n
    with np.errstate(invalid="ignore", divide="ignore"):
        sd = np.sqrt(np.maximum(csq - n * mean ** 2, 0.0) / (n - 1))
    pick = np.argmin(mean, axis=2)[:, :, None]  # the best-looking variant at each look
    mean = np.take_along_axis(mean, pick, axis=2)[:, :, 0]
    sd = np.take_along_axis(sd, pick, axis=2)[:, :, 0]
    looks = np.arange(FIRST_LOOK, MAX_RUNS + 1)
    crit = np.array([critical_t(int(m), k) for m in looks])
    half = crit * sd[:, looks - 1] / np.sqrt(looks)
    lo, hi = mean[:, looks - 1] - half, mean[:, looks - 1] + half
    repro, refut = hi <= 0.0, lo > 0.0
    decided = repro | refut
    stop = np.where(decided.any(axis=1), decided.argmax(axis=1), len(looks) - 1)
    rows = np.arange(studies)
    v_repro, v_refut = repro[rows, stop], refut[rows, stop]
    truth = math.log(ratio)
    covered = (lo[rows, stop] <= truth) & (truth <= hi[rows, stop])
    # the same interval, looked at once at 6 runs a side (at alpha / k)
    f_half = fixed_t(FIXED_RUNS, k) * sd[:, FIXED_RUNS - 1] / math.sqrt(FIXED_RUNS)
    f_lo, f_hi = mean[:, FIXED_RUNS - 1] - f_half, mean[:, FIXED_RUNS - 1] + f_half
    f_repro, f_refut = f_hi <= 0.0, f_lo > 0.0
    used = looks[stop]
    return Cell(ratio, cv, noise, k, float(v_repro.mean()), float(v_refut.mean()),
                float(1.0 - (v_repro | v_refut).mean()),
                float(_wrong(ratio, v_repro, v_refut).mean()), float(used.mean()),
                float(np.percentile(used, 95)), float(covered.mean()),
                float(_wrong(ratio, f_repro, f_refut).mean()),
                float((f_repro | f_refut).mean()),
                float(((f_lo <= truth) & (truth <= f_hi)).mean()))


def _wrong(ratio: float, reproduced: np.ndarray, refuted: np.ndarray) -> np.ndarray:
    """The wrong decisions of a "<=" claim at true ratio / threshold ``ratio``."""
    if ratio == 1.0:
        return reproduced | refuted
    return refuted if ratio < 1.0 else reproduced


def simulate(studies: int = 10_000, seed: int = 0, ratios: Sequence[float] = RATIOS,
             cvs: Sequence[float] = CVS, noises: Sequence[str] = NOISES,
             ks: Sequence[int] = KS) -> list[Cell]:
    """Every cell of the grid (``simulate_cell``), each from its own seeded generator
    (the seed and the cell's parameters), so a cell gives the same rates in any grid."""
    if studies < 1:
        raise ValueError(f"studies must be at least 1, not {studies!r}")
    return [simulate_cell(r, cv, noise, k, studies, seed)
            for k in ks for noise in noises for cv in cvs for r in ratios]


_HEAD = (f"{'ratio':>6} {'cv':>4} {'noise':>5} {'k':>2} {'repro':>7} {'refut':>7} "
         f"{'undec':>7} {'wrong':>7} {'runs':>5} {'p95':>4} {'cover':>7} | "
         f"{'wrong6':>7} {'decid6':>7} {'cover6':>7} {'runs6':>5}")
_UNITS = (f"{'xthr':>6} {'%':>4} {'':>5} {'':>2} {'P':>7} {'P':>7} {'P':>7} {'P':>7} "
          f"{'mean':>5} {'side':>4} {'P':>7} | {'P':>7} {'P':>7} {'P':>7} {'side':>5}")


def table(cells: Sequence[Cell], studies: int, seed: int) -> list[str]:
    """The simulation as a fixed-width table: header lines start with "#", a units row, one
    row per cell, and the headline (worst wrong-decision rate, lowest coverage, mean runs
    a side against the fixed 6)."""
    lines = [
        f"# {PROG}: claim \"ratio <= threshold\"; paired log-ratio, t interval, looks at "
        f"{FIRST_LOOK}..{MAX_RUNS} runs a side, {CONFIDENCE:.0%} over all looks "
        "(alpha spent in proportion to n, union bound), best of k at alpha/k",
        f"# {studies} studies a cell, seed {seed}; noise iid or AR(1) rho={DRIFT_RHO:g} over "
        "the run order, rounds of one run a side in a shuffled order",
        "# wrong: any decision at the threshold, refuted below it, reproduced above it; "
        f"cover: the interval at the stop holds the true ratio; *6: one look at {FIXED_RUNS}",
        "#" + _HEAD, "#" + _UNITS]
    for c in cells:
        lines.append(
            f" {c.ratio:6.2f} {c.cv * 100:4.0f} {c.noise:>5} {c.k:2d} {c.reproduced:7.4f} "
            f"{c.refuted:7.4f} {c.undecided:7.4f} {c.wrong:7.4f} {c.runs_mean:5.2f} "
            f"{c.runs_p95:4.0f} {c.covered:7.4f} | {c.fixed_wrong:7.4f} {c.fixed_decided:7.4f} "
            f"{c.fixed_covered:7.4f} {FIXED_RUNS:5d}")
    worst = max(cells, key=lambda c: c.wrong)
    low = min(cells, key=lambda c: c.covered)
    mean_runs = sum(c.runs_mean for c in cells) / len(cells)
    decided = sum(1 - c.undecided for c in cells) / len(cells)
    decided6 = sum(c.fixed_decided for c in cells) / len(cells)
    goal = "met" if worst.wrong <= 0.05 and low.covered >= CONFIDENCE else "NOT met"
    lines += [
        f"# worst wrong-decision rate {worst.wrong:.4f} (ratio {worst.ratio:g}, cv "
        f"{worst.cv:.0%}, {worst.noise}, k={worst.k}); fixed 6: "
        f"{max(c.fixed_wrong for c in cells):.4f}",
        f"# lowest coverage {low.covered:.4f} (ratio {low.ratio:g}, cv {low.cv:.0%}, "
        f"{low.noise}, k={low.k}); fixed 6: {min(c.fixed_covered for c in cells):.4f}",
        f"# mean runs a side {mean_runs:.2f} over the cells (fixed: {FIXED_RUNS}); decided "
        f"{decided:.1%} of studies (fixed 6: {decided6:.1%})",
        f"# goal (wrong decisions <= 5% in every cell, coverage >= {CONFIDENCE:.0%}): {goal}"]
    return lines


def _positive_int(text: str) -> int:
    """A count of at least 1 (argparse names the flag in its message)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


def _seed(text: str) -> int:
    """A seed: a whole number of at least 0 (numpy's generators refuse negative ones)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = parser(PROG, "The decide-then-stop rule for ratio claims, checked by a seeded "
                     "simulation.")
    p.add_argument("--simulate", action="store_true",
                   help="run the seeded simulation of the rule over the grid and print its "
                        "table")
    p.add_argument("--studies", type=_positive_int, default=10_000,
                   help="simulated studies a cell (a rate's standard error is at most "
                        "0.5/sqrt(studies))")
    p.add_argument("--seed", type=_seed, default=0, help="the simulation's seed")
    return p


def body(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if not args.simulate:
        raise UsageError("nothing to do: give --simulate (the rule itself is "
                         "analysis.sequential.decide, which the claims call)")
    cells = simulate(args.studies, args.seed)
    print("\n".join(table(cells, args.studies, args.seed)))
    return 0


main = entry(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
