"""Run under torchrun: does PyTorch's FSDP2 (``fully_shard``) train on a CPU mesh over Gloo?

The smallest case of what ``--strategy fsdp`` (``commbench.strategies.fsdp``) needs, in
plain torch: a model of two blocks and a head, ``fully_shard`` on each block, then on the
root, over a one-dimensional CPU ``DeviceMesh`` of the Gloo group; the parameters start
alike on every rank; each rank trains on its own batch. Three steps of forward, backward
and SGD (momentum), with

- ``set_force_sum_reduction_for_comms(True)`` on every wrapped module (the setting is
  each module's own): the reduce-scatter is then a SUM, divided after. Without it FSDP2
  asks for ``ReduceOp.AVG`` in float32, which Gloo runs under torch 2.13, and for
  ``ReduceOp.PREMUL_SUM`` under a divide factor other than the ranks
  (``set_gradient_divide_factor``), which Gloo refuses: "RuntimeError: Cannot use
  ReduceOp.PREMUL_SUM with Gloo" (torch 2.13.0+cpu);
- explicit forward prefetch: each unit's forward pre-hook (after FSDP's own) starts the
  next unit's all-gather with ``unshard(async_op=True)``, since on the CPU FSDP2's
  implicit prefetch is a blocking all-gather (CPU streams are no-ops).

The reference is the same model, unsharded, stepped by the same SGD on the mean of every
rank's loss (each rank computes every rank's batch). After each step the full parameters
(``DTensor.full_tensor()``) must match it to float tolerance. Prints the torch version and
one OK line on rank 0; exits 1 on a mismatch (an exception's text is the finding where
FSDP2 cannot run here).

    torchrun --nproc-per-node 2 tests/mpi/check_fsdp_smoke.py
"""

from __future__ import annotations

import copy
import gc
import sys
from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

STEPS = 3
SGD = {"lr": 0.1, "momentum": 0.9}
RTOL, ATOL = 1e-5, 1e-6


def model() -> nn.Module:
    torch.manual_seed(0)
    blocks = nn.Sequential(*[nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
                             for _ in range(2)])
    return nn.Sequential(nn.Linear(5, 8), blocks, nn.Linear(8, 3))  # stem, units, head


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 5, generator=gen), torch.randn(4, 3, generator=gen)


def prefetch(after, *_) -> None:
    """A forward pre-hook: start ``after``'s all-gather (a hook's return would replace the
    module's input)."""
    after.unshard(async_op=True)


def main() -> int:
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    ref = model()
    net = copy.deepcopy(ref)
    units = list(net[1])
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(net, mesh=mesh)
    for m in (net, *units):
        m.set_force_sum_reduction_for_comms(True)
    order = [net, *units]
    for here, after in zip(order, order[1:]):
        here.register_forward_pre_hook(partial(prefetch, after))
    opt = torch.optim.SGD(net.parameters(), **SGD)
    ref_opt = torch.optim.SGD(ref.parameters(), **SGD)
    bad = []
    for step in range(STEPS):
        x, y = batch(rank, step)
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        ref_opt.zero_grad()
        loss = sum(nn.functional.mse_loss(ref(xr), yr)
                   for xr, yr in (batch(r, step) for r in range(n))) / n
        loss.backward()
        ref_opt.step()
        for (name, p), q in zip(net.named_parameters(), ref.parameters()):
            full = p.full_tensor()  # a collective: every rank, in one order
            if not torch.allclose(full, q.detach(), rtol=RTOL, atol=ATOL):
                bad.append(f"step {step} {name}: differs by "
                           f"{float((full - q.detach()).abs().max()):.3g}")
    every = [None] * n
    dist.all_gather_object(every, bad)
    # FSDP2's Works sit in reference cycles: freed after the group was destroyed, one aborts
    # the process at exit ("terminate called without an active exception", seen once
    # here), as comm.torchdist's close says; free them while the group lives
    del net, opt, units, order
    gc.collect()
    dist.destroy_process_group()
    errors = [f"rank {r}: {m}" for r, b in enumerate(every) for m in b]
    if rank == 0:
        print("\n".join(errors) if errors else
              f"OK fsdp2 smoke: fully_shard on a CPU mesh over Gloo, {n} ranks, {STEPS} "
              f"steps == unsharded SGD (torch {torch.__version__})")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
