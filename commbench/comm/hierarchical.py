"""Two-level (hierarchical) all-reduce from the node topology.

Ranks are grouped by host (``Topology.hostnames``). Let ``L`` be the largest
number of ranks on a node and split the flat tensor into ``L`` shards (sizes
differ by at most one element). On a node with ``l`` ranks, local rank ``i``
owns shards ``i*L//l .. (i+1)*L//l - 1``: one shard each when ``l == L``, all
of them on a node with one rank, so uneven nodes (3 + 1) work.

Default variant (``hier``), the scheme Horovod uses with NCCL:

1. Reduce-scatter inside the node: each rank gets the node's sum of the
   shards it owns.
2. For every shard, all-reduce it across nodes among the ranks that own it,
   all local ranks working at once, each on its own shards; with the
   project's pipelined ring where the group has point-to-point messages
   (``_inter_node_allreduce`` says why), else the backend's all-reduce. Each node link
   carries ``2(n-1)/n`` of the tensor in total, as a flat ring does, but in
   ``l`` parallel streams of ``1/l`` of the data.
3. All-gather inside the node.

Leader variant (``hier-leader``): reduce to local rank 0, all-reduce among
the nodes' rank-0s, broadcast inside the node. One stream per node carries
the whole tensor across.

On one node, both variants reduce to their intra-node part.
(Sergeev & Del Balso 2018, "Horovod", https://arxiv.org/abs/1802.05799;
Thakur, Rabenseifner & Gropp 2005 for the cost model.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from commbench.comm.base import Communicator, Group
from commbench.comm.phases import PhaseHook, Phases
from commbench.comm.ring import chunk_bounds, ring_allreduce


def owned_shards(i: int, n_local: int, L: int) -> range:
    """Shards local rank ``i`` of a node with ``n_local`` ranks owns, of ``L`` in all."""
    return range(i * L // n_local, (i + 1) * L // n_local)


@dataclass
class Plan:
    L: int                               # shards (= largest node's rank count)
    local: Group                         # my node's ranks
    local_index: int
    local_size: int
    my_shards: list[int]
    cross: dict[int, Group | None]       # shard -> owners of it across nodes (mine only)
    leaders: Group | None                # every node's local rank 0 (for the leader variant)


_PLANS: dict[int, Plan] = {}


def plan_for(comm: Communicator) -> Plan:
    """The groups of ``comm``'s topology, made once (collectively) and kept."""
    key = id(comm)
    if key in _PLANS:
        return _PLANS[key]
    hosts = comm.topo.hostnames
    order = list(dict.fromkeys(hosts))
    nodes = [[r for r, h in enumerate(hosts) if h == host] for host in order]
    L = max(len(n) for n in nodes)
    local = mine = None
    for members in nodes:  # every rank takes part in every split, in the same order
        g = comm.subgroup(members)
        if g is not None:
            local, mine = g, members
    cross: dict[int, Group | None] = {}
    made: dict[tuple[int, ...], Group | None] = {}
    i = mine.index(comm.rank)
    shards = list(owned_shards(i, len(mine), L))
    for j in range(L):
        owners = tuple(sorted(
            n[next(k for k in range(len(n)) if j in owned_shards(k, len(n), L))]
            for n in nodes))
        if owners not in made:
            made[owners] = comm.subgroup(list(owners))
        if j in shards:
            cross[j] = made[owners]
    leaders_key = tuple(sorted(n[0] for n in nodes))
    leaders = made[leaders_key] if leaders_key in made else comm.subgroup(list(leaders_key))
    plan = Plan(L=L, local=local, local_index=i, local_size=len(mine), my_shards=shards,
                cross=cross, leaders=leaders)
    _PLANS[key] = plan
    return plan


#: phase names, in the order they run
HIER_PHASES = ("intra_reduce_scatter", "inter_allreduce", "intra_allgather")
LEADER_PHASES = ("intra_reduce", "inter_allreduce", "intra_bcast")


def inter_node_algo(group: Group) -> str:
    """What the inter-node phase runs on ``group``: ``ring`` where it has point-to-point
    messages, else the backend's ``native`` all-reduce of the group."""
    return "ring" if group.supports_p2p else "native"


def plan_inter_node_algo(comm: Communicator) -> str | None:
    """What this rank's inter-node phase runs (None: it has none, e.g. one node)."""
    p = plan_for(comm)
    groups = [g for g in (*p.cross.values(), p.leaders) if g is not None and g.size > 1]
    return inter_node_algo(groups[0]) if groups else None


def _inter_node_allreduce(group: Group, tensor: torch.Tensor) -> None:
    """All-reduce across nodes with the project's pipelined ring where the group allows.

    Open MPI's tuned all-reduce between two ranks moved 16 MiB at 0.67 of a
    200 Mbit/s link on the emulated cluster (1.04 s against a 0.70 s bound),
    while the ring, sending half each way at once in 1 MiB segments, took
    0.70 s; with four such flows per node pair (2 x 4 ranks) hierarchical's
    inter-node phase ran at ~0.6 of the link on the native all-reduce.
    """
    if inter_node_algo(group) == "ring":
        ring_allreduce(group, tensor)
    else:
        group.allreduce(tensor)


def hierarchical_allreduce(comm: Communicator, tensor: torch.Tensor,
                           on_phase: PhaseHook | None = None) -> None:
    """Reduce-scatter in the node, all-reduce shards across nodes, all-gather in the node.

    ``on_phase`` is told of each of ``HIER_PHASES`` as it ends; a phase that has
    nothing to do on this layout (one rank per node: no intra-node phase) is
    still reported, with its near-zero duration.
    """
    if comm.size == 1:
        return
    phases = Phases(on_phase)
    p = plan_for(comm)
    flat = tensor.view(-1)
    shard = chunk_bounds(flat.numel(), p.L)
    # each local rank's contiguous region: the shards it owns
    regions = []
    for k in range(p.local_size):
        owned = owned_shards(k, p.local_size, p.L)
        regions.append((shard[owned.start][0], shard[owned.stop - 1][1]))
    counts = [b - a for a, b in regions]
    start = regions[p.local_index][0]
    part = p.local.reduce_scatter_v(flat, counts) if p.local_size > 1 else flat
    phases.end("intra_reduce_scatter")
    for j in p.my_shards:
        g = p.cross[j]
        if g is not None and g.size > 1:
            a, b = shard[j]
            _inter_node_allreduce(g, part[a - start:b - start] if p.local_size > 1
                                  else flat[a:b])
    phases.end("inter_allreduce")
    if p.local_size > 1:
        p.local.allgather_v(part, counts, flat)
    phases.end("intra_allgather")


def leader_allreduce(comm: Communicator, tensor: torch.Tensor,
                     on_phase: PhaseHook | None = None) -> None:
    """Reduce to the node's first rank, all-reduce among those, broadcast in the node.

    ``on_phase`` is told of each of ``LEADER_PHASES`` as it ends.
    """
    if comm.size == 1:
        return
    phases = Phases(on_phase)
    p = plan_for(comm)
    flat = tensor.view(-1)
    if p.local_size > 1:
        p.local.reduce(flat, root=0)
    phases.end("intra_reduce")
    if p.leaders is not None and p.leaders.size > 1:
        _inter_node_allreduce(p.leaders, flat)
    phases.end("inter_allreduce")
    if p.local_size > 1:
        p.local.bcast(flat, root=0)
    phases.end("intra_bcast")
