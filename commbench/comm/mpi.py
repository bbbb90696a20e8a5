"""mpi4py backend: collectives on numpy views of torch tensors (no copies).

Open MPI does not progress a non-blocking collective on its own (DESIGN.md
§8): ``Handle.test`` must be called while compute runs for transfers to
overlap it; strategies that overlap do so.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from commbench.comm.base import Communicator, Handle, hostname, topology_from_hostnames

_NUMPY_OK = {torch.float32, torch.float64, torch.int32, torch.int64}


def as_buffer(t: torch.Tensor) -> np.ndarray:
    """A numpy view sharing ``t``'s memory; MPI reads and writes it directly."""
    if t.device.type != "cpu":
        raise ValueError(f"mpi backend needs CPU tensors, got {t.device}")
    if t.dtype not in _NUMPY_OK:
        raise ValueError(f"mpi backend cannot reduce {t.dtype}; use float32")
    if not t.is_contiguous():
        raise ValueError("mpi backend needs contiguous tensors")
    return t.detach().numpy()


class _MpiHandle(Handle):
    __slots__ = ("_req", "_buf", "_done")

    def __init__(self, req: Any, buf: np.ndarray) -> None:
        self._req = req
        self._buf = buf  # keep the buffer alive while MPI writes into it
        self._done = False

    def test(self) -> bool:
        if not self._done:
            self._done = bool(self._req.Test())
        return self._done

    def wait(self) -> None:
        if not self._done:
            self._req.Wait()
            self._done = True


class MpiCommunicator(Communicator):
    name = "mpi"

    def __init__(self, comm: Any = None) -> None:
        from mpi4py import MPI

        self._MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        hosts = self.comm.allgather(hostname())
        self.topo = topology_from_hostnames(self.comm.Get_rank(), hosts)

    def allreduce(self, tensor: torch.Tensor) -> None:
        self.comm.Allreduce(self._MPI.IN_PLACE, as_buffer(tensor), op=self._MPI.SUM)

    def iallreduce(self, tensor: torch.Tensor) -> Handle:
        buf = as_buffer(tensor)
        return _MpiHandle(self.comm.Iallreduce(self._MPI.IN_PLACE, buf, op=self._MPI.SUM), buf)

    def sendrecv(self, send: torch.Tensor, dest: int, recv: torch.Tensor, source: int,
                 tag: int = 0) -> None:
        self.comm.Sendrecv(as_buffer(send), dest, tag, as_buffer(recv), source, tag)

    def barrier(self) -> None:
        self.comm.Barrier()

    def allgather_object(self, obj: Any) -> list[Any]:
        return self.comm.allgather(obj)

    def gather_object(self, obj: Any) -> list[Any] | None:
        return self.comm.gather(obj, root=0)

    def bcast_object(self, obj: Any, root: int = 0) -> Any:
        return self.comm.bcast(obj, root=root)

    def abort(self, code: int = 1) -> None:
        self.comm.Abort(code)

    def versions(self) -> dict[str, str]:
        import mpi4py

        return {
            "mpi4py": mpi4py.__version__,
            "mpi_library": self._MPI.Get_library_version().strip().splitlines()[0],
            "mpi_standard": "{}.{}".format(*self._MPI.Get_version()),
        }
