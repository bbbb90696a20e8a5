"""All-reduce algorithms a strategy can run on a buffer, by ``--algo`` name.

Each takes ``(comm, tensor)`` and sums ``tensor`` over ``comm`` in place.
A new algorithm is one function plus one line here.
"""

from __future__ import annotations

from typing import Callable

import torch

from commbench.comm.base import Communicator
from commbench.comm.ring import ring_allreduce


def _native(comm: Communicator, tensor: torch.Tensor) -> None:
    comm.allreduce(tensor)


ALGOS: dict[str, Callable[[Communicator, torch.Tensor], None]] = {
    "native": _native,   # the backend's own (Open MPI's tuned / Horovod's) all-reduce
    "ring": ring_allreduce,  # reduce-scatter + all-gather on sendrecv, 2(p-1) steps
}


def get_algo(name: str) -> Callable[[Communicator, torch.Tensor], None]:
    if name not in ALGOS:
        raise ValueError(f"unknown algo {name!r}; choose from {', '.join(ALGOS)}")
    return ALGOS[name]
