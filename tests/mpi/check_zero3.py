"""Run under mpirun/torchrun/horovodrun: zero3 steps the parameters as flat + SGD.

A small real model (``units_net``, below) is trained a few steps by the real workload
(forward, backward, announcing hooks: ``commbench.steploop.run_steps``), each rank on its
own batch, once under flat (the reference: the mean gradient, then ``torch.optim.SGD``
with momentum) and once under zero3 in each of its settings (prefetch on and off, the
reduce-scatters on a shared or a separate engine). Its units: four blocks, one of them of
a single element (fewer than the ranks: empty shards), and a weight tied across two
blocks (one ``Parameter``: the root unit's). After the steps every zero3 run must hold
flat's parameters within float tolerance, every unit freed at rest between steps; each
step must have run two all-gathers and one reduce-scatter per unit, each kind's time
apart; the ranks together must hand over 3(n−1) times the parameters' bytes; and the
validation pass must give the closed-form mean (``count_wrong``: 0). Exits 1 on a
mismatch.

    mpirun -np 3 python tests/mpi/check_zero3.py mpi
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from verdict import verdict  # beside this script (scripts run as files)

from commbench.comm import make_communicator
from commbench.models.units import ROOT
from commbench.steploop import run_steps
from commbench.strategies import make_strategy
from commbench.timing import StepTimer
from commbench.validate import count_wrong
from commbench.workloads import RealWorkload

MODEL = "check_zero3:units_net"  # this file, on sys.path as a script's folder is
STEPS = 3
SETTINGS = [{"prefetch": p, "reduce_scatter_group": g}
            for p in ("on", "off") for g in ("shared", "separate")]
RTOL, ATOL = 1e-5, 1e-6  # float32, a few ranks, three steps


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.norm(self.lin(x)))


class Gain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


class Tiny(nn.Module):
    """A unit of one element."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = Gain()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gain(x)


class UnitsNet(nn.Module):
    def __init__(self, width: int = 8, classes: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.blocks = nn.ModuleList([Block(width), Tiny(), Block(width), Block(width)])
        self.blocks[3].lin.weight = self.blocks[0].lin.weight  # tied across units: the root's
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def units_net(num_classes: int = 4) -> UnitsNet:
    return UnitsNet(classes=num_classes)


def workload(rank: int) -> RealWorkload:
    return RealWorkload(MODEL, rank, seed=3, batch_size=4, num_classes=4, lr=0.1,
                        momentum=0.9, input_shape=(8,))


def main() -> int:
    comm = make_communicator(sys.argv[1] if len(sys.argv) > 1 else "mpi")
    algo = sys.argv[2] if len(sys.argv) > 2 else "native"  # --algo
    n, r = comm.size, comm.rank
    bad: list[str] = []
    ref = workload(r)
    with make_strategy("flat", comm, ref.grads, algo="native") as flat:
        run_steps(comm, ref, flat, StepTimer(), STEPS, 0)
    want = [p.detach().clone() for p in ref.params]
    nbytes = sum(p.numel() * 4 for p in ref.params)
    for fields in SETTINGS:
        run = "zero3 " + " ".join(f"{k}={v}" for k, v in fields.items())
        wl = workload(r)
        zero = make_strategy("zero3", comm, wl.grads, backward_order=wl.backward_order,
                             workload=wl, algo=algo, **fields)
        units = zero.units
        paths = [u.path for u in units]
        if paths != [ROOT, "blocks.0", "blocks.1", "blocks.2", "blocks.3"]:
            bad.append(f"{run}: units {paths}")
        home = {wl.param_names[i]: u.path for u in units for i in u.indices}
        if home["blocks.0.lin.weight"] != ROOT:
            bad.append(f"{run}: the tied weight is unit {home['blocks.0.lin.weight']!r}'s")
        samples = run_steps(comm, wl, zero, StepTimer(), STEPS, 0)
        held = [u.path for u in units if u.storage().nbytes() != 0]
        if held:
            bad.append(f"{run}: units {held} still whole between steps")
        held = [u.path for u in units if u.grad_storage().nbytes() != 0]
        if held:
            bad.append(f"{run}: units {held} keep their gradient buffers between steps")
        for s in samples:
            if s.comm_calls != 3 * len(units) or len(s.collective_s) != 3 * len(units):
                bad.append(f"{run} step {s.step}: {s.comm_calls} collectives, expected "
                           f"{3 * len(units)} (two gathers and a reduce-scatter a unit)")
            if set(s.comm_phases) != {"allgather", "reduce_scatter"}:
                bad.append(f"{run} step {s.step}: comm phases {s.comm_phases}")
            if s.comm_bytes != sum(3 * (u.nbytes // 2) for u in units):
                bad.append(f"{run} step {s.step}: {s.comm_bytes} comm bytes, not 1.5x "
                           f"{nbytes}")
        knobs = zero.knobs()
        if knobs["algo"] != algo:
            bad.append(f"{run}: ran --algo {knobs['algo']}, not {algo}")
        if sum(knobs["library_bytes_per_step_ranks"]) != 3 * (n - 1) * nbytes:
            bad.append(f"{run}: ranks hand over {knobs['library_bytes_per_step_ranks']}, "
                       f"not 3(n-1) x {nbytes} in all")
        peak = zero.record_fields("step")["model_state_bytes_peak"]
        if not 0 < peak <= 4 * nbytes:
            bad.append(f"{run}: model state peak {peak} bytes for {nbytes} of parameters")
        zero.finish_run()
        for i, (p, w) in enumerate(zip(wl.params, want)):
            if not torch.allclose(p.detach(), w, rtol=RTOL, atol=ATOL):
                bad.append(f"{run}: parameter {wl.param_names[i]} differs from flat + SGD by "
                           f"{float((p.detach() - w).abs().max()):.3g}")
        stepped = [p.detach().clone() for p in wl.params]
        wrong, checked = count_wrong(zero, wl.backward_order)
        if wrong or checked != nbytes // 4:
            bad.append(f"{run}: validation {wrong} wrong of {checked}")
        if any(not torch.equal(p.detach(), s) for p, s in zip(wl.params, stepped)):
            bad.append(f"{run}: the validation pass moved the parameters")
        zero.close()
    return verdict(comm, bad, f"OK zero3 == flat + SGD on {n} ranks, "
                              f"{len(SETTINGS)} settings, algo {algo}")


if __name__ == "__main__":
    sys.exit(main())
