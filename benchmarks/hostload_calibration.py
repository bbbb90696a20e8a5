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
Horovod's own all-reduce, ``native``, under ``horovodrun``), and the training cells
(``--cells training``): ``commbench.allreduce`` steps of a small model's replayed compute
(``--model``, default smallcnn, 7.8 MiB of gradient in 6 tensors, ``--compute-ms`` 40)
under DDP on Gloo and bucketed on its transfer paths (``torchrun``: thread and ring on
Gloo; ``mpirun``: thread, ring and hier on Open MPI) and Horovod's
``DistributedOptimizer`` (``horovodrun``), the figure each run's median step. Every cell
is judged at K = 1 (against 2 and 4) and K = 4 (against 8 and 16). Every job runs
``--repeats`` times, shuffled within its K.

Run it from the repository root, as root, with nothing else running::

    python -m benchmarks.hostload_calibration --cells micro    # 45 jobs, ~11 min on 2 cores
    python -m benchmarks.hostload_calibration --cells training --bases 1,2  # 72 runs, 35 min
    python -m benchmarks.hostload_calibration --bases 1 --repeats 3 --dry-run
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from analysis import stats
from commbench import dilation as dil
from commbench.allreduce import Config
from commbench.flags import csv_list, nonneg_float, parse_size, positive_int
from commbench.hostload import LINK_BOUND
from commbench.microbench import MicroConfig
from commbench.strategies import BucketedSettings
from commbench.tables import Column, format_table
from commbench.workloads.spec import model_name
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
#: the training cells' jobs: (launcher, strategies, bucketed's transfer path); DDP runs on
#: Gloo, bucketed on the launcher's backend (Gloo under torchrun, Open MPI under mpirun)
TRAINING = (("torchrun", ("ddp", "bucketed"), "thread"), ("torchrun", ("bucketed",), "ring"),
            ("mpirun", ("bucketed",), "thread"), ("mpirun", ("bucketed",), "ring"),
            ("mpirun", ("bucketed",), "hier"), ("horovodrun", ("horovod",), None))
CELL_KINDS = ("micro", "training")
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
    p.add_argument("--cells", type=csv_list(CELL_KINDS, "--cells"), default=list(CELL_KINDS),
                   help="micro: each library's all-reduce (commbench.microbench); training: "
                        "DDP, bucketed on each transfer path and Horovod's optimizer "
                        "(commbench.allreduce, replayed compute)")
    p.add_argument("--iters", type=positive_int, default=20,
                   help="timed calls per size; measured steps of a training cell")
    p.add_argument("--model", default="smallcnn", type=model_name,
                   help="training cells: the model whose gradients are synchronised")
    p.add_argument("--compute-ms", type=nonneg_float, default=40.0,
                   help="training cells: replayed forward+backward per step")
    p.add_argument("--warmup", type=positive_int, default=3, help="untimed calls first")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="runs of every job (at least 3 for an interval)")
    add_output_flags(p, STEM)
    return p


def factors(bases: Sequence[float]) -> list[float]:
    """Every K run: each base, twice and four times it."""
    return sorted({b * m for b in bases for m in (1, 2, 4)})


def plan(args: argparse.Namespace) -> list[Job]:
    """Per K, each launcher's microbenchmark job and its training cells' jobs, every one
    ``--repeats`` times; each K its own set (K is what this varies)."""
    nodes, slots = (int(x) for x in args.layout.split("x"))
    lo, hi = min(args.sizes), max(args.sizes)
    step = round(hi / lo) if len(args.sizes) == 2 else 2
    jobs = []

    def place(name: str, cfg, launcher: str, k: float) -> Job:
        return Job.place(f"{launcher}-{name}k{dil.text(k)}", cfg, nodes, slots, args.rate,
                         launcher=launcher, timeout_s=JOB_TIMEOUT_S, dilation=k,
                         repeats=args.repeats, sets={f"k{dil.text(k)}"})

    for k in factors(args.bases):
        for launcher in args.launchers:
            if "micro" in args.cells:
                cfg = MicroConfig(minbytes=lo, maxbytes=hi, stepfactor=max(step, 2),
                                  algos=list(ALGOS[launcher]), iters=args.iters,
                                  warmup_iters=args.warmup, quiet=True)
                jobs.append(place("", cfg, launcher, k))
            if "training" not in args.cells:
                continue
            for how, strategies, transfer in TRAINING:
                if how != launcher:
                    continue
                sync = BucketedSettings(**({"transfer": transfer} if transfer else {}))
                cfg = Config(model=args.model, compute_ms=args.compute_ms,
                             strategies=list(strategies), sync=sync, steps=args.iters,
                             warmup=args.warmup, quiet=True)
                jobs.append(place(f"{'+'.join(strategies)}-{transfer or 'own'}-", cfg,
                                  launcher, k))
    return jobs


def training_row(s: dict, launcher: str) -> dict:
    """A training run's summary as a calibration row: the strategy (bucketed with its
    transfer path) as the algorithm, the gradient's bytes as the size, the median step
    (emulated) as the time."""
    algo = s["strategy"]
    if algo == "bucketed":
        algo = f"bkt/{(s.get('knobs') or {}).get('transfer_path')}"
    return {"_launcher": launcher, "algo": algo, "size": s["grad_bytes"],
            "dilation": s["dilation"], "time_us": {"avg": s["stats"]["step_s"]["median"] * 1e6},
            "bound": s.get("bound"), "latency_bound": s.get("latency_bound")}


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


TABLE = [Column("library", "", 8), Column("algo", "", 10), Column("size", "B", 8),
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
            rows += [training_row(s, launcher) for s in records(path, "summary")]
    cs = cells(rows, args.bases)
    print(format_table(TABLE, [table_row(c) for c in cs],
                       title=f"hostload_calibration  {args.layout} at {args.rate}, "
                             f"{args.iters} calls (+{args.warmup}), {args.repeats} runs at "
                             f"each K", footer=[
                           "t: median over runs of each run's mean time per call (a training "
                           "cell's: its median step), emulated; "
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
