"""Parameter-server loops: workers push gradients and pull parameters on their own.

Rank 0 is the server: it holds the parameters and an SGD optimizer (the real
workload's own, ``--lr`` and ``--momentum``; momentum 0.9 on the synthetic one).
Every other rank is a worker:

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

The server loops: receive a header from any worker
(``Communicator.recv_any``), then that worker's gradient; apply it at once
(staleness = current version - the version the worker computed on = the
number of other workers' updates applied in between); send the new
parameters back. No worker waits for another, only for the server's round
trip; the server applies one gradient at a time, in arrival order.

Why server loops and not MPI one-sided communication: an SGD step with
momentum is not an ``MPI_Accumulate`` (the update is not an elementwise sum,
and the momentum state lives with the parameters); the staleness of each
gradient needs a version counter that is read and advanced atomically with
the update, which a single server loop gives for free; and Open MPI's
passive-target one-sided operations, like its non-blocking collectives
(docs/strategies.md, "Overlap"), advance only while the target process is inside an MPI
call, so a server process would have to poll anyway.

Mitigation: ``--staleness-lr`` scales the learning rate of each update by
1/staleness of that gradient (1 for staleness 0), Zhang et al. 2016,
https://arxiv.org/abs/1511.05950 — per gradient, as that paper does.

Messages go through a duplicate of the job's communicator
(``Communicator.dup``): a tag space of their own, apart from every other
message of the job. They need point-to-point messages (``supports_p2p``: the
mpi backend, or Horovod on its MPI controller) and at least 2 ranks
(``check``).

What each rank saw comes back as a ``PSResult``; the tools turn it into
records: ``commbench.ps`` (step, update and summary records) and the
convergence study ``commbench.staleness``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from commbench import metrics
from commbench.comm.base import Communicator
from commbench.flags import flag
from commbench.flatbuf import FlatBuffer
from commbench.strategies.settings import COMPRESSIONS
from commbench.timing import StepSample, StepTimer, now
from commbench.workloads import Workload

SERVER = 0
TAG_HDR, TAG_GRAD, TAG_PARAM = 11, 12, 13
KIND_GRAD, KIND_DONE = 0, 1
#: push header, float64: kind, worker step, parameter version it was computed on, loss
HDR_LEN = 4


@dataclass(frozen=True)
class PSSettings:
    """What the server and the workers run besides the workload."""

    lr: float  #: the synchronous rate; each update applies lr / workers (module docstring)
    steps: int  #: each worker's measured steps
    warmup: int = 0  #: each worker's warm-up steps before them (flagged in updates)
    compression: str = flag("--compression", default="none", choices=tuple(COMPRESSIONS),
                            help="push gradients in this dtype (the server casts them back)")
    staleness_lr: bool = flag("--staleness-lr", default=False, action="store_true",
                              help="scale each update's learning rate by 1/its staleness "
                                   "(Zhang et al. 2016)")
    eval_every: int = 0  #: the server evaluates every this many updates (0: never)


def check(comm: Communicator) -> None:
    """Raise ValueError, naming the cause, where the parameter server cannot run."""
    if not comm.supports_p2p or not comm.supports_recv_any:
        lacks = "point-to-point messages" if not comm.supports_p2p else \
            "receives from any source"
        raise ValueError(f"the parameter server needs point-to-point messages received from "
                         f"whichever worker is ready, and the {comm.name} backend has no "
                         f"{lacks}: launch it with mpirun (or horovodrun --mpi), or under "
                         "torchrun with --dist-backend gloo")
    if comm.size < 2:
        raise ValueError(f"the parameter server needs at least 2 ranks (1 server + workers), "
                         f"got {comm.size}")


def model_params(workload: Workload) -> list[torch.Tensor]:
    """The tensors the server updates: the model's (the replayed workload's too, updated
    all the same, so the cost is real)."""
    return list(workload.params)


@dataclass
class PSResult:
    """What one rank saw. Server: updates and evaluations; worker: its step samples."""

    samples: list[StepSample] = field(default_factory=list)
    losses: list[float | None] = field(default_factory=list)
    updates: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    busy_s: float = 0.0


def _server(comm: Communicator, workload, settings: PSSettings,
            evaluate: Callable[[], float | None] | None) -> PSResult:
    params = model_params(workload)
    opt = (workload.opt if workload.real
           else torch.optim.SGD(params, lr=settings.lr, momentum=0.9))
    workers = comm.size - 1
    base_lr = opt.param_groups[0]["lr"]
    lr_per_update = base_lr / workers  # a round of one update per worker = one sync step
    gbuf = FlatBuffer(params, dtype=_wire(settings, params), device="cpu")
    for p in params:
        p.grad = torch.zeros_like(p)
    pbuf = FlatBuffer(params, device="cpu")
    hdr = torch.zeros(HDR_LEN, dtype=torch.float64)
    ver = torch.zeros(1, dtype=torch.int64)
    res = PSResult()
    done = version = 0
    eval_s = 0.0
    t0 = now()
    while done < workers:
        src = comm.recv_any(hdr, tag=TAG_HDR)
        kind, worker_step, pulled, loss = hdr.tolist()
        if kind == KIND_DONE:
            done += 1
            continue
        t_in = now()
        comm.recv(gbuf.flat, src, tag=TAG_GRAD)
        staleness = version - int(pulled)
        scale = 1.0 / staleness if settings.staleness_lr and staleness > 0 else 1.0
        gbuf.unpack([p.grad for p in params])
        opt.param_groups[0]["lr"] = lr_per_update * scale
        with torch.no_grad():
            opt.step()
        version += 1
        pbuf.pack(params)
        ver[0] = version
        comm.send(pbuf.flat, src, tag=TAG_PARAM)
        comm.send(ver, src, tag=TAG_HDR)
        t_out = now()
        res.busy_s += t_out - t_in
        res.updates.append({"update": version, "worker": src, "worker_step": int(worker_step),
                            "warmup": int(worker_step) < settings.warmup,
                            "staleness": staleness, "lr_scale": scale,
                            "loss": None if math.isnan(loss) else loss,
                            "t_s": t_out - t0 - eval_s,
                            "apply_s": t_out - t_in})
        if evaluate is not None and settings.eval_every and version % settings.eval_every == 0:
            wall = t_out - t0 - eval_s
            te = now()
            res.evals.append({"update": version, "wall_s": wall, "accuracy": evaluate()})
            eval_s += now() - te  # workers wait meanwhile; not counted as training time
    res.wall_s = now() - t0 - eval_s
    opt.param_groups[0]["lr"] = base_lr
    return res


def _wire(settings: PSSettings, params: Sequence[torch.Tensor]) -> torch.dtype:
    return COMPRESSIONS[settings.compression] or params[0].dtype


def _worker(comm: Communicator, workload, settings: PSSettings) -> PSResult:
    params = model_params(workload)
    gbuf = FlatBuffer(workload.grads, dtype=_wire(settings, params), device="cpu")
    pbuf = FlatBuffer(params, device="cpu")
    hdr = torch.zeros(HDR_LEN, dtype=torch.float64)
    ver = torch.zeros(1, dtype=torch.int64)
    version = 0
    nbytes = gbuf.nbytes + pbuf.nbytes
    res = PSResult()
    timer = StepTimer()
    real = workload.real

    def ignore(_i: int) -> None:
        pass

    steps = settings.warmup + settings.steps
    for k in range(steps):
        timer.begin_step(k, k < settings.warmup, 0.0)
        workload.forward(timer, None)
        workload.backward(timer, ignore, None)
        loss = float(workload.loss.detach()) if real else None
        # not a collective: workers push and pull on their own, so the push/pull of one
        # worker's step k has no counterpart to split wait from transfer by (whole=False)
        with timer.comm_span(nbytes, calls=2, whole=False):
            gbuf.pack(workload.grads)
            hdr.copy_(torch.tensor([KIND_GRAD, k, version, math.nan if loss is None else loss],
                                   dtype=torch.float64))
            comm.send(hdr, SERVER, tag=TAG_HDR)
            comm.send(gbuf.flat, SERVER, tag=TAG_GRAD)
            comm.recv(pbuf.flat, SERVER, tag=TAG_PARAM)
            comm.recv(ver, SERVER, tag=TAG_HDR)
            version = int(ver[0])
            if real:
                pbuf.unpack(params)
        res.samples.append(timer.end_step())
        res.losses.append(loss)
    hdr.copy_(torch.tensor([KIND_DONE, steps, version, math.nan], dtype=torch.float64))
    comm.send(hdr, SERVER, tag=TAG_HDR)
    return res


def run_ps(comm: Communicator, settings: PSSettings, workload,
           evaluate: Callable[[], float | None] | None = None) -> PSResult:
    """Run the server (rank 0) or a worker; every rank returns what it saw.

    ``workload`` on the server supplies the parameters (and ``evaluate``,
    called every ``settings.eval_every`` updates, outside the training time);
    workers should build theirs with worker index ``rank - 1`` of ``size - 1``.
    Collective: every rank calls it.
    """
    check(comm)
    ps_comm = comm.dup()  # a tag space of its own, apart from every other message
    try:
        ps_comm.barrier()
        if comm.rank == SERVER:
            return _server(ps_comm, workload, settings, evaluate)
        return _worker(ps_comm, workload, settings)
    finally:
        ps_comm.close()


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
