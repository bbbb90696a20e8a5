"""Run under mpirun/torchrun/horovodrun on emulated nodes of equal size: hsdp steps the
parameters as flat + SGD.

The ranks' node names come from ``tests/fakes.py --nodes`` (``a,a,b,b``: 2 nodes x 2
ranks). Parameters are a few odd small tensors (one element and three: fewer than a node's
ranks, so per-tensor buckets leave some ranks an empty shard and some replica groups an
empty all-reduce) and ResNet-18's shapes under 100k elements, from the same random values
on every rank. At each step rank ``r``'s gradient is ``a + r * b`` (``a`` and ``b`` drawn
alike on every rank). The reference is flat's mean, then ``torch.optim.SGD`` (momentum,
weight decay) on a copy of the parameters. hsdp, at several bucket caps (0 = one bucket
per tensor, a tiny one, 1 MB, one bucket for all), takes the same steps from the same start,
announcing the gradients in backward order, then shuffled per rank, then with some never
announced. After every step its parameters must match the reference within float
tolerance on every rank; the timer must have seen one reduce-scatter, one all-reduce and
one all-gather per bucket, each kind's time apart, and the bucket's bytes once; the
validation pass must give the closed-form mean (``count_wrong``: 0) and leave the
parameters alone; the bytes each rank hands over must sum to 2(n-1) times the gradient's,
each node's shards must tile the gradient, and the node link must carry 2Ψ(N-1)/N.
Exits 1 on a mismatch.

    mpirun -np 4 python -m tests.fakes --nodes a,a,b,b tests/mpi/check_hsdp_vs_flat.py mpi
"""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import torch
from announce import HOW, announced  # beside this script (scripts run as files)
from verdict import verdict

from commbench.comm import make_communicator
from commbench.models import parameter_shapes
from commbench.strategies import make_strategy
from commbench.strategies.hsdp import node_ranks
from commbench.timing import StepTimer
from commbench.validate import count_wrong

BUCKET_MB = [0, 0.01, 1, 1000]
SGD = {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}
RTOL, ATOL = 1e-5, 1e-6  # float32 sums of O(1) values over a few ranks, three steps
PHASES = {"reduce_scatter", "allreduce", "allgather"}


def shapes() -> list[tuple[int, ...]]:
    odd = [(1,), (3,), (7, 13), (1009,)]  # fewer elements than a node's ranks, primes
    return odd + [tuple(s) for _, s in parameter_shapes("resnet18", 1000)
                  if math.prod(s) < 100_000]


def gradients(rank: int, step: int, shp: list[tuple[int, ...]]) -> list[torch.Tensor]:
    """This rank's gradients at ``step``: ``a + rank * b``, alike on every rank."""
    gen = torch.Generator().manual_seed(100 + step)
    a = [torch.randn(s, generator=gen) for s in shp]
    b = [torch.randn(s, generator=gen) for s in shp]
    return [x + rank * y for x, y in zip(a, b)]


def model(start: list[torch.Tensor]) -> SimpleNamespace:
    """What hsdp needs of a workload: its parameters and its SGD."""
    params = [torch.nn.Parameter(p.clone()) for p in start]
    return SimpleNamespace(params=params, opt=torch.optim.SGD(params, **SGD))


def check_knobs(run: str, knobs: dict, nodes: list[list[int]], n: int, nbytes: int) -> list[str]:
    bad = []
    if sum(knobs["bucket_bytes"]) != nbytes:
        bad.append(f"{run}: buckets hold {sum(knobs['bucket_bytes'])} bytes, gradients {nbytes}")
    if sum(knobs["library_bytes_per_step_ranks"]) != 2 * (n - 1) * nbytes:
        bad.append(f"{run}: ranks hand over {knobs['library_bytes_per_step_ranks']} bytes, "
                   f"not 2(n-1) x {nbytes} in all")
    for node in nodes:
        if sum(knobs["shard_elements_ranks"][r] for r in node) != nbytes // 4:
            bad.append(f"{run}: node {node}'s shards {knobs['shard_elements_ranks']} do not "
                       "tile the gradient")
    N = len(nodes)
    if knobs["node_link_bytes_per_step"] != 2 * nbytes * (N - 1) / N \
            or (knobs["nodes"], knobs["shard_group_size"], knobs["stage"]) != \
            (N, len(nodes[0]), 2):
        bad.append(f"{run}: knobs {knobs}")
    return bad


def main() -> int:
    comm = make_communicator(sys.argv[1] if len(sys.argv) > 1 else "mpi")
    n, r = comm.size, comm.rank
    nodes = node_ranks(comm.topo)
    shp = shapes()
    order = list(reversed(range(len(shp))))
    start = [torch.randn(s, generator=torch.Generator().manual_seed(7)) for s in shp]
    grads = [torch.empty(s) for s in shp]
    nbytes = sum(g.numel() * 4 for g in grads)
    bad: list[str] = []
    ref = model(start)  # the reference: flat's mean gradient, then torch's SGD
    flat = make_strategy("flat", comm, grads, algo="native")
    want = []
    for step in range(len(HOW)):
        for g, v in zip(grads, gradients(r, step, shp)):
            g.copy_(v)
        flat.begin_step(StepTimer())
        flat.finish()
        for p, g in zip(ref.params, grads):
            p.grad = g.clone()
        ref.opt.step()
        want.append([p.detach().clone() for p in ref.params])
    for mb in BUCKET_MB:
        run = f"hsdp bucket_mb={mb}"
        wl = model(start)
        hsdp = make_strategy("hsdp", comm, grads, bucket_mb=mb, backward_order=order,
                             workload=wl)
        knobs = hsdp.knobs()
        buckets = knobs["buckets"]
        bad += check_knobs(run, knobs, nodes, n, nbytes)
        for step, (how, expect) in enumerate(zip(HOW, want)):
            for g, v in zip(grads, gradients(r, step, shp)):
                g.copy_(v)
            timer = StepTimer()
            timer.begin_step(step, False)
            hsdp.begin_step(timer)
            for i in announced(how, order, r):
                hsdp.on_ready(i)
            hsdp.finish()
            wl.opt.step()  # as the workload steps: nothing left to do
            sample = timer.end_step()
            for i, (p, w) in enumerate(zip(wl.params, expect)):
                if not torch.allclose(p.detach(), w, rtol=RTOL, atol=ATOL):
                    bad.append(f"{run} {how}: parameter {i} {tuple(p.shape)} differs from "
                               f"flat + SGD by {float((p.detach() - w).abs().max()):.3g}")
            if sample.comm_calls != 3 * buckets or sample.comm_bytes != nbytes \
                    or len(sample.collective_s) != 3 * buckets:
                bad.append(f"{run} {how}: timer saw {sample.comm_calls} collectives of "
                           f"{sample.comm_bytes} bytes, expected {3 * buckets} of {nbytes}")
            if set(sample.comm_phases) != PHASES or not sample.comm_s > 0:
                bad.append(f"{run} {how}: comm phases {sample.comm_phases}, comm "
                           f"{sample.comm_s}")
        stepped = [p.detach().clone() for p in wl.params]
        wrong, checked = count_wrong(hsdp, order)
        if wrong or checked != nbytes // 4:
            bad.append(f"{run}: validation {wrong} wrong of {checked}")
        if any(not torch.equal(p.detach(), s) for p, s in zip(wl.params, stepped)):
            bad.append(f"{run}: the validation pass moved the parameters")
        hsdp.close()
    return verdict(comm, bad, f"OK hsdp == flat + SGD on {len(nodes)} nodes x "
                              f"{len(nodes[0])} ranks, bucket_mb {BUCKET_MB}")


if __name__ == "__main__":
    sys.exit(main())
