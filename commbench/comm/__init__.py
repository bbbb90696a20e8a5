"""Communicators: one interface (``base.Communicator``), one module per backend.

The backend follows from how the job was launched: ``horovodrun`` sets
``HOROVOD_*`` variables in every worker (→ ``horovod``); ``torchrun`` sets its
rendezvous (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``PORT``,
→ ``torch``, on Gloo or NCCL by ``--dist-backend``); plain ``mpirun`` sets
Open MPI's or PMI's (→ ``mpi``). ``--backend`` overrides.
"""

from __future__ import annotations

from typing import Callable

from commbench.comm.base import Communicator, Handle, Topology, topology_from_hostnames
from commbench.comm.horovod import HorovodCommunicator
from commbench.comm.mpi import MpiCommunicator
from commbench.launchenv import TORCHRUN_VARS, detect_backend, launcher_name, launcher_rank


def _torch_communicator(dist_backend: str = "auto", device: str = "cpu") -> Communicator:
    # torch.distributed's process groups load only where this backend runs
    from commbench.comm.torchdist import TorchDistCommunicator
    return TorchDistCommunicator(dist_backend, device)


#: each backend's constructor; mpi4py's MPI, horovod.torch and torch.distributed's process
#: group load when one is built
BACKENDS: dict[str, Callable[..., Communicator]] = {"mpi": MpiCommunicator,
                                                    "horovod": HorovodCommunicator,
                                                    "torch": _torch_communicator}


def make_communicator(backend: str, dist_backend: str = "auto",
                      device: str = "cpu") -> Communicator:
    """The communicator of ``backend``; ``dist_backend`` (gloo, nccl, auto) and ``device``
    (where the workload's tensors live) choose torch's library under ``torch``."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if backend == "torch":
        return BACKENDS[backend](dist_backend, device)
    return BACKENDS[backend]()


__all__ = ["BACKENDS", "TORCHRUN_VARS", "Communicator", "Handle", "Topology", "detect_backend",
           "launcher_name", "launcher_rank", "make_communicator", "topology_from_hostnames"]
