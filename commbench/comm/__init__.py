"""Communicators: one interface (``base.Communicator``), one module per backend.

The backend follows from how the job was launched: ``horovodrun`` sets
``HOROVOD_*`` variables in every worker (→ ``horovod``); plain ``mpirun`` sets
Open MPI's or PMI's (→ ``mpi``). ``--backend`` overrides.
"""

from __future__ import annotations

import os
from typing import Callable

from commbench.comm.base import Communicator, Handle, Topology, topology_from_hostnames
from commbench.comm.horovod import HorovodCommunicator
from commbench.comm.mpi import MpiCommunicator

#: each backend's constructor; mpi4py's MPI and horovod.torch load when one is built
BACKENDS: dict[str, Callable[[], Communicator]] = {"mpi": MpiCommunicator,
                                                   "horovod": HorovodCommunicator}


def detect_backend(environ: dict[str, str] | None = None) -> str:
    """Name the backend the launcher implies: ``horovod`` under horovodrun, else ``mpi``.

    ``horovodrun --gloo`` gives every worker ``HOROVOD_RANK`` and friends.
    ``horovodrun --mpi`` starts mpirun with no Horovod variables, but always
    exports ``NCCL_SOCKET_IFNAME`` and ``btl_tcp_if_include`` together (and
    the shell's ``_`` names horovodrun); plain mpirun does neither.
    """
    env = os.environ if environ is None else environ
    if "HOROVOD_RANK" in env or "HOROVOD_CONTROLLER" in env:
        return "horovod"
    if env.get("_", "").endswith("horovodrun"):
        return "horovod"
    if "NCCL_SOCKET_IFNAME" in env and "OMPI_MCA_btl_tcp_if_include" in env:
        return "horovod"
    return "mpi"


def launcher_rank(environ: dict[str, str] | None = None) -> int:
    """This process's rank as the launcher told it, without initialising any library."""
    env = os.environ if environ is None else environ
    for k in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "HOROVOD_RANK", "SLURM_PROCID"):
        if k in env:
            try:
                return int(env[k])
            except ValueError:
                pass
    return 0


def make_communicator(backend: str) -> Communicator:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    return BACKENDS[backend]()


__all__ = ["BACKENDS", "Communicator", "Handle", "Topology", "detect_backend",
           "launcher_rank", "make_communicator", "topology_from_hostnames"]
