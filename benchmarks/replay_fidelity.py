"""Does replayed compute take as long as the real compute it was recorded from?

For each model, on one rank (a one-node emulated cluster, links unshaped:
``launch.sweep`` runs every job under a launcher, and there Open MPI leaves
the rank's placement to the kernel, where plain ``mpirun`` would bind one
rank to one core), three jobs one after another:

1. ``python -m commbench.profile`` records the model's forward and backward
   (the compute profile a GPU machine would ship), with the torch threads the
   next two jobs get (one rank alone: every core);
2. ``python -m commbench.allreduce --workload real`` trains the model for
   real (flat native, one rank: nothing to wait for);
3. ``python -m commbench.allreduce --compute-profile <1> --compute-scale 1``
   replays the profile on the synthetic workload, same steps.

It prints per model the profile's backward, the real run's and the replay's
backward medians (p5-p95 over the measured steps) and replay / real (goal:
within 10 %), per repeat and as the median over ``--repeats`` (3): the
three jobs run in turn that many times, since one process computes up to
~10 % faster or slower than the next on this machine. Forward is printed
beside it. Default: gpt-tiny (batch 32, 64 tokens) and resnet18 (batch 32,
64 px); ~3 min here. Run it from the repository root, as root (the cluster
needs network namespaces)::

    python -m benchmarks.replay_fidelity
    python -m benchmarks.replay_fidelity --models resnet18 --repeats 1 --dry-run
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from commbench.allreduce import Config
from commbench.cores import thread_plan
from commbench.profile import ProfileConfig
from commbench.profilefile import read as read_profile
from experiments.bench import Benchmark, add_output_flags, output_of, parser, records
from experiments.job import Job
from experiments.runner import Runner

STEM = "replay-fidelity"
GOAL = 0.10
JOB_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Repeat:
    """One repeat of one model: its profile, real-run and replay jobs."""

    model: str
    rep: int
    profile: Job
    real: Job
    replay: Job

    @property
    def jobs(self) -> list[Job]:
        return [self.profile, self.real, self.replay]


def one_rank(name: str, config: object, dilation: float | str | None, model: str) -> Job:
    """A job on one rank; ``dilation`` is set here, not by the runner, because the replay
    names the profile job's results file (``output_of``), whose id includes it."""
    return Job.place(name, config, nodes=1, slots=1, rate="none", timeout_s=JOB_TIMEOUT_S,
                     dilation=dilation, sets={model})


def repeats(args: argparse.Namespace) -> list[Repeat]:
    """Profile, real run and replay of each model, ``--repeats`` times in turn."""
    threads = thread_plan(1).threads  # what one rank alone on this machine computes with
    out = []
    for rep in range(args.repeats):
        for model in args.models:
            profile = one_rank(f"{model}-{rep}-profile", ProfileConfig(
                model=model, batch_size=args.batch_size, iters=args.steps,
                warmup=args.warmup, threads=threads), args.dilation, model)
            run = Config(model=model, batch_size=args.batch_size, strategies=["flat"],
                         algos=["native"], steps=args.steps, warmup=args.warmup, quiet=True)
            real = one_rank(f"{model}-{rep}-real", replace(run, workload="real"), args.dilation,
                            model)
            replay = one_rank(f"{model}-{rep}-replay", replace(
                run, compute_profile=str(output_of(profile, args.outdir))), args.dilation,
                model)
            out.append(Repeat(model, rep, profile, real, replay))
    return out


def stats(path: Path, field: str) -> dict:
    summary = records(path, "summary")
    if not summary:
        raise SystemExit(f"{path}: no summary record (its job failed)")
    return summary[0]["stats"][field]


def report(repeats: list[Repeat], files: dict[str, Path]) -> int:
    print(f"# replay fidelity: backward and forward of real compute against its replay, one "
          f"rank; medians (p5-p95) over measured steps; goal |replay/real - 1| <= {GOAL:.0%} "
          f"in the median of the repeats")
    print(f"# {'model':>10} {'#':>2} {'phase':>9} {'profile':>9} {'real':>23} {'replay':>23} "
          f"{'replay/real':>11}")
    print(f"# {'':>10} {'':>2} {'':>9} {'(ms)':>9} {'(ms)':>23} {'(ms)':>23} {'':>11}")

    def cell(s: dict) -> str:
        return f"{s['median'] * 1e3:7.1f} ({s['p5'] * 1e3:.1f}-{s['p95'] * 1e3:.1f})"

    worst = 0.0
    for model in dict.fromkeys(r.model for r in repeats):
        ratios: dict[str, list[float]] = {"backward": [], "forward": []}
        for r in (r for r in repeats if r.model == model):
            prof = read_profile(files[r.profile.name])
            for phase in ratios:
                real = stats(files[r.real.name], f"{phase}_s")
                rep_s = stats(files[r.replay.name], f"{phase}_s")
                ratios[phase].append(rep_s["median"] / real["median"])
                prof_s = getattr(prof, f"{phase}_s")
                print(f"  {model:>10} {r.rep:>2} {phase:>9} {prof_s * 1e3:9.1f} "
                      f"{cell(real):>23} {cell(rep_s):>23} {ratios[phase][-1]:11.3f}")
        for phase, x in ratios.items():
            print(f"# {model} {phase}: replay/real median {statistics.median(x):.3f} "
                  f"(repeats {min(x):.3f}-{max(x):.3f})")
        worst = max(worst, abs(statistics.median(ratios["backward"]) - 1))
    print(f"# worst backward |median replay/real - 1|: {worst:.3f} "
          f"({'within' if worst <= GOAL else 'outside'} the {GOAL:.0%} goal)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = parser("benchmarks.replay_fidelity", __doc__, defaults=False)
    p.add_argument("--models", type=lambda t: [m for m in t.split(",") if m],
                   default=["gpt-tiny", "resnet18"],
                   help="comma-separated (registered names or package.module:factory)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3,
                   help="profile, real run and replay this many times each, in turn: the "
                        "real run's speed drifts between processes by as much as the goal")
    add_output_flags(p, STEM)
    return p


def plan(args: argparse.Namespace) -> list[Job]:
    return [j for r in repeats(args) for j in r.jobs]


def check(args: argparse.Namespace, jobs: list[Job], runner: Runner) -> int:
    return report(repeats(args), {j.name: runner.outputs(j)[0] for j in jobs})


def refuse(args: argparse.Namespace) -> str | None:
    if args.dilation == "auto":
        return ("--dilation auto: the replay names its profile's results file before a K "
                "could be chosen; give K (replay_fidelity runs one rank: 1 suffices)")
    return None


BENCHMARK = Benchmark(STEM, build_parser, plan, check, refuse)
main = BENCHMARK.main


if __name__ == "__main__":
    sys.exit(main())
