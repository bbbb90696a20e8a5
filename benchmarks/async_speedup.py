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

Then it prints one fixed-width table per layout: wall-clock throughput
(samples/s over the wall time of the measured steps, the summaries'
``wall_throughput``; ``throughput``, the median per-step rate, where a record
lacks it, which the table's footer says) of flat, async S=1, async S=2 and
bucketed, the ratios to flat, the link rate the cluster measured
(``link_gbps`` in the records) and the validation's #wrong. The load average
is printed first (the experiment runner's reading, ``experiments.runner.read_load``),
with a warning above 0.75 x the cores: timing on a busy machine measures the machine.

Run it from the repository root, as root (the cluster needs network
namespaces), with nothing else measuring::

    python -m benchmarks.async_speedup                          # ~8 min on 2 cores (estimate)
    python -m benchmarks.async_speedup --dry-run                # print the commands only
    python -m benchmarks.async_speedup --layouts 2x4 --transfer thread,ring
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from commbench.allreduce import Config
from commbench.comm.engine import TRANSFER_PATHS
from commbench.strategies import AsyncSettings
from commbench.tables import Column, format_table
from experiments.bench import Benchmark, add_output_flags, layouts, parser, records
from experiments.job import Job
from experiments.runner import Runner

DEFAULT_LAYOUTS = "2x1,2x2,2x4,4x2"
JOB_TIMEOUT_S = 300.0


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
                    name, cfg, n, s, args.rate, timeout_s=JOB_TIMEOUT_S, sets={f"{n}x{s}"})))
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


TABLE = [Column("transfer", "", 9), Column("flat", "samples/s", 11, ".1f"),
         Column("async S=1", "samples/s", 11, ".1f"), Column("async S=2", "samples/s", 11, ".1f"),
         Column("bucketed", "samples/s", 11, ".1f"), Column("S=1/flat", "", 8, ".3f"),
         Column("S=2/flat", "", 8, ".3f"), Column("bkt/flat", "", 8, ".3f"),
         Column("link", "Gbit/s", 8, ".3f"), Column("#wrong", "", 7)]


def layout_row(jobs: list[Run], files: dict[str, Path], fell_back: list[str]) -> list:
    """One table row from one layout's and path's two jobs."""
    by = {}
    for job in jobs:
        for s in records(files[job.tool.name], "summary"):
            key = s["strategy"] if s["strategy"] != "async" else f"async{job.staleness}"
            by[key] = s
    flat, a1, a2, bkt = (rate_of(by.get(k), fell_back)
                         for k in ("flat", "async1", "async2", "bucketed"))
    links = [s.get("link_gbps") for s in by.values() if s.get("link_gbps")]
    paths = {s["knobs"].get("transfer_path") for k, s in by.items() if k != "flat"}
    if paths - {jobs[0].transfer}:  # what ran is what the records say
        print(f"# warning: records name transfer paths {sorted(map(str, paths))}",
              file=sys.stderr)
    wrong = sum(s.get("wrong", 0) for s in by.values()) if by else None
    return [jobs[0].transfer, flat, a1, a2, bkt, ratio(a1, flat), ratio(a2, flat),
            ratio(bkt, flat), min(links) if links else None, wrong]


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
    add_output_flags(p, "async-speedup")
    return p


def check(args: argparse.Namespace, planned: list[Job], runner: Runner) -> int:
    jobs = runs(args)
    files = {job.tool.name: runner.outputs(job.tool.name)[0] for job in jobs}
    for n, s in args.layouts:
        fell_back: list[str] = []
        rows = [layout_row([j for j in jobs if j.layout == (n, s) and j.transfer == path],
                           files, fell_back) for path in args.transfer]
        footer = [f"wall-clock throughput; {args.model}, {args.compute_ms:g} ms compute, "
                  f"{args.steps} steps (+{args.warmup} warm-up), links {args.rate}",
                  f"records: {runner.outdir}"]
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
