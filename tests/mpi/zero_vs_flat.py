"""Run under mpirun/torchrun/horovodrun: zero1 and zero2 step the parameters as flat + SGD.

Parameters have ResNet-18's shapes (those under 600k elements, to keep the job short on
oversubscribed cores) plus a few odd small ones: one element and three, fewer than the
ranks, so that per-tensor buckets leave some ranks an empty shard. They start from the
same random values on every rank. At each step rank ``r``'s gradient is ``a + r * b``
(``a`` and ``b`` random, drawn alike on every rank). The reference is flat's mean, then
``torch.optim.SGD`` (momentum, weight decay) on a copy of the parameters. Each ZeRO
strategy, at several bucket caps (0 = one bucket per tensor, a tiny one, 1 MB, one
bucket for all), takes the same steps from the same start on its own copy, announcing
the gradients in backward order, then in an order shuffled differently on every rank
(the collectives must still be issued in one order), then with some never announced
(``finish`` takes them as they are). After every step its parameters must match the
reference within float tolerance, on every rank; the timer must have seen one
reduce-scatter and one all-gather per bucket, each kind's time apart; the validation
pass must give the closed-form mean (``count_wrong``: 0) and leave the parameters alone;
and the bytes each rank hands over must sum to 2(n-1) times the gradient's. Exits 1 on
a mismatch.

    mpirun -np 3 python tests/mpi/zero_vs_flat.py mpi
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
from commbench.timing import StepTimer
from commbench.validate import count_wrong

BUCKET_MB = [0, 0.01, 1, 1000]
SGD = {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}
RTOL, ATOL = 1e-5, 1e-6  # float32 sums of O(1) values over a few ranks, three steps


def shapes() -> list[tuple[int, ...]]:
    odd = [(1,), (3,), (7, 13), (1009,)]  # fewer elements than ranks, primes: uneven shards
    return odd + [tuple(s) for _, s in parameter_shapes("resnet18", 1000)
                  if math.prod(s) < 600_000]


def gradients(rank: int, step: int, shp: list[tuple[int, ...]]) -> list[torch.Tensor]:
    """This rank's gradients at ``step``: ``a + rank * b``, ``a`` and ``b`` alike on every
    rank."""
    gen = torch.Generator().manual_seed(100 + step)
    a = [torch.randn(s, generator=gen) for s in shp]
    b = [torch.randn(s, generator=gen) for s in shp]
    return [x + rank * y for x, y in zip(a, b)]


def model(start: list[torch.Tensor]) -> SimpleNamespace:
    """What the ZeRO strategies need of a workload: its parameters and its SGD."""
    params = [torch.nn.Parameter(p.clone()) for p in start]
    return SimpleNamespace(params=params, opt=torch.optim.SGD(params, **SGD))


def main() -> int:
    comm = make_communicator(sys.argv[1] if len(sys.argv) > 1 else "mpi")
    n, r = comm.size, comm.rank
    shp = shapes()
    order = list(reversed(range(len(shp))))
    start = [torch.randn(s, generator=torch.Generator().manual_seed(7)) for s in shp]
    grads = [torch.empty(s) for s in shp]
    nbytes = sum(g.numel() * 4 for g in grads)
    bad: list[str] = []
    # the reference: flat's mean gradient, then torch's SGD
    ref = model(start)
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
    for name in ("zero1", "zero2"):
        for mb in BUCKET_MB:
            run = f"{name} bucket_mb={mb}"
            wl = model(start)
            zero = make_strategy(name, comm, grads, bucket_mb=mb, backward_order=order,
                                 workload=wl)
            knobs = zero.knobs()
            buckets = knobs["buckets"]
            if sum(knobs["bucket_bytes"]) != nbytes:
                bad.append(f"{run}: buckets hold {sum(knobs['bucket_bytes'])} bytes, "
                           f"gradients {nbytes}")
            if sum(knobs["library_bytes_per_step_ranks"]) != 2 * (n - 1) * nbytes:
                bad.append(f"{run}: ranks hand over {knobs['library_bytes_per_step_ranks']} "
                           f"bytes, not 2(n-1) x {nbytes} in all")
            if sum(knobs["shard_elements_ranks"]) != nbytes // 4:
                bad.append(f"{run}: shards {knobs['shard_elements_ranks']} do not tile the "
                           "gradient")
            for step, (how, expect) in enumerate(zip(HOW, want)):
                for g, v in zip(grads, gradients(r, step, shp)):
                    g.copy_(v)
                announce = announced(how, order, r)
                timer = StepTimer()
                timer.begin_step(step, False)
                zero.begin_step(timer)
                for i in announce:
                    zero.on_ready(i)
                zero.finish()
                wl.opt.step()  # as the workload steps: nothing left to do
                sample = timer.end_step()
                for i, (p, w) in enumerate(zip(wl.params, expect)):
                    if not torch.allclose(p.detach(), w, rtol=RTOL, atol=ATOL):
                        bad.append(f"{run} {how}: parameter {i} {tuple(p.shape)} differs from "
                                   f"flat + SGD by {float((p.detach() - w).abs().max()):.3g}")
                if sample.comm_calls != 2 * buckets or sample.comm_bytes != nbytes \
                        or len(sample.collective_s) != 2 * buckets:
                    bad.append(f"{run} {how}: timer saw {sample.comm_calls} collectives of "
                               f"{sample.comm_bytes} bytes, expected {2 * buckets} of {nbytes}")
                if set(sample.comm_phases) != {"reduce_scatter", "allgather"} \
                        or not sample.comm_s > 0:
                    bad.append(f"{run} {how}: comm phases {sample.comm_phases}, comm "
                               f"{sample.comm_s}")
            stepped = [p.detach().clone() for p in wl.params]
            wrong, checked = count_wrong(zero, order)
            if wrong or checked != nbytes // 4:
                bad.append(f"{run}: validation {wrong} wrong of {checked}")
            if any(not torch.equal(p.detach(), s) for p, s in zip(wl.params, stepped)):
                bad.append(f"{run}: the validation pass moved the parameters")
            # zero1 holds the whole gradient; zero2 buffers of the largest bucket's size, at
            # least two, where two of them hold less than the whole gradient (else as zero1)
            held, largest = zero.knobs()["grad_buffer_bytes"], max(knobs["bucket_bytes"])
            pooled = name == "zero2" and 2 * largest < nbytes
            if (held % largest or held < 2 * largest) if pooled else held != nbytes:
                bad.append(f"{run}: holds {held} bytes of gradient buffers")
            zero.close()
    return verdict(comm, bad, f"OK zero1, zero2 == flat + SGD on {n} ranks, "
                              f"bucket_mb {BUCKET_MB}")


if __name__ == "__main__":
    sys.exit(main())
