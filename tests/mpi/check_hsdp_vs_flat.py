"""Run under mpirun/torchrun/horovodrun on emulated nodes of equal size: hsdp steps the
parameters as flat + SGD.

The ranks' node names come from ``tests/fakes.py --nodes`` (``a,a,b,b``: 2 nodes x 2
ranks). Parameters are a few odd small tensors (one element and three: fewer than a node's
ranks, so per-tensor buckets leave some ranks an empty shard and some replica groups an
empty all-reduce) and ResNet-18's shapes under 100k elements, from the same random values
on every rank. At each step rank ``r``'s gradient is ``a + r * b`` (``a`` and ``b`` drawn
alike on every rank). The reference is flat's mean, then ``torch.optim.SGD`` (momentum,
weight decay) on a copy of the parameters. hsdp, at several bucket caps (0 = one bucket
per tensor, a tiny one, 1 MB, one bucket for all), takes the same steps from the same start,
announcing the gradients in backward order, then shuffled per rank, then with some never
announced. After every step its parameters must match the reference within float
tolerance on every rank; the timer must have seen one reduce-scatter, one all-reduce and
one all-gather per bucket, each kind's time apart, and the bucket's bytes once; the
validation pass must give the closed-form mean (``count_wrong``: 0) and leave the
parameters alone; the bytes each rank hands over must sum to 2(n-1) times the gradient's,
each node's shards must tile the gradient, and the node link must carry 2Ψ(N-1)/N.
Exits 1 on a mismatch.

    mpirun -np 4 python -m tests.fakes --nodes a,a,b,b tests/mpi/check_hsdp_vs_flat.py mpi
"""

from __future__ import annotations

import sys

from sgd_reference import model, reference  # beside this script (scripts run as files)
from verdict import verdict

from commbench.comm import make_communicator
from commbench.strategies import make_strategy
from commbench.strategies.hsdp import node_ranks

BUCKET_MB = [0, 0.01, 1, 1000]
PHASES = {"reduce_scatter", "allreduce", "allgather"}


def check_knobs(run: str, knobs: dict, nodes: list[list[int]], n: int, nbytes: int) -> list[str]:
    bad = []
    if sum(knobs["bucket_bytes"]) != nbytes:
        bad.append(f"{run}: buckets hold {sum(knobs['bucket_bytes'])} bytes, gradients {nbytes}")
    if sum(knobs["library_bytes_per_step_ranks"]) != 2 * (n - 1) * nbytes:
        bad.append(f"{run}: ranks hand over {knobs['library_bytes_per_step_ranks']} bytes, "
                   f"not 2(n-1) x {nbytes} in all")
    for node in nodes:
        if sum(knobs["shard_elements_ranks"][r] for r in node) != nbytes // 4:
            bad.append(f"{run}: node {node}'s shards {knobs['shard_elements_ranks']} do not "
                       "tile the gradient")
    N = len(nodes)
    if knobs["node_link_bytes_per_step"] != 2 * nbytes * (N - 1) / N \
            or (knobs["nodes"], knobs["shard_group_size"], knobs["stage"]) != \
            (N, len(nodes[0]), 2):
        bad.append(f"{run}: knobs {knobs}")
    return bad


def main() -> int:
    comm = make_communicator(sys.argv[1] if len(sys.argv) > 1 else "mpi")
    n = comm.size
    nodes = node_ranks(comm.topo)
    ref = reference(comm, 100_000)
    bad: list[str] = []
    for mb in BUCKET_MB:
        run = f"hsdp bucket_mb={mb}"
        wl = model(ref.start)
        hsdp = make_strategy("hsdp", comm, ref.grads, bucket_mb=mb, backward_order=ref.order,
                             workload=wl)
        knobs = hsdp.knobs()
        bad += check_knobs(run, knobs, nodes, n, ref.nbytes)
        bad += ref.steps(run, hsdp, wl, 3 * knobs["buckets"], PHASES)
        hsdp.close()
    return verdict(comm, bad, f"OK hsdp == flat + SGD on {len(nodes)} nodes x "
                              f"{len(nodes[0])} ranks, bucket_mb {BUCKET_MB}")


if __name__ == "__main__":
    sys.exit(main())
