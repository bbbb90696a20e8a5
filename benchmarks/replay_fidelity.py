"""Does replayed compute take as long as the real compute it was recorded from?

For each model, on one rank of this machine (no launcher needed), three jobs
one after another:

1. ``python -m commbench.profile`` records the model's forward and backward
   (the compute profile a GPU machine would ship), with the torch threads the
   next two jobs get (one rank alone: every core);
2. ``python -m commbench.allreduce --workload resnet`` trains the model for
   real (flat native, one rank: nothing to wait for);
3. ``python -m commbench.allreduce --compute-profile <1> --compute-scale 1``
   replays the profile on the synthetic workload, same steps.

It prints per model the profile's backward, the real run's and the replay's
backward medians (p5-p95 over the measured steps) and replay / real (goal:
within 10 %). Forward is printed beside it. Default: gpt-tiny (batch 32,
64 tokens) and resnet18 (batch 32, 64 px); ~2 min here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.cluster_jobs import add_output_flags, execute, outdir_of, records
from commbench.cores import thread_plan

STEM = "replay-fidelity"
GOAL = 0.10


def jobs_of(model: str, batch: int, steps: int, warmup: int, threads: int,
            outdir: Path) -> list[tuple[str, list[str]]]:
    prof, real, replay = (outdir / f"{model}.{k}" for k in ("profile.json", "real.jsonl",
                                                            "replay.jsonl"))
    common = ["--model", model, "--batch-size", str(batch), "--strategy", "flat",
              "--algo", "native", "--steps", str(steps), "--warmup", str(warmup),
              "--quiet"]
    py = [sys.executable, "-m"]
    return [
        (f"{model}: profile", [*py, "commbench.profile", "--model", model, "--batch-size",
                               str(batch), "--iters", str(steps), "--warmup", str(warmup),
                               "--threads", str(threads), "-o", str(prof)]),
        (f"{model}: real", [*py, "commbench.allreduce", "--workload", "resnet", *common,
                            "--output", str(real)]),
        (f"{model}: replay", [*py, "commbench.allreduce", "--compute-profile", str(prof),
                              "--compute-scale", "1", *common, "--output", str(replay)]),
    ]


def stats(path: Path, field: str) -> dict:
    summary = records(path, "summary")
    if not summary:
        raise SystemExit(f"{path}: no summary record (its job failed)")
    return summary[0]["stats"][field]


def report(models: list[str], outdir: Path) -> int:
    print(f"# replay fidelity: backward and forward of real compute against its replay, one "
          f"rank; medians (p5-p95) over measured steps; goal |replay/real - 1| <= {GOAL:.0%}")
    print(f"# {'model':>10} {'phase':>9} {'profile':>9} {'real':>23} {'replay':>23} "
          f"{'replay/real':>11}")
    print(f"# {'':>10} {'':>9} {'(ms)':>9} {'(ms)':>23} {'(ms)':>23} {'':>11}")
    worst = 0.0
    for model in models:
        prof = json.loads((outdir / f"{model}.profile.json").read_text())
        for phase in ("backward", "forward"):
            real = stats(outdir / f"{model}.real.jsonl", f"{phase}_s")
            rep = stats(outdir / f"{model}.replay.jsonl", f"{phase}_s")
            ratio = rep["median"] / real["median"]
            if phase == "backward":
                worst = max(worst, abs(ratio - 1))

            def cell(s):
                return f"{s['median'] * 1e3:7.1f} ({s['p5'] * 1e3:.1f}-{s['p95'] * 1e3:.1f})"
            print(f"  {model:>10} {phase:>9} {prof[f'{phase}_s'] * 1e3:9.1f} "
                  f"{cell(real):>23} {cell(rep):>23} {ratio:11.3f}")
    print(f"# worst backward |replay/real - 1|: {worst:.3f} "
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
    add_output_flags(p, STEM)
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    outdir = outdir_of(args, STEM)
    threads = thread_plan(1).threads  # what one rank alone on this machine computes with
    jobs = [j for m in models for j in jobs_of(m, args.batch_size, args.steps, args.warmup,
                                               threads, outdir)]
    failed = execute(jobs, outdir, args.dry_run, timeout_s=600)
    if failed is None:
        return 0
    if failed:
        return 1
    return report(models, outdir)


if __name__ == "__main__":
    sys.exit(main())
