"""Workloads: what produces the gradients each step.

A workload owns the gradient tensors (``grads``, in the model's parameter
order) and runs a step in three calls: ``forward``, ``backward`` (which
announces each gradient through ``on_ready(i)`` in the order backward
produces it, calling ``progress()`` while it computes so non-blocking
collectives can advance) and ``optimizer_step``.
"""

from __future__ import annotations

from typing import Callable

from commbench.config import WorkloadSpec
from commbench.workloads.resnet import ResNetWorkload
from commbench.workloads.synthetic import SyntheticWorkload

WORKLOADS: dict[str, Callable[..., object]] = {
    "synthetic": SyntheticWorkload,  # real gradient shapes, compute replayed
    "resnet": ResNetWorkload,        # real forward/backward passes
}


def make_workload(cfg: WorkloadSpec, rank: int, world_size: int = 1):
    """Build ``cfg.workload`` for ``rank`` (of ``world_size`` sharing the data set)."""
    if cfg.workload == "resnet":
        return ResNetWorkload(cfg.model, rank, seed=cfg.seed, batch_size=cfg.batch_size,
                              num_classes=cfg.num_classes, image_size=cfg.image_size,
                              lr=cfg.lr, device=cfg.device, dataset=cfg.dataset,
                              world_size=world_size)
    profile = None
    if cfg.compute_profile:
        from commbench.profile import load

        profile = load(cfg.compute_profile, cfg.model, cfg.num_classes)
    return SyntheticWorkload(cfg.model, cfg.compute_ms, rank, seed=cfg.seed,
                             batch_size=cfg.batch_size, num_classes=cfg.num_classes,
                             profile=profile, compute_scale=cfg.compute_scale)


__all__ = ["WORKLOADS", "ResNetWorkload", "SyntheticWorkload", "make_workload"]
