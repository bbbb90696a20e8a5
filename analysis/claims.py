"""The seed claims C1-C8 (docs/claims.md) checked against results and the cost model.

Each check returns a Claim: what was measured here (and in which figure),
what the fitted model predicts at the claim's scale, and a verdict —
``reproduced``, ``refuted`` or ``not reproducible here`` — with its reason.
Thresholds are stated next to each check; nothing is decided without data.

A claim that compares runs compares only runs of one matched set-up
(``analysis.match``): runs that differ in the claim's own variable alone (the
sync scheme for C2 and C4, the batch for C5 and C6, k for C7). Where several
matched sets hold the comparison, the verdict comes from the largest
(``match.scale``: most ranks, then nodes) and the others' figures are listed
beside it; where none does, the claim is "not reproducible here". Every figure
names the runs behind it (``Claim.runs``).

Every matched set is shown with its time dilation and host verdict
(``match.host_words``, ``Claim.host``). Claims that compare comm times (C1-C4, C7)
prefer sets whose runs were all link-bound (``match.host_rank``, before size): a
host-bound run's figure holds this machine's scheduling, polling and copying as
well as the links (docs/fidelity.md). Where the chosen set still has
host-bound runs, the reason says so and why; records without a verdict (before
schema 4) are judged as before, and the reason says their host load was not
judged. Claims of compute (C5, C6, C8) state the verdict without preferring.

A verdict needs an interval of stated coverage. A ratio claim (C2, C4's halves, C5,
C7) is decided on its paired runs (``stats.decide``, ``analysis.sequential``): each
side's runs in run order (by ``repeat``), a 95 % confidence sequence with looks at 3
to 12 runs a side, the figure the best of k variants judged at alpha / k (C2: the
hierarchical algorithms; C4: stale x synchronous schemes, or the mitigations);
below 3 runs a side it is ``undecided (n runs: range ...)`` and one run a side is
never judged on its value. C3's overlap, a median, needs its order-statistic
interval (``stats.verdict``: 6 runs). ``Claim.spread`` stays the figure's spread as
the measured words give it; ``Claim.decision`` is what the verdict was decided on,
and how many runs a side it wants next.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import product

import numpy as np

from analysis import convergence, match, overlap, sequential, stats
from analysis.alphabeta import Scenario, predict, sync_share
from analysis.costmodel import ModelResult, error_by_algorithm
from analysis.load import get, knob, num, stat
from commbench import dilation as dil
from commbench import metrics
from commbench.hostload import is_link_bound

REPRODUCED, REFUTED, NOT_HERE = "reproduced", "refuted", "not reproducible here"
UNDECIDED = stats.UNDECIDED


@dataclass
class Claim:
    id: str
    text: str
    measured: str
    figure: str | None
    model: str
    verdict: str
    reason: str
    #: the matched set-up the verdict comes from, in words
    setup: str | None = None
    #: figure -> the ids of the runs behind it
    runs: dict[str, list[str]] = field(default_factory=dict)
    #: the figures of the other matched set-ups, each with its set-up and runs
    others: list[str] = field(default_factory=list)
    #: the verdict's runs' time dilation and host verdict, in words (``match.host_words``)
    host: str | None = None
    #: the spread of the figure the verdict compares with its threshold (``analysis.stats``:
    #: the median or ratio of medians over repeats, as the measured words give it)
    spread: stats.Spread | None = None
    #: a ratio claim's verdict on its paired runs (``stats.decide``): the interval it was
    #: decided on, the runs a side it read and how many more it wants
    decision: sequential.Decision | None = None


def _decide(spread: stats.Spread, threshold: float, holds_below: bool, what: str,
            fmt: str = ".2f") -> tuple[str, str]:
    """A verdict on a median's ``spread`` against ``threshold`` (``stats.verdict``: reproduced
    or refuted when the whole confidence interval is on one side, undecided when it
    straddles or there is no interval yet, below ``stats.MIN_CI_SAMPLES`` runs) and the
    words for its reason: ``what``, the spread, and for an undecided verdict about how many
    runs would decide it ("runs a side", the words ``experiments.study`` reads)."""
    verdict = stats.verdict(spread, threshold, holds_below)
    if spread.kind in (stats.RANGE, stats.SINGLE):
        runs = f"{spread.n} run" + ("s" if spread.n > 1 else "")
        seen = (f"range {spread.lo:{fmt}}-{spread.hi:{fmt}}" if spread.kind == stats.RANGE
                else format(spread.value, fmt))
        need = stats.repeats_to_decide(spread, threshold)
        about = f"; about {need} runs a side would decide it" if need else ""
        return verdict, (f"{what} undecided ({runs}: {seen}): a verdict needs a 95% interval, "
                         f"from {stats.MIN_CI_SAMPLES} runs{about}")
    note = f"{what} {spread.words(fmt)}"
    if verdict == UNDECIDED:
        need = stats.repeats_to_decide(spread, threshold)
        note += (f": the interval straddles {threshold:{fmt}}; " + (
            f"about {need} runs a side would decide it" if need else
            "no number of repeats decides it"))
    return verdict, note


def _in_run_order(runs: Iterable[dict]) -> list[dict]:
    """A side's runs in the order they ran, to pair with another side's (``stats.decide``):
    by their repeat (``launch.sweep --repeats``: repeat r of one side ran in round r
    beside repeat r of the other; records carry no start time), in the order read within
    one repeat or without one."""
    def repeat(r: dict) -> float:
        value = num(r.get("repeat"))
        return 0.0 if math.isnan(value) else value

    return sorted(runs, key=repeat)


def _decision_words(d: sequential.Decision, threshold: float, what: str, fmt: str) -> str:
    """The reason's words for a ratio claim's decision: ``what`` and the interval (or the
    range below the first look); where undecided, what it wants and about how many runs a
    side would decide it if the mean and spread held (``sequential.runs_to_decide``)."""
    note = f"{what} {d.words(fmt)}"
    if d.verdict != UNDECIDED:
        return note
    need = sequential.runs_to_decide(d, threshold)
    about = (f"about {need} runs a side would decide it" if need else
             f"no number of runs up to {sequential.MAX_RUNS} a side would decide it at this "
             "spread" if not math.isnan(d.log_sd) else "no spread seen yet")
    if d.coverage is None:
        return (f"{note}: a verdict needs a {sequential.CONFIDENCE:.0%} interval, from "
                f"{sequential.FIRST_LOOK} runs a side; {about}")
    if d.wants == 0:
        return (f"{note}: the interval straddles {threshold:{fmt}} at the cap of "
                f"{sequential.MAX_RUNS} runs a side: undecided")
    return (f"{note}: the interval straddles {threshold:{fmt}}; one more run a side next, "
            f"{about}")


def _decide_runs(num_runs: Sequence[float], den_runs: Sequence[float], threshold: float,
                 holds_below: bool, what: str, k: int = 1, fmt: str = ".2f"
                 ) -> tuple[str, str, sequential.Decision | None]:
    """A ratio claim's verdict on its paired runs (``stats.decide``: a 95 % confidence
    sequence, reproduced or refuted from 3 runs a side when the whole interval is on one
    side, the figure the best of ``k``), the words for its reason and the decision; one
    run a side, or two, is undecided. Each side's figures in run order
    (``_in_run_order``). A figure of 0 or below has no log-ratio: undecided, and says so."""
    try:
        d = stats.decide(num_runs, den_runs, threshold, holds_below, k)
    except ValueError as e:
        return UNDECIDED, f"{what}: no verdict ({e})", None
    return d.verdict, _decision_words(d, threshold, what, fmt), d


def _by_scheme(g: Sequence[dict], keep: Callable[[dict], bool] = lambda r: True
               ) -> dict[tuple, list[dict]]:
    """The runs of a matched set kept by ``keep``, by sync scheme (the repeats of each)."""
    out: dict[tuple, list[dict]] = {}
    for r in g:
        if keep(r):
            out.setdefault(match.sync_scheme(r), []).append(r)
    return out


def _summaries(records: Sequence[dict]) -> list[dict]:
    return [r for r in records if r.get("kind") == "summary"]


def _med(vals: Sequence[float]) -> float:
    vals = [v for v in vals if not math.isnan(v)]
    return metrics.percentile(vals, 50) if vals else math.nan


def _global_batch(r: dict) -> float:
    return num(r.get("world_size")) * num(r.get("batch_size")) * (num(get(r, "accum_steps")) or 1)


def _setup(g: Sequence[dict], vary: Sequence[str] = ()) -> str:
    """A matched set's set-up in words, less its dilation (``Claim.host`` gives it)."""
    return match.describe(g[0], (*vary, "dilation"))


def _choose(groups: list[list[dict]], figure: Callable[[list[dict]], tuple[str, dict]],
            vary: Sequence[str], key=match.scale, link_bound: bool = True
            ) -> tuple[list[dict], str, dict, list[str]]:
    """The matched set a verdict comes from (with ``link_bound``, the most link-bound by
    ``match.host_rank``; then the largest by ``key``), its figure text and runs, and one
    line per other set: its set-up, host verdict, figure and runs."""
    rank = (lambda g: (match.host_rank(g), *key(g))) if link_bound else key
    ordered = sorted(groups, key=rank, reverse=True)
    chosen = ordered[0]
    text, runs = figure(chosen)
    others = []
    for g in ordered[1:]:
        t, rs = figure(g)
        others.append(f"{_setup(g, vary)} ({match.host_words(g)}): {t} ("
                      + "; ".join(f"{k}: {', '.join(v)}" for k, v in rs.items()) + ")")
    return chosen, text, runs, others


def _host_note(g: Sequence[dict], links: bool = True) -> str:
    """What a verdict's reason adds on its runs' host load: nothing when every run was
    link-bound; that some were host-bound, and why (with ``links``, a comparison of comm
    times, and runs across nodes: rerun with time dilation); or that it was not judged."""
    rank = match.host_rank(g)
    if rank == 2:
        return ""
    if rank == 1:
        unjudged = sum(is_link_bound(r) is None for r in g)
        return "; host load not judged" + ("" if unjudged == len(g) else
                                           f" for {unjudged} of {len(g)} runs")
    note = f"; its runs were {match.host_verdict(g)}"
    if links and max(num(r.get("nodes")) for r in g) > 1:
        k = max(num(r.get("dilation") or 1) for r in g)
        note += ": the figure holds this machine's scheduling as well as the links, " + (
            f"rerun at --dilation {dil.text(2 * k)} (python -m experiments.study)"
            if 2 * k <= dil.MAX_FACTOR else
            f"and K = {dil.text(k)} is the highest the emulation runs: fewer ranks on "
            "this machine's cores, or a real cluster")
    return note


def _scenario(model: ModelResult | None) -> Scenario:
    """The model's scenario, else the one device scenario of predictions at scale (the
    committed H200 profile; ``analysis.overlap``)."""
    return model.scenario if model is not None else overlap.default_scenario()


def _device(sc: Scenario) -> overlap.Device | None:
    """The overlap model's device when it is the scenario's (the committed H200 profile):
    compute and overlap from one device, never two."""
    try:
        dev = overlap.h200()
    except overlap.ModelError:
        return None
    return dev if overlap.model_scenario(dev) == sc else None


#: C1's scale: global batch above 2048 at the H200 profile's per-GPU batch 256: 16 ranks
#: (2 nodes, global batch 4096) and 256 ranks (65,536)
C1_RANKS = (16, 256)
C1_RATES = (25.0, 100.0)


def _c1_prediction(sc: Scenario) -> str:
    dev = _device(sc)
    if dev is None:
        parts = [f"{p} ranks at {r:g} Gbit/s: flat {sync_share('ring', p, r, sc)[1]:.0%}, "
                 f"hierarchical {sync_share('hier', p, r, sc)[1]:.0%}"
                 for r in C1_RATES for p in C1_RANKS]
        return (f"{sc.compute_s * 1e3:.0f} ms compute, {sc.grad_bytes / 1e6:.0f} MB gradient, "
                "no overlap; sync share " + "; ".join(parts))
    batch = 256  # the device profile's per-GPU batch
    parts = []
    for r in C1_RATES:
        for p in C1_RANKS:
            shares = {s: overlap.predict_step(s, p, r, dev) for s in overlap.STRATEGIES}
            parts.append(f"{p} ranks (global batch {p * batch}) at {r:g} Gbit/s: " + ", ".join(
                f"{s} {st.exposed_s / st.step_s:.0%}" for s, st in shares.items()))
    return (f"sync share on {dev.profile.name} ({dev.profile.compute_s * 1e3:.0f} ms compute, "
            f"{dev.local_size} per node; bucketed overlaps backward, 25 MiB buckets): "
            + "; ".join(parts))


def c1(records, model) -> Claim:
    text = "at global batch > 2048, gradient sync is ~35% of the training step"
    sc = _scenario(model)
    flat = sync_share("ring", 256, 100, sc)[1]
    pred = _c1_prediction(sc)
    recs = [r for r in _summaries(records) if not math.isnan(stat(r, "sync_share"))]
    if not recs:
        return Claim("C1", text, "no allreduce summaries", None, pred, NOT_HERE,
                     "no runs with a sync share")
    # a link-bound run first (match.host_rank), then the largest global batch
    big = max(recs, key=lambda r: (match.host_rank([r]), _global_batch(r)))
    gb, share = _global_batch(big), stat(big, "sync_share")
    k = num(get(big, "accum_steps"))
    accum = f" x {k:g} accumulated" if k > 1 else ""
    among = ""  # where a larger run was passed over for its host verdict, say among which
    if max(map(_global_batch, recs)) > gb:
        among = (" among link-bound runs" if match.host_rank([big]) == 2 else
                 " among runs not judged host-bound")
    measured = (f"largest global batch{among} here {gb:.0f} ({big.get('world_size')} ranks x "
                f"{big.get('batch_size')}{accum}): sync share {share:.0%} ({_scheme(big)}; "
                f"run {big.get('run_id')})")
    found = {"setup": _setup([big]), "runs": {"sync share": match.run_ids([big])},
             "host": match.host_words([big])}
    note = _host_note([big])
    if gb <= 2048:
        # the model decides at the claim's scale: within 10 points of 35% counts as agreement
        verdict = REPRODUCED if abs(flat - 0.35) <= 0.10 else REFUTED
        return Claim("C1", text, measured, "sync_share_vs_ranks", pred, NOT_HERE,
                     f"global batch > 2048 needs more ranks than this machine has; the model "
                     f"{verdict} it at 256 ranks, 100 Gbit/s (flat ring, no overlap: {flat:.0%} vs "
                     "35%), and the share depends mostly on the link speed" + note, **found)
    verdict = REPRODUCED if abs(share - 0.35) <= 0.10 else REFUTED
    return Claim("C1", text, measured, "sync_share_vs_ranks", pred, verdict,
                 f"measured {share:.0%} vs 35% (agreement: within 10 points){note}", **found)


_scheme = match.scheme_words


def _not_matched(kinds: str, vary: str, pairs: Iterable[tuple[dict, dict]] = ()) -> str:
    """Why a comparison found no matched set: what "one set-up" holds equal, and where
    the closest of the candidate ``pairs`` of runs differ."""
    same = ", ".join(match.WORDS[f] for f in match.FIELDS if f != vary)
    why = (f"no {kinds} of one matched set-up (runs differing only in the "
           f"{match.WORDS[vary]}: same {same})")
    diffs = [match.differences(a, b, (vary,)) for a, b in pairs]
    if diffs:
        closest = min(diffs, key=len)
        why += f"; the closest pair here differs in {', '.join(match.WORDS[f] for f in closest)}"
    return why


# -- C2: hierarchical vs flat ring ------------------------------------------------------

def _is_flat_ring(r: dict) -> bool:
    return match.sync_family(r) == "flat" and r.get("algo") == "ring"


def _is_hier(r: dict) -> bool:
    return match.sync_family(r) == "hierarchical"


def _c2_sides(g: list[dict]) -> tuple[list[dict], dict[str, list[dict]]]:
    """The flat ring's runs and each hierarchical algorithm's, in run order."""
    ring = _in_run_order(r for r in g if _is_flat_ring(r))
    hier = {algo: _in_run_order(r for r in g if _is_hier(r) and r.get("algo") == algo)
            for algo in match.HIERARCHICAL_ALGOS}
    return ring, {algo: hs for algo, hs in hier.items() if hs}


def _exposed(rs: Sequence[dict]) -> list[float]:
    return [stat(r, "exposed_sync_s") for r in rs]


def _c2_ratios(g: list[dict]) -> tuple[dict[str, stats.Spread], dict[str, list[str]]]:
    """Exposed sync of each hierarchical algorithm / the flat ring's: the ratio of their
    medians over repeats, with its spread (``stats.ratio_spread``)."""
    ring, hier = _c2_sides(g)
    ratios, runs = {}, {"flat (ring)": match.run_ids(ring)}
    for algo, hs in hier.items():
        ratios[algo] = stats.ratio_spread(_exposed(hs), _exposed(ring))
        runs[f"hierarchical ({algo})"] = match.run_ids(hs)
    return ratios, runs


def _c2_figure(g: list[dict]) -> tuple[str, dict[str, list[str]]]:
    ratios, runs = _c2_ratios(g)
    return ("exposed sync / flat ring: " + ", ".join(f"{k} {v.words()}"
                                                     for k, v in ratios.items()), runs)


def c2(records, model) -> Claim:
    text = "hierarchical (two-level) all-reduce cuts communication cost ~40%"
    sc = _scenario(model)
    n = sc.grad_bytes
    big = predict("hier", n, 256, sc.params(100), 32, 8) / predict("ring", n, 256,
                                                                      sc.params(100), 32, 8)
    pred = f"hier / flat ring at 256 ranks (32 x 8), 100 Gbit/s: {big:.2f} (cut {1 - big:.0%})"
    multi = [r for r in _summaries(records) if num(r.get("nodes")) > 1
             and not math.isnan(stat(r, "exposed_sync_s"))]
    vary = ("sync",)
    groups = [g for g in match.matched_sets(multi, vary)
              if any(map(_is_flat_ring, g)) and any(map(_is_hier, g))]
    if not groups:
        if not multi:
            return Claim("C2", text, "no runs on more than one node", None, pred, NOT_HERE,
                         "one host: both levels are the same shared memory; run on the "
                         "emulated cluster (python -m launch.cluster)")
        seen = sorted({_scheme(r) for r in multi})
        return Claim("C2", text, "no flat ring and hierarchical runs of one set-up on more "
                     f"than one node (multi-node runs: {', '.join(seen)})", None, pred, NOT_HERE,
                     _not_matched("flat ring and hierarchical (--strategy hierarchical, or "
                                  "flat --algo hier / hier-leader) runs", "sync",
                                  product(filter(_is_flat_ring, multi),
                                          filter(_is_hier, multi))))
    g, measured, runs, others = _choose(groups, _c2_figure, vary)
    f = next(r for r in g if _is_flat_ring(r))
    nodes, local, p = int(f["nodes"]), int(f["local_size"]), int(f["world_size"])
    if model is not None and not math.isnan(model.params.alpha_inter):
        def vs_ring(algo: str) -> float:
            args = (f["grad_bytes"], p, model.params, nodes, local)
            return predict(algo, *args) / predict("ring", *args)

        pred += (f"; with the fitted links at {nodes} x {local}: hier {vs_ring('hier'):.2f}, "
                 f"leader {vs_ring('hier-leader'):.2f}")
        errs = [f"{a} {e:.0%}" for a, lv, _, e in
                error_by_algorithm(model.held_points, model.params) if lv == "inter"]
        if errs:
            pred += ("; the model's median error on these runs' inter-node microbenchmarks "
                     f"(>= 1 MiB, not fitted on): {', '.join(errs)}")
    ratios, _ = _c2_ratios(g)
    best = min(ratios, key=lambda k: ratios[k].value)
    effs: dict[str, list[float]] = {}  # per scheme, each repeat's link efficiency
    for r in g:
        if r.get("link_efficiency") is not None:
            effs.setdefault(_scheme(r), []).append(num(r["link_efficiency"]))
    link = "; ".join(f"{scheme}: {statistics.median(xs):.2f}"
                     + (f" ({min(xs):.2f}-{max(xs):.2f} over {len(xs)})" if len(xs) > 1 else "")
                     for scheme, xs in effs.items())
    measured = (f"{measured} on {nodes} nodes x {local} ({f.get('link_shaping') or 'unshaped'} "
                f"links)" + (f"; link efficiency {link}" if link else ""))
    # a cut of at least 30 %: the ratio at most 0.70, judged on the paired runs of the best
    # variant, best of the variants measured (alpha / k)
    ring, hier = _c2_sides(g)
    verdict, note, decision = _decide_runs(_exposed(hier[best]), _exposed(ring), 0.70, True,
                                           f"best variant ({best}): ratio", k=len(hier))
    return Claim("C2", text, measured, "overlap", pred, verdict,
                 f"{note}; it cuts {1 - ratios[best].value:.0%} (reproduced when the ratio is "
                 f"at most 0.70, a cut of at least 30%){_host_note(g)}", _setup(g, vary), runs,
                 others, match.host_words(g), ratios[best], decision)


# -- C3: bucketed ---------------------------------------------------------------------

def _c3_figure(g: list[dict]) -> tuple[str, dict[str, list[str]]]:
    r = g[0]
    calls = (r.get("knobs") or {}).get("buckets")
    return (f"{r.get('world_size')} ranks, bucket {num(knob(r, 'bucket_mb')):g} MB: {calls} "
            f"all-reduces per step for {r.get('grad_tensors')} gradient tensors, overlap "
            f"{_med([stat(x, 'overlap') for x in g]):.2f}", {"bucketed": match.run_ids(g)})


def c3(records, model) -> Claim:
    text = ("bucketed gradient sync (DDP bucket_cap_mb=25) cuts the number of comm calls and "
            "overlaps with backward")
    buck = [r for r in _summaries(records) if r.get("strategy") == "bucketed"]
    sc = _scenario(model)
    per_tensor = [r for r in buck if num(knob(r, "bucket_mb")) == 0]
    pred = "no overlap term in the alpha-beta model"
    sizes = (per_tensor[0].get("knobs") or {}).get("bucket_bytes") if per_tensor else None
    dev = _device(sc)
    if dev is not None:
        flat = overlap.predict_step("flat", 256, 100, dev)
        steps = {mb: overlap.predict_step("bucketed", 256, 100, dev, mb) for mb in (25, 0)}
        pred = (f"{dev.profile.name}, 256 ranks, 100 Gbit/s: flat (one all-reduce after "
                f"backward) exposes {flat.exposed_s * 1e3:.1f} ms; " + "; ".join(
                    f"{'per-tensor' if mb == 0 else f'{mb} MiB buckets'}: {st.buckets} "
                    f"all-reduces, exposed {st.exposed_s * 1e3:.1f} ms, overlap "
                    f"{1 - st.exposed_s / st.comm_s:.2f}" for mb, st in steps.items()))
    elif sizes:
        nodes = 256 // sc.local_size
        t0 = sum(predict("ring", b, 256, sc.params(100), nodes, sc.local_size) for b in sizes)
        t1 = predict("ring", sum(sizes), 256, sc.params(100), nodes, sc.local_size)
        pred = (f"{len(sizes)} per-tensor all-reduces cost {t0 * 1e3:.1f} ms vs {t1 * 1e3:.1f} ms "
                f"one-shot at 256 ranks, 100 Gbit/s (latency terms)")
    if model is not None:
        checks, _ = overlap.check_runs(records, model.params)
        if checks:
            used, which = overlap.judged_on(checks)
            pred += (f"; the overlap model's median error on {len(used)} bucketed runs here: "
                     f"exposed sync {overlap.median_abs([c.exposed_err for c in used]):.0%}, "
                     f"step {overlap.median_abs([c.step_err for c in used]):.0%} (judged on "
                     f"{which})")
    if not buck:
        return Claim("C3", text, "no bucketed runs", None, pred, NOT_HERE, "no data")
    groups = match.matched_sets(buck)  # repeats of one set-up and bucket size
    groups = [g for g in groups if num(knob(g[0], "bucket_mb")) == 25] or groups
    g, measured, runs, others = _choose(groups, _c3_figure, ())
    calls, tensors = (g[0].get("knobs") or {}).get("buckets"), g[0].get("grad_tensors")
    ov = stats.spread_of([stat(r, "overlap") for r in g])
    fewer = calls is not None and tensors is not None and calls < tensors
    verdict, note = _decide(ov, 0.1, False, "overlap")
    if not fewer:
        verdict = REFUTED
    return Claim("C3", text, measured, "overlap", pred, verdict,
                 f"calls fewer than tensors: {fewer}; {note} (reproduced with fewer calls and "
                 f"overlap above 0.1)" + _host_note(g), _setup(g), runs, others,
                 match.host_words(g), ov)


# -- C4: asynchronous updates ----------------------------------------------------------

def _synchronous(r: dict) -> bool:
    """A run whose step waits for its own gradients, with nothing overlapped: the
    reference the seed's "3x" speaks of (async s=0 runs async's own code)."""
    family = match.sync_family(r)
    return family in ("flat", "hierarchical") or (
        family == "async" and num(knob(r, "staleness")) == 0)


def _stale(r: dict) -> bool:
    family = match.sync_family(r)
    return family == "ps" or (family == "async" and num(knob(r, "staleness")) > 0)


def _c4_speedup(g: list[dict]) -> tuple[stats.Spread, list[dict], list[dict], str, int]:
    """Fastest stale scheme / fastest synchronous scheme of one matched set (each by its
    median over repeats), with the spread of that ratio, each side's runs in run order, the
    rate read and k, the pairs of schemes the pick compared (stale x synchronous). Runs
    are judged by ``wall_throughput`` where all of them carry it (async's transfers run
    on between steps, which ``step_s`` misses), else by ``throughput``."""
    pair = [r for r in g if _synchronous(r) or _stale(r)]
    rate = "wall_throughput" if all(not math.isnan(stat(r, "wall_throughput")) for r in pair) \
        else "throughput"

    def fastest(keep: Callable[[dict], bool]) -> list[dict]:
        return _in_run_order(max(_by_scheme(g, keep).values(),
                                 key=lambda rs: _med([stat(r, rate) for r in rs])))

    ref, best = fastest(_synchronous), fastest(_stale)
    k = len(_by_scheme(g, _synchronous)) * len(_by_scheme(g, _stale))
    return (stats.ratio_spread([stat(r, rate) for r in best], [stat(r, rate) for r in ref]),
            best, ref, rate, k)


def _c4_figure(g: list[dict]) -> tuple[str, dict[str, list[str]]]:
    speed, best, ref, rate, _ = _c4_speedup(g)
    return (f"fastest stale / fastest synchronous {rate}: {speed.words(unit='x')} ("
            f"{_scheme(best[0])} "
            f"{_med([stat(r, rate) for r in best]):.4g} vs {_scheme(ref[0])} "
            f"{_med([stat(r, rate) for r in ref]):.4g} samples/s, medians)",
            {_scheme(best[0]): match.run_ids(best), _scheme(ref[0]): match.run_ids(ref)})


def _c4_ratios(pts: Sequence[convergence.ConvergencePoint], ref: convergence.ConvergencePoint,
               by_seed: bool = False) -> dict[str, stats.Spread]:
    """Each stale configuration's time to accuracy / synchronous training's, seed by seed
    (``convergence.time_ratio_or_never``: inf where it never reached the target; ``by_seed``
    across the settings of a grid), with the spread over seeds."""
    return {p.label: stats.spread_of(convergence.time_ratio_or_never(p, ref, by_seed))
            for p in pts if not p.is_reference and p.strategy == "async"}


def _tta_words(sp: stats.Spread) -> str:
    """A time-to-accuracy ratio's spread in words, "never" for a seed that never reached
    the target (an infinite ratio)."""
    if math.isinf(sp.value) and math.isinf(sp.lo):
        return f"never (no seed of {sp.n} reached the target)"
    return sp.words().replace("inf", "never")


def _setting_words(p: convergence.ConvergencePoint) -> str:
    lr, momentum = convergence.setting(p)
    return f"lr {lr:g}, momentum {momentum:g}"


def _at_best(group: Sequence[convergence.ConvergencePoint]
             ) -> tuple[convergence.ConvergencePoint, list[convergence.ConvergencePoint], int]:
    """A grid's synchronous reference and each other configuration at its best training
    setting (``convergence.best_setting``), and the settings in the grid (1: no grid)."""
    grid = len({convergence.setting(p) for p in group})
    labels: dict[str, list[convergence.ConvergencePoint]] = {}
    for p in group:
        labels.setdefault(p.label, []).append(p)
    best = [convergence.best_setting(ps) for ps in labels.values()]
    ref = next(p for p in best if p.is_reference)
    return ref, best, grid


def _c4_accuracy_words(group: Sequence[convergence.ConvergencePoint]) -> str:
    ref, pts, grid = _at_best(group)
    ratios = _c4_ratios(pts, ref, by_seed=grid > 1)
    steps = dict(ref.setup).get("steps")
    reached = ", ".join(f"{p.label} {p.reached}/{p.n}" for p in pts)
    at = ("" if grid == 1 else f"; each at its best of {grid} settings: " + ", ".join(
        f"{p.label} {_setting_words(p)}" for p in pts))
    return (f"time to {ref.target_accuracy:g} held-out accuracy / s=0's, per seed over "
            f"{ref.n} seeds ({steps} steps): " + ", ".join(f"{k} {_tta_words(v)}"
                                                         for k, v in ratios.items())
            + f"; seeds that reached it: {reached}{at}")


def _c4_accuracy_half(records: Sequence[dict]) -> tuple[str, str, str, dict, list[str]]:
    """C4's accuracy half by time to a target accuracy (``analysis.convergence``): at the
    largest staleness, with each mitigation, the paired ratio over seeds of the time to
    the target against synchronous training's; staleness hurts when even the better
    mitigation's ratio is above 1 (its spread wholly so: reproduced; wholly below:
    refuted; straddling: undecided). (verdict, measured, reason, runs, other set-ups)."""
    pts = convergence.points(records)
    sets: dict[tuple, list[convergence.ConvergencePoint]] = {}
    for p in pts:  # a grid of training settings is one set-up: each compared at its best
        sets.setdefault((p.target_accuracy, convergence.base_setup(p)), []).append(p)
    usable = []
    for group in sets.values():
        refs = [p for p in group if p.is_reference]
        stale = [p for p in group if p.strategy == "async" and (p.staleness or 0) > 0]
        if refs and stale:
            usable.append((max(p.n for p in refs), group, stale))
    if not usable:
        why = ("no convergence runs (python -m commbench.staleness; experiments.study plans them "
               "as convergence-digits)" if not pts else
               "no convergence runs at s = 0 and s > 0 of one set-up and target")
        return NOT_HERE, "", why, {}, []
    # the set-up with the most seeds, then the most ranks
    usable.sort(key=lambda u: (u[0], dict(u[1][0].setup).get("ranks") or 0), reverse=True)
    _, group, stale = usable[0]
    ref, best_pts, grid = _at_best(group)
    runs = {f"convergence {p.label}" + (f" ({_setting_words(p)})" if grid > 1 else ""):
            [str(i) for i in p.run_ids] for p in group}
    where = ", ".join(f"{k} {v}" for k, v in ref.setup if k in ("model", "ranks", "nodes"))
    measured = f"convergence ({where}): {_c4_accuracy_words(group)}"
    others = [f"convergence ({', '.join(f'{k} {v}' for k, v in g[0].setup)}, target "
              f"{g[0].target_accuracy:g}): {_c4_accuracy_words(g)}" for _, g, _ in usable[1:]]
    if ref.reached == 0:
        return (NOT_HERE, measured, f"synchronous training reached {ref.target_accuracy:g} in "
                f"none of {ref.n} seeds" + (f" at any of {grid} settings" if grid > 1 else "")
                + ": no time to compare with (more --steps, or a lower --target-accuracy)",
                runs, others)
    top = max(p.staleness or 0 for p in stale)
    at_top = [p for p in best_pts if p.strategy == "async" and p.staleness == top]
    ratios = _c4_ratios(at_top, ref, by_seed=grid > 1)
    best = min(ratios, key=lambda k: ratios[k].value)
    what = f"{best}, the better mitigated at s={top}: time to accuracy / s=0's"
    if grid > 1:
        what += f", each at its best of {grid} settings"
    seeds = convergence.time_ratio_or_never(next(p for p in at_top if p.label == best), ref,
                                            by_seed=grid > 1)
    # the picks the figure is the best of: the mitigations, and on a grid the setting of
    # each side (the stale configuration's and the reference's): alpha / k for them all
    k = len(ratios) * grid * grid
    if any(math.isinf(x) for x in seeds):
        # a seed that never got there has no log-ratio: the interval of the mean needs them all
        verdict, note = UNDECIDED, (f"{what} {_tta_words(ratios[best])}: a seed never reached "
                                    "the target, so no interval of the paired ratio (more "
                                    "--steps)")
    else:
        # per seed, paired by seed; the better of the mitigations (and settings) read
        d = stats.decide_log_ratios(np.log(seeds), 1.0, False, k=k)
        verdict, note = d.verdict, _decision_words(d, 1.0, what, ".2f")
    return (verdict, measured, f"{note} (staleness hurts when even that is above 1; "
            f"{len(ratios)} mitigation(s)" + (f" x {grid} settings a side" if grid > 1 else "")
            + " read)", runs, others)


def _both(speed: str, accuracy: str) -> str:
    """A claim of two halves: refuted when either is, reproduced when both are, undecided
    when neither is refuted and one is undecided."""
    if REFUTED in (speed, accuracy):
        return REFUTED
    if UNDECIDED in (speed, accuracy):
        return UNDECIDED
    return REPRODUCED if speed == accuracy == REPRODUCED else NOT_HERE


def c4(records, model) -> Claim:
    text = "async gradient updates have ~3x theoretical speed-up, but staleness hurts"
    sc = _scenario(model)
    share = sync_share("ring", 256, 100, sc)[1]
    pred = (f"hiding all sync bounds the speed-up at 1 / (1 - sync share) = {1 / (1 - share):.2f}x "
            f"at 256 ranks, 100 Gbit/s (3x needs a sync share of 67%)")
    acc_verdict, acc_measured, acc_reason, acc_runs, acc_others = _c4_accuracy_half(records)
    accuracy = f"; {acc_measured}" if acc_measured else ""
    recs = [r for r in _summaries(records) if not math.isnan(stat(r, "throughput"))]
    vary = ("sync",)
    groups = [g for g in match.matched_sets(recs, vary)
              if any(map(_synchronous, g)) and any(map(_stale, g))]
    if not groups:
        if not any(map(_stale, recs)):
            measured, why = "no async runs", (
                "needs --strategy async --staleness S > 0 (or python -m commbench.ps) results "
                "beside a synchronous run of the same set-up")
        else:
            measured, why = "no async run with a synchronous run of the same set-up", \
                _not_matched("async (s > 0) or parameter-server runs and synchronous (flat, "
                             "hierarchical, async s=0) runs", "sync",
                             product(filter(_stale, recs), filter(_synchronous, recs)))
        return Claim("C4", text, measured + accuracy, "staleness", pred, NOT_HERE,
                     f"speed-up: {why}; accuracy: {acc_reason}", None, acc_runs, acc_others)
    g, measured, runs, others = _choose(groups, _c4_figure, vary)
    speed, best, ref, rate, k = _c4_speedup(g)
    # within a sixth of 3x, on the paired runs of the two fastest, best of k pairs of schemes
    speed_verdict, note, decision = _decide_runs([stat(r, rate) for r in best],
                                                 [stat(r, rate) for r in ref], 2.5, False,
                                                 "speed-up", k=k)
    return Claim("C4", text, measured + accuracy, "staleness", pred,
                 _both(speed_verdict, acc_verdict),
                 f"{note} vs ~3x (reproduced from 2.5x){_host_note(g)}; "
                 f"accuracy: {acc_reason}", _setup(g, vary), {**runs, **acc_runs},
                 others + acc_others, match.host_words(g), speed, decision)


# -- C5-C7: sweeps of one setting ---------------------------------------------------------

def _at(g: list[dict], read: Callable[[dict], float], value: float) -> list[dict]:
    return [r for r in g if read(r) == value]


def _batch(r: dict) -> float:
    return num(r.get("batch_size"))


def _c5_sides(g: list[dict]) -> tuple[list[float], list[float]]:
    """Throughput at the largest batch and at the smallest, each side's runs in run order."""
    bs = sorted({_batch(r) for r in g})
    return tuple([stat(r, "throughput") for r in _in_run_order(_at(g, _batch, b))]
                 for b in (bs[-1], bs[0]))


def _c5_ratio(g: list[dict]) -> tuple[float, float, stats.Spread, dict[str, list[str]]]:
    bs = sorted({_batch(r) for r in g})
    lo, hi = _at(g, _batch, bs[0]), _at(g, _batch, bs[-1])
    ratio = stats.ratio_spread(*_c5_sides(g))
    return bs[0], bs[-1], ratio, {f"batch {bs[0]:g}": match.run_ids(lo),
                                  f"batch {bs[-1]:g}": match.run_ids(hi)}


def _c5_figure(g: list[dict]) -> tuple[str, dict[str, list[str]]]:
    b0, b1, ratio, runs = _c5_ratio(g)
    measured = (f"{_scheme(g[0])}: throughput x{ratio.words()} from batch {b0:g} to {b1:g} "
                "per rank")
    acc = {_batch(r): r["final_accuracy"] for r in g if r.get("final_accuracy") is not None}
    if acc:
        measured += "; final accuracy " + ", ".join(f"{k:g}: {v:.3f}"
                                                     for k, v in sorted(acc.items()))
    return measured, runs


def c5(records, model) -> Claim:
    text = "throughput rises with batch size (256 -> 1024) at little accuracy cost"
    sc = _scenario(model)
    t = sync_share("ring", 256, 100, sc)[0]
    gain = 4 * (sc.compute_s + t) / (4 * sc.compute_s + t)
    pred = f"per-rank batch 256 -> 1024 at 256 ranks, 100 Gbit/s: throughput x{gain:.2f}"
    recs = [r for r in _summaries(records) if not math.isnan(_batch(r))
            and not math.isnan(stat(r, "throughput"))]
    vary = ("batch",)
    groups = [g for g in match.matched_sets(recs, vary) if len({_batch(r) for r in g}) >= 2]
    if not groups:
        return Claim("C5", text, "no runs at two batch sizes of one set-up", None, pred,
                     NOT_HERE, _not_matched("runs at two batch sizes", "batch",
                                            ((a, b) for a, b in product(recs, recs)
                                             if _batch(a) < _batch(b))))
    g, measured, runs, others = _choose(groups, _c5_figure, vary, link_bound=False)
    ratio = _c5_ratio(g)[2]
    acc = any(r.get("final_accuracy") is not None for r in g)
    verdict, note, decision = _decide_runs(*_c5_sides(g), 1.1, False, "throughput ratio")
    return Claim("C5", text, measured, "batch_size", pred, verdict,
                 f"{note} (reproduced when throughput rose more than 10%)"
                 + ("" if acc else "; accuracy not measured (needs --dataset digits)")
                 + _host_note(g, links=False), _setup(g, vary), runs, others,
                 match.host_words(g), ratio, decision)


def _memory_field(g: list[dict]) -> str:
    return "peak_cuda_mb" if any(r.get("peak_cuda_mb") is not None for r in g) else "peak_rss_mb"


def _c6_fit(g: list[dict]) -> tuple[float, float, float, list[dict]]:
    key = _memory_field(g)
    used = [r for r in g if not math.isnan(num(r.get(key)))]
    x = np.array([_batch(r) for r in used])
    y = np.array([num(r.get(key)) for r in used])
    slope, icpt = np.polyfit(x, y, 1)
    r2 = 1 - ((y - (slope * x + icpt)) ** 2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-12)
    return slope, icpt, r2, used


def _c6_batches(g: list[dict]) -> int:
    key = _memory_field(g)
    return len({_batch(r) for r in g if not math.isnan(num(r.get(key)))})


def _c6_figure(g: list[dict]) -> tuple[str, dict[str, list[str]]]:
    slope, icpt, r2, used = _c6_fit(g)
    return (f"{_memory_field(g)} = {icpt:.0f} MB + {slope:.1f} MB/sample (R^2 {r2:.3f}, "
            f"{len(used)} runs, {g[0].get('model')})", {"memory": match.run_ids(used)})


def c6(records, model) -> Claim:
    text = "activation memory grows linearly with batch (12 GB -> 38 GB, ResNet-50)"
    real = [r for r in _summaries(records) if match.is_real(r)
            and not math.isnan(_batch(r))]
    vary = ("batch",)
    groups = [g for g in match.matched_sets(real, vary) if _c6_batches(g) >= 3]
    pred = "the cost model has no memory term"
    if not groups:
        return Claim("C6", text, "fewer than three batch sizes of the real workload in one "
                     "set-up", None, pred, NOT_HERE,
                     "needs --workload real at >= 3 batch sizes of one set-up; the synthetic "
                     "workload has no activations")
    g, measured, runs, others = _choose(
        groups, _c6_figure, vary, key=lambda g: (_c6_batches(g), *match.scale(g)),
        link_bound=False)
    slope, _, r2, _ = _c6_fit(g)
    verdict = REPRODUCED if r2 >= 0.95 and slope > 0 else REFUTED
    return Claim("C6", text, measured, "batch_size", pred, verdict,
                 "linear when R^2 >= 0.95; absolute GB need ResNet-50 at 224 px on a GPU"
                 + _host_note(g, links=False), _setup(g, vary), runs, others,
                 match.host_words(g))


def _k(r: dict) -> float:
    return num(get(r, "accum_steps", 1))


def _c7_shares(g: list[dict]) -> tuple[float, float, stats.Spread, stats.Spread,
                                        dict[str, list[str]]]:
    ks = sorted({_k(r) for r in g})
    one, many = _at(g, _k, ks[0]), _at(g, _k, ks[-1])
    s1, sk = (stats.spread_of([stat(r, "sync_share") for r in rs]) for rs in (one, many))
    return ks[0], ks[-1], s1, sk, {f"k={ks[0]:g}": match.run_ids(one),
                                   f"k={ks[-1]:g}": match.run_ids(many)}


def _c7_sides(g: list[dict]) -> tuple[list[float], list[float]]:
    """Sync share at the largest k and at the smallest, each side's runs in run order."""
    ks = sorted({_k(r) for r in g})
    return tuple([stat(r, "sync_share") for r in _in_run_order(_at(g, _k, k))]
                 for k in (ks[-1], ks[0]))


def _c7_ratio(g: list[dict]) -> stats.Spread:
    """Sync share at the largest k / at the smallest, with its spread over repeats."""
    return stats.ratio_spread(*_c7_sides(g))


def _c7_figure(g: list[dict]) -> tuple[str, dict[str, list[str]]]:
    k1, kk, s1, sk, runs = _c7_shares(g)
    return (f"{_scheme(g[0])}: sync share k={k1:g}: {s1.words('.0%')}, k={kk:g}: "
            f"{sk.words('.0%')}", runs)


def c7(records, model) -> Claim:
    text = "gradient accumulation keeps the effective batch and cuts sync frequency"
    sc = _scenario(model)
    t = sync_share("ring", 256, 100, sc)[0]
    pred = ("sync share at 256 ranks, 100 Gbit/s: k=1 "
            f"{t / (t + sc.compute_s):.0%}, k=4 {t / (t + 4 * sc.compute_s):.0%}")
    recs = [r for r in _summaries(records) if not math.isnan(stat(r, "sync_share"))]
    vary = ("accumulation",)
    groups = [g for g in match.matched_sets(recs, vary) if len({_k(r) for r in g}) >= 2]
    if not groups:
        return Claim("C7", text, "no runs at two accumulation settings of one set-up", None,
                     pred, NOT_HERE, _not_matched("runs at k=1 and k>1 (--accum-steps)",
                                                  "accumulation",
                                                  ((a, b) for a, b in product(recs, recs)
                                                   if _k(a) < _k(b))))
    g, measured, runs, others = _choose(groups, _c7_figure, vary)
    ratio = _c7_ratio(g)
    verdict, note, decision = _decide_runs(*_c7_sides(g), 1.0, True,
                                           "sync share at the largest k / at k=1:")
    if verdict == REPRODUCED and decision.lo == decision.hi == 1.0:
        verdict = REFUTED  # equal shares, run after run: it did not fall
    return Claim("C7", text, measured, "accumulation", pred, verdict,
                 f"{note} (reproduced when it fell: the ratio below 1)" + _host_note(g),
                 _setup(g, vary), runs, others, match.host_words(g), ratio, decision)


def c8(records, model) -> Claim:
    text = "report per-iteration time, peak memory, final accuracy"
    recs = _summaries(records)
    if not recs:
        return Claim("C8", text, "no summaries", None, "-", NOT_HERE, "no data")
    have = {f: sum(1 for r in recs if r.get(f) is not None)
            for f in ("step_s", "peak_rss_mb", "final_accuracy")}
    measured = ", ".join(f"{f} in {n}/{len(recs)} summaries" for f, n in have.items())
    ok = have["step_s"] == have["peak_rss_mb"] == len(recs)
    verdict = REFUTED if not ok else REPRODUCED if have["final_accuracy"] else NOT_HERE
    reason = ("every run records step time and peak memory; final accuracy only where a "
              "labelled data set is trained (--workload real --dataset digits)")
    runs = {f"without {f}": match.run_ids(r for r in recs if r.get(f) is None)
            for f in ("step_s", "peak_rss_mb") if have[f] < len(recs)}
    return Claim("C8", text, measured, None, "-", verdict, reason, runs=runs,
                 host=match.host_words(recs))


CHECKS = (c1, c2, c3, c4, c5, c6, c7, c8)


def check_all(records: Sequence[dict], model: ModelResult | None) -> list[Claim]:
    return [c(records, model) for c in CHECKS]
