"""mpi4py backend: collectives on numpy views of torch tensors (no copies).

Open MPI does not progress a non-blocking collective on its own
(docs/strategies.md, "Overlap"): ``Handle.test`` must be called while compute runs for transfers to
overlap it; strategies that overlap do so.

float16 and bfloat16: numpy has no bfloat16 and MPI 3 has no half-precision
type, so 2-byte floats travel as their raw bits in a 2-byte contiguous MPI
datatype and are summed by a user-defined commutative ``MPI.Op`` that adds
the buffers with torch (``torch.frombuffer``). Transfers stay 2 bytes per
element; Open MPI calls the op once per piece it reduces, a Python call each
time, so 2-byte reductions cost more per call than float32's, which keeps
the predefined ``MPI.SUM`` on a numpy view.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

import mpi4py
import numpy as np
import torch

from commbench.comm import base
from commbench.comm.base import Communicator, Group, Handle, Topology, topology_from_hostnames
from commbench.comm.placement import TensorPlacement, host, launcher_local_rank
from commbench.comm.ring import chunk_counts, offsets
from commbench.hostload import polled

_NUMPY_OK = {torch.float32, torch.float64, torch.int32, torch.int64}
#: 2-byte floats numpy cannot reduce: sent as uint16 bits, summed by a user-defined op
_HALF = (torch.float16, torch.bfloat16)


def as_buffer(t: torch.Tensor) -> np.ndarray:
    """A numpy view sharing ``t``'s memory; MPI reads and writes it directly.

    float16/bfloat16 come back as a uint16 view of their bits: right for
    moving them (send, receive, gather), wrong for ``MPI.SUM``, which
    ``MpiCommunicator`` therefore never applies to them.
    """
    if t.device.type != "cpu":
        raise ValueError(f"mpi backend needs CPU tensors, got {t.device}")
    if not t.is_contiguous():
        raise ValueError("mpi backend needs contiguous tensors")
    if t.dtype in _HALF:
        return t.detach().view(torch.uint16).numpy()
    if t.dtype not in _NUMPY_OK:
        raise ValueError(f"mpi backend cannot reduce {t.dtype}; use float32, float16 or "
                         "bfloat16")
    return t.detach().numpy()


def mpi_library_version(MPI: Any) -> str:
    """First line of the MPI library's version string (Open MPI's ends in a NUL byte)."""
    return MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]


def _torch_sum_op(MPI: Any, dtype: torch.dtype) -> Any:
    """A commutative MPI.Op summing 2-byte ``dtype`` buffers in place with torch."""

    def add(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
        if len(memoryview(inoutbuf)):  # torch.frombuffer refuses empty buffers
            torch.frombuffer(inoutbuf, dtype=dtype).add_(torch.frombuffer(inbuf, dtype=dtype))

    return MPI.Op.Create(add, commute=True)


class _MpiHandle(Handle):
    __slots__ = ("_req", "_buf", "_done")

    def __init__(self, req: Any, buf: Any) -> None:
        self._req = req
        self._buf = buf  # keep the buffer alive while MPI writes into it
        self._done = False

    def test(self) -> bool:
        if not self._done:
            self._done = bool(self._req.Test())
        return self._done

    @polled
    def wait(self) -> None:
        if not self._done:
            self._req.Wait()
            self._done = True



class _Then(Handle):
    """One operation, then another started once the first has completed (by whichever
    ``test`` or ``wait`` sees it complete)."""

    __slots__ = ("_first", "_then", "_second")

    def __init__(self, first: Handle, then: Callable[[], Handle]) -> None:
        self._first: Handle | None = first
        self._then = then
        self._second: Handle | None = None

    def _advance(self) -> Handle:
        self._first = None
        self._second = self._then()
        return self._second

    def test(self) -> bool:
        if self._first is not None and not self._first.test():
            return False
        return (self._second or self._advance()).test()

    def wait(self) -> None:
        if self._first is not None:
            self._first.wait()
        (self._second or self._advance()).wait()


def p2p_isend(mpi_comm: Any, t: torch.Tensor, dest: int, tag: int) -> Handle:
    """Non-blocking send of ``t``'s bytes on an mpi4py communicator."""
    buf = as_buffer(t)
    return _MpiHandle(mpi_comm.Isend(buf, dest, tag), buf)


def p2p_irecv(mpi_comm: Any, t: torch.Tensor, source: int, tag: int) -> Handle:
    """Non-blocking receive into ``t`` on an mpi4py communicator."""
    buf = as_buffer(t)
    return _MpiHandle(mpi_comm.Irecv(buf, source, tag), buf)


def p2p_recv_any(MPI: Any, mpi_comm: Any, t: torch.Tensor, tag: int) -> int:
    """Blocking receive into ``t`` from whichever rank sends with ``tag`` first; its rank."""
    status = MPI.Status()
    mpi_comm.Recv(as_buffer(t), source=MPI.ANY_SOURCE, tag=tag, status=status)
    return status.Get_source()


#: the side channel's tag, on its own duplicate communicator (so no clash is possible)
SIDE_TAG = 7411


class MpiSideChannel(base.SideChannel):
    """``Communicator.side_channel`` on MPI: a duplicate of ``comm`` used only for it
    (point-to-point, pickled objects), read with ``iprobe`` so it never waits."""

    def __init__(self, MPI: Any, comm: Any) -> None:
        self._MPI = MPI
        self.comm = comm.Dup()  # collective: every rank builds its channel together
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self._sent: list[Any] = []

    def send(self, dest: int, msg: Any) -> None:
        self._sent = [r for r in self._sent if not r.Test()]  # keep only those in flight
        self._sent.append(self.comm.isend(msg, dest=dest, tag=SIDE_TAG))

    def receive(self) -> list[tuple[int, Any]]:
        got = []
        status = self._MPI.Status()
        while self.comm.iprobe(source=self._MPI.ANY_SOURCE, tag=SIDE_TAG, status=status):
            got.append((status.Get_source(),
                        self.comm.recv(source=status.Get_source(), tag=SIDE_TAG)))
        return got

    def allgather(self, obj: Any) -> list[Any]:
        return self.comm.allgather(obj)


def mpi_side_channel(MPI: Any, comm: Any) -> MpiSideChannel | None:
    """A side channel on ``comm``'s ranks where threads may call MPI at once
    (``MPI_THREAD_MULTIPLE``, as mpi4py asks for), else None."""
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        return None
    return MpiSideChannel(MPI, comm)


class MpiCommunicator(Communicator, Group):
    name = "mpi"

    def __init__(self, comm: Any = None, topo: Topology | None = None,
                 owned: bool = False, placement: TensorPlacement | None = None) -> None:
        """``comm``: an mpi4py communicator (default MPI_COMM_WORLD); ``topo``: its
        topology if known (else gathered); ``owned``: ``close`` frees ``comm``;
        ``placement``: where the job's tensors live (``commbench.comm.placement``; default
        host memory): on a GPU, this rank takes the one of its local rank (as the launcher
        numbers the machine's processes, else as the topology does), and its collectives
        still reduce host memory (the strategies stage through it)."""
        from mpi4py import MPI  # importing mpi4py.MPI initialises MPI: not at import time

        self._MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self._owned = owned
        if topo is None:
            topo = topology_from_hostnames(self.comm.Get_rank(),
                                           self.comm.allgather(base.hostname()))
        self.topo = topo
        placement = placement or host("mpi")
        local = launcher_local_rank(os.environ)
        self._placement = placement.bind(topo.local_rank if local is None else local)
        self._half_type = None  # 2-byte contiguous datatype, made at the first half reduce
        self._half_ops: dict[torch.dtype, Any] = {}

    def placement(self) -> TensorPlacement:
        return self._placement

    def _reduce_args(self, tensor: torch.Tensor) -> tuple[Any, Any]:
        """(buffer spec, op) summing ``tensor``: MPI.SUM where MPI knows the type."""
        buf = as_buffer(tensor)
        if tensor.dtype not in _HALF:
            return buf, self._MPI.SUM  # the fast path: a predefined type and op
        if self._half_type is None:
            self._half_type = self._MPI.BYTE.Create_contiguous(2).Commit()
        if tensor.dtype not in self._half_ops:
            self._half_ops[tensor.dtype] = _torch_sum_op(self._MPI, tensor.dtype)
        return [buf, self._half_type], self._half_ops[tensor.dtype]

    @polled
    def allreduce(self, tensor: torch.Tensor) -> None:
        buf, op = self._reduce_args(tensor)
        self.comm.Allreduce(self._MPI.IN_PLACE, buf, op=op)

    def iallreduce(self, tensor: torch.Tensor) -> Handle:
        buf, op = self._reduce_args(tensor)
        return _MpiHandle(self.comm.Iallreduce(self._MPI.IN_PLACE, buf, op=op), buf)

    @polled
    def sendrecv(self, send: torch.Tensor, dest: int, recv: torch.Tensor, source: int,
                 tag: int = 0) -> None:
        self.comm.Sendrecv(as_buffer(send), dest, tag, as_buffer(recv), source, tag)

    def subgroup(self, ranks: list[int]) -> MpiCommunicator | None:
        me = self.comm.Get_rank()
        color = 0 if me in ranks else self._MPI.UNDEFINED
        sub = self.comm.Split(color, ranks.index(me) if me in ranks else 0)
        return MpiCommunicator(sub) if me in ranks else None

    def _scatter_args(self, tensor: torch.Tensor, counts: list[int]) -> tuple[Any, ...]:
        """(this rank's part, send spec, receive spec, op) of a reduce-scatter."""
        part = torch.empty(counts[self.comm.Get_rank()], dtype=tensor.dtype)
        send, op = self._reduce_args(tensor)
        recv, _ = self._reduce_args(part)
        return part, send, recv, op

    @polled
    def reduce_scatter_v(self, tensor: torch.Tensor, counts: list[int]) -> torch.Tensor:
        part, send, recv, op = self._scatter_args(tensor, counts)
        self.comm.Reduce_scatter(send, recv, counts, op=op)
        return part

    @polled
    def allgather_v(self, part: torch.Tensor, counts: list[int], out: torch.Tensor) -> None:
        displs = offsets(counts)
        self.comm.Allgatherv(as_buffer(part), [as_buffer(out), (counts, displs)])

    nonblocking_collectives = True

    def ireduce_scatter_v(self, tensor: torch.Tensor,
                          counts: list[int]) -> tuple[torch.Tensor, Handle]:
        part, send, recv, op = self._scatter_args(tensor, counts)
        return part, _MpiHandle(self.comm.Ireduce_scatter(send, recv, counts, op=op),
                                (send, recv))

    def iallgather_v(self, part: torch.Tensor, counts: list[int], out: torch.Tensor) -> Handle:
        displs = offsets(counts)
        send, recv = as_buffer(part), as_buffer(out)
        return _MpiHandle(self.comm.Iallgatherv(send, [recv, (counts, displs)]), (send, recv))

    @polled
    def reduce(self, tensor: torch.Tensor, root: int = 0) -> None:
        buf, op = self._reduce_args(tensor)
        if self.comm.Get_rank() == root:
            self.comm.Reduce(self._MPI.IN_PLACE, buf, op=op, root=root)
        else:
            self.comm.Reduce(buf, None, op=op, root=root)

    @polled
    def bcast(self, tensor: torch.Tensor, root: int = 0) -> None:
        self.comm.Bcast(as_buffer(tensor), root=root)

    def ireduce(self, tensor: torch.Tensor, root: int = 0) -> Handle:
        """A reduce-scatter, then a gather of the parts at ``root`` (Rabenseifner's reduce).

        Open MPI 4.1's ``MPI_Ireduce`` (libnbc) between two ranks runs a chain of small
        segments that advances one segment per call into MPI: polled every 0.5 ms, 8 MiB
        took 628 ms against 5 ms for the blocking reduce (1037 tests). This takes 15 ms
        in 16 tests on 2 ranks, 18 ms on 4 (blocking: 18 ms).
        """
        flat = tensor.view(-1)
        p = self.comm.Get_size()
        counts = chunk_counts(flat.numel(), p)
        part, scatter = self.ireduce_scatter_v(flat, counts)
        displs = offsets(counts)

        def gather() -> Handle:
            send = as_buffer(part)
            recv = [as_buffer(flat), (counts, displs)] if self.comm.Get_rank() == root else None
            return _MpiHandle(self.comm.Igatherv(send, recv, root=root), (send, recv))

        return _Then(scatter, gather)

    def ibcast(self, tensor: torch.Tensor, root: int = 0) -> Handle:
        buf = as_buffer(tensor)
        return _MpiHandle(self.comm.Ibcast(buf, root=root), buf)

    def isend(self, tensor: torch.Tensor, dest: int, tag: int = 0) -> Handle:
        return p2p_isend(self.comm, tensor, dest, tag)

    def irecv(self, tensor: torch.Tensor, source: int, tag: int = 0) -> Handle:
        return p2p_irecv(self.comm, tensor, source, tag)

    @polled
    def send(self, tensor: torch.Tensor, dest: int, tag: int = 0) -> None:
        self.comm.Send(as_buffer(tensor), dest, tag)

    @polled
    def recv(self, tensor: torch.Tensor, source: int, tag: int = 0) -> None:
        self.comm.Recv(as_buffer(tensor), source, tag)

    @polled
    def recv_any(self, tensor: torch.Tensor, tag: int = 0) -> int:
        return p2p_recv_any(self._MPI, self.comm, tensor, tag)

    @polled
    def barrier(self) -> None:
        self.comm.Barrier()

    def dup(self) -> MpiCommunicator:
        """``MPI_Comm_dup``: the same ranks and topology in a communication context of
        its own (no host names gathered again)."""
        return MpiCommunicator(self.comm.Dup(), topo=self.topo, owned=True,
                               placement=self._placement)

    def allgather_object(self, obj: Any) -> list[Any]:
        return self.comm.allgather(obj)

    def gather_object(self, obj: Any) -> list[Any] | None:
        return self.comm.gather(obj, root=0)

    def bcast_object(self, obj: Any, root: int = 0) -> Any:
        return self.comm.bcast(obj, root=root)

    def side_channel(self) -> MpiSideChannel | None:
        return mpi_side_channel(self._MPI, self.comm)

    def abort(self, code: int = 1) -> None:
        sys.stdout.flush()  # what this rank said before dying reaches the launcher
        sys.stderr.flush()
        self.comm.Abort(code)

    def close(self) -> None:
        for op in self._half_ops.values():
            op.Free()
        self._half_ops.clear()
        if self._half_type is not None:
            self._half_type.Free()
            self._half_type = None
        if self._owned:
            self.comm.Free()
            self._owned = False

    def versions(self) -> dict[str, str]:
        return {
            "mpi4py": mpi4py.__version__,
            "mpi_library": mpi_library_version(self._MPI),
            "mpi_standard": "{}.{}".format(*self._MPI.Get_version()),
        }
