"""One figure per question, drawn from whatever records the results hold.

Every builder takes the loaded records and returns a ``Result``: the figure
(or None and the reason the results hold no data for it) and the series it
drew. Runs are grouped as the claims group them (``analysis.match``): a
series is one matched set, the runs alike in everything but the figure's own
variable (ranks, bucket size, batch, ...); series of one set-up (alike but for
the sync scheme too) share a panel, titled with the set-up in words, its
legend beside it (outside the axes). Runs of different set-ups are never on
one line, nor in one panel. At most ``MAX_SETUPS`` set-ups are drawn, those
with the most points first; the figure's footnote counts the rest. Axes from
which a ratio is read start at zero. Figures use the non-interactive Agg
backend.
"""

from __future__ import annotations

import math
import textwrap
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from analysis import match, stats  # noqa: E402
from analysis.load import get, knob, num, stat  # noqa: E402
from commbench import metrics  # noqa: E402  (formulas only; imports nothing of MPI)


@dataclass
class Series:
    """One line (or bar row) of a figure: a matched set of runs, in the panel of its set-up."""

    label: str  # the legend entry: the sync scheme, within its set-up
    setup: str  # the set-up in words: the panel's title
    runs: list[dict]


class Result(NamedTuple):
    fig: Figure | None
    why: str | None  # why nothing was drawn
    series: tuple[Series, ...] = ()


def save(fig: Figure, stem: Path) -> list[Path]:
    """Write ``stem``.png and ``stem``.svg (legends beside the axes included); close it."""
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    fig.savefig(paths[0], dpi=120, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    plt.close(fig)
    return paths


# -- grouping ------------------------------------------------------------------

#: set-ups drawn per figure, those with the most points first (the footnote counts the rest)
MAX_SETUPS = 6

#: the rank sweep: a run on more ranks may sit on more nodes, each with its own ranks
RANKS = ("ranks", "nodes", "local_sizes")


def _bucket_mb(r: dict) -> float | None:
    return knob(r, "bucket_mb")  # bucketed's and DDP's cap; none for other strategies


def algo_label(r: dict) -> str:
    """A microbenchmark row's algorithm; ``native`` names what it was forced to, if known."""
    algo = str(r.get("algo"))
    forced = r.get("native_algorithm")
    return f"native ({forced})" if algo == "native" and forced else algo


def strategy_label(r: dict) -> str:
    algo = r.get("algo")
    return f"{r.get('strategy', '?')} ({algo})" if algo else str(r.get("strategy", "?"))


def _scheme_but(name: str) -> Callable[[dict], Hashable]:
    """The sync scheme less knob ``name`` (a sweep of that knob is one series)."""
    def key(r: dict) -> Hashable:
        return tuple(k for k in match.sync_scheme(r)
                     if not (isinstance(k, tuple) and k[0] == name))
    return key


def _family(r: dict) -> str:
    return strategy_label(r) if match.sync_family(r) in ("flat", "hierarchical") \
        else str(match.sync_family(r))


def _distinct(labels: list[str], reps: Sequence[dict]) -> list[str]:
    """Labels that read alike get the knobs of their schemes that tell them apart."""
    out = list(labels)
    for lab in {x for x in labels if labels.count(x) > 1}:
        idx = [i for i, x in enumerate(labels) if x == lab]
        knobs = [{k[0]: k[1] for k in match.sync_scheme(reps[i])[2:]} for i in idx]
        differ = sorted({k for d in knobs for k in d
                         if len({repr(e.get(k)) for e in knobs}) > 1})
        for i, d in zip(idx, knobs):
            out[i] = f"{lab}, " + ", ".join(f"{k.replace('_', ' ')} {d.get(k)}" for k in differ)
    if len(set(out)) < len(out):  # alike in every knob shown: the whole scheme
        out = [" ".join(map(str, match.sync_scheme(r))) for r in reps]
    return out


def setups(recs: Sequence[dict], vary: Sequence[str], xget: Callable[[dict], object],
           label: Callable[[dict], str] = match.scheme_words,
           split: Callable[[dict], Hashable] | None = None, swept_only: bool = False,
           prefer_swept: bool = True) -> tuple[list[tuple[str, list[Series]]], list[str]]:
    """Runs as set-ups, each with its series, and the set-ups left out (in words).

    A series is a matched set of ``vary`` (``match.matched_sets``), cut further by
    ``split`` where the figure's variable is a knob of the scheme (bucket size,
    staleness: ``vary`` is then ``sync`` and ``split`` the scheme less that knob). Set-ups
    group the series alike but for the sync scheme. With ``swept_only``, or with
    ``prefer_swept`` where any set-up has a series at two or more values of ``xget``,
    set-ups without one are left out; then the ``MAX_SETUPS`` with the most values are
    kept.
    """
    groups = match.matched_sets(recs, vary)
    if split is not None:
        groups = [[r for r in g if split(r) == k] for g in groups
                  for k in dict.fromkeys(split(r) for r in g)]
    home = {id(g[0]): g for g in groups}
    every = (*vary, "sync")
    sets = [[home[id(r)] for r in su]
            for su in match.matched_sets([g[0] for g in groups], every)]
    titles = [match.describe(m[0][0], every) for m in sets]
    for i, m in enumerate(sets):  # set-ups that read alike: the fields that tell them apart
        twins = [sets[j][0][0] for j, t in enumerate(titles) if t == titles[i] and j != i]
        differ = [f for f in match.FIELDS
                  if any(f in match.differences(m[0][0], t, every) for t in twins)]
        if differ:
            titles[i] += "; " + ", ".join(f"{match.WORDS[f]} {match.FIELDS[f](m[0][0])}"
                                          for f in differ)
    out = []
    for words, members in zip(titles, sets):
        labels = _distinct([label(g[0]) for g in members], [g[0] for g in members])
        out.append((words, sorted((Series(lab, words, g) for lab, g in zip(labels, members)),
                                  key=lambda s: s.label)))

    def points(su: list[Series]) -> int:
        return max(len({repr(xget(r)) for r in s.runs}) for s in su)

    swept = [o for o in out if points(o[1]) > 1]
    keep = swept if swept_only or (prefer_swept and swept) else out
    keep = sorted(keep, key=lambda o: (points(o[1]), match.scale([r for s in o[1]
                                                                  for r in s.runs])),
                  reverse=True)
    left = [w for w, su in out if not any(su is k for _, k in keep[:MAX_SETUPS])]
    return keep[:MAX_SETUPS], left


def _all(drawn: list[tuple[str, list[Series]]]) -> tuple[Series, ...]:
    return tuple(s for _, su in drawn for s in su)


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
    labels = list(dict.fromkeys(labels))
    cmap = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    return {lab: cmap(i % cmap.N) for i, lab in enumerate(labels)}


def _line(ax, recs: Sequence[dict], xget, field: str, label: str, scale: float = 1.0,
          spread: bool = True, color=None) -> bool:
    """Median of ``field`` vs x (median over repeated runs), p5-p95 over steps as error
    bars; where a point has repeats, their spread (``stats.spread_of`` of the runs'
    medians: a 95 % interval from 6, else the range) as a thick bar over it, and the
    figure's footnote says so (``_finish``)."""
    pts = _by_x(recs, xget)
    xs, ys, lo, hi, rep = [], [], [], [], []
    for x, rs in pts:
        y = _med([stat(r, field) for r in rs])
        if math.isnan(y):
            continue
        xs.append(x)
        ys.append(y * scale)
        lo.append(min(stat(r, field, "p5") for r in rs) * scale)
        hi.append(max(stat(r, field, "p95") for r in rs) * scale)
        rep.append(stats.spread_of([stat(r, field) for r in rs]))
    if not xs:
        return False
    if spread and not any(math.isnan(v) for v in lo + hi):
        yerr = [[max(0.0, y - a) for y, a in zip(ys, lo)],
                [max(0.0, b - y) for y, b in zip(ys, hi)]]
        line = ax.errorbar(xs, ys, yerr=yerr, marker="o", ms=4, capsize=3, label=label,
                           color=color)
        color = line.lines[0].get_color()
    else:
        color = ax.plot(xs, ys, marker="o", ms=4, label=label, color=color)[0].get_color()
    many = [(x, s) for x, s in zip(xs, rep) if s.kind not in (stats.SINGLE, stats.NONE)]
    if spread and many:
        ax.vlines([x for x, _ in many], [s.lo * scale for _, s in many],
                  [s.hi * scale for _, s in many], colors=color, linewidth=4, alpha=0.45)
        REPEAT_BARS.add(ax.figure)
    return True


#: figures where ``_line`` drew a spread over repeats (their footnote says what it is)
REPEAT_BARS: set = set()


def _grid(rows: int, cols: int, width: float = 5.0, height: float = 2.9):
    """A panel row per set-up, ``cols`` panels each; room on the right for the legends."""
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols + 3.4, height * rows + 0.8),
                             squeeze=False, layout="constrained")
    return fig, axes


def _title(ax, setup: str, cols: float = 1) -> None:
    ax.set_title(textwrap.fill(setup, int(70 * cols)), fontsize=8, loc="left")


def _from_zero(ax) -> None:
    """A y axis read as ratios of heights: from zero, with room above the highest point."""
    ax.set_ylim(0, ax.get_ylim()[1] * 1.06)


def _legend(ax, source=None) -> None:
    """The legend of ``source``'s series (default: ``ax``'s) outside ``ax``, on its right:
    it never covers a point."""
    handles, labels = (source or ax).get_legend_handles_labels()
    if handles:
        ax.legend(handles, [textwrap.fill(lab, 38) for lab in labels], loc="upper left",
                  bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False, borderaxespad=0)


def _panel(ax, setup: str, ylabel: str) -> None:
    """A one-panel row's y label (its axis from zero), set-up title and legend beside it."""
    ax.set_ylabel(ylabel)
    _from_zero(ax)
    _title(ax, setup)
    _legend(ax)


def _finish(fig: Figure, axes, title: str, left: Sequence[str] = ()) -> Figure:
    """Grid, the title, and a footnote counting the set-ups not drawn."""
    for ax in getattr(axes, "flat", axes):
        ax.grid(True, alpha=0.3)
    fig.suptitle(title, fontsize=10)
    notes = []
    if fig in REPEAT_BARS:
        REPEAT_BARS.discard(fig)
        notes.append("thick bars: the spread over repeats of the runs' medians (95% CI from "
                     "6 runs, else min-max)")
    if left:
        notes.append(f"{len(left)} more set-up{'s' if len(left) > 1 else ''} not drawn "
                     f"(fewer points; the report's claims list every run)")
    if notes:
        fig.supxlabel("; ".join(notes), fontsize=7, color="0.4")
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

def _rank_sweep(records: Sequence[dict], field: str, cols: int, width: float):
    """The summaries with ``field``, as set-ups over ranks: (drawn, left out, colours,
    figure, axes), or None where no summary has it."""
    recs = [r for r in summaries(records) if not math.isnan(stat(r, field))]
    if not recs:
        return None
    drawn, left = setups(recs, RANKS, _ranks)
    return (drawn, left, palette([s.label for s in _all(drawn)]),
            *_grid(len(drawn), cols, width=width))


def sync_share_vs_ranks(records: Sequence[dict]) -> Result:
    start = _rank_sweep(records, "sync_share", 1, 5.0)
    if start is None:
        return Result(None, "no allreduce summaries with a sync share")
    drawn, left, colors, fig, axes = start
    for (setup, series), ax in zip(drawn, axes[:, 0]):
        for s in series:
            _line(ax, s.runs, _ranks, "sync_share", s.label, color=colors[s.label])
        _rank_axis(ax)
        _panel(ax, setup, "sync share\n(exposed sync / step)")
    return Result(_finish(fig, axes, "Sync share vs ranks (median, bars p5-p95 over steps), "
                                     "one panel per set-up", left), None, _all(drawn))


def scaling(records: Sequence[dict]) -> Result:
    start = _rank_sweep(records, "throughput", 2, 4.2)
    if start is None:
        return Result(None, "no allreduce summaries with a throughput")
    drawn, left, colors, fig, axes = start
    for (setup, series), (ax1, ax2) in zip(drawn, axes):
        for s in series:
            _line(ax1, s.runs, _ranks, "throughput", s.label, color=colors[s.label])
            pts = [(x, _med([stat(r, "throughput") for r in g])) for x, g in _by_x(s.runs, _ranks)]
            if len(pts) < 2:
                continue  # efficiency needs a reference and another rank count
            n0, t0 = pts[0]  # reference: 1 rank when measured, else the fewest ranks measured
            ax2.plot([x for x, _ in pts],
                     [metrics.scaling_efficiency(t, x / n0, t0) for x, t in pts],
                     marker="o", ms=4, label=s.label, color=colors[s.label])
        for ax in (ax1, ax2):
            _rank_axis(ax)
            _from_zero(ax)
        ax1.set_ylabel("throughput (samples/s)")
        ax2.set_ylabel("scaling efficiency\n(vs 1 rank, else the fewest run)")
        _title(ax1, setup, 2)
        _legend(ax2, ax1)
    return Result(_finish(fig, axes, "Throughput and scaling efficiency vs ranks, one row per "
                                     "set-up", left), None, _all(drawn))


def _overlap_panel(ax, series: Sequence[Series]) -> None:
    """One set-up's bars: comm time, and exposed sync split into wait + transfer."""
    labels = [s.label for s in series]

    def med(field: str) -> list[float]:
        return [_med([stat(r, field) for r in s.runs]) * 1e3 for s in series]

    comm, exposed = med("comm_s"), med("exposed_sync_s")
    wait, transfer = med("sync_wait_s"), med("sync_transfer_s")
    ys = range(len(labels))
    ax.barh([y - 0.2 for y in ys], comm, height=0.4, color="tab:blue",
            label="comm time (collective in flight)")
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
                [e for e, ok in zip(exposed, split) if not ok], height=0.4, color="tan",
                label="exposed sync (not hidden; no wait/transfer split)")
    for y, c, e in zip(ys, comm, exposed):
        ov = metrics.overlap(e / 1e3, c / 1e3)
        if not math.isnan(ov):
            ax.annotate(f" overlap {ov:.2f}", (max(c, e), y), ha="left", va="center", fontsize=7)
    ax.set_yticks(list(ys))
    ax.set_yticklabels([textwrap.fill(k, 40) for k in labels], fontsize=7)
    ax.set_ylim(len(labels) - 0.4, -0.6)  # first series on top
    ax.set_xlabel("time per step (ms, median)")
    ends = comm + exposed + [w + t for w, t, ok in zip(wait, transfer, split) if ok]
    ends = [v for v in ends if not math.isnan(v)]
    ax.set_xlim(0, max(ends, default=1.0) * 1.25 or 1.0)


def overlap(records: Sequence[dict]) -> Result:
    """Comm time and exposed sync per strategy; exposed sync stacked as wait + transfer.

    The exposed bar's first part is the slowest rank's wait for later ranks inside
    the step's collectives (``sync_wait_s``, capped at exposed sync), the rest is
    exposed sync less that: transfer, plus packing the buffers. A marker shows the
    measured wait + transfer sums: on the bar's end where nothing overlapped, past
    it by the hidden part where collectives overlapped compute. Records without the
    split (schema 1, Horovod's peer) keep a plain exposed bar. One panel per set-up;
    a row per matched set (repeats of one run pooled).
    """
    recs = [r for r in summaries(records)
            if not math.isnan(stat(r, "comm_s")) and not math.isnan(stat(r, "exposed_sync_s"))]
    if not recs:
        return Result(None, "no allreduce summaries with comm and exposed sync times")
    drawn, left = setups(recs, (), lambda r: None)
    heights = [0.7 + 0.42 * len(series) for _, series in drawn]
    fig, axes = plt.subplots(len(drawn), 1, figsize=(10, sum(heights) + 1.0), squeeze=False,
                             layout="constrained", gridspec_kw={"height_ratios": heights})
    for (setup, series), ax in zip(drawn, axes[:, 0]):
        _overlap_panel(ax, series)
        _title(ax, setup, 1.5)
    handles: dict[str, object] = {}
    for ax in axes[:, 0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    axes[0, 0].legend(list(handles.values()), list(handles), loc="upper left",
                      bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False, borderaxespad=0)
    return Result(_finish(fig, axes, "Exposed sync vs comm time (overlap = 1 - exposed / "
                                     "comm); exposed = wait + transfer only where nothing "
                                     "overlapped", left), None, _all(drawn))


#: algorithms whose bus bandwidth a link between nodes bounds: a ring sends every byte over
#: one node's link (2(n-1)/n of the message, as busbw counts); the hierarchical algorithms
#: reduce inside the node first and the MPI library's own choice may too, so they can pass it
LINK_BOUNDED = ("ring",)


def _link_line(ax, recs: Sequence[dict], labels: Sequence[str]) -> None:
    """The measured link as a ceiling, said to be one only for the algorithms it bounds."""
    links = [num(r.get("link_gbps")) for r in recs
             if num(r.get("link_gbps")) > 0 and num(r.get("nodes")) > 1]
    if not links:
        return
    g = _med(links)
    bounded = [a for a in LINK_BOUNDED if a in labels]
    free = [lab for lab in labels if lab not in LINK_BOUNDED]
    what = (f"the ceiling of {', '.join(bounded)}" + (f" ({', '.join(free)} can pass it)"
                                                        if free else "")
            if bounded else f"not a ceiling for {', '.join(free)}")
    ax.axhline(g / 8, color="black", ls="--", lw=1,
               label=f"link {g:.3g} Gbit/s = {g / 8:.3g} GB/s (measured): {what}")


def busbw_vs_size(records: Sequence[dict]) -> Result:
    recs = [r for r in records if r.get("kind") == "microbench"]
    if not recs:
        return Result(None, "no microbenchmark records (python -m commbench.microbench)")
    size = lambda r: r.get("size")  # noqa: E731
    # one size is still a reading against the link: no set-up is left out for it
    drawn, left = setups(recs, (), size, label=algo_label, prefer_swept=False)
    colors = palette([s.label for s in _all(drawn)])
    fig, axes = _grid(len(drawn), 1, width=5.6)
    for (setup, series), ax in zip(drawn, axes[:, 0]):
        for s in series:
            by = _by_x(s.runs, size)  # repeated runs: median, min-max band
            xs = [x for x, _ in by]
            bw = [[num(r.get("busbw")) for r in g] for _, g in by]
            ax.plot(xs, [_med(b) for b in bw], marker="o", ms=3, label=s.label,
                    color=colors[s.label])
            if any(len(b) > 1 for b in bw):
                ax.fill_between(xs, [min(b) for b in bw], [max(b) for b in bw], alpha=0.15,
                                color=colors[s.label], lw=0)
        _link_line(ax, [r for s in series for r in s.runs], [s.label for s in series])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        _panel(ax, setup, "bus bandwidth (GB/s)")
    return Result(_finish(fig, axes, "All-reduce bus bandwidth vs message size (median of "
                                     "repeats; band: min-max)", left), None, _all(drawn))


def _references(panels: Sequence[tuple], refs: Sequence[dict], series: Sequence[Series],
                what: str = "reference") -> None:
    """Runs of ``refs`` of the set-up of ``series`` (alike but for the sync scheme) as
    horizontal lines, one per scheme (median over its repeats), on each (axes, field, scale)
    of ``panels``; the first panel's lines are labelled."""
    mine = [r for r in refs if match.same_setup(r, series[0].runs[0], ("sync",))]
    schemes: dict[str, list[dict]] = defaultdict(list)
    for r in mine:
        schemes[match.scheme_words(r)].append(r)
    for k, (lab, rs) in enumerate(sorted(schemes.items())):
        style = dict(ls=(":", "--", "-.")[k % 3], lw=1, color=f"{0.2 + 0.15 * (k % 4)}")
        for i, (ax, field, scale) in enumerate(panels):
            ax.axhline(_med([stat(r, field) for r in rs]) * scale, **style,
                       label=f"{lab} ({what})" if i == 0 else None)


def _sweep(records: Sequence[dict], vary: str, xget: Callable[[dict], object], xlabel: str,
           title: str, want: Callable[[dict], bool] = lambda r: True,
           categorical: bool = False, split: Callable[[dict], Hashable] | None = None,
           label: Callable[[dict], str] = match.scheme_words,
           reference: Callable[[dict], bool] | None = None) -> Result:
    """Step time and sync share vs one setting, a row per set-up; ``reference`` runs of
    a set-up (flat, for the bucket sweep) drawn as horizontal lines in its row."""
    recs = [r for r in summaries(records) if want(r) and xget(r) is not None]
    if not recs:
        return Result(None, f"no data: no summaries with {xlabel}")
    drawn, left = setups(recs, (vary,), lambda r: str(xget(r)), label=label, split=split,
                         swept_only=True)
    if not drawn:
        values = sorted({str(xget(r)) for r in recs})
        return Result(None, f"no data: no set-up run at two or more values of {xlabel} "
                            f"(seen: {', '.join(values)})")
    shown = [r for s in _all(drawn) for r in s.runs]
    values = sorted({str(xget(r)) if categorical else num(xget(r)) for r in shown},
                    key=lambda v: (isinstance(v, str), v))
    cats = {v: i for i, v in enumerate(values)}
    x = (lambda r: cats[str(xget(r))]) if categorical else xget
    refs = [r for r in summaries(records) if reference is not None and reference(r)]
    colors = palette([s.label for s in _all(drawn)])
    fig, axes = _grid(len(drawn), 2, width=4.2)
    for (setup, series), (ax1, ax2) in zip(drawn, axes):
        for s in series:
            _line(ax1, s.runs, x, "step_s", s.label, scale=1e3, color=colors[s.label])
            _line(ax2, s.runs, x, "sync_share", s.label, color=colors[s.label])
        _references([(ax1, "step_s", 1e3), (ax2, "sync_share", 1.0)], refs, series)
        for ax in (ax1, ax2):
            ax.set_xlabel(xlabel)
            _from_zero(ax)
            if categorical:
                ax.set_xticks(list(cats.values()))
                ax.set_xticklabels(list(cats))
        ax1.set_ylabel("step time (ms)")
        ax2.set_ylabel("sync share\n(exposed sync / step)")
        _title(ax1, setup, 2)
        _legend(ax2, ax1)
    return Result(_finish(fig, axes, title, left), None, _all(drawn))


def bucket_sweep(records: Sequence[dict]) -> Result:
    return _sweep(records, "sync", _bucket_mb, "bucket cap (MB; 0 = one per tensor)",
                  "Bucket-size sweep (bucketed strategy; flat runs of the same set-up as lines)",
                  split=_scheme_but("bucket_mb"), label=_family,
                  reference=lambda r: match.sync_family(r) == "flat")


def accumulation(records: Sequence[dict]) -> Result:
    return _sweep(records, "accumulation", lambda r: get(r, "accum_steps"),
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
    sets none: its staleness is measured, and its series is one whatever it measured),
    with its mitigation."""
    mit = r.get("mitigation") or ("lr" if knob(r, "staleness_lr") else "none")
    name = ("ps (staleness measured)" if match.sync_family(r) == "ps"
            else f"{match.sync_family(r)} s={knob(r, 'staleness')}")
    return name if mit == "none" else f"{name}, {mit}"


def _curves(ax, series: Sequence[Series], colors: dict) -> None:
    """Held-out accuracy vs wall time, a line per run (repeats share their series' colour)."""
    for s in series:
        for k, rid in enumerate(match.run_ids(s.runs)):
            pts = sorted((_first(r, WALL_FIELDS), _first(r, ACCURACY_FIELDS))
                         for r in s.runs if str(r.get("run_id")) == rid)
            base, _, mitigation = s.label.partition(", ")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".",
                    color=colors[base], label=s.label if k == 0 else "_repeat",
                    ls={"": "-", "lr": "--"}.get(mitigation, ":"))
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(0, 1)
    ax.set_xlim(left=0)


def staleness(records: Sequence[dict]) -> Result:
    conv = [r for r in records if r.get("kind") not in ("summary", "microbench", "trace")
            and not math.isnan(_first(r, ACCURACY_FIELDS))
            and not math.isnan(_first(r, WALL_FIELDS))]
    thr = [r for r in summaries(records) if get(r, "staleness") is not None]
    if len({num(get(r, "staleness")) for r in thr}) < 2:
        thr = []  # one staleness value (every run synchronous) is no sweep
    if not conv and not thr:
        return Result(None, "no data: no convergence records and no summaries at two or more "
                            "staleness values")
    curves, left_c = setups(conv, (), lambda r: r.get("run_id"), label=_staleness_label) \
        if conv else ([], [])
    sweeps, left_t = setups(thr, ("sync",), lambda r: get(r, "staleness"),
                            split=_scheme_but("staleness"), label=_family, swept_only=True) \
        if thr else ([], [])
    rows = len(curves) + len(sweeps)
    if not rows:
        return Result(None, "no data: no set-up run at two or more staleness values")
    colors = palette([s.label.partition(", ")[0] for s in _all(curves)])  # mitigation: dashes
    thr_colors = palette([s.label for s in _all(sweeps)])
    fig, axes = _grid(rows, 1, width=5.6, height=3.1)
    for (setup, series), ax in zip(curves, axes[:len(curves), 0]):
        _curves(ax, series, colors)
        _title(ax, "convergence: " + setup)
        _legend(ax)
    flats = [r for r in summaries(records) if match.sync_family(r) in ("flat", "hierarchical")]
    for (setup, series), ax in zip(sweeps, axes[len(curves):, 0]):
        for s in series:
            _line(ax, s.runs, lambda r: get(r, "staleness"), "throughput", s.label,
                  color=thr_colors[s.label])
        _references([(ax, "throughput", 1.0)], flats, series, "synchronous reference")
        ax.set_xticks(sorted({num(get(r, "staleness")) for s in series for r in s.runs}))
        ax.set_xlabel("staleness s (steps)")
        ax.set_ylabel("throughput (samples/s)")
        _from_zero(ax)
        _title(ax, "throughput: " + setup)
        _legend(ax)
    return Result(_finish(fig, axes, "Bounded staleness: convergence and throughput",
                          left_c + left_t), None, _all(curves + sweeps))


def _batch(r: dict) -> object:
    return r.get("batch_size")


def batch_size(records: Sequence[dict]) -> Result:
    recs = [r for r in summaries(records) if r.get("batch_size") is not None]
    drawn, left = setups(recs, ("batch",), _batch, swept_only=True)
    if not drawn:
        return Result(None, "no data: no set-up run at two or more batch sizes (seen: "
                            f"{', '.join(map(str, sorted({r['batch_size'] for r in recs})))})")
    shown = [r for s in _all(drawn) for r in s.runs]
    mem_kind = "peak_cuda_mb" if any(r.get("peak_cuda_mb") is not None for r in shown) \
        else "peak_rss_mb"
    colors = palette([s.label for s in _all(drawn)])
    fig, axes = _grid(len(drawn), 2, width=4.2)
    for (setup, series), (ax1, ax2) in zip(drawn, axes):
        for s in series:
            _line(ax1, s.runs, _batch, "throughput", s.label, color=colors[s.label])
            pts = [(x, _med([num(r.get(mem_kind)) for r in g])) for x, g in _by_x(s.runs, _batch)]
            pts = [p for p in pts if not math.isnan(p[1])]
            if pts:
                ax2.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=4,
                         label=s.label, color=colors[s.label])
        ax1.set_ylabel("throughput (samples/s)")
        ax2.set_ylabel(("peak GPU memory" if mem_kind == "peak_cuda_mb" else "peak RSS")
                       + " per rank\n(MB, max over ranks)")
        for ax in (ax1, ax2):
            ax.set_xlabel("batch size per rank (samples)")
            _from_zero(ax)
        _title(ax1, setup, 2)
        _legend(ax2, ax1)
    return Result(_finish(fig, axes, "Throughput and peak memory vs batch size, one row per "
                                     "set-up", left), None, _all(drawn))


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
