"""Synchronisation strategies, registered by name (one module each).

A new strategy is one module with a ``Strategy`` subclass plus one line in
``STRATEGIES``; every strategy is built the same way, from the communicator,
the gradients and one ``StrategySettings``. A strategy imports no tool and no workload
(``tests/test_import_contract.py``); the parameter server, which runs its own
loops rather than a step's sync, is a tool: ``python -m commbench.ps``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from commbench.comm.base import Communicator
from commbench.strategies.asynchronous import AsyncStrategy
from commbench.strategies.base import Strategy
from commbench.strategies.bucketed import BucketedStrategy
from commbench.strategies.flat import FlatStrategy
from commbench.strategies.hierarchical import HierarchicalStrategy
from commbench.strategies.peers import DDPStrategy, HorovodStrategy
from commbench.strategies.settings import StrategySettings

STRATEGIES: dict[str, type[Strategy]] = {
    "flat": FlatStrategy,
    "bucketed": BucketedStrategy,
    "hierarchical": HierarchicalStrategy,
    "horovod": HorovodStrategy,  # hvd.DistributedOptimizer on the workload's model
    "ddp": DDPStrategy,  # torch DistributedDataParallel on Gloo
    "async": AsyncStrategy,  # bounded staleness s (module asynchronous: async is a keyword)
}


def make_strategy(name: str, comm: Communicator, grads: Sequence[torch.Tensor],
                  settings: StrategySettings | None = None, *,
                  backward_order: Sequence[int] | None = None, workload: Any = None,
                  **fields: Any) -> Strategy:
    """Build strategy ``name`` from ``settings``; ``fields`` given by keyword
    (``bucket_mb=5``) replace those of ``settings`` (a name that is no field of
    ``StrategySettings`` is a TypeError). Every strategy gets the same settings
    and reads the fields that concern it. Whoever builds a strategy closes it."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    settings = replace(settings if settings is not None else StrategySettings(), **fields)
    return STRATEGIES[name](comm, grads, settings, backward_order=backward_order,
                            workload=workload)


__all__ = ["STRATEGIES", "Strategy", "StrategySettings", "make_strategy"]
