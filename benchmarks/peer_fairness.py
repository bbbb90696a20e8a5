"""The project's bucketed against Horovod and DDP under the same replayed compute.

Every job runs on an emulated cluster (default 2 nodes x 4 ranks, links
shaped to 1 Gbit/s) that ``launch.sweep`` brings up and measures the link of,
and replays the committed H200 ResNet-50 batch-256 profile scaled by
``--compute-scale`` (default 20: backward ~1.6 s, about as long as flat's
all-reduce of 102 MB over that link, so bucketing has something to hide
behind; at scale 1 backward could hide only ~5 % of it and the comparison
would rank all-reduce libraries instead). The jobs, one at a time:

1. ``horovodrun``: ``--strategy flat,bucketed,horovod`` at 25 MB buckets, in
   one job. Under ``horovodrun`` the project's flat and bucketed run on
   Horovod's own all-reduce (the horovod backend; the transfer engine hands
   each bucket to Horovod's background thread), so this compares bucketing
   with one library underneath.
2. ``mpirun``: ``--strategy flat,bucketed,ddp`` at 25 MB (the project's
   strategies on Open MPI's all-reduce, DDP on Gloo). DDP runs here rather
   than beside Horovod: with Horovod's MPI background thread spinning beside
   Gloo's on 8 ranks sharing 2 cores, DDP's exposed sync was 2.3 s against
   0.4 s under ``mpirun`` (one run each, quiet machine).
3. ``mpirun``: ``--strategy bucketed`` at each other ``--sweep`` size; the
   best bucketed of jobs 2-3 is compared too.
4. ``mpirun``: ``--strategy flat,bucketed`` with ``--slow-rank`` (default
   1:2): transfer should stay where job 2 had it and the straggler's extra
   time show as the other ranks' wait.

It prints one table: per run, step time, exposed sync, its wait and transfer
parts (critical-path rank; a collective's transfer is the shortest duration
over ranks, a rank's wait its own minus that), overlap, and the ratios of
bucketed (25 MB and best of the sweep) to the best peer (Horovod or DDP) in
step time and exposed sync, within each launcher's job. The load average is
printed first (warning above 1.5).

Run it from the repository root, as root, with nothing else measuring::

    python -m benchmarks.peer_fairness                  # ~9 min on 2 cores (estimate)
    python -m benchmarks.peer_fairness --dry-run        # the commands only
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks.cluster_jobs import (
    ROOT,
    ToolJob,
    add_output_flags,
    execute,
    layouts,
    records,
)
from commbench.allreduce import Config
from commbench.buckets import DEFAULT_BUCKET_MB
from commbench.strategies.settings import StrategySettings
from commbench.tables import Column, format_table
from commbench.workloads.spec import slow_rank

JOB_TIMEOUT_S = 420.0
PROFILE = "profiles/h200-resnet50-b256.json"


def plan(args: argparse.Namespace) -> list[ToolJob]:
    """The jobs of the module docstring, in its order."""
    nodes, slots = args.layout

    def job(name: str, launcher: str, strategies: list[str], bucket_mb: float = DEFAULT_BUCKET_MB,
            straggler: tuple[int, float] | None = None) -> ToolJob:
        cfg = Config(model="resnet50", compute_profile=str(ROOT / PROFILE),
                     compute_scale=args.compute_scale, batch_size=256,
                     strategies=strategies, algos=["native"],
                     sync=StrategySettings(bucket_mb=bucket_mb), slow_rank=straggler,
                     steps=args.steps, warmup=args.warmup, quiet=True)
        return ToolJob(name, cfg, nodes, slots, args.rate, launcher, JOB_TIMEOUT_S)

    jobs = [job("horovodrun", "horovodrun", ["flat", "bucketed", "horovod"]),
            job("mpirun", "mpirun", ["flat", "bucketed", "ddp"])]
    jobs += [job(f"mpirun {mb:g} MB", "mpirun", ["bucketed"], mb)
             for mb in args.sweep if mb != DEFAULT_BUCKET_MB]
    if args.slow_rank:
        r, f = args.slow_rank
        jobs.append(job(f"mpirun slow {r}:{f:g}", "mpirun", ["flat", "bucketed"],
                        straggler=args.slow_rank))
    return jobs


def ms(v: float | None) -> float | None:
    return None if v is None else v * 1e3


TABLE = [Column("job", "", 16), Column("strategy", "", 9), Column("bucket", "MB", 6, ".0f"),
         Column("step", "ms", 8, ".0f"), Column("p5", "ms", 7, ".0f"),
         Column("p95", "ms", 7, ".0f"), Column("compute", "ms", 8, ".0f"),
         Column("exposed", "ms", 8, ".0f"), Column("wait", "ms", 7, ".0f"),
         Column("transfer", "ms", 8, ".0f"), Column("overlap", "", 7, ".3f"),
         Column("link", "Gbit/s", 7, ".3f"), Column("#wrong", "", 6)]


def bucket_of(s: dict) -> float | None:
    k = s.get("knobs") or {}
    return k.get("bucket_mb", k.get("bucket_cap_mb"))


def row(job: ToolJob, s: dict) -> list:
    st = s["stats"]
    return [job.name, s["strategy"], bucket_of(s), ms(st["step_s"]["median"]),
            ms(st["step_s"]["p5"]), ms(st["step_s"]["p95"]), ms(s["compute_s"]),
            ms(s["exposed_sync_s"]), ms(s.get("sync_wait_s")), ms(s.get("sync_transfer_s")),
            s.get("overlap"), s.get("link_gbps"), s.get("wrong")]


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.3f}" if a is not None and b else "n/a"


def verdicts(by_job: dict[str, list[dict]]) -> list[str]:
    """bucketed / best peer within each launcher's job, and the sweep's best bucketed."""
    out = []
    sweep = [s for name, ss in by_job.items() if name.startswith("mpirun") and "slow" not in name
             for s in ss if s["strategy"] == "bucketed"]
    best = min(sweep, key=lambda s: s["step_s"], default=None)
    for name in ("horovodrun", "mpirun"):
        ss = {s["strategy"]: s for s in by_job.get(name, [])}
        peers = [ss[p] for p in ("horovod", "ddp") if p in ss]
        if "bucketed" not in ss or not peers:
            continue
        bp = min(peers, key=lambda s: s["step_s"])
        b = ss["bucketed"]
        out.append(f"{name}: bucketed {DEFAULT_BUCKET_MB:g} MB / best peer "
                   f"({bp['strategy']}): step {ratio(b['step_s'], bp['step_s'])}, exposed sync "
                   f"{ratio(b['exposed_sync_s'], bp['exposed_sync_s'])}")
        if name == "mpirun" and best is not None:
            out.append(f"mpirun: best bucketed ({bucket_of(best):g} MB) / best peer "
                       f"({bp['strategy']}): step {ratio(best['step_s'], bp['step_s'])}, "
                       f"exposed sync {ratio(best['exposed_sync_s'], bp['exposed_sync_s'])}")
    base = {s["strategy"]: s for s in by_job.get("mpirun", [])}
    slow = [ss for name, ss in by_job.items() if "slow" in name]
    for s in slow[0] if slow else []:
        b = base.get(s["strategy"])
        if b is None:
            continue
        tr = ratio(s.get("sync_transfer_s"), b.get("sync_transfer_s"))
        out.append(f"straggler, {s['strategy']}: transfer {tr}x the run without; most any "
                   f"rank waited {ms(s.get('sync_wait_max_s')) or 0:.0f} ms vs "
                   f"{ms(b.get('sync_wait_max_s')) or 0:.0f} ms without (imbalance "
                   f"{ms(s.get('imbalance_s')) or 0:.0f} ms, straggler rank "
                   f"{s.get('straggler_rank')}); without a straggler median wait / transfer = "
                   f"{ratio(b.get('sync_wait_s'), b.get('sync_transfer_s'))}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peer_fairness",
                                description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--layout", type=lambda t: layouts(t)[0], default=(2, 4),
                   help="NODESxRANKS")
    p.add_argument("--rate", default="1gbit", help="link rate per node (tc syntax)")
    p.add_argument("--compute-scale", type=float, default=20.0,
                   help=f"factor on {PROFILE}'s times")
    p.add_argument("--sweep", type=lambda t: [float(x) for x in t.split(",")],
                   default=[10.0, 25.0, 50.0], help="bucket sizes (MB) of the project's bucketed")
    p.add_argument("--slow-rank", type=lambda t: slow_rank(t) if t else None,
                   default=(1, 2.0), metavar="R:F",
                   help="the straggler job's --slow-rank ('' for none)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    add_output_flags(p, "peer-fairness")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    jobs = plan(args)
    t0 = time.monotonic()
    done = execute(jobs, args, "peer-fairness")
    if done is None:
        return 0
    outdir = done.outdir
    by_job = {job.name: records(done.output(job), "summary") for job in jobs}
    rows = [row(job, s) for job in jobs for s in by_job[job.name]]
    n, s = args.layout
    print(format_table(TABLE, rows, title=f"peer_fairness  {n} nodes x {s} ranks  links "
                       f"{args.rate}  resnet50 {PROFILE} x {args.compute_scale:g}  "
                       f"{args.steps} steps (+{args.warmup} warm-up)",
                       footer=["medians over measured steps of the critical-path rank; wait + "
                               "transfer explain exposed sync only where nothing overlapped",
                               *verdicts(by_job),
                               f"{time.monotonic() - t0:.0f} s; records: {outdir}"]))
    return 1 if done.failed else 0


if __name__ == "__main__":
    sys.exit(main())
