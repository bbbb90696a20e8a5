"""HSDP: ZeRO-2 sharding inside each node, the shards replicated across nodes.

Hybrid sharded data parallel (PyTorch FSDP's ``ShardingStrategy._HYBRID_SHARD_ZERO2``:
``SHARD_GRAD_OP`` within a node, replicated across nodes; Zhao et al., "PyTorch FSDP",
VLDB 2023, https://arxiv.org/abs/2304.11277, on hybrid sharding). The job's ranks form a 2-D
mesh: each node is one shard group of ``L`` ranks, and the ranks with the same local rank
on the ``N`` nodes are one replica group. Within the node it is ``zero2``
(``commbench.strategies.zero``, whose bucket machinery it runs): gradients and the
optimizer state are sharded over the node's ranks, the parameters kept whole on every
rank. Which stage, and why: the ZeRO-2 form, not ``HYBRID_SHARD``'s ZeRO-3 one (parameters
sharded at rest and gathered per unit before forward and again in backward), because the
gradient sync is what this toolkit measures, and the ZeRO-2 form's is exactly the
two-level all-reduce's (below) with one parameter all-gather a step, where the ZeRO-3
form gathers each unit's parameters before forward and again in backward; those per-unit
gathers belong with ``zero3``'s forward replayed unit by unit.

1. Once, gradients are grouped into buckets by bucketed's rule (``--bucket-mb``,
   ``--first-bucket-mb``), and each bucket is split into ``L`` contiguous parts
   (``shard_counts``, as zero's over the job's ranks): local rank ``i`` of every node
   owns part ``i``, so the ``N`` ranks of one replica group own the same part.
2. As backward fills a bucket (zero2's two reused buffers), the strategy's transfer
   engine runs, on its own thread and in one order on every rank:
   a. the bucket's reduce-scatter in the node (``reduce_scatter_v`` of the node
      group): this rank gets the node's sum of its part, and the buffer is free again;
   b. the all-reduce of that part across nodes, within the replica group (the
      backend's ``allreduce`` of the group: Open MPI's tuned one, Gloo's, Horovod's
      process set or MPI twin), then divided by the job's ranks ``n = NL``: the mean.
3. ``finish`` steps each bucket's shard with the workload's SGD (``sgd_step``; every rank
   of a replica group steps the same shard alike), then all-gathers the parameters in
   the node (``allgather_v`` of the node group), as ``zero2`` does over the job.

Bytes. A node's link carries only the cross-node all-reduces: each of the ``L`` ranks
all-reduces Ψ/L over ``N`` nodes, which a bandwidth-optimal all-reduce (ring,
Rabenseifner) does by sending 2(Ψ/L)(N−1)/N out of the node, so each node link carries
2Ψ(N−1)/N per direction per step (1.0Ψ on 2 × 4, as hierarchical's all-reduce; a flat
ring's 1.75Ψ; ``node_link_bytes``). Each rank hands across ranks the other local ranks'
parts twice (reduce-scatter, all-gather) and its part's all-reduce, 2(Ψ−Ψ/L) +
2(Ψ/L)(N−1)/N = 2Ψ(n−1)/n with even parts: what DDP's all-reduce hands over
(``library_bytes``).

What it refuses (exit 2, naming the cause): one node (no replicas: that is ``zero2``);
nodes of unequal size (``check_layout`` says why); what ``zero2`` refuses
(``--compression``, ``--bucket-mb auto``, ``--accum-steps`` above 1, a model on the GPU).

Records. Each bucket's three collectives are timed by the engine, and ``comm_phases_s``
keeps ``reduce_scatter``, ``allreduce`` and ``allgather`` apart; ``comm_bytes`` counts
the bucket once, at its reduce-scatter (busbw then reads as an all-reduce's, as for
zero). ``knobs``: zero's, over this layout, plus ``nodes``, ``shard_group_size``,
``node_link_bytes_per_step``.

Example (two nodes of four ranks)::

    mpirun -np 8 --map-by ppr:4:node python -m commbench.allreduce \\
        --strategy bucketed,zero2,hsdp --algo native --bucket-mb 25 --compute-ms 300
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import torch

from commbench.comm.base import Communicator, Topology
from commbench.comm.shardcoll import (
    OneLevel,
    node_and_replica_groups,
    node_ranks,
    replica_groups,
)
from commbench.strategies.zero import (
    ZeroSettings,
    ZeroStrategy,
    _Bucket,
    shard_counts,
)


def check_shard_group(strategy: str, shard_group: int, ranks: int) -> None:
    """ValueError, naming ``strategy`` and the cause, unless shard groups of
    ``shard_group`` ranks tile the job's ``ranks`` (each rank in one group, every group
    the same size, so that the parts of a bucket and their replicas line up)."""
    if shard_group < 1 or ranks % shard_group:
        raise ValueError(f"--strategy {strategy}: a shard group of {shard_group} ranks does not "
                         f"divide the job's {ranks} ranks; give a divisor of {ranks} "
                         f"({', '.join(str(d) for d in range(1, ranks + 1) if ranks % d == 0)})")


def shard_groups_of(strategy: str, shard_group: int, ranks: int) -> list[list[int]]:
    """The job's ranks in consecutive shard groups of ``shard_group`` (``check_shard_group``
    first): ``[[0, 1], [2, 3]]`` for 2 of 4."""
    check_shard_group(strategy, shard_group, ranks)
    return [list(range(k, k + shard_group)) for k in range(0, ranks, shard_group)]


def check_layout(topo: Topology, strategy: str = "hsdp") -> None:
    """ValueError, naming the cause, unless the job spans several nodes of equal size."""
    sizes = topo.local_sizes
    if len(sizes) < 2:
        raise ValueError(f"--strategy {strategy} on one node: it shards inside the node and "
                         "all-reduces the shards across nodes, so one node has no replicas "
                         "and it would be zero2; run --strategy zero2 there, or launch on "
                         "several nodes")
    if len(set(sizes)) > 1:
        raise ValueError(
            f"--strategy {strategy} on nodes of unequal size "
            f"({' + '.join(map(str, sizes))} ranks): each node is one shard group and "
            "local rank i of every node holds part i of each bucket, all-reduced with its "
            "peers on the other nodes; a smaller node has no rank for some parts, and the "
            "rank that took several would hold that many shards of the optimizer state, "
            "the memory HSDP exists to save; give every node the same number of ranks, or "
            "run --strategy zero2 (one shard group over the job) or hierarchical")
    check_shard_group(strategy, sizes[0], topo.size)


def library_bytes(bucket_numels: Sequence[int], shard_group: int, replicas: int,
                  local: int, replica: int, itemsize: int) -> int:
    """Bytes the rank at ``local`` in its shard group and ``replica`` in its replica group
    hands across ranks per step: in each bucket's reduce-scatter the other local ranks'
    parts, which it sends, and in its all-gather theirs again, which it receives; in its
    part's all-reduce across the ``replicas`` that part less its own ``1/replicas`` of it,
    twice (a reduce-scatter then an all-gather: what a ring all-reduce hands over). Summed
    over the job's ``n`` ranks that is 2(n−1)Ψ for Ψ gradient bytes, as zero's."""
    out = 0
    for numel in bucket_numels:
        part = shard_counts(numel, shard_group)[local]
        out += (numel - part) + (part - shard_counts(part, replicas)[replica])
    return 2 * out * itemsize


def node_link_bytes(grad_bytes: int, nodes: int) -> float:
    """Bytes through one node's link per direction per step, on a bandwidth-optimal
    all-reduce across nodes: 2Ψ(N−1)/N (1.0Ψ on 2 nodes; the reduce-scatter and
    all-gather stay inside the node)."""
    return 2 * grad_bytes * (nodes - 1) / nodes


@dataclass(frozen=True)
class HsdpSettings(ZeroSettings):
    """``hsdp``'s settings (``ZeroSettings``: its buckets; ``--compression`` and
    ``--bucket-mb auto`` refused): ``--accum-steps`` refused, as under ``zero2``."""

    strategy: ClassVar[str] = "hsdp"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.accum_steps > 1:
            raise ValueError(f"--strategy hsdp with --accum-steps {self.accum_steps}: not "
                             "built (its ZeRO-2 form keeps only its shard of the gradient, so "
                             "each micro-batch would need a reduce-scatter into the shard); "
                             "use --strategy zero1, which accumulates the full gradient")


class HsdpStrategy(ZeroStrategy):
    """``zero2`` inside each node, the shards all-reduced across nodes (module docstring)."""

    name = "hsdp"
    settings_class = HsdpSettings
    settings: HsdpSettings
    stage = 2  # gradients and optimizer state sharded in the node (module docstring: why)
    algos = ("native",)  # the backend's collectives in the node and across it

    @classmethod
    def check(cls, comm: Communicator, algo: str) -> None:
        super().check(comm, algo)
        check_layout(comm.topo, cls.name)

    def shard_place(self) -> tuple[int, int]:
        """(local rank, ranks on the node), from the nodes' names (Horovod's own local rank
        follows the real host, not an emulated layout)."""
        node = next(n for n in node_ranks(self.comm.topo) if self.comm.rank in n)
        return node.index(self.comm.rank), len(node)

    def open_collectives(self, engine_comm: Communicator) -> OneLevel:
        """The backend's reduce-scatter and all-gather over the node's group, which the
        buckets are sharded over; the replica group (``self._cross``) beside it
        (``node_and_replica_groups``)."""
        local, self._cross = node_and_replica_groups(engine_comm)
        return OneLevel("native", local)

    def _submit_reduction(self, b: _Bucket) -> None:
        """The node's reduce-scatter of ``b`` (its sum into the gradient shard, the buffer
        then free), then the shard's all-reduce across nodes (the mean)."""
        b.scatter = self._engine.submit(b.buffer, after=partial(self._take_node_sum, b),
                                        run=partial(self._reduce_scatter, b))
        cross = self._engine.submit(b.grad, after=partial(self._take_mean_of_sum, b),
                                    run=self._allreduce_across)
        b.reduction = [(b.scatter, "reduce_scatter", b.numel * self.dtype.itemsize),
                       (cross, "allreduce", 0)]  # the bucket counted once (module docstring)

    def _take_node_sum(self, b: _Bucket) -> None:
        """On the engine's thread: the node's sum of this rank's part into its gradient
        shard; the buffer goes back to the pool."""
        b.grad.copy_(b.summed)
        b.summed = None
        self._give_back(b)

    def _allreduce_across(self, part: torch.Tensor) -> None:
        """On the engine's thread: ``part`` summed over the replica group. An empty part (a
        bucket of fewer elements than the node's ranks) is empty on every rank of the
        group, which then skips it alike."""
        if part.numel():
            self._cross.allreduce(part)

    def _take_mean_of_sum(self, b: _Bucket) -> None:
        """On the engine's thread: the job's sum of this rank's part into its mean."""
        b.grad.div_(self.comm.size)

    def knobs(self) -> dict:
        nodes = node_ranks(self.comm.topo)
        shard_group, replicas, itemsize = len(nodes[0]), len(nodes), self.dtype.itemsize
        numels = [b.numel for b in self.buckets]
        # (place in the node, place in the replica group) of every rank
        place = {r: (i, g.index(r)) for i, g in enumerate(replica_groups(nodes)) for r in g}
        grad_bytes = sum(numels) * itemsize
        return {**super().knobs(),
                "collective": f"reduce_scatter_v and allgather_v of the node's "
                              f"{self._coll.group.name} group, allreduce of the "
                              f"{self._cross.name} replica group across nodes, on the engine "
                              "thread",
                "nodes": replicas, "shard_group_size": shard_group,
                "shard_elements_ranks": [
                    sum(shard_counts(n, shard_group)[place[r][0]] for n in numels)
                    for r in range(self.comm.size)],
                "library_bytes_per_step_ranks": [
                    library_bytes(numels, shard_group, replicas, *place[r], itemsize)
                    for r in range(self.comm.size)],
                "node_link_bytes_per_step": node_link_bytes(grad_bytes, replicas)}
