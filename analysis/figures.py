"""One figure per question, drawn from whatever records the results hold.

Every builder takes the loaded records and returns ``(figure, None)`` or
``(None, reason)`` when the results hold no data for it. Figures use the
non-interactive Agg backend; series are labelled by strategy and algorithm
plus whichever run settings (model, compute, backend, ...) differ between
the records drawn, so runs of different set-ups are never merged silently.
"""

from __future__ import annotations

import math
import textwrap
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from analysis.load import get, knob, num, stat  # noqa: E402
from commbench import metrics  # noqa: E402  (formulas only; imports nothing of MPI)

Result = tuple[Figure | None, str | None]


def save(fig: Figure, stem: Path) -> list[Path]:
    """Write ``stem``.png and ``stem``.svg; close the figure."""
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    fig.savefig(paths[0], dpi=120)
    fig.savefig(paths[1])
    plt.close(fig)
    return paths


# -- grouping ------------------------------------------------------------------

def _compute_ms(r: dict) -> float | None:
    v = get(r, "compute_ms")
    return None if r.get("workload") == "resnet" else v


def _bucket_mb(r: dict) -> float | None:
    return knob(r, "bucket_mb")  # bucketed's and DDP's cap; none for other strategies


#: run settings that make two runs different experiments (name, getter, label format)
CONTEXT: list[tuple[str, Callable[[dict], object], str]] = [
    ("model", lambda r: r.get("model"), "{}"),
    ("workload", lambda r: r.get("workload"), "{}"),
    ("dataset", lambda r: get(r, "dataset"), "data {}"),
    ("image_size", lambda r: r.get("image_size") or get(r, "image_size")
     if r.get("workload") == "resnet" else None, "{} px"),
    ("num_classes", lambda r: get(r, "num_classes"), "{} classes"),
    ("backend", lambda r: r.get("backend"), "{}"),
    ("compute_ms", _compute_ms, "compute {:g} ms"),
    ("batch_size", lambda r: r.get("batch_size"), "batch {}"),
    ("world_size", lambda r: r.get("world_size"), "np{}"),
    ("nodes", lambda r: r.get("nodes"), "{} node(s)"),
    ("link_shaping", lambda r: r.get("link_shaping"), "link {}"),
    ("bucket_mb", _bucket_mb, "bucket {:g} MB"),
    ("accum_steps", lambda r: get(r, "accum_steps"), "accum {}"),
    ("compression", lambda r: get(r, "compression"), "compression {}"),
    ("staleness", lambda r: get(r, "staleness"), "s={}"),
    ("dtype", lambda r: r.get("dtype"), "{}"),
]


def algo_label(r: dict) -> str:
    """A microbenchmark row's algorithm; ``native`` names what it was forced to, if known."""
    algo = str(r.get("algo"))
    forced = r.get("native_algorithm")
    return f"native ({forced})" if algo == "native" and forced else algo


def strategy_label(r: dict) -> str:
    algo = r.get("algo")
    return f"{r.get('strategy', '?')} ({algo})" if algo else str(r.get("strategy", "?"))


def series(recs: Sequence[dict], exclude: Sequence[str] = (),
           base: Callable[[dict], str] = strategy_label) -> dict[str, list[dict]]:
    """Records grouped into labelled series: ``base`` plus every varying CONTEXT setting."""
    varying = []
    for name, getter, fmt in CONTEXT:
        if name in exclude:
            continue
        values = {repr(getter(r)) for r in recs if getter(r) is not None}
        if len(values) > 1:  # absent (an older writer) is not a difference
            varying.append((getter, fmt))
    out: dict[str, list[dict]] = defaultdict(list)
    for r in recs:
        parts = [base(r)] + [fmt.format(g(r)) for g, fmt in varying if g(r) is not None]
        out[", ".join(parts)].append(r)
    return dict(sorted(out.items()))


def swept(groups: dict[str, list[dict]], xget: Callable[[dict], object]
          ) -> dict[str, list[dict]]:
    """Only the series run at two or more values of the swept setting."""
    return {k: rs for k, rs in groups.items() if len({repr(xget(r)) for r in rs}) > 1}


def _by_x(recs: Sequence[dict], xget: Callable[[dict], float]) -> list[tuple[float, list[dict]]]:
    groups: dict[float, list[dict]] = defaultdict(list)
    for r in recs:
        x = num(xget(r))
        if not math.isnan(x):
            groups[x].append(r)
    return sorted(groups.items())


def _med(values: Sequence[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return metrics.percentile(vals, 50) if vals else math.nan


def palette(labels: Sequence[str]) -> dict[str, object]:
    """A colour per series label, the same in every panel of a figure."""
    cmap = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    return {lab: cmap(i % cmap.N) for i, lab in enumerate(labels)}


def _line(ax, recs: Sequence[dict], xget, field: str, label: str, scale: float = 1.0,
          spread: bool = True, color=None) -> bool:
    """Median of ``field`` vs x (median over repeated runs), p5-p95 as error bars."""
    pts = _by_x(recs, xget)
    xs, ys, lo, hi = [], [], [], []
    for x, rs in pts:
        y = _med([stat(r, field) for r in rs])
        if math.isnan(y):
            continue
        xs.append(x)
        ys.append(y * scale)
        lo.append(min(stat(r, field, "p5") for r in rs) * scale)
        hi.append(max(stat(r, field, "p95") for r in rs) * scale)
    if not xs:
        return False
    if spread and not any(math.isnan(v) for v in lo + hi):
        yerr = [[max(0.0, y - a) for y, a in zip(ys, lo)],
                [max(0.0, b - y) for y, b in zip(ys, hi)]]
        ax.errorbar(xs, ys, yerr=yerr, marker="o", ms=4, capsize=3, label=label, color=color)
    else:
        ax.plot(xs, ys, marker="o", ms=4, label=label, color=color)
    return True


def _finish(fig: Figure, axes: Sequence, title: str) -> Figure:
    """Grid, title, and one legend for the whole figure below its axes (labels can be long)."""
    handles: dict[str, object] = {}
    for ax in axes:
        ax.grid(True, alpha=0.3)
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.suptitle(title, fontsize=10)
    if handles:
        ncol = 1 if max(map(len, handles)) > 60 else 2 if max(map(len, handles)) > 30 else 3
        rows = -(-len(handles) // ncol)
        extra = 0.2 * rows + 0.1
        height = fig.get_figheight()
        fig.set_figheight(height + extra)
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol,
                   fontsize=7, frameon=False)
        fig.tight_layout(rect=(0, extra / (height + extra), 1, 1))
    else:
        fig.tight_layout()
    return fig


def summaries(records: Sequence[dict]) -> list[dict]:
    return [r for r in records if r.get("kind") == "summary"]


def _ranks(r: dict) -> float:
    return num(r.get("world_size"))


def _rank_axis(ax) -> None:
    """Log2 rank axis ticked at the rank counts drawn."""
    xs = sorted({float(x) for line in ax.get_lines() for x in line.get_xdata()})
    ax.set_xscale("log", base=2)
    if xs:
        ax.set_xlim(xs[0] / 1.4, xs[-1] * 1.4)
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("ranks")


# -- the figures ---------------------------------------------------------------

def sync_share_vs_ranks(records: Sequence[dict]) -> Result:
    recs = [r for r in summaries(records) if not math.isnan(stat(r, "sync_share"))]
    if not recs:
        return None, "no allreduce summaries with a sync share"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, rs in series(recs, exclude=("world_size", "nodes")).items():
        _line(ax, rs, _ranks, "sync_share", label)
    _rank_axis(ax)
    ax.set_ylabel("sync share (exposed sync / step)")
    ax.set_ylim(bottom=0)
    return _finish(fig, [ax], "Sync share vs ranks (median, bars p5-p95 over steps)"), None


def scaling(records: Sequence[dict]) -> Result:
    recs = [r for r in summaries(records) if not math.isnan(stat(r, "throughput"))]
    if not recs:
        return None, "no allreduce summaries with a throughput"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4.2))
    groups = series(recs, exclude=("world_size", "nodes"))
    colors = palette(list(groups))
    for label, rs in groups.items():
        _line(ax1, rs, _ranks, "throughput", label, color=colors[label])
        pts = [(x, _med([stat(r, "throughput") for r in g])) for x, g in _by_x(rs, _ranks)]
        if len(pts) < 2:
            continue  # efficiency needs a reference and another rank count
        n0, t0 = pts[0]  # reference: 1 rank when measured, else the fewest ranks measured
        ax2.plot([x for x, _ in pts], [metrics.scaling_efficiency(t, x / n0, t0) for x, t in pts],
                 marker="o", ms=4, label=label, color=colors[label])
    for ax in (ax1, ax2):
        _rank_axis(ax)
    ax1.set_ylabel("throughput (samples/s)")
    ax2.set_ylabel("scaling efficiency (vs 1 rank, else the fewest run)")
    ax2.set_ylim(bottom=0)
    return _finish(fig, [ax1, ax2], "Throughput and scaling efficiency vs ranks"), None


def overlap(records: Sequence[dict]) -> Result:
    """Comm time and exposed sync per strategy; exposed sync stacked as wait + transfer.

    The exposed bar's first part is the slowest rank's wait for later ranks inside
    the step's collectives (``sync_wait_s``, capped at exposed sync), the rest is
    exposed sync less that: transfer, plus packing the buffers. A marker shows the
    measured wait + transfer sums: on the bar's end where nothing overlapped, past
    it by the hidden part where collectives overlapped compute. Records without the
    split (schema 1, Horovod's peer) keep a plain exposed bar.
    """
    recs = [r for r in summaries(records)
            if not math.isnan(stat(r, "comm_s")) and not math.isnan(stat(r, "exposed_sync_s"))]
    if not recs:
        return None, "no allreduce summaries with comm and exposed sync times"
    groups = series(recs)
    labels = list(groups)

    def med(field: str) -> list[float]:
        return [_med([stat(r, field) for r in groups[k]]) * 1e3 for k in labels]

    comm, exposed = med("comm_s"), med("exposed_sync_s")
    wait, transfer = med("sync_wait_s"), med("sync_transfer_s")
    # horizontal bars: one row per strategy, however many there are
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.45 * len(labels)))
    ys = range(len(labels))
    ax.barh([y - 0.2 for y in ys], comm, height=0.4, label="comm time (collective in flight)")
    split = [not math.isnan(w) and not math.isnan(t) for w, t in zip(wait, transfer)]
    waited = [min(w, e) if ok else 0.0 for w, e, ok in zip(wait, exposed, split)]
    row = [y + 0.2 for y in ys]
    if any(split):
        ax.barh([y for y, ok in zip(row, split) if ok],
                [w for w, ok in zip(waited, split) if ok], height=0.4, color="tab:red",
                label="exposed sync: wait for slower ranks")
        ax.barh([y for y, ok in zip(row, split) if ok],
                [e - w for e, w, ok in zip(exposed, waited, split) if ok], height=0.4,
                left=[w for w, ok in zip(waited, split) if ok], color="tab:orange",
                label="exposed sync: transfer and the rest (exposed - wait)")
        ax.plot([w + t for w, t, ok in zip(wait, transfer, split) if ok],
                [y for y, ok in zip(row, split) if ok], "k|", ms=12,
                label="wait + transfer (sums over the step's collectives)")
    if not all(split):
        ax.barh([y for y, ok in zip(row, split) if not ok],
                [e for e, ok in zip(exposed, split) if not ok], height=0.4, color="tab:orange",
                label="exposed sync (not hidden; no wait/transfer split)")
    for y, c, e in zip(ys, comm, exposed):
        ov = metrics.overlap(e / 1e3, c / 1e3)
        if not math.isnan(ov):
            ax.annotate(f" overlap {ov:.2f}", (max(c, e), y), ha="left", va="center", fontsize=7)
    ax.set_yticks(list(ys))
    ax.set_yticklabels([textwrap.fill(k, 60) for k in labels], fontsize=7)
    ax.invert_yaxis()
    ax.set_ylabel("strategy")
    ax.set_xlabel("time per step (ms, median)")
    ends = comm + exposed + [w + t for w, t, ok in zip(wait, transfer, split) if ok]
    ax.set_xlim(0, max(ends) * 1.2)
    return _finish(fig, [ax], "Exposed sync vs comm time (overlap = 1 - exposed / comm); "
                              "exposed = wait + transfer only where nothing overlapped"), None


def busbw_vs_size(records: Sequence[dict]) -> Result:
    recs = [r for r in records if r.get("kind") == "microbench"]
    if not recs:
        return None, "no microbenchmark records (python -m commbench.microbench)"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups = series(recs, base=algo_label)
    colors = palette(list(groups))
    for label, rs in groups.items():
        by = _by_x(rs, lambda r: r.get("size"))  # repeated runs: median, min-max band
        xs = [x for x, _ in by]
        bw = [[num(r.get("busbw")) for r in g] for _, g in by]
        ax.plot(xs, [_med(b) for b in bw], marker="o", ms=3, label=label, color=colors[label])
        if any(len(b) > 1 for b in bw):
            ax.fill_between(xs, [min(b) for b in bw], [max(b) for b in bw], alpha=0.15,
                            color=colors[label], lw=0)
    links = [num(r.get("link_gbps")) for r in recs if num(r.get("link_gbps")) > 0]
    if links:
        g = _med(links)
        ax.axhline(g / 8, color="black", ls="--", lw=1,
                   label=f"link ceiling: {g:.3g} Gbit/s = {g / 8:.3g} GB/s (measured)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    title = "All-reduce bus bandwidth vs message size (median of repeats; band: min-max)"
    if not links:
        title += " (no inter-node link in these runs: no ceiling)"
    return _finish(fig, [ax], title), None


def _sweep(records: Sequence[dict], name: str, xget: Callable[[dict], object], xlabel: str,
           title: str, want: Callable[[dict], bool] = lambda r: True,
           categorical: bool = False, extra: Callable | None = None) -> Result:
    recs = [r for r in summaries(records) if want(r) and xget(r) is not None]
    if not recs:
        return None, f"no data: no summaries with {name}"
    groups = swept(series(recs, exclude=(name,)), lambda r: str(xget(r)))
    if not groups:
        values = sorted({str(xget(r)) for r in recs})
        return None, (f"no data: no set-up run at two or more {name} values "
                      f"(seen: {', '.join(values)})")
    recs = [r for rs in groups.values() for r in rs]
    groups = series(recs, exclude=(name,))  # labels: what differs among the sweeps drawn
    values = sorted({str(xget(r)) if categorical else num(xget(r)) for r in recs},
                    key=lambda v: (isinstance(v, str), v))
    cats = {v: i for i, v in enumerate(values)}
    x = (lambda r: cats[str(xget(r))]) if categorical else xget
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4.2))
    for label, rs in groups.items():
        _line(ax1, rs, x, "step_s", label, scale=1e3)
        _line(ax2, rs, x, "sync_share", label)
    for ax in (ax1, ax2):
        ax.set_xlabel(xlabel)
        if categorical:
            ax.set_xticks(list(cats.values()))
            ax.set_xticklabels(list(cats))
    if extra is not None:
        extra(ax1, ax2, recs)
    ax1.set_ylabel("step time (ms)")
    ax2.set_ylabel("sync share (exposed sync / step)")
    ax2.set_ylim(bottom=0)
    return _finish(fig, [ax1, ax2], title), None


def _setup(r: dict, without: str) -> tuple:
    return tuple(repr(g(r)) for name, g, _ in CONTEXT if name != without)


def _flat_references(records: Sequence[dict], name: str):
    """Draw flat runs of the same set-up as the sweep's runs as horizontal references."""
    def draw(ax1, ax2, swept: Sequence[dict]) -> None:
        setups = {_setup(r, name) for r in swept}
        flats = [r for r in summaries(records) if r.get("strategy") == "flat"
                 and _setup(r, name) in setups]
        for k, (label, rs) in enumerate(series(flats, exclude=(name,)).items()):
            style = dict(ls=(":", "--", "-.")[k % 3], lw=1, color=f"{0.2 + 0.15 * (k % 4)}")
            ax1.axhline(_med([stat(r, "step_s") for r in rs]) * 1e3, **style,
                        label=f"{label}: one-shot reference")
            ax2.axhline(_med([stat(r, "sync_share") for r in rs]), **style)
    return draw


def bucket_sweep(records: Sequence[dict]) -> Result:
    return _sweep(records, "bucket_mb", _bucket_mb, "bucket cap (MB; 0 = one per tensor)",
                  "Bucket-size sweep (bucketed strategy; flat runs of the same set-up as lines)",
                  extra=_flat_references(records, "bucket_mb"))


def accumulation(records: Sequence[dict]) -> Result:
    return _sweep(records, "accum_steps", lambda r: get(r, "accum_steps"),
                  "accumulation steps k (micro-batches per sync)",
                  "Gradient accumulation: sync once every k micro-batches")


def compression(records: Sequence[dict]) -> Result:
    return _sweep(records, "compression", lambda r: get(r, "compression"), "gradient compression",
                  "Compression of gradients on the wire", categorical=True)


ACCURACY_FIELDS = ("heldout_accuracy", "held_out_accuracy", "val_accuracy", "test_accuracy",
                   "accuracy")
WALL_FIELDS = ("wall_s", "wall_time_s", "elapsed_s", "time_s")


def _first(r: dict, names: Sequence[str]) -> float:
    for n in names:
        v = num(r.get(n))
        if not math.isnan(v):
            return v
    return math.nan


def _staleness_label(r: dict) -> str:
    """A convergence series: the strategy and its staleness bound (the parameter server
    sets none: its staleness is measured, and its series is one whatever it measured)."""
    if r.get("strategy") == "ps":
        return f"{strategy_label(r)} (staleness measured)"
    return f"{strategy_label(r)} s={get(r, 'staleness')}"


def staleness(records: Sequence[dict]) -> Result:
    conv = [r for r in records if r.get("kind") not in ("summary", "microbench", "trace")
            and not math.isnan(_first(r, ACCURACY_FIELDS))
            and not math.isnan(_first(r, WALL_FIELDS))]
    thr = [r for r in summaries(records) if get(r, "staleness") is not None]
    if len({num(get(r, "staleness")) for r in thr}) < 2:
        thr = []  # one staleness value (every run synchronous) is no sweep
    if not conv and not thr:
        return None, ("no data: no convergence records and no summaries at two or more "
                      "staleness values")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4.2))
    if conv:
        for label, rs in series(conv, exclude=("staleness",),
                                base=_staleness_label).items():
            pts = sorted((_first(r, WALL_FIELDS), _first(r, ACCURACY_FIELDS)) for r in rs)
            ax1.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=label)
    else:
        ax1.text(0.5, 0.5, "no convergence records", ha="center", transform=ax1.transAxes)
    ax1.set_xlabel("wall time (s)")
    ax1.set_ylabel("held-out accuracy")
    if thr:
        for label, rs in series(thr, exclude=("staleness",)).items():
            _line(ax2, rs, lambda r: get(r, "staleness"), "throughput", label)
    ax2.set_xlabel("staleness s (steps)")
    ax2.set_ylabel("throughput (samples/s)")
    return _finish(fig, [ax1, ax2], "Bounded staleness: convergence and throughput"), None


def batch_size(records: Sequence[dict]) -> Result:
    recs = [r for r in summaries(records) if r.get("batch_size") is not None]
    groups = swept(series(recs, exclude=("batch_size",)), lambda r: r.get("batch_size"))
    if not groups:
        return None, ("no data: no set-up run at two or more batch sizes (seen: "
                      f"{', '.join(map(str, sorted({r['batch_size'] for r in recs})))})")
    recs = [r for rs in groups.values() for r in rs]
    groups = series(recs, exclude=("batch_size",))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4.2))
    mem_kind = "peak_cuda_mb" if any(r.get("peak_cuda_mb") is not None for r in recs) \
        else "peak_rss_mb"
    for label, rs in groups.items():
        _line(ax1, rs, lambda r: r.get("batch_size"), "throughput", label)
        pts = [(x, _med([num(r.get(mem_kind)) for r in g]))
               for x, g in _by_x(rs, lambda r: r.get("batch_size"))]
        pts = [p for p in pts if not math.isnan(p[1])]
        if pts:
            ax2.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=4, label=label)
    ax1.set_ylabel("throughput (samples/s)")
    ax2.set_ylabel(("peak GPU memory" if mem_kind == "peak_cuda_mb" else "peak RSS")
                   + " per rank (MB, max over ranks)")
    for ax in (ax1, ax2):
        ax.set_xlabel("batch size per rank (samples)")
    return _finish(fig, [ax1, ax2], "Throughput and peak memory vs batch size"), None


#: name -> (question it answers, builder); one file per figure, in this order
FIGURES: dict[str, tuple[str, Callable[[Sequence[dict]], Result]]] = {
    "sync_share_vs_ranks": ("How does the sync share grow with ranks, per strategy?",
                            sync_share_vs_ranks),
    "scaling": ("How do throughput and scaling efficiency grow with ranks?", scaling),
    "overlap": ("How much of the comm time does each strategy hide?", overlap),
    "busbw_vs_size": ("What bus bandwidth does each all-reduce reach per message size?",
                      busbw_vs_size),
    "bucket_sweep": ("Which bucket size syncs fastest?", bucket_sweep),
    "accumulation": ("How does accumulation (k micro-batches per sync) cut the sync share?",
                     accumulation),
    "compression": ("What does gradient compression buy?", compression),
    "staleness": ("What do stale gradients buy in throughput and cost in accuracy?", staleness),
    "batch_size": ("How do throughput and peak memory grow with batch size?", batch_size),
}
