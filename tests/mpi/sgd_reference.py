"""What the sharded strategies' checks against flat + SGD share (``zero_vs_flat.py``,
``check_hsdp_vs_flat.py``): the parameters' shapes, every rank's gradients, the reference
(flat's mean gradient, then ``torch.optim.SGD``), and the steps a strategy takes against it.

Parameters are a few odd small tensors (one element and three: fewer than the ranks, so
per-tensor buckets leave some ranks an empty shard; primes: uneven shards) and ResNet-18's
shapes under a size limit, from the same random values on every rank. At each step rank
``r``'s gradient is ``a + r * b`` (``a`` and ``b`` random, drawn alike on every rank). The
strategy takes the same steps from the same start on its own copy, announcing the gradients
in each of ``announce.HOW``'s orders; after every step its parameters must match the
reference within float tolerance on every rank, and the timer must have seen the expected
collectives; the validation pass must then give the closed-form mean (``count_wrong``: 0)
and leave the parameters alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from announce import HOW, announced  # beside this script (scripts run as files)

from commbench.models import parameter_shapes
from commbench.strategies import make_strategy
from commbench.timing import StepTimer
from commbench.validate import count_wrong

SGD = {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}
RTOL, ATOL = 1e-5, 1e-6  # float32 sums of O(1) values over a few ranks, three steps


def shapes(limit: int) -> list[tuple[int, ...]]:
    odd = [(1,), (3,), (7, 13), (1009,)]
    return odd + [tuple(s) for _, s in parameter_shapes("resnet18", 1000)
                  if math.prod(s) < limit]


def gradients(rank: int, step: int, shp: list[tuple[int, ...]]) -> list[torch.Tensor]:
    """This rank's gradients at ``step``: ``a + rank * b``, ``a`` and ``b`` alike on every
    rank."""
    gen = torch.Generator().manual_seed(100 + step)
    a = [torch.randn(s, generator=gen) for s in shp]
    b = [torch.randn(s, generator=gen) for s in shp]
    return [x + rank * y for x, y in zip(a, b)]


def model(start: list[torch.Tensor]) -> SimpleNamespace:
    """What the sharded strategies need of a workload: its parameters and its SGD."""
    params = [torch.nn.Parameter(p.clone()) for p in start]
    return SimpleNamespace(params=params, opt=torch.optim.SGD(params, **SGD))


@dataclass
class Reference:
    """The job's shapes, gradient tensors and backward order, and flat + SGD's parameters
    after each step of ``HOW``."""

    comm: Any
    shp: list[tuple[int, ...]]
    order: list[int]
    start: list[torch.Tensor]
    grads: list[torch.Tensor]
    want: list[list[torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(g.numel() * 4 for g in self.grads)

    def fill(self, step: int) -> None:
        for g, v in zip(self.grads, gradients(self.comm.rank, step, self.shp)):
            g.copy_(v)

    def steps(self, run: str, strategy: Any, wl: SimpleNamespace, collectives: int,
              phases: set[str]) -> list[str]:
        """``strategy`` (on ``wl``, the gradients ``grads``) through every step of ``HOW``
        against the reference: what differs, in words. The timer must see ``collectives``
        collectives of the gradient's bytes a step, of ``phases``."""
        bad = []
        for step, (how, expect) in enumerate(zip(HOW, self.want)):
            self.fill(step)
            timer = StepTimer()
            timer.begin_step(step, False)
            strategy.begin_step(timer)
            for i in announced(how, self.order, self.comm.rank):
                strategy.on_ready(i)
            strategy.finish()
            wl.opt.step()  # as the workload steps: nothing left to do
            sample = timer.end_step()
            for i, (p, w) in enumerate(zip(wl.params, expect)):
                if not torch.allclose(p.detach(), w, rtol=RTOL, atol=ATOL):
                    bad.append(f"{run} {how}: parameter {i} {tuple(p.shape)} differs from "
                               f"flat + SGD by {float((p.detach() - w).abs().max()):.3g}")
            if sample.comm_calls != collectives or sample.comm_bytes != self.nbytes \
                    or len(sample.collective_s) != collectives:
                bad.append(f"{run} {how}: timer saw {sample.comm_calls} collectives of "
                           f"{sample.comm_bytes} bytes, expected {collectives} of "
                           f"{self.nbytes}")
            if set(sample.comm_phases) != phases or not sample.comm_s > 0:
                bad.append(f"{run} {how}: comm phases {sample.comm_phases}, comm "
                           f"{sample.comm_s}")
        stepped = [p.detach().clone() for p in wl.params]
        wrong, checked = count_wrong(strategy, self.order)
        if wrong or checked != self.nbytes // 4:
            bad.append(f"{run}: validation {wrong} wrong of {checked}")
        if any(not torch.equal(p.detach(), s) for p, s in zip(wl.params, stepped)):
            bad.append(f"{run}: the validation pass moved the parameters")
        return bad


def reference(comm: Any, limit: int) -> Reference:
    """Flat's mean gradient then torch's SGD, a step for each of ``HOW``, on ``shapes(limit)``
    in reverse registration order as backward's."""
    shp = shapes(limit)
    start = [torch.randn(s, generator=torch.Generator().manual_seed(7)) for s in shp]
    ref = Reference(comm, shp, list(reversed(range(len(shp)))), start,
                    [torch.empty(s) for s in shp], [])
    wl = model(start)
    flat = make_strategy("flat", comm, ref.grads, algo="native")
    for step in range(len(HOW)):
        ref.fill(step)
        flat.begin_step(StepTimer())
        flat.finish()
        for p, g in zip(wl.params, ref.grads):
            p.grad = g.clone()
        wl.opt.step()
        ref.want.append([p.detach().clone() for p in wl.params])
    return ref
