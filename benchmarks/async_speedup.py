"""Async and bucketed against flat on the emulated cluster: wall-clock throughput per layout.

For each layout (nodes x ranks per node; default 2x1, 2x2, 2x4, 4x2, links
shaped to 1 Gbit/s) and each transfer path of the background engine
(``--transfer``, default ``thread``) it runs two jobs of
``commbench.allreduce`` (ResNet-18's gradients, 300 ms of replayed compute,
the default 25 MB buckets, 16 measured steps after 2 warm-up: as many as the
largest staleness, so async's pipeline is full when the wall clock starts), on
an emulated cluster of the layout's shape that ``launch.sweep`` brings up and
measures the link of (kept up across the layout's jobs):

1. ``--strategy flat,async,bucketed --staleness 1``: the baseline and the two
   overlapping schemes in one job, so they share the cluster and the minute;
2. ``--strategy async --staleness 2`` (``--staleness`` takes one value per job).

Then it prints one fixed-width table per layout, a row per repeat: wall-clock
throughput (samples/s over the wall time of the measured steps, the summaries'
``wall_throughput``; ``throughput``, the median per-step rate, where a record
lacks it, which the table's footer says) of flat, async S=1, async S=2 and
bucketed, the ratios to flat, async's speed-up bound, the link rate the cluster
measured (``link_gbps`` in the records), the validation's #wrong and the runs'
verdict. The load average is printed first (the experiment runner's reading,
``experiments.runner.read_load``), with a warning above 0.75 x the cores: timing
on a busy machine measures the machine.

The speed-up bound is flat's own: a step of flat is its compute plus the
all-reduce it waits for; async hides the all-reduce behind the next steps'
compute, so its step is at least the longer of the two, and its speed-up at
most ``flat step / max(flat compute, flat comm)`` (medians of the same job's
flat run). Two goals under each table, decided on the paired repeats
(``analysis.stats.decide``: flat and async S=1 of one repeat ran in one job; a
95 % confidence sequence from 3 repeats, undecided below, never a verdict on
one run): async S=1 >= 1.30 x flat, and async S=1's speed-up >= 0.90 of its
bound. Where any compared run is host-bound (its set-up's verdict at
``--dilation auto``, else its own counter reading) the goals are not judged.

Run it from the repository root, as root (the cluster needs network
namespaces), with nothing else measuring::

    python -m benchmarks.async_speedup                          # ~8 min on 2 cores (estimate)
    python -m benchmarks.async_speedup --dry-run                # print the commands only
    python -m benchmarks.async_speedup --layouts 2x4 --transfer thread,ring
    python -m benchmarks.async_speedup --layouts 2x4 --steps 8 --dilation auto --repeats 3
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from analysis import stats
from analysis.load import mark_setup_verdicts
from commbench.allreduce import Config
from commbench.comm.engine import TRANSFER_PATHS
from commbench.hostload import is_link_bound
from commbench.strategies import AsyncSettings
from commbench.tables import Column, format_table
from experiments.bench import Benchmark, add_output_flags, layouts, parser, records, repeats_arg
from experiments.job import Job
from experiments.runner import Runner

DEFAULT_LAYOUTS = "2x1,2x2,2x4,4x2"
JOB_TIMEOUT_S = 300.0
#: the goals: async S=1's wall throughput / flat's, and / (flat's x the speed-up bound)
SPEEDUP_GOAL, BOUND_GOAL = 1.30, 0.90
#: a goal's verdict from ``stats.decide``'s, in this benchmark's words
_WORDS = {stats.REPRODUCED: "met", stats.REFUTED: "NOT met", stats.UNDECIDED: "undecided"}


@dataclass(frozen=True)
class Run:
    """A job of this benchmark: its layout, transfer path and staleness, and the job."""

    layout: tuple[int, int]  # (nodes, ranks per node)
    transfer: str
    staleness: int
    tool: Job


def transfers(text: str) -> list[str]:
    out = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in out if x not in TRANSFER_PATHS]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"--transfer: choose from {', '.join(TRANSFER_PATHS)}")
    return out


def runs(args: argparse.Namespace) -> list[Run]:
    """Two jobs per layout and transfer path (see the module docstring); one compared set
    per layout."""
    jobs = []
    for n, s in args.layouts:
        for path in args.transfer:
            for staleness, strategies in ((1, ["flat", "async", "bucketed"]), (2, ["async"])):
                cfg = Config(model=args.model, strategies=strategies, algos=["native"],
                             sync=AsyncSettings(staleness=staleness, transfer=path),
                             compute_ms=args.compute_ms, steps=args.steps,
                             warmup=args.warmup, quiet=True)
                name = f"{n}x{s}-{path}-s{staleness}"
                jobs.append(Run((n, s), path, staleness, Job.place(
                    name, cfg, n, s, args.rate, timeout_s=JOB_TIMEOUT_S,
                    repeats=args.repeats if args.repeats > 1 else None,
                    sets={f"{n}x{s}"})))
    return jobs


def plan(args: argparse.Namespace) -> list[Job]:
    return [r.tool for r in runs(args)]


def rate_of(summary: dict | None, fell_back: list[str]) -> float | None:
    """Wall-clock throughput, or the per-step median where the record lacks it."""
    if summary is None:
        return None
    if summary.get("wall_throughput") is not None:
        return summary["wall_throughput"]
    fell_back.append(summary["strategy"])
    return summary.get("throughput")


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def speedup_bound(flat: dict | None) -> float | None:
    """The most async can gain over this flat run: its median step over the longer of its
    compute and its all-reduce (comm per step), both medians of the same run."""
    if flat is None or not flat.get("compute_s") or flat.get("comm_s") is None:
        return None
    return flat["stats"]["step_s"]["median"] / max(flat["compute_s"], flat["comm_s"])


def verdict_of(runs: list[dict]) -> str:
    """The runs' verdict as the table shows it: host where any is host-bound, ``*`` where
    each is its set-up's (the runner's outcome rule, ``dilations.json``)."""
    marks = [is_link_bound(s) for s in runs]
    word = "host" if False in marks else "link" if marks and all(marks) else "-"
    return word + ("*" if runs and all(s.get("setup_bound") for s in runs) else "")


TABLE = [Column("transfer", "", 10), Column("flat", "samples/s", 11, ".1f"),
         Column("async S=1", "samples/s", 11, ".1f"), Column("async S=2", "samples/s", 11, ".1f"),
         Column("bucketed", "samples/s", 11, ".1f"), Column("S=1/flat", "", 8, ".3f"),
         Column("S=2/flat", "", 8, ".3f"), Column("bkt/flat", "", 8, ".3f"),
         Column("bound", "x flat", 8, ".3f"), Column("S=1/bnd", "", 8, ".3f"),
         Column("link", "Gbit/s", 8, ".3f"), Column("#wrong", "", 7), Column("verdict", "", 8)]


@dataclass
class Repeat:
    """One repeat of a layout's and path's two jobs: each strategy's summary (``async1``,
    ``async2`` by staleness), as far as the jobs wrote them."""

    index: int
    by: dict[str, dict]

    def rate(self, key: str, fell_back: list[str]) -> float | None:
        return rate_of(self.by.get(key), fell_back)


def repeats_of(jobs: list[Run], files: dict[str, list[Path]]) -> list[Repeat]:
    """Each repeat's summaries from a layout's and path's jobs, repeat 0 first."""
    n = max(len(files[j.tool.name]) for j in jobs)
    out = []
    for r in range(n):
        by: dict[str, dict] = {}
        for job in jobs:
            paths = files[job.tool.name]
            for s in records(paths[r], "summary") if r < len(paths) else []:
                key = s["strategy"] if s["strategy"] != "async" else f"async{job.staleness}"
                by[key] = {**s, "_file": str(paths[r])}
        out.append(Repeat(r, by))
    mark_setup_verdicts([s for rep in out for s in rep.by.values()])
    return out


def layout_row(jobs: list[Run], rep: Repeat, fell_back: list[str], label: str) -> list:
    """One table row from one repeat of a layout's and path's two jobs."""
    by = rep.by
    flat, a1, a2, bkt = (rep.rate(k, fell_back) for k in ("flat", "async1", "async2", "bucketed"))
    links = [s.get("link_gbps") for s in by.values() if s.get("link_gbps")]
    paths = {s["knobs"].get("transfer_path") for k, s in by.items() if k != "flat"}
    if paths - {jobs[0].transfer}:  # what ran is what the records say
        print(f"# warning: records name transfer paths {sorted(map(str, paths))}",
              file=sys.stderr)
    wrong = sum(s.get("wrong", 0) for s in by.values()) if by else None
    bound = speedup_bound(by.get("flat"))
    s1 = ratio(a1, flat)
    return [label, flat, a1, a2, bkt, s1, ratio(a2, flat), ratio(bkt, flat), bound,
            ratio(s1, bound), min(links) if links else None, wrong,
            verdict_of(list(by.values()))]


def judge(reps: list[Repeat]) -> list[str]:
    """Async S=1 against its two goals, decided on the paired repeats (module docstring):
    one line each, with its figure as judged; undecided below 3 repeats; not judged where
    a compared run is host-bound."""
    pairs = [(r.by["async1"], r.by["flat"]) for r in reps
             if "async1" in r.by and "flat" in r.by]
    if not pairs:
        return ["goals: async S=1 or flat left no summary: no verdict"]
    a1 = [rate_of(a, []) or math.nan for a, _ in pairs]
    flat = [rate_of(f, []) or math.nan for _, f in pairs]
    bounded = [f * (speedup_bound(s) or math.nan) for f, (_, s) in zip(flat, pairs)]
    host = [s["strategy"] for pair in pairs for s in pair if is_link_bound(s) is False]
    out = []
    for name, den, goal in (("async S=1 / flat", flat, SPEEDUP_GOAL),
                            ("async S=1 / (flat x its bound)", bounded, BOUND_GOAL)):
        try:
            d = stats.decide(a1, den, goal, False)
            figure, word = d.words(".3f"), _WORDS[d.verdict]
        except ValueError as e:  # a figure of 0 or NaN has no log-ratio
            figure, word = f"no figure ({e})", "undecided"
        if host:
            word = "undecided"
        out.append(f"goal {name} >= {goal:.2f}: {figure} [{word}]")
    if host:
        out.append(f"{len(host)} compared runs host-bound ({', '.join(sorted(set(host)))}): "
                   "the goals are not judged")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = parser("benchmarks.async_speedup", __doc__)
    p.add_argument("--layouts", type=layouts, default=layouts(DEFAULT_LAYOUTS),
                   help="NODESxRANKS[,...] (default " + DEFAULT_LAYOUTS + ")")
    p.add_argument("--transfer", type=transfers, default=["thread"],
                   help="transfer path(s) of async and bucketed: "
                        f"{','.join(TRANSFER_PATHS)}; two paths double the time")
    p.add_argument("--rate", default="1gbit", help="link rate per node (tc syntax)")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--compute-ms", type=float, default=300.0)
    p.add_argument("--steps", type=int, default=16,
                   help="measured steps; 6 left async S=2 short of steady state (1.41, "
                        "1.57 and 0.98x flat in three runs on 2x4; 1.35 with 16)")
    p.add_argument("--warmup", type=int, default=2,
                   help="warm-up steps; at least the largest staleness (2), so async's "
                        "pipeline is full when the wall clock starts")
    p.add_argument("--repeats", type=repeats_arg, default=1, metavar="N",
                   help="run every job N times (each a job of its own, shuffled within its "
                        "cluster); the goals are decided on the paired repeats from 3")
    add_output_flags(p, "async-speedup")
    return p


def check(args: argparse.Namespace, planned: list[Job], runner: Runner) -> int:
    jobs = runs(args)
    files = {job.tool.name: runner.outputs(job.tool.name) for job in jobs}
    for n, s in args.layouts:
        fell_back: list[str] = []
        rows, goals = [], []
        for path in args.transfer:
            mine = [j for j in jobs if j.layout == (n, s) and j.transfer == path]
            reps = repeats_of(mine, files)
            rows += [layout_row(mine, rep, fell_back,
                                path + (f" r{rep.index}" if len(reps) > 1 else ""))
                     for rep in reps]
            goals += [f"{path}: {line}" for line in judge(reps)]
        footer = [f"wall-clock throughput; {args.model}, {args.compute_ms:g} ms compute, "
                  f"{args.steps} steps (+{args.warmup} warm-up), links {args.rate}"
                  + (f", {args.repeats} repeats" if args.repeats > 1 else ""),
                  "bound: flat step / max(flat compute, flat comm), the most async can gain; "
                  "verdict * = the set-up's (outcome rule: K against 2K, dilations.json), "
                  "else the runs' own counter reading",
                  *goals, f"records: {runner.outdir}"]
        if fell_back:
            footer.append("no wall_throughput in the records of "
                          f"{', '.join(sorted(set(fell_back)))}: median per-step throughput "
                          "shown instead")
        print(format_table(TABLE, rows, title=f"async_speedup  {n} nodes x {s} ranks",
                           footer=footer))
    return 0


BENCHMARK = Benchmark("async-speedup", build_parser, plan, check)
main = BENCHMARK.main


if __name__ == "__main__":
    sys.exit(main())
