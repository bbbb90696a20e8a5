"""All-reduce algorithms a strategy can run on a buffer, by ``--algo`` name.

Each takes ``(comm, tensor)`` and sums ``tensor`` over ``comm`` in place.
A new algorithm is one function plus one line here.
"""

from __future__ import annotations

import os
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


# Test-only fault hook: on the rank named here, every all-reduce's first
# element comes out off by one, so the tests can show that #wrong catches it.
CORRUPT_ENV = "COMMBENCH_TEST_CORRUPT_RANK"


def get_algo(name: str) -> Callable[[Communicator, torch.Tensor], None]:
    if name not in ALGOS:
        raise ValueError(f"unknown algo {name!r}; choose from {', '.join(ALGOS)}")
    algo = ALGOS[name]
    if CORRUPT_ENV not in os.environ:
        return algo
    bad_rank = int(os.environ[CORRUPT_ENV])

    def corrupted(comm: Communicator, tensor: torch.Tensor) -> None:
        algo(comm, tensor)
        if comm.rank == bad_rank and tensor.numel():
            tensor.view(-1)[0] += 1

    return corrupted
