"""Run under mpirun/torchrun/horovodrun: zero1 and zero2 step the parameters as flat + SGD.

Parameters have ResNet-18's shapes (those under 600k elements, to keep the job short on
oversubscribed cores) plus a few odd small ones: one element and three, fewer than the
ranks, so that per-tensor buckets leave some ranks an empty shard. They start from the
same random values on every rank. At each step rank ``r``'s gradient is ``a + r * b``
(``a`` and ``b`` random, drawn alike on every rank). The reference is flat's mean, then
``torch.optim.SGD`` (momentum, weight decay) on a copy of the parameters. Each ZeRO
strategy, at several bucket caps (0 = one bucket per tensor, a tiny one, 1 MB, one
bucket for all), takes the same steps from the same start on its own copy, announcing
the gradients in backward order, then in an order shuffled differently on every rank
(the collectives must still be issued in one order), then with some never announced
(``finish`` takes them as they are). After every step its parameters must match the
reference within float tolerance, on every rank; the timer must have seen one
reduce-scatter and one all-gather per bucket, each kind's time apart; the validation
pass must give the closed-form mean (``count_wrong``: 0) and leave the parameters alone;
and the bytes each rank hands over must sum to 2(n-1) times the gradient's. Exits 1 on
a mismatch.

The second argument is ``--algo`` (default ``native``; ``hier`` wants nodes of equal size).

    mpirun -np 3 python tests/mpi/zero_vs_flat.py mpi
"""

from __future__ import annotations

import sys

from sgd_reference import model, reference  # beside this script (scripts run as files)
from verdict import verdict

from commbench.comm import make_communicator
from commbench.strategies import make_strategy

BUCKET_MB = [0, 0.01, 1, 1000]


def main() -> int:
    comm = make_communicator(sys.argv[1] if len(sys.argv) > 1 else "mpi")
    algo = sys.argv[2] if len(sys.argv) > 2 else "native"
    n = comm.size
    ref = reference(comm, 600_000)
    nbytes = ref.nbytes
    bad: list[str] = []
    for name in ("zero1", "zero2"):
        for mb in BUCKET_MB:
            run = f"{name} bucket_mb={mb}"
            wl = model(ref.start)
            zero = make_strategy(name, comm, ref.grads, bucket_mb=mb, backward_order=ref.order,
                                 workload=wl, algo=algo)
            knobs = zero.knobs()
            buckets = knobs["buckets"]
            if knobs["algo"] != algo:
                bad.append(f"{run}: ran --algo {knobs['algo']}, not {algo}")
            if sum(knobs["bucket_bytes"]) != nbytes:
                bad.append(f"{run}: buckets hold {sum(knobs['bucket_bytes'])} bytes, "
                           f"gradients {nbytes}")
            if sum(knobs["library_bytes_per_step_ranks"]) != 2 * (n - 1) * nbytes:
                bad.append(f"{run}: ranks hand over {knobs['library_bytes_per_step_ranks']} "
                           f"bytes, not 2(n-1) x {nbytes} in all")
            if sum(knobs["shard_elements_ranks"]) != nbytes // 4:
                bad.append(f"{run}: shards {knobs['shard_elements_ranks']} do not tile the "
                           "gradient")
            bad += ref.steps(run, zero, wl, 2 * buckets, {"reduce_scatter", "allgather"})
            # zero1 holds the whole gradient; zero2 buffers of the largest bucket's size, at
            # least two, where two of them hold less than the whole gradient (else as zero1)
            held, largest = zero.knobs()["grad_buffer_bytes"], max(knobs["bucket_bytes"])
            pooled = name == "zero2" and 2 * largest < nbytes
            if (held % largest or held < 2 * largest) if pooled else held != nbytes:
                bad.append(f"{run}: holds {held} bytes of gradient buffers")
            zero.close()
    return verdict(comm, bad, f"OK zero1, zero2 == flat + SGD on {n} ranks, "
                              f"bucket_mb {BUCKET_MB}, algo {algo}")


if __name__ == "__main__":
    sys.exit(main())
