"""Model buffers across ranks: BatchNorm's running statistics, broadcast or kept local.

Gradient sync keeps the *parameters* of every rank in lock-step, but a
model's buffers (BatchNorm ``running_mean``, ``running_var``,
``num_batches_tracked``) are updated in forward from each rank's own batch
and no all-reduce touches them. Left alone, every rank ends with a different
model: evaluations differ, and one rank's accuracy stands for a model the
others do not hold. The frameworks choose one of two rules:

* ``broadcast`` (PyTorch DDP's ``broadcast_buffers=True``, its default):
  rank 0's buffers are copied to every rank before each forward. Here they
  are packed into one flat buffer per dtype and broadcast with the backend's
  own broadcast; the time is recorded as its own phase of sync
  (``buffer_sync_s``), outside compute, so it counts in exposed sync and the
  study measures what the rule costs. One more (untimed) broadcast before the
  final evaluation makes every rank evaluate rank 0's model.
* ``local`` (plain Horovod after its initial ``broadcast_parameters``): each
  rank keeps its own. Accuracy is then rank 0's, and records carry every
  rank's figure so the spread shows.

The peers keep their own machinery: ``ddp`` sets DDP's ``broadcast_buffers``
from the rule (DDP broadcasts inside its forward, so that cost lands in
forward compute), and ``horovod`` broadcasts the whole state dict once at the
start and keeps buffers local afterwards, as Horovod users do. The strategy
says which rule a run really had (``Strategy.buffer_rule``); records carry it
as ``buffer_rule``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from commbench.comm.base import Communicator
from commbench.flatbuf import FlatBuffer
from commbench.timing import now

BUFFER_RULES = ("broadcast", "local")


def check_rule(requested: str) -> str:
    """``requested`` if it is a ``--buffers`` rule, else a ValueError naming the choices.

    Which rule a run then follows is its strategy's to say (``Strategy.buffer_rule``:
    the peers keep their own machinery)."""
    if requested not in BUFFER_RULES:
        raise ValueError(f"--buffers must be one of {', '.join(BUFFER_RULES)}, got {requested!r}")
    return requested


class BufferSync:
    """Broadcasts rank 0's buffers before each forward (rule ``broadcast``), or nothing.

    ``per_step`` is False where a peer moves the buffers itself (DDP); the
    final broadcast before evaluation still runs under any broadcast rule, so
    evaluation never depends on which rank's forward ran last.
    """

    def __init__(self, comm: Communicator, buffers: Sequence[torch.Tensor], rule: str) -> None:
        self.comm = comm
        self.rule = rule
        self.broadcasts = rule in ("broadcast", "ddp-broadcast")
        self.per_step = rule == "broadcast"
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for b in buffers:
            by_dtype.setdefault(b.dtype, []).append(b)
        self.groups: list[list[torch.Tensor]] = list(by_dtype.values())
        # One flat buffer per dtype: one broadcast instead of one per tensor (ResNet-50 has
        # 53 BatchNorm layers, 159 buffers); in host memory, or on the buffers' device where
        # the backend's collectives take device tensors (NCCL).
        self._flat = [FlatBuffer(group, device=group[0].device if comm.device_collectives
                                 else "cpu") for group in self.groups] \
            if self.broadcasts else []
        self.nbytes = sum(b.numel() * b.element_size() for b in buffers)

    def _broadcast(self) -> None:
        for group, fb in zip(self.groups, self._flat):
            fb.pack(group)
            self.comm.bcast(fb.flat, root=0)
            if self.comm.rank != 0:
                fb.unpack(group)

    def before_forward(self, timer) -> None:
        """Rank 0's buffers on every rank, timed as the step's buffer phase of sync."""
        if not (self.per_step and self.groups):
            return
        start = now()
        self._broadcast()
        timer.buffer_sync(start, now(), self.nbytes)

    def before_evaluation(self) -> None:
        """Untimed: every rank evaluates rank 0's model under a broadcast rule."""
        if self.broadcasts and self.groups:
            self._broadcast()
