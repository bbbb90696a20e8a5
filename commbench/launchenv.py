"""What a job's environment says about how it was started, read without starting any
library: the backend its launcher implies, the launcher's name, this process's rank.

Standard library only: records (``commbench.results``) and the launchers read it too.
"""

from __future__ import annotations

import os

#: torchrun's variables: where all are set, the job was started by torchrun (or the like)
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def detect_backend(environ: dict[str, str] | None = None) -> str:
    """Name the backend the launcher implies: ``horovod`` under horovodrun, ``torch`` under
    torchrun, else ``mpi``.

    ``horovodrun --gloo`` gives every worker ``HOROVOD_RANK`` and friends.
    ``horovodrun --mpi`` starts mpirun with no Horovod variables, but always
    exports ``NCCL_SOCKET_IFNAME`` and ``btl_tcp_if_include`` together (and
    the shell's ``_`` names horovodrun); plain mpirun does neither.
    """
    env = os.environ if environ is None else environ
    if _torchrun(env):  # decisive: torchrun's workers may also see NCCL_SOCKET_IFNAME,
        return "torch"  # an exported btl setting, or Slurm's PMIx variables
    if "HOROVOD_RANK" in env or "HOROVOD_CONTROLLER" in env:
        return "horovod"
    if env.get("_", "").endswith("horovodrun"):
        return "horovod"
    if "NCCL_SOCKET_IFNAME" in env and "OMPI_MCA_btl_tcp_if_include" in env:
        return "horovod"
    if all(k in env for k in TORCHRUN_VARS) and not _under_mpi(env):
        return "torch"
    return "mpi"


def _torchrun(env) -> bool:
    """Started by torchrun: its elastic agent names the run in every worker."""
    return "TORCHELASTIC_RUN_ID" in env and all(k in env for k in TORCHRUN_VARS)


def _under_mpi(env) -> bool:
    return any(k in env for k in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"))


def launcher_name(environ: dict[str, str] | None = None) -> str:
    """How this job's ranks were started, as their environment tells: ``torchrun``,
    ``horovodrun``, ``mpirun``, ``srun`` or ``none`` (one process on its own); records
    carry it (the ``launcher`` matching field)."""
    env = os.environ if environ is None else environ
    if detect_backend(env) == "torch":
        return "torchrun"
    if detect_backend(env) == "horovod":
        return "horovodrun"
    if _under_mpi(env):
        return "mpirun"
    if "SLURM_PROCID" in env:
        return "srun"
    return "none"


def launcher_rank(environ: dict[str, str] | None = None) -> int:
    """This process's rank as the launcher told it, without initialising any library."""
    env = os.environ if environ is None else environ
    first = ("RANK",) if _torchrun(env) else ()  # a torchrun worker under srun: torchrun's
    for k in (*first, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "HOROVOD_RANK", "RANK",
              "SLURM_PROCID"):
        if k in env:
            try:
                return int(env[k])
            except ValueError:
                pass
    return 0
