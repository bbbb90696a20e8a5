"""Verdicts that need their runs and stop when decided: a confidence sequence for a ratio claim.

A claim about a ratio ("hier / ring <= 0.6") compares runs of two set-ups. Judged on the
range of a few runs' pairwise ratios (``analysis.stats.ratio_spread`` below 6 a side), a
2-run study covers the true ratio about 66 % of the time; judged on one run's value, not
at all. This module decides a claim only with an interval whose coverage holds over every
look it takes, and says when more runs would decide it.

The rule (``decide``):

1. **Unit: one pair of runs.** The runs of the two sides are taken in turns (B, A, B, A,
   ... in run order); run i of side A is paired with run i of side B and the statistic is
   the mean of the paired log-ratios ``d_i = log a_i - log b_i``. The machine drifts across
   a session (the load, the page cache, thermal state: an AR(1) drift across the run
   order); two adjacent runs share most of it, so it cancels in the pair, where a ratio of
   the two sides' medians keeps it. Logs, because run times are multiplicative: a 5 %
   slower host is 5 % on both sides.
2. **Interval: Student's t on the pairs**, ``mean(d) +- t(1 - a_n / 2, n - 1) s / sqrt(n)``.
3. **Looks and alpha spending.** Looks at n = 3, 4, ..., 12 pairs (``FIRST_LOOK`` to
   ``MAX_RUNS``); look n spends ``a_n`` of the total alpha (``spending``: in proportion to
   n, so early looks with their wide t quantiles take little). By the union bound the
   probability that any look's interval misses the true log-ratio is at most
   ``sum a_n = 1 - confidence``, whatever the dependence between looks: a confidence
   sequence in the Bonferroni form (cf. Howard et al., "Time-uniform, nonparametric,
   nonasymptotic confidence sequences", Ann. Statist. 2021, for tighter ones).
4. **Best of k.** Where the claim's figure is the best of k variants (the fastest
   algorithm, the best staleness), each look's alpha is divided by k (Bonferroni over the
   k comparisons the pick made), rather than held back for fresh runs: no run is wasted.
5. **Decision at a look:** reproduced where the whole interval lies on the claim's side of
   log(threshold), refuted where it lies wholly on the other side; else undecided, wanting
   one more pair, until ``MAX_RUNS``.

``python -m analysis.sequential --simulate`` checks it by a seeded simulation (true ratio,
run-to-run CV, i.i.d. or drifting noise, best of k) and prints the wrong-decision rate and
the runs used per cell beside a fixed 6 runs a side.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analysis import stats

#: pairs of runs before the first look (2 give no usable t interval)
FIRST_LOOK = 3
#: the most pairs a claim is given; undecided there, it stays undecided
MAX_RUNS = 12
LOOKS = tuple(range(FIRST_LOOK, MAX_RUNS + 1))
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(96)


def _beta_reg(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta I_x(a, b) for 0 <= x < 1, a >= 1, b = 1/2, by
    Gauss-Legendre quadrature of u^(a-1) (1-u)^(b-1) on [0, x] (smooth there: the
    integrand's singularity is at u = 1)."""
    if x <= 0:
        return 0.0
    u = 0.5 * x * (_NODES + 1)
    integral = 0.5 * x * float(np.sum(_WEIGHTS * u ** (a - 1) * (1 - u) ** (b - 1)))
    return integral * math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b))


def t_tail(t: float, df: int) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom, t >= 0."""
    return 0.5 * _beta_reg(df / (df + t * t), df / 2, 0.5)


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (p in (0.5, 1)) of Student's t with ``df`` >= 2 degrees of
    freedom, by bisection on ``t_tail``."""
    if not 0.5 < p < 1 or df < 2:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 2, not p={p}, df={df}")
    lo, hi = 0.0, 1.0
    while t_tail(hi, df) > 1 - p:
        hi *= 2
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_tail(mid, df) > 1 - p else (lo, mid)
    return 0.5 * (lo + hi)


def spending(confidence: float = 0.95, k: int = 1) -> dict[int, float]:
    """Each look's share of alpha = 1 - confidence, in proportion to its pairs n and divided
    by the k variants a best-of-k pick compared."""
    alpha = 1 - confidence
    total = sum(LOOKS)
    return {n: alpha * n / total / k for n in LOOKS}


def _critical(confidence: float, k: int) -> dict[int, float]:
    return {n: t_quantile(1 - a / 2, n - 1) for n, a in spending(confidence, k).items()}


@dataclass(frozen=True)
class Decision:
    """The verdict on a ratio claim at its last look: ``lo``-``hi`` the interval of the
    ratio (exp of the log-ratio's), ``n`` the pairs used, ``wants`` the pairs a side it
    wants next (0 when decided or at ``MAX_RUNS``)."""

    verdict: str
    value: float
    lo: float
    hi: float
    n: int
    wants: int
    confidence: float
    k: int

    def words(self, fmt: str = ".3f") -> str:
        if self.n < FIRST_LOOK:
            return f"{self.verdict} ({self.n} runs a side: {FIRST_LOOK} before the first look)"
        level = f"{self.confidence:.0%} CS" + (f", best of {self.k}" if self.k > 1 else "")
        return (f"{self.verdict} ({self.n} runs a side: {level} "
                f"{self.lo:{fmt}}-{self.hi:{fmt}})")


def decide(a_runs: Sequence[float], b_runs: Sequence[float], threshold: float,
           holds_below: bool, k: int = 1, confidence: float = 0.95) -> Decision:
    """The claim "median(A) / median(B) <= threshold" (``holds_below``) or ">= threshold"
    judged on paired runs (``a_runs[i]`` beside ``b_runs[i]``, in run order), looking at
    every n from ``FIRST_LOOK`` up to the pairs given: the first look that decides stands.

    Example: ``decide([0.61, 0.60, 0.59, 0.60], [1.0, 1.01, 0.99, 1.0], 0.7, True)`` is
    reproduced at 4 pairs."""
    if threshold <= 0 or k < 1:
        raise ValueError(f"threshold must be > 0 and k >= 1, not {threshold}, {k}")
    n_all = min(len(a_runs), len(b_runs))
    d = np.log(np.asarray(a_runs[:n_all], float)) - np.log(np.asarray(b_runs[:n_all], float))
    crit = _critical(confidence, k)
    lo = hi = value = math.nan
    for n in range(FIRST_LOOK, min(n_all, MAX_RUNS) + 1):
        m, s = float(d[:n].mean()), float(d[:n].std(ddof=1))
        half = crit[n] * s / math.sqrt(n)
        value, lo, hi = math.exp(m), math.exp(m - half), math.exp(m + half)
        below, above = hi <= threshold, lo >= threshold
        if below or above:
            verdict = stats.REPRODUCED if below == holds_below else stats.REFUTED
            return Decision(verdict, value, lo, hi, n, 0, confidence, k)
    if n_all and n_all < FIRST_LOOK:
        value = math.exp(float(d.mean()))
    used = min(n_all, MAX_RUNS)
    wants = 0 if used >= MAX_RUNS else max(used, FIRST_LOOK - 1) + 1 - used
    return Decision(stats.UNDECIDED, value, lo, hi, used, wants, confidence, k)


# -- the simulation ---------------------------------------------------------------------

RATIOS = (0.80, 0.95, 0.98, 1.00, 1.02, 1.05, 1.25)
CVS = (0.03, 0.08, 0.15)
RHO = 0.5
THRESHOLD = 0.6  # a "<=" claim (C2's hier / ring <= 0.6)
FIXED = 6


def _noise(rng: np.random.Generator, studies: int, runs: int, cv: float, drift: bool
           ) -> np.ndarray:
    """Log-noise of ``runs`` runs in run order per study: i.i.d. normal with sd ``cv``, or
    a stationary AR(1) with the same sd and coefficient RHO."""
    z = rng.standard_normal((studies, runs)) * cv
    if not drift:
        return z
    e = np.empty_like(z)
    e[:, 0] = z[:, 0]
    for t in range(1, runs):
        e[:, t] = RHO * e[:, t - 1] + math.sqrt(1 - RHO * RHO) * z[:, t]
    return e


def simulate_cell(rng: np.random.Generator, studies: int, ratio: float, cv: float,
                  drift: bool, k: int, confidence: float = 0.95) -> dict:
    """``studies`` seeded studies of a "<= THRESHOLD" claim whose k variants all have true
    ratio ``ratio`` x THRESHOLD (all equal: the pick's bias is then the largest), run in
    rounds of B then A_1..A_k; the rule stops at its first deciding look."""
    log_t = math.log(THRESHOLD)
    truth = log_t + math.log(ratio)
    e = _noise(rng, studies, MAX_RUNS * (k + 1), cv, drift).reshape(studies, MAX_RUNS, k + 1)
    d = truth + e[:, :, 1:] - e[:, :, :1]  # (studies, pairs, variants)
    crit = _critical(confidence, k)
    verdict = np.zeros(studies, int)  # 0 undecided, 1 reproduced, -1 refuted
    used = np.full(studies, MAX_RUNS)
    covered = np.ones(studies, bool)
    open_ = np.ones(studies, bool)
    for n in LOOKS:
        m = d[:, :n].mean(axis=1)
        s = d[:, :n].std(axis=1, ddof=1)
        best = m.argmin(axis=1)  # the pick: the smallest ratio
        mb, sb = m[np.arange(studies), best], s[np.arange(studies), best]
        half = crit[n] * sb / math.sqrt(n)
        rep, ref = mb + half <= log_t, mb - half >= log_t
        now = open_ & (rep | ref)
        verdict[now & rep], verdict[now & ref] = 1, -1
        used[now] = n
        if n == MAX_RUNS:
            now = open_
        covered[now] = np.abs(mb[now] - truth) <= half[now]
        open_ &= ~(rep | ref)
    # the same interval at a fixed 6 pairs, alpha divided by k only (no looks)
    m, s = d[:, :FIXED].mean(axis=1), d[:, :FIXED].std(axis=1, ddof=1)
    best = m.argmin(axis=1)
    mb, sb = m[np.arange(studies), best], s[np.arange(studies), best]
    half6 = t_quantile(1 - (1 - confidence) / (2 * k), FIXED - 1) * sb / math.sqrt(FIXED)
    fixed = np.where(mb + half6 <= log_t, 1, np.where(mb - half6 >= log_t, -1, 0))

    def wrong(v: np.ndarray) -> float:
        if ratio == 1.0:
            return float(np.mean(v != 0))
        return float(np.mean(v == (-1 if ratio < 1 else 1)))

    return {"ratio": ratio, "cv": cv, "drift": drift, "k": k,
            "reproduced": float(np.mean(verdict == 1)), "refuted": float(np.mean(verdict == -1)),
            "undecided": float(np.mean(verdict == 0)), "wrong": wrong(verdict),
            "runs_mean": float(used.mean()), "runs_p95": float(np.percentile(used, 95)),
            "coverage": float(covered.mean()), "fixed_wrong": wrong(fixed),
            "fixed_undecided": float(np.mean(fixed == 0))}


def simulate(studies: int, seed: int, ks: Sequence[int] = (1, 3)) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [simulate_cell(rng, studies, r, cv, drift, k)
            for k in ks for drift in (False, True) for cv in CVS for r in RATIOS]


def table(cells: Sequence[dict], studies: int, seed: int) -> str:
    head = ["# analysis.sequential --simulate: a '<= 0.6' claim, true ratio = 0.6 x r, "
            f"{studies} studies per cell, seed {seed}",
            f"# looks at {FIRST_LOOK}..{MAX_RUNS} runs a side, 95% confidence sequence; beside "
            f"it the same interval at a fixed {FIXED} runs a side",
            "#     r    cv  noise k   P(rep)  P(ref) P(und) P(wrong) runs  p95  cover | "
            f"fixed{FIXED}: P(wrong) P(und)",
            "#         (%)                                            (mean)       |"]
    rows = [f"  {c['ratio']:5.2f} {c['cv'] * 100:4.0f}  {'AR1' if c['drift'] else 'iid':>5} "
            f"{c['k']}  {c['reproduced']:6.3f}  {c['refuted']:6.3f} {c['undecided']:6.3f} "
            f"{c['wrong']:8.4f} {c['runs_mean']:5.2f} {c['runs_p95']:4.0f} "
            f"{c['coverage']:6.3f} |        {c['fixed_wrong']:8.4f} {c['fixed_undecided']:6.3f}"
            for c in cells]
    worst = max(cells, key=lambda c: c["wrong"])
    tail = [f"# worst P(wrong) {worst['wrong']:.4f} (r {worst['ratio']}, cv {worst['cv']:.0%}, "
            f"{'AR1' if worst['drift'] else 'iid'}, k {worst['k']}); worst fixed-{FIXED} "
            f"P(wrong) {max(c['fixed_wrong'] for c in cells):.4f}",
            f"# runs a side: mean {np.mean([c['runs_mean'] for c in cells]):.2f} over the "
            f"cells against {FIXED} fixed; lowest coverage at the stop "
            f"{min(c['coverage'] for c in cells):.3f}"]
    return "\n".join([*head, *rows, *tail])


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of at least 1")
    return v


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.sequential",
                                description=__doc__.splitlines()[0])
    p.add_argument("--simulate", action="store_true", required=True,
                   help="run the seeded simulation of the rule and print its table")
    p.add_argument("--studies", type=_positive, default=10_000, help="studies per cell")
    p.add_argument("--seed", type=int, default=0, help="the generator's seed")
    a = p.parse_args(argv)
    print(table(simulate(a.studies, a.seed), a.studies, a.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
