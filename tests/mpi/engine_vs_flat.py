"""Run under mpirun/horovodrun: strategies on the transfer engine give flat native's mean.

For every transfer path the communicator offers (``ring`` needs
point-to-point messages: not Horovod on Gloo) and every gradient dtype
(float32, float16, bfloat16), ``async`` (s = 0 and s = 1) and ``bucketed``
(``progress="thread"``, three bucket caps) must give the gradients flat
native gives, bit for bit, and the exact mean. Element counts are ones no
rank count divides (1, 3, 91, 1009, 4099); rank ``r`` holds small integers
that differ by element and rank, so every sum is exact in each dtype (below
256, bfloat16's last exact integer) and only the final division rounds,
alike in every strategy. ``knobs`` must name the path, and after ``close``
no engine thread may be left. Exits 1 on a mismatch.

    COMMBENCH_RING_SEGMENT_BYTES=512 mpirun -np 3 python tests/mpi/engine_vs_flat.py mpi
"""

from __future__ import annotations

import sys
import threading

import torch
from verdict import verdict  # beside this script (scripts run as files)

from commbench.comm import make_communicator
from commbench.comm.engine import engine_paths
from commbench.strategies import make_strategy
from commbench.timing import StepTimer

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SHAPES = [(1,), (3,), (7, 13), (1009,), (4099,)]
RUNS = [("async", {"staleness": 0}), ("async", {"staleness": 1}),
        ("bucketed", {"bucket_mb": 0, "progress": "thread"}),
        ("bucketed", {"bucket_mb": 0.005, "progress": "thread"}),
        ("bucketed", {"bucket_mb": 1000, "progress": "thread"})]
STEPS = 3


def values(step: int, r: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Rank r's gradients at ``step``: integers 1..7, exact in every dtype, as are their
    sums over up to 8 ranks (<= 56)."""
    return [((torch.arange(torch.Size(s).numel()) * 3 + i + 5 * r + step) % 7 + 1)
            .to(dtype).view(s) for i, s in enumerate(SHAPES)]


def exact_mean(step: int, n: int, dtype: torch.dtype) -> list[torch.Tensor]:
    sums = [sum(v[i].double() for v in (values(step, r, dtype) for r in range(n)))
            for i in range(len(SHAPES))]
    return [torch.div(s.to(dtype), n) for s in sums]


def reduce_steps(comm, name: str, knobs: dict, dtype: torch.dtype) -> tuple[list, object]:
    """The gradients after each of STEPS steps (announced in backward order)."""
    grads = [torch.empty(s, dtype=dtype) for s in SHAPES]
    order = list(reversed(range(len(grads))))
    strat = make_strategy(name, comm, grads, algo="native", backward_order=order, **knobs)
    out = []
    for step in range(STEPS):
        for g, v in zip(grads, values(step, comm.rank, dtype)):
            g.copy_(v)
        timer = StepTimer()
        timer.begin_step(step, False)
        strat.begin_step(timer)
        for i in order:
            strat.on_ready(i)
            if strat.poll:
                strat.poll()
        strat.finish()
        timer.end_step()
        out.append([g.clone() for g in grads])
    if name == "async":
        strat.finish_run()
    knobs_out = strat.knobs()
    strat.close()
    return out, knobs_out


def main() -> int:
    comm = make_communicator(sys.argv[1] if len(sys.argv) > 1 else "mpi")
    n = comm.size
    paths = engine_paths(comm)
    bad: list[str] = []
    for dtype in DTYPES:
        flat, _ = reduce_steps(comm, "flat", {}, dtype)
        for step in range(STEPS):
            for i, (f, e) in enumerate(zip(flat[step], exact_mean(step, n, dtype))):
                if not torch.equal(f, e):
                    bad.append(f"flat native {dtype}: step {step} tensor {i} is not the "
                               "exact mean")
        for path in paths:
            for name, knobs in RUNS:
                label = f"{name} {knobs} transfer={path} {dtype}"
                got, k = reduce_steps(comm, name, {**knobs, "transfer": path}, dtype)
                if k["transfer_path"] != path:
                    bad.append(f"{label}: knobs say transfer_path {k['transfer_path']}")
                delay = knobs.get("staleness", 0)
                for step in range(delay, STEPS):
                    for i, (g, f) in enumerate(zip(got[step], flat[step - delay])):
                        if g.dtype != dtype or not torch.equal(g, f):
                            bad.append(f"{label}: step {step} tensor {i} differs from flat "
                                       f"native's step {step - delay} by "
                                       f"{float((g.double() - f.double()).abs().max()):.3g}")
    left = [t.name for t in threading.enumerate() if t.name.startswith("commbench-transfer")]
    if left:
        bad.append(f"engine threads left after close: {left}")
    return verdict(comm, bad, f"OK engine == flat native on {n} ranks, paths {paths}")


if __name__ == "__main__":
    sys.exit(main())
