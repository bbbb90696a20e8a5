"""Correctness beside speed: reduce known values and count wrong elements.

After the timed steps every run fills its gradients with values whose sum
over ranks has a closed form, runs them through the same strategy the steps
used, and counts the elements that differ from the closed form (nccl-tests'
``#wrong``). Rank ``r`` holds ``(r+1) * pattern`` with
``pattern[j] = (j + i) % 13 + 1`` for element ``j`` of tensor ``i``; the mean
over ``n`` ranks is ``(n+1)/2 * pattern``, exact in float32 for any sane ``n``.
With ``--compression`` the sums are taken in the compressed dtype, whose
rounding grows with the number of additions: the tolerance is then
``n * eps`` of that dtype (float16: 1e-3 per rank, bfloat16: 8e-3 per rank).
"""

from __future__ import annotations

import torch

from commbench.strategies.base import Strategy

RTOL = 1e-6


def _pattern(numel: int, i: int) -> torch.Tensor:
    return ((torch.arange(numel, dtype=torch.int64) + i) % 13 + 1).to(torch.float32)


def tolerance(wire: torch.dtype, ranks: int) -> float:
    """Relative tolerance for a mean summed over ``ranks`` in dtype ``wire``."""
    if wire in (torch.float32, torch.float64):
        return RTOL
    return max(RTOL, ranks * torch.finfo(wire).eps)


def count_wrong(strategy: Strategy, backward_order: list[int]) -> tuple[int, int]:
    """Return (wrong elements, elements checked) on this rank."""
    comm, grads = strategy.comm, strategy.grads
    for i, g in enumerate(grads):
        g.copy_(_pattern(g.numel(), i).view_as(g) * (comm.rank + 1))
    strategy.validation_pass(backward_order)
    scale = (comm.size + 1) / 2.0
    rtol = tolerance(strategy.wire, comm.size)
    wrong = checked = 0
    for i, g in enumerate(grads):
        expected = _pattern(g.numel(), i) * scale
        ok = torch.isclose(g.reshape(-1).cpu(), expected, rtol=rtol, atol=0.0)
        wrong += int((~ok).sum())
        checked += g.numel()
    return wrong, checked
