"""Convergence study of stale updates: time-to-accuracy, final accuracy, throughput vs s.

Trains a real model on a real labelled data set that ships in a package
(scikit-learn's digits, ``commbench.workloads.data``; default model the small
CNN of ``commbench.models.small``) once per configuration, in one job:

* ``async`` with each staleness s of ``--staleness`` (default 0,1,2,4,8) and
  each of ``--mitigations``: ``none``; ``lr`` (learning rate x 1/s, Zhang et
  al. 2016); ``warmup`` (the first ``--staleness-warmup`` steps synchronous).
  s = 0 with ``none`` is synchronous training: the reference.
* ``ps`` (rank 0 serves, the others work), without and with ``lr`` (per
  gradient, 1/its staleness), unless ``--no-ps``. Each worker runs
  ``ceil(steps * N / (N - 1))`` steps, so ps sees as many samples as the
  async runs (N ranks x steps batches).

Every configuration runs once per seed of ``--seeds`` (default 0; ``--seed S``
is ``--seeds S``): the seed sets the initial weights and the held-out split.
Seed by seed, each with all its configurations (synchronous first), so a job
cut short holds whole seeds, and each seed's runs are compared with its own
synchronous run. One seed's time-to-accuracy is one draw: ``analysis.convergence``
pools the seeds of each configuration.

Every rank evaluates held-out accuracy every ``--eval-every`` steps (all at
once, so none waits for another's evaluation; outside the timed steps).
Wall time is the sum over steps of the slowest rank's step plus its wait in
the step's opening barrier (ps: the server's clock, evaluation excluded).

Records (JSON Lines, rank 0): ``train_step`` per step (async) or per update
(ps) with the training loss (mean over ranks; ps: the pushing worker's),
cumulative wall time and, where evaluated, held-out accuracy; one
``staleness_summary`` per configuration and seed with time-to-accuracy (wall
time until held-out accuracy first reaches ``--target-accuracy``, null if
never), final accuracy, throughput and throughput relative to the synchronous
run of the same seed. Every record of a run carries its ``seed``.

Launch::

    mpirun -np 4 python -m commbench.staleness
    mpirun -np 4 python -m commbench.staleness --staleness 0,2,8 --mitigations none,lr \\
        --steps 300 --target-accuracy 0.9 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, replace

from commbench import dilation, flags, latency, metrics
from commbench.comm import BACKENDS
from commbench.flags import (
    ConfigError,
    ToolConfig,
    csv_list,
    flag,
    fraction,
    momentum_value,
    nonneg_int,
    positive_float,
    positive_int,
)
from commbench.jobtime import Seconds, Where, real_pass_s
from commbench.lifecycle import run_job
from commbench.models.registry import MODELS
from commbench.output import Output
from commbench.paramserver import PSSettings, run_ps, summarize_updates
from commbench.paramserver import check as check_ps
from commbench.results import run_fields
from commbench.steploop import run_steps
from commbench.strategies import AsyncSettings, make_strategy
from commbench.tables import Column
from commbench.timing import StepTimer
from commbench.workloads import make_workload
from commbench.workloads.real import MIN_IMAGE_SIZE
from commbench.workloads.spec import WorkloadSpec

PROG = "commbench.staleness"
MITIGATIONS = ("none", "lr", "warmup")


def _int_list(text: str) -> list[int]:
    out = []
    for x in csv_list(None, "--staleness")(text):
        try:
            v = int(x)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected integers, got {x!r}") from None
        if v < 0:
            raise argparse.ArgumentTypeError(f"staleness must be >= 0, got {v}")
        out.append(v)
    return out


def _seed_list(text: str) -> list[int]:
    """``--seeds``: distinct integers >= 0, comma-separated."""
    out: list[int] = []
    for x in csv_list(None, "--seeds")(text):
        v = nonneg_int(x)
        if v in out:
            raise argparse.ArgumentTypeError(f"seed {v} given twice")
        out.append(v)
    return out


@dataclass
class StudyConfig(ToolConfig):
    """The convergence study's flags (its own training defaults: a small CNN on digits)."""

    staleness: list[int] = flag("--staleness", default_factory=lambda: [0, 1, 2, 4, 8],
                                type=_int_list, metavar="S[,S]",
                                help="staleness values of the async runs")
    mitigations: list[str] = flag(
        "--mitigations", default_factory=lambda: list(MITIGATIONS),
        type=csv_list(MITIGATIONS, "--mitigations"), metavar="NAME[,NAME]",
        help="none; lr = learning rate x 1/s; warmup = the first --staleness-warmup steps "
             "synchronous")
    ps: bool = flag("--no-ps", default=True, action="store_false",
                    help="skip the parameter-server runs (they need >= 2 ranks)")
    staleness_warmup: int = flag("--staleness-warmup", default=20, type=nonneg_int,
                                 metavar="N",
                                 help="synchronous steps before staleness starts (mitigation "
                                      "warmup)")
    steps: int = flag("--steps", default=200, type=positive_int, help="steps per run")
    eval_every: int = flag("--eval-every", default=10, type=positive_int,
                           help="evaluate held-out accuracy every this many steps (ps: "
                                "updates x ranks / workers)")
    target_accuracy: float = flag("--target-accuracy", default=0.9, type=fraction,
                                  help="held-out accuracy that time-to-accuracy is measured to")
    model: str = flag("--model", default="smallcnn", choices=tuple(MODELS),
                      help="model trained (smallcnn: 25.6k parameters, fast on CPU)")
    lr: float = flag("--lr", default=0.02, type=positive_float,
                     help="SGD rate; 0.05 diverges even synchronously on 4 ranks (momentum 0.9)")
    momentum: float = flag("--momentum", default=0.9, type=momentum_value,
                           help="SGD momentum, in [0, 1)")
    batch_size: int = flag("--batch-size", default=32, type=positive_int,
                           help="images per rank per step")
    image_size: int = flag("--image-size", default=32, type=positive_int,
                           help="digits are resized to this (at least 32)")
    seeds: list[int] = flag("--seeds", default_factory=lambda: [0], type=_seed_list,
                            metavar="SEED[,SEED]",
                            help="run every configuration once per seed (initial weights and "
                                 "held-out split), seed by seed")
    #: ``--seed S``, the former flag of one seed: moved into ``seeds`` (``__post_init__``)
    seed: int | None = flag("--seed", default=None, type=nonneg_int, metavar="SEED",
                            help="one seed: the same as --seeds SEED")

    def __post_init__(self) -> None:
        # seed=S (--seed S) runs seed S alone, as seeds=[S] (--seeds S) does; with seeds
        # other than the default beside it, which one is meant is unknown
        if self.seed is None:
            return
        if self.seeds not in ([0], [self.seed]):
            raise ValueError(f"--seed {self.seed} and --seeds "
                             f"{','.join(map(str, self.seeds))}: give one of them")
        self.seeds, self.seed = [self.seed], None

    def workload_spec(self, seed: int | None = None) -> WorkloadSpec:
        """The workload every run of ``seed`` (default: the first of ``seeds``) trains: the
        model on digits, on the CPU."""
        return WorkloadSpec(workload="real", model=self.model, batch_size=self.batch_size,
                            num_classes=10, image_size=self.image_size, device="cpu",
                            dataset="digits", lr=self.lr, momentum=self.momentum,
                            seed=self.seeds[0] if seed is None else seed)

    def emulated_s(self, where: Where) -> Seconds:
        """How long the study takes on ``where`` (``commbench.jobtime``): real passes of the
        small model, every run of every seed, its evaluations included (host work: the
        gradient's transfers are small beside them)."""
        step = real_pass_s(0, self.batch_size, self.image_size) * where.share
        return Seconds(0.0, where.startup_s() + len(seeded_runs(self)) * self.steps * step * 1.2)

    def probe(self) -> StudyConfig:
        """The study shortened for a dilation probe: its first seed, 10 steps."""
        return replace(self, seeds=self.seeds[:1], steps=max(10, max(self.staleness)),
                       eval_every=10, quiet=True)


def build_parser() -> argparse.ArgumentParser:
    p = flags.tool_parser(
        f"python -m {PROG}",
        "Train on scikit-learn's digits under bounded staleness s and a parameter server; "
        "report time-to-accuracy, final accuracy and throughput relative to synchronous "
        "training. Run it under mpirun (or torchrun).",
        ["mpirun -np 4 python -m commbench.staleness",
         "torchrun --nproc-per-node 4 -m commbench.staleness",
         "mpirun -np 4 python -m commbench.staleness --staleness 0,4 --mitigations none,lr "
         "--no-ps"])
    flags.add_fields(p.add_argument_group("study"), StudyConfig,
               ["staleness", "mitigations", "ps", "staleness_warmup", "steps", "eval_every",
                "target_accuracy"])
    g = p.add_argument_group("training")
    flags.add_fields(g, StudyConfig, ["model", "lr", "momentum", "batch_size", "image_size",
                                      "seeds", "seed"])
    flags.add_backend_flag(g, BACKENDS)
    flags.add_output_group(p, "staleness")
    return p


def parse_study(argv: list[str] | None = None) -> StudyConfig:
    # seeds=None in the namespace: argparse leaves it there unless --seeds is given, which
    # tells --seeds at its default from --seeds given (--help still shows the default)
    ns = build_parser().parse_args(sys.argv[1:] if argv is None else argv,
                                   namespace=argparse.Namespace(seeds=None))
    if ns.seed is not None and ns.seeds is not None:
        raise ConfigError(f"--seed {ns.seed} and --seeds {','.join(map(str, ns.seeds))}: "
                          "give one of them (--seed S is --seeds S)")
    if ns.seeds is None:
        del ns.seeds  # the field's default (or --seed's one seed: StudyConfig.__post_init__)
    cfg = StudyConfig(**flags.values_for(StudyConfig, ns))
    if max(cfg.staleness) > cfg.steps:
        raise ConfigError(f"--staleness {max(cfg.staleness)}: larger than --steps {cfg.steps}")
    if cfg.staleness_warmup >= cfg.steps and "warmup" in cfg.mitigations:
        raise ConfigError(f"--staleness-warmup {cfg.staleness_warmup}: must be below --steps "
                          f"{cfg.steps}, or no step runs stale")
    if cfg.image_size < MIN_IMAGE_SIZE:
        raise ConfigError(f"--image-size: {cfg.image_size} px is too small (at least "
                          f"{MIN_IMAGE_SIZE})")
    flags.check_output(cfg)
    return cfg


def runs_of(cfg: StudyConfig) -> list[tuple[str, int | None, str]]:
    """(strategy, staleness, mitigation) of every run, synchronous first."""
    runs = [("async", 0, "none")]
    for s in cfg.staleness:
        for m in cfg.mitigations:
            if s == 0 and m != "none":
                continue  # nothing to mitigate: the same run as synchronous
            if (s, m) != (0, "none"):
                runs.append(("async", s, m))
    if cfg.ps:
        runs += [("ps", None, "none")] + ([("ps", None, "lr")] if "lr" in cfg.mitigations
                                           else [])
    return runs


def seeded_runs(cfg: StudyConfig) -> list[tuple[int, str, int | None, str]]:
    """(seed, strategy, staleness, mitigation) of every run of the job: for each seed of
    ``cfg.seeds`` in turn, every run of ``runs_of`` (synchronous first)."""
    return [(seed, *run) for seed in cfg.seeds for run in runs_of(cfg)]


def time_to_accuracy(curve: list[dict], target: float) -> float | None:
    """Wall time of the first evaluation at or above ``target`` (None if none is)."""
    for p in curve:
        if p.get("accuracy") is not None and p["accuracy"] >= target:
            return p["wall_s"]
    return None


def _run_async(comm, cfg: StudyConfig, seed: int, s: int, mitigation: str):
    workload = make_workload(cfg.workload_spec(seed), comm.rank, comm.size)
    settings = AsyncSettings(staleness=s, staleness_lr=mitigation == "lr",
                             staleness_warmup=cfg.staleness_warmup
                             if mitigation == "warmup" else 0)
    rows = []
    with make_strategy("async", comm, workload.grads, settings) as strategy:
        for k in range(cfg.steps):
            sample = run_steps(comm, workload, strategy, StepTimer(), 1, 0, first_step=k)[0]
            acc = None
            if (k + 1) % cfg.eval_every == 0 or k == cfg.steps - 1:
                acc = workload.evaluate()
            rows.append((sample.step_s + sample.wait_s, float(workload.loss.detach()), acc))
        strategy.finish_run()
        log = strategy.step_log
    gathered = comm.gather_object(rows)
    if comm.rank != 0:
        return None
    curve, wall = [], 0.0
    for k in range(cfg.steps):
        wall += max(g[k][0] for g in gathered)
        curve.append({"step": k, "samples": (k + 1) * cfg.batch_size * comm.size,
                      "wall_s": wall, "loss": sum(g[k][1] for g in gathered) / len(gathered),
                      "accuracy": gathered[0][k][2], "staleness": log[k]["staleness"],
                      "lr_scale": log[k]["lr_scale"]})
    return workload, strategy.knobs(), curve, wall, cfg.steps * cfg.batch_size * comm.size, {}


def _run_ps(comm, cfg: StudyConfig, seed: int, mitigation: str):
    workers = comm.size - 1
    steps = math.ceil(cfg.steps * comm.size / workers)
    workload = make_workload(cfg.workload_spec(seed), max(comm.rank - 1, 0), workers)
    every = max(1, round(cfg.eval_every * comm.size))  # the same samples between evaluations
    settings = PSSettings(lr=cfg.lr, steps=steps, staleness_lr=mitigation == "lr",
                          eval_every=every)
    res = run_ps(comm, settings, workload, evaluate=workload.evaluate)
    if comm.rank != 0:
        return None
    acc_at = {e["update"]: e["accuracy"] for e in res.evals}
    final = workload.evaluate()
    curve = [{"update": u["update"], "worker": u["worker"],
              "samples": u["update"] * cfg.batch_size,
              "wall_s": u["t_s"], "loss": u["loss"], "accuracy": acc_at.get(u["update"]),
              "staleness": u["staleness"], "lr_scale": u["lr_scale"]} for u in res.updates]
    if curve and curve[-1]["accuracy"] is None:
        curve[-1]["accuracy"] = final
    extra = summarize_updates(res.updates, cfg.batch_size)
    extra["server_busy_share"] = res.busy_s / res.wall_s if res.wall_s else None
    knobs = {"servers": 1, "workers": workers, "worker_steps": steps,
             "staleness_lr": mitigation == "lr", "lr_per_update": cfg.lr / workers}
    return workload, knobs, curve, res.wall_s, len(res.updates) * cfg.batch_size, extra


TABLE = [Column("seed", "", 5), Column("strategy", "", 9), Column("s", "", 4),
         Column("mitigation", "", 10),
         Column("final", "acc", 7, ".3f"), Column("best", "acc", 7, ".3f"),
         Column("to target", "s", 9, ".2f"), Column("wall", "s", 8, ".2f"),
         Column("thru", "img/s", 8, ".0f"), Column("vs sync", "x", 7, ".2f"),
         Column("stale", "mean", 6, ".2f")]


def study(comm, cfg: StudyConfig) -> int:
    out = Output.open(comm, "staleness", cfg)
    rows, sync_thru = [], None
    for seed, strategy, s, mitigation in seeded_runs(cfg):
        if strategy == "async" and s == 0 and mitigation == "none":
            sync_thru = None  # this seed's own synchronous run, which comes first, sets it
        result = (_run_async(comm, cfg, seed, s, mitigation) if strategy == "async"
                  else _run_ps(comm, cfg, seed, mitigation))
        if comm.rank != 0:
            continue
        workload, knobs, curve, wall, samples, extra = result
        run = out.run({**run_fields(strategy=strategy, algo=None, workload=workload,
                                    knobs=knobs), "seed": seed})
        for p in curve:
            run.write("train_step", {"staleness_config": s, "mitigation": mitigation, **p})
        accs = [p["accuracy"] for p in curve if p["accuracy"] is not None]
        stale = [p["staleness"] for p in curve if p["staleness"] is not None]
        thru = samples / wall if wall > 0 else None
        if strategy == "async" and s == 0 and mitigation == "none":
            sync_thru = thru
        summary = run.write("staleness_summary", {
            "staleness_config": s, "mitigation": mitigation,
            "target_accuracy": cfg.target_accuracy,
            "time_to_accuracy_s": time_to_accuracy(curve, cfg.target_accuracy),
            "final_accuracy": accs[-1] if accs else None,
            "best_accuracy": max(accs) if accs else None,
            "final_loss": curve[-1]["loss"] if curve else None,
            "wall_s": wall, "samples": samples, "throughput": thru,
            "throughput_vs_sync": thru / sync_thru if thru and sync_thru else None,
            "staleness_mean": sum(stale) / len(stale) if stale else None,
            "staleness_stats": metrics.summarize(stale), **extra})
        rows.append([seed, strategy, "-" if s is None else s, mitigation,
                     summary["final_accuracy"], summary["best_accuracy"],
                     summary["time_to_accuracy_s"], wall, thru, summary["throughput_vs_sync"],
                     summary["staleness_mean"]])
    out.close()
    out.table(TABLE, rows,
              title=f"{PROG}  model {cfg.model}  digits  ranks {comm.size}  steps {cfg.steps}"
                    f"  batch {cfg.batch_size}/rank  lr {cfg.lr:g}  target "
                    f"{cfg.target_accuracy:g}  seeds {','.join(map(str, cfg.seeds))}",
              footer=["to target: wall time until held-out accuracy first >= target "
                      "(n/a: never); vs sync: throughput / async s=0 of the same seed",
                      f"ps: rank 0 serves, {comm.size - 1} workers; results: {out.path}",
                      *latency.footer_lines(out.alpha, dilation.factor(), [])])
    return 0


def check(comm, cfg: StudyConfig) -> None:
    if cfg.ps:
        try:
            check_ps(comm)
        except ValueError as e:
            raise ValueError(f"{e} (or pass --no-ps)") from None


def main(argv: list[str] | None = None) -> int:
    return run_job(PROG, argv, parse_study, check, study)


if __name__ == "__main__":
    sys.exit(main())
