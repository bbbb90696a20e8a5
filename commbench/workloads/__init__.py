"""Workloads: what produces the gradients each step (the interface: ``workloads.base``)."""

from __future__ import annotations

from typing import Callable

from commbench.config import WorkloadSpec
from commbench.workloads.base import Workload
from commbench.workloads.resnet import ResNetWorkload
from commbench.workloads.synthetic import SyntheticWorkload

WORKLOADS: dict[str, Callable[..., Workload]] = {
    "synthetic": SyntheticWorkload,  # real gradient shapes, compute replayed
    "resnet": ResNetWorkload,        # real forward/backward passes
}


def make_workload(cfg: WorkloadSpec, rank: int, world_size: int = 1,
                  job_rank: int | None = None) -> Workload:
    """Build ``cfg.workload`` for ``rank`` (of ``world_size`` sharing the data set);
    ``job_rank`` (default ``rank``) is the rank ``--slow-rank`` names."""
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
                             profile=profile, compute_scale=cfg.compute_scale, lr=cfg.lr,
                             slow=slow_factor(cfg, rank if job_rank is None else job_rank),
                             jitter=cfg.compute_jitter)


def slow_factor(cfg: WorkloadSpec, job_rank: int) -> float:
    """What ``--slow-rank R:F`` multiplies this rank's replayed compute by (F on rank R)."""
    if cfg.slow_rank is not None and cfg.slow_rank[0] == job_rank:
        return cfg.slow_rank[1]
    return 1.0


__all__ = ["WORKLOADS", "ResNetWorkload", "SyntheticWorkload", "Workload", "make_workload"]
