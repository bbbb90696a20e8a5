"""Bucketed all-reduce, DDP-style: buckets reduced while backward still runs.

1. Once, from the gradients' shapes and the order backward produces them,
   group the gradients into buckets of at most ``bucket_mb`` MB (MB = 2**20
   bytes, as DDP's ``bucket_cap_mb``). A tensor larger than the cap gets a
   bucket of its own; ``bucket_mb=0`` gives one bucket per tensor. Each
   bucket owns a flat buffer.
2. As backward produces gradient ``i`` (``on_ready``), copy it into its
   bucket's buffer (DDP copies too when gradients are not views of its
   buckets; here the workload owns the gradient tensors).
3. When a bucket's last gradient is in, start its non-blocking all-reduce
   (``comm.iallreduce``), but never before every earlier bucket's: all ranks
   then issue their collectives in the same order whatever order their
   gradients arrive in (MPI matches collectives by issue order; DDP has the
   same rule).
4. While compute runs, ``poll`` tests the handles in flight: Open MPI
   advances a non-blocking collective only inside MPI calls (docs/strategies.md).
   Horovod progresses on its own thread; the test only observes.
   ``progress="thread"`` (``--progress thread``) instead hands each full bucket
   to the strategy's transfer engine (``commbench.comm.engine``): one
   background thread on a communicator of its own runs the buckets in order
   (Horovod's design), so transfers advance whatever the main thread does,
   and unpacks each bucket as its sum arrives, so the compute loop is not
   woken to poll (on 8 ranks sharing 2 cores, each rank's 2000 wake-ups a
   second took CPU the transfers needed).
   ``--transfer thread`` runs each as the backend's tuned blocking
   all-reduce rather than Open MPI's non-blocking one (libnbc), which is
   much slower across nodes; ``--transfer ring`` as the project's ring on
   point-to-point messages tested between sleeps (lighter on the CPU);
   ``--transfer hier`` as the two-level all-reduce (in the node, across
   nodes on the ring, in the node: fewer bytes through each node link where
   nodes hold several ranks).
   ``auto`` (the default) is the ring wherever the backend has
   point-to-point messages: Open MPI's tuned all-reduce moves large
   messages by its ``put`` pipeline, which runs at about half the link when
   ranks enter apart, as back-to-back buckets do (``PREFERRED_PATH``).
5. A bucket that ``poll`` sees complete is divided by the rank count
   into its gradients at once, while backward still runs (DDP divides in its
   hook too; with ``gradient_as_bucket_view`` it needs no copy at all).
   ``finish`` waits for the rest, then unpacks them.

Comm time is what was really in flight. Polling: each bucket from its issue
to the moment its handle was first seen complete (a test in ``poll`` or
the wait in ``finish``), so with polling every 0.5 ms an end is late by at
most that. Engine: from when the engine began the bucket (not when it was
queued behind earlier ones) to when it finished, the engine's own stamps.
Exposed sync (step - compute) and overlap (1 - exposed/comm) follow.
Where the buckets stay on a GPU (NCCL) both ends are device events, read when
the step ends (``commbench.timing``): the issue is an event on the compute
stream as the bucket is started (complete once its gradients are, not when
the host queued them), the end an event on a stream of the strategy's own (or
the engine's) queued behind the collective (``Handle.wait_on_device``), so it
completes when the collective does, not when a poll sees it; the gradient-ready
stamps of ``--bucket-mb auto`` are events too. Staged buckets (a GPU's
gradients through pinned host memory) start when their copy to the host is
done, which the host sees: host stamps are right there.

Differences from DDP (Li et al., VLDB 2020, https://arxiv.org/abs/2006.15704):
caps are upper bounds here (DDP closes a bucket once it reaches the cap); the
first bucket's cap is ``first_bucket_mb`` (default DDP's 1 MiB, so the first
all-reduce starts early in backward); buckets stay as built from the order given at
construction (DDP rebuilds them once from the order of the first iteration);
the mean is taken after the sum, as ``flat`` does, not by pre-dividing.

Built like every strategy (``Strategy.__init__``); ``backward_order`` is the
order the buckets follow. Its settings are ``BucketedSettings``:

    bucket_mb: bucket cap in MB (2**20 bytes); 0 = one all-reduce per tensor;
        ``auto``: DDP's 25 for the first step, then the cap that
        ``commbench.buckets.choose_cap`` predicts ends sync soonest after
        backward, from a probe of the transfer paths at construction (all-reduces
        of 8 KiB to 8 MiB: ``commbench.buckets.ProbeCost``) and the first step's
        gradient times; with several engine paths probed (``--transfer auto``:
        ``commbench.comm.engine.engine_paths``), also ``by-size`` (each bucket
        on the path priced cheapest for its size). Rank 0 decides, every
        rank rebuilds its buckets (DDP too rebuilds its buckets once, after the
        first iteration). The tuner is an object of its own, ``BucketTuner``
        (``commbench.strategies.tuner``), the strategy's ``tuner``; records carry
        its record under ``knobs.bucket_mb_auto``.
    first_bucket_mb: the first bucket's cap (default 1, DDP's).
    compression: ``none``, ``fp16`` or ``bf16`` (buckets hold that dtype).
    progress: ``thread`` (default: the transfer engine runs the buckets in
        order) or ``poll`` (MPI non-blocking all-reduce, tested from
        ``progress``). Measured on 2 emulated nodes x 4 ranks, 1 Gbit/s,
        ResNet-50, 25 MB buckets: exposed sync 1.68 s with a comm thread
        running blocking all-reduces, 4.67 s polling Open MPI's iallreduce
        (flat native: 2.21 s).
    transfer: with ``progress="thread"``, the engine's path: ``thread``,
        ``ring``, ``hier`` (``commbench.comm.engine.TRANSFER_PATHS``) or ``auto``.

Example::

    mpirun -np 4 python -m commbench.allreduce --strategy flat,bucketed --algo native \\
        --bucket-mb 25 --compute-ms 300
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from commbench.buckets import (
    AUTO,
    DEFAULT_BUCKET_MB,
    FIRST_BUCKET_MB,
    MB,
    assign_buckets,
    parse_bucket_mb,
)
from commbench.comm.base import Communicator, Handle
from commbench.comm.engine import (
    AUTO_PATH,
    PATH_COLLECTIVE,
    TRANSFER_PATHS,
    TransferEngine,
    engine_paths,
    resolve_path,
)
from commbench.flags import flag, nonneg_float
from commbench.flatbuf import FlatBuffer
from commbench.strategies.base import Strategy, unpack_mean
from commbench.strategies.settings import COMPRESSIONS, EngineSettings, check_choice
from commbench.strategies.tuner import BY_SIZE, HANDOFF_BYTES, BucketTuner
from commbench.timing import NullTimer, StepTimer, device_events, now

#: --transfer auto's path: back-to-back buckets on the project's ring (peer_fairness, 2 x 1 at
#: 1 Gbit/s, ResNet-18: Open MPI's tuned all-reduce ran them at 0.72 of the link, the ring
#: at 0.97); the backend's all-reduce where it has no point-to-point messages
PREFERRED_PATH = "ring"
#: ``--progress``: how bucketed's all-reduces advance while backward computes
PROGRESS = ("poll", "thread")


def bucket_mb_arg(text: str) -> float | str:
    """``--bucket-mb``'s argparse type: MB >= 0, or ``auto``."""
    try:
        return parse_bucket_mb(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--bucket-mb: ")) from None


def bucket_cap_mb(bucket_mb: float | str) -> float:
    """A fixed cap: ``bucket_mb``, or DDP's default where it is ``auto`` (which only the
    bucketed strategy resolves, from its probe)."""
    return DEFAULT_BUCKET_MB if bucket_mb == AUTO else float(bucket_mb)


def check_bucket_flags(bucket_mb: float | str, first_bucket_mb: float) -> None:
    """``--bucket-mb`` (MB >= 0 or auto) and ``--first-bucket-mb`` (finite, >= 0), for every
    strategy that groups gradients into buckets; a ValueError naming the flag."""
    parse_bucket_mb(bucket_mb)
    if not 0 <= first_bucket_mb < math.inf:
        raise ValueError(f"--first-bucket-mb must be a finite number >= 0, "
                         f"got {first_bucket_mb}")


@dataclass(frozen=True)
class BucketedSettings(EngineSettings):
    """``bucketed``'s settings: the common ones, the engine's ``transfer``, and its buckets.

    Args:
        bucket_mb: the cap in MB; 0 = per tensor; ``auto``: the tuner's (``BucketTuner``).
        first_bucket_mb: the first bucket's cap.
        progress: ``thread`` (the transfer engine, on ``transfer``) or ``poll``.

    Example::

        make_strategy("bucketed", comm, grads, BucketedSettings(bucket_mb=5, transfer="ring"))
    """

    bucket_mb: float | str = flag(
        "--bucket-mb", default=DEFAULT_BUCKET_MB, metavar="MB|auto", type=bucket_mb_arg,
        help="--strategy bucketed, ddp, zero1 and zero2: bucket cap in MB (2**20 bytes, as "
             "DDP's bucket_cap_mb); 0 = one collective per tensor; auto (bucketed): the cap a "
             "probe of the transfer path and the first step's gradient times predict ends "
             "sync soonest (DDP then keeps its default, 25; zero1 and zero2 refuse it)")
    first_bucket_mb: float = flag(
        "--first-bucket-mb", default=FIRST_BUCKET_MB, metavar="MB", type=nonneg_float,
        help="--strategy bucketed, zero1 and zero2: the first bucket's cap, DDP's 1 MiB by "
             "default, so the first collective starts early in backward")
    progress: str = flag(
        "--progress", default="thread", choices=PROGRESS,
        help="--strategy bucketed: how buckets' all-reduces advance during backward: poll = "
             "MPI non-blocking all-reduce tested from the compute loop, thread = blocking "
             "all-reduces on a comm thread (Horovod's design)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bucket_flags(self.bucket_mb, self.first_bucket_mb)
        check_choice("progress", self.progress, PROGRESS)

    @property
    def bucket_cap_mb(self) -> float:
        """The cap of the first step: ``bucket_mb``, or DDP's default under ``auto``."""
        return bucket_cap_mb(self.bucket_mb)

    @property
    def engine_transfer(self) -> str | None:
        """``--transfer``, which applies under ``--progress thread`` only."""
        return self.transfer if self.progress == "thread" else None


class _Bucket:
    """One bucket: its gradients' indices and the flat buffer MPI reduces.

    On a GPU the gradients are packed into a device buffer (``dev``) and the
    full bucket is staged into a pinned host ``buffer`` by an asynchronous copy;
    ``staged`` is the CUDA event that says the copy is done (MPI here is not
    CUDA-aware). On a CPU, or where the backend's collectives take device tensors
    (``on_device``: NCCL), ``buffer`` is packed directly.
    """

    __slots__ = ("indices", "buffer", "dev", "views", "nbytes", "pending", "handle", "start",
                 "staged", "path", "start_mark", "end_mark")

    def __init__(self, indices: list[int], grads: Sequence[torch.Tensor],
                 dtype: torch.dtype | None = None, on_device: bool = False) -> None:
        self.indices = indices
        packed = FlatBuffer([grads[i] for i in indices], dtype=dtype)  # on their device
        gpu = packed.flat.device.type == "cuda" and not on_device
        self.dev = packed.flat if gpu else None
        self.buffer = torch.empty(packed.flat.numel(), dtype=packed.flat.dtype,
                                  pin_memory=True) if gpu else packed.flat
        self.views: dict[int, torch.Tensor] = dict(zip(indices, packed.views))
        self.nbytes = self.buffer.numel() * self.buffer.element_size()
        self.pending: set[int] = set()
        self.handle: Handle | None = None
        self.start = 0.0
        #: on a device, under --progress poll: events at the issue and behind the collective
        self.start_mark = self.end_mark = None
        self.staged = None  # torch.cuda.Event once the device-to-host copy is queued
        self.path: str | None = None  # by-size: its transfer path (None: the engine's)

    def stage(self) -> None:
        """Queue the copy of the packed device buffer to the host (GPU only)."""
        if self.dev is not None and self.staged is None:
            self.buffer.copy_(self.dev, non_blocking=True)
            self.staged = torch.cuda.Event()
            self.staged.record()

    def on_host(self, block: bool) -> bool:
        """Whether the host buffer holds the bucket (waiting for it if ``block``)."""
        if self.dev is None:
            return True
        self.stage()
        if block:
            self.staged.synchronize()
            return True
        return self.staged.query()


class BucketedStrategy(Strategy):
    name = "bucketed"
    settings_class = BucketedSettings
    settings: BucketedSettings

    def __init__(self, comm: Communicator, grads: Sequence[torch.Tensor],
                 settings: BucketedSettings | None = None, *,
                 backward_order: Sequence[int] | None = None, workload: Any = None) -> None:
        super().__init__(comm, grads, settings, backward_order=backward_order,
                         workload=workload)
        first_bucket_mb = self.settings.first_bucket_mb
        progress = self.settings.progress
        self.progress = progress
        self.transfer = resolve_path(comm, self.settings.transfer, PREFERRED_PATH)
        # progress="thread": opened at the first bucket (a collective: every rank starts
        # its buckets in the same order), closed by close(); auto's probe opens one per path
        self._engines: dict[str, TransferEngine] = {}
        # --bucket-mb auto: DDP's default cap until the first step's gradient times are in
        self.bucket_mb = self.settings.bucket_cap_mb
        self.first_bucket_mb = float(first_bucket_mb)
        # Caps count the gradients' own bytes, as DDP's do: its fp16 hook compresses each
        # bucket after bucketing, so a 25 MB bucket of float32 sends 12.5 MB.
        self._cast = COMPRESSIONS[self.compression]
        self._build(self.bucket_mb)
        #: the device clock of the buffers the collectives take, where they stay on a GPU
        #: (NCCL); None where they are in host memory (staged or on a CPU)
        self.events = device_events(self.buckets[0].buffer.device) if self.buckets else None
        #: under --progress poll on a device: the stream each bucket's end is marked on,
        #: queued behind its collective (a stream of its own: not the compute stream)
        self._seen = None
        self._next = 0  # first bucket not yet started; buckets start strictly in order
        self._in_flight: list[_Bucket] = []
        # The engine unpacks each bucket on its own thread, so nothing needs driving
        # from the compute loop, unless MPI's non-blocking collectives advance only
        # when tested (poll) or buckets wait for their copy off a GPU (stage).
        gpu = any(b.dev is not None for b in self.buckets)
        self.poll = self._drive if progress == "poll" or gpu else None
        #: --bucket-mb auto's tuner (None for a fixed cap): its probe runs now, its choice
        #: after the first timed step
        self.tuner: BucketTuner | None = None
        if self.settings.bucket_mb == AUTO:
            self.tuner = BucketTuner(self._tuner_paths(), PREFERRED_PATH,
                                     wire_ratio=self._wire_ratio())
            self.tuner.measure(self._time_transfers, like=self.buckets[0].buffer,
                               time_handoffs=self._time_handoffs
                               if self.progress == "thread" else None)
        self.begin_step(self.timer)

    def _build(self, bucket_mb: float) -> None:
        """The buckets at this cap (in ``backward_order``), each with its buffer."""
        groups = assign_buckets([g.numel() * g.element_size() for g in self.grads],
                                self.backward_order,
                                bucket_mb * MB, [g.dtype for g in self.grads],
                                first_cap_bytes=self.first_bucket_mb * MB)
        self.buckets = [_Bucket(idx, self.grads, self._cast, self.comm.device_collectives)
                        for idx in groups]
        self._bucket_of = {i: b for b, bucket in enumerate(self.buckets) for i in bucket.indices}

    # -- --bucket-mb auto: what the tuner needs of the strategy, and its choice taken --------

    def _tuner_paths(self) -> list[str]:
        """The transfer paths the tuner chooses among: every engine path that runs
        differently on this layout (``engine_paths``) where ``--transfer auto`` and the
        backend has point-to-point messages (the preferred first), else the one this
        strategy runs (``iallreduce`` under ``--progress poll``)."""
        if self.progress != "thread":
            return ["iallreduce"]
        # A library that runs queued ops itself (Horovod) fuses the buckets queued in a
        # cycle into one message, so its transfers are not the probe's sizes and the
        # schedule cannot price them: there auto takes the preferred path where it can
        # (peer_fairness, ResNet-18 under horovodrun on 2 x 2: 1 MB buckets on Horovod
        # exposed 225 ms against 93 predicted, 1.21 x hvd.DistributedOptimizer's step).
        if self.settings.transfer != AUTO_PATH or not self.comm.supports_p2p:
            return [self.transfer]
        if self.comm.progresses_itself:
            return [PREFERRED_PATH]
        return [PREFERRED_PATH, *(p for p in engine_paths(self.comm) if p != PREFERRED_PATH)]

    def _time_transfers(self, t: torch.Tensor, path: str, n: int) -> list[float]:
        """Seconds each of ``n`` all-reduces of ``t`` takes on transfer path ``path``,
        queued back to back as a step's buckets are: each starts when the one before
        ends on this rank, so ranks enter it apart, as they enter a step's buckets.
        Open MPI's large messages run at about half the link so (its put pipeline);
        probed one at a time, ranks entered together and its 8 MiB took 70 ms against
        the ring's 71 on 2 x 1, and auto put ResNet-50's 0.5 MB buckets on it (exposed
        309 ms against 37 predicted, DDP's 146)."""
        if path == "iallreduce":
            times = []
            for _ in range(n):
                t0 = now()
                self.comm.iallreduce(t).wait()
                times.append(now() - t0)
            return times
        engine = self._open_engine(path)
        # the library fuses what is queued in one of its cycles (Horovod): queued back to
        # back, three 8 MiB transfers went as one of 24 and their times said nothing of
        # 8 MiB; one at a time each is its own size
        alone = path == "thread" and self.comm.progresses_itself
        handles = []
        for _ in range(n):
            handles.append(engine.submit(t))
            if alone:
                handles[-1].wait()
        handles[-1].wait()
        return [h.seconds() for h in handles]

    def _time_handoffs(self, path: str, n: int) -> list[tuple[float, float]]:
        """``(pickup_s, handback_s)`` of each of ``n`` transfers of ``HANDOFF_BYTES`` on path
        ``path``'s engine, each submitted while the engine idles and waited for: from the
        submit to the engine's start (its thread woken from its queue), and from the
        engine's end to this thread running again (woken by the transfer's event). A
        transfer's own time (``_time_transfers``) leaves both out; a step pays the first
        for every bucket handed to an idle engine and the second at its final wait
        (``commbench.buckets.schedule``)."""
        engine = self._open_engine(path)
        like = self.buckets[0].buffer
        t = torch.zeros(max(1, HANDOFF_BYTES // like.element_size()), dtype=like.dtype,
                        device=like.device)
        pairs = []
        for _ in range(n):
            h = engine.submit(t)
            h.wait()
            back = now()
            pairs.append((h.start - h.queued, back - h.end))
        return pairs

    def _wire_ratio(self) -> float:
        """Bytes on the wire per byte of gradient (0.5 under fp16 or bf16 compression)."""
        return self.buckets[0].buffer.element_size() / self.grads[0].element_size()

    def _choose(self) -> None:
        """The tuner chooses (rank 0 for every rank); every rank then rebuilds its buckets
        at the chosen cap, on the chosen path, and closes the engines it no longer needs."""
        assert self.tuner is not None
        choice = self.tuner.choose(self.comm, [g.numel() * g.element_size() for g in self.grads],
                                   self.backward_order, [g.dtype for g in self.grads],
                                   self.first_bucket_mb * MB)
        if choice is None:
            return
        chosen = choice["chosen_path"]
        if chosen in TRANSFER_PATHS:
            self.transfer = chosen
        elif chosen == BY_SIZE:
            self.transfer = PREFERRED_PATH
        for path in [p for p in self._engines if p != self.transfer]:  # in the same order
            self._engines.pop(path).close()
        if choice["chosen"] != self.bucket_mb:
            self.bucket_mb = float(choice["chosen"])
            self._build(self.bucket_mb)
        if chosen == BY_SIZE:  # every rank prices its buckets alike: rank 0's probe
            paths = self.tuner.paths_by_size([b.nbytes / self._wire_ratio()
                                              for b in self.buckets])
            for b, path in zip(self.buckets, paths):
                b.path = path

    def begin_step(self, timer: StepTimer | NullTimer) -> None:
        super().begin_step(timer)
        if self._in_flight or self._next not in (0, len(self.buckets)):
            raise RuntimeError("bucketed: a step began before the previous one finished")
        if self.tuner is not None:
            if self.tuner.due:
                self._choose()  # as DDP rebuilds its buckets after the first iteration
            self.tuner.begin_step()
        for b in self.buckets:
            b.pending = set(b.indices)
            b.handle = None
        self._next = 0

    def on_ready(self, i: int) -> None:
        bucket = self.buckets[self._bucket_of[i]]
        if i not in bucket.pending:
            raise RuntimeError(f"bucketed: gradient {i} announced twice in one step")
        if self.tuner is not None:
            self.tuner.stamp(i, self.timer)
        bucket.views[i].copy_(self.grads[i])
        bucket.pending.discard(i)
        if not bucket.pending:
            bucket.stage()
            self._start_ready_buckets()

    def _start_ready_buckets(self, block: bool = False) -> None:
        """Start every bucket that is full (and on the host) with no unstarted bucket before it."""
        while self._next < len(self.buckets) and not self.buckets[self._next].pending:
            b = self.buckets[self._next]
            if not b.on_host(block):
                return  # its copy from the GPU is still running; poll() comes back
            b.staged = None
            b.start = self.timer.clock()
            if self.progress == "poll" and self.events is not None \
                    and self.timer.events is not None:
                b.start_mark = self.timer.mark()  # on the compute stream
                if self._seen is None:
                    self._seen = self.events.new_stream()
            if self.progress == "thread":
                b.handle = self._open_engine().submit(
                    b.buffer, after=partial(self._unpack, b) if self._engine_unpacks(b) else None,
                    path=b.path)
            else:
                b.handle = self.comm.iallreduce(b.buffer)
                if b.start_mark is not None:  # its end: an event behind it, off the compute
                    with self.events.using(self._seen):  # stream, which does not wait
                        b.handle.wait_on_device()
                        b.end_mark = self.events.mark(self._seen)
            self._in_flight.append(b)
            self._next += 1

    def _open_engine(self, path: str | None = None) -> TransferEngine:
        """The engine of ``path`` (default: the one buckets run on), opened at first use."""
        path = path or self.transfer
        if path not in self._engines:
            self._engines[path] = TransferEngine(self.comm, path, events=self.events)
        return self._engines[path]

    def _test_in_flight(self) -> list[_Bucket]:
        """Test every bucket in flight; record the end of those seen complete; return them."""
        done, still = [], []
        for b in self._in_flight:
            if b.handle.test():
                self._record_flight(b)
                done.append(b)
            else:
                still.append(b)
        self._in_flight = still
        return done

    def _record_flight(self, b: _Bucket) -> None:
        """Record completed bucket ``b``'s flight: the engine's stamps (begun, finished),
        else (issued, now = first seen complete); on a device, the same as events."""
        if self.progress == "thread":
            h = b.handle
            if h.on_device and self.timer.events is not None:
                self.timer.device_comm(h.start_mark, h.end_mark, b.nbytes)
            else:
                self.timer.comm(h.start, h.end, b.nbytes)
        elif b.start_mark is not None:
            self.timer.device_comm(b.start_mark, b.end_mark, b.nbytes)
            b.start_mark = b.end_mark = None
        else:
            self.timer.comm(b.start, self.timer.clock(), b.nbytes)

    def _drive(self) -> None:
        """Drive the buckets in flight; unpack those that completed."""
        self._start_ready_buckets()
        if self._in_flight:
            for b in self._test_in_flight():
                self._unpack_here(b)

    def _unpack_here(self, b: _Bucket) -> None:
        """Unpack on this thread unless the engine already has."""
        if not self._engine_unpacks(b):
            self._unpack(b)

    def _engine_unpacks(self, b: _Bucket) -> bool:
        """Whether the engine's thread unpacks ``b`` as its sum arrives (a bucket in host
        memory). A staged bucket's copy back is stream-ordered on this thread; one that
        stays on the GPU is unpacked here in ``finish``, on the compute stream after
        backward's end, not queued there from the engine's thread in the middle of
        backward (its kernels would count as compute; DDP's copy-back also follows
        backward)."""
        return self.progress == "thread" and b.dev is None and self.events is None

    def _unpack(self, b: _Bucket) -> None:
        """Write the bucket's mean into its gradients (final: backward is done with them).

        Division and copy in one pass.
        """
        if b.dev is not None:
            b.dev.copy_(b.buffer, non_blocking=True)  # stream-ordered before the division
        for i, v in b.views.items():
            unpack_mean(v, self.grads[i], self.comm.size)

    def finish(self) -> None:
        # Gradients never announced (a workload that skips on_ready) are taken as they are.
        for b in self.buckets[self._next:]:
            for i in list(b.pending):
                b.views[i].copy_(self.grads[i])
            b.pending.clear()
        self._start_ready_buckets(block=True)
        # Complete everything before unpacking: host work here would stall the
        # transfers still in flight, which advance only inside MPI calls.
        done: list[_Bucket] = []
        while self._in_flight:
            done += self._test_in_flight()  # those already complete end now, not after a wait
            if self._in_flight:
                b = self._in_flight.pop(0)
                b.handle.wait()
                self._record_flight(b)
                done.append(b)
        for b in done:
            self._unpack_here(b)
        if self.tuner is not None:
            self.tuner.end_step(self.timer)

    def knobs(self) -> dict:
        return {**super().knobs(), "bucket_mb": self.bucket_mb,
                "bucket_mb_auto": self.tuner.record if self.tuner is not None else None,
                "first_bucket_mb": self.first_bucket_mb, "buckets": len(self.buckets),
                "bucket_bytes": [b.nbytes for b in self.buckets],
                "collective": self._collective(), "progress": self.progress,
                "transfer_path": self._transfer_path(),
                "bucket_paths": [b.path for b in self.buckets] if self._by_size() else None,
                "staging": "pinned host buffers" if self.buckets and self.buckets[0].dev
                is not None else None,
                "comm_device": str(self.buckets[0].buffer.device) if self.buckets else None}

    def _by_size(self) -> bool:
        return self.tuner is not None and self.tuner.by_size

    def _transfer_path(self) -> str | None:
        """The path buckets ran on, as records carry it (``knobs.transfer_path``)."""
        if self.progress != "thread":
            return None
        return BY_SIZE if self._by_size() else self.transfer

    def _collective(self) -> str:
        if self.progress == "poll":
            return "iallreduce"
        if self._by_size():
            return ("by size on the engine thread: each bucket on the path its probe priced "
                    "cheapest (bucket_paths)")
        return PATH_COLLECTIVE[self.transfer]

    def close(self) -> None:
        """Stop the transfer engines (after their last bucket)."""
        for path in list(self._engines):
            self._engines.pop(path).close()
