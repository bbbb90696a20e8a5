"""Run under mpirun/horovodrun: the gradient async applies at step t is exactly step t-s's mean.

Every step rank ``r`` fills gradient ``i`` with ``16 t + 4 r + (i % 3) + 1``
(small integers: exact in float32 and float16, their sum over ranks exact), so
the mean over ranks of step t's gradients is known exactly. For s = 0, 1, 2, 3
(float32, and s = 2 with fp16 compression), with and without ``staleness_lr``
and with a synchronous warm-up, the gradients after ``finish`` at step t must
equal step (t - s)'s mean (times 1/s with ``staleness_lr``), bit for bit, and
be zero where nothing is due; s = 0 must equal flat's result bit for bit, and
the step log must name the step applied. Exits 1 on a mismatch.

    mpirun -np 3 python tests/mpi/async_delay.py mpi
"""

from __future__ import annotations

import sys

import torch
from verdict import verdict  # beside this script (scripts run as files)

from commbench.comm import make_communicator
from commbench.strategies import make_strategy
from commbench.timing import StepTimer

SHAPES = [(1,), (3, 5), (1009,), (64, 9)]
STEPS = 9


def fill(grads: list[torch.Tensor], t: int, r: int) -> None:
    for i, g in enumerate(grads):
        g.fill_(16 * t + 4 * r + (i % 3) + 1)


def mean_of_step(t: int, n: int, shapes: list[tuple[int, ...]], scale: float,
                 wire: torch.dtype) -> list:
    """Step t's mean over n ranks, computed as the strategy does: the exact sum in the
    wire dtype, one division into the float32 gradient."""
    out = []
    for i, s in enumerate(shapes):
        total = torch.full(s, float(sum(16 * t + 4 * r + (i % 3) + 1 for r in range(n))),
                           dtype=wire)
        div = n if scale == 1.0 else n / scale
        out.append(torch.div(total, div, out=torch.empty(s)))
    return out


def due(t: int, s: int, warmup: int) -> int | None:
    """The step whose gradient is applied at step t (None: nothing due)."""
    eff = 0 if t < warmup else s
    src = t - eff
    if t >= warmup and src < warmup:  # the gap the switch from s = 0 opens
        return None
    return src if src >= 0 else None


def check(comm, s: int, lr: bool, warmup: int, compression: str, transfer: str,
          flat_results, bad) -> None:
    n, r = comm.size, comm.rank
    grads = [torch.empty(shape) for shape in SHAPES]
    strat = make_strategy("async", comm, grads, staleness=s, staleness_lr=lr,
                          staleness_warmup=warmup, compression=compression, transfer=transfer)
    tag = f"s={s} lr={lr} warmup={warmup} {compression} transfer={transfer}"
    for t in range(STEPS):
        fill(grads, t, r)
        timer = StepTimer()
        timer.begin_step(t, False)
        strat.begin_step(timer)
        for i in reversed(range(len(grads))):
            strat.on_ready(i)
            if strat.poll:
                strat.poll()
        strat.finish()
        timer.end_step()
        src = due(t, s, warmup)
        log = strat.step_log[-1]
        if log["applied_step"] != src:
            bad.append(f"{tag} step {t}: log says step {log['applied_step']} applied, "
                       f"expected {src}")
        if src is None:
            if any(bool(g.any()) for g in grads):
                bad.append(f"{tag} step {t}: nothing is due, yet the gradients are not zero")
            continue
        eff = t - src
        scale = 1.0 / eff if lr and eff > 0 else 1.0
        want = mean_of_step(src, n, SHAPES, scale, strat.wire)
        for i, (g, w) in enumerate(zip(grads, want)):
            if not torch.equal(g, w):
                bad.append(f"{tag} step {t}: tensor {i} is not step {src}'s mean "
                           f"(got {float(g.view(-1)[0])}, want {float(w.view(-1)[0])})")
        if s == 0 and not lr and compression == "none":
            for i, (g, f) in enumerate(zip(grads, flat_results[t])):
                if not torch.equal(g, f):
                    bad.append(f"{tag} step {t}: tensor {i} differs from flat")
    strat.finish_run()
    log = strat.step_log
    if len(log) != STEPS or strat.knobs()["buffers"] > s + 1:
        bad.append(f"{tag}: {len(log)} log entries, {strat.knobs()['buffers']} buffers")
    strat.close()


def main() -> int:
    comm = make_communicator(sys.argv[1] if len(sys.argv) > 1 else "mpi")
    bad: list[str] = []
    grads = [torch.empty(shape) for shape in SHAPES]
    flat = make_strategy("flat", comm, grads, algo="native")
    flat_results = []
    for t in range(STEPS):
        fill(grads, t, comm.rank)
        flat.begin_step(StepTimer())
        flat.finish()
        flat_results.append([g.clone() for g in grads])
    cases = [(0, False, 0, "none"), (1, False, 0, "none"), (2, False, 0, "none"),
             (3, False, 0, "none"), (3, True, 0, "none"), (2, False, 3, "none"),
             (2, True, 2, "none"), (2, False, 0, "fp16")]
    for s, lr, warmup, compression in cases:
        check(comm, s, lr, warmup, compression, "thread", flat_results, bad)
    if comm.supports_p2p:  # the ring path: the delay does not depend on what transfers
        for s, lr, warmup, compression in [(0, False, 0, "none"), (2, True, 2, "none"),
                                           (2, False, 0, "fp16")]:
            check(comm, s, lr, warmup, compression, "ring", flat_results, bad)
    return verdict(comm, bad, f"OK async applies step t-s's mean on {comm.size} ranks")


if __name__ == "__main__":
    sys.exit(main())
