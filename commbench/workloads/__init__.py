"""Workloads: what produces the gradients each step.

A workload owns the gradient tensors (``grads``, in the model's parameter
order) and runs a step in three calls: ``forward``, ``backward`` (which
announces each gradient through ``on_ready(i)`` in the order backward
produces it, calling ``progress()`` while it computes so non-blocking
collectives can advance) and ``optimizer_step``.
"""

from __future__ import annotations

from typing import Callable

from commbench.workloads.synthetic import SyntheticWorkload

WORKLOADS: dict[str, Callable[..., object]] = {"synthetic": SyntheticWorkload}

__all__ = ["WORKLOADS", "SyntheticWorkload"]
