"""Horovod backend (horovod.torch): Horovod's own collectives and its topology.

Point-to-point messages (used by the project's ring) are not part of Horovod's
API; when Horovod runs on MPI (``horovodrun --mpi`` or plain mpirun) they go
through mpi4py on the same ``MPI_COMM_WORLD`` Horovod uses. Under the Gloo
controller there is no point-to-point path and ``sendrecv`` says so.

``dup`` (for the transfer engine's thread, ``commbench.comm.engine``):
Horovod has no communicators; it matches operations across ranks by name,
and runs them in the order its coordinator finds them ready on every rank.
The project names every op from a counter per (kind, process set); a second
thread drawing from the same counters would take different numbers on
different ranks and pair unrelated tensors. A dup therefore shares Horovod
but names its ops from counters of its own under a prefix of its own
(``commbench.dup1.allreduce.ps0.7``): the two threads' names never meet,
and each thread's are the same on every rank. Its ``barrier`` is a named
one-element all-reduce for the same reason (``hvd.barrier`` takes no name).
Its point-to-point messages (the ring) go through a duplicate
of MPI_COMM_WORLD. All ops still run on Horovod's one background thread, so
a dup's transfer and the main thread's small ops queue behind each other.

Horovod 0.28.1 reduces float16 on the CPU (its own MPI op, or Gloo's) but has
no bfloat16 all-reduce ("Tensor type torch.BFloat16Tensor is not supported").
For a dtype the installed Horovod cannot reduce, ``allreduce`` widens to
float32, reduces that, and narrows back: 4 bytes per element on the wire
plus two casts, which ``allreduce_dtype`` reports so results can say so. A
Horovod that gains bfloat16 is used directly (the check asks its library).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import mpi4py
import torch

from commbench import dilation
from commbench.comm import base
from commbench.comm.base import Communicator, Group, Handle, Topology, topology_from_hostnames
from commbench.comm.mpi import (
    MpiCommunicator,
    as_buffer,
    mpi_library_version,
    mpi_side_channel,
    p2p_irecv,
    p2p_isend,
    p2p_recv_any,
)
from commbench.comm.placement import TensorPlacement, host


def launched_by_mpi() -> bool:
    return any(k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


def horovod_reduces(dtype: torch.dtype) -> bool:
    """Whether the installed horovod.torch has a CPU all-reduce for ``dtype``."""
    try:
        from horovod.torch import mpi_ops  # horovod is optional (the [horovod] extra)

        lib = mpi_ops.mpi_lib
    except (ImportError, AttributeError):  # layout changed: assume only bfloat16 is missing
        return dtype != torch.bfloat16
    # the name horovod.torch.mpi_ops looks up for a tensor of this type
    kind = torch.empty(0, dtype=dtype).type().replace(".", "_")
    return hasattr(lib, f"horovod_torch_allreduce_async_{kind}")


class _HorovodHandle(Handle):
    __slots__ = ("_hvd", "_handle", "_done", "_narrow")

    def __init__(self, hvd: Any, handle: Any,
                 narrow: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        self._hvd = hvd
        self._handle = handle
        self._done = False
        self._narrow = narrow  # (widened copy being reduced, the caller's tensor)

    def test(self) -> bool:
        # Horovod progresses on its own background thread; poll only observes.
        if not self._done and self._hvd.poll(self._handle):
            self.wait()
        return self._done

    def wait(self) -> None:
        if not self._done:
            self._hvd.synchronize(self._handle)
            if self._narrow is not None:
                wide, tensor = self._narrow
                tensor.copy_(wide)
            self._done = True


class _HorovodGroup(Group):
    """A Horovod process set (Gloo controller: ``HorovodCommunicator.subgroup``). Horovod
    orders a set's ranks by global rank, so the group's rank order is the sorted member
    list; Horovod has no reduce, so ``reduce`` all-reduces inside the set (more traffic
    than a reduce, same result on the root). No point-to-point messages."""

    name = "horovod process set"

    def __init__(self, parent: HorovodCommunicator, process_set: Any,
                 members: tuple[int, ...]) -> None:
        if list(members) != sorted(members):
            raise ValueError("Horovod process sets need their ranks in ascending order")
        self.parent, self.ps, self.members = parent, process_set, members
        self.rank, self.size = members.index(parent.rank), len(members)
        self.hvd = parent.hvd

    def allreduce(self, tensor: torch.Tensor) -> None:
        self.parent.allreduce(tensor, process_set=self.ps)

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return self.parent.allreduce_dtype(dtype)

    def _wire(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` in a dtype Horovod can move (bfloat16 widened, as allreduce does)."""
        wire = self.parent.allreduce_dtype(t.dtype)
        return t if wire == t.dtype else t.to(wire)

    def reduce_scatter_v(self, tensor: torch.Tensor, counts: list[int]) -> torch.Tensor:
        # every rank sends rank i its part; then each sums what it received
        got = self.hvd.alltoall(self._wire(tensor.view(-1)),
                                splits=torch.tensor(counts, dtype=torch.int32),
                                name=self.parent.op_name("alltoall", self.ps),
                                process_set=self.ps)
        got = got[0] if isinstance(got, tuple) else got
        return got.view(self.size, counts[self.rank]).sum(0).to(tensor.dtype)

    def allgather_v(self, part: torch.Tensor, counts: list[int], out: torch.Tensor) -> None:
        out.view(-1).copy_(self.hvd.allgather(self._wire(part),
                                              name=self.parent.op_name("allgather", self.ps),
                                              process_set=self.ps))

    def reduce(self, tensor: torch.Tensor, root: int = 0) -> None:
        self.allreduce(tensor)

    def bcast(self, tensor: torch.Tensor, root: int = 0) -> None:
        wire = self._wire(tensor)
        self.hvd.broadcast_(wire, root_rank=self.members[root],
                            name=self.parent.op_name("broadcast", self.ps), process_set=self.ps)
        if wire is not tensor:
            tensor.copy_(wire)


class HorovodCommunicator(Communicator):
    name = "horovod"
    progresses_itself = True  # its background thread runs every queued op
    runs_horovod = True

    def __init__(self, placement: TensorPlacement | None = None) -> None:
        """``placement``: where the job's tensors live (``commbench.comm.placement``; default
        host memory): on a GPU, this rank takes the one of Horovod's local rank, and
        Horovod's collectives still reduce host memory (the strategies stage through it)."""
        self._mpi = None
        if launched_by_mpi():
            # Initialise MPI with MPI_THREAD_MULTIPLE (mpi4py's default) before
            # Horovod so both share MPI_COMM_WORLD (here, not at import: importing
            # mpi4py.MPI initialises MPI).
            from mpi4py import MPI

            self._mpi = MPI
        import horovod.torch as hvd  # optional extra; loaded after MPI is initialised

        self.hvd = hvd
        dilation.apply_horovod_cycle()  # its cycle is on emulated time
        hvd.init(process_sets="dynamic")  # two-level schemes add process sets later
        if self._mpi is not None and not hvd.mpi_enabled():
            self._mpi = None  # Gloo controller under mpirun: do not mix in MPI traffic
        hosts = tuple(hvd.allgather_object(base.hostname()))
        self.topo = Topology(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                             local_size=hvd.local_size(), cross_rank=hvd.cross_rank(),
                             cross_size=hvd.cross_size(), hostnames=hosts)
        self._placement = (placement or host("horovod")).bind(hvd.local_rank())
        self._wire: dict[torch.dtype, torch.dtype] = {}
        self._sets: dict[tuple[int, ...], Any] = {}
        self._seq: dict[tuple[str, int], int] = {}
        self._names = "commbench"  # prefix of every op name (a dup's is its own)
        self._dups = 0
        self._p2p_comm = self._mpi.COMM_WORLD if self._mpi is not None else None
        self._group_comms: dict[tuple[int, ...], Any] = {}  # subgroup's MPI twin

    def placement(self) -> TensorPlacement:
        return self._placement

    def op_name(self, kind: str, process_set: Any = None) -> str:
        """A name for the next ``kind`` op on ``process_set``.

        Horovod matches tensors across ranks by name, and its automatic names
        count every op a process submits; once ranks take part in different
        process sets those counters differ and the job deadlocks. A counter per
        set and kind is the same on every member.
        """
        ps_id = 0 if process_set is None else process_set.process_set_id
        n = self._seq.get((kind, ps_id), 0)
        self._seq[(kind, ps_id)] = n + 1
        return f"{self._names}.{kind}.ps{ps_id}.{n}"

    @property
    def supports_p2p(self) -> bool:
        return self._mpi is not None

    @property
    def controller(self) -> str:
        return "mpi" if self.hvd.mpi_enabled() else "gloo"

    def allreduce_dtype(self, dtype: torch.dtype) -> torch.dtype:
        if dtype not in self._wire:
            self._wire[dtype] = dtype if horovod_reduces(dtype) else torch.float32
        return self._wire[dtype]

    def allreduce(self, tensor: torch.Tensor, process_set: Any = None) -> None:
        ps = self.hvd.global_process_set if process_set is None else process_set
        name = self.op_name("allreduce", ps)
        wire = self.allreduce_dtype(tensor.dtype)
        if wire == tensor.dtype:
            self.hvd.allreduce_(tensor, op=self.hvd.Sum, name=name, process_set=ps)
            return
        wide = tensor.to(wire)
        self.hvd.allreduce_(wide, op=self.hvd.Sum, name=name, process_set=ps)
        tensor.copy_(wide)

    def bcast(self, tensor: torch.Tensor, root: int = 0) -> None:
        self.hvd.broadcast_(tensor, root_rank=root,
                            name=self.op_name("broadcast", self.hvd.global_process_set))

    def subgroup(self, ranks: list[int]) -> Group | None:
        """``ranks`` as a group: a Horovod process set, made once; under the MPI controller
        the group is the set's twin, the same ranks split from ``MPI_COMM_WORLD``, whose
        collectives and point-to-point messages are MPI's.

        Through the process set, the two-level all-reduce's intra-node phases queue on
        Horovod's one background thread behind every other op, each negotiated by its
        coordinator, so they cannot overlap the inter-node phase: on 2 emulated nodes x
        4 ranks at 1 Gbit/s, ResNet-50's gradient (102 MB), the set's intra-node
        reduce-scatter (an ``alltoall``) spanned 0.6-1.2 s against 84 ms for 64 MiB on
        the mpi backend, and hierarchical's exposed sync was 0.92x flat's; on the twins,
        0.60x and 0.89x in two runs (5 and 8 steps; each step either near the link,
        0.93-0.97 s, or 1.3-2.0 s, Horovod's thread in MPI beside both of ours).
        Horovod's own hierarchical all-reduce (``HOROVOD_HIERARCHICAL_ALLREDUCE``)
        likewise runs its phases on MPI communicators of its own, not on process sets.
        """
        key = tuple(ranks)
        if key not in self._sets:  # Horovod refuses a second set with the same ranks
            if sorted(key) == list(range(self.size)):
                self._sets[key] = self.hvd.global_process_set
            else:
                self._sets[key] = self.hvd.add_process_set(sorted(key))
            # The same ranks on MPI (collective, like the set).
            if self._p2p_comm is not None:
                mine = self.rank in key
                self._group_comms[key] = self._p2p_comm.Split(
                    0 if mine else self._mpi.UNDEFINED,
                    sorted(key).index(self.rank) if mine else 0)
        if self.rank not in key:
            return None
        twin = self._group_comms.get(key)  # none under Gloo, nor for a dup's older sets
        if twin is None:
            return _HorovodGroup(self, self._sets[key], key)
        members = sorted(key)
        return MpiCommunicator(twin, topo=topology_from_hostnames(
            members.index(self.rank), [self.topo.hostnames[m] for m in members]))

    def world_group(self) -> Group:
        """Every rank as a group, the same for the job and each dup: under the MPI controller
        this communicator's own MPI communicator (``MPI_COMM_WORLD``, a dup's duplicate of
        it), whose collectives are MPI's as ``subgroup``'s twins' are; under Gloo Horovod's
        global process set. Not collective. (``subgroup`` of every rank would give a dup
        made after the job's first all-rank group the process set, not a twin.)"""
        if self._p2p_comm is not None:
            return MpiCommunicator(self._p2p_comm, topo=self.topo)
        return _HorovodGroup(self, self.hvd.global_process_set, tuple(range(self.size)))

    def iallreduce(self, tensor: torch.Tensor) -> Handle:
        wire = self.allreduce_dtype(tensor.dtype)
        name = self.op_name("allreduce", self.hvd.global_process_set)
        if wire == tensor.dtype:
            return _HorovodHandle(self.hvd, self.hvd.allreduce_async_(tensor, op=self.hvd.Sum,
                                                                      name=name))
        wide = tensor.to(wire)
        return _HorovodHandle(self.hvd, self.hvd.allreduce_async_(wide, op=self.hvd.Sum,
                                                                  name=name),
                              narrow=(wide, tensor))

    def _p2p(self) -> Any:
        if self._p2p_comm is None:
            raise RuntimeError(
                "point-to-point messages under the horovod backend need Horovod's MPI "
                "controller (horovodrun --mpi or mpirun); this job runs on Gloo")
        return self._p2p_comm

    def sendrecv(self, send: torch.Tensor, dest: int, recv: torch.Tensor, source: int,
                 tag: int = 0) -> None:
        self._p2p().Sendrecv(as_buffer(send), dest, tag, as_buffer(recv), source, tag)

    def isend(self, tensor: torch.Tensor, dest: int, tag: int = 0) -> Handle:
        return p2p_isend(self._p2p(), tensor, dest, tag)

    def irecv(self, tensor: torch.Tensor, source: int, tag: int = 0) -> Handle:
        return p2p_irecv(self._p2p(), tensor, source, tag)

    def send(self, tensor: torch.Tensor, dest: int, tag: int = 0) -> None:
        self._p2p().Send(as_buffer(tensor), dest, tag)

    def recv(self, tensor: torch.Tensor, source: int, tag: int = 0) -> None:
        self._p2p().Recv(as_buffer(tensor), source, tag)

    def recv_any(self, tensor: torch.Tensor, tag: int = 0) -> int:
        return p2p_recv_any(self._mpi, self._p2p(), tensor, tag)

    def barrier(self) -> None:
        self.hvd.barrier()

    def dup(self) -> HorovodCommunicator:
        """The same Horovod with op names of its own (module docstring). Collective
        under the MPI controller (it duplicates MPI_COMM_WORLD for the ring)."""
        self._dups += 1
        return _HorovodDup(self, f"{self._names}.dup{self._dups}")

    def allgather_object(self, obj: Any) -> list[Any]:
        return list(self.hvd.allgather_object(obj, name=f"{self._names}.allgather_object"))

    def bcast_object(self, obj: Any, root: int = 0) -> Any:
        return self.hvd.broadcast_object(obj, root_rank=root,
                                         name=f"{self._names}.bcast_object")

    def side_channel(self) -> base.SideChannel | None:
        """On MPI_COMM_WORLD's ranks when Horovod runs on MPI; none on Gloo."""
        return mpi_side_channel(self._mpi, self._mpi.COMM_WORLD) if self._mpi is not None \
            else None

    def abort(self, code: int = 1) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        if self._mpi is not None:
            self._mpi.COMM_WORLD.Abort(code)
        os._exit(code)  # horovodrun (Gloo) ends the other workers when one exits

    def close(self) -> None:
        # Horovod's thread first: it is in MPI every cycle, and MPI_Comm_free beside it
        # was seen to crash (benchmarks/horovod_presence.py). MPI stays up: mpi4py
        # initialised it, so Horovod's shutdown does not finalise it.
        self.hvd.shutdown()
        for c in self._group_comms.values():
            if c != self._mpi.COMM_NULL:
                c.Free()
        self._group_comms.clear()

    def versions(self) -> dict[str, str]:
        import horovod  # optional extra: the module imports without it

        out = {"horovod": horovod.__version__, "horovod_controller": self.controller}
        if self._mpi is not None:
            out["mpi4py"] = mpi4py.__version__
            out["mpi_library"] = mpi_library_version(self._mpi)
        return out


class _HorovodDup(HorovodCommunicator):
    """``HorovodCommunicator.dup``: shares the parent's Horovod, topology, process sets
    and dtype table; names its ops under ``names``; sends point-to-point messages on a
    duplicate of the parent's MPI communicator. Closing it leaves Horovod running."""

    def __init__(self, parent: HorovodCommunicator, names: str) -> None:  # no hvd.init
        self.hvd, self._mpi, self.topo = parent.hvd, parent._mpi, parent.topo
        self._placement = parent._placement
        self._wire, self._sets = parent._wire, parent._sets
        self._group_comms = {}  # sets made before the dup have no MPI twin here: no ring
        self._seq = {}
        self._names = names
        self._dups = 0
        self._p2p_comm = parent._p2p_comm.Dup() if parent._p2p_comm is not None else None

    def barrier(self) -> None:
        # hvd.barrier takes no name; a named all-reduce cannot meet the parent's barrier
        self.allreduce(torch.zeros(1))

    def close(self) -> None:
        if self._p2p_comm is not None:
            self._p2p_comm.Free()
            self._p2p_comm = None
