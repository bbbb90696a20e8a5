"""Where a job's tensors live and which library reduces them: one answer, decided once.

Before any library starts, ``decide`` turns the backend, ``--dist-backend`` and what
the tool's flags ask for (``commbench.flags.DeviceRequest``: ``--device``, or host memory and why)
into a ``TensorPlacement``, or refuses with a ValueError that names the flag. The
communicator is built on that placement, puts this rank on its GPU
(``TensorPlacement.bind``: ``torch.cuda.set_device`` before anything lands on ``cuda``) and
answers ``Communicator.placement()`` with it from then on: the workload, the
strategies, the microbenchmark and the records all read the one answer.

=======  =========  ====================================  ========================
backend  library    the tool's tensors on a GPU           the collectives take
=======  =========  ====================================  ========================
mpi      mpi        allowed: staged through host memory   host tensors
horovod  horovod    allowed: staged through host memory   host tensors
torch    gloo       allowed: staged through host memory   host tensors
torch    nccl       required, one GPU per rank of a node  the rank's GPU's tensors
=======  =========  ====================================  ========================

``--dist-backend auto`` (the torch backend) is NCCL where the tensors are asked for on a
CUDA device and this torch has CUDA and NCCL, Gloo otherwise. ``--device auto`` of a tool
whose buffers are the collectives' own (the microbenchmark: ``staging=False``) is a GPU
where the collectives would take it there (NCCL), else host memory; a workload resolves
its own ``--device auto`` first (``commbench.workloads.spec.resolve_workload``).

Ranks of a node share its GPUs round-robin (``local_rank mod GPUs``) where the library
allows it (two ranks under torchrun on one GPU, Gloo staging through host memory); NCCL
needs a GPU of its own per rank, so more ranks on a node than GPUs is refused on every
rank before ``init_process_group`` (``decide``'s ``local_size``, from torchrun's
``LOCAL_WORLD_SIZE``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from commbench.flags import DIST_BACKENDS, DeviceRequest

HOST = torch.device("cpu")

#: the variables that give a process's index among the launcher's processes on its machine
#: (torchrun, Open MPI, MPICH/Hydra, PMI, Slurm), first found wins
LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                   "PMI_LOCAL_RANK", "SLURM_LOCALID")


@dataclass(frozen=True)
class TensorPlacement:
    """Where a communicator's tensors live and which library reduces them.

    ``library``: what reduces them (``mpi``, ``horovod``, ``gloo``, ``nccl``); ``device``:
    where the tool's tensors live (a workload's parameters and gradients, the
    microbenchmark's buffers); ``comm_device``: where the collectives take them. The two
    differ where gradients on a GPU are staged through host memory.
    """

    library: str
    device: torch.device = HOST
    comm_device: torch.device = HOST

    @property
    def on_device(self) -> bool:
        """Whether the collectives take device tensors (NCCL): gradients stay on the GPU, and
        a blocking collective returns once the device has finished it."""
        return self.comm_device.type == "cuda"

    @property
    def staged(self) -> bool:
        """Whether the tensors live on a GPU and are reduced through host memory."""
        return self.device.type == "cuda" and not self.on_device

    def bind(self, local_rank: int) -> TensorPlacement:
        """Put this rank on its GPU (``torch.cuda.set_device``) where its tensors live on one:
        GPU ``local_rank`` mod the node's GPUs; return the placement with that device's
        index. Host memory: nothing to do. Called once, by the communicator, before
        anything is made on ``cuda`` (NCCL's process group included)."""
        if self.device.type != "cuda":
            return self
        gpu = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(gpu)
        return dataclasses.replace(self, device=gpu,
                                   comm_device=gpu if self.on_device else self.comm_device)


def host(library: str) -> TensorPlacement:
    """Tensors in host memory, reduced by ``library``."""
    return TensorPlacement(library)


def decide(backend: str, dist_backend: str, request: DeviceRequest, *,
           cuda: bool | None = None, nccl: bool | None = None, gloo: bool | None = None,
           gpus: int | None = None, local_size: int | None = None) -> TensorPlacement:
    """The placement of a job on ``backend`` (``mpi``, ``horovod``, ``torch``) with
    ``--dist-backend dist_backend`` whose flags make ``request``; a ValueError names the
    flag where they cannot run here. ``cuda``, ``nccl``, ``gloo``: whether this torch has
    them, ``gpus``: the node's GPUs (default: asked of torch); ``local_size``: the job's
    ranks on this node where known (NCCL needs a GPU for each)."""
    if dist_backend not in DIST_BACKENDS:
        raise ValueError(f"--dist-backend {dist_backend!r}: choose from "
                         f"{', '.join(DIST_BACKENDS)}")
    cuda = torch.cuda.is_available() if cuda is None else cuda
    nccl = dist.is_available() and dist.is_nccl_available() if nccl is None else nccl
    gloo = dist.is_available() and dist.is_gloo_available() if gloo is None else gloo
    nccl_here = cuda and nccl
    if request.device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"--device {request.device!r}: choose from auto, cpu, cuda")
    if request.device == "cuda" and not cuda:
        raise ValueError("--device cuda: no CUDA device here")
    nccl_possible = backend == "torch" and dist_backend in ("auto", "nccl") and nccl_here
    wanted = request.device
    if wanted == "auto":
        wanted = "cuda" if nccl_possible else "cpu"
    library = backend
    if backend == "torch":
        library = _torch_library(dist_backend, wanted, request.why_host, cuda, nccl_here, gloo)
    if wanted == "cuda" and library != "nccl" and not request.staging:
        label = f"torch backend on {library}" if backend == "torch" else f"{backend} backend"
        raise ValueError(f"--device cuda: the {label} reduces host memory here; device "
                         "buffers need the torch backend on NCCL (torchrun, --dist-backend "
                         "nccl or auto)")
    if library == "nccl":
        gpus = torch.cuda.device_count() if gpus is None else gpus
        if local_size is not None and local_size > gpus:
            raise ValueError(
                f"--dist-backend {dist_backend}: NCCL needs a GPU of its own for every rank, "
                f"and this node runs {local_size} ranks on {gpus} "
                f"GPU{'' if gpus == 1 else 's'}: start at most {gpus} per node (torchrun "
                f"--nproc-per-node {gpus}), or give --dist-backend gloo")
    device = torch.device(wanted)
    return TensorPlacement(library, device=device,
                           comm_device=device if library == "nccl" else HOST)


def _torch_library(dist_backend: str, wanted: str, why_host: str, cuda: bool,
                   nccl_here: bool, gloo: bool) -> str:
    """torch.distributed's library for tensors asked for on ``wanted`` (see ``decide``)."""
    if dist_backend == "auto":
        return "nccl" if wanted == "cuda" and nccl_here else "gloo"
    if dist_backend == "nccl":
        if wanted != "cuda":
            where = f" ({why_host})" if why_host else ""
            fix = "--dist-backend gloo" if why_host else "--device cuda or --dist-backend gloo"
            raise ValueError(f"--dist-backend nccl reduces CUDA tensors only, and this job's "
                             f"are in host memory{where}: use {fix}")
        if not nccl_here:
            why = "no CUDA device" if not cuda else "no NCCL"
            raise ValueError(f"--dist-backend nccl needs CUDA and NCCL; torch "
                             f"{torch.__version__} here has {why}: use --dist-backend gloo")
        return "nccl"
    if not gloo:
        raise ValueError(f"--dist-backend gloo: torch {torch.__version__} was built without "
                         "Gloo")
    return "gloo"


def launcher_local_size(environ: Mapping[str, str]) -> int | None:
    """The job's ranks on this node as torchrun tells them (``LOCAL_WORLD_SIZE``); else,
    from ``LOCAL_RANK``, at least this rank's index + 1; None where neither is set."""
    for key, extra in (("LOCAL_WORLD_SIZE", 0), ("LOCAL_RANK", 1)):
        value = environ.get(key, "")
        if value.isdigit():
            return int(value) + extra
    return None


def launcher_local_rank(environ: Mapping[str, str]) -> int | None:
    """This process's index among its launcher's processes on this machine (the GPU it
    takes), where a launcher says it (``LOCAL_RANK_VARS``)."""
    for key in LOCAL_RANK_VARS:
        value = environ.get(key, "")
        if value.isdigit():
            return int(value)
    return None
