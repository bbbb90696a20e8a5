"""Hierarchical all-reduce: two levels from the node topology.

The fused gradient (as ``flat``) is all-reduced with one of the two-level
algorithms of ``commbench.comm.hierarchical``:

- ``--algo hier`` (default): reduce-scatter inside each node, all-reduce of
  each shard across nodes with all local ranks working in parallel,
  all-gather inside the node (Horovod's scheme with NCCL);
- ``--algo hier-leader``: reduce to the node's first rank, all-reduce among
  the first ranks, broadcast inside the node.

With the mpi backend the levels are MPI sub-communicators (``Split``); with
the horovod backend, Horovod process sets (dynamic), whose collectives run on
MPI twins of the sets under Horovod's MPI controller (``comm/horovod.py``). Uneven nodes (3 + 1)
and a single node work. ``--strategy flat --algo hier`` runs the same thing;
this name exists so studies read "flat vs hierarchical".
"""

from __future__ import annotations

from commbench.strategies.flat import FlatStrategy


class HierarchicalStrategy(FlatStrategy):
    name = "hierarchical"
    algos = ("hier", "hier-leader")
    default_algo = "hier"
