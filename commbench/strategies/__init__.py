"""Synchronisation strategies, registered by name (one module each).

A new strategy is one module with a ``Strategy`` subclass plus one line in
``STRATEGIES``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from commbench.comm.base import Communicator
from commbench.strategies.algos import ALGOS, get_algo
from commbench.strategies.base import Strategy
from commbench.strategies.flat import FlatStrategy

STRATEGIES: dict[str, type[Strategy]] = {
    "flat": FlatStrategy,
}


def make_strategy(name: str, comm: Communicator, grads: Sequence[torch.Tensor],
                  algo: str = "native") -> Strategy:
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    cls = STRATEGIES[name]
    return cls(comm, grads, algo=algo) if cls.uses_algo else cls(comm, grads)


__all__ = ["ALGOS", "STRATEGIES", "Strategy", "get_algo", "make_strategy"]
