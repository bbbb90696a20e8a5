"""Run under mpirun/horovodrun: every strategy, compressed or not, gives flat native's mean.

Gradients have a few of ResNet-18's shapes plus odd small ones. Rank ``r``
holds ``a + r * b`` (``a``, ``b`` random, drawn alike on every rank), so the
exact mean ``a + b (n-1)/2`` is known in float64. Uncompressed, each
strategy must match flat native within float32 tolerance; with fp16 or bf16
compression, within the dtype's rounding: per element
``2 n eps * mean_r |a + r b|`` (each of the ``n - 1`` additions and each cast
rounds by at most ``eps/2`` of the partial sum's magnitude). Then
accumulation: ``run_steps`` with ``accum_steps`` k on the synthetic workload
must reduce ``k *`` each rank's per-micro-batch gradient. Exits 1 on any
mismatch.

    mpirun -np 3 python tests/mpi/compressed_vs_native.py mpi
"""

from __future__ import annotations

import sys

import torch
from verdict import verdict  # beside this script (scripts run as files)

from commbench.comm import make_communicator
from commbench.models import parameter_shapes
from commbench.steploop import run_steps
from commbench.strategies import make_strategy
from commbench.strategies.settings import COMPRESSIONS
from commbench.timing import StepTimer
from commbench.workloads.synthetic import SyntheticWorkload

SHAPES = [(1,), (3,), (7, 13), (1009,)] + [
    tuple(s) for _, s in parameter_shapes("resnet18", 1000)[:12]]


def runs(backend: str) -> list[tuple[str, str, dict]]:
    out = [("flat", "native", {}), ("hierarchical", "hier", {}),
           ("hierarchical", "hier-leader", {}), ("bucketed", "native", {"bucket_mb": 0}),
           ("bucketed", "native", {"bucket_mb": 0.05}),
           ("bucketed", "native", {"bucket_mb": 1000})]
    if backend == "mpi":
        out.insert(1, ("flat", "ring", {}))
    return out


def main() -> int:
    backend = sys.argv[1] if len(sys.argv) > 1 else "mpi"
    comm = make_communicator(backend)
    n, r = comm.size, comm.rank
    gen = torch.Generator().manual_seed(11)
    a = [torch.randn(s, generator=gen) for s in SHAPES]
    b = [torch.randn(s, generator=gen) for s in SHAPES]
    mine = [x + r * y for x, y in zip(a, b)]
    exact = [x.double() + y.double() * (n - 1) / 2 for x, y in zip(a, b)]
    scale = [sum((x.double() + k * y.double()).abs() for k in range(n)) / n
             for x, y in zip(a, b)]
    order = list(reversed(range(len(SHAPES))))
    grads = [torch.empty(s) for s in SHAPES]
    bad: list[str] = []

    def reduce(name: str, algo: str, compression: str, knobs: dict) -> list[torch.Tensor]:
        for g, v in zip(grads, mine):
            g.copy_(v)
        s = make_strategy(name, comm, grads, algo=algo, backward_order=order,
                          compression=compression, **knobs)
        s.validation_pass(order)
        s.close()
        return [g.clone() for g in grads]

    want = reduce("flat", "native", "none", {})
    for i, (w, e) in enumerate(zip(want, exact)):
        if not torch.allclose(w.double(), e, rtol=1e-5, atol=1e-5):
            bad.append(f"flat native: tensor {i} off the exact mean")
    for compression, cast in COMPRESSIONS.items():
        for name, algo, knobs in runs(backend):
            got = reduce(name, algo, compression, knobs)
            eps = torch.finfo(cast).eps if cast is not None else 1e-6
            label = f"{name} {algo} {knobs} compression={compression}"
            for i, (g, w, sc) in enumerate(zip(got, want, scale)):
                err = (g.double() - w.double()).abs()
                limit = 2 * n * eps * sc + 1e-5
                if bool((err > limit).any()):
                    bad.append(f"{label}: tensor {i} differs from flat native by "
                               f"{float(err.max()):.3g} (limit {float(limit.max()):.3g})")
            if g.dtype != torch.float32:
                bad.append(f"{label}: gradients came back as {g.dtype}")

    # Accumulation: k micro-batches, one sync of their sum.
    wl = SyntheticWorkload("resnet18", 0.0, r, seed=3)
    per_rank = comm.allgather_object(list(wl.grad_values))
    for k in (1, 3):
        strat = make_strategy("flat", comm, wl.grads, algo="native")
        timer = StepTimer()
        samples = run_steps(comm, wl, strat, timer, steps=1, warmup=0, accum_steps=k)
        if samples[0].comm_calls != 1:
            bad.append(f"accum_steps={k}: {samples[0].comm_calls} all-reduces in a step, not 1")
        for i, g in enumerate(wl.grads):
            mean = k * sum(v[i] for v in per_rank) / n
            if not torch.allclose(g, torch.full_like(g, mean), rtol=1e-5):
                bad.append(f"accum_steps={k}: tensor {i} is {float(g.view(-1)[0])}, "
                           f"expected {mean}")
                break
    return verdict(comm, bad, f"OK compressed and accumulated == flat native on {n} ranks")


if __name__ == "__main__":
    sys.exit(main())
