"""Replayed compute balanced against the link: the cell set-up that experiments share.

A cell of ``benchmarks.peer_fairness`` or of the advisor's validation grid
(``experiments.grid``) runs ``commbench.allreduce`` on the synthetic workload,
replaying a committed compute profile (``commbench.profile``) scaled so that
backward lasts ``balance`` x the gradient's link bound: the bytes a ring
all-reduce moves through each node link (``analysis.costmodel.link_bytes``,
``ring``: what DDP's Gloo and the project's ring move) at a stated link rate.
At the profiles' own speed (an H200's) backward would hide a few per cent of any
transfer on the emulated cluster's links, and a comparison of schemes would rank
all-reduce libraries instead. Each run measures at least ``MEASURED_S`` emulated
seconds of steps: a latency-bound model's steps last milliseconds, and 4 of them
are noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from analysis.costmodel import link_bytes
from analysis.overlap import Profile
from commbench.allreduce import Config
from commbench.strategies import CommonSettings, Sync

#: emulated seconds of measured steps per run at least, in at most MAX_STEPS steps
MEASURED_S, MAX_STEPS = 3.0, 200


def ring_bound_bytes(prof: Profile, nodes: int, slots: int) -> float:
    """The bytes a ring all-reduce of ``prof``'s gradient moves through one node link each
    way, on ``nodes`` x ``slots`` ranks placed node by node."""
    return link_bytes("ring", prof.grad_bytes, nodes * slots, nodes, slots)


def balanced_scale(prof: Profile, nodes: int, slots: int, gbit: float,
                   balance: float) -> float:
    """The factor on ``prof``'s times that makes backward last ``balance`` x the ring's
    link bound at ``gbit`` Gbit/s (``ring_bound_bytes``); not rounded."""
    bound_s = ring_bound_bytes(prof, nodes, slots) * 8 / (gbit * 1e9)
    return balance * bound_s / prof.backward_s


def measured_steps(prof: Profile, scale: float, bound_s: float, least: int) -> int:
    """Measured steps of a run: ``least``, or more where a step (about the scaled compute
    plus ``bound_s``) is short, so that at least ``MEASURED_S`` are measured, at most
    ``MAX_STEPS``."""
    step_s = prof.compute_s * scale + bound_s
    return max(least, min(MAX_STEPS, math.ceil(MEASURED_S / step_s)))


def replay_config(model: str, profile: str | Path, batch: int, scale: float, steps: int,
                  warmup: int, strategies: Sequence[str], algos: Sequence[str] = ("native",),
                  sync: Sync | CommonSettings | Sequence[CommonSettings] | None = None,
                  **workload: Any) -> Config:
    """``commbench.allreduce`` replaying ``profile`` (recorded for ``model`` at ``batch``)
    x ``scale``: one run per strategy and algorithm, with ``sync``'s settings; ``workload``
    (``input_shape``, ``slow_rank``...) is passed on. Its table is left out (``quiet``):
    the experiment prints its own."""
    return Config(model=model, compute_profile=str(profile), compute_scale=scale,
                  batch_size=batch, strategies=list(strategies), algos=list(algos), sync=sync,
                  steps=steps, warmup=warmup, quiet=True, **workload)
