"""Calibrate the host-load verdict against dilation itself: which rule says "link-bound" when
the figure really stopped moving, on every library?

A verdict (``link-bound`` / ``host-bound``) claims that a figure holds the links and the
algorithm, not this machine. The independent reference is what dilation does to the figure
(Gupta et al., NSDI 2006): at K and at 4K, the same set-up, 3 or more runs each; the figure
**converged** at K where the interval of time(K) / time(4K) (``analysis.stats.ratio_spread``:
the range of every pairwise ratio below 6 runs a side, conservative) lies inside +-5 %,
**moved** where it lies wholly outside, and is **unresolved** otherwise (counted, shown, left
out of the agreement). Two candidate rules are then scored on the resolved cells:

- (i) the **counter rule** (``commbench.hostload.verdict``, what every run records today):
  per-thread CPU and run-queue wait from schedstat, excusing the CPU of the mpi backend's
  blocking calls (``hostload.polled``); a side is link-bound only when every run at K is;
- (ii) the **outcome rule**: link-bound at K when time(K) / time(2K) lies inside +-5 %
  (the probe ladder's pair), host-bound when it lies wholly outside, no verdict otherwise.

A rule agrees with the reference where it says link-bound on a converged cell and host-bound
on a moved one. The cells: each library's microbenchmark on a 2 x 2 emulated cluster at one
link rate, at two sizes, for each algorithm it runs (Open MPI ``native``, the project's
``ring`` and ``hier`` under ``mpirun``; Gloo's ``native`` and the ring under ``torchrun``;
Horovod's own all-reduce, ``native``, under ``horovodrun``), judged at K = 1 (against 2 and
4) and K = 4 (against 8 and 16). Every job runs ``--repeats`` times, shuffled within its K.

Run it from the repository root, as root, with nothing else running::

    python -m benchmarks.hostload_calibration                   # 45 jobs, ~25 min on 2 cores
    python -m benchmarks.hostload_calibration --bases 1 --repeats 3 --dry-run
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from analysis import stats
from commbench import dilation as dil
from commbench.flags import csv_list, parse_size, positive_int
from commbench.hostload import LINK_BOUND
from commbench.microbench import MicroConfig
from commbench.tables import Column, format_table
from experiments.bench import Benchmark, add_output_flags, parser, records
from experiments.job import Job
from experiments.runner import Runner

STEM = "hostload-calibration"
#: a figure within this of its value at the other K has not moved
TOLERANCE = 0.05
#: the algorithms each launcher's library runs here ("native" is the library's own)
ALGOS = {"mpirun": ("native", "ring", "hier"), "torchrun": ("native", "ring"),
         "horovodrun": ("native",)}
LIBRARY = {"mpirun": "Open MPI", "torchrun": "Gloo", "horovodrun": "Horovod"}
JOB_TIMEOUT_S = 300.0  # emulated; the sweep multiplies it by K
CONVERGED, MOVED, UNRESOLVED = stats.CONVERGED, stats.MOVED, stats.UNRESOLVED
HOST, LINK, NONE = "host", "link", "-"


def build_parser() -> argparse.ArgumentParser:
    p = parser("benchmarks.hostload_calibration", __doc__)
    p.add_argument("--launchers", type=csv_list(tuple(ALGOS), "--launchers"),
                   default=list(ALGOS), help="libraries, by launcher, comma-separated")
    p.add_argument("--bases", type=lambda t: sorted({float(dil.parse(x, "--bases"))
                                                     for x in t.split(",") if x.strip()}),
                   default=[1.0, 4.0],
                   help="the K each cell is judged at: it also runs at 2K and 4K")
    p.add_argument("--layout", default="2x2", help="NODESxRANKS of the emulated cluster")
    p.add_argument("--rate", default="1gbit", help="emulated link rate")
    p.add_argument("--sizes", type=lambda t: [parse_size(x) for x in t.split(",") if x],
                   default=[64 << 10, 1 << 20], help="all-reduce sizes in bytes (float32)")
    p.add_argument("--iters", type=positive_int, default=20, help="timed calls per size")
    p.add_argument("--warmup", type=positive_int, default=3, help="untimed calls first")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="runs of every job (at least 3 for an interval)")
    add_output_flags(p, STEM)
    return p


def factors(bases: Sequence[float]) -> list[float]:
    """Every K run: each base, twice and four times it."""
    return sorted({b * m for b in bases for m in (1, 2, 4)})


def plan(args: argparse.Namespace) -> list[Job]:
    """One microbenchmark job per launcher and K, every one ``--repeats`` times; each K its
    own set (K is what this varies)."""
    nodes, slots = (int(x) for x in args.layout.split("x"))
    lo, hi = min(args.sizes), max(args.sizes)
    step = round(hi / lo) if len(args.sizes) == 2 else 2
    jobs = []
    for k in factors(args.bases):
        for launcher in args.launchers:
            cfg = MicroConfig(minbytes=lo, maxbytes=hi, stepfactor=max(step, 2),
                              algos=list(ALGOS[launcher]), iters=args.iters,
                              warmup_iters=args.warmup, quiet=True)
            jobs.append(Job.place(f"{launcher}-k{dil.text(k)}", cfg, nodes, slots, args.rate,
                                  launcher=launcher, timeout_s=JOB_TIMEOUT_S, dilation=k,
                                  repeats=args.repeats, sets={f"k{dil.text(k)}"}))
    return jobs


def moved(a: Sequence[float], b: Sequence[float]) -> tuple[str, stats.Spread]:
    """Whether ``a`` (runs at one K) and ``b`` (at another) agree: the interval of their
    ratio of medians inside +-TOLERANCE (converged), wholly outside (moved), or neither
    (``analysis.stats.agreement``, the runner's ladder's rule too)."""
    return stats.agreement(a, b, TOLERANCE)


def counter_rule(rows: Sequence[dict]) -> str:
    """(i): link-bound only when every run recorded link-bound."""
    verdicts = [r.get("bound") for r in rows]
    if not verdicts or any(v is None for v in verdicts):
        return NONE
    return LINK if all(v == LINK_BOUND for v in verdicts) else HOST


def outcome_rule(at_k: Sequence[float], at_2k: Sequence[float]) -> str:
    """(ii): link-bound where K's figure agrees with 2K's, host-bound where it moved."""
    verdict, _ = moved(at_k, at_2k)
    return {CONVERGED: LINK, MOVED: HOST}.get(verdict, NONE)


def agrees(rule: str, reference: str) -> bool | None:
    """Whether a rule's verdict matches the reference; None where either has none."""
    if rule == NONE or reference == UNRESOLVED:
        return None
    return (rule == LINK) == (reference == CONVERGED)


def cells(rows: Sequence[dict], bases: Sequence[float]) -> list[dict]:
    """One cell per (library, algorithm, size, base K): the reference and both rules."""
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault((r["_launcher"], r["algo"], r["size"], float(r["dilation"])), []).append(r)
    out = []
    for (launcher, algo, size, k), at_k in sorted(by.items()):
        if k not in bases:
            continue
        times = {m: [r["time_us"]["avg"] for r in by.get((launcher, algo, size, k * m), [])]
                 for m in (1, 2, 4)}
        reference, ratio = moved(times[1], times[4])
        counter, outcome = counter_rule(at_k), outcome_rule(times[1], times[2])
        out.append({"library": LIBRARY[launcher], "algo": algo, "size": size, "k": k,
                    "runs": min(len(t) for t in times.values()), "t_us": times,
                    "ratio": ratio, "reference": reference,
                    "latency": sum(bool(r.get("latency_bound")) for r in at_k),
                    "counter": counter, "outcome": outcome,
                    "counter_agrees": agrees(counter, reference),
                    "outcome_agrees": agrees(outcome, reference)})
    return out


def _med(xs: Sequence[float]) -> float | None:
    return stats.spread_of(xs).value if xs else None


def score(cs: Sequence[dict]) -> list[str]:
    """Per library and rule: resolved cells, agreements, disagreements, no verdict."""
    lines = []
    for lib in dict.fromkeys(c["library"] for c in cs):
        mine = [c for c in cs if c["library"] == lib]
        resolved = [c for c in mine if c["reference"] != UNRESOLVED]
        parts = []
        for rule in ("counter", "outcome"):
            got = [c[f"{rule}_agrees"] for c in resolved]
            parts.append(f"{rule} rule {sum(g is True for g in got)} agree, "
                         f"{sum(g is False for g in got)} disagree, "
                         f"{sum(g is None for g in got)} no verdict")
        lines.append(f"{lib}: {len(resolved)} of {len(mine)} cells resolved; "
                     + "; ".join(parts))
    return lines


TABLE = [Column("library", "", 8), Column("algo", "", 6), Column("size", "B", 8),
         Column("K", "", 4), Column("runs", "", 4), Column("t(K)", "us", 9, ".1f"),
         Column("t(2K)", "us", 9, ".1f"), Column("t(4K)", "us", 9, ".1f"),
         Column("K/4K", "", 6, ".3f"), Column("lo", "", 6, ".3f"), Column("hi", "", 6, ".3f"),
         Column("reference", "", 10), Column("lat", "", 3), Column("counter", "", 7),
         Column("outcome", "", 7)]


def table_row(c: dict) -> list:
    t = c["t_us"]
    mark = {True: "", False: " X", None: ""}
    return [c["library"], c["algo"], c["size"], dil.text(c["k"]), c["runs"], _med(t[1]),
            _med(t[2]), _med(t[4]), c["ratio"].value, c["ratio"].lo, c["ratio"].hi,
            c["reference"], c["latency"], c["counter"] + mark[c["counter_agrees"]],
            c["outcome"] + mark[c["outcome_agrees"]]]


def check(args: argparse.Namespace, jobs: list[Job], runner: Runner) -> int:
    rows = []
    for job in jobs:
        launcher = job.placement.launcher
        for path in runner.outputs(job):
            rows += [{**r, "_launcher": launcher} for r in records(path, "microbench")]
    cs = cells(rows, args.bases)
    print(format_table(TABLE, [table_row(c) for c in cs],
                       title=f"hostload_calibration  {args.layout} at {args.rate}, "
                             f"{args.iters} calls (+{args.warmup}), {args.repeats} runs at "
                             f"each K", footer=[
                           "t: median over runs of each run's mean time per call, emulated; "
                           "K/4K: ratio of medians, lo-hi its interval (range of pairwise "
                           "ratios below 6 runs a side)",
                           f"reference: converged (K/4K inside +-{TOLERANCE:.0%}), moved "
                           "(wholly outside), unresolved; lat: runs at K that are "
                           "latency-bound (commbench.latency)",
                           "counter: (i) every run at K recorded link-bound; outcome: (ii) "
                           f"K/2K inside +-{TOLERANCE:.0%} (link) or wholly outside (host); "
                           "X: disagrees with the reference",
                           *score(cs), f"records: {runner.outdir}"]))
    return 0


BENCHMARK = Benchmark(STEM, build_parser, plan, check)
main = BENCHMARK.main


if __name__ == "__main__":
    sys.exit(main())
