"""Flat all-reduce: the whole gradient fused into one buffer, reduced after backward.

1. When backward has produced every gradient, copy them into one flat buffer
   (Horovod's fusion buffer, without its size cap).
2. All-reduce the buffer over all ranks in one call: ``native`` is the
   backend's own all-reduce, ``ring`` the project's ring on point-to-point
   messages (``commbench.comm.ring``).
3. Divide by the rank count and copy the mean back into the gradients.

With ``--compression fp16|bf16`` the buffer has that dtype: gradients are
cast as they are packed and cast back as the mean is unpacked, so the wire
carries half the bytes (``hvd.Compression.fp16``'s scheme).

Nothing overlaps backward; this is the baseline every other strategy is
compared with.

Where the buffer stays on a GPU (NCCL) the all-reduce is timed by events: one on
the compute stream once the buffer is packed (complete when backward's tail and
the packing have run, not when the host queued them), one there after the
library's blocking call returns (the compute stream then waits for the
collective; the torch backend's host sees NCCL's end by polling its event, so
this end may be late by that poll), both read when the step ends
(``commbench.timing``). Staged through host memory, the copy
off the device waits for it, and the host's clock is right.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from commbench.comm.algos import TWO_LEVEL_ALGOS, get_algo, wire_dtype
from commbench.comm.base import Communicator
from commbench.comm.hierarchical import pipeline_segments, plan_inter_node_algo
from commbench.flatbuf import FlatBuffer
from commbench.strategies.base import Strategy, dtype_name, unpack_mean
from commbench.strategies.settings import CommonSettings
from commbench.timing import device_events


@dataclass(frozen=True)
class FlatSettings(CommonSettings):
    """``flat``'s and ``hierarchical``'s settings: the common ones (``algo``, one of
    ``--algo`` per run; ``--compression``; ``--accum-steps``), and no flag of their own.

    Example::

        make_strategy("flat", comm, grads, FlatSettings(algo="ring", compression="fp16"))
    """


class FlatStrategy(Strategy):
    name = "flat"
    uses_algo = True
    settings_class = FlatSettings
    settings: FlatSettings

    def __init__(self, comm: Communicator, grads: Sequence[torch.Tensor],
                 settings: FlatSettings | None = None, *,
                 backward_order: Sequence[int] | None = None, workload: Any = None) -> None:
        super().__init__(comm, grads, settings, backward_order=backward_order,
                         workload=workload)
        algo = self.settings.algo
        self.check(comm, algo)
        self.algo = algo
        self._allreduce = get_algo(algo)
        # On a GPU the gradients are fused on the device, then staged through a pinned
        # host buffer in one copy each way (MPI here is not CUDA-aware), unless the
        # backend's collectives take device tensors (NCCL): then they stay there.
        self.packed = FlatBuffer(self.grads, dtype=self.wire)  # on the gradients' device
        self.fused = self.packed.flat
        self.staged = self.fused.device.type == "cuda" and not comm.device_collectives
        self.buffer = torch.empty(self.fused.numel(), dtype=self.wire, pin_memory=True) \
            if self.staged else self.fused
        #: the device clock of the buffer the all-reduce takes, where it stays on a GPU
        self.events = device_events(self.buffer.device)

    def finish(self) -> None:
        self.packed.pack(self.grads)  # cast as it packs, under --compression
        if self.staged:
            self.buffer.copy_(self.fused)  # waits for the device, as the collective must
        if self.events is not None and self.timer.events is not None:
            start = self.timer.mark()
            self._allreduce(self.comm, self.buffer, on_phase=self.timer.comm_phase)
            self.timer.device_comm(start, self.timer.mark(), self.nbytes)
        else:
            with self.timer.comm_span(self.nbytes):
                self._allreduce(self.comm, self.buffer, on_phase=self.timer.comm_phase)
        if self.staged:
            self.fused.copy_(self.buffer, non_blocking=True)  # ordered before the division
        for g, v in zip(self.grads, self.packed.views):  # divide and copy back in one pass
            unpack_mean(v, g, self.comm.size)

    def knobs(self) -> dict:
        hier = {"inter_node_algo": plan_inter_node_algo(self.comm),
                "hier_segments": pipeline_segments(self.comm, self.buffer.numel(),
                                                   self.buffer.element_size())} \
            if self.algo in TWO_LEVEL_ALGOS and self.comm.size > 1 else {}
        return {**super().knobs(), "algo": self.algo, "fused_bytes": self.nbytes, **hier,
                "wire_dtype": dtype_name(wire_dtype(self.comm, self.algo, self.wire)),
                "staging": "pinned host buffer" if self.staged else None,
                "comm_device": str(self.buffer.device)}
