"""All-reduce algorithms a strategy can run on a buffer, by ``--algo`` name.

Each takes ``(comm, tensor)`` and sums ``tensor`` over ``comm`` in place.
A new algorithm is one function plus one line here.
"""

from __future__ import annotations

from typing import Callable

import torch

from commbench.comm.base import Communicator, lacks_p2p
from commbench.comm.hierarchical import hierarchical_allreduce, leader_allreduce, plan_wire_dtype
from commbench.comm.phases import PhaseHook
from commbench.comm.ring import ring_allreduce


def _native(comm: Communicator, tensor: torch.Tensor, on_phase: PhaseHook | None = None) -> None:
    comm.allreduce(tensor)  # one call: the backend's phases are not visible


#: an algorithm: ``(comm, tensor, on_phase=None)`` sums ``tensor`` over ``comm`` in place,
#: telling ``on_phase`` of each of its phases (``commbench.comm.phases``)
AllReduceAlgo = Callable[..., None]

ALGOS: dict[str, AllReduceAlgo] = {
    "native": _native,   # the backend's own (Open MPI's tuned / Horovod's) all-reduce
    "ring": ring_allreduce,  # reduce-scatter + all-gather on sendrecv, 2(p-1) steps
    "hier": hierarchical_allreduce,  # node reduce-scatter, cross-node shards, node all-gather
    "hier-leader": leader_allreduce,  # reduce to node leader, leaders all-reduce, broadcast
}


#: algorithms built on point-to-point messages (the others use collectives of groups)
P2P_ALGOS = frozenset({"ring"})
#: the two-level algorithms (``commbench.comm.hierarchical``)
TWO_LEVEL_ALGOS = frozenset({"hier", "hier-leader"})


def check_algo(comm: Communicator, name: str) -> None:
    """Raise ValueError, naming the cause, if algorithm ``name`` cannot run on ``comm``."""
    if name not in ALGOS:
        raise ValueError(f"unknown algo {name!r}; choose from {', '.join(ALGOS)}")
    if name in P2P_ALGOS and not comm.supports_p2p:
        raise ValueError(lacks_p2p(comm, f"--algo {name}", "--algo native"))


def wire_dtype(comm: Communicator, name: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype algorithm ``name`` transfers for a tensor of ``dtype`` on ``comm``.

    The ring sends the tensor's bytes as they are; ``native`` is whatever the
    backend does (Horovod 0.28.1 widens bfloat16 to float32), and the hierarchical
    algorithms whatever their groups do (Horovod's MPI controller: the groups' MPI
    twins, as they are; Gloo: Horovod's process sets, widened).
    """
    if name in P2P_ALGOS:
        return dtype
    if name in TWO_LEVEL_ALGOS:
        return plan_wire_dtype(comm, dtype)
    return comm.allreduce_dtype(dtype)


def get_algo(name: str) -> AllReduceAlgo:
    if name not in ALGOS:
        raise ValueError(f"unknown algo {name!r}; choose from {', '.join(ALGOS)}")
    return ALGOS[name]
