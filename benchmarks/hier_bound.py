"""Each all-reduce algorithm against its link bound on the emulated cluster, per layout.

For each case (layout, link rate, message size; default the four of issue
"hierarchical at its link bound": 2x1, 2x2, 2x4 at 1 Gbit/s with 64 MiB and
2x4 at 200 Mbit/s with 16 MiB) it runs ``commbench.microbench`` with
``--algo native,ring,hier,hier-leader`` on an emulated cluster of the case's
shape that ``launch.sweep`` brings up and measures the link of, then prints
per algorithm:

- time per all-reduce (the microbenchmark's ``avg``: mean over ranks of each
  rank's own loop);
- the bytes the algorithm sends through the busiest node link, per direction,
  as the cost model counts them (``analysis.costmodel.link_bytes``): the ring
  ``2(n-1)/n * S`` over n ranks (ranks on a node are contiguous, so each node
  has one ring edge leaving it); hierarchical and the leader variant
  ``2(N-1)/N * S`` over N nodes (each shard, or the leader's whole tensor,
  all-reduced across nodes); ``native`` (the library's choice, unknown) the
  least of the flat algorithms' (ring, recursive doubling, Rabenseifner);
- link efficiency = those bytes / the measured link rate (``link_gbps``, the
  payload rate the cluster's link test saw) / the time;
- the slowest rank's time in each phase (reduce-scatter / all-gather for the
  ring; intra-node, inter-node, intra-node for the two-level algorithms).
  Where the two-level algorithms run pipelined (``hier_segments`` > 1), each
  phase is its span from first segment to last, and the spans overlap.

With ``--launchers mpirun,torchrun`` every case runs once per launcher, each its own
job: under torchrun the tools take the torch backend on Gloo, so ``native`` is Gloo's
all-reduce and ``ring`` the project's ring on Gloo's point-to-point messages, beside
Open MPI's native and the ring on MPI; rows name their backend, and "vs ring" / "vs
native" compare within a backend.

Run it from the repository root, as root, with nothing else running::

    python -m benchmarks.hier_bound               # ~6 min on 2 cores
    python -m benchmarks.hier_bound --dry-run
    python -m benchmarks.hier_bound --cases 2x4@200mbit@16M --iters 10
    python -m benchmarks.hier_bound --cases 2x2@1gbit@64M --launchers mpirun,torchrun \
        --algos native,ring
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from analysis.costmodel import link_bytes
from commbench import hostload
from commbench.flags import csv_list, parse_size
from commbench.microbench import MicroConfig
from commbench.tables import Column, format_table
from experiments.bench import Benchmark, add_output_flags, parse_layout, parser, records
from experiments.job import Job
from experiments.runner import Runner
from launch.commands import LAUNCHERS

DEFAULT_CASES = "2x1@1gbit@64M,2x2@1gbit@64M,2x4@1gbit@64M,2x4@200mbit@16M"
ALGOS = ("native", "ring", "hier", "hier-leader")
JOB_TIMEOUT_S = 400.0


@dataclass(frozen=True)
class Case:
    nodes: int
    slots: int
    rate: str
    size: int  # bytes

    @property
    def label(self) -> str:
        return f"{self.nodes}x{self.slots} {self.rate} {self.size / 2**20:g} MiB"

    @property
    def stem(self) -> str:
        return f"{self.nodes}x{self.slots}-{self.rate}-{self.size}"


def parse_case(text: str) -> Case:
    parts = text.strip().split("@")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"case {text!r}: write NODESxRANKS@RATE@SIZE, e.g. "
                                         "2x4@200mbit@16M")
    nodes, slots = parse_layout(parts[0])
    return Case(nodes, slots, parts[1], parse_size(parts[2]))


def cases(text: str) -> list[Case]:
    return [parse_case(x) for x in text.split(",") if x.strip()]


def case_link_bytes(algo: str, case: Case) -> float:
    """Bytes through the busiest node link, one direction (the cost model's)."""
    return link_bytes(algo, case.size, case.nodes * case.slots, case.nodes, case.slots)


TABLE = [Column("algo", "", 11), Column("backend", "", 10), Column("time", "ms", 9, ".1f"),
         Column("link bytes", "MB", 10, ".1f"), Column("bound", "ms", 9, ".1f"),
         Column("link eff", "", 8, ".3f"), Column("vs ring", "", 7, ".3f"),
         Column("vs native", "", 9, ".3f"), Column("phase 1", "ms", 8, ".1f"),
         Column("phase 2", "ms", 8, ".1f"), Column("phase 3", "ms", 8, ".1f"),
         Column("#wrong", "", 6)]


def case_rows(case: Case, recs: list[dict]) -> tuple[list[list], str, list[str]]:
    """Table rows of one case (per backend, per algorithm), the link rate seen, and the
    phase names per algorithm."""
    recs = [r for r in recs if r["size"] == case.size]
    gbps = next((r.get("link_gbps") for r in recs if r.get("link_gbps")), None)
    rows, names = [], []
    for backend in dict.fromkeys(r["backend"] for r in recs):
        by = {r["algo"]: r for r in recs if r["backend"] == backend}
        t = {a: r["time_us"]["avg"] / 1e6 for a, r in by.items()}
        for algo in ALGOS:
            if algo not in by:
                continue
            nbytes = case_link_bytes(algo, case)
            bound = nbytes * 8 / (gbps * 1e9) if gbps and nbytes else None
            phases = list((by[algo].get("phases_us") or {}).items())
            if phases:
                segs = by[algo].get("hier_segments")
                how = f" (pipelined in {segs} segments: spans overlap)" if (segs or 1) > 1 \
                    else ""
                names.append(f"{algo} [{backend}]{how}: " + ", ".join(k for k, _ in phases))
            ph = [v / 1e3 for _, v in phases] + [None] * (3 - len(phases))
            rows.append([algo, backend, t[algo] * 1e3, nbytes / 1e6,
                         bound * 1e3 if bound else None, bound / t[algo] if bound else None,
                         t[algo] / t["ring"] if "ring" in t else None,
                         t[algo] / t["native"] if "native" in t else None, *ph[:3],
                         by[algo]["wrong"]])
    return rows, f"{gbps:.3f}" if gbps else "not measured", list(dict.fromkeys(names))


def build_parser() -> argparse.ArgumentParser:
    p = parser("benchmarks.hier_bound", __doc__)
    p.add_argument("--cases", type=cases, default=cases(DEFAULT_CASES),
                   help="NODESxRANKS@RATE@SIZE[,...]")
    p.add_argument("--algos", type=csv_list(ALGOS, "--algos"), default=list(ALGOS),
                   help="algorithms, comma-separated")
    p.add_argument("--launchers", type=csv_list(LAUNCHERS, "--launchers"), default=["mpirun"],
                   help="launchers, one job each per case: mpirun (MPI), torchrun (the torch "
                        "backend on Gloo), horovodrun")
    p.add_argument("--iters", type=int, default=5, help="timed all-reduces per algorithm")
    p.add_argument("--warmup", type=int, default=2)
    add_output_flags(p, "hier-bound")
    return p


def plan(args: argparse.Namespace) -> list[Job]:
    """One microbenchmark job per case and launcher; a case's launchers are one compared
    set."""
    several = len(args.launchers) > 1
    config = [MicroConfig(minbytes=case.size, maxbytes=case.size, algos=list(args.algos),
                          iters=args.iters, warmup_iters=args.warmup, quiet=True)
              for case in args.cases]
    return [Job.place(f"{case.stem}-{launcher}" if several else case.stem, cfg, case.nodes,
                      case.slots, case.rate, launcher=launcher, timeout_s=JOB_TIMEOUT_S,
                      sets={case.stem})
            for case, cfg in zip(args.cases, config) for launcher in args.launchers]


def check(args: argparse.Namespace, jobs: list[Job], runner: Runner) -> int:
    outdir = runner.outdir
    per_case = len(args.launchers)
    for i, case in enumerate(args.cases):
        recs = [r for job in jobs[i * per_case:(i + 1) * per_case]
                for r in records(runner.outputs(job)[0], "microbench")]
        rows, gbps, names = case_rows(case, recs)
        host = hostload.footer_lines([r for r in recs if r["size"] == case.size],
                                     lambda r: f"{r['algo']} [{r['backend']}]",
                                     next((r["dilation"] for r in recs if "dilation" in r), 1))
        print(format_table(TABLE, rows, title=f"hier_bound  {case.label}  link {gbps} Gbit/s",
                           footer=[*[f"phases {n}" for n in names], *host,
                                   "link eff = link bytes / link rate / time (1.0 = at the "
                                   "link); bound = link bytes / link rate (the cost model's "
                                   "bytes: analysis.costmodel.link_bytes)",
                                   f"records: {outdir}"]))
    return 0


BENCHMARK = Benchmark("hier-bound", build_parser, plan, check)
main = BENCHMARK.main


if __name__ == "__main__":
    sys.exit(main())
