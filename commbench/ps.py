"""Parameter-server training: workers push gradients and pull parameters, none waits for another.

Rank 0 serves (holds the parameters and the optimizer), every other rank
works; the loops are ``commbench.paramserver``. Launch it under mpirun (or
horovodrun --mpi, or torchrun on Gloo: it needs point-to-point messages received from
any rank) with at least 2 ranks::

    mpirun -np 4 python -m commbench.ps                                 # ResNet-50 gradients
    mpirun -np 4 python -m commbench.ps --workload real --model smallcnn \\
        --dataset digits --image-size 32 --lr 0.01 --steps 120          # converges (~0.9)
    mpirun -np 4 python -m commbench.ps --compute-ms 300 --staleness-lr

Records (rank 0, JSON Lines, ``strategy: "ps"`` in each): one ``step`` record
per worker step (the workers' samples of that step; ``comm_s`` = push + pull
round trip; ``loss`` of every worker), one ``update`` record per applied
gradient (worker, its step, ``staleness``, ``lr_scale``, loss, server time),
and a ``summary`` with the staleness distribution (``staleness_hist``,
``staleness_stats``), ``throughput`` (samples of measured updates per second
on the server's clock: the workers are not in step, so that is the rate),
``throughput_steps`` (from worker steps) and ``server_busy_share`` (server
time receiving, applying and sending over its wall time: near 1 means the
single server bounds the rate). Held-out accuracy (``--dataset digits``) is
the server's model's. Exit status: 0, or 1 when a rank failed, 2 on bad
input.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from commbench import dilation, flags, latency, paramserver
from commbench.comm import BACKENDS
from commbench.flags import StepCount, ToolConfig
from commbench.lifecycle import run_job
from commbench.output import Output, Run, rank_extras, summarize_extras
from commbench.paramserver import SERVER, PSSettings, run_ps, summarize_updates
from commbench.results import run_fields
from commbench.tables import Column
from commbench.workloads import make_workload
from commbench.workloads.spec import (
    WorkloadSpec,
    add_workload_flags,
    check_slow_rank,
    resolve_workload,
)

PROG = "commbench.ps"


@dataclass
class PSConfig(WorkloadSpec, StepCount, ToolConfig):
    #: the server's messages are host memory (the mpi backend is not CUDA-aware)
    device: str = "cpu"
    compression: str = flags.same_flag(PSSettings, "compression")
    staleness_lr: bool = flags.same_flag(PSSettings, "staleness_lr")

    def settings(self) -> PSSettings:
        """The server's and workers' settings, by field name."""
        return PSSettings(**flags.values_for(PSSettings, self.as_dict()))


def build_parser() -> argparse.ArgumentParser:
    p = flags.tool_parser(
        f"python -m {PROG}",
        "Train with a parameter server on rank 0 and workers on the other ranks that push "
        "gradients and pull parameters without waiting for each other; report staleness, "
        "throughput and the server's load. Run it under mpirun (or torchrun) with at least 2 "
        "ranks.",
        ["mpirun -np 4 python -m commbench.ps", "torchrun --nproc-per-node 4 -m commbench.ps",
         "mpirun -np 4 python -m commbench.ps --workload real --model smallcnn --dataset "
         "digits --image-size 32 --lr 0.01"])
    g = p.add_argument_group("parameter server")
    flags.add_fields(g, PSConfig, ["compression", "staleness_lr"])
    flags.add_backend_flag(g, BACKENDS)
    g = p.add_argument_group("workload")
    add_workload_flags(g, PSConfig, leave_out=("device",))
    g = p.add_argument_group("run")
    flags.add_fields(g, PSConfig, ["steps", "warmup", "seed"])
    flags.add_output_group(p, "ps")
    return p


def parse_config(argv: list[str] | None = None) -> PSConfig:
    """Parse and check ``argv``; raise ConfigError naming the flag on bad input."""
    ns = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    cfg = PSConfig(**flags.values_for(PSConfig, ns))
    resolve_workload(cfg)
    flags.check_output(cfg)
    return cfg


TABLE = [
    Column("strategy", "", 9), Column("backend", "", 8), Column("ranks", "", 5),
    Column("workers", "", 7), Column("nodes", "", 5), Column("size", "MB", 8, ".1f"),
    Column("step", "ms", 8, ".1f"), Column("p5", "ms", 8, ".1f"), Column("p95", "ms", 8, ".1f"),
    Column("compute", "ms", 8, ".1f"), Column("comm", "ms", 8, ".1f"),
    Column("thru", "smp/s", 8, ".1f"), Column("stale", "mean", 6, ".2f"),
    Column("busy", "share", 6, ".2f"), Column("final", "acc", 6, ".3f"),
]


def table_row(s: dict) -> list:
    st, ms = s["stats"], 1e3
    return [s["strategy"], s["backend"], s["world_size"], s["knobs"]["workers"], s["nodes"],
            s["grad_bytes"] / 1e6, st["step_s"]["median"] * ms, st["step_s"]["p5"] * ms,
            st["step_s"]["p95"] * ms, st["compute_s"]["median"] * ms,
            st["comm_s"]["median"] * ms, s["throughput"], s["staleness_mean"],
            s["server_busy_share"], s.get("final_accuracy")]


def write_steps(run: Run, per_worker: list, losses: list) -> None:
    """Rank 0: one record per worker step, from every worker's k-th sample (the workers
    are not in step: ``step_s`` is the slowest worker's k-th step)."""

    def amend(rec: dict, step_losses: list) -> None:
        rec["busbw_gbps"] = None  # point-to-point round trips, not an all-reduce
        rec["critical_rank"] += 1  # a worker's global rank
        rec["loss"] = step_losses
        rec["wrong"] = 0

    for k in range(len(per_worker[0])):
        run.record_step([s[k] for s in per_worker], [w[k] for w in losses], amend)


#: how each backend moves the server's messages (records' ``transport``)
TRANSPORTS = {"mpi": "mpi4py Send/Recv", "horovod": "mpi4py Send/Recv (Horovod's MPI)",
              "torch": "torch.distributed send/recv (Gloo)"}


def write_records(out: Output, cfg: PSConfig, workload, gathered: list) -> dict:
    """Rank 0: the step, update and summary records from every rank's ``PSResult`` (and
    the server's extras); return the summary."""
    server, extra = gathered[SERVER]
    workers = len(gathered) - 1
    run = out.run(run_fields(strategy="ps", algo=None, workload=workload, knobs={
        "servers": 1, "workers": workers, "staleness_lr": cfg.staleness_lr,
        "lr_per_update": cfg.lr / workers, "compression": cfg.compression,
        "transport": TRANSPORTS.get(out.comm.name.split("-")[0], out.comm.name),
        "accum_steps": 1}))
    write_steps(run, [g[0].samples for g in gathered[1:]], [g[0].losses for g in gathered[1:]])
    for u in server.updates:
        run.write("update", u)
    upd = summarize_updates(server.updates, workload.batch_size)
    # Workers are not in step: the server's count of samples per second is the rate.
    steps = run.step_summary(cfg.batch_size * workers, wall_clock=False)
    return run.write("summary", {
        **steps, **upd,
        "throughput_steps": steps["throughput"], "throughput": upd["server_throughput"],
        "wrong": 0, "elements_checked": 0,
        **summarize_extras([extra]),
        "server_busy_share": server.busy_s / server.wall_s if server.wall_s else None,
        "server_wall_s": server.wall_s,
        "validated": False})  # no all-reduce to check; tests check convergence


def serve(comm, cfg: PSConfig) -> int:
    """The run, its records and the table; nothing is validated (tests check convergence)."""
    out = Output.open(comm, "ps", cfg)
    # worker w trains on shard w of the data; the server builds worker 0's (unused)
    workload = make_workload(cfg, max(comm.rank - 1, 0), comm.size - 1, job_rank=comm.rank)
    res = run_ps(comm, cfg.settings(), workload)
    extra = rank_extras(workload) if comm.rank == SERVER else None
    gathered = comm.gather_object((res, extra))
    summary = write_records(out, cfg, workload, gathered) if comm.rank == SERVER else None
    out.close()
    if comm.rank != SERVER:
        return 0
    acc = summary.get("final_accuracy")
    accuracy = [] if acc is None else [f"final accuracy {acc:.3f}: the server's model"]
    out.table(TABLE, [table_row(summary)],
              title=f"{PROG}  workload {summary['workload']}  model {summary['model']}  "
                    f"{cfg.label()}  steps {cfg.steps} (+{cfg.warmup} warm-up) per worker  "
                    f"torch threads/rank {out.threads}",
              footer=[f"hosts: {', '.join(sorted(set(comm.topo.hostnames)))}",
                      "step, compute, comm (push + pull round trip): medians over measured "
                      "worker steps; thru = samples of measured updates / server time; "
                      "stale = mean staleness of measured updates; busy = server time "
                      "receiving, applying, sending / its wall time",
                      *accuracy, *latency.footer_lines(out.alpha, dilation.factor(), []),
                      f"results: {out.path}"])
    return 0


def check(comm, cfg: PSConfig) -> None:
    paramserver.check(comm)
    check_slow_rank(cfg, comm.size, computing=range(1, comm.size))  # rank 0 serves


def main(argv: list[str] | None = None) -> int:
    return run_job(PROG, argv, parse_config, check, serve)


if __name__ == "__main__":
    sys.exit(main())
