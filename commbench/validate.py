"""Correctness beside speed: reduce known values and count wrong elements.

After the timed steps every run fills its gradients with values whose sum
over ranks has a closed form, runs them through the same strategy the steps
used, and counts the elements that differ from the closed form (nccl-tests'
``#wrong``). Rank ``r`` holds ``(r+1) * pattern`` with
``pattern[j] = (j + i) % 13 + 1`` for element ``j`` of tensor ``i``; the mean
over ``n`` ranks is ``(n+1)/2 * pattern``, exact in float32 for any sane ``n``.
"""

from __future__ import annotations

import torch

from commbench.strategies.base import Strategy
from commbench.timing import NullTimer

RTOL = 1e-6


def _pattern(numel: int, i: int) -> torch.Tensor:
    return ((torch.arange(numel, dtype=torch.int64) + i) % 13 + 1).to(torch.float32)


def count_wrong(strategy: Strategy, backward_order: list[int]) -> tuple[int, int]:
    """Return (wrong elements, elements checked) on this rank."""
    comm, grads = strategy.comm, strategy.grads
    for i, g in enumerate(grads):
        g.copy_(_pattern(g.numel(), i).view_as(g) * (comm.rank + 1))
    strategy.begin_step(NullTimer())
    for i in backward_order:
        strategy.on_ready(i)
    strategy.finish()
    scale = (comm.size + 1) / 2.0
    wrong = checked = 0
    for i, g in enumerate(grads):
        expected = _pattern(g.numel(), i) * scale
        ok = torch.isclose(g.reshape(-1), expected, rtol=RTOL, atol=0.0)
        wrong += int((~ok).sum())
        checked += g.numel()
    return wrong, checked
