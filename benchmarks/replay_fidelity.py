"""Does replayed compute take as long as the real compute it was recorded from?

For each model, on one rank of this machine (no launcher needed), three jobs
one after another:

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
64 px); ~3 min here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchmarks.cluster_jobs import add_output_flags, execute, outdir_of, records
from commbench.cores import thread_plan

STEM = "replay-fidelity"
GOAL = 0.10


def files(outdir: Path, model: str, rep: int) -> tuple[Path, Path, Path]:
    """Repeat ``rep``'s profile, real-run and replay files for ``model``."""
    return tuple(outdir / f"{model}.{rep}.{k}"
                 for k in ("profile.json", "real.jsonl", "replay.jsonl"))


def jobs_of(model: str, batch: int, steps: int, warmup: int, threads: int,
            outdir: Path, rep: int) -> list[tuple[str, list[str]]]:
    prof, real, replay = files(outdir, model, rep)
    common = ["--model", model, "--batch-size", str(batch), "--strategy", "flat",
              "--algo", "native", "--steps", str(steps), "--warmup", str(warmup),
              "--quiet"]
    py = [sys.executable, "-m"]
    return [
        (f"{model} #{rep}: profile",
         [*py, "commbench.profile", "--model", model, "--batch-size", str(batch), "--iters",
          str(steps), "--warmup", str(warmup), "--threads", str(threads), "-o", str(prof)]),
        (f"{model} #{rep}: real",
         [*py, "commbench.allreduce", "--workload", "real", *common, "--output", str(real)]),
        (f"{model} #{rep}: replay",
         [*py, "commbench.allreduce", "--compute-profile", str(prof), "--compute-scale", "1",
          *common, "--output", str(replay)]),
    ]


def stats(path: Path, field: str) -> dict:
    summary = records(path, "summary")
    if not summary:
        raise SystemExit(f"{path}: no summary record (its job failed)")
    return summary[0]["stats"][field]


def report(models: list[str], outdir: Path, repeats: int) -> int:
    print(f"# replay fidelity: backward and forward of real compute against its replay, one "
          f"rank; medians (p5-p95) over measured steps; goal |replay/real - 1| <= {GOAL:.0%} "
          f"in the median of {repeats} repeats")
    print(f"# {'model':>10} {'#':>2} {'phase':>9} {'profile':>9} {'real':>23} {'replay':>23} "
          f"{'replay/real':>11}")
    print(f"# {'':>10} {'':>2} {'':>9} {'(ms)':>9} {'(ms)':>23} {'(ms)':>23} {'':>11}")

    def cell(s: dict) -> str:
        return f"{s['median'] * 1e3:7.1f} ({s['p5'] * 1e3:.1f}-{s['p95'] * 1e3:.1f})"

    worst = 0.0
    for model in models:
        ratios = {"backward": [], "forward": []}
        for rep in range(repeats):
            prof_path, real_path, replay_path = files(outdir, model, rep)
            prof = json.loads(prof_path.read_text())
            for phase in ratios:
                real, rep_s = stats(real_path, f"{phase}_s"), stats(replay_path, f"{phase}_s")
                ratios[phase].append(rep_s["median"] / real["median"])
                print(f"  {model:>10} {rep:>2} {phase:>9} {prof[f'{phase}_s'] * 1e3:9.1f} "
                      f"{cell(real):>23} {cell(rep_s):>23} {ratios[phase][-1]:11.3f}")
        for phase, r in ratios.items():
            print(f"# {model} {phase}: replay/real median {statistics.median(r):.3f} "
                  f"(repeats {min(r):.3f}-{max(r):.3f})")
        worst = max(worst, abs(statistics.median(ratios["backward"]) - 1))
    print(f"# worst backward |median replay/real - 1|: {worst:.3f} "
          f"({'within' if worst <= GOAL else 'outside'} the {GOAL:.0%} goal)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.replay_fidelity",
                                description=__doc__.splitlines()[0])
    p.add_argument("--models", default="gpt-tiny,resnet18",
                   help="comma-separated (registered names or package.module:factory)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3,
                   help="profile, real run and replay this many times each, in turn: the "
                        "real run's speed drifts between processes by as much as the goal")
    add_output_flags(p, STEM)
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    outdir = outdir_of(args, STEM)
    threads = thread_plan(1).threads  # what one rank alone on this machine computes with
    jobs = [j for rep in range(args.repeats) for m in models
            for j in jobs_of(m, args.batch_size, args.steps, args.warmup, threads, outdir, rep)]
    failed = execute(jobs, outdir, args.dry_run, timeout_s=600)
    if failed is None:
        return 0
    if failed:
        return 1
    return report(models, outdir, args.repeats)


if __name__ == "__main__":
    sys.exit(main())
