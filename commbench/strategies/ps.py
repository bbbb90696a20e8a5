"""Parameter-server asynchrony: workers push gradients and pull parameters on their own.

Rank 0 is the server: it holds the parameters and an SGD optimizer (momentum
0.9, ``--lr``, as the real workload's). Every other rank is a worker:

1. Compute forward and backward on its own batch with the parameters it
   pulled last.
2. Push: send the server a header (worker step, the parameter version the
   gradient was computed on) and the fused gradient (cast to the
   ``--compression`` dtype, as flat does).
3. Pull: receive the parameters the server holds after applying that
   gradient, and their version; copy them into the model.

Each update applies one worker's gradient with ``--lr / workers``: one
round of updates (one per worker) then moves the parameters as far as one
synchronous step of ``--lr`` over the same batches would, so runs compare at
the same ``--lr``. At the full ``--lr`` the server took ``workers`` times
the synchronous step per sample and diverged on digits (3 workers, lr 0.02
and 0.01, momentum 0.9: held-out accuracy back to chance).

The server loops: receive a header from any worker (``MPI.ANY_SOURCE``),
then that worker's gradient; apply it at once (staleness = current version -
the version the worker computed on = the number of other workers' updates
applied in between); send the new parameters back. No worker waits for
another, only for the server's round trip; the server applies one gradient
at a time, in arrival order.

Why server loops and not MPI one-sided communication: an SGD step with
momentum is not an ``MPI_Accumulate`` (the update is not an elementwise sum,
and the momentum state lives with the parameters); the staleness of each
gradient needs a version counter that is read and advanced atomically with
the update, which a single server loop gives for free; and Open MPI's
passive-target one-sided operations, like its non-blocking collectives
(DESIGN.md §8), advance only while the target process is inside an MPI
call, so a server process would have to poll anyway.

Mitigation: ``--staleness-lr`` scales the learning rate of each update by
1/staleness of that gradient (1 for staleness 0), Zhang et al. 2016,
https://arxiv.org/abs/1511.05950 — per gradient, as that paper does.

Records: per worker step as every strategy (compute, comm = push + pull
round trip, exposed sync); per update (``kind: "update"``) the worker, its
step, the staleness, the learning-rate scale and the server's time; the
summary carries the staleness distribution (``staleness_hist``), the
server-measured throughput (samples of measured updates over the time they
took) and the server's busy share (time applying and sending over wall
time: near 1 means the single server is the bottleneck).

Needs the mpi backend (point-to-point on mpi4py) and at least 2 ranks.

Example::

    mpirun -np 4 python -m commbench.allreduce --strategy ps --workload resnet \\
        --model smallcnn --dataset digits --image-size 32 --lr 0.05
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from commbench import metrics
from commbench.comm.base import Communicator
from commbench.strategies.base import Strategy
from commbench.timing import StepSample, StepTimer, now

SERVER = 0
TAG_HDR, TAG_GRAD, TAG_PARAM = 11, 12, 13
KIND_GRAD, KIND_DONE = 0, 1
#: push header, float64: kind, worker step, parameter version it was computed on, loss
HDR_LEN = 4


class PSStrategy(Strategy):
    """Registry entry and checks; the run itself is ``run_ps`` (servers run no workload)."""

    name = "ps"

    @classmethod
    def check(cls, comm: Communicator, algo: str) -> None:
        if comm.name != "mpi":
            raise ValueError(f"--strategy ps needs the mpi backend (server loops on mpi4py "
                             f"point-to-point); this job runs on {comm.name}: launch it with "
                             "mpirun, or pass --backend mpi")
        if comm.size < 2:
            raise ValueError(f"--strategy ps needs at least 2 ranks (1 server + workers), got "
                             f"{comm.size}")

    def finish(self) -> None:
        raise RuntimeError("--strategy ps runs through commbench.strategies.ps.run_ps")


def _flat_views(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    views, offset = [], 0
    for t in like:
        views.append(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
    return views


def model_params(workload) -> list[torch.Tensor]:
    """The tensors the server updates: the real model's, or stand-ins of the gradients'
    shapes for the synthetic workload (updated all the same, so the cost is real)."""
    if hasattr(workload, "params"):
        return list(workload.params)
    return [torch.nn.Parameter(torch.zeros_like(g)) for g in workload.grads]


@dataclass
class PSResult:
    """What one rank saw. Server: updates and evaluations; worker: its step samples."""

    samples: list[StepSample] = field(default_factory=list)
    losses: list[float | None] = field(default_factory=list)
    updates: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    busy_s: float = 0.0


def _server(mpi, comm, workload, cfg, staleness_lr: bool, eval_every: int,
            evaluate: Callable[[], float | None] | None) -> PSResult:
    from commbench.comm.mpi import as_buffer

    params = model_params(workload)
    opt = getattr(workload, "opt", None) or torch.optim.SGD(params, lr=cfg.lr, momentum=0.9)
    workers = comm.Get_size() - 1
    base_lr = opt.param_groups[0]["lr"]
    lr_per_update = base_lr / workers  # a round of one update per worker = one sync step
    numel = sum(p.numel() for p in params)
    wire = _wire(cfg, params)
    gbuf = torch.empty(numel, dtype=wire)
    grads = []
    for p, v in zip(params, _flat_views(gbuf, params)):
        p.grad = torch.zeros_like(p)
        grads.append(v)
    pbuf = torch.empty(numel, dtype=params[0].dtype)
    hdr = np.zeros(HDR_LEN)
    ver = np.zeros(1, dtype=np.int64)
    status = mpi.Status()
    res = PSResult()
    done = version = 0
    eval_s = 0.0
    t0 = now()
    while done < workers:
        comm.Recv(hdr, source=mpi.ANY_SOURCE, tag=TAG_HDR, status=status)
        src = status.Get_source()
        if hdr[0] == KIND_DONE:
            done += 1
            continue
        t_in = now()
        comm.Recv(as_buffer(gbuf), source=src, tag=TAG_GRAD)
        staleness = version - int(hdr[2])
        scale = 1.0 / staleness if staleness_lr and staleness > 0 else 1.0
        for p, v in zip(params, grads):
            p.grad.copy_(v)
        opt.param_groups[0]["lr"] = lr_per_update * scale
        with torch.no_grad():
            opt.step()
        version += 1
        torch.cat([p.detach().view(-1) for p in params], out=pbuf)
        ver[0] = version
        comm.Send(as_buffer(pbuf), dest=src, tag=TAG_PARAM)
        comm.Send(ver, dest=src, tag=TAG_HDR)
        t_out = now()
        res.busy_s += t_out - t_in
        res.updates.append({"update": version, "worker": src, "worker_step": int(hdr[1]),
                            "warmup": int(hdr[1]) < cfg.warmup, "staleness": staleness,
                            "lr_scale": scale,
                            "loss": None if np.isnan(hdr[3]) else float(hdr[3]),
                            "t_s": t_out - t0 - eval_s,
                            "apply_s": t_out - t_in})
        if evaluate is not None and eval_every and version % eval_every == 0:
            wall = t_out - t0 - eval_s
            te = now()
            res.evals.append({"update": version, "wall_s": wall, "accuracy": evaluate()})
            eval_s += now() - te  # workers wait meanwhile; not counted as training time
    res.wall_s = now() - t0 - eval_s
    opt.param_groups[0]["lr"] = base_lr
    return res


def _wire(cfg, params: Sequence[torch.Tensor]) -> torch.dtype:
    from commbench.strategies.base import COMPRESSIONS

    return COMPRESSIONS.get(getattr(cfg, "compression", "none")) or params[0].dtype


def _worker(mpi, comm, workload, cfg) -> PSResult:
    from commbench.comm.mpi import as_buffer

    params = model_params(workload)
    numel = sum(p.numel() for p in params)
    wire = _wire(cfg, params)
    gbuf = torch.empty(numel, dtype=wire)
    gviews = _flat_views(gbuf, workload.grads)
    pbuf = torch.empty(numel, dtype=params[0].dtype)
    pviews = _flat_views(pbuf, params)
    hdr = np.zeros(HDR_LEN)
    ver = np.zeros(1, dtype=np.int64)
    version = 0
    nbytes = numel * (wire.itemsize + pbuf.element_size())
    res = PSResult()
    timer = StepTimer()
    real = hasattr(workload, "params")

    def ignore(_i: int) -> None:
        pass

    for k in range(cfg.warmup + cfg.steps):
        timer.begin_step(k, k < cfg.warmup, 0.0)
        workload.forward(timer, None)
        workload.backward(timer, ignore, None)
        loss = getattr(workload, "loss", None)
        loss = float(loss.detach()) if loss is not None else None
        with timer.comm_span(nbytes, calls=2):
            for g, v in zip(workload.grads, gviews):
                v.copy_(g)
            hdr[:] = (KIND_GRAD, k, version, np.nan if loss is None else loss)
            comm.Send(hdr, dest=SERVER, tag=TAG_HDR)
            comm.Send(as_buffer(gbuf), dest=SERVER, tag=TAG_GRAD)
            comm.Recv(as_buffer(pbuf), source=SERVER, tag=TAG_PARAM)
            comm.Recv(ver, source=SERVER, tag=TAG_HDR)
            version = int(ver[0])
            if real:
                with torch.no_grad():
                    for p, v in zip(params, pviews):
                        p.copy_(v)
        res.samples.append(timer.end_step())
        res.losses.append(loss)
    hdr[:] = (KIND_DONE, cfg.warmup + cfg.steps, version, np.nan)
    comm.Send(hdr, dest=SERVER, tag=TAG_HDR)
    return res


def run_ps(comm: Communicator, cfg, workload, staleness_lr: bool = False, eval_every: int = 0,
           evaluate: Callable[[], float | None] | None = None) -> PSResult:
    """Run the server (rank 0) or a worker; every rank returns what it saw.

    ``workload`` on the server supplies the parameters (and ``evaluate``,
    called every ``eval_every`` updates, outside the training time); workers
    should build theirs with worker index ``rank - 1`` of ``size - 1``.
    """
    from mpi4py import MPI

    PSStrategy.check(comm, "native")
    mpi_comm = comm.comm.Dup()  # its own tag space, apart from every other message
    try:
        comm.barrier()
        if comm.rank == SERVER:
            return _server(MPI, mpi_comm, workload, cfg, staleness_lr, eval_every, evaluate)
        return _worker(MPI, mpi_comm, workload, cfg)
    finally:
        mpi_comm.Free()


def summarize_updates(updates: Sequence[dict], batch_size: int) -> dict:
    """Staleness distribution, server-measured throughput of the measured updates."""
    measured = [u for u in updates if not u["warmup"]]
    tau = [u["staleness"] for u in measured]
    out = {"updates": len(updates), "measured_updates": len(measured),
           "staleness_hist": {str(k): v for k, v in sorted(Counter(tau).items())},
           "staleness_stats": metrics.summarize(tau),
           "staleness_mean": sum(tau) / len(tau) if tau else None}
    if len(measured) >= 2:
        span = measured[-1]["t_s"] - measured[0]["t_s"] + measured[0]["apply_s"]
        out["server_throughput"] = len(measured) * batch_size / span if span > 0 else None
    else:
        out["server_throughput"] = None
    return out


def run_one_ps(comm: Communicator, cfg, writer, vers: dict, threads: int) -> dict | None:
    """``commbench.allreduce``'s run for ``--strategy ps``: step records of the workers,
    one ``update`` record per applied gradient, a summary (rank 0 writes them)."""
    import uuid

    from commbench.allreduce import rank_extras, summarize_extras
    from commbench.results import run_header
    from commbench.runner import step_record, summarize_steps
    from commbench.workloads import make_workload

    workers = comm.size - 1
    worker_index = max(comm.rank - 1, 0)  # the server builds worker 0's shard (unused)
    workload = make_workload(cfg, worker_index, workers)
    res = run_ps(comm, cfg, workload, staleness_lr=cfg.staleness_lr)
    extra = rank_extras(workload) if comm.rank == SERVER else None
    gathered = comm.gather_object((res, extra))
    if comm.rank != SERVER:
        return None
    server = gathered[0][0]
    head = dict(run_id=uuid.uuid4().hex[:12], strategy="ps", algo=None, backend=comm.name,
                topo=comm.topo, workload=workload,
                knobs={"servers": 1, "workers": workers, "staleness_lr": cfg.staleness_lr,
                       "lr_per_update": cfg.lr / workers,
                       "compression": cfg.compression, "transport": "mpi4py Send/Recv"},
                config=cfg.as_dict(), vers=vers, torch_threads=threads)
    per_worker = [g[0].samples for g in gathered[1:]]
    steps = []
    for k in range(len(per_worker[0])):
        rec = step_record([s[k] for s in per_worker], workers)
        rec["busbw_gbps"] = None  # point-to-point round trips, not an all-reduce
        rec["critical_rank"] += 1  # a worker's global rank
        rec["loss"] = [g[0].losses[k] for g in gathered[1:]]
        steps.append(rec)
        writer.write({**run_header(kind="step", **head), **rec, "wrong": 0})
    for u in server.updates:
        writer.write({**run_header(kind="update", **head), **u})
    upd = summarize_updates(server.updates, workload.batch_size)
    summary = {**run_header(kind="summary", **head),
               **summarize_steps(steps, cfg.batch_size * workers),
               **upd,
               "throughput_steps": None,
               "wrong": 0, "elements_checked": 0,
               **summarize_extras([extra]),
               "server_busy_share": server.busy_s / server.wall_s if server.wall_s else None,
               "server_wall_s": server.wall_s,
               "validated": False}  # no all-reduce to check; tests check convergence
    # Workers are not in lockstep: the server's count of samples per second is the rate.
    summary["throughput_steps"] = summary["throughput"]
    summary["throughput"] = upd["server_throughput"]
    writer.write(summary)
    return summary
