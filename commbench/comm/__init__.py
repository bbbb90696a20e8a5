"""Communicators: one interface (``base.Communicator``), one module per backend.

The backend follows from how the job was launched: ``horovodrun`` sets
``HOROVOD_*`` variables in every worker (→ ``horovod``); ``torchrun`` sets its
rendezvous (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``PORT``,
→ ``torch``, on Gloo or NCCL by ``--dist-backend``); plain ``mpirun`` sets
Open MPI's or PMI's (→ ``mpi``). ``--backend`` overrides. Every backend is built on the
job's placement (``commbench.comm.placement``): where its tensors live, which library
reduces them.
"""

from __future__ import annotations

from typing import Callable

from commbench.comm.base import Communicator, Handle, Topology, topology_from_hostnames
from commbench.comm.horovod import HorovodCommunicator
from commbench.comm.mpi import MpiCommunicator
from commbench.comm.placement import TensorPlacement, decide
from commbench.flags import DeviceRequest
from commbench.launchenv import TORCHRUN_VARS, detect_backend, launcher_name, launcher_rank


def _mpi_communicator(placement: TensorPlacement) -> Communicator:
    return MpiCommunicator(placement=placement)


def _torch_communicator(placement: TensorPlacement) -> Communicator:
    # torch.distributed's process groups load only where this backend runs
    from commbench.comm.torchdist import connect
    return connect(placement)


#: each backend's constructor, given the job's placement; mpi4py's MPI, horovod.torch and
#: torch.distributed's process group load when one is built
BACKENDS: dict[str, Callable[[TensorPlacement], Communicator]] = {
    "mpi": _mpi_communicator, "horovod": HorovodCommunicator, "torch": _torch_communicator}


def make_communicator(backend: str, dist_backend: str = "auto", device: str = "cpu", *,
                      placement: TensorPlacement | None = None) -> Communicator:
    """The communicator of ``backend`` on ``placement`` (``commbench.comm.placement``), or on
    the one ``dist_backend`` (gloo, nccl, auto) and ``device`` (where the tensors live)
    decide."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if placement is None:
        placement = decide(backend, dist_backend, DeviceRequest(device))
    return BACKENDS[backend](placement)


__all__ = ["BACKENDS", "TORCHRUN_VARS", "Communicator", "Handle", "Topology", "detect_backend",
           "launcher_name", "launcher_rank", "make_communicator", "topology_from_hostnames"]
