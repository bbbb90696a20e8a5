"""ZeRO stages 1 and 2: gradients reduce-scattered in buckets, each rank steps its shard.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", SC 2020 (https://arxiv.org/abs/1910.02054); DeepSpeed's ``stage_1_and_2.py``.
Stage 1 shards the optimizer state, stage 2 the gradients too; both keep every
parameter on every rank.

1. Once, the gradients are grouped into buckets in the order backward produces them, by
   bucketed's rule (``assign_buckets``: at most ``--bucket-mb`` MB each, the first at
   most ``--first-bucket-mb``; 0 = one bucket per tensor). Each bucket is split into one
   contiguous part per rank, sizes differing by at most one element (``shard_counts``:
   a bucket of fewer elements than ranks leaves some ranks an empty part); rank ``r``
   owns part ``r`` of every bucket. Its shard is that part of the mean gradient, its own
   copy of that part of the parameters (what the optimizer steps) and the optimizer's
   state for it (SGD's momentum: one copy of the shard). A bucket's parameters are made
   views of one flat buffer (DeepSpeed flattens its parameter groups so), so the
   all-gather writes them in place.
2. As backward produces gradient ``i`` (``on_ready``), it is copied into its bucket's
   buffer. When the bucket is full, and every earlier bucket has started (the same issue
   order on every rank, bucketed's rule), its reduce-scatter is handed to the strategy's
   transfer engine (``commbench.comm.engine``: one thread and a communicator of its own,
   whose world group runs the library's blocking ``reduce_scatter_v``), which divides
   this rank's part of the sum into its gradient shard as it arrives. Open MPI would
   not advance a non-blocking one while backward computes (docs/strategies.md,
   "Overlap").

   - ``zero1`` keeps a buffer per bucket: the whole gradient, as ZeRO-1 keeps it.
   - ``zero2`` keeps only its shard: a bucket borrows one of ``ZERO2_BUFFERS`` buffers
     of the largest bucket's size from its first gradient until its reduce-scatter is
     done (DeepSpeed's double-buffered reduction bucket). A bucket that finds none free
     waits for the oldest reduce-scatter in flight, as DeepSpeed waits for its reduction
     stream; with none in flight (gradients out of backward order fill several buckets
     at once) it gets a new one. Where two of the largest bucket would hold the whole
     gradient or more (few large buckets), it keeps a buffer per bucket as ``zero1``
     does: ``knobs.grad_buffer_bytes`` says what it held.
3. ``finish`` waits for the reduce-scatters, then steps each bucket's shard with the
   workload's SGD settings (torch's own update, ``sgd_step``; timed as the optimizer's
   compute) and hands that bucket's all-gather of the parameters to the engine at once,
   so gathers run while later shards step; then waits for the gathers. The workload's
   optimizer is replaced by one whose step has nothing left to do.

Records. Every reduce-scatter and all-gather is one collective, timed by the engine from
when it began to when it ended (wait vs transfer, as a bucket's all-reduce); per step
``comm_phases_s`` holds the time in each kind apart (``reduce_scatter``,
``allgather``). ``comm_bytes`` counts each bucket once, at its reduce-scatter: a
reduce-scatter and an all-gather of Ψ bytes move the bus bytes of one all-reduce of Ψ,
2Ψ(n−1)/n, so busbw (the all-reduce's factor) reads as for the other strategies.
``knobs.library_bytes_per_step_ranks``: what each rank hands across ranks per step
(``library_bytes``). Model-state memory per rank is not counted yet.

``--algo``: ``native`` runs both collectives as the backend's (``reduce_scatter_v``,
``allgather_v``); ``ring`` as the project's ring forms on point-to-point messages
(``comm.p2pcoll.ring_reduce_scatter_steps`` and ``ring_allgather_steps``), which move
(n−1)/n of a bucket per collective through each node's link: on Open MPI 4.1 the
native pair measured twice that (docs/strategies.md); ``hier`` as the topology-aware
forms, in the node and then across nodes (``comm.shardcoll.TwoLevel``), which move
(N−1)/N of it on N nodes of equal size. Each is ``comm.shardcoll.shard_collectives``.

Not built: ``--compression``, ``--bucket-mb auto`` (exit 2, naming the pair), tensors
on a GPU (ZeRO-3 is ``zero3``).

Example::

    mpirun -np 4 python -m commbench.allreduce --strategy flat,zero1,zero2 --algo native \\
        --bucket-mb 25 --compute-ms 300
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, ClassVar

import torch
from torch.optim.sgd import sgd as torch_sgd

from commbench.buckets import AUTO, MB, assign_buckets
from commbench.comm.base import Communicator
from commbench.comm.engine import Transfer, TransferEngine
from commbench.comm.ring import chunk_counts
from commbench.comm.shardcoll import ShardCollectives, check_two_level, shard_collectives
from commbench.flags import same_flag
from commbench.flatbuf import FlatBuffer, flat_views
from commbench.strategies.base import Strategy
from commbench.strategies.bucketed import BucketedSettings, check_bucket_flags
from commbench.strategies.settings import CommonSettings
from commbench.timing import NullTimer, StepTimer

#: zero2's gradient buffers: two of the largest bucket's size, one filling while the other
#: is reduce-scattered (DeepSpeed's double-buffered reduction bucket under overlap_comm)
ZERO2_BUFFERS = 2


#: each rank's part of a bucket of ``numel`` elements, in rank order: contiguous, sizes
#: differing by at most one (the first ``numel % ranks`` ranks hold one more), so with fewer
#: elements than ranks the last ranks hold none (the ring's chunks)
shard_counts = chunk_counts


def library_bytes(bucket_numels: Sequence[int], ranks: int, rank: int, itemsize: int) -> int:
    """Bytes rank ``rank`` hands across ranks per step: in each bucket's reduce-scatter the
    other ranks' parts, which it sends, and in its all-gather theirs again, which it
    receives. Summed over ranks that is 2(n−1)Ψ for Ψ gradient bytes, 2Ψ(n−1)/n a rank
    (ZeRO §7: what a ring all-reduce, DDP's, hands over)."""
    others = sum(numel - shard_counts(numel, ranks)[rank] for numel in bucket_numels)
    return 2 * others * itemsize


@dataclass(frozen=True)
class SGDHyper:
    """``torch.optim.SGD``'s hyper-parameters, read from the workload's optimizer."""

    lr: float
    momentum: float
    dampening: float
    weight_decay: float
    nesterov: bool
    maximize: bool

    @classmethod
    def of(cls, opt: Any, strategy: str) -> SGDHyper:
        """The settings of ``opt``; a ValueError, naming ``strategy``, where it is not one
        SGD parameter group (the shards hold one)."""
        if type(opt) is not torch.optim.SGD:
            raise ValueError(f"--strategy {strategy} steps SGD on its shard; the workload's "
                             f"optimizer is {type(opt).__name__}")
        if len(opt.param_groups) != 1:
            raise ValueError(f"--strategy {strategy}: the workload's SGD has "
                             f"{len(opt.param_groups)} parameter groups; its shards hold one")
        g = opt.param_groups[0]
        return cls(lr=float(g["lr"]), momentum=float(g["momentum"]),
                   dampening=float(g["dampening"]), weight_decay=float(g["weight_decay"]),
                   nesterov=bool(g["nesterov"]), maximize=bool(g.get("maximize", False)))


def sgd_step(param: torch.Tensor, grad: torch.Tensor, buf: torch.Tensor | None,
             hp: SGDHyper) -> torch.Tensor | None:
    """``torch.optim.SGD``'s update of one tensor, in place, by torch's own functional
    form (``torch.optim.sgd.sgd``, single-tensor: what ``SGD.step`` runs on the CPU), so a
    shard steps as its elements step under SGD on the whole parameter. Returns the
    momentum buffer (made from the first step's gradient, as SGD makes it; None without
    momentum)."""
    bufs = [buf]
    torch_sgd([param], [grad], bufs, foreach=False, lr=hp.lr, momentum=hp.momentum,
              dampening=hp.dampening, weight_decay=hp.weight_decay, nesterov=hp.nesterov,
              maximize=hp.maximize)
    return bufs[0]


@dataclass(frozen=True)
class ZeroSettings(CommonSettings):
    """The ZeRO strategies' settings: the common ones, and bucketed's buckets
    (``--bucket-mb``, ``--first-bucket-mb``, declared on ``BucketedSettings``). What a
    stage cannot honour is refused, naming the pair (exit 2):

    - ``--compression``: not built (the reduce-scatter would run in the narrow dtype and
      the shard be widened for its step);
    - ``--bucket-mb auto``: its tuner prices bucketed's all-reduces, not reduce-scatters;
    - ``--accum-steps`` above 1 under ``zero2`` (``Zero2Settings``). ``zero1`` honours
      it: the full gradient accumulates locally and is reduce-scattered once per step, as
      DeepSpeed's stage 1 keeps it.

    Example::

        make_strategy("zero2", comm, grads, Zero2Settings(bucket_mb=5), workload=workload)
    """

    #: the strategy these settings are for, as messages name it
    strategy: ClassVar[str] = "zero"

    bucket_mb: float | str = same_flag(BucketedSettings, "bucket_mb")
    first_bucket_mb: float = same_flag(BucketedSettings, "first_bucket_mb")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bucket_flags(self.bucket_mb, self.first_bucket_mb)
        what = f"--strategy {self.strategy}"
        if self.compression != "none":
            raise ValueError(f"{what} with --compression {self.compression}: not built (its "
                             "reduce-scatter would move the narrow dtype and its shard be "
                             "widened to step); run it without --compression, or compress "
                             "with --strategy flat or bucketed")
        if self.bucket_mb == AUTO:
            raise ValueError(f"{what} with --bucket-mb auto: auto's tuner prices bucketed's "
                             "all-reduces, not reduce-scatters; give a cap in MB (25 is "
                             "DDP's), or run --strategy bucketed alone with auto")


@dataclass(frozen=True)
class Zero1Settings(ZeroSettings):
    """``zero1``'s settings (``ZeroSettings``): ``--accum-steps`` honoured."""

    strategy: ClassVar[str] = "zero1"


@dataclass(frozen=True)
class Zero2Settings(ZeroSettings):
    """``zero2``'s settings (``ZeroSettings``): ``--accum-steps`` refused."""

    strategy: ClassVar[str] = "zero2"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.accum_steps > 1:
            raise ValueError(f"--strategy zero2 with --accum-steps {self.accum_steps}: not "
                             "built (ZeRO-2 keeps no full gradient to accumulate in, so each "
                             "micro-batch would need a reduce-scatter into the shard, as "
                             "DeepSpeed's stage 2 runs); use --strategy zero1, which "
                             "accumulates the full gradient and reduce-scatters once")


class _Bucket:
    """One bucket: its gradients' indices, its parameters' flat buffer (which they are views
    of), this rank's shard, and the gradient buffer it is reduce-scattered from."""

    __slots__ = ("indices", "numel", "counts", "params", "param", "grad", "momentum",
                 "lent", "buffer", "views", "pending", "scatter", "reduction", "gather",
                 "summed")

    def __init__(self, indices: list[int], params: Sequence[torch.Tensor], rank: int,
                 ranks: int) -> None:
        """``rank`` of ``ranks``: this rank's place in the group the bucket is sharded over
        (the job's ranks under ZeRO; the node's under HSDP)."""
        self.indices = indices
        mine = [params[i] for i in indices]
        self.numel = sum(p.numel() for p in mine)
        self.counts = shard_counts(self.numel, ranks)
        self.params = FlatBuffer(mine)
        self.params.pack(mine)
        for p, view in zip(mine, self.params.views):
            p.data = view  # the all-gather then writes the parameter itself
        lo = sum(self.counts[:rank])
        #: this rank's shard: its own copy of the parameters' part, the mean gradient's part
        self.param = self.params.flat[lo:lo + self.counts[rank]].clone()
        self.grad = torch.zeros_like(self.param)
        self.momentum: torch.Tensor | None = None
        self.lent: torch.Tensor | None = None  # the buffer held (zero2: lent by the pool)
        self.buffer: torch.Tensor | None = None  # its first ``numel`` elements: the bucket
        self.views: dict[int, torch.Tensor] = {}
        self.pending: set[int] = set()
        self.scatter: Transfer | None = None  # the one that gives the buffer back
        #: every transfer that reduces the bucket this step, in order, with the phase its
        #: time is recorded under and the bytes it counts (``ZeroStrategy._reduce``)
        self.reduction: list[tuple[Transfer, str, int]] = []
        self.gather: Transfer | None = None
        self.summed: torch.Tensor | None = None  # this rank's part of the sum, as it lands

    def hold(self, flat: torch.Tensor, grads: Sequence[torch.Tensor]) -> None:
        """Take ``flat`` (at least this bucket's size) as the gradient buffer."""
        self.lent = flat
        self.buffer = flat[:self.numel]
        self.views = dict(zip(self.indices,
                              flat_views(self.buffer, [grads[i] for i in self.indices])))


class _BufferPool:
    """zero2's gradient buffers: flat tensors of the largest bucket's size, lent to a bucket
    from its first gradient until its reduce-scatter is done, and given back on the
    engine's thread (a thread-safe queue)."""

    def __init__(self, numel: int, dtype: torch.dtype, keep: int) -> None:
        self.numel, self.dtype = numel, dtype
        self._free: queue.SimpleQueue[torch.Tensor] = queue.SimpleQueue()
        self.made = 0
        self.waits = 0  # lends that waited for a reduce-scatter to give a buffer back
        for _ in range(keep):
            self.give(self._new())

    def _new(self) -> torch.Tensor:
        self.made += 1
        return torch.empty(self.numel, dtype=self.dtype)

    def take(self, oldest_in_flight: Callable[[], Transfer | None]) -> torch.Tensor:
        """A free buffer; if none, wait for the oldest reduce-scatter in flight to give one
        back (it does before it counts as done), or make one where none is in flight.

        The oldest in flight may have given its buffer back already, and that buffer been
        lent again, in the moment before it counts as done: waiting for it then frees
        nothing, so wait again for the next one until a buffer is free."""
        waited = False
        while self._free.empty():
            oldest = oldest_in_flight()
            if oldest is None:  # every buffer is in a bucket still filling
                break
            oldest.wait()
            waited = True
        self.waits += waited
        try:
            return self._free.get_nowait()
        except queue.Empty:
            return self._new()

    def give(self, flat: torch.Tensor) -> None:
        self._free.put(flat)


class _Stepped:
    """The workload's optimizer once ``finish`` has stepped the shard and gathered the
    parameters: its step has nothing left to do (``opt`` is the one replaced)."""

    def __init__(self, opt: Any) -> None:
        self.opt = opt

    def step(self) -> None:
        pass


class ShardedStrategy(Strategy):
    """What the sharded strategies share (``ZeroStrategy`` and its HSDP, ``zero3``): shards
    kept and stepped in host memory, ``--algo`` for their two collectives, and the
    workload's parameters and SGD settings taken over (``take_workload``)."""

    needs_model = True  # it steps the workload's parameters with the workload's SGD settings
    #: --algo: ``native`` = the backend's reduce_scatter_v and allgather_v; ``ring`` = the
    #: project's ring forms of the two on point-to-point messages (``comm.p2pcoll``);
    #: ``hier`` = topology-aware, inside the node then across (``comm.shardcoll``)
    uses_algo = True
    algos = ("native", "ring", "hier")
    #: what it keeps in host memory, for the message refusing a model on a device
    held: ClassVar[str] = "its shards"

    @classmethod
    def check(cls, comm: Communicator, algo: str) -> None:
        super().check(comm, algo)
        if algo == "hier":
            check_two_level(comm.topo, f"--strategy {cls.name}")
        device = comm.placement().device
        if device.type != "cpu":
            raise ValueError(f"--strategy {cls.name} keeps {cls.held} in host memory and "
                             f"steps them there: not built for a model on {device.type} "
                             "yet; use --device cpu, or --strategy bucketed")

    def resolve_algo(self) -> None:
        """Called first in a constructor: the run's algorithm (``self.algo``), checked."""
        self.algo = self.algos_for([self.settings.algo])[0]
        self.check(self.comm, self.algo)

    def take_workload(self, workload: Any) -> list[torch.Tensor]:
        """The workload's parameters (returned; shaped as the gradients, of one dtype:
        ``self.dtype``) and its SGD settings (``self.sgd``); the workload's optimizer is
        replaced by one whose step has nothing left to do (``finish`` steps the shards)."""
        params = list(workload.params)
        if [p.shape for p in params] != [g.shape for g in self.grads]:
            raise ValueError(f"--strategy {self.name}: the workload's parameters do not "
                             "match its gradients")
        dtypes = {g.dtype for g in self.grads}
        if len(dtypes) != 1:
            raise ValueError(f"--strategy {self.name}: gradients of several dtypes "
                             f"({', '.join(sorted(map(str, dtypes)))}); its shards hold one")
        self.dtype = self.grads[0].dtype
        self.sgd = SGDHyper.of(workload.opt, self.name)
        workload.opt = _Stepped(workload.opt)
        return params

    #: ``model_state_bytes_peak`` of the last step (``record_fields``)
    _last_peak = 0

    def record_fields(self, kind: str, steps: Sequence[dict] = ()) -> dict:
        """Per step: this rank's ``model_state_bytes_peak``, the peak of what the strategy
        itself holds of the model's state, counted from its own live tensors (each
        strategy's docstring says which); the summary: its largest over steps and ranks."""
        key = "model_state_bytes_peak"
        if kind == "summary":
            peaks = [p for r in steps for p in [r.get(key), *r.get("ranks", {}).get(key, [])]
                     if p is not None]
            return {key: max(peaks)} if peaks else {}
        return {key: self._last_peak}

    def optimizer_knob(self) -> dict:
        """``knobs.optimizer``: the SGD settings its shards step with, and the state."""
        return {"name": "SGD", **asdict(self.sgd),
                "state": "momentum of this rank's shard" if self.sgd.momentum else "none"}


class ZeroStrategy(ShardedStrategy):
    """ZeRO stage ``stage`` (module docstring): ``Zero1Strategy``, ``Zero2Strategy``."""

    held = "its buckets and shards"
    settings_class: type[ZeroSettings] = ZeroSettings
    settings: ZeroSettings
    #: 1: the whole gradient kept in a buffer per bucket; 2: only the shard (``ZERO2_BUFFERS``)
    stage: ClassVar[int] = 0

    def __init__(self, comm: Communicator, grads: Sequence[torch.Tensor],
                 settings: ZeroSettings | None = None, *,
                 backward_order: Sequence[int] | None = None, workload: Any = None) -> None:
        super().__init__(comm, grads, settings, backward_order=backward_order,
                         workload=workload)
        self.resolve_algo()
        params = self.take_workload(workload)  # finish steps and gathers
        self.bucket_mb = float(self.settings.bucket_mb)
        self.first_bucket_mb = float(self.settings.first_bucket_mb)
        groups = assign_buckets([g.numel() * g.element_size() for g in self.grads],
                                self.backward_order, self.bucket_mb * MB,
                                first_cap_bytes=self.first_bucket_mb * MB)
        shard_rank, shard_ranks = self.shard_place()
        with torch.no_grad():
            self.buckets = [_Bucket(idx, params, shard_rank, shard_ranks) for idx in groups]
        self._bucket_of = {i: b for b in self.buckets for i in b.indices}
        self._pool: _BufferPool | None = None
        largest = max(b.numel for b in self.buckets)
        if self.stage == 1 or ZERO2_BUFFERS * largest >= sum(b.numel for b in self.buckets):
            # zero2 with few large buckets (ResNet-18 at DDP's 25 MB: 3, two of the largest
            # 50.6 MB against 46.8 MB in all): a pool would hold more than a buffer each
            for b in self.buckets:
                b.hold(torch.empty(b.numel, dtype=self.dtype), self.grads)
        else:
            self._pool = _BufferPool(largest, self.dtype, ZERO2_BUFFERS)
        # A collective (its communicator's dup): every rank opens its engine here, and asks
        # for the engine's groups on this thread, where a backend may make them collectively
        self._engine = TransferEngine(comm, "thread")
        self._coll = self.open_collectives(self._engine.comm)
        self._next = 0  # the first bucket not yet handed to the engine
        self.begin_step(self.timer)

    def shard_place(self) -> tuple[int, int]:
        """(this rank's part, the parts) of every bucket: the job's rank and size; a strategy
        that shards over fewer ranks (HSDP: the node's) says so here."""
        return self.comm.rank, self.comm.size

    def open_collectives(self, engine_comm: Communicator) -> ShardCollectives:
        """The reduce-scatter and all-gather of ``--algo`` over the job's ranks, on the
        engine's communicator (``commbench.comm.shardcoll``). Called once, on the main
        thread, where a backend may make groups collectively; a strategy that shards over
        other groups makes them here."""
        return shard_collectives(self.algo, engine_comm)

    # -- backward: buckets filled, reduce-scattered in order ---------------------------------

    def begin_step(self, timer: StepTimer | NullTimer) -> None:
        super().begin_step(timer)
        if self._next not in (0, len(self.buckets)):
            raise RuntimeError(f"{self.name}: a step began before the previous one finished")
        for b in self.buckets:
            b.pending = set(b.indices)
            b.scatter = b.gather = None
            b.reduction = []
        self._next = 0

    def on_ready(self, i: int) -> None:
        b = self._bucket_of[i]
        if i not in b.pending:
            raise RuntimeError(f"{self.name}: gradient {i} announced twice in one step")
        self._fill(b, [i])
        if not b.pending:
            self._start_ready_buckets()

    def _fill(self, b: _Bucket, indices: Sequence[int]) -> None:
        """Copy gradients ``indices`` of ``b`` into its buffer (lent first under zero2)."""
        if b.buffer is None:
            self._lend(b)
        for i in indices:
            b.views[i].copy_(self.grads[i])
        b.pending.difference_update(indices)

    def _lend(self, b: _Bucket) -> None:
        """zero2: give ``b`` a buffer from the pool."""
        assert self._pool is not None  # zero1's buckets hold theirs for good
        b.hold(self._pool.take(self._oldest_in_flight), self.grads)

    def _oldest_in_flight(self) -> Transfer | None:
        return next((b.scatter for b in self.buckets[:self._next] if not b.scatter.test()),
                    None)

    def _start_ready_buckets(self) -> None:
        """Hand the engine every full bucket's reduce-scatter with no unstarted bucket before
        it: every rank issues them in one order whatever order its gradients came in."""
        while self._next < len(self.buckets) and not self.buckets[self._next].pending:
            self._submit_reduction(self.buckets[self._next])
            self._next += 1

    def _submit_reduction(self, b: _Bucket) -> None:
        """Hand the engine the full bucket ``b``'s reduction: its reduce-scatter, whose mean
        lands in the gradient shard."""
        b.scatter = self._engine.submit(b.buffer, after=partial(self._take_mean, b),
                                        run=partial(self._reduce_scatter, b))
        b.reduction = [(b.scatter, "reduce_scatter", b.numel * self.dtype.itemsize)]

    def _reduce_scatter(self, b: _Bucket, buffer: torch.Tensor) -> None:
        """On the engine's thread: this rank's part of the bucket's sum."""
        b.summed = self._coll.reduce_scatter(buffer, b.counts)

    def _take_mean(self, b: _Bucket) -> None:
        """On the engine's thread, once the sum is in: its mean into the gradient shard; under
        zero2 the buffer goes back to the pool."""
        torch.div(b.summed, self.comm.size, out=b.grad)
        b.summed = None
        self._give_back(b)

    def _give_back(self, b: _Bucket) -> None:
        """zero2: ``b``'s buffer back to the pool (on the engine's thread)."""
        if self._pool is not None:
            self._pool.give(b.lent)
            b.lent = b.buffer = None
            b.views = {}

    # -- after backward: the shard stepped, the parameters gathered --------------------------

    def _reduce(self) -> None:
        """Start what backward left (gradients never announced are taken as they are), wait
        for every bucket's reduction, and record each of its collectives."""
        for b in self.buckets[self._next:]:
            if b.pending:
                self._fill(b, list(b.pending))
            self._start_ready_buckets()
        for b in self.buckets:
            for t, phase, nbytes in b.reduction:
                t.wait()
                self._record(t, phase, nbytes)

    def _record(self, t: Transfer, phase: str, nbytes: int) -> None:
        """One collective's flight, the engine's stamps; its time also under ``phase``."""
        self.timer.comm(t.start, t.end, nbytes)
        if self.timer.comm_phase is not None:
            self.timer.comm_phase(phase, t.start, t.end)

    def _allgather(self, part: torch.Tensor, counts: list[int], out: torch.Tensor) -> None:
        """On the engine's thread: every rank's ``part`` into ``out``."""
        self._coll.allgather(part, counts, out)

    def finish(self) -> None:
        self._reduce()
        with self.timer.compute("optimizer"):
            for b in self.buckets:
                b.momentum = sgd_step(b.param, b.grad, b.momentum, self.sgd)
                b.gather = self._engine.submit(
                    b.params.flat, run=partial(self._allgather, b.param, b.counts))
        for b in self.buckets:
            b.gather.wait()
            # counted in comm_bytes at the reduce-scatter (module docstring)
            self._record(b.gather, "allgather", 0)
        self._last_peak = self._model_state_bytes()

    def _grad_buffer_elements(self) -> int:
        """The gradient buffers' elements: one a bucket (zero1), else what the pool made."""
        if self._pool is None:
            return sum(b.numel for b in self.buckets)
        return self._pool.made * self._pool.numel

    def _model_state_bytes(self) -> int:
        """What this rank's strategy holds of the model's state: the parameters whole (the
        buckets' flat buffers, which the workload's parameters are views of), its shards
        (parameters, mean gradients, momentum) and the gradient buffers."""
        whole = sum(b.params.flat.numel() for b in self.buckets)
        shards = sum(b.param.numel() + b.grad.numel()
                     + (b.momentum.numel() if b.momentum is not None else 0)
                     for b in self.buckets)
        return (whole + shards + self._grad_buffer_elements()) * self.dtype.itemsize

    def validation_pass(self, backward_order: Sequence[int]) -> None:
        """Reduce-scatter the values in ``grads`` as a step does, then gather every rank's
        mean shard back into them, so that the closed-form check (``validate.count_wrong``)
        sees every element of every shard; no step is taken."""
        self.begin_step(NullTimer())
        for i in backward_order:
            self.on_ready(i)
        self._reduce()
        for b in self.buckets:
            whole = FlatBuffer([self.grads[i] for i in b.indices])
            self._engine.submit(whole.flat,
                                run=partial(self._allgather, b.grad, b.counts)).wait()
            whole.unpack([self.grads[i] for i in b.indices])

    def knobs(self) -> dict:
        size, itemsize = self.comm.size, self.dtype.itemsize
        numels = [b.numel for b in self.buckets]
        held = self._grad_buffer_elements()
        return {**super().knobs(), "stage": self.stage, "bucket_mb": self.bucket_mb,
                "first_bucket_mb": self.first_bucket_mb, "buckets": len(self.buckets),
                "bucket_bytes": [n * itemsize for n in numels],
                "algo": self.algo,
                "collective": self._coll.describe() + ", on the engine thread",
                "shard_elements_ranks": [sum(shard_counts(n, size)[r] for n in numels)
                                         for r in range(size)],
                "library_bytes_per_step_ranks": [library_bytes(numels, size, r, itemsize)
                                                 for r in range(size)],
                "grad_buffer_bytes": held * itemsize,
                "grad_buffer_waits": self._pool.waits if self._pool is not None else 0,
                "optimizer": self.optimizer_knob()}

    def close(self) -> None:
        """Stop the transfer engine (after its last transfer)."""
        self._engine.close()


class Zero1Strategy(ZeroStrategy):
    name = "zero1"
    settings_class = Zero1Settings
    stage = 1


class Zero2Strategy(ZeroStrategy):
    name = "zero2"
    settings_class = Zero2Settings
    stage = 2
