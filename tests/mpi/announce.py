"""The orders a check script under tests/mpi announces gradients in, one per step: as
backward produces them, shuffled differently on each rank, and with three never
announced (the strategy must take those as they are when the step finishes)."""

from __future__ import annotations

import torch

HOW = ("backward order", "shuffled per rank", "some unannounced")


def announced(how: str, order: list[int], rank: int) -> list[int]:
    """The gradients rank ``rank`` announces, in order, for a step of kind ``how``."""
    if how == "shuffled per rank":
        gen = torch.Generator().manual_seed(7 + 31 * rank)
        return [order[k] for k in torch.randperm(len(order), generator=gen)]
    if how == "some unannounced":
        return order[: len(order) // 2] + order[len(order) // 2 + 3:]
    return list(order)
