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

import sys
import uuid

import torch

from commbench.config import Config, parse_config
from commbench.job import run_job, set_torch_threads
from commbench.report import Column, format_table, rank0_print
from commbench.results import ResultWriter, default_output, link_info, run_header, versions
from commbench.runner import run_steps, step_record, summarize_steps
from commbench.strategies import STRATEGIES, make_strategy
from commbench.strategies.stale import merge_step_log, summarize_step_log
from commbench.timing import StepTimer, TracingStepTimer
from commbench.validate import count_wrong
from commbench.workloads import make_workload

PROG = "commbench.allreduce"


def runs_of(cfg: Config) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for s in cfg.strategies:
        if STRATEGIES[s].uses_algo:
            out += [(s, a) for a in STRATEGIES[s].algos_for(cfg.algos)]
        else:
            out.append((s, None))
    return out


TABLE = [
    Column("strategy", "", 12), Column("algo", "", 7), Column("backend", "", 8),
    Column("ranks", "", 5), Column("nodes", "", 5), Column("size", "MB", 8, ".1f"),
    Column("step", "ms", 8, ".1f"), Column("p5", "ms", 8, ".1f"), Column("p95", "ms", 8, ".1f"),
    Column("compute", "ms", 8, ".1f"), Column("comm", "ms", 8, ".1f"),
    Column("exposed", "ms", 8, ".1f"), Column("sync", "share", 7, ".3f"),
    Column("p5", "share", 7, ".3f"), Column("p95", "share", 7, ".3f"),
    Column("busbw", "GB/s", 7, ".3f"), Column("#wrong", "", 7),
]


def table_row(s: dict) -> list:
    st = s["stats"]
    ms = 1e3
    return [s["strategy"], s["algo"] or "-", s["backend"], s["world_size"], s["nodes"],
            s["grad_bytes"] / 1e6, st["step_s"]["median"] * ms, st["step_s"]["p5"] * ms,
            st["step_s"]["p95"] * ms, st["compute_s"]["median"] * ms,
            st["comm_s"]["median"] * ms, st["exposed_sync_s"]["median"] * ms,
            st["sync_share"]["median"], st["sync_share"]["p5"], st["sync_share"]["p95"],
            s["busbw_gbps"], s["wrong"]]


def rank_extras(workload) -> dict:
    """Per-rank facts for the summary: peak memory, and the parameters' checksum."""
    import resource

    out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if getattr(workload, "device", None) is not None and workload.device.type == "cuda":
        out["peak_cuda_mb"] = torch.cuda.max_memory_allocated(workload.device) / 2**20
    if hasattr(workload, "parameter_checksum"):
        out["param_checksum"] = workload.parameter_checksum()
    accuracy = workload.evaluate() if hasattr(workload, "evaluate") else None
    if accuracy is not None:
        out["final_accuracy"] = accuracy
    return out


def summarize_extras(per_rank: list[dict]) -> dict:
    """Max over ranks of each memory figure, and every rank's value under ``ranks_*``."""
    out: dict = {}
    for key in per_rank[0]:
        vals = [e[key] for e in per_rank]
        out[f"{key}_ranks"] = vals
        if key == "final_accuracy":
            out[key] = vals[0]  # parameters are the same everywhere; rank 0's figure
        elif key != "param_checksum":
            out[key] = max(vals)
    return out


def run_one(comm, cfg: Config, strategy_name: str, algo: str | None, writer: ResultWriter | None,
            vers: dict, threads: int) -> dict | None:
    if strategy_name == "ps":  # servers run no workload: a run path of its own
        from commbench.strategies.ps import run_one_ps

        return run_one_ps(comm, cfg, writer, vers, threads)
    workload = make_workload(cfg, comm.rank, comm.size)
    strategy = make_strategy(strategy_name, comm, workload.grads, algo=algo or "native",
                             bucket_mb=cfg.bucket_mb, backward_order=workload.backward_order,
                             compression=cfg.compression, accum_steps=cfg.accum_steps,
                             progress=cfg.progress,
                             workload=workload, staleness=cfg.staleness,
                             staleness_lr=cfg.staleness_lr,
                             staleness_warmup=cfg.staleness_warmup)
    timer = TracingStepTimer() if cfg.timeline else StepTimer()
    run_id = uuid.uuid4().hex[:12]
    link = link_info()  # interface bytes are compared with the link's rate in the same unit
    wire_gbps = link["link_wire_gbps"] or link["link_gbps"]
    steps: list[dict] = []

    def header_args() -> dict:
        return dict(run_id=run_id, strategy=strategy_name, algo=algo, backend=comm.name,
                    topo=comm.topo, workload=workload, knobs=strategy.knobs(),
                    config=cfg.as_dict(), vers=vers, torch_threads=threads)

    def record_step(sample) -> None:
        """Gather this step's samples; rank 0 writes its record now, so a job killed
        later keeps every finished step (the run's validation is in the summary)."""
        log = strategy.step_log[-1] if hasattr(strategy, "step_log") else None
        per_rank = comm.gather_object((sample, log))
        if comm.rank != 0:
            return
        rec = step_record([p[0] for p in per_rank], comm.size, wire_gbps)
        if log is not None:
            merge_step_log(rec, [[p[1]] for p in per_rank], 0)
        steps.append(rec)
        writer.write({**run_header(kind="step", **header_args()), **rec})

    samples = run_steps(comm, workload, strategy, timer, cfg.steps, cfg.warmup,
                        accum_steps=cfg.accum_steps, on_step=record_step)
    # async: per-step schedule (staleness applied, wait); completes what is in flight
    step_log = strategy.end_run() if hasattr(strategy, "end_run") else None
    wrong, checked = count_wrong(strategy, workload.backward_order) if cfg.validate else (0, 0)
    extra = rank_extras(workload)
    gathered = comm.gather_object((samples, wrong, checked, extra,
                                   getattr(timer, "steps", None), step_log))
    if comm.rank != 0:
        return None
    wrong_total = sum(g[1] for g in gathered)
    head = header_args()
    summary = {**run_header(kind="summary", **head),
               **summarize_steps(steps, cfg.batch_size * cfg.accum_steps * comm.size),
               "wrong": wrong_total,
               "elements_checked": sum(g[2] for g in gathered),
               **summarize_extras([g[3] for g in gathered]),
               "validated": cfg.validate}
    if step_log is not None:
        summary.update(summarize_step_log(steps))
    writer.write(summary)
    if cfg.timeline:  # every rank's intervals, seconds from that rank's first step start
        writer.write({**run_header(kind="trace", **head), "ranks": [g[4] for g in gathered]})
    return summary


def compute_label(cfg: Config) -> str:
    """What computes in each step, for the table's title."""
    if cfg.workload == "resnet":
        what = f"batch {cfg.batch_size} x {cfg.image_size} px on {cfg.device}"
    elif cfg.compute_profile:
        what = f"compute {cfg.compute_profile} x {cfg.compute_scale:g}"
    else:
        what = f"compute {cfg.compute_ms:g} ms"
    extra = [f"accum {cfg.accum_steps}"] * (cfg.accum_steps > 1) + \
        [f"{cfg.compression} compression"] * (cfg.compression != "none")
    return "  ".join([what, *extra])


def check(comm, cfg: Config) -> None:
    for strategy_name, algo in runs_of(cfg):
        STRATEGIES[strategy_name].check(comm, algo or "native")


def study(comm, cfg: Config) -> int:
    """Every requested run, its records and the table; return the wrong elements."""
    threads = set_torch_threads(comm.local_size)
    vers = versions(comm.versions())
    path = cfg.output or default_output(cfg.output_dir, comm.name, comm.size)
    writer = ResultWriter(path) if comm.rank == 0 else None
    summaries = [run_one(comm, cfg, strategy_name, algo, writer, vers, threads)
                 for strategy_name, algo in runs_of(cfg)]
    wrong = comm.bcast_object(sum(s["wrong"] for s in summaries) if comm.rank == 0 else None)
    if comm.rank == 0:
        writer.close()
        if not cfg.quiet:
            first = summaries[0]
            rank0_print(0, format_table(
                TABLE, [table_row(s) for s in summaries],
                title=f"commbench.allreduce  workload {first['workload']}  model "
                      f"{first['model']}  {compute_label(cfg)}  steps "
                      f"{cfg.steps} (+{cfg.warmup} warm-up)  torch threads/rank {threads}",
                footer=[f"hosts: {', '.join(sorted(set(comm.topo.hostnames)))}",
                        "medians over measured steps; busbw = algbw * 2(n-1)/n",
                        f"results: {path}"]))
    return wrong


def main(argv: list[str] | None = None) -> int:
    return run_job(PROG, argv, parse_config, check, study)


if __name__ == "__main__":
    sys.exit(main())
