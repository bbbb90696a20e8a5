"""The alpha-beta-gamma cost model of all-reduce: fitted here, used to look past this machine.

    python -m analysis.costmodel results/ -o model/        # fit, check, extrapolate; prints tables
    python -m analysis.costmodel results/ --native-is rd=results/mb-rd.jsonl

The model's formulas (each algorithm's time from alpha, beta and gamma per link
level; a step's sync share at scale) are ``analysis.alphabeta``. Here they meet the
measurements: fitted, checked on what they were not fitted on, extrapolated.

Fitting: alpha, beta (and gamma where two algorithms with different
beta:gamma weights are measured; otherwise gamma is folded into beta) by
least absolute relative error, from microbenchmark records of a ring (a
known algorithm: the MPI library's forced ring where measured, else the
project's ``ring``; the fastest of repeated runs per size): one-host
records fix ``intra``, multi-host records (the emulated cluster) fix
``inter``. Every other record,
and the ring sizes left out of the fit (every second size), are predictions
the fit never saw. ``native`` (the MPI library's own choice) is predicted as
the cheapest of the three flat algorithms unless ``--native-is ALGO=PATH``
says which one the library was forced to (Open MPI:
``OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allreduce_algorithm=``
3 recursive doubling, 4 ring, 6 Rabenseifner).

Extrapolation (sync share at 8-1024 GPUs, no overlap): on the one device
scenario of ``analysis.report`` and the overlap model (``--device h200``: the
committed H200 ResNet-50 profile at batch 256, 8 GPUs per node;
``analysis/overlap.py``), or on ``--device a100`` (NVIDIA's published A100
throughput); ``--compute-ms``, ``--grad-bytes``, ``--local-size`` and
``--latency-us`` (the user's network's per-message latency, a model input with one
name here, in ``analysis.report`` and ``experiments.study``; ``--alpha-inter-us`` is
its old spelling) replace the device's own values.
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from analysis.alphabeta import (
    AE,
    AI,
    BE,
    BI,
    DEFAULT_ALPHA_INTER,
    FLAT_ALGOS,
    LATENCY_FLAG,
    G,
    ModelError,
    Params,
    Scenario,
    a100_scenario,
    flat_coef,
    hier_coef,
    latency_us,
    predict,
    sync_share,
)
from analysis.cli import UsageError, entry, output_dir, parser, warn
from analysis.load import get, load, num, result_files
from analysis.overlap import default_scenario, h200, model_scenario

PROG = "analysis.costmodel"

#: each modelled algorithm in words (the fit figure's legend)
ALGO_NAMES = {"ring": "ring", "rd": "recursive doubling", "rabenseifner": "Rabenseifner",
              "hier": "hierarchical", "hier-leader": "hierarchical leader",
              "native": "native (best of ring, rd, Rabenseifner)"}


# --- measurements ------------------------------------------------------------------

@dataclass
class Point:
    """One measured all-reduce: algorithm (as modelled), bytes, ranks, nodes, seconds.

    ``label`` names the implementation measured: commbench's own algorithms by
    their ``--algo`` name (``ring``, ``hier``, ``hier-leader``), the MPI
    library's all-reduce as ``mpi-<algo>`` (``mpi-native`` when its choice is
    unknown), torch.distributed's library's by its name (``native_label``:
    ``gloo-native``, ``nccl-native``).
    """

    label: str
    algo: str
    size: float
    ranks: int
    nodes: int
    local: int
    seconds: float
    source: str = ""
    link_gbps: float = math.nan  # the inter-node link's measured rate, where the job had one
    #: the time dilation K it ran at: an emulated network's per-message latency is the
    #: host's / K, so points at two K are two networks (never fitted or checked together)
    dilation: float = 1.0
    alpha_us: float = math.nan  # the job's measured emulated alpha (commbench.latency)


def native_label(r: dict) -> str | None:
    """The library whose all-reduce a ``native`` record timed, where it is not MPI's:
    ``gloo-native``/``nccl-native`` (the torch backend: ``torch-gloo``, ``torch-nccl``);
    None for MPI's, and Horovod's on its MPI controller (``mpi-<algo>``)."""
    backend = str(r.get("backend") or "mpi")
    if backend.startswith("torch-"):
        return f"{backend[len('torch-'):]}-native"
    return None


def points(records: Sequence[dict], native_is: dict[str, str] | None = None) -> list[Point]:
    """Microbenchmark records as Points; ``native`` renamed where its algorithm is known."""
    out = []
    for r in records:
        if r.get("kind") != "microbench":
            continue
        t = num((r.get("time_us") or {}).get("avg")) * 1e-6
        size = num(r.get("size"))
        if not (t > 0 and size > 0) or r.get("wrong"):
            continue
        algo = r.get("algo") or "native"
        label = algo
        if algo == "native" and native_label(r) is not None:
            label = native_label(r)
        elif algo == "native":
            algo = (native_is or {}).get(r.get("_file"), get(r, "native_algorithm", "native"))
            label = f"mpi-{algo}"
        if r.get("wire_dtype") and r.get("dtype") and r["wire_dtype"] != r["dtype"]:
            continue  # widened on the wire: not the bytes it says
        ranks = num(r.get("world_size"))
        if not ranks >= 1:
            continue
        nodes, local = num(r.get("nodes")), num(r.get("local_size"))
        out.append(Point(label, algo, size, int(ranks), int(nodes) if nodes >= 1 else 1,
                         int(local) if local >= 1 else int(ranks), t,
                         f"{r['_file']}:{r['_line']}", num(r.get("link_gbps")),
                         float(r.get("dilation") or 1.0), num(r.get("alpha_us"))))
    return out


def fastest(pts: Sequence[Point]) -> list[Point]:
    """One point per (label, size, ranks, nodes, K): the fastest of repeated measurements.

    Contention on a shared machine only ever adds time, so the minimum over
    repeats is the best estimate of the uncontended cost. Runs at two dilations K are
    two networks (the host's latency / K), never one point.
    """
    best: dict[tuple, Point] = {}
    for pt in pts:
        key = (pt.label, pt.size, pt.ranks, pt.nodes, pt.local, pt.dilation)
        if key not in best or pt.seconds < best[key].seconds:
            best[key] = pt
    return list(best.values())


def split_fit(pts: Sequence[Point], fit_algos: Sequence[str]) -> tuple[list[Point], list[Point]]:
    """Fit set: every second message size of each fit algorithm's series; the rest held out."""
    fit, held = [], []
    series: dict[tuple, list[Point]] = defaultdict(list)
    for pt in pts:
        if pt.label in fit_algos:
            series[(pt.label, pt.ranks, pt.nodes)].append(pt)
        else:
            held.append(pt)
    for ser in series.values():
        sizes = sorted({pt.size for pt in ser})
        even = set(sizes[::2])
        for pt in ser:
            (fit if pt.size in even else held).append(pt)
    return fit, held


def link_bytes(algo: str, n: float, p: int, nodes: int, local: int) -> float:
    """Bytes one node's link carries each way in an all-reduce of ``n`` bytes on ``p``
    ranks over ``nodes`` nodes (ranks placed node by node): the model's inter-node beta
    coefficient, so ``link_bytes / rate`` is the algorithm's link bound; ``native`` (the
    library's choice, unknown) the least of the flat algorithms' (on 2 x 4 Rabenseifner's,
    Open MPI 4.1's choice for 4-15 ranks from 8 KiB: ``coll_tuned_decision_fixed.c``)."""
    if nodes <= 1:
        return 0.0
    if algo == "native":
        return min(link_bytes(a, n, p, nodes, local) for a in FLAT_ALGOS)
    if algo in FLAT_ALGOS:
        return float(flat_coef(algo, n, p, nodes, local)[BE])
    if algo == "hier":
        return float(hier_coef(n, nodes, local)[BE])
    if algo == "hier-leader":
        return float(flat_coef("ring", n, nodes, nodes, 1)[BE])
    raise ModelError(f"no model for algorithm {algo!r}")


def bound_ratio(pt: Point) -> float:
    """Measured seconds / the algorithm's link bound (its busiest link's bytes at the
    link's measured rate); NaN on one host or where the rate was not measured. Near 1: the
    implementation runs at its algorithm's bound, and the model's bytes describe it; far
    above 1: the implementation costs more than its algorithm's bytes (the model, which
    prices the bytes, cannot follow it)."""
    if pt.nodes <= 1 or not pt.link_gbps > 0:
        return math.nan
    bound = link_bytes(pt.algo, pt.size, pt.ranks, pt.nodes, pt.local) * 8 / (pt.link_gbps * 1e9)
    return pt.seconds / bound if bound > 0 else math.nan


def _coef(pt: Point) -> np.ndarray:
    if pt.algo in FLAT_ALGOS:
        return flat_coef(pt.algo, pt.size, pt.ranks, pt.nodes, pt.local)
    if pt.algo == "hier":
        return hier_coef(pt.size, pt.nodes, pt.local)
    raise ModelError(f"cannot fit on {pt.algo!r}: only ring, rd, rabenseifner and hier are "
                     "linear in the parameters")


def _nnls_relative(rows: np.ndarray, t: np.ndarray, offset: np.ndarray, cols: list[int]
                   ) -> dict[int, float]:
    """Least absolute relative error over ``cols`` (others fixed); negative ones dropped.

    Absolute rather than squared error (iteratively reweighted least squares):
    on a shared machine a few timings are inflated many times by preemption,
    and squares would let those few decide the fit.
    """
    active = list(cols)
    while active:
        a = rows[:, active] / t[:, None]
        y = (t - offset) / t
        w = np.ones(len(t))
        for _ in range(50):
            sol, *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
            w = 1 / np.sqrt(np.maximum(np.abs(a @ sol - y), 1e-3))
        if (sol >= 0).all():
            return dict(zip(active, sol.tolist()))
        active.pop(int(np.argmin(sol)))
    return {}


def _gamma_identifiable(rows: np.ndarray, beta_col: int) -> bool:
    ratios = {round(r[G] / r[beta_col], 6) for r in rows if r[beta_col] > 0}
    return len(ratios) > 1


def fit(pts: Sequence[Point], intra_default: Params | None = None) -> Params:
    """alpha, beta per level (gamma where identifiable) from the fit set's points."""
    params = Params(gamma=0.0)
    intra = [pt for pt in pts if pt.nodes <= 1 and pt.ranks > 1]
    inter = [pt for pt in pts if pt.nodes > 1]
    if intra:
        rows = np.array([_coef(pt) for pt in intra])
        t = np.array([pt.seconds for pt in intra])
        cols = [AI, BI]
        if _gamma_identifiable(rows, BI):
            cols.append(G)
            params.gamma_folded = False
        sol = _nnls_relative(rows, t, np.zeros(len(t)), cols)
        params.alpha_intra, params.beta_intra = sol.get(AI, 0.0), sol.get(BI, 0.0)
        params.gamma = sol.get(G, 0.0)
        params.fitted += ["alpha_intra", "beta_intra"] + (["gamma"] if G in cols else [])
    elif intra_default is not None:
        params.alpha_intra, params.beta_intra = intra_default.alpha_intra, \
            intra_default.beta_intra
        params.gamma = intra_default.gamma
    if inter:
        if math.isnan(params.alpha_intra) and any(pt.local > 1 for pt in inter):
            raise ModelError("multi-host points need the intra-node level too: add one-host "
                             "microbenchmark results")
        rows = np.array([_coef(pt) for pt in inter])
        t = np.array([pt.seconds for pt in inter])
        known = np.nan_to_num(params.vector())
        known[AE] = known[BE] = 0.0
        sol = _nnls_relative(rows, t, rows @ known, [AE, BE])
        params.alpha_inter, params.beta_inter = sol.get(AE, 0.0), sol.get(BE, 0.0)
        params.fitted += ["alpha_inter", "beta_inter"]
    if not params.fitted:
        raise ModelError("nothing to fit: no microbenchmark records of the fit algorithms "
                         "(run python -m commbench.microbench --algo ring)")
    return params


@dataclass
class ErrorRow:
    algo: str
    level: str
    ranks: int
    count: int
    median_abs_err: float
    p90_abs_err: float
    worst_size: float
    worst_err: float


def errors(held: Sequence[Point], params: Params) -> list[ErrorRow]:
    """Relative error (predicted / measured - 1) per algorithm and level on held-out points."""
    groups: dict[tuple[str, str, int], list[tuple[float, float]]] = defaultdict(list)
    for pt in held:
        level = "intra" if pt.nodes <= 1 else "inter"
        if level == "inter" and math.isnan(params.alpha_inter):
            continue
        pred = predict(pt.algo, pt.size, pt.ranks, params, pt.nodes, pt.local)
        groups[(pt.label, level, pt.ranks)].append((pt.size, pred / pt.seconds - 1))
    rows = []
    for (algo, level, ranks), errs in sorted(groups.items()):
        absd = np.abs([e for _, e in errs])
        worst = int(np.argmax(absd))
        rows.append(ErrorRow(algo, level, ranks, len(errs), float(np.median(absd)),
                             float(np.percentile(absd, 90)), errs[worst][0], errs[worst][1]))
    return rows


MIB = 2**20
ERROR_GOAL = 0.15  # median |predicted / measured - 1| on the emulated cluster (issue 18)


def error_by_algorithm(held: Sequence[Point], params: Params, min_bytes: float = MIB
                       ) -> list[tuple[str, str, int, float]]:
    """(measured algorithm, level, points, median |predicted / measured - 1|) over the
    points not fitted on of at least ``min_bytes``, all rank counts together."""
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for pt in held:
        level = "intra" if pt.nodes <= 1 else "inter"
        if pt.size < min_bytes or (level == "inter" and math.isnan(params.alpha_inter)):
            continue
        pred = predict(pt.algo, pt.size, pt.ranks, params, pt.nodes, pt.local)
        groups[(pt.label, level)].append(abs(pred / pt.seconds - 1))
    return [(algo, level, len(e), float(np.median(e)))
            for (algo, level), e in sorted(groups.items())]


def bound_by_algorithm(held: Sequence[Point], min_bytes: float = MIB) -> dict[str, float]:
    """Per measured algorithm (label), the median ``bound_ratio`` of its inter-node points
    of at least ``min_bytes`` (those of ``error_by_algorithm``) with a measured link rate."""
    groups: dict[str, list[float]] = defaultdict(list)
    for pt in held:
        r = bound_ratio(pt) if pt.size >= min_bytes else math.nan
        if not math.isnan(r):
            groups[pt.label].append(r)
    return {algo: float(np.median(r)) for algo, r in sorted(groups.items())}


# --- extrapolation ---------------------------------------------------------------

EXTRAP_ALGOS = ("ring", "hier")
EXTRAP_RANKS = (8, 16, 32, 64, 128, 256, 512, 1024)
EXTRAP_RATES = (25.0, 100.0, 400.0)


def extrapolation_figure(sc: Scenario, rates: Sequence[float] = EXTRAP_RATES,
                         ranks: Sequence[int] = EXTRAP_RANKS, claim: float | None = 0.35):
    """Predicted sync share vs ranks, one line per (link speed, flat ring / hierarchical)."""
    # matplotlib (~0.5 s): only when drawing; claims and report import this module
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, rate in enumerate(rates):
        for algo, style in zip(EXTRAP_ALGOS, ("-", "--")):
            ys = [sync_share(algo, p, rate, sc)[1] for p in ranks]
            ax.plot(ranks, ys, style, marker="o", ms=3, color=colors[k % len(colors)],
                    label=f"{'flat ring' if algo == 'ring' else 'hierarchical'}, {rate:g} Gbit/s")
    if claim is not None:
        ax.axhline(claim, color="grey", lw=1, ls=":", label=f"seed claim C1 ({claim:.0%})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks (GPUs)")
    ax.set_ylabel("sync share (exposed sync / step), no overlap")
    ax.set_ylim(0, 1)
    ax.set_title(f"Model on {sc.name}: gradient sync share, {sc.grad_bytes / 1e6:.1f} MB "
                 f"gradient, {sc.compute_s * 1e3:.1f} ms compute, {sc.local_size} ranks/node",
                 fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def fit_figure(pts: Sequence[Point], fit_pts: Sequence[Point], params: Params):
    """Measured all-reduce time vs size (markers; filled = fitted on) with the model's lines,
    one panel per rank count and node count."""
    import matplotlib.pyplot as plt  # only when drawing (see extrapolation_figure)

    panels: dict[tuple, dict[tuple, list[Point]]] = defaultdict(lambda: defaultdict(list))
    for pt in pts:
        if pt.nodes > 1 and math.isnan(params.alpha_inter):
            continue
        panels[(pt.ranks, pt.nodes, pt.local)][(pt.label, pt.algo)].append(pt)
    labels = sorted({key[0] for panel in panels.values() for key in panel})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    color = {lab: colors[i % len(colors)] for i, lab in enumerate(labels)}
    fitted = {id(pt) for pt in fit_pts}
    fig, axes = plt.subplots(max(1, len(panels)), 1, figsize=(8.5, 3.6 * max(1, len(panels))),
                             squeeze=False, layout="constrained")
    for ax, ((p, nodes, local), panel) in zip(axes[:, 0], sorted(panels.items())):
        for (name, algo), ser in sorted(panel.items()):
            ser.sort(key=lambda pt: pt.size)
            xs = [pt.size for pt in ser]
            c = color[name]
            ax.plot(xs, [pt.seconds * 1e6 for pt in ser], "o", color=c, mfc="none", ms=4)
            fx = [pt for pt in ser if id(pt) in fitted]
            if fx:
                ax.plot([pt.size for pt in fx], [pt.seconds * 1e6 for pt in fx], "o", color=c,
                        ms=4)
            grid = np.geomspace(min(xs), max(xs), 60)
            ax.plot(grid, [predict(algo, x, p, params, nodes, local) * 1e6 for x in grid],
                    "-", color=c, lw=1, label=f"{name} (model: {ALGO_NAMES.get(algo, algo)})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("all-reduce time (µs)")
        ax.set_title(f"{p} ranks, {nodes} node{'s' if nodes > 1 else ''}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False,
                  borderaxespad=0)  # beside the axes: never over a point
    fig.suptitle("Cost model (lines) vs microbenchmark (markers; filled: fitted on, open: "
                 "held out)", fontsize=10)
    return fig


# --- command line -------------------------------------------------------------------

@dataclass
class ModelResult:
    params: Params
    fit_points: list[Point]
    held_points: list[Point]
    points: list[Point]
    errors: list[ErrorRow]
    scenario: Scenario
    #: why points were left out of the check (another K than the fit's), in words
    refused: list[str] = field(default_factory=list)

    @property
    def dilation(self) -> float:
        """The K the fit's points ran at (one K: ``analyse`` refuses a mix)."""
        return self.fit_points[0].dilation if self.fit_points else 1.0


def analyse(records: Sequence[dict], native_is: dict[str, str] | None = None,
            fit_algos: Sequence[str] | None = None, scenario: Scenario | None = None,
            ranks: Sequence[int] | None = None) -> ModelResult:
    """Fit on ``fit_algos`` (labels; default, per level: the MPI library's ring where
    measured, else commbench's ring), check on the rest, carry the extrapolation scenario."""
    pts = fastest(points(records, native_is))
    if ranks:
        pts = [pt for pt in pts if pt.ranks in ranks]
    if not pts:
        raise ModelError("no microbenchmark records (python -m commbench.microbench) to fit "
                         "the model on" + (f" with {ranks} ranks" if ranks else ""))
    if fit_algos:
        fit_pts, held = split_fit(pts, fit_algos)
    else:  # per level: the MPI library's ring where measured there, else commbench's ring
        fit_pts, held = [], []
        for multi in (False, True):
            level = [pt for pt in pts if (pt.nodes > 1) == multi]
            labels = {pt.label for pt in level}
            f, h = split_fit(level, ["mpi-ring"] if "mpi-ring" in labels else ["ring"])
            fit_pts += f
            held += h
    ks = sorted({pt.dilation for pt in fit_pts})
    if len(ks) > 1:
        raise ModelError(f"the points to fit ran at K = {', '.join(f'{k:g}' for k in ks)}: an "
                         "emulated network's per-message latency is the host's / K, so each K "
                         "is another network and one alpha cannot describe them; fit the "
                         "records of one K (--dilation K, or one study's folder)")
    refused = []
    other = [pt for pt in held if ks and pt.dilation != ks[0]]
    if other:
        held = [pt for pt in held if pt.dilation == ks[0]]
        refused.append(f"{len(other)} points at K = "
                       f"{', '.join(f'{k:g}' for k in sorted({pt.dilation for pt in other}))} "
                       f"not predicted: the fit is at K = {ks[0]:g}, and a fit made at one K "
                       "predicts no other (its alpha is that network's)")
    params = fit(fit_pts)
    if scenario is None:  # the one device scenario of predictions at scale
        scenario = default_scenario()
    return ModelResult(params, fit_pts, held, pts, errors(held, params), scenario, refused)


def report_lines(res: ModelResult, rates: Sequence[float] = EXTRAP_RATES,
                 ranks: Sequence[int] = EXTRAP_RANKS) -> list[str]:
    p = res.params
    out = ["# fitted (least absolute relative error, fastest repeat per size, on every second "
           f"size of: {', '.join(sorted({pt.label for pt in res.fit_points}))})"]
    for level in ("intra", "inter"):
        a, b = getattr(p, f"alpha_{level}"), getattr(p, f"beta_{level}")
        if math.isnan(a):
            out.append(f"{level:6s} not fitted (no {'one' if level == 'intra' else 'multi'}-host "
                       "microbenchmark records)")
        else:
            out.append(f"{level:6s} alpha {a * 1e6:9.2f} us   beta {b * 1e9:8.4f} ns/B "
                       f"({1 / b / 1e9 if b > 0 else math.inf:7.2f} GB/s)")
    measured = [pt.alpha_us for pt in res.fit_points if pt.nodes > 1
                and not math.isnan(pt.alpha_us)]
    if not math.isnan(p.alpha_inter) and res.fit_points:
        out.append(f"# inter alpha fitted at K = {res.dilation:g}"
                   + (f" (measured emulated alpha {float(np.median(measured)):.1f} us, "
                      "commbench.latency)" if measured else "")
                   + ": the emulated network's, never used as a real cluster's (the "
                     "extrapolation below takes the scenario's, or --latency-us)")
    out.append(f"gamma  {p.gamma * 1e9:.4f} ns/B" if not p.gamma_folded else
               "gamma  folded into beta (the fit algorithms weigh beta and gamma alike)")
    out.append("")
    out.append("# prediction vs measurement on points not fitted on: |predicted/measured - 1|")
    out.append(f"{'algorithm':16s} {'level':6s} {'ranks':>5s} {'points':>6s} {'median':>8s} "
               f"{'p90':>8s} {'worst at size':>14s} {'worst':>8s}")
    for e in res.errors:
        out.append(f"{e.algo:16s} {e.level:6s} {e.ranks:5d} {e.count:6d} "
                   f"{e.median_abs_err:8.1%} {e.p90_abs_err:8.1%} {int(e.worst_size):14d} "
                   f"{e.worst_err:+8.1%}")
    out += [f"# {why}" for why in res.refused]
    bound = bound_by_algorithm(res.held_points)
    if bound:
        out += ["", "# measured / link bound (inter-node points >= 1 MiB not fitted on: the "
                "busiest link's bytes at its measured rate): "
                + ", ".join(f"{a} {r:.2f}x" for a, r in bound.items())]
    sc = res.scenario
    out += ["", f"# extrapolation on {sc.name}: {sc.grad_bytes / 1e6:.1f} MB gradient, compute "
                f"{sc.compute_s * 1e3:.1f} ms/step, {sc.local_size} ranks/node, inter alpha "
                f"{sc.alpha_inter * 1e6:.1f} us, no overlap: sync share",
            f"{'ranks':>6s} " + " ".join(f"{f'{a} {r:g}G':>12s}" for r in rates
                                         for a in ("flat", "hier"))]
    for n in ranks:
        out.append(f"{n:6d} " + " ".join(f"{sync_share(a, n, r, sc)[1]:12.1%}" for r in rates
                                         for a in EXTRAP_ALGOS))
    return out


def mark_native(records: Sequence[dict], native_is: dict[str, str] | None) -> None:
    """Record, on ``native`` microbenchmark rows of the files named, which algorithm ran."""
    for r in records:
        algo = (native_is or {}).get(r.get("_file"))
        if algo and r.get("kind") == "microbench" and r.get("algo") == "native":
            r["native_algorithm"] = algo


def add_native_is(p) -> None:
    """The ``--native-is ALGO=PATH`` flag of every command that reads microbenchmarks."""
    p.add_argument("--native-is", action="append", metavar="ALGO=PATH",
                   help="native records in PATH ran this algorithm (Open MPI forced with "
                        "OMPI_MCA_coll_tuned_allreduce_algorithm); repeatable")


def parse_native_is(items: Sequence[str]) -> dict[str, str]:
    """``ALGO=PATH`` items as {result file: algorithm}."""
    out = {}
    for item in items or []:
        algo, _, path = item.partition("=")
        if algo not in FLAT_ALGOS or not path:
            raise UsageError(f"--native-is {item!r}: expected ALGO=PATH with ALGO one of "
                             f"{', '.join(FLAT_ALGOS)}")
        for f in result_files([path]):
            out[str(f)] = algo
    return out


def _floats(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"expected comma-separated numbers, got {text!r}") from None
    if not vals or any(not v > 0 for v in vals):
        raise UsageError(f"expected positive numbers, got {text!r}")
    return vals


#: the device scenarios of the command line; h200 is the report's (``analysis.overlap``)
DEVICES = ("h200", "a100")


def cli_scenario(device: str = "h200", compute_ms: float | None = None,
                 grad_bytes: float | None = None, local_size: int | None = None,
                 alpha_inter_us: float | None = None) -> Scenario:
    """The command line's scenario: ``device``'s, with the values given replacing its own."""
    if device not in DEVICES:
        raise UsageError(f"--device {device!r}: choose from {', '.join(DEVICES)}")
    if device == "h200":
        try:
            sc = model_scenario(h200())
        except ModelError as e:
            raise UsageError(f"--device h200: {e} (or use --device a100)") from None
    else:
        sc = a100_scenario()
    given = {"--compute-ms": compute_ms, "--grad-bytes": grad_bytes,
             "--local-size": local_size, LATENCY_FLAG: alpha_inter_us}
    bad = [k for k, v in given.items() if v is not None and not v > 0]
    if bad:
        raise UsageError(f"{', '.join(bad)} must be > 0")
    changed = {k: v for k, v in given.items() if v is not None}
    scaled = {"compute_s": None if compute_ms is None else compute_ms / 1e3,
              "grad_bytes": grad_bytes, "local_size": local_size,
              "alpha_inter": None if alpha_inter_us is None else alpha_inter_us * 1e-6}
    sc = replace(sc, **{k: v for k, v in scaled.items() if v is not None})
    if changed:
        sc.name += " with " + ", ".join(f"{k} {v:g}" for k, v in changed.items())
    return sc


def body(argv: list[str]) -> int:
    p = parser(PROG, "Fit the alpha-beta(-gamma) all-reduce cost model to microbenchmark "
                     "results, check it on what it was not fitted on, and extrapolate a "
                     "training step's sync share to large clusters.")
    p.add_argument("paths", nargs="+", help="result files or directories")
    p.add_argument("-o", "--output", help="directory for the figures (PNG, SVG) and fit.json")
    add_native_is(p)
    p.add_argument("--fit", default=None,
                   help="measured algorithms to fit on, comma list of labels (ring, hier, "
                        "mpi-ring, mpi-rd, mpi-rabenseifner; default, per link level: mpi-ring "
                        "where measured, else ring)")
    p.add_argument("--ranks", default=None,
                   help="only records of these rank counts (comma list), e.g. leave out runs "
                        "with more ranks than cores, where latency is the scheduler's")
    p.add_argument("--device", choices=DEVICES, default="h200",
                   help="device scenario of the extrapolation: h200 = the committed H200 "
                        "ResNet-50 profile at batch 256 on 8-GPU NVLink 4 nodes, the one "
                        "analysis.report and the overlap model use; a100 = ResNet-50 at batch "
                        "256, 2470 img/s on one A100 80GB (NVIDIA DeepLearningExamples), "
                        "8-GPU NVLink 3 nodes")
    p.add_argument("--compute-ms", type=float, default=None,
                   help="compute time of the extrapolated step (default: the device's)")
    p.add_argument("--grad-bytes", type=float, default=None,
                   help="gradient bytes per step (default: the device's)")
    p.add_argument("--rates", default="25,100,400", help="inter-node link speeds, Gbit/s")
    p.add_argument("--local-size", type=int, default=None,
                   help="ranks (GPUs) per node in the extrapolation (default: the device's)")
    p.add_argument(LATENCY_FLAG, "--alpha-inter-us", dest="latency_us", default=None,
                   help="your network's inter-node latency per message, a model input, in "
                        "the extrapolation (default: the "
                        f"device's, {DEFAULT_ALPHA_INTER * 1e6:g} us: an RDMA-class fabric; the "
                        "emulated cluster's fitted TCP latency is far larger)")
    args = p.parse_args(argv)
    try:
        user_us = None if args.latency_us is None else latency_us(args.latency_us)
    except ValueError as e:
        raise UsageError(str(e)) from None
    sc = cli_scenario(args.device, args.compute_ms, args.grad_bytes, args.local_size,
                      user_us)
    rates = _floats(args.rates)
    fit_algos = [a.strip() for a in (args.fit or "").split(",") if a.strip()]
    fittable = (*FLAT_ALGOS, "hier", *(f"mpi-{a}" for a in FLAT_ALGOS))
    bad = [a for a in fit_algos if a not in fittable]
    if bad:
        raise UsageError(f"--fit: cannot fit on {bad[0]!r}; choose from {', '.join(fittable)}")
    out = output_dir(args.output, create=False) if args.output else None
    native_is = parse_native_is(args.native_is)
    loaded = load(args.paths)
    warn(PROG, loaded.warnings)
    try:
        res = analyse(loaded.records, native_is, fit_algos, sc,
                      [int(x) for x in _floats(args.ranks)] if args.ranks else None)
    except ModelError as e:
        raise UsageError(str(e)) from None
    print("\n".join(report_lines(res, rates)))
    if out is not None:
        from analysis.figures import save  # imports matplotlib: only when drawing (see above)

        output_dir(out)
        save(fit_figure(res.points, res.fit_points, res.params), out / "model_fit")
        save(extrapolation_figure(sc, rates), out / "model_extrapolation")
        (out / "fit.json").write_text(json.dumps(
            {"params": asdict(res.params), "errors": [asdict(e) for e in res.errors],
             "scenario": asdict(sc)}, indent=1), encoding="utf-8")
        print(f"figures -> {out}", file=sys.stderr)
    return 0


main = entry(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
