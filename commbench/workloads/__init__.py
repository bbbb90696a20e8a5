"""Workloads: what produces the gradients each step (the interface: ``workloads.base``).

``WORKLOADS`` by ``--workload`` name; what a workload is built from, its flags
and their checks: ``workloads.spec``.
"""

from __future__ import annotations

import sys
from typing import Callable

from commbench.profilefile import lacks
from commbench.tables import rank0_print
from commbench.workloads.base import Workload
from commbench.workloads.compute_profile import load
from commbench.workloads.real import RealWorkload
from commbench.workloads.spec import WorkloadSpec
from commbench.workloads.synthetic import SyntheticWorkload

WORKLOADS: dict[str, Callable[..., Workload]] = {
    "synthetic": SyntheticWorkload,  # real gradient shapes, compute replayed
    "real": RealWorkload,            # real forward/backward passes of any model
}


def make_workload(cfg: WorkloadSpec, rank: int, world_size: int = 1,
                  job_rank: int | None = None) -> Workload:
    """Build ``cfg.workload`` for ``rank`` (of ``world_size`` sharing the data set);
    ``job_rank`` (default ``rank``) is the rank ``--slow-rank`` names."""
    job_rank = rank if job_rank is None else job_rank
    if cfg.workload == "real":
        wl: Workload = RealWorkload(
            cfg.model, rank, seed=cfg.seed, batch_size=cfg.batch_size,
            num_classes=cfg.num_classes, image_size=cfg.image_size, lr=cfg.lr,
            momentum=cfg.momentum, device=cfg.device, dataset=cfg.dataset, world_size=world_size,
            model_kwargs=cfg.model_kwargs, input_shape=cfg.input_shape, vocab=cfg.vocab)
    else:
        profile = None
        if cfg.compute_profile:
            profile = load(cfg.compute_profile, cfg.model, cfg.num_classes, cfg.model_kwargs)
            for note in lacks(profile):  # a profile recorded before what it lacks
                rank0_print(job_rank, f"commbench: note: {cfg.compute_profile}: {note}",
                            file=sys.stderr)
        wl = SyntheticWorkload(cfg.model, cfg.compute_ms, rank, seed=cfg.seed,
                               batch_size=cfg.batch_size, num_classes=cfg.num_classes,
                               profile=profile, compute_scale=cfg.compute_scale, lr=cfg.lr,
                               slow=slow_factor(cfg, job_rank), jitter=cfg.compute_jitter,
                               model_kwargs=cfg.model_kwargs, input_shape=cfg.sample_shape(),
                               vocab=cfg.vocab)
    if wl.unused:
        rank0_print(job_rank, f"commbench: warning: {cfg.model}: backward never reaches "
                              f"{len(wl.unused)} parameter(s), left out of synchronisation "
                              "(DDP would need find_unused_parameters=True for them): "
                              + ", ".join(wl.unused), file=sys.stderr)
    return wl


def slow_factor(cfg: WorkloadSpec, job_rank: int) -> float:
    """What ``--slow-rank R:F`` multiplies this rank's replayed compute by (F on rank R)."""
    if cfg.slow_rank is not None and cfg.slow_rank[0] == job_rank:
        return cfg.slow_rank[1]
    return 1.0


__all__ = ["WORKLOADS", "RealWorkload", "SyntheticWorkload", "Workload", "WorkloadSpec",
           "make_workload"]
