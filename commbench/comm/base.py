"""The communicator interface every backend implements.

A communicator knows the job's topology (rank, size, and the two levels used
by hierarchical schemes: ``local`` = ranks on the same host, ``cross`` = ranks
with the same local rank on different hosts) and offers the few collectives
the strategies need. Tensors are reduced in place, where the communicator's
placement says (``Communicator.placement``, ``commbench.comm.placement``): host memory,
or this rank's GPU under NCCL.
"""

from __future__ import annotations

import abc
import socket
from dataclasses import dataclass
from typing import Any

import torch

from commbench.comm.placement import TensorPlacement, host


class Handle(abc.ABC):
    """A non-blocking collective in flight."""

    @abc.abstractmethod
    def test(self) -> bool:
        """Drive progress; return True once the operation has completed."""

    @abc.abstractmethod
    def wait(self) -> None:
        """Block until the operation has completed."""

    def wait_on_device(self) -> None:
        """Order the current CUDA stream after the operation without waiting for it on the
        host (a device library's handle: NCCL's), so that work queued on the stream next,
        a CUDA event included, runs once it has finished; elsewhere ``wait``."""
        self.wait()


@dataclass(frozen=True)
class Topology:
    """Where a rank sits: its host, and its place on and across hosts."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostnames: tuple[str, ...]  # host of every rank, indexed by rank

    @property
    def nodes(self) -> int:
        return len(set(self.hostnames))

    @property
    def local_sizes(self) -> tuple[int, ...]:
        """Ranks per node, nodes in order of their first rank (uneven allowed)."""
        seen: dict[str, int] = {}
        for h in self.hostnames:
            seen[h] = seen.get(h, 0) + 1
        return tuple(seen.values())


def topology_from_hostnames(rank: int, hostnames: list[str] | tuple[str, ...]) -> Topology:
    """Group ranks by host name, as Horovod and Open MPI do.

    local_rank is the rank's index among the ranks of its host (ordered by
    global rank); cross_rank is the host's index among hosts that have a rank
    with that local_rank, so cross groups work for uneven nodes too.
    """
    hostnames = tuple(hostnames)
    me = hostnames[rank]
    local = [r for r, h in enumerate(hostnames) if h == me]
    local_rank = local.index(rank)
    hosts_in_order = list(dict.fromkeys(hostnames))
    cross = [h for h in hosts_in_order
             if sum(1 for x in hostnames if x == h) > local_rank]
    return Topology(rank=rank, size=len(hostnames), local_rank=local_rank,
                    local_size=len(local), cross_rank=cross.index(me),
                    cross_size=len(cross), hostnames=hostnames)


def hostname() -> str:
    """The name of this rank's node: ranks that give the same name share a node.

    Backends call it through this module at the time they build their
    topology, so a program that runs the tools can replace it (to lay out
    the ranks of one machine as several nodes); the MPI library still sees
    the real host.
    """
    return socket.gethostname()


class Group(abc.ABC):
    """Some of the job's ranks, for two-level schemes: an MPI sub-communicator or a
    Horovod process set. ``rank`` and ``size`` are within the group."""

    rank: int
    size: int
    #: what carries the group's collectives, as records name it (``commbench.latency``)
    name: str = "?"
    #: whether ``isend``/``irecv`` work within the group (the project's ring needs them)
    supports_p2p: bool = False
    #: whether ``ireduce_scatter_v`` and the other ``i`` collectives return before the
    #: transfer is done (by default they run it to the end)
    nonblocking_collectives: bool = False

    @abc.abstractmethod
    def allreduce(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over the group, in place."""

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype the group's collectives move a ``dtype`` tensor in (its own, unless
        the library widens it)."""
        return dtype

    def isend(self, tensor: torch.Tensor, dest: int, tag: int = 0) -> Handle:
        """Start sending ``tensor`` to group rank ``dest`` (where ``supports_p2p``)."""
        raise NotImplementedError(f"{type(self).__name__} has no point-to-point messages")

    def irecv(self, tensor: torch.Tensor, source: int, tag: int = 0) -> Handle:
        """Start receiving into ``tensor`` from group rank ``source`` (where ``supports_p2p``)."""
        raise NotImplementedError(f"{type(self).__name__} has no point-to-point messages")

    @abc.abstractmethod
    def reduce_scatter_v(self, tensor: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Sum ``tensor`` over the group; return this rank's contiguous part of the sum
        (``counts[i]`` elements for group rank ``i``, in rank order)."""

    @abc.abstractmethod
    def allgather_v(self, part: torch.Tensor, counts: list[int], out: torch.Tensor) -> None:
        """Concatenate every rank's ``part`` (``counts`` elements each) into ``out``."""

    @abc.abstractmethod
    def reduce(self, tensor: torch.Tensor, root: int = 0) -> None:
        """Sum ``tensor`` onto group rank ``root`` (in place there)."""

    @abc.abstractmethod
    def bcast(self, tensor: torch.Tensor, root: int = 0) -> None:
        """Copy group rank ``root``'s ``tensor`` to every rank of the group."""

    def ireduce_scatter_v(self, tensor: torch.Tensor,
                          counts: list[int]) -> tuple[torch.Tensor, Handle]:
        """Start ``reduce_scatter_v``: this rank's part (filled once the handle is done) and
        the handle; a backend without a non-blocking one runs it to the end."""
        return self.reduce_scatter_v(tensor, counts), DONE

    def iallgather_v(self, part: torch.Tensor, counts: list[int], out: torch.Tensor) -> Handle:
        """Start ``allgather_v``; a backend without a non-blocking one runs it to the end."""
        self.allgather_v(part, counts, out)
        return DONE

    def ireduce(self, tensor: torch.Tensor, root: int = 0) -> Handle:
        """Start ``reduce``; a backend without a non-blocking one runs it to the end."""
        self.reduce(tensor, root)
        return DONE

    def ibcast(self, tensor: torch.Tensor, root: int = 0) -> Handle:
        """Start ``bcast``; a backend without a non-blocking one runs it to the end."""
        self.bcast(tensor, root)
        return DONE


class _Done(Handle):
    """An operation that completed when it was started."""

    def test(self) -> bool:
        return True

    def wait(self) -> None:
        pass


DONE = _Done()


def _topology_field(name: str) -> property:
    """A read-only attribute of a communicator that is ``name`` of its ``topo``."""
    return property(lambda self: getattr(self.topo, name), doc=f"``topo.{name}``")


class SideChannel(abc.ABC):
    """Small Python objects between ranks, off the job's communicator
    (``Communicator.side_channel``): sends never block, receiving never waits."""

    rank: int
    size: int

    @abc.abstractmethod
    def send(self, dest: int, msg: Any) -> None:
        """Start sending ``msg`` to rank ``dest``; returns at once."""

    def announce(self, msg: Any) -> None:
        """``send`` ``msg`` to every other rank."""
        for dest in range(self.size):
            if dest != self.rank:
                self.send(dest, msg)

    @abc.abstractmethod
    def receive(self) -> list[tuple[int, Any]]:
        """(source, message) of every message that has arrived; none waited for."""

    @abc.abstractmethod
    def allgather(self, obj: Any) -> list[Any]:
        """``obj`` of every rank, by rank (collective)."""


def lacks_p2p(comm: Communicator, what: str, instead: str) -> str:
    """The message for ``what`` (a flag and value) asked of ``comm``, which has no
    point-to-point messages: the library that lacks them, and where they are."""
    where = {"horovod": "launch with horovodrun --mpi (Horovod on Gloo has none)",
             "torch-nccl": "use --dist-backend gloo (NCCL's are not offered here)"}
    return (f"{what} needs point-to-point messages, which the {comm.name} backend does not "
            f"offer: use {instead}, or {where.get(comm.name, 'launch with mpirun')}")


class Communicator(abc.ABC):
    """One backend's view of the job. Subclasses set ``name`` and ``topo``."""

    name: str = "?"
    topo: Topology
    #: whether ``sendrecv`` works (the project's own algorithms need it)
    supports_p2p: bool = True
    #: whether ``iallreduce`` runs on a background thread of the library's own (Horovod's),
    #: so handles complete without being tested and several may be in flight at once
    progresses_itself: bool = False
    #: whether horovod.torch is initialised on this job's ranks, so Horovod's own training
    #: API (``hvd.DistributedOptimizer``: the ``horovod`` peer) can run beside it
    runs_horovod: bool = False

    @property
    def supports_recv_any(self) -> bool:
        """Whether ``recv_any`` works (a library without receive-from-any-source, NCCL,
        says no here); where point-to-point works, it does unless a backend says not."""
        return self.supports_p2p

    def placement(self) -> TensorPlacement:
        """Where this communicator's tensors live and which library reduces them
        (``commbench.comm.placement``): the one answer, decided before the backend started;
        host memory, reduced by the backend itself, unless a backend says otherwise."""
        return host(self.name)

    @property
    def device_collectives(self) -> bool:
        """``placement().on_device``: the collectives take tensors where the workload keeps
        them, on a CUDA device (NCCL), with no staging through host memory; blocking calls
        return once the device has finished them."""
        return self.placement().on_device

    #: the torch.distributed process group the backend runs on (the torch backend's), for a
    #: peer that runs on torch.distributed itself (DDP); None elsewhere
    process_group: Any = None

    # -- topology shortcuts: comm.rank is comm.topo.rank, and so on ---------
    rank = _topology_field("rank")
    size = _topology_field("size")
    local_rank = _topology_field("local_rank")
    local_size = _topology_field("local_size")
    cross_rank = _topology_field("cross_rank")
    cross_size = _topology_field("cross_size")

    # -- collectives on tensors (sum, in place) ----------------------------
    @abc.abstractmethod
    def allreduce(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over all ranks, in place, with the backend's own algorithm."""

    def allreduce_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype ``allreduce`` puts on the wire for tensors of ``dtype``.

        ``dtype`` itself unless the backend has to widen (Horovod without
        bfloat16); results record it so a widened run is not mistaken for a
        2-byte one.
        """
        return dtype

    @abc.abstractmethod
    def bcast(self, tensor: torch.Tensor, root: int = 0) -> None:
        """Copy rank ``root``'s ``tensor`` to every rank, in place (model buffers)."""

    @abc.abstractmethod
    def iallreduce(self, tensor: torch.Tensor) -> Handle:
        """Start a non-blocking in-place sum of ``tensor``; return its handle."""

    @abc.abstractmethod
    def sendrecv(self, send: torch.Tensor, dest: int, recv: torch.Tensor, source: int,
                 tag: int = 0) -> None:
        """Send ``send`` to ``dest`` while receiving ``recv`` from ``source`` (point to point)."""

    @abc.abstractmethod
    def isend(self, tensor: torch.Tensor, dest: int, tag: int = 0) -> Handle:
        """Start sending ``tensor`` to ``dest``; do not touch it until the handle is done."""

    @abc.abstractmethod
    def irecv(self, tensor: torch.Tensor, source: int, tag: int = 0) -> Handle:
        """Start receiving into ``tensor`` from ``source``.

        Messages between one pair of ranks with one tag match in the order
        they were posted (MPI's non-overtaking rule); the ring relies on it.
        """

    @abc.abstractmethod
    def send(self, tensor: torch.Tensor, dest: int, tag: int = 0) -> None:
        """Send ``tensor`` to ``dest``; return once ``tensor`` may be changed again."""

    @abc.abstractmethod
    def recv(self, tensor: torch.Tensor, source: int, tag: int = 0) -> None:
        """Receive into ``tensor`` from ``source``; return once it has arrived."""

    @abc.abstractmethod
    def recv_any(self, tensor: torch.Tensor, tag: int = 0) -> int:
        """Receive into ``tensor`` the first message with ``tag`` from any rank; return
        that rank (a server serving whichever client is ready: ``commbench.paramserver``)."""

    @abc.abstractmethod
    def subgroup(self, ranks: list[int]) -> Group | None:
        """The group of ``ranks`` (in that order); None on ranks outside it.

        Collective over the whole job: every rank calls it with the same list,
        in the same order of calls.
        """

    def world_group(self) -> Group:
        """Every rank of the job as a ``Group``: its reduce-scatter and all-gather, v-forms
        included (the ZeRO strategies'). The communicator itself where it is one (mpi,
        torch); else a backend's own (Horovod's), or by default the group of all its ranks
        made by ``subgroup``, collective then: every rank asks at the same point."""
        if isinstance(self, Group):
            return self
        group = self.subgroup(list(range(self.size)))
        if group is None:  # every rank is in it
            raise RuntimeError(f"{self.name}: rank {self.rank} is not in the group of all ranks")
        return group

    @abc.abstractmethod
    def barrier(self) -> None:
        """Wait until every rank has arrived."""

    @abc.abstractmethod
    def dup(self) -> Communicator:
        """A communicator over the same ranks whose operations never match this one's.

        For a second thread (``commbench.comm.engine``): collectives are matched
        per communicator in issue order, so two threads sharing one would pair
        different operations on different ranks. Collective over the whole job:
        every rank calls it in the same order of calls. The owner closes it.
        """

    # -- small Python objects (outside timed regions) ----------------------
    @abc.abstractmethod
    def allgather_object(self, obj: Any) -> list[Any]:
        """Return ``obj`` of every rank, indexed by rank."""

    def gather_object(self, obj: Any) -> list[Any] | None:
        """Return ``obj`` of every rank on rank 0, None elsewhere."""
        objs = self.allgather_object(obj)
        return objs if self.rank == 0 else None

    @abc.abstractmethod
    def bcast_object(self, obj: Any, root: int = 0) -> Any:
        """Return root's ``obj`` on every rank."""

    def side_channel(self) -> SideChannel | None:
        """A channel of its own for small messages between helper threads of the ranks
        (the watchdog's queries and replies), never matched with the job's operations and
        usable while the main thread is inside a collective; None where the backend has
        none (Horovod on Gloo). Collective where it is offered: every rank asks for it at
        the same point."""
        return None

    # -- job control ---------------------------------------------------------
    @abc.abstractmethod
    def abort(self, code: int = 1) -> None:
        """End the whole job now (all ranks) with ``code``."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the backend (called once at the end)."""

    @abc.abstractmethod
    def versions(self) -> dict[str, str]:
        """Library versions this backend runs on, for result records."""
