"""Synchronisation strategies, registered by name (one module each).

A new strategy is one module with a ``Strategy`` subclass plus one line in
``STRATEGIES``. A strategy imports no tool and no workload
(``tests/test_import_contract.py``); the parameter server, which runs its own
loops rather than a step's sync, is a tool: ``python -m commbench.ps``.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

from commbench.comm.base import Communicator
from commbench.strategies.algos import ALGOS, get_algo
from commbench.strategies.base import Strategy
from commbench.strategies.bucketed import BucketedStrategy
from commbench.strategies.flat import FlatStrategy
from commbench.strategies.hierarchical import HierarchicalStrategy
from commbench.strategies.peers import DDPStrategy, HorovodStrategy
from commbench.strategies.stale import AsyncStrategy

STRATEGIES: dict[str, type[Strategy]] = {
    "flat": FlatStrategy,
    "bucketed": BucketedStrategy,
    "hierarchical": HierarchicalStrategy,
    "horovod": HorovodStrategy,  # hvd.DistributedOptimizer on the workload's model
    "ddp": DDPStrategy,  # torch DistributedDataParallel on Gloo
    "async": AsyncStrategy,  # bounded staleness s (module stale: async is a keyword)
}


def make_strategy(name: str, comm: Communicator, grads: Sequence[torch.Tensor],
                  algo: str = "native", **knobs: Any) -> Strategy:
    """Build strategy ``name``; each of ``knobs`` (``bucket_mb``, ``backward_order``, ...)
    goes to the strategies whose constructor takes it."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    cls = STRATEGIES[name]
    takes = inspect.signature(cls).parameters
    kwargs = {k: v for k, v in knobs.items() if k in takes}
    return cls(comm, grads, algo=algo, **kwargs) if cls.uses_algo else cls(comm, grads, **kwargs)


__all__ = ["ALGOS", "STRATEGIES", "Strategy", "get_algo", "make_strategy"]
