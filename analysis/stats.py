"""The statistics behind verdicts: spreads, confidence intervals and how many repeats decide.

Run times of communication are not deterministic: the same job on the same
machine gives a different figure each time. Following Hoefler & Belli,
"Scientific Benchmarking of Parallel Computing Systems: Twelve ways to tell the
masses when reporting performance results", SC 2015, this module

- reports every figure with its spread (``Spread``), never a bare number: the
  median with a confidence interval where there are enough samples, the
  min-max range over the repeats where there are not, and "one run" where there
  is a single sample;
- uses nonparametric (distribution-free) intervals, since run times are rarely
  normal (they are skewed, with a long tail of slow runs):

  * the interval of a median comes from order statistics (``median_ci``): the
    number of samples below the true median is binomial(n, 1/2), so
    ``[x_(j), x_(n-j+1)]`` (sorted samples, 1-based) covers the median with
    probability ``1 - 2 P(B < j)``; ``j`` is the largest with
    ``P(B < j) <= alpha / 2``. A 95 % interval needs at least 6 samples
    (``MIN_CI_SAMPLES``); with 6 it is the min-max, which is in fact a 96.9 %
    interval (``1 - 2/2^6``);
  * the interval of a ratio of two medians (one system against another, one
    scheme against another) comes from a percentile bootstrap of both samples,
    resampled independently with a seeded generator so results repeat exactly
    (``ratio_spread``); with fewer than 6 samples on a side, the range of all
    pairwise ratios, which is conservative (wider than any interval of the
    ratio of medians);

- compares against a claim's threshold with the whole interval, not with a
  point estimate, and only with an interval of stated coverage (``verdict``):
  reproduced when a confidence interval lies on the claim's side, refuted when
  it lies on the other side, undecided when it straddles, and undecided when
  there is no interval yet (a range over fewer than 6 runs, one run). A ratio
  claim is decided on its runs by ``decide`` (``analysis.sequential``: the
  paired runs' log-ratios, a 95 % confidence sequence over looks at 3 to 12
  runs a side, best of k at alpha / k), which also says how many runs a side it
  wants next. ``judge`` is the older check that takes a range or one run as it
  stands (``benchmarks.peer_fairness``'s goals still use it);
- says how many repeats would decide an undecided verdict
  (``repeats_to_decide``) or reach a wanted precision (``repeats_for_precision``,
  ``within``), assuming the interval's half-width shrinks as ``1/sqrt(n)``.
  This is a rough guide (exact for a normal mean, about right for a median and
  a bootstrap); repeat, re-measure, and judge again.

NaN samples (failed or missing measurements) are dropped before anything is
computed. Pure Python and numpy; no scipy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from analysis.sequential import (  # noqa: F401 (the verdicts and the ratio rule, re-exported)
    REFUTED,
    REPRODUCED,
    UNDECIDED,
    Decision,
    decide,
    decide_log_ratios,
)

#: fewest samples for a 95 % confidence interval of a median from order statistics
MIN_CI_SAMPLES = 6

#: Spread.kind of a 95 % confidence interval (the default confidence)
CI_95 = "95% CI"
#: Spread.kind of the min-max over a few repeats (fewer than MIN_CI_SAMPLES)
RANGE = "range"
#: Spread.kind of a single sample: lo = hi = value
SINGLE = "single"
#: Spread.kind when there are no samples: value, lo and hi are NaN
NONE = "none"

def _ci_kind(confidence: float) -> str:
    return f"{confidence * 100:g}% CI"


def _is_ci(kind: str) -> bool:
    return kind.endswith("% CI")


def _clean(samples: Iterable[float]) -> np.ndarray:
    """The samples as a float array, NaNs dropped."""
    arr = np.asarray(list(samples), dtype=float).ravel()
    return arr[~np.isnan(arr)]


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), not {confidence!r}")


def _order_index(n: int, confidence: float) -> int:
    """The largest 1-based j with P(B < j) <= alpha/2 for B ~ binomial(n, 1/2); 0 if none.

    Exact: the binomial coefficients and tail in integers (math.comb's recurrence, one
    step per j, so large n stays fast), compared with alpha as a rational."""
    half_alpha = (1 - Fraction(str(confidence))) / 2
    limit = half_alpha.numerator * 2**n  # P(B < j) <= alpha/2  <=>  cum * den <= limit
    den = half_alpha.denominator
    cum = 0  # sum of comb(n, k) for k < j, i.e. P(B < j) * 2^n
    term = math.comb(n, 0)  # comb(n, j), then by comb(n, j+1) = comb(n, j) (n-j) / (j+1)
    j = 0
    while j < n:
        if (cum + term) * den > limit:  # P(B < j + 1) > alpha/2
            break
        cum += term
        term = term * (n - j) // (j + 1)
        j += 1
    return min(j, (n + 1) // 2)


def median_ci(samples: Iterable[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """The distribution-free confidence interval of the median, from order statistics.

    The count of samples below the true median is binomial(n, 1/2), so the sorted
    samples' ``[x_(j), x_(n-j+1)]`` (1-based) cover the median with probability at
    least ``confidence`` for the largest ``j`` with ``P(B < j) <= (1 - confidence)/2``
    (computed exactly). For n = 10 at 95 %: j = 2, the interval is ``[x_(2), x_(9)]``
    (97.9 % coverage). For n = 6 at 95 %: j = 1, the min-max, which is exactly the
    96.9 % interval; the discrete binomial rarely gives exactly the level asked, and
    the interval given is the narrowest order-statistic one with at least that level.

    NaN samples are dropped first. None when fewer than ``MIN_CI_SAMPLES`` remain, or
    when no order statistic reaches the confidence (e.g. 99 % with 6 samples)."""
    _check_confidence(confidence)
    x = np.sort(_clean(samples))
    n = len(x)
    if n < MIN_CI_SAMPLES:
        return None
    j = _order_index(n, confidence)
    if j < 1:
        return None
    return float(x[j - 1]), float(x[n - j])


def _num(x: float, fmt: str) -> str:
    return format(x, fmt)


def _span(lo: float, hi: float, fmt: str) -> str:
    sep = " to " if lo < 0 or hi < 0 else "-"
    return f"{_num(lo, fmt)}{sep}{_num(hi, fmt)}"


@dataclass(frozen=True)
class Spread:
    """A point estimate with its spread.

    ``value``: the median (or ratio of medians); ``lo``, ``hi``: the interval;
    ``kind``: "95% CI" (a confidence interval; another level reads e.g. "90% CI"),
    "range" (min-max over fewer than MIN_CI_SAMPLES repeats), "single" (one
    sample: lo = hi = value) or "none" (no samples: all NaN); ``n``: the samples
    behind it (for a ratio, the smaller of the two counts)."""

    value: float
    lo: float
    hi: float
    kind: str
    n: int

    def words(self, fmt: str = ".2f", unit: str = "") -> str:
        """The figure as a report states it, e.g. "0.58 (95% CI 0.55-0.61, n=8)",
        "0.58 (range 0.55-0.61 over 3 repeats)", "0.58 (one run)"; ``unit`` follows the
        value ("2.00x (one run)")."""
        v = _num(self.value, fmt) + unit
        if self.kind == SINGLE:
            return f"{v} (one run)"
        if self.kind == RANGE:
            return f"{v} (range {_span(self.lo, self.hi, fmt)} over {self.n} repeats)"
        if self.kind == NONE:
            return "no data"
        return f"{v} ({self.kind} {_span(self.lo, self.hi, fmt)}, n={self.n})"

    def half_width(self) -> float:
        """The larger half of the interval: max(value - lo, hi - value); 0 for one run."""
        if self.kind == SINGLE:
            return 0.0
        return max(self.value - self.lo, self.hi - self.value)

    def half_width_share(self) -> float:
        """The larger half of the interval relative to the value:
        max(value - lo, hi - value) / |value|; 0 for one run, inf when the value is 0
        or NaN (no relative precision is defined)."""
        if self.kind == SINGLE:
            return 0.0
        if math.isnan(self.value) or self.value == 0:
            return math.inf
        hw = self.half_width()
        if math.isnan(hw):
            return math.inf
        return hw / abs(self.value)


def _none() -> Spread:
    return Spread(math.nan, math.nan, math.nan, NONE, 0)


def spread_of(samples: Iterable[float], confidence: float = 0.95) -> Spread:
    """The median of the samples with its spread: the order-statistic confidence interval
    (``median_ci``) when there are at least MIN_CI_SAMPLES, else the min-max range (kind
    "range"), and kind "single" for one sample. NaNs are dropped; no samples give
    ``Spread(nan, nan, nan, "none", 0)``."""
    x = _clean(samples)
    n = len(x)
    if n == 0:
        return _none()
    med = float(np.median(x))
    if n == 1:
        return Spread(med, med, med, SINGLE, 1)
    ci = median_ci(x, confidence) if n >= MIN_CI_SAMPLES else None
    if ci is not None:
        return Spread(med, ci[0], ci[1], _ci_kind(confidence), n)
    return Spread(med, float(x.min()), float(x.max()), RANGE, n)


def _ratio(a: float, b: float) -> float:
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.float64(a) / np.float64(b))


def _boot_medians(x: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """Medians of ``resamples`` bootstrap resamples of ``x`` (chunked to bound memory)."""
    n = len(x)
    rows = max(1, 2_000_000 // n)
    out = np.empty(resamples)
    for start in range(0, resamples, rows):
        stop = min(resamples, start + rows)
        idx = rng.integers(0, n, size=(stop - start, n))
        out[start:stop] = np.median(x[idx], axis=1)
    return out


def ratio_spread(num_samples: Iterable[float], den_samples: Iterable[float],
                 confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> Spread:
    """The ratio of medians median(num) / median(den) with its spread.

    With at least MIN_CI_SAMPLES on both sides: a percentile bootstrap interval (kind
    "95% CI" at the default confidence): each sample is resampled independently,
    ``resamples`` times, with ``numpy.random.default_rng(seed)``, so the interval is
    the same on every call; the interval is widened, if need be, to hold the point
    estimate. Otherwise the range of every pairwise ratio ``num_i / den_j`` (kind
    "range"): conservative, since no ratio of medians of these samples can fall outside
    it, and it is wider than an interval of the ratio would be. One sample on each
    side gives kind "single". ``n`` is the smaller sample count. NaNs are dropped;
    either side empty gives kind "none". Meant for positive quantities (times)."""
    return _two_sample(num_samples, den_samples, np.divide, confidence, resamples, seed)


def diff_spread(a_samples: Iterable[float], b_samples: Iterable[float],
                confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> Spread:
    """The difference of medians median(a) - median(b) with its spread, as
    ``ratio_spread`` (bootstrap interval from MIN_CI_SAMPLES a side, else the range of
    every pairwise difference)."""
    return _two_sample(a_samples, b_samples, np.subtract, confidence, resamples, seed)


def _two_sample(a_samples: Iterable[float], b_samples: Iterable[float], op,
                confidence: float, resamples: int, seed: int) -> Spread:
    _check_confidence(confidence)
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, not {resamples!r}")
    a, b = _clean(a_samples), _clean(b_samples)
    if len(a) == 0 or len(b) == 0:
        return _none()
    n = min(len(a), len(b))
    ma, mb = float(np.median(a)), float(np.median(b))
    value = _ratio(ma, mb) if op is np.divide else ma - mb
    if len(a) == 1 and len(b) == 1:
        return Spread(value, value, value, SINGLE, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        if len(a) >= MIN_CI_SAMPLES and len(b) >= MIN_CI_SAMPLES:
            rng = np.random.default_rng(seed)
            out = op(_boot_medians(a, rng, resamples), _boot_medians(b, rng, resamples))
            alpha = 1.0 - confidence
            lo, hi = np.percentile(out, [100 * alpha / 2, 100 * (1 - alpha / 2)])
            lo, hi = min(float(lo), value), max(float(hi), value)
            return Spread(value, lo, hi, _ci_kind(confidence), n)
        pairs = op(a[:, None], b[None, :])
    return Spread(value, float(pairs.min()), float(pairs.max()), RANGE, n)


def judge(spread: Spread, threshold: float, holds_below: bool) -> str:
    """The spread as it stands against "value <= threshold" (``holds_below``) or ">=".

    REPRODUCED when the whole of [lo, hi] is on the holding side (the threshold itself
    holds), REFUTED when it is wholly on the other side, UNDECIDED when it straddles the
    threshold or there are no samples. Any spread counts, a "range" over a few repeats
    and a "single" run (judged on its value) included: no coverage is stated, so this is
    a goal's reading, not a verdict; claims use ``verdict`` (a confidence interval
    needed) and ``decide`` (a ratio's runs)."""
    if spread.kind == NONE or math.isnan(spread.value):
        return UNDECIDED
    if spread.kind == SINGLE:
        lo = hi = spread.value
    else:
        lo, hi = spread.lo, spread.hi
    if holds_below:
        if hi <= threshold:
            return REPRODUCED
        if lo > threshold:
            return REFUTED
    else:
        if lo >= threshold:
            return REPRODUCED
        if hi < threshold:
            return REFUTED
    return UNDECIDED


def verdict(spread: Spread, threshold: float, holds_below: bool) -> str:
    """The verdict on a claim "value <= threshold" (``holds_below``) or ">= threshold" from
    a spread with stated coverage: ``judge``'s rule on a confidence interval (kind "95% CI"
    or another level), UNDECIDED on anything else. A "range" over fewer than
    MIN_CI_SAMPLES repeats covers the median with no stated probability (two runs: 50 %),
    and one run not at all, so neither decides a claim; more runs do."""
    if not _is_ci(spread.kind):
        return UNDECIDED
    return judge(spread, threshold, holds_below)


def _ceil(x: float) -> int:
    return math.ceil(x - 1e-9)  # 8.000000000001 from rounding is 8


def repeats_to_decide(spread: Spread, threshold: float, n: int | None = None) -> int | None:
    """About how many samples (per side, for a ratio) would make an undecided interval
    exclude the threshold, if the half-width shrinks as 1/sqrt(n).

    Needs ``half_width <= |value - threshold|``, so ``ceil(n * (half_width / |value -
    threshold|)^2)`` with the larger half ``max(value - lo, hi - value)``; never fewer
    than MIN_CI_SAMPLES (a "range" over fewer repeats is no confidence interval yet)
    nor fewer than n + 1. ``n`` defaults to ``spread.n``. Below MIN_CI_SAMPLES a range
    wholly on one side of the threshold, or one run off it, is not decided: it needs the
    runs that give an interval (MIN_CI_SAMPLES, at least n + 1), whatever its width (a
    range of 0.45-0.45 over 2 runs left ``--decide`` adding none). None with no data, when
    a confidence interval does not straddle the threshold (already decided), or when
    value == threshold (no number of repeats decides it)."""
    if spread.kind == NONE or spread.value == threshold:
        return None
    n = spread.n if n is None else n
    if spread.kind in (SINGLE, RANGE) and not spread.lo <= threshold <= spread.hi:
        return max(MIN_CI_SAMPLES, n + 1)
    if spread.kind == SINGLE or not spread.lo <= threshold <= spread.hi:
        return None
    hw = spread.half_width()
    gap = abs(spread.value - threshold)
    if not math.isfinite(hw) or not math.isfinite(gap):
        return None
    need = _ceil(n * (hw / gap) ** 2)
    return max(MIN_CI_SAMPLES, n + 1, need)


def repeats_for_precision(spread: Spread, pct: float, n: int | None = None) -> int:
    """About how many samples would bring the half-width within ±pct % of the value, if
    it shrinks as 1/sqrt(n): ``max(MIN_CI_SAMPLES, n, ceil(n * (share / (pct/100))^2))``
    with ``share = spread.half_width_share()``. One run (no spread seen yet) or no data
    gives MIN_CI_SAMPLES (or n if more). ``n`` defaults to ``spread.n``. ValueError when
    pct <= 0 or the value is 0 or NaN (no relative precision)."""
    if pct <= 0:
        raise ValueError(f"pct must be positive, not {pct!r}")
    n = spread.n if n is None else n
    if spread.kind in (SINGLE, NONE):
        return max(MIN_CI_SAMPLES, n)
    share = spread.half_width_share()
    if not math.isfinite(share):
        raise ValueError(f"no relative precision for value {spread.value!r}")
    need = _ceil(n * (share / (pct / 100)) ** 2)
    return max(MIN_CI_SAMPLES, n, need)


def within(spread: Spread, pct: float) -> bool:
    """Whether the spread is a confidence interval whose larger half is within ±pct % of
    the value (a range over a few repeats or one run never is)."""
    return _is_ci(spread.kind) and spread.half_width_share() <= pct / 100


#: ``agreement``'s readings of two sides' figures against a tolerance
CONVERGED, MOVED, UNRESOLVED = "converged", "moved", "unresolved"


def agreement(a_samples: Iterable[float], b_samples: Iterable[float],
              tolerance: float) -> tuple[str, Spread]:
    """Whether two sides' figures (the same set-up at two dilations, say) agree: the interval
    of their ratio of medians (``ratio_spread``: the range of every pairwise ratio below
    MIN_CI_SAMPLES a side, a bootstrap interval from there) inside ``1 +- tolerance``
    (CONVERGED), wholly outside (MOVED), or neither (UNRESOLVED), with the spread. One
    sample a side has no interval: UNRESOLVED, whatever its value."""
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must lie between 0 and 1, not {tolerance!r}")
    sp = ratio_spread(a_samples, b_samples)
    if sp.kind in (NONE, SINGLE) or math.isnan(sp.value):
        return UNRESOLVED, sp
    if 1 - tolerance <= sp.lo and sp.hi <= 1 + tolerance:
        return CONVERGED, sp
    if sp.lo > 1 + tolerance or sp.hi < 1 - tolerance:
        return MOVED, sp
    return UNRESOLVED, sp
