"""What Horovod being initialised costs MPI traffic it does not carry, on the emulated cluster.

Under the horovod backend the project's algorithms send on MPI communicators of
their own (hierarchical's phases on MPI twins of Horovod's process sets), yet
they ran slower than the same algorithms on the mpi backend. This benchmark
isolates that: each job is plain ``mpirun`` (through ``launch.cluster run``) and
times the same all-reduces on ``MPI_COMM_WORLD``, per mode:

- ``none``: Horovod is not imported;
- ``init@C``: ``hvd.init()`` first, with ``HOROVOD_CYCLE_TIME=C`` ms (Horovod's
  background thread then coordinates every C ms); nothing is ever queued to it.

It prints, per layout, the median time of each algorithm (``native`` is Open
MPI's own ``MPI_Allreduce``; ``ring`` and ``hier`` the project's, on the mpi
communicator) and its ratio to ``none``. Each mode runs on a fresh cluster that
measures its link. Run it from the repository root, as root, with nothing else
running::

    python -m benchmarks.horovod_presence                  # ~4 min on 2 cores
    python -m benchmarks.horovod_presence --layouts 2x4 --cycle-ms 1,20,100
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from commbench.config import parse_size

from benchmarks.cluster_jobs import (
    add_output_flags,
    cluster_argv,
    execute,
    layouts,
    outdir_of,
    print_load,
)
from commbench.linkstats import GBPS_ENV
from commbench.tables import Column, format_table

ALGOS = ("native", "ring", "hier")
JOB_TIMEOUT_S = 400.0


def rank_job(mode: str, cycle_ms: int, size: int, algos: list[str], iters: int, warmup: int,
             output: Path) -> int:
    """One rank's part: time each algorithm on a world duplicate; rank 0 writes one line."""
    import torch  # noqa: I001 -- torch and MPI only in the ranks, not in the driver

    if mode == "init":
        os.environ["HOROVOD_CYCLE_TIME"] = str(cycle_ms)
        import horovod.torch as hvd

        hvd.init()
    from mpi4py import MPI  # initialises MPI (unless Horovod did)

    from commbench.comm.algos import get_algo
    from commbench.comm.mpi import MpiCommunicator

    # MPI_COMM_WORLD itself: freeing a duplicate at the end, with Horovod's thread still
    # running and owning MPI, crashed in MPI_Comm_free (1 in ~20 runs here)
    comm = MpiCommunicator(MPI.COMM_WORLD)
    tensor = torch.ones(size // 4)
    medians = {}
    for name in algos:
        algo, times = get_algo(name), []
        for _ in range(warmup + iters):
            tensor.fill_(1.0)
            comm.comm.Barrier()
            t0 = time.perf_counter()
            algo(comm, tensor)
            times.append(time.perf_counter() - t0)
        # the slowest rank's time of each call, then the median over calls
        per_call = comm.comm.allgather(times[warmup:])
        medians[name] = statistics.median(max(c) for c in zip(*per_call))
        if float(tensor[0]) != comm.comm.Get_size():
            raise SystemExit(f"{name}: wrong sum {float(tensor[0])}")
    if comm.comm.Get_rank() == 0:
        line = {"mode": mode, "cycle_ms": cycle_ms if mode == "init" else None,
                "world_size": comm.comm.Get_size(), "size": size, "iters": iters,
                "median_s": medians, "link_gbps": _link_gbps()}
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(line) + "\n")
    return 0


def _link_gbps() -> float | None:
    raw = os.environ.get(GBPS_ENV)
    return float(raw) if raw else None


TABLE = [Column("algo", "", 8), Column("mode", "", 10), Column("median", "ms", 9, ".1f"),
         Column("vs none", "", 8, ".3f")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--layouts", type=layouts, default=layouts("2x1,2x4"),
                   help="NODESxRANKS[,...]")
    p.add_argument("--rate", default="1gbit", help="link rate of the emulated cluster")
    p.add_argument("--size", default="64M", help="bytes per all-reduce (float32)")
    p.add_argument("--cycle-ms", default="1,100",
                   help="HOROVOD_CYCLE_TIME values to run with hvd.init(), comma-separated")
    p.add_argument("--algos", default=",".join(ALGOS), help="algorithms, comma-separated")
    p.add_argument("--iters", type=int, default=4, help="timed all-reduces per algorithm")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rank-job", choices=("none", "init"), help=argparse.SUPPRESS)
    p.add_argument("--cycle", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--output", type=Path, help=argparse.SUPPRESS)
    add_output_flags(p, "horovod-presence")
    args = p.parse_args(argv)
    size = parse_size(args.size)
    algos = [a for a in args.algos.split(",") if a]
    if args.rank_job:
        return rank_job(args.rank_job, args.cycle, size, algos, args.iters, args.warmup,
                        args.output)

    outdir = outdir_of(args, "horovod-presence")
    modes = [("none", 0)] + [("init", int(c)) for c in args.cycle_ms.split(",") if c]
    jobs, files = [], {}
    for nodes, slots in args.layouts:
        for mode, cycle in modes:
            out = outdir / f"{nodes}x{slots}-{mode}{cycle or ''}.jsonl"
            files[(nodes, slots, mode, cycle)] = out
            program = ["python", "-m", "benchmarks.horovod_presence", "--rank-job", mode,
                       "--cycle", str(cycle), "--size", str(size), "--algos", args.algos,
                       "--iters", str(args.iters), "--warmup", str(args.warmup),
                       "--output", str(out)]
            jobs.append((f"{nodes}x{slots} {mode} {cycle or ''}",
                         cluster_argv(nodes, slots, args.rate, program, JOB_TIMEOUT_S)))
    failed = execute(jobs, outdir, args.dry_run, JOB_TIMEOUT_S)
    if failed is None:
        return 0
    for nodes, slots in args.layouts:
        got = {}
        for mode, cycle in modes:
            path = files[(nodes, slots, mode, cycle)]
            if path.exists():
                got[(mode, cycle)] = json.loads(path.read_text())
        base = got.get(("none", 0), {}).get("median_s", {})
        rows = []
        for algo in algos:
            for (mode, cycle), rec in got.items():
                t = rec["median_s"].get(algo)
                label = "none" if mode == "none" else f"init@{cycle}ms"
                rows.append([algo, label, t * 1e3 if t else None,
                             t / base[algo] if t and base.get(algo) else None])
        gbps = next((r.get("link_gbps") for r in got.values() if r.get("link_gbps")), None)
        print(format_table(TABLE, rows, title=f"horovod_presence  {nodes}x{slots} {args.rate} "
                           f"{size / 2**20:g} MiB  link {gbps or 'not measured'} Gbit/s",
                           footer=[f"median over {args.iters} calls of the slowest rank's "
                                   f"time, after {args.warmup} warm-up; records: {outdir}"]))
    print_load("after")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
