"""How much the step timer costs: the same loop with timing on and off, in one run.

Run under a launcher, e.g.::

    mpirun -np 4 --oversubscribe python benchmarks/instrumentation_overhead.py --model resnet18
    horovodrun -np 4 -H localhost:4 python benchmarks/instrumentation_overhead.py

Blocks of steps alternate between ``StepTimer`` and ``NullTimer`` (same
workload, same strategy, same barrier per step) so drift on a shared machine
hits both alike. Each block's wall time per step is measured from outside the
loop, rank 0 prints the median of each and their ratio (goal <= 1.02).
"""

from __future__ import annotations

import argparse
import statistics
import sys

from commbench.comm import detect_backend, make_communicator
from commbench.steploop import run_steps
from commbench.strategies import make_strategy
from commbench.timing import NullTimer, StepTimer, now
from commbench.workloads import SyntheticWorkload


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--compute-ms", type=float, default=100.0)
    p.add_argument("--algo", default="native")
    p.add_argument("--blocks", type=int, default=10, help="blocks per mode")
    p.add_argument("--steps-per-block", type=int, default=5)
    args = p.parse_args()
    comm = make_communicator(detect_backend())
    wl = SyntheticWorkload(args.model, args.compute_ms, comm.rank)
    strategy = make_strategy("flat", comm, wl.grads, algo=args.algo)
    run_steps(comm, wl, strategy, NullTimer(), steps=3, warmup=0)  # warm caches and buffers
    per_step = {"on": [], "off": []}
    for b in range(2 * args.blocks):
        mode = "on" if b % 2 == 0 else "off"
        if b // 2 % 2 == 1:  # alternate which mode goes first in each pair
            mode = "off" if mode == "on" else "on"
        timer = StepTimer() if mode == "on" else NullTimer()
        comm.barrier()
        t0 = now()
        run_steps(comm, wl, strategy, timer, steps=args.steps_per_block, warmup=0)
        per_step[mode].append((now() - t0) / args.steps_per_block)
    # the slowest rank defines a block's time
    blocks = comm.allgather_object(per_step)
    on = [max(r["on"][i] for r in blocks) for i in range(args.blocks)]
    off = [max(r["off"][i] for r in blocks) for i in range(args.blocks)]
    if comm.rank == 0:
        m_on, m_off = statistics.median(on), statistics.median(off)
        print(f"# instrumentation overhead  backend {comm.name}  ranks {comm.size}  model "
              f"{args.model}  compute {args.compute_ms:g} ms  algo {args.algo}  "
              f"{args.blocks} blocks x {args.steps_per_block} steps per mode")
        print(f"step time, timing on : median {m_on * 1e3:8.2f} ms")
        print(f"step time, timing off: median {m_off * 1e3:8.2f} ms")
        print(f"ratio on/off: {m_on / m_off:.4f}")
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
