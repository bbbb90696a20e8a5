"""ZeRO-3 / FSDP-style full sharding: parameters sharded at rest, gathered per unit.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", SC 2020 (https://arxiv.org/abs/1910.02054), stage 3 (§5.3, §7.2); PyTorch
FSDP (Zhao et al., VLDB 2023, https://arxiv.org/abs/2304.11277), whose flat parameter
per wrapped block this follows.

1. Once, the model is cut into units (``commbench.models.units``): each top-level block
   (a ResNet bottleneck, a transformer block) and the root unit (the rest: stem,
   embeddings, head; a parameter tied across units is the root's). The workload says
   which units its forward calls one by one (``Workload.unit_paths``: the real model's
   blocks; the replay's, where its profile times them). A unit's synchronised parameters
   are laid end to end in one flat buffer (FSDP's ``FlatParameter``), of which the
   parameters are made views, and its gradients likewise in a flat gradient buffer (the
   workload's gradient tensors become its views, so autograd accumulates straight into
   it). The flat buffer is split into one contiguous part per rank (``shard_counts``:
   sizes differ by at most one; a unit of fewer elements than ranks leaves some ranks an
   empty part). Rank ``r`` keeps its part of the parameters (what it steps), of the mean
   gradient, and SGD's momentum for it; the unit's full parameters are freed (their
   storage resized to 0, as FSDP frees them) outside use. Two parameters sharing memory
   in different units (a tie made by sharing storage, not one ``Parameter``) are refused:
   each unit's copy would be stepped apart.
2. Forward: a forward pre-hook on each unit's module (the root's: the model's) waits for
   the unit's all-gather (``allgather_v`` of the shards into the flat buffer) and, with
   ``--prefetch on``, hands the next unit's to the transfer engine, so it runs during
   this unit's compute (FSDP's ``forward_prefetch``; the order is the one the units ran
   in at the previous step, registration order before). A forward hook frees the unit's
   parameters again and puts a hook on its outputs.
3. Backward: that hook fires when the gradient of the unit's output is in, before its
   backward (FSDP's pre-backward hook): the unit is gathered again and, with prefetch,
   the unit that backward reaches next (the reverse of forward's order) is handed to the
   engine (FSDP's ``BACKWARD_PRE``). The root's output hook gathers the root first
   (the head's backward). Every unit, the root included, is resharded after forward and
   gathered twice a step, so a rank hands over 3Ψ(n−1)/n (ZeRO §7.2). With
   ``--reshard-root off`` the root stays gathered from its forward to its backward, as
   FSDP2 keeps its root module (``fully_shard``'s root does not reshard after forward):
   one gather of the root a step, not two, and no more memory at the peak (the root is
   whole through the whole forward either way).
4. As backward announces a unit's last gradient (``on_ready``), its parameters are freed
   and its reduce-scatter (``reduce_scatter_v`` of the flat gradient buffer) is handed
   to the engine, units in one order on every rank (that in which the workload's
   ``backward_order`` completes them), whose ``after`` divides this rank's part of the
   sum into its gradient shard and frees the flat gradient buffer (FSDP frees the
   unsharded gradient after its reduce-scatter). Gradients are sharded at rest too: a
   unit's flat gradient buffer is made again, zeroed, in its pre-backward hook (3.),
   before autograd accumulates into it; with ``--accum-steps`` it stays whole until the
   last micro-batch's reduce-scatter.
5. ``finish`` waits for the reduce-scatters and steps each shard with the workload's SGD
   settings (``sgd_step``); nothing is gathered after the step: the next forward gathers.
   ``finish_run`` gathers every unit and removes the hooks, so the run's checksums and
   evaluation read whole parameters.

Transfer engines (``commbench.comm.engine``: a thread and a communicator of their own).
``--reduce-scatter-group shared`` (default) runs the gathers and reduce-scatters on one
engine, in the order they were handed over, as one communicator serialises them (NCCL's
single communicator under FSDP); ``separate`` gives the reduce-scatters an engine and
communicator of their own, so a backward gather need not queue behind a reduce-scatter
(fairscale's separate reduce-scatter group and stream).

Records. Each all-gather and reduce-scatter is one collective (the engine's stamps;
wait against transfer as for an all-reduce), its time also under ``comm_phases_s``
(``allgather``, ``reduce_scatter``). A reduce-scatter or all-gather of Ψ bytes moves half
the bus bytes of an all-reduce of Ψ, so each counts Ψ/2 in ``comm_bytes`` and busbw
reads as for the other strategies (per step 1.5 Ψ: 1.5× DDP's).
``knobs.library_bytes_per_step_ranks``: what each rank hands across ranks per step
(3Ψ(n−1)/n with even shards). Per step, ``model_state_bytes_peak``: the peak of what the
strategy itself holds per rank (parameter, gradient and momentum shards, the units'
gathered parameters, and the flat gradient buffers made and not yet freed: those of units
in backward and of reduce-scatters in flight), counted from its own live tensors; the RSS
high-water mark is the summary's ``peak_rss_mb``, beside it. ``knobs.model_state_bytes``
gives the bound's terms (the largest unit, the root unit, the shards).

Not built: ``--compression``, tensors on a GPU, a shard group other than the world
(HSDP), prefetch deeper than one unit, and the project's ring or point-to-point forms of
the two collectives (both run as the backend's). ``--bucket-mb`` does not apply: a
unit's gradients are one reduce-scatter, its parameters one all-gather (FSDP's rule).

Example::

    mpirun -np 4 python -m commbench.allreduce --strategy flat,zero3 --workload real \\
        --model gpt-tiny --prefetch on --reduce-scatter-group separate
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import torch
from torch import nn

from commbench.comm.base import Communicator
from commbench.comm.engine import Transfer, TransferEngine
from commbench.comm.shardcoll import shard_collectives
from commbench.flags import flag
from commbench.flatbuf import FlatBuffer
from commbench.models.units import ROOT, parameter_units
from commbench.strategies.base import stall_of
from commbench.strategies.settings import CommonSettings, check_choice
from commbench.strategies.zero import ShardedStrategy, sgd_step, shard_counts
from commbench.timing import NullTimer, StepTimer

PREFETCH_CHOICES = ("on", "off")
RESHARD_ROOT_CHOICES = ("on", "off")
RS_GROUP_CHOICES = ("shared", "separate")


def library_bytes(unit_numels: Sequence[int], ranks: int, rank: int, itemsize: int,
                  collectives: Sequence[int] | None = None) -> int:
    """Bytes rank ``rank`` hands across ranks per step under ZeRO-3: for each unit the
    other ranks' parts, received in each of its all-gathers and sent in its
    reduce-scatter (``collectives``: how many a unit runs a step; 3 for every unit by
    default, 2 for a root kept gathered from forward to backward). Summed over ranks
    3(n−1)Ψ for Ψ parameter bytes, 3Ψ(n−1)/n a rank (ZeRO §7.2: 1.5× a ring all-reduce's
    2Ψ(n−1)/n)."""
    times = [3] * len(unit_numels) if collectives is None else list(collectives)
    return itemsize * sum(k * (numel - shard_counts(numel, ranks)[rank])
                          for numel, k in zip(unit_numels, times, strict=True))


@dataclass(frozen=True)
class Zero3Settings(CommonSettings):
    """``zero3``'s settings: the common ones, and its two options.

    Args:
        prefetch: ``on``: the next unit's all-gather is handed to the engine while this
            unit computes (forward and backward); ``off``: each unit's gather is started
            when the unit needs it, and waited for (to judge the prefetch).
        reduce_scatter_group: ``shared``: gathers and reduce-scatters on one engine and
            communicator; ``separate``: reduce-scatters on one of their own.
        reshard_root: ``on``: the root unit is freed after forward and gathered again for
            backward, as every other unit (ZeRO §7.2's 3Ψ(n−1)/n); ``off``: kept gathered
            from forward to backward (FSDP2's root module).

    ``--accum-steps`` is honoured (gradients accumulate in the whole gradient buffers, one
    reduce-scatter per unit on the last micro-batch, as FSDP's ``no_sync``);
    ``--compression`` is refused, naming the pair (exit 2).
    """

    strategy: ClassVar[str] = "zero3"

    prefetch: str = flag(
        "--prefetch", default="on", choices=PREFETCH_CHOICES,
        help="--strategy zero3: on = hand the next unit's parameter all-gather to the "
             "transfer engine while this unit computes (forward and backward), off = gather "
             "each unit when it is needed and wait for it")
    reduce_scatter_group: str = flag(
        "--reduce-scatter-group", default="shared", choices=RS_GROUP_CHOICES,
        help="--strategy zero3: shared = gathers and reduce-scatters on one transfer engine "
             "and communicator (in the order handed over, as one NCCL communicator runs "
             "them), separate = reduce-scatters on an engine and communicator of their own")

    reshard_root: str = flag(
        "--reshard-root", default="on", choices=RESHARD_ROOT_CHOICES,
        help="--strategy zero3: on = free the root unit's parameters after forward and "
             "gather them again for backward, as every unit (ZeRO-3's 3x the parameters a "
             "step), off = keep the root gathered from forward to backward (FSDP2's root "
             "module: one gather of the root a step fewer)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("prefetch", self.prefetch, PREFETCH_CHOICES)
        check_choice("reduce_scatter_group", self.reduce_scatter_group, RS_GROUP_CHOICES)
        check_choice("reshard_root", self.reshard_root, RESHARD_ROOT_CHOICES)

    def check_steps(self, steps: int) -> None:
        """What zero3 cannot honour, refused where a job runs it (``check_unbuilt``)."""
        self.check_unbuilt()

    def check_unbuilt(self) -> None:
        """ValueError naming the pair for a flag zero3 cannot honour. Not in
        ``__post_init__``: these settings declare ``--prefetch``, so every job's ``Sync``
        makes them to check that flag, whichever strategies it runs."""
        if self.compression != "none":
            raise ValueError(f"--strategy zero3 with --compression {self.compression}: not "
                             "built (its reduce-scatter would move the narrow dtype and its "
                             "shard be widened to step); run it without --compression, or "
                             "compress with --strategy flat or bucketed")


#: a unit's parameters: freed (storage of 0 bytes), gathering (an all-gather in flight into
#: them) or gathered
FREED, GATHERING, GATHERED = "freed", "gathering", "gathered"


class _Unit:
    """One unit: its module path, its parameters' indices, their flat buffer (the
    parameters are views of it), this rank's shards, and its gather state."""

    __slots__ = ("path", "indices", "numel", "counts", "params", "grads", "param", "grad",
                 "momentum", "nbytes", "state", "gather", "scatter", "summed", "pending",
                 "backward_gathered")

    def __init__(self, path: str, indices: list[int], params: Sequence[torch.Tensor],
                 grads: Sequence[torch.Tensor], rank: int, ranks: int) -> None:
        self.path = path
        self.indices = indices
        mine = [params[i] for i in indices]
        self.numel = sum(p.numel() for p in mine)
        self.counts = shard_counts(self.numel, ranks)
        self.params = FlatBuffer(mine)
        self.params.pack(mine)
        for p, view in zip(mine, self.params.views):
            p.data = view  # the all-gather then writes the parameters themselves
        self.grads = FlatBuffer([grads[i] for i in indices])
        self.grads.pack([grads[i] for i in indices])
        for i, view in zip(indices, self.grads.views):
            grads[i].data = view  # autograd accumulates into the flat gradient buffer
        lo = sum(self.counts[:rank])
        #: this rank's shard: its own copy of the parameters' part, the mean gradient's part
        self.param = self.params.flat[lo:lo + self.counts[rank]].clone()
        self.grad = torch.zeros_like(self.param)
        self.momentum: torch.Tensor | None = None
        self.nbytes = self.params.nbytes
        self.state = GATHERED
        self.gather: Transfer | None = None
        self.scatter: Transfer | None = None
        self.summed: torch.Tensor | None = None
        self.pending: set[int] = set()
        self.backward_gathered = False

    def storage(self) -> torch.UntypedStorage:
        return self.params.flat.untyped_storage()

    def grad_storage(self) -> torch.UntypedStorage:
        return self.grads.flat.untyped_storage()


class Zero3Strategy(ShardedStrategy):
    """ZeRO-3 (module docstring): parameters sharded at rest, gathered per unit; it hooks
    the workload's units (``--algo``: the two collectives' form, as zero1/zero2)."""

    name = "zero3"
    settings_class = Zero3Settings
    settings: Zero3Settings

    def __init__(self, comm: Communicator, grads: Sequence[torch.Tensor],
                 settings: Zero3Settings | None = None, *,
                 backward_order: Sequence[int] | None = None, workload: Any = None) -> None:
        super().__init__(comm, grads, settings, backward_order=backward_order,
                         workload=workload)
        self.resolve_algo()
        self.settings.check_unbuilt()
        params = self.take_workload(workload)  # finish steps the shards
        #: a wait for a unit's parameters is sync, not the workload's compute
        self._stall = stall_of(workload)
        self.prefetch = self.settings.prefetch == "on"
        self.separate = self.settings.reduce_scatter_group == "separate"
        self.reshard_root = self.settings.reshard_root == "on"
        net: nn.Module = workload.net
        paths = list(workload.unit_paths)
        names = list(workload.param_names)
        unit_of = self._unit_of_params(workload)
        check_ties(params, names, unit_of)
        with torch.no_grad():
            self.units = [
                _Unit(path, [i for i, u in enumerate(unit_of) if u == path], params,
                      self.grads, comm.rank, comm.size)
                for path in [ROOT, *paths] if path in unit_of]
        self._unit_of = {i: u for u in self.units for i in u.indices}
        self._modules = {u.path: net.get_submodule(u.path) if u.path else net
                         for u in self.units}
        #: units in the order forward ran them at the last step (registration order before)
        self._forward_order = [u for u in self.units if u.path != ROOT]
        self._ran: list[_Unit] = []
        #: the reduce-scatters' order, the same on every rank: as backward_order completes
        #: the units (a unit's last gradient in it)
        last = {i: k for k, i in enumerate(self.backward_order)}
        self._rs_order = sorted(self.units, key=lambda u: max(last.get(i, -1)
                                                              for i in u.indices))
        self._next_rs = 0
        # A collective each (a dup of the communicator): every rank opens its engines here, in
        # one order, and asks for each engine's world group on this thread
        self._ag = TransferEngine(comm, "thread")
        self._ag_coll = shard_collectives(self.algo, self._ag.comm)
        self._rs = TransferEngine(comm, "thread") if self.separate else self._ag
        self._rs_coll = shard_collectives(self.algo, self._rs.comm) if self.separate \
            else self._ag_coll
        self._step_transfers: list[tuple[Transfer, str, int]] = []
        #: whole parameters and gradient buffers held now, and their peak this step (the
        #: engine's thread frees gradient buffers: a lock)
        self._held_lock = threading.Lock()
        self._held = 2 * sum(u.nbytes for u in self.units)
        self._peak_held = self._held
        #: the validation pass keeps the gradient buffers it reduce-scatters
        self._keep_grads = False
        self._hooks = [net.register_forward_pre_hook(self._root_pre_forward),
                       net.register_forward_hook(self._root_post_forward)]
        for u in self.units:
            if u.path != ROOT:
                m = self._modules[u.path]
                self._hooks.append(m.register_forward_pre_hook(self._pre_forward_of(u)))
                self._hooks.append(m.register_forward_hook(self._post_forward_of(u)))
        for u in self.units:  # sharded at rest, parameters and gradients
            self._free(u)
            self._free_grads(u)
        self._peak_held = self._held
        self.begin_step(self.timer)

    checks_workload = True

    @classmethod
    def check_workload(cls, workload: Any) -> None:
        """A tie split across units (``check_ties``), before the job writes anything."""
        check_ties(list(workload.params), list(workload.param_names),
                   cls._unit_of_params(workload))

    @staticmethod
    def _unit_of_params(workload: Any) -> list[str]:
        """Each of the workload's parameters' unit (its path; ROOT for the root's)."""
        home = parameter_units(workload.net, list(workload.unit_paths))
        return [home[n] for n in workload.param_names]

    @property
    def _root(self) -> _Unit | None:
        return self.units[0] if self.units and self.units[0].path == ROOT else None

    # -- gathering and freeing -----------------------------------------------------------------

    def _start_gather(self, u: _Unit) -> None:
        """Hand ``u``'s all-gather to the engine: its storage is made whole again first (on
        this thread) and the shards gathered into it on the engine's."""
        if u.state != FREED:
            return
        u.storage().resize_(u.nbytes)
        self._hold(u.nbytes)
        u.state = GATHERING
        u.gather = self._ag.submit(u.params.flat, run=partial(self._allgather, u.param,
                                                                 u.counts))
        self._step_transfers.append((u.gather, "allgather", u.nbytes // 2))

    def _allgather(self, part: torch.Tensor, counts: list[int], out: torch.Tensor) -> None:
        """On the engine's thread: every rank's ``part`` into ``out``, through an alias of
        its memory (``torch.from_dlpack``: the same bytes, a storage of its own). The mpi
        backend hands MPI a numpy view, and ``Tensor.numpy`` makes the storage it views
        unresizable for good (torch 2.13), which would keep a unit from being freed."""
        self._ag_coll.allgather(part, counts, torch.from_dlpack(out))

    def _ensure(self, u: _Unit | None) -> None:
        """``u``'s parameters whole: gathered now, or its gather (prefetched) waited for."""
        if u is None:
            return
        self._start_gather(u)
        if u.state == GATHERING:
            with self._stall():  # the unit cannot compute before: exposed sync
                u.gather.wait()
            u.state = GATHERED

    def _free(self, u: _Unit) -> None:
        """Give back ``u``'s whole parameters (after the gather in flight into them)."""
        if u.state == FREED:
            return
        if u.state == GATHERING:
            u.gather.wait()
        u.storage().resize_(0)
        self._hold(-u.nbytes)
        u.state = FREED

    def _make_grads(self, u: _Unit) -> None:
        """``u``'s flat gradient buffer whole and zeroed, where it was freed (kept as it is
        where whole: gradients of earlier micro-batches accumulate in it)."""
        if u.grad_storage().nbytes() == 0:
            u.grad_storage().resize_(u.grads.nbytes)
            u.grads.flat.zero_()
            self._hold(u.grads.nbytes)

    def _free_grads(self, u: _Unit) -> None:
        """Give back ``u``'s flat gradient buffer (its reduce-scatter done, or at rest)."""
        if u.grad_storage().nbytes() != 0:
            u.grad_storage().resize_(0)
            self._hold(-u.grads.nbytes)

    def _hold(self, nbytes: int) -> None:
        """``nbytes`` more (fewer, negative) of whole parameters or gradient buffers held
        now; the step's peak kept (either thread)."""
        with self._held_lock:
            self._held += nbytes
            self._peak_held = max(self._peak_held, self._held)

    # -- forward -------------------------------------------------------------------------------

    def _root_pre_forward(self, _module: nn.Module, _args: Any) -> None:
        self._ran = []
        self._ensure(self._root)
        if self.prefetch and self._forward_order:
            self._start_gather(self._forward_order[0])

    def _pre_forward_of(self, u: _Unit):
        def hook(_module: nn.Module, _args: Any) -> None:
            self._ensure(u)
            self._ran.append(u)
            if self.prefetch:
                nxt = self._after(self._forward_order, u)
                if nxt is not None:
                    self._start_gather(nxt)
        return hook

    def _root_post_forward(self, _module: nn.Module, _args: Any, output: Any) -> None:
        """After the whole forward: learn the units' order, free the root's parameters
        (``--reshard-root on``), and hook the model's outputs (where backward begins: the
        root is gathered again there where it was freed, and the first unit of backward
        prefetched)."""
        self._learn_order()
        self._after_forward(self._root, output, free=self.reshard_root)

    def _post_forward_of(self, u: _Unit):
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            self._after_forward(u, output)
        return hook

    def _after_forward(self, u: _Unit | None, output: Any, free: bool = True) -> None:
        """Free ``u`` (resharded after forward; kept gathered where not ``free``) and hook
        its outputs for its backward."""
        if u is not None:
            if free:
                self._free(u)
            u.backward_gathered = False
        for t in _tensors(output):
            if t.requires_grad:
                # through a weak reference: autograd holds a tensor's hooks in C++, out of the
                # garbage collector's sight, so an output kept past the run (the workload's
                # last one) would keep this strategy and the workload alive for good
                # (and the unit by its place: a hook left on a tensor holds nothing)
                place = None if u is None else next(k for k, x in enumerate(self.units)
                                                    if x is u)
                t.register_hook(partial(_pre_backward_weakly, weakref.ref(self), place))

    def _learn_order(self) -> None:
        """The order the units ran in: the next step's prefetch order (kept where a unit
        ran twice or not at all)."""
        ran = self._ran
        if len(ran) == len(self._forward_order) and len(set(map(id, ran))) == len(ran):
            self._forward_order = list(ran)

    @staticmethod
    def _after(order: list[_Unit], u: _Unit) -> _Unit | None:
        k = next((k for k, v in enumerate(order) if v is u), None)
        return order[k + 1] if k is not None and k + 1 < len(order) else None

    # -- backward ------------------------------------------------------------------------------

    def _pre_backward(self, u: _Unit | None) -> None:
        """The hook on the outputs of unit ``u`` (None: a root without parameters): it fires
        once their gradient is in, before the unit's backward."""
        if u is not None:
            if u.backward_gathered:  # one of several outputs, or a unit run twice
                return
            u.backward_gathered = True
            self._ensure(u)
            self._make_grads(u)  # before autograd accumulates into it
        if self.prefetch:
            order = list(reversed(self._forward_order))
            nxt = order[0] if u is self._root and order else self._after(order, u)
            if nxt is not None and nxt.pending:
                self._start_gather(nxt)

    def begin_step(self, timer: StepTimer | NullTimer) -> None:
        super().begin_step(timer)
        if self._next_rs not in (0, len(self._rs_order)):
            raise RuntimeError(f"{self.name}: a step began before the previous one finished")
        for u in self.units:
            u.pending = set(u.indices)
            u.scatter = None
        self._next_rs = 0
        self._step_transfers = []
        with self._held_lock:
            self._peak_held = self._held

    def on_ready(self, i: int) -> None:
        u = self._unit_of[i]
        if i not in u.pending:
            raise RuntimeError(f"{self.name}: gradient {i} announced twice in one step")
        u.pending.discard(i)
        if not u.pending:
            self._free(u)  # its backward is done: no node left that reads its parameters
            self._start_ready_scatters()

    def _start_ready_scatters(self) -> None:
        """Hand the engine every finished unit's reduce-scatter with no unstarted unit before
        it in ``_rs_order``: every rank issues them in one order."""
        while self._next_rs < len(self._rs_order) and not self._rs_order[self._next_rs].pending:
            u = self._rs_order[self._next_rs]
            self._make_grads(u)  # a unit backward never reached: its zero gradient
            u.scatter = self._rs.submit(u.grads.flat, after=partial(self._take_mean, u),
                                        run=partial(self._reduce_scatter, u))
            self._step_transfers.append((u.scatter, "reduce_scatter", u.nbytes // 2))
            self._next_rs += 1

    def _reduce_scatter(self, u: _Unit, buffer: torch.Tensor) -> None:
        """On the engine's thread: this rank's part of the unit's gradient sum, through an
        alias of the buffer's memory (``_allgather`` says why: the buffer is freed after)."""
        u.summed = self._rs_coll.reduce_scatter(torch.from_dlpack(buffer), u.counts)

    def _take_mean(self, u: _Unit) -> None:
        """On the engine's thread, once the sum is in: its mean into the gradient shard, and
        the unit's flat gradient buffer freed (no longer read: its backward is done)."""
        torch.div(u.summed, self.comm.size, out=u.grad)
        u.summed = None
        if not self._keep_grads:
            self._free_grads(u)

    # -- after backward --------------------------------------------------------------------------

    def _reduce(self) -> None:
        """Start what backward left (units whose gradients were never all announced are
        taken as they are), wait for every transfer of the step, and record each."""
        for u in self._rs_order[self._next_rs:]:
            u.pending.clear()
        self._start_ready_scatters()
        for t, phase, nbytes in self._step_transfers:
            t.wait()
            self.timer.comm(t.start, t.end, nbytes)
            if self.timer.comm_phase is not None:
                self.timer.comm_phase(phase, t.start, t.end)
        for u in self.units:
            if u.state == GATHERING:  # a prefetch nobody used: settled, then freed
                u.state = GATHERED
            self._free(u)
        self._step_transfers = []

    def finish(self) -> None:
        self._reduce()
        with self.timer.compute("optimizer"):
            for u in self.units:
                u.momentum = sgd_step(u.param, u.grad, u.momentum, self.sgd)
        self._last_peak = self._model_state_bytes(self._peak_held)

    def finish_run(self) -> None:
        """Gather every unit and leave it whole, hooks removed: the run's checksums and
        evaluation read the parameters; the gradient buffers made whole (zeroed) for the
        validation pass, which writes them."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for u in self.units:
            self._start_gather(u)
        for u in self.units:
            self._ensure(u)
            self._make_grads(u)

    def validation_pass(self, backward_order: Sequence[int]) -> None:
        """Reduce-scatter the values in ``grads`` as a step does, then gather every rank's
        mean shard back into them, so that the closed-form check (``validate.count_wrong``)
        sees every element of every shard; no step is taken, the parameters stay as they
        are."""
        self.begin_step(NullTimer())
        for u in self._rs_order:
            u.pending.clear()
        self._keep_grads = True
        try:
            self._start_ready_scatters()
            for u in self._rs_order:
                u.scatter.wait()
                self._ag.submit(u.grads.flat,
                                run=partial(self._allgather, u.grad, u.counts)).wait()
        finally:
            self._keep_grads = False
        self._step_transfers = []

    # -- records ---------------------------------------------------------------------------------

    def _model_state_bytes(self, held: int) -> int:
        """What this rank's strategy holds of the model's state, with ``held`` bytes of
        whole parameters and flat gradient buffers: its shards (parameters, gradients,
        momentum) and those."""
        return self._shard_bytes() + held

    def _shard_bytes(self) -> int:
        """This rank's parameter, gradient and momentum shards, in bytes."""
        itemsize = self.dtype.itemsize
        shards = sum(u.param.numel() * itemsize * 2 for u in self.units)
        return shards + sum(u.momentum.numel() * itemsize for u in self.units
                            if u.momentum is not None)

    def knobs(self) -> dict:
        size, itemsize = self.comm.size, self.dtype.itemsize
        numels = [u.numel for u in self.units]
        collectives = [2 if u.path == ROOT and not self.reshard_root else 3
                       for u in self.units]
        largest = max((u.nbytes for u in self.units), default=0)
        return {**super().knobs(), "stage": 3, "prefetch": self.settings.prefetch,
                "reduce_scatter_group": self.settings.reduce_scatter_group,
                "reshard_root": self.settings.reshard_root,
                "units": [u.path for u in self.units],
                "unit_bytes": [n * itemsize for n in numels],
                "algo": self.algo,
                "collective": self._ag_coll.describe() + ", on "
                              + ("two engine threads and communicators" if self.separate
                                 else "one engine thread and communicator"),
                "shard_elements_ranks": [sum(shard_counts(n, size)[r] for n in numels)
                                         for r in range(size)],
                "library_bytes_per_step_ranks": [library_bytes(numels, size, r, itemsize,
                                                               collectives)
                                                 for r in range(size)],
                "model_state_bytes": {
                    "what": "bytes this rank's strategy holds: parameter, gradient and "
                            "momentum shards, and at their peak the gathered parameters "
                            "and the flat gradient buffers made (a unit's, before its "
                            "backward) and not yet freed (after its reduce-scatter) "
                            "(records' model_state_bytes_peak); not the RSS",
                    "shard_bytes": self._shard_bytes(),
                    "largest_unit_bytes": largest,
                    "root_unit_bytes": self._root.nbytes if self._root else 0,
                    "grad_buffer_bytes": sum(u.grads.nbytes for u in self.units)},
                "optimizer": self.optimizer_knob()}

    def close(self) -> None:
        """Stop the transfer engines (after their last transfers) and take the hooks off the
        workload's modules."""
        if self._rs is not self._ag:
            self._rs.close()
        self._ag.close()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()


def _pre_backward_weakly(strategy: weakref.ref, unit: int | None, _grad: torch.Tensor
                         ) -> None:
    """The output hook of unit ``unit`` (its place in ``units``; None: a root without
    parameters): ``Zero3Strategy._pre_backward`` while the strategy lives."""
    zero = strategy()
    if zero is not None:
        zero._pre_backward(None if unit is None else zero.units[unit])


def _tensors(output: Any) -> list[torch.Tensor]:
    """The tensors of a module's output: itself, or those in a tuple, list or dict."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for o in output for t in _tensors(o)]
    if isinstance(output, dict):
        return [t for o in output.values() for t in _tensors(o)]
    return []


def check_ties(params: Sequence[torch.Tensor], names: Sequence[str],
               unit_of: Sequence[str]) -> None:
    """ValueError naming the pair where two parameters share memory (a tie made by sharing
    storage, not one ``Parameter``) in different units: each unit's flat buffer would hold
    its own copy, stepped apart. One ``Parameter`` tied across units is the root unit's
    (``commbench.models.units``) and fine."""
    seen: dict[tuple[int, int], int] = {}
    for i, p in enumerate(params):
        if p.numel() == 0:
            continue
        key = (p.untyped_storage().data_ptr(), p.storage_offset())
        j = seen.setdefault(key, i)
        if j != i and unit_of[j] != unit_of[i]:
            raise ValueError(
                f"--strategy zero3: parameters {names[j]} (unit {unit_of[j] or 'root'}) and "
                f"{names[i]} (unit {unit_of[i] or 'root'}) share memory: a tie split across "
                "units, which would be stepped apart; tie them as one Parameter (it then "
                "belongs to the root unit)")
