"""Flat all-reduce: the whole gradient fused into one buffer, reduced after backward.

1. When backward has produced every gradient, copy them into one flat buffer
   (Horovod's fusion buffer, without its size cap).
2. All-reduce the buffer over all ranks in one call: ``native`` is the
   backend's own all-reduce, ``ring`` the project's ring on point-to-point
   messages (``commbench.comm.ring``).
3. Divide by the rank count and copy the mean back into the gradients.

Nothing overlaps backward; this is the baseline every other strategy is
compared with.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from commbench.comm.base import Communicator
from commbench.strategies.algos import get_algo
from commbench.strategies.base import Strategy


class FlatStrategy(Strategy):
    name = "flat"
    uses_algo = True

    def __init__(self, comm: Communicator, grads: Sequence[torch.Tensor],
                 algo: str = "native") -> None:
        super().__init__(comm, grads)
        self.check(comm, algo)
        self.algo = algo
        self._allreduce = get_algo(algo)
        self.buffer = torch.empty(sum(g.numel() for g in self.grads), dtype=self.grads[0].dtype)
        self._views = []
        offset = 0
        for g in self.grads:
            self._views.append(self.buffer[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def finish(self) -> None:
        torch.cat([g.view(-1) for g in self.grads], out=self.buffer)
        with self.timer.comm_span(self.nbytes):
            self._allreduce(self.comm, self.buffer)
        for g, v in zip(self.grads, self._views):  # divide and copy back in one pass
            torch.div(v, self.comm.size, out=g)

    def knobs(self) -> dict:
        return {"algo": self.algo, "fused_bytes": self.nbytes}
