"""The FSDP2 peer: PyTorch's own fully sharded data parallel (``fully_shard``) in the harness.

``--strategy fsdp`` wraps the workload's model as PyTorch FSDP users do (torch
``torch.distributed.fsdp.fully_shard``, "FSDP2"; Zhao et al., "PyTorch FSDP", VLDB 2023,
https://arxiv.org/abs/2304.11277): ``fully_shard`` on each unit (a top-level block,
``commbench.models.units``), then on the root, over a one-dimensional ``DeviceMesh`` of the
torch backend's process group. Parameters are then sharded at rest (each rank holds a
``DTensor`` shard of every parameter, dim 0 padded to a multiple of the ranks); FSDP2
all-gathers a unit's parameters in its forward pre-hook, reshards them after its forward
(not the root's), all-gathers them again in backward, and reduce-scatters the unit's
gradients in its post-backward. The workload's optimizer is rebuilt, with the same
settings, on the sharded parameters (FSDP2 steps the shards: the optimizer state is a
shard too). It is the peer of the project's ZeRO-3 (issue 49): the same replayed compute,
the same step timer.

Which units: on the replayed model (``--workload synthetic``) the units whose forward the
compute profile times (``forward_units``; ``ReplayNet`` calls each unit's module at its
time, which then applies its own parameters' part of the chain). Without forward units
(``--compute-ms``, a profile recorded before units) and where the profile's backward
order does not keep each unit's parameters together (``forward_plan``: the root then
applies the whole chain), no unit's module uses its parameters in its own forward, so
only the root is sharded: one unit, gathered whole before forward, reduce-scattered at
the end of backward; ``knobs.units`` says which. On the real model (``--workload real``)
the model's units (``unit_names``).

On the CPU over Gloo (torch 2.13; FSDP1 refuses CPU tensors, so it is no fallback):

- ``set_force_sum_reduction_for_comms(True)`` on every wrapped module (each module's own
  setting): the reduce-scatter is a SUM, divided by the ranks after, as flat's mean is.
  Without it FSDP2 asks for ``ReduceOp.AVG`` in float32 (which Gloo runs under torch
  2.13) and for ``ReduceOp.PREMUL_SUM`` under a divide factor other than the ranks, which
  Gloo refuses ("Cannot use ReduceOp.PREMUL_SUM with Gloo").
- Streams are no-ops on the CPU, so FSDP2's implicit prefetch is a blocking all-gather
  at the previous unit's hook. The peer prefetches explicitly in forward: each unit's
  forward pre-hook (and the root's), after FSDP2's own, starts the next unit's all-gather
  with ``unshard(async_op=True)`` (FSDP2 waits for it in that unit's pre-forward), so it
  runs on Gloo's thread during the unit's compute. In backward FSDP2's own prefetch runs,
  blocking.
- A unit's wait for its parameters is sync, not compute: FSDP2's forward pre-hook (where
  it waits for the unit's gather) sits between two hooks of the peer's that make it the
  workload's ``stall``.
- The reduce-scatter stays blocking: FSDP2 issues it synchronously (on a CUDA stream it
  would run beside compute; on the CPU it holds the host until it is done). The replay's
  device computes on meanwhile (``commbench.workloads.synthetic``: a gradient is due at
  its time whatever the host does), as a GPU's would beside a reduce-scatter on its own
  stream; what the host runs past the device shows as exposed sync.
- So in backward the host falls behind the replay's device, and a unit's parameters
  arrive (FSDP2's blocking gather, its prefetch one unit ahead) later on the device's
  schedule than when the host asked for them. Each blocking gather therefore *holds*
  its unit's gradients (``Workload.blocked``): their computation begins no earlier than the
  gather's end, as on a device that waits for the parameters it computes with. (A stall
  there instead, the gather's time added to the schedule, let the device compute a unit
  before its parameters were in whenever the host was behind: the peer's step came out
  8 % under the same schedule's, ``analysis.sharded.fsdp_step`` says how.)

Records. Each collective FSDP2 runs goes through the peer's own ``AllGather`` and
``ReduceScatter`` (FSDP2's ``set_custom_all_gather`` / ``set_custom_reduce_scatter``,
which call the same ``dist.all_gather_single`` / ``dist.reduce_scatter_single`` as its
defaults) and is timed from its issue to its end (for an asynchronous all-gather: when
Gloo completes its future) as one collective: wait vs transfer, comm time, and
``comm_phases_s`` (``allgather``, ``reduce_scatter``) as for ZeRO. ``comm_bytes`` counts
each unit's gradient bytes once, at its reduce-scatter (ZeRO's rule: busbw reads as an
all-reduce's). ``knobs.library_bytes_per_step`` is what this rank handed across ranks in
its last step (the others' parts it sent in reduce-scatters and received in all-gathers,
padding included): about 3Ψ(n−1)/n with every unit resharded after forward (ZeRO §7);
``knobs.gathers_prefetched_per_step`` how many of its all-gathers ran asynchronously
(the forward prefetches: one a unit).

On ``--workload real`` the model computes on the host's thread, so each blocking
collective (FSDP2's reduce-scatters and backward gathers, inside ``loss.backward()``) is
the real workload's ``stall`` (``Workload.blocked``): sync, taken out of backward compute,
and so in exposed sync. (Until 2026-12-07 the reduce-scatters counted as backward
compute there.)

Not built: ``--compression`` (FSDP2's ``MixedPrecisionPolicy(reduce_dtype=...)`` would
be the way), a model on a GPU, HSDP (a 2-D mesh) and a separate reduce-scatter group
(FSDP2's ``set_separate_reduce_scatter_group``).
``--accum-steps`` is honoured: the micro-batches but the last run with
``set_requires_gradient_sync(False)``, as FSDP2's users accumulate.

Example::

    torchrun --nproc-per-node 4 -m commbench.allreduce --strategy flat,fsdp \\
        --model resnet50 --compute-profile profiles/cpu-resnet50.json
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard

# the interfaces FSDP2's public set_custom_all_gather / set_custom_reduce_scatter take
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from commbench import dilation
from commbench.comm.base import Communicator
from commbench.models.units import ROOT, unit_names, unit_of
from commbench.strategies.base import Strategy, stall_of
from commbench.strategies.settings import CommonSettings
from commbench.timing import NullTimer, StepTimer, now


@dataclass(frozen=True)
class FSDPSettings(CommonSettings):
    """``fsdp``'s settings: the common ones; ``--accum-steps`` honoured
    (``set_requires_gradient_sync``), ``--compression`` refused (exit 2, naming the pair)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.compression != "none":
            raise ValueError(f"--strategy fsdp with --compression {self.compression}: not "
                             "built (FSDP2 would reduce in that dtype through "
                             "MixedPrecisionPolicy(reduce_dtype=...)); run it without "
                             "--compression, or compress with --strategy flat or bucketed")


class _Flight:
    """One collective FSDP2 ran: its kind, when it was issued and ended, the gradient bytes
    it counts in ``comm_bytes``, and the future whose callback stamps an asynchronous
    one's end."""

    __slots__ = ("phase", "start", "end", "nbytes", "done")

    def __init__(self, phase: str, start: float, nbytes: int) -> None:
        self.phase, self.start, self.nbytes = phase, start, nbytes
        self.end: float | None = None
        self.done: torch.futures.Future | None = None


class _TimedAllGather(AllGather):
    """FSDP2's default all-gather (``dist.all_gather_single``) of one wrapped module's
    parameters, timed; ``indices``: the workload's gradients of those parameters."""

    def __init__(self, peer: FSDPStrategy, indices: list[int]) -> None:
        self.peer, self.indices = peer, indices

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, async_op: bool = False):
        start = now()
        # blocking: FSDP2's own prefetch in backward, whose unit computes after it
        with contextlib.nullcontext() if async_op else self.peer.workload.blocked(
                self.indices):
            work = dist.all_gather_single(output_tensor, input_tensor, group=group,
                                          async_op=async_op)
        received = (output_tensor.numel() - input_tensor.numel()) * output_tensor.element_size()
        self.peer._flown(_Flight("allgather", start, 0), work, received)
        return work


class _TimedReduceScatter(ReduceScatter):
    """FSDP2's default reduce-scatter (``dist.reduce_scatter_single``), timed; ``nbytes``:
    its unit's gradient bytes (unpadded), counted in ``comm_bytes``."""

    def __init__(self, peer: FSDPStrategy, nbytes: int) -> None:
        self.peer, self.nbytes = peer, nbytes

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op: Any, async_op: bool = False):
        start = now()
        with contextlib.nullcontext() if async_op else self.peer.workload.blocked():
            work = dist.reduce_scatter_single(output=output_tensor, input=input_tensor,
                                              group=group, op=op, async_op=async_op)
        sent = (input_tensor.numel() - output_tensor.numel()) * input_tensor.element_size()
        self.peer._flown(_Flight("reduce_scatter", start, self.nbytes), work, sent)
        return work


class _ModuleParams(Sequence):
    """The replayed model's parameters as its modules hold them now, by index.

    ``ReplayNet`` (and each unit's module) applies the chain to the parameter objects it
    made; ``fully_shard`` replaces each module's parameters with its own (a sharded
    ``DTensor`` at rest, the unsharded parameter while a unit computes), so the replay
    must look them up on their modules at each call, as a real model's layers do."""

    def __init__(self, net: torch.nn.Module, params: Sequence[torch.Tensor]) -> None:
        where = {id(p): name for name, p in net.named_parameters()}
        self._homes = []
        for p in params:
            path, _, leaf = where[id(p)].rpartition(".")
            self._homes.append((net.get_submodule(path), leaf))

    def __len__(self) -> int:
        return len(self._homes)

    def __getitem__(self, i):
        module, leaf = self._homes[i]
        return getattr(module, leaf)


def _units(workload: Any) -> list[str]:
    """The module paths ``fully_shard`` wraps before the root (module docstring)."""
    net = workload.net
    if workload.real:
        return unit_names(net)
    names = [u.name for u in workload.forward_units[1:]]
    # a unit's module carries its parameters' part of the chain only where the plan was cut
    if not any(net.get_submodule(n).chain for n in names):
        return []
    return names


def _prefetch(after: FSDPModule, *_: Any) -> None:
    """A forward pre-hook: start ``after``'s all-gather (returns None: the input stays)."""
    after.unshard(async_op=True)


class FSDPStrategy(Strategy):
    name = "fsdp"
    needs_model = True
    settings_class = FSDPSettings
    settings: FSDPSettings

    @classmethod
    def check(cls, comm: Communicator, algo: str) -> None:
        if comm.process_group is None:
            raise ValueError("--strategy fsdp runs PyTorch's FSDP2 (fully_shard) on "
                             "torch.distributed: it needs the torch backend, and this job "
                             f"runs on {comm.name}; launch it with torchrun (python -m "
                             "torch.distributed.run ... -m commbench.allreduce --strategy "
                             "fsdp); under mpirun the sharded strategies are zero1 and zero2")
        device = comm.placement().device
        if device.type != "cpu":
            raise ValueError(f"--strategy fsdp: not built for a model on {device.type} yet "
                             "(its mesh and timing are the CPU's); use --device cpu, or "
                             "--strategy ddp")

    def __init__(self, comm: Communicator, grads: Sequence[torch.Tensor],
                 settings: FSDPSettings | None = None, *,
                 backward_order: Sequence[int] | None = None, workload: Any = None) -> None:
        super().__init__(comm, grads, settings, backward_order=backward_order,
                         workload=workload)
        self.check(comm, "native")
        opt = workload.opt
        if len(opt.param_groups) != 1:
            raise ValueError(f"--strategy fsdp: the workload's {type(opt).__name__} has "
                             f"{len(opt.param_groups)} parameter groups; the peer rebuilds "
                             "one on the sharded parameters")
        self.group = comm.process_group
        self.workload = workload
        net = workload.net
        #: the workload's own parameters, which the run's checksums read (``finish_run``)
        self._originals = dict(zip(workload.param_names, workload.params))
        with torch.no_grad():  # FSDP2 shards each rank's copy: rank 0's, everywhere
            for p in net.parameters():
                dist.broadcast(p.data, 0, group=self.group)
        if not workload.real:  # the replay's ReplayNet (a strategy imports no workload)
            live = _ModuleParams(net, net._params)
            net._params = live
            for unit in net._units.values():
                unit.all_params = live
        self.units = _units(workload)
        self._unit_set = frozenset(self.units)
        mesh = DeviceMesh.from_group(self.group, "cpu")
        modules = [net.get_submodule(u) for u in self.units]
        for m in modules:
            fully_shard(m, mesh=mesh)
        fully_shard(net, mesh=mesh)
        self.net: FSDPModule = net
        self._flights: list[_Flight] = []
        self._stalling: list[contextlib.AbstractContextManager[None]] = []
        self._callbacks: weakref.WeakSet = weakref.WeakSet()
        self._handed = self._step_handed = 0
        self._async = self._step_async = 0  # asynchronous gathers: the forward prefetches
        home = dict(net.named_parameters())  # the sharded parameters, by name
        wrapped = [net, *modules]  # each wrapped module, the root first: its own parameters
        self.unit_bytes = {}
        index = {n: k for k, n in enumerate(workload.param_names)}
        for path, m in zip([ROOT, *self.units], wrapped):
            mine = [n for n in home if self._owner(n) == path]
            nbytes = sum(self._originals[n].numel() * self._originals[n].element_size()
                         for n in mine if n in self._originals)
            self.unit_bytes[path] = nbytes
            m.set_force_sum_reduction_for_comms(True)  # each module's own: Gloo has no AVG
            m.set_custom_all_gather(_TimedAllGather(self, [index[n] for n in mine
                                                            if n in index]))
            m.set_custom_reduce_scatter(_TimedReduceScatter(self, nbytes))
        # FSDP2's pre-forward (prepended at fully_shard) waits for the unit's gather: a
        # stall, between a hook prepended before it and one appended after it
        self.stall = stall_of(workload)
        for m in wrapped:
            m.register_forward_pre_hook(self._stall_begins, prepend=True)
            m.register_forward_pre_hook(self._stall_ends)
        # explicit forward prefetch: after FSDP2's pre-forward (prepended), start the next
        # unit's all-gather on Gloo's thread; FSDP2 waits for it in that unit's pre-forward
        for here, after in zip(wrapped, wrapped[1:]):
            here.register_forward_pre_hook(partial(_prefetch, after))
        hyper = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
        workload.opt = type(opt)(net.parameters(), **hyper)  # on the shards
        self.optimizer = type(opt).__name__

    def _stall_begins(self, *_: Any) -> None:
        self._stalling.append(self.stall())
        self._stalling[-1].__enter__()

    def _stall_ends(self, *_: Any) -> None:
        self._stalling.pop().__exit__(None, None, None)

    def _owner(self, name: str) -> str:
        """The wrapped module that owns parameter ``name``: its unit, else the root."""
        return unit_of(name, self._unit_set)

    # -- the collectives FSDP2 runs, timed ---------------------------------------------------

    def _flown(self, flight: _Flight, work: Any, handed: int) -> None:
        """Keep ``flight`` for the step's records: ended now if it was blocking, else when
        Gloo completes ``work``'s future (on Gloo's thread)."""
        self._handed += handed
        self._async += work is not None
        if work is None:
            flight.end = now()
        else:
            def landed(_f: torch.futures.Future, flight: _Flight = flight) -> None:
                flight.end = now()

            self._callbacks.add(landed)
            flight.done = work.get_future().then(landed)
        self._flights.append(flight)

    def begin_step(self, timer: StepTimer | NullTimer) -> None:
        super().begin_step(timer)
        self._flights.clear()
        self._handed = self._async = 0
        for p in self.net.parameters():  # FSDP2 accumulates into a shard's gradient
            p.grad = None

    def micro_batch(self, last: bool) -> contextlib.AbstractContextManager[None]:
        self.net.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def finish(self) -> None:
        """FSDP2 has reduce-scattered inside backward; record each collective it ran."""
        for f in self._flights:
            if f.done is not None:
                f.done.wait()
            self.timer.comm(f.start, f.end, f.nbytes)
            if self.timer.comm_phase is not None:
                self.timer.comm_phase(f.phase, f.start, f.end)
        self._flights.clear()
        self._step_handed, self._step_async = self._handed, self._async

    def finish_run(self) -> None:
        """Gather the sharded parameters into the workload's own (which the run's checksums
        read); a collective, on every rank in one order."""
        with torch.no_grad():
            for name, p in self.net.named_parameters():
                full = p.full_tensor()
                if name in self._originals:
                    self._originals[name].copy_(full)

    def validation_pass(self, backward_order: Sequence[int]) -> None:
        """FSDP2's arithmetic on the values in ``grads``, on its group: each unit's
        gradients padded to a multiple of the ranks, reduce-scattered as a SUM, divided by
        the ranks, then gathered back so every element is checked
        (``validate.count_wrong``)."""
        n = self.comm.size
        index = {name: i for i, name in enumerate(self.workload.param_names)}
        for path in [ROOT, *self.units]:
            mine = [self.grads[index[name]] for name in index if self._owner(name) == path]
            if not mine:
                continue
            flat = torch.cat([g.reshape(-1) for g in mine])
            padded = torch.zeros(-(-flat.numel() // n) * n, dtype=flat.dtype)
            padded[:flat.numel()] = flat
            shard = torch.empty(padded.numel() // n, dtype=flat.dtype)
            dist.reduce_scatter_single(output=shard, input=padded, group=self.group,
                                       op=dist.ReduceOp.SUM)
            shard.div_(n)
            dist.all_gather_single(padded, shard, group=self.group)
            offset = 0
            for g in mine:
                g.copy_(padded[offset:offset + g.numel()].view_as(g))
                offset += g.numel()

    def close(self, timeout_s: float = 30.0) -> None:
        """Wait until Gloo's threads have dropped every completion callback (the DDP peer's
        reason: one released while the interpreter shuts down aborts the process)."""
        deadline = now() + timeout_s
        while len(self._callbacks) and now() < deadline:
            dilation.sleep(0.001)

    def record_fields(self, kind: str, steps: Sequence[dict] = ()) -> dict:
        """Per step: ``library_bytes`` this rank handed across ranks in it (every rank's under
        the record's ``ranks``); ``knobs.library_bytes_per_step`` is rank 0's last."""
        return {"library_bytes": self._step_handed} if kind == "step" else {}

    def knobs(self) -> dict:
        return {**super().knobs(), "units": len(self.units) + 1,
                "unit_names": [ROOT, *self.units],
                "unit_bytes": [self.unit_bytes[u] for u in [ROOT, *self.units]],
                "collective": "FSDP2's all_gather_single and reduce_scatter_single on the "
                              f"{self.comm.name} group",
                "forward_prefetch": "explicit: the next unit's unshard(async_op=True) in each "
                                    "unit's forward pre-hook",
                "backward_prefetch": "FSDP2's implicit, a blocking all-gather on the CPU",
                "reduce_scatter": "blocking (FSDP2 issues it synchronously; CPU streams are "
                                  "no-ops)",
                "reshard_after_forward": "every unit but the root",
                "force_sum_reduction_for_comms": True,
                "library_bytes_per_step": self._step_handed,
                "gathers_prefetched_per_step": self._step_async,
                "optimizer": {"name": self.optimizer,
                              "state": "of this rank's shards (FSDP2 steps DTensor shards)"}}
