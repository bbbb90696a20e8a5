"""Time dilation's validity test: the same jobs at K = 1, 2, 4, 8, and where they converge.

Time-dilated emulation (``commbench.dilation``) is trusted where it is checked:
a figure that the host bends moves as K grows, one that the links and the
algorithm set does not (Gupta et al., NSDI 2006: the de-dilated result stops
changing). For each K this runs, on an emulated cluster brought up at that K:

- ``commbench.allreduce`` on 2 x 4 at 1 Gbit/s with ResNet-50's replayed H200
  profile: flat (native, ring, hier), bucketed, and async with staleness 1;
- the control: flat ring on 2 x 1 at 1 Gbit/s, where ranks do not outnumber the
  cores;

then prints, per run, the median step time in emulated time (records hold
wall / K) at each K, the host verdict at each K (``commbench.hostload``), and
the K where it converges: the smallest K whose figure is within 5 % of 2K's.
Last, the check of the verdicts: every run called link-bound at K must agree
with its run at 2K within 5 %.

Run it from the repository root, as root, with nothing else running::

    python -m benchmarks.dilation                  # ~15 min on 2 cores
    python -m benchmarks.dilation --factors 1,4 --steps 3 --dry-run
"""

from __future__ import annotations

import argparse
import sys

from commbench import dilation as dil
from commbench.allreduce import Config
from commbench.hostload import LINK_BOUND, verdict
from commbench.strategies import AsyncSettings
from commbench.tables import Column, format_table
from experiments.bench import Benchmark, add_output_flags, parser, records
from experiments.job import Job
from experiments.runner import Runner

#: a de-dilated figure within this of its value at 2K has converged
CONVERGED = 0.05
PROFILE = "profiles/h200-resnet50-b256.json"
JOB_TIMEOUT_S = 900.0  # emulated; the sweep multiplies it by K


def factors(text: str) -> list[float]:
    out = []
    for x in text.split(","):
        try:
            out.append(float(dil.parse(x.strip(), "--factors")))
        except dil.DilationError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    if len(out) < 2:
        raise argparse.ArgumentTypeError("--factors: give at least two, e.g. 1,2,4,8")
    return sorted(set(out))


def build_parser() -> argparse.ArgumentParser:
    p = parser("benchmarks.dilation", __doc__)
    p.add_argument("--factors", type=factors, default=factors("1,2,4,8"),
                   help="the dilations K to run, comma-separated")
    p.add_argument("--rate", default="1gbit", help="emulated link rate")
    p.add_argument("--steps", type=int, default=3, help="measured steps per run")
    p.add_argument("--warmup", type=int, default=1, help="warm-up steps (>= async's staleness)")
    p.add_argument("--compute-scale", type=float, default=5.0,
                   help="factor on the replayed H200 profile (backward ~0.4 s: about a "
                        "quarter of flat's transfer at 1 Gbit/s, so bucketed can overlap)")
    add_output_flags(p, "dilation")
    return p


def _config(args: argparse.Namespace, strategies: list[str], algos: list[str]) -> Config:
    return Config(workload="synthetic", model="resnet50", compute_profile=PROFILE,
                  compute_scale=args.compute_scale, batch_size=256, steps=args.steps,
                  warmup=args.warmup, quiet=True, strategies=strategies, algos=algos,
                  sync=AsyncSettings(staleness=1))


def plan(args: argparse.Namespace) -> list[Job]:
    """Per K: the 2 x 4 job (every strategy) and the 2 x 1 control (each K its own: K is
    what this benchmark varies)."""
    jobs = []
    for k in args.factors:
        tag = f"k{dil.text(k)}"
        jobs.append(Job.place(f"2x4-{tag}", _config(args, ["flat", "bucketed", "async"],
                                                    ["native", "ring", "hier"]),
                              2, 4, args.rate, timeout_s=JOB_TIMEOUT_S, dilation=k))
        jobs.append(Job.place(f"2x1-{tag}", _config(args, ["flat"], ["ring"]), 2, 1,
                              args.rate, timeout_s=JOB_TIMEOUT_S, dilation=k))
    return jobs


def run_label(s: dict) -> str:
    if s["strategy"] == "flat":
        return f"flat {s['algo']}"
    if s["strategy"] == "async":
        return f"async S={s.get('knobs', {}).get('staleness', 1)}"
    return s["strategy"]


def bound(s: dict) -> str | None:
    """A run's verdict as today's criteria read its recorded host counters (so runs recorded
    before a change of the criteria are judged alike), else the one it recorded."""
    return verdict(s["host"]) if s.get("host") else s.get("bound")


def spread(s: dict) -> float:
    """A run's step-to-step spread: (p95 - p5) / median of its measured steps."""
    st = s.get("stats", {}).get("step_s", {})
    med = st.get("median") or s["step_s"]
    return (st.get("p95", med) - st.get("p5", med)) / med


def converged_at(times: dict[float, float]) -> float | None:
    """The smallest K whose figure is within ``CONVERGED`` of the next K's (2K where run)."""
    ks = sorted(times)
    for a, b in zip(ks, ks[1:]):
        if abs(times[a] - times[b]) <= CONVERGED * times[b]:
            return a
    return None


def table(args: argparse.Namespace, runs: dict[str, dict[float, dict]]) -> tuple[list, list]:
    """Rows (run, then per K its step time and verdict, then where it converged), and the
    verdict check's lines."""
    rows, checks = [], []
    ks = args.factors
    for name, by_k in runs.items():
        times = {k: s["step_s"] for k, s in by_k.items() if s.get("step_s")}
        row: list = [name]
        for k in ks:
            s = by_k.get(k)
            row += [s["step_s"] * 1e3 if s else None,
                    ("link" if bound(s) == LINK_BOUND else "host" if bound(s) else "-")
                    if s else "-"]
        at = converged_at(times)
        row.append(dil.text(at) if at else "no")
        row.append(max(spread(s) for s in by_k.values()))
        rows.append(row)
        for a, b in zip(ks, ks[1:]):
            if a in times and b in times and bound(by_k[a]) == LINK_BOUND:
                off = times[a] / times[b] - 1
                noise = max(spread(by_k[a]), spread(by_k[b]))
                checks.append(f"{name}: link-bound at K = {dil.text(a)}, {off:+.1%} against "
                              f"K = {dil.text(b)}: "
                              + ("agrees" if abs(off) <= CONVERGED else
                                 f"DISAGREES (its steps spread {noise:.0%})"))
    return rows, checks


def check(args: argparse.Namespace, jobs: list[Job], runner: Runner) -> int:
    runs: dict[str, dict[float, dict]] = {}
    for job in jobs:
        layout = job.name.split("-")[0]
        for s in records(runner.outputs(job)[0], "summary"):
            runs.setdefault(f"{layout} {run_label(s)}", {})[float(s.get("dilation") or 1)] = s
    rows, checks = table(args, runs)
    columns = [Column("run", "", 18)]
    for k in args.factors:
        columns += [Column(f"K={dil.text(k)}", "ms", 9, ".1f"), Column("", "", 4)]
    columns += [Column("conv K", "", 6), Column("spread", "", 6, ".0%")]
    print(format_table(columns, rows, title=f"dilation  ResNet-50 replayed (x "
                                            f"{args.compute_scale:g}), link {args.rate}, "
                                            f"{args.steps} steps (+{args.warmup} warm-up)",
                       footer=["step time: median over measured steps, emulated time (wall / "
                               "K); link/host: the run's verdict, today's criteria "
                               "(commbench.hostload.verdict) on its recorded host counters",
                               "spread: the largest (p95 - p5) / median of the run's steps "
                               "over its K",
                               f"conv K: the smallest K within {CONVERGED:.0%} of the next "
                               "K's figure", *checks, f"records: {runner.outdir}"]))
    return 1 if any("DISAGREES" in c for c in checks) else 0


BENCHMARK = Benchmark("dilation", build_parser, plan, check)
main = BENCHMARK.main


if __name__ == "__main__":
    sys.exit(main())
