"""The reduce-scatter and all-gather of the sharded strategies, by ``--algo``.

A sharded strategy (``zero1``, ``zero2``, ``zero3``) splits each bucket or unit of ``numel``
elements into one contiguous part per job rank (``counts``, in rank order) and runs two
collectives on it: a reduce-scatter (rank ``r`` gets part ``r`` of the sum) and an
all-gather (every rank's part into the whole). ``shard_collectives`` makes the object that
runs them on a transfer engine's communicator:

- ``native`` and ``ring`` (``OneLevel``): over the whole job at once, by the backend's
  ``reduce_scatter_v`` and ``allgather_v`` or by the project's ring forms on point-to-point
  messages (``commbench.comm.p2pcoll``). A ring moves Ψ(n−1)/n through each node's link per
  collective.
- ``hier`` (``TwoLevel``), topology-aware (shard-then-cross): on ``N`` nodes of ``L``
  ranks, a reduce-scatter inside the node, then one across nodes among the ranks with the
  same place in their node; an all-gather the other way round. Only the cross-node step
  leaves the node, on ``1/L`` of the data, so each node's link carries Ψ(N−1)/N per
  collective (0.5Ψ on 2 × 4 against the ring's 0.875Ψ), as the two-level all-reduce does
  for its two halves (``commbench.comm.hierarchical``: 2Ψ(N−1)/N).

  Rank ``r`` must still end with part ``r`` of the job's order, which the two levels do
  not give by themselves: the node's reduce-scatter hands its local rank ``l`` one
  contiguous piece, which the cross-node reduce-scatter then splits among the nodes. So
  the buffer is permuted first: piece ``l`` of the node's reduce-scatter is the parts of
  the ranks at place ``l`` on every node, in their cross-node group's rank order; the
  cross-node reduce-scatter then leaves each rank its own part. The all-gather runs the
  same steps backwards and puts each part back in its place. (NCCL's and DeepSpeed's
  hierarchical forms permute the same way; the copies are two of the bucket per step,
  in host memory.)

  The cross-node step runs on the project's ring where the group has point-to-point
  messages (``inter_node_algo``, as the two-level all-reduce's does: with 2 nodes it is
  one exchange of halves), else on the backend's collectives; inside the node, the
  backend's. It needs nodes of equal size (``check_two_level``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from commbench.comm.base import Communicator, Group, Topology
from commbench.comm.hierarchical import inter_node_algo
from commbench.comm.p2pcoll import allgather_by, reduce_scatter_by
from commbench.comm.ring import offsets


def node_ranks(topo: Topology) -> list[list[int]]:
    """Every node's ranks, ascending, nodes in order of their first rank."""
    hosts = topo.hostnames
    return [[r for r, h in enumerate(hosts) if h == host] for host in dict.fromkeys(hosts)]


def replica_groups(shard_groups: Sequence[Sequence[int]]) -> list[list[int]]:
    """The ranks that hold the same part: the ``i``-th rank of every shard group, ascending
    (as torch orders a group's ranks), for each ``i``; the shard groups of equal size."""
    return [sorted(g[i] for g in shard_groups) for i in range(len(shard_groups[0]))]


class OneRank(Group):
    """A group of one rank: its reduce-scatter and all-gather are copies (no library call;
    the library is not asked for groups of one rank)."""

    name = "one rank"
    rank, size = 0, 1

    def allreduce(self, tensor: torch.Tensor) -> None:
        pass

    def reduce_scatter_v(self, tensor: torch.Tensor, counts: list[int]) -> torch.Tensor:
        return tensor.clone()

    def allgather_v(self, part: torch.Tensor, counts: list[int], out: torch.Tensor) -> None:
        out.view(-1).copy_(part.view(-1))

    def reduce(self, tensor: torch.Tensor, root: int = 0) -> None:
        pass

    def bcast(self, tensor: torch.Tensor, root: int = 0) -> None:
        pass


def node_and_replica_groups(comm: Communicator) -> tuple[Group, Group]:
    """This rank's node group and replica group (the ranks at its place on every node) of
    ``comm``, whose nodes are of equal size. Collective: every rank asks for every group, in
    one order. A group of one rank is ``OneRank`` (no library group); one of every rank
    (one node, or a rank a node) is ``comm``'s world group."""
    nodes = node_ranks(comm.topo)
    mine = next(k for k, n in enumerate(nodes) if comm.rank in n)
    place = nodes[mine].index(comm.rank)

    def group(members: list[list[int]], index: int) -> Group:
        if len(members[0]) == 1:
            return OneRank()
        if len(members) == 1:
            return comm.world_group()
        made = [comm.subgroup(m) for m in members][index]
        assert made is not None  # this rank is one of its members
        return made

    return group(nodes, mine), group(replica_groups(nodes), place)


def check_two_level(topo: Topology, who: str) -> None:
    """ValueError, naming ``who`` and the cause, unless the nodes are of equal size."""
    sizes = topo.local_sizes
    if len(set(sizes)) > 1:
        raise ValueError(
            f"{who} --algo hier on nodes of unequal size ({' + '.join(map(str, sizes))} "
            "ranks): the topology-aware reduce-scatter hands local rank l of every node the "
            "parts of the ranks at place l across nodes, and a smaller node has no rank for "
            "some places; give every node the same number of ranks, or use --algo ring")


class OneLevel:
    """``native`` or ``ring`` over one group (module docstring)."""

    def __init__(self, algo: str, group: Group) -> None:
        self.algo = algo
        self.group = group

    def reduce_scatter(self, flat: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Blocking: this rank's part of the sum of ``flat``."""
        return reduce_scatter_by(self.algo, self.group, flat, counts)

    def allgather(self, part: torch.Tensor, counts: list[int], out: torch.Tensor) -> None:
        """Blocking: every rank's ``part`` into ``out``."""
        allgather_by(self.algo, self.group, part, counts, out)

    def describe(self) -> str:
        if self.algo == "ring":
            return ("the project's ring reduce-scatter and all-gather on point-to-point "
                    f"messages of the {self.group.name} group")
        return f"reduce_scatter_v and allgather_v of the {self.group.name} group"


class TwoLevel:
    """``hier``: inside the node, then across nodes (module docstring)."""

    algo = "hier"

    def __init__(self, comm: Communicator) -> None:
        check_two_level(comm.topo, "a sharded strategy's")
        nodes = node_ranks(comm.topo)
        self.local, self.cross = node_and_replica_groups(comm)
        #: the job ranks at each place of a node, in their cross-node group's rank order:
        #: the node's reduce-scatter gives place l the parts of ``self.places[l]``
        self.places = replica_groups(nodes)
        self.place = next(k for k, g in enumerate(self.places) if comm.rank in g)
        self.cross_algo = inter_node_algo(self.cross) if self.cross.size > 1 else "native"

    def _layout(self, counts: list[int]) -> tuple[list[int], list[int], list[int]]:
        """(each place's piece in the permuted buffer, this place's cross-node counts, each
        job rank's offset in the job's order)."""
        pieces = [sum(counts[r] for r in ranks) for ranks in self.places]
        return pieces, [counts[r] for r in self.places[self.place]], offsets(counts)

    def reduce_scatter(self, flat: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Blocking: this rank's part of the job's sum of ``flat``."""
        pieces, cross_counts, off = self._layout(counts)
        permuted = torch.cat([flat[off[r]:off[r] + counts[r]]
                              for ranks in self.places for r in ranks])
        node_sum = self.local.reduce_scatter_v(permuted, pieces) \
            if flat.numel() else permuted
        if not pieces[self.place]:  # empty on every rank of this cross-node group alike
            return node_sum[:0]
        return reduce_scatter_by(self.cross_algo, self.cross, node_sum, cross_counts)

    def allgather(self, part: torch.Tensor, counts: list[int], out: torch.Tensor) -> None:
        """Blocking: every rank's ``part`` into ``out`` (the job's order)."""
        pieces, cross_counts, off = self._layout(counts)
        piece = torch.empty(pieces[self.place], dtype=part.dtype)
        if pieces[self.place]:
            allgather_by(self.cross_algo, self.cross, part, cross_counts, piece)
        permuted = torch.empty(sum(pieces), dtype=part.dtype)
        if permuted.numel():
            self.local.allgather_v(piece, pieces, permuted)
        flat = out.view(-1)
        at = 0
        for ranks in self.places:
            for r in ranks:
                flat[off[r]:off[r] + counts[r]].copy_(permuted[at:at + counts[r]])
                at += counts[r]

    def describe(self) -> str:
        return (f"topology-aware: reduce_scatter_v and allgather_v of the node's "
                f"{self.local.name} group, and across nodes the "
                + ("project's ring forms on point-to-point messages"
                   if self.cross_algo == "ring" else "backend's collectives")
                + f" of the {self.cross.name} group of this rank's place")


ShardCollectives = OneLevel | TwoLevel


def shard_collectives(algo: str, comm: Communicator) -> ShardCollectives:
    """The collectives of ``algo`` on ``comm`` (a transfer engine's). Collective where
    ``algo`` is ``hier`` (it makes groups): call it on every rank, in one order."""
    if algo == "hier":
        return TwoLevel(comm)
    return OneLevel(algo, comm.world_group())
