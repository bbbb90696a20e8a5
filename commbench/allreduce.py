"""Time every training step under gradient-sync strategies; report the sync share.

Launch it like any data-parallel job::

    horovodrun -np 8 -H localhost:8 python -m commbench.allreduce   # one machine, 8 ranks
    mpirun -np 4 python -m commbench.allreduce --algo ring           # plain MPI
    mpirun -np 64 --hostfile hosts python -m commbench.allreduce --steps 100

With no arguments it runs the default study: ResNet-50's gradients
(25.6 M parameters, 161 tensors), 100 ms of replayed compute per step, the
flat strategy with the backend's all-reduce and with the project's ring.
Rank 0 writes JSON Lines records under ``results/`` and prints a table.
Exit status: 0 when every element of every validation pass was right, 1 when
any was wrong or a rank failed, 2 on bad input.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from commbench import dilation, flags, hostload, latency
from commbench.buffers import BUFFER_RULES, BufferSync
from commbench.comm import BACKENDS
from commbench.comm.algos import ALGOS
from commbench.comm.engine import check_transfer_path
from commbench.flags import (
    MOVED_STRATEGIES,
    ConfigError,
    StepCount,
    ToolConfig,
    csv_list,
    flag,
    positive_int,
)
from commbench.hostload import HostMonitor
from commbench.jobtime import HOST_S_PER_PARAM, REAL_FIXED_S, Seconds, Where, real_pass_s
from commbench.lifecycle import run_job
from commbench.models.registry import parameter_shapes
from commbench.output import Output, merge_rank_fields, rank_extras, summarize_extras
from commbench.profilefile import ComputeProfile, ProfileError
from commbench.profilefile import read as read_profile
from commbench.results import run_fields
from commbench.steploop import run_steps
from commbench.strategies import STRATEGIES, SYNC_FLAGS, CommonSettings, Sync, make_strategy
from commbench.tables import Column
from commbench.timing import StepTimer, TracingStepTimer
from commbench.torchtrace import DEFAULT_STEPS, TorchTrace, trace_dir, window_start
from commbench.validate import count_wrong
from commbench.workloads import make_workload
from commbench.workloads.spec import (
    WorkloadSpec,
    add_workload_flags,
    check_slow_rank,
    resolve_workload,
)

PROG = "commbench.allreduce"
TRACE_KINDS = ("commbench", "torch")


def strategy_list(text: str) -> list[str]:
    """``--strategy``: registered strategies; a former one that is a tool now says where."""
    for name in (x.strip() for x in text.split(",")):
        if name in MOVED_STRATEGIES:
            raise argparse.ArgumentTypeError(
                f"{name} is a tool of its own now: run python -m {MOVED_STRATEGIES[name]} "
                "(it takes the same workload flags)")
    return csv_list(STRATEGIES, "--strategy")(text)


@dataclass
class Config(WorkloadSpec, StepCount, ToolConfig):
    """Everything one ``commbench.allreduce`` job runs: the workload (``WorkloadSpec``),
    the steps, the backend and output, the runs (``--strategy`` x ``--algo`` x
    ``--buffers``) and the strategies' settings (``sync``: a ``Sync``, each strategy flag's
    value once, ``--bucket-mb`` among them; each strategy's settings class declares its
    flags). ``sync`` may be given as a strategy's settings object, or several, and reads as
    the ``Sync`` they give::

        Config(strategies=["bucketed"], sync=BucketedSettings(bucket_mb=5))
        Config(strategies=["flat", "async"], sync=AsyncSettings(staleness=2, transfer="ring"))
    """

    strategies: list[str] = flag(
        "--strategy", default_factory=lambda: ["flat"], metavar="NAME[,NAME]",
        type=strategy_list, help=f"strategies to run, one run each: {', '.join(STRATEGIES)}")
    algos: list[str] = flag(
        "--algo", default_factory=lambda: ["native", "ring"], metavar="NAME[,NAME]",
        type=csv_list(ALGOS, "--algo"),
        help="all-reduce algorithms for strategies that take one: native = the backend's own, "
             "ring = the project's reduce-scatter + all-gather")
    buffers: list[str] = flag(
        "--buffers", default_factory=lambda: ["broadcast"], metavar="RULE[,RULE]",
        type=csv_list(BUFFER_RULES, "--buffers"),
        help="model buffers (BatchNorm statistics), one run each: broadcast = rank 0's "
             "before every forward, timed as sync (DDP's broadcast_buffers); local = each "
             "rank keeps its own (Horovod after its first broadcast); the horovod peer "
             "always follows Horovod's rule")
    sync: Sync = field(default_factory=Sync)
    validate: bool = flag("--no-validate", default=True, action="store_false",
                          help="skip the correctness pass (known values, closed-form sum)")
    #: None; "commbench" = every phase interval per rank in kind "trace" records (the
    #: timeline); "torch" = a window of steps under torch.profiler, a trace file per rank
    trace: str | None = flag(
        "--trace", "--timeline", default=None, nargs="?", const="commbench",
        choices=TRACE_KINDS, metavar="KIND",
        help="commbench (or no value): also record every rank's phase and collective "
             "intervals per step (kind \"trace\" records; python -m analysis.timeline makes "
             "a Chrome trace of them); torch: run --trace-steps measured steps under "
             "torch.profiler and write one trace per rank beside the results file (Perfetto, "
             "TensorBoard, Holistic Trace Analysis open it). Under horovodrun write --trace: "
             "horovodrun reads --timeline after the program as an ambiguous abbreviation of "
             "its own --timeline-filename and exits")
    trace_steps: int | None = flag(
        "--trace-steps", default=None, metavar="N", type=positive_int,
        help=f"--trace torch: how many measured steps (in the middle) to trace; default "
             f"{DEFAULT_STEPS}")

    def emulated_s(self, where: Where) -> Seconds:
        """How long this job takes on ``where`` (``commbench.jobtime``): per run (warm-up +
        steps), the replayed compute and the gradient's ring all-reduce across nodes, which
        dilation stretches; the ranks' start-up and own host work (writing gradients, the
        update; real passes; copies within a node), which it does not."""
        prof = self._replayed_profile()
        params = prof.params if prof else self._model_params()
        k = self.sync.accum_steps
        host = params * HOST_S_PER_PARAM * where.share
        runs = len(runs_of(self))
        fixed = where.startup_s()
        if self.workload != "synthetic":
            host += real_pass_s(params, self.batch_size, self.image_size) * where.share * k
            fixed += REAL_FIXED_S * runs
            replayed = 0.0
        elif self.compute_profile:
            # a profile not yet written (a job that replays what an earlier job of its
            # experiment profiles) is priced as a real pass here would take
            step_s = prof.step_s if prof else real_pass_s(params, self.batch_size,
                                                          self.image_size)
            replayed = step_s * self.compute_scale * k
        else:
            replayed = self.compute_ms / 1e3 * k
        if self.slow_rank:
            replayed *= self.slow_rank[1]
        steps = (self.steps + self.warmup) * runs  # (validation: one all-reduce, no step)
        comm = where.allreduce(params * 4)
        return Seconds(steps * (replayed + comm.dilated), fixed + steps * (host + comm.host))

    def _replayed_profile(self) -> ComputeProfile | None:
        """The profile this job replays, read once for its estimate; None where it replays
        none or its file is not written yet."""
        if self.workload != "synthetic" or not self.compute_profile:
            return None
        try:
            return read_profile(self.compute_profile)
        except ProfileError:
            return None

    def _model_params(self) -> int:
        """The gradient's elements from the model's shapes (the default model where none is
        given): for a job without a readable profile."""
        model = self.model or ("resnet50" if self.workload == "synthetic" else "resnet18")
        return sum(math.prod(s) for _, s in parameter_shapes(
            model, self.num_classes or 1000, self.model_kwargs))

    def probe(self) -> Config:
        """This job shortened for a dilation probe: 2 steps after 1 warm-up, no table."""
        return replace(self, steps=2, warmup=1, quiet=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.sync = Sync.of(self.sync)

    def as_dict(self) -> dict:
        """One flat record of every setting (the strategies' under their own names, as
        ``--bucket-mb`` gives ``bucket_mb``), as result records carry it."""
        d = asdict(self)
        d.pop("sync")
        return {**d, **self.sync.values}

    @classmethod
    def from_dict(cls, d: dict) -> Config:
        """The configuration ``as_dict`` gave (a record's ``config``, a parsed command line),
        or ``dataclasses.asdict`` (the strategies' flag values nested under ``sync``)."""
        nested = d.get("sync")
        flat = {**d, **nested.get("values", nested)} if isinstance(nested, dict) else d
        sync = Sync(**{k: flat[k] for k in SYNC_FLAGS if k in flat})
        return cls(**flags.values_for(cls, flat), sync=sync)

    def run_settings(self) -> dict[str, CommonSettings]:
        """Each of the job's strategies' settings (``Sync.settings``); a ValueError names a
        flag one of them refuses."""
        return {name: self.sync.settings(name) for name in self.strategies}


def build_parser() -> argparse.ArgumentParser:
    p = flags.tool_parser(
        "python -m commbench.allreduce",
        "Time every training step under a gradient-sync strategy and report how much of it "
        "is spent waiting for gradients. Run it under horovodrun or mpirun.",
        ["horovodrun -np 8 -H localhost:8 python -m commbench.allreduce",
         "mpirun -np 4 python -m commbench.allreduce --algo ring --model resnet18",
         "mpirun -np 64 --hostfile hosts python -m commbench.allreduce --steps 100"])
    g = p.add_argument_group("synchronisation")
    flags.add_fields(g, Config, ["strategies", "algos"])
    Sync.add_flags(g)
    flags.add_backend_flag(g, BACKENDS)
    g = p.add_argument_group("workload")
    add_workload_flags(g, Config)
    flags.add_fields(g, Config, ["buffers"])
    g = p.add_argument_group("run")
    flags.add_fields(g, Config, ["steps", "warmup", "seed", "validate"])
    flags.add_step_timeout_flag(g)
    g = flags.add_output_group(p, "allreduce")
    flags.add_fields(g, Config, ["trace", "trace_steps"])
    return p


def parse_config(argv: list[str] | None = None) -> Config:
    """Parse and check ``argv``; raise ConfigError naming the flag on bad input."""
    ns = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    # the strategies' flags set the values of Sync by field name (--bucket-mb: bucket_mb),
    # from which every run's strategy settings are built (Sync.for_run)
    cfg = Config.from_dict(vars(ns))
    resolve_defaults(cfg)
    if cfg.workload == "synthetic" and not cfg.compute_profile:
        flags.check_step_timeout(cfg.step_timeout, cfg.compute_ms * cfg.sync.accum_steps / 1e3)
    flags.check_output(cfg)
    return cfg


def resolve_defaults(cfg: Config, cuda: bool | None = None) -> None:
    """Check the runs against the workload, then fill and check the workload's defaults
    (``resolve_workload``)."""
    try:  # what each strategy's settings refuse, alone or in a job of --steps
        for settings in cfg.run_settings().values():
            settings.check_steps(cfg.steps)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_trace(cfg)
    resolve_workload(cfg, cuda)
    # what time dilation cannot place (replayed compute keeps its tensors in host memory)
    flags.check_dilation(cfg.device if cfg.workload == "real" else "cpu", cfg.trace)


def check_trace(cfg: Config) -> None:
    """``--trace-steps`` belongs to ``--trace torch`` and fits in ``--steps``."""
    if cfg.trace != "torch":
        if cfg.trace_steps is not None:
            raise ConfigError("--trace-steps: needs --trace torch")
        return
    if cfg.trace_steps is None:
        cfg.trace_steps = min(DEFAULT_STEPS, cfg.steps)
    if cfg.trace_steps > cfg.steps:
        raise ConfigError(f"--trace-steps {cfg.trace_steps}: more than --steps {cfg.steps} "
                          "(the window is measured steps)")


def runs_of(cfg: Config) -> list[tuple[str, str | None, str]]:
    """(strategy, algo, buffer rule requested) of every run, in the order they run; a
    strategy with a buffer rule of its own runs once."""
    out: list[tuple[str, str | None, str]] = []
    for s in cfg.strategies:
        algos = STRATEGIES[s].algos_for(cfg.algos) if STRATEGIES[s].uses_algo else [None]
        buffers = cfg.buffers[:1] if STRATEGIES[s].own_buffer_rule else cfg.buffers
        out += [(s, a, b) for a in algos for b in buffers]
    return out


TABLE = [
    Column("strategy", "", 12), Column("algo", "", 7), Column("buffers", "", 9),
    Column("backend", "", 8),
    Column("ranks", "", 5), Column("nodes", "", 5), Column("size", "MB", 8, ".1f"),
    Column("step", "ms", 8, ".1f"), Column("p5", "ms", 8, ".1f"), Column("p95", "ms", 8, ".1f"),
    Column("compute", "ms", 8, ".1f"), Column("comm", "ms", 8, ".1f"),
    Column("exposed", "ms", 8, ".1f"), Column("wait", "ms", 8, ".1f"),
    Column("transfer", "ms", 8, ".1f"), Column("sync", "share", 7, ".3f"),
    Column("p5", "share", 7, ".3f"), Column("p95", "share", 7, ".3f"),
    Column("busbw", "GB/s", 7, ".3f"), Column("wall", "smp/s", 8, ".1f"),
    Column("#wrong", "", 7),
]


#: the table's short name for each buffer rule (``commbench.buffers``)
BUFFER_LABEL = {"broadcast": "bcast", "local": "local", "ddp-broadcast": "ddp-bcast",
                "ddp-local": "local", "horovod-initial-broadcast": "hvd-init"}


def _ms(stats: dict, name: str) -> float | None:
    """The median of ``name`` in ms; None (n/a) where no step had it (Horovod's peer)."""
    st = stats.get(name)
    return st["median"] * 1e3 if st and st["count"] else None


def table_row(s: dict) -> list:
    st = s["stats"]
    ms = 1e3
    buffers = BUFFER_LABEL.get(s.get("buffer_rule"), "-") if s.get("buffer_bytes") else "-"
    return [s["strategy"], s["algo"] or "-", buffers,
            s["backend"], s["world_size"], s["nodes"],
            s["grad_bytes"] / 1e6, st["step_s"]["median"] * ms, st["step_s"]["p5"] * ms,
            st["step_s"]["p95"] * ms, st["compute_s"]["median"] * ms,
            st["comm_s"]["median"] * ms, st["exposed_sync_s"]["median"] * ms,
            _ms(st, "sync_wait_s"), _ms(st, "sync_transfer_s"),
            st["sync_share"]["median"], st["sync_share"]["p5"], st["sync_share"]["p95"],
            s["busbw_gbps"], s.get("wall_throughput"), s["wrong"]]


def run_one(out: Output, cfg: Config, strategy_name: str, algo: str | None,
            buffers: str) -> dict | None:
    """One run: its step records as steps end, then its summary (returned on rank 0)."""
    comm = out.comm
    workload = make_workload(cfg, comm.rank, comm.size)
    strategy = make_strategy(strategy_name, comm, workload.grads,
                             cfg.sync.for_run(strategy_name, algo, buffers),
                             backward_order=workload.backward_order, workload=workload)
    with strategy:  # whoever builds a strategy closes it
        buffer_sync = BufferSync(comm, workload.buffers, strategy.buffer_rule(buffers))
        timer = TracingStepTimer() if cfg.trace else StepTimer()  # torch's takes its collectives
        fields = {**run_fields(strategy=strategy_name, algo=algo, workload=workload,
                               knobs=strategy.knobs()),
                  "buffer_rule": buffer_sync.rule, "buffer_bytes": buffer_sync.nbytes}
        # its wall clock starts now, before the first step
        run = out.run(fields, live=lambda: {"knobs": strategy.knobs()})

        def record_step(sample) -> None:
            """Rank 0 writes the step's record now, so a job killed later keeps every finished
            step (the run's validation is in the summary)."""
            run.step(sample, strategy.record_fields("step"), merge_rank_fields)

        trace = None
        if cfg.trace == "torch":  # rank 0 names the folder: ranks' default file names may differ
            name = "-".join(x for x in (strategy_name, algo, run.run_id) if x)
            folder = comm.bcast_object(str(trace_dir(out.path, name))
                                       if comm.rank == 0 else None)
            first = window_start(cfg.warmup, cfg.steps, cfg.trace_steps)
            trace = TorchTrace(folder, first, cfg.trace_steps, comm.name, comm.rank,
                               comm.size, cuda=workload.device.type == "cuda")
        host = HostMonitor()
        samples = run_steps(comm, workload, strategy, timer, cfg.steps, cfg.warmup,
                            accum_steps=cfg.sync.accum_steps, on_step=record_step,
                            buffers=buffer_sync, trace=trace, host=host)
        strategy.finish_run()  # completes what is still in flight (async)
        wrong, checked = count_wrong(strategy, workload.backward_order) if cfg.validate else (0, 0)
    buffer_sync.before_evaluation()
    extra = rank_extras(workload)
    gathered = comm.gather_object((samples, wrong, checked, extra, timer.trace(),
                                   host.result and host.result.as_dict()))
    if comm.rank != 0:
        return None
    steps = run.step_summary(cfg.batch_size * cfg.sync.accum_steps * comm.size)
    summary = {**steps,
               **hostload.record_fields([g[5] for g in gathered]),
               **strategy.record_fields("summary", run.steps),
               "wrong": sum(g[1] for g in gathered),
               "elements_checked": sum(g[2] for g in gathered),
               **summarize_extras([g[3] for g in gathered]),
               "validated": cfg.validate,
               **({"torch_trace_dir": str(trace.directory)} if trace else {})}
    summary = run.write("summary", summary)
    if cfg.trace == "commbench":  # every rank's intervals, seconds from its first step start
        run.write("trace", {"ranks": [g[4] for g in gathered]})
    return summary


def settings_notes(cfg: Config) -> list[str]:
    """What the strategies' settings say of reading their runs (async: a wall clock that
    starts with its pipeline part-empty, ``Run.step_summary``), each note once."""
    notes: dict[str, Any] = {}
    for settings in cfg.run_settings().values():
        notes.update(dict.fromkeys(settings.notes(cfg.warmup)))
    return list(notes)


def accuracy_lines(summaries: list[dict]) -> list[str]:
    """Held-out accuracy per run, saying whose model it is."""
    out = []
    for s in summaries:
        if s.get("final_accuracy") is None:
            continue
        accs = s["final_accuracy_ranks"]
        what = (f"{s['strategy']} {s['algo'] or ''}".strip()
                + f" (buffers {s.get('buffer_rule', 'n/a')}): final accuracy "
                  f"{s['final_accuracy']:.3f}")
        if min(accs) == max(accs):
            out.append(f"{what}, the same on every rank")
        else:
            out.append(f"{what} is rank 0's; ranks {min(accs):.3f}-{max(accs):.3f} "
                       "(each evaluates its own buffers)")
    return out


def compute_label(cfg: Config) -> str:
    """What computes in each step, for the table's title."""
    extra = [f"accum {cfg.sync.accum_steps}"] * (cfg.sync.accum_steps > 1) + \
        [f"{cfg.sync.compression} compression"] * (cfg.sync.compression != "none")
    return "  ".join([cfg.label(), *extra])


def check(comm, cfg: Config) -> None:
    check_slow_rank(cfg, comm.size)
    for strategy_name, algo, _ in runs_of(cfg):
        STRATEGIES[strategy_name].check(comm, algo or "native")
    model_checks = [STRATEGIES[name] for name in dict.fromkeys(n for n, _, _ in runs_of(cfg))
                    if STRATEGIES[name].checks_workload]
    if model_checks:  # e.g. zero3's units: built once here, before anything is written
        workload = make_workload(cfg, comm.rank, comm.size)
        for cls in model_checks:
            cls.check_workload(workload)
    # the transfer engines' paths (--transfer ring: point-to-point messages)
    paths = {s.engine_transfer for s in cfg.run_settings().values()} - {None}
    for path in sorted(paths):
        check_transfer_path(comm, path)


def trace_lines(summaries: list[dict]) -> list[str]:
    """The table's footer on ``--trace torch``: what the traced steps cost, per run."""
    lines = []
    for s in summaries:
        run = f"{s['strategy']}/{s['algo'] or '-'}"
        if s.get("trace_overhead") is not None:
            lines.append(f"{run}: {s['traced_steps']} traced steps (not in the medians) took "
                         f"{s['traced_step_s'] * 1e3:.1f} ms, {s['trace_overhead']:+.1%} "
                         "against the untraced median")
        elif s.get("traced_steps"):
            lines.append(f"{run}: every measured step traced; its medians include the "
                         "profiler's cost (--steps above --trace-steps measures it)")
    return lines


def study(comm, cfg: Config) -> int:
    """Every requested run, its records and the table; return the wrong elements."""
    out = Output.open(comm, "allreduce", cfg)
    summaries = [run_one(out, cfg, strategy_name, algo, buffers)
                 for strategy_name, algo, buffers in runs_of(cfg)]
    wrong = comm.bcast_object(sum(s["wrong"] for s in summaries) if comm.rank == 0 else None)
    out.close()
    if comm.rank == 0:
        first = summaries[0]
        out.table(TABLE, [table_row(s) for s in summaries],
                  title=f"commbench.allreduce  workload {first['workload']}  model "
                        f"{first['model']}  {compute_label(cfg)}  steps "
                        f"{cfg.steps} (+{cfg.warmup} warm-up)  torch threads/rank {out.threads} "
                        f"({out.thread_plan.rule})",
                  footer=[f"hosts: {', '.join(sorted(set(comm.topo.hostnames)))}",
                          "medians over measured steps; busbw = algbw * 2(n-1)/n; wall = "
                          "samples / wall time of the measured steps, bookkeeping included",
                          "wait, transfer: per collective, transfer = the shortest duration "
                          "over ranks, wait = the slowest rank's own minus that; sums per step",
                          "exposed = wait + transfer (+ packing buffers) only where nothing "
                          "overlapped (flat, hierarchical); n/a: no per-collective times "
                          "(horovod)",
                          *hostload.footer_lines(
                              summaries, lambda s: f"{s['strategy']}/{s['algo'] or '-'}",
                              dilation.factor(), real_compute=cfg.workload != "synthetic"),
                          *latency.footer_lines(
                              out.alpha, dilation.factor(),
                              [(f"{s['strategy']}/{s['algo'] or '-'}", s) for s in summaries]),
                          *accuracy_lines(summaries), *settings_notes(cfg),
                          *[f"torch.profiler traces: {s['torch_trace_dir']}" for s in summaries
                            if s.get("torch_trace_dir")],
                          *trace_lines(summaries),
                          f"results: {out.path}"])
    return wrong


def main(argv: list[str] | None = None) -> int:
    return run_job(PROG, argv, parse_config, check, study)


if __name__ == "__main__":
    sys.exit(main())
