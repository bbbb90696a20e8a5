"""What Horovod being initialised costs MPI traffic it does not carry, on the emulated cluster.

Under the horovod backend the project's algorithms send on MPI communicators of
their own (hierarchical's phases on MPI twins of Horovod's process sets), yet
they ran slower than the same algorithms on the mpi backend. This benchmark
isolates that: each job is ``commbench.microbench`` under plain ``mpirun`` on
the mpi backend, timing the same all-reduces on ``MPI_COMM_WORLD`` (with
``--sync-each``: an untimed barrier before each call, so every call starts
together), per mode:

- ``none``: Horovod is not imported;
- ``init@C``: ``--horovod-cycle-ms C``, Horovod initialised beside the
  communicator for the whole job (``hvd.init()`` with ``HOROVOD_CYCLE_TIME=C``
  ms: its background thread then coordinates every C ms); nothing is ever
  queued to it.

It prints, per layout, each algorithm's time per call (``native`` is Open
MPI's own ``MPI_Allreduce``; ``ring`` and ``hier`` the project's, on the mpi
communicator) as the microbenchmark's ``max``: the slowest rank's mean over
the timed calls, and its ratio to ``none``, with ``#wrong``. The modes of a
layout run one after another on one emulated cluster (``launch.sweep`` brings
it up and measures its link). Run it from the repository root, as root, with
nothing else running::

    python -m benchmarks.horovod_presence                  # ~4 min on 2 cores
    python -m benchmarks.horovod_presence --layouts 2x4 --cycle-ms 1,20,100
    python -m benchmarks.horovod_presence --dry-run        # the commands only
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from commbench.flags import csv_list, parse_size, positive_float
from commbench.microbench import MicroConfig
from commbench.tables import Column, format_table
from experiments.bench import Benchmark, add_output_flags, layouts, parser, records
from experiments.job import Job
from experiments.runner import Runner

ALGOS = ("native", "ring", "hier")
JOB_TIMEOUT_S = 400.0
STEM = "horovod-presence"


def mode_label(cycle_ms: float | None) -> str:
    return "none" if cycle_ms is None else f"init@{cycle_ms:g}ms"


def build_parser() -> argparse.ArgumentParser:
    p = parser("benchmarks.horovod_presence", __doc__)
    p.add_argument("--layouts", type=layouts, default=layouts("2x1,2x4"),
                   help="NODESxRANKS[,...]")
    p.add_argument("--rate", default="1gbit", help="link rate of the emulated cluster")
    p.add_argument("--size", type=parse_size, default=parse_size("64M"),
                   help="bytes per all-reduce (float32)")
    p.add_argument("--cycle-ms", type=lambda t: [positive_float(x) for x in t.split(",") if x],
                   default=[1.0, 100.0],
                   help="HOROVOD_CYCLE_TIME values to run with Horovod initialised, "
                        "comma-separated")
    p.add_argument("--algos", type=csv_list(ALGOS, "--algos"), default=list(ALGOS),
                   help="algorithms, comma-separated")
    p.add_argument("--iters", type=int, default=4, help="timed all-reduces per algorithm")
    p.add_argument("--warmup", type=int, default=2)
    add_output_flags(p, STEM)
    return p


def plan(args: argparse.Namespace) -> list[Job]:
    """One microbenchmark job per layout and mode (none, then each cycle time); a layout's
    modes are one compared set."""
    jobs = []
    for nodes, slots in args.layouts:
        for cycle in [None, *args.cycle_ms]:
            cfg = MicroConfig(backend="mpi", minbytes=args.size, maxbytes=args.size,
                              algos=list(args.algos), iters=args.iters,
                              warmup_iters=args.warmup, sync_each=True,
                              horovod_cycle_ms=cycle, quiet=True)
            jobs.append(Job.place(f"{nodes}x{slots}-{mode_label(cycle)}", cfg, nodes, slots,
                                  args.rate, timeout_s=JOB_TIMEOUT_S,
                                  sets={f"{nodes}x{slots}"}))
    return jobs


TABLE = [Column("algo", "", 8), Column("mode", "", 12), Column("time", "ms", 9, ".1f"),
         Column("vs none", "", 8, ".3f"), Column("#wrong", "", 6)]


def layout_table(jobs: list[Job], files: dict[str, Path], title: str,
                 footer: list[str]) -> str:
    """One layout's table: per algorithm, each mode's slowest-rank time and its ratio to
    the mode without Horovod."""
    got = {job.config.horovod_cycle_ms: {r["algo"]: r for r in records(files[job.name],
                                                                       "microbench")}
           for job in jobs}
    base = got.get(None, {})
    rows = []
    for algo in jobs[0].config.algos:
        for cycle, by_algo in got.items():
            rec = by_algo.get(algo)
            t = rec["time_us"]["max"] / 1e6 if rec else None
            t0 = base[algo]["time_us"]["max"] / 1e6 if algo in base else None
            rows.append([algo, mode_label(cycle), t * 1e3 if t else None,
                         t / t0 if t and t0 else None, rec["wrong"] if rec else None])
    gbps = next((r.get("link_gbps") for by in got.values() for r in by.values()
                 if r.get("link_gbps")), None)
    return format_table(TABLE, rows, title=f"{title}  link {gbps or 'not measured'} Gbit/s",
                        footer=footer)


def check(args: argparse.Namespace, jobs: list[Job], runner: Runner) -> int:
    outdir = runner.outdir
    files = {job.name: runner.outputs(job)[0] for job in jobs}
    for nodes, slots in args.layouts:
        mine = [j for j in jobs if (j.placement.nodes, j.placement.slots) == (nodes, slots)]
        print(layout_table(mine, files, f"horovod_presence  {nodes}x{slots} {args.rate} "
                           f"{args.size / 2**20:g} MiB",
                           [f"time: the slowest rank's mean over {args.iters} calls, each "
                            f"after an untimed barrier, after {args.warmup} warm-up; "
                            f"records: {outdir}"]))
    return 0


BENCHMARK = Benchmark(STEM, build_parser, plan, check)
main = BENCHMARK.main


if __name__ == "__main__":
    sys.exit(main())
