"""Peers in the same harness: Horovod's and PyTorch DDP's own gradient sync.

Both wrap the workload's model and optimizer unchanged, on either workload:
the replayed one (``--workload synthetic``) is an ``nn.Module`` whose backward
accumulates each parameter's gradient at its replayed time, so their hooks on
the gradient accumulators fire during backward as on a real model
(``workloads.synthetic``). The step timer is the same as for the project's
strategies, so their exposed sync compares directly. Each records how much of
its sync started inside backward: ``grads_hooked_in_backward`` (Horovod: the
gradients whose all-reduce its hooks had started before ``synchronize()``;
it reduces the rest inside ``synchronize()``) and
``buckets_before_last_grad`` (DDP: the buckets whose all-reduce started
before backward produced its last gradient), both of the last measured step.

``horovod`` wraps the workload's SGD in ``hvd.DistributedOptimizer``
(``op=Average``, ``backward_passes_per_step = --accum-steps``,
``hvd.Compression.fp16`` for ``--compression fp16``) after broadcasting
rank 0's whole state dict (parameters and buffers) once, as Horovod users
do; buffers then stay local whatever ``--buffers`` says. Horovod's own hooks
start each gradient's all-reduce during backward; its background thread
fuses them (``HOROVOD_FUSION_THRESHOLD``, default 64 MB) every cycle
(``HOROVOD_CYCLE_TIME``, default 1 ms after 0.20): set them as Horovod users
do, e.g. ``horovodrun --fusion-threshold-mb 32 --cycle-time-ms 5``; records
carry the values in force. ``finish`` is ``optimizer.synchronize()``; the
optimizer step then runs under ``skip_synchronize``. Its comm interval is
from the step's first ready gradient to the end of ``synchronize`` (Horovod
does not expose when each fused all-reduce really ran, so this is an upper
bound on its comm time; exposed sync is exact); on a GPU both ends are events
on the compute stream (the first gradient's hook, and after ``synchronize``),
read when the step ends. Needs the horovod backend.

``ddp`` wraps the model in ``DistributedDataParallel`` on a Gloo process
group made for it (``bucket_cap_mb = --bucket-mb``, ``broadcast_buffers``
from ``--buffers``: DDP's own broadcast of rank 0's buffers in each forward,
which then counts in forward compute; see ``commbench.buffers``). DDP
waits for its buckets inside ``loss.backward()``, so the workload counts
backward compute up to the last gradient's hook and the rest of backward
shows as exposed sync. On a GPU that end is an event the last gradient's hook
records on the compute stream, before DDP's reducer makes that stream wait
for its all-reduces (an event after ``loss.backward()`` returns would complete
after the communication), and each bucket runs from an event on the compute
stream at its hand-over to one on the stream its completion callback runs on
(which torch makes wait for the collective): both on the device's clock, read
when the step ends. For a model with parameters backward never reaches
(``workload.unused``) DDP runs with ``find_unused_parameters=True``. A comm
hook (the default all-reduce hook's arithmetic: divide, then all-reduce; with
``--compression`` cast first, as ``fp16_compress_hook`` does) records each
bucket's interval. ``--accum-steps``
uses ``no_sync()`` for all but the last micro-batch.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import socket
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from commbench import dilation
from commbench.buckets import parse_bucket_mb
from commbench.buffers import check_rule
from commbench.comm.base import Communicator
from commbench.flags import same_flag
from commbench.flatbuf import FlatBuffer
from commbench.strategies.base import Strategy
from commbench.strategies.bucketed import BucketedSettings, bucket_cap_mb
from commbench.strategies.settings import COMPRESSIONS, CommonSettings
from commbench.timing import device_events, now

HOROVOD_DEFAULTS = {"HOROVOD_FUSION_THRESHOLD": str(64 * 2**20), "HOROVOD_CYCLE_TIME": "1"}
#: the ``--compression`` values Horovod has a compressor for (``hvd.Compression``)
HOROVOD_COMPRESSIONS = ("none", "fp16")


@dataclass(frozen=True)
class HorovodSettings(CommonSettings):
    """``horovod``'s settings: the common ones (``--compression`` as ``hvd.Compression``,
    which has no bfloat16; ``--accum-steps`` as ``backward_passes_per_step``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.compression not in HOROVOD_COMPRESSIONS:
            raise ValueError(f"--compression {self.compression}: Horovod has no bfloat16 "
                             "compressor (its Compression offers none and fp16); use fp16 "
                             "with --strategy horovod")


@dataclass(frozen=True)
class DDPSettings(CommonSettings):
    """``ddp``'s settings: the common ones (``broadcast_buffers`` from ``--buffers``), and
    ``--bucket-mb`` as ``bucket_cap_mb`` (declared on ``BucketedSettings``; DDP has no
    ``auto``: under it DDP keeps its default, 25)."""

    bucket_mb: float | str = same_flag(BucketedSettings, "bucket_mb")

    def __post_init__(self) -> None:
        super().__post_init__()
        parse_bucket_mb(self.bucket_mb)  # MB >= 0 or auto

    @property
    def bucket_cap_mb(self) -> float:
        """DDP's ``bucket_cap_mb``: ``bucket_mb``, or its default under ``auto``."""
        return bucket_cap_mb(self.bucket_mb)


class _PreSynchronized:
    """The optimizer the workload steps once ``finish`` has synchronised."""

    def __init__(self, opt) -> None:
        self.opt = opt

    def step(self) -> None:
        with self.opt.skip_synchronize():
            self.opt.step()


class HorovodStrategy(Strategy):
    name = "horovod"
    needs_model = True
    settings_class = HorovodSettings
    settings: HorovodSettings
    own_buffer_rule = "horovod-initial-broadcast"  # one broadcast of the state dict, at start

    @classmethod
    def check(cls, comm: Communicator, algo: str) -> None:
        if not comm.runs_horovod:
            raise ValueError("--strategy horovod runs hvd.DistributedOptimizer: it needs the "
                             f"horovod backend, and this job runs on {comm.name} (launch "
                             "with horovodrun, or --backend horovod under mpirun; under "
                             "torchrun use --strategy ddp, torch's own peer)")

    def __init__(self, comm: Communicator, grads: Sequence[torch.Tensor],
                 settings: HorovodSettings | None = None, *,
                 backward_order: Sequence[int] | None = None, workload: Any = None) -> None:
        super().__init__(comm, grads, settings, backward_order=backward_order,
                         workload=workload)
        compression, accum_steps = self.compression, self.settings.accum_steps
        self.check(comm, "native")
        import horovod.torch as hvd  # optional extra: only --strategy horovod needs it

        # HOROVOD_COMPRESSIONS: HorovodSettings refused any other
        codecs = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}
        # Horovod's rule for state: one broadcast of rank 0's parameters and buffers at the
        # start; buffers are never synchronised again (commbench.buffers).
        hvd.broadcast_parameters(workload.net.state_dict(), root_rank=0)
        self.opt = hvd.DistributedOptimizer(
            workload.opt, named_parameters=list(workload.net.named_parameters()),
            compression=codecs[compression], backward_passes_per_step=accum_steps,
            op=hvd.Average)
        workload.opt = _PreSynchronized(self.opt)
        self.accum_steps = accum_steps
        self._first: float | None = None
        self._hooked = 0

    def begin_step(self, timer) -> None:
        super().begin_step(timer)
        self._first = None

    def on_ready(self, i: int) -> None:
        if self._first is None:  # on a device: an event on the compute stream, in the hook
            self._first = self.timer.clock() if self.timer.events is None else self.timer.mark()

    def finish(self) -> None:
        """``synchronize()``; comm time from the first ready gradient to its end.

        That span is not one collective (Horovod fuses and runs the all-reduces on its
        own thread and exposes no per-collective times), so it gives no wait vs
        transfer split: ``sync_wait_s``/``sync_transfer_s`` are None for this peer;
        ``imbalance_s`` and ``straggler_rank``, from compute, are recorded.
        """
        if self.timer.events is not None:  # on a device: events on the compute stream
            start = self._first if self._first is not None else self.timer.mark()
            self._synchronize()
            self.timer.device_comm(start, self.timer.mark(), self.nbytes, whole=False)
            return
        t = self.timer.clock()
        self._synchronize()
        self.timer.comm(self._first if self._first is not None else t, self.timer.clock(),
                        self.nbytes, whole=False)

    def _synchronize(self) -> None:
        # handles Horovod's gradient hooks started during backward (the rest it starts now)
        self._hooked = sum(1 for h in self.opt._handles.values() if h[0] is not None)
        self.opt.synchronize()

    def validation_pass(self, backward_order: Sequence[int]) -> None:
        # With no handles pending, synchronize() all-reduces every gradient the way
        # the optimizer's hooks do (same names, compression and averaging).
        self.opt.synchronize()

    def knobs(self) -> dict:
        env = {k.lower(): os.environ.get(k, v) for k, v in HOROVOD_DEFAULTS.items()}
        env["horovod_cycle_time"] = os.environ.get(dilation.HOROVOD_CYCLE_BASE_ENV,
                                                   env["horovod_cycle_time"])  # emulated
        return {**super().knobs(), "backward_passes_per_step": self.accum_steps, **env,
                "grads_hooked_in_backward": self._hooked}


def _gloo_group(comm: Communicator):
    """The default torch.distributed group on Gloo, rendezvous at rank 0 (made once)."""
    if dist.is_initialized():
        return dist.group.WORLD
    where = None
    if comm.rank == 0:
        single_host = len(set(comm.topo.hostnames)) == 1
        addr = "127.0.0.1" if single_host else socket.gethostbyname(socket.gethostname())
        with socket.socket() as s:
            s.bind((addr, 0))
            where = (addr, s.getsockname()[1])
    addr, port = comm.bcast_object(where)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=comm.rank,
                            world_size=comm.size)
    return dist.group.WORLD


class DDPStrategy(Strategy):
    name = "ddp"
    needs_model = True
    settings_class = DDPSettings
    settings: DDPSettings

    @classmethod
    def buffer_rule(cls, requested: str) -> str:
        return f"ddp-{check_rule(requested)}"  # DDP's own broadcast_buffers, set from the flag

    def __init__(self, comm: Communicator, grads: Sequence[torch.Tensor],
                 settings: DDPSettings | None = None, *,
                 backward_order: Sequence[int] | None = None, workload: Any = None) -> None:
        super().__init__(comm, grads, settings, backward_order=backward_order,
                         workload=workload)
        # DDP has no auto: under --bucket-mb auto it keeps its default cap
        bucket_mb = self.settings.bucket_cap_mb
        broadcast_buffers = self.settings.broadcast_buffers
        self._dist = dist
        # under the torch backend DDP runs on the backend's own group (Gloo or NCCL);
        # elsewhere on a Gloo group of its own beside MPI or Horovod
        self.group = comm.process_group if comm.process_group is not None \
            else _gloo_group(comm)
        self.bucket_mb = float(bucket_mb)
        self.broadcast_buffers = bool(broadcast_buffers)
        # Buffer sync in forward: named forward_sync_buffers from torch 2.13 on.
        takes = inspect.signature(DistributedDataParallel).parameters
        sync = {"forward_sync_buffers" if "forward_sync_buffers" in takes
                else "broadcast_buffers": self.broadcast_buffers}
        # A parameter backward never reaches would hold its bucket back for ever: DDP must
        # look for such parameters after every forward (workloads.objective finds them).
        self.find_unused = bool(workload.unused)
        on_gpu = {p.device for p in workload.net.parameters()} - {torch.device("cpu")}
        devices = {"device_ids": [next(iter(on_gpu))]} if len(on_gpu) == 1 else {}
        self.ddp = DistributedDataParallel(workload.net, bucket_cap_mb=self.bucket_mb,
                                           process_group=self.group, **devices,
                                           find_unused_parameters=self.find_unused, **sync)
        self._cast = COMPRESSIONS[self.compression]
        # the hook's state is a weak reference: DDP's reducer holds the hook in C++, out of
        # the garbage collector's sight, and a bound method would keep this strategy, DDP
        # and the workload's model alive after the run (one leaked workload a DDP run)
        self.ddp.register_comm_hook(weakref.ref(self), _ddp_comm_hook)
        workload.net = self.ddp
        workload.sync_in_backward = True
        self.workload = workload
        self._buckets = self._step_buckets = 0
        self._bucket_starts: list[float] = []
        self._early = 0
        self._callbacks: weakref.WeakSet = weakref.WeakSet()
        #: the device clock of the model's gradients, where they are on a GPU
        self.events = device_events(next(iter(on_gpu))) if len(on_gpu) == 1 else None
        #: buckets reduced on a GPU this step: (hand-over event, end event, bytes)
        self._on_device: list[tuple[Any, Any, int]] = []

    def begin_step(self, timer) -> None:
        super().begin_step(timer)
        self._buckets = 0
        self._bucket_starts = []
        self._on_device.clear()  # a validation pass's buckets are not a step's

    def _reduce(self, buf: torch.Tensor) -> torch.futures.Future:
        """Mean of ``buf`` over ranks, in place, as a future (DDP's default hook's arithmetic).

        The bucket is timed from when DDP hands it over (Gloo does not say when its
        thread began it, so time queued behind an earlier bucket counts) to its
        completion: one whole collective, for wait vs transfer. On a GPU both ends are
        events: the hand-over on the compute stream (the hook runs there), the end on
        the stream the completion callback runs on, which torch makes wait for the
        collective's work; read when the step ends.
        """
        start = now()
        send = buf.to(self._cast) if self._cast is not None else buf
        send.div_(self.comm.size)
        began = self.events.mark() if self.events is not None else None
        fut = self._dist.all_reduce(send, group=self.group, async_op=True).get_future()
        nbytes = send.numel() * send.element_size()

        def done(f: torch.futures.Future) -> torch.Tensor:
            if began is None:
                self.timer.comm(start, now(), nbytes)
            else:  # on a device this may run once the work is queued: its end is an event
                self._on_device.append((began, self.events.mark(), nbytes))
            out = f.value()[0]
            if out is not buf:
                buf.copy_(out)
            return buf

        self._callbacks.add(done)  # gone once Gloo's thread has let go of it (``close``)
        return fut.then(done)

    def _hook(self, bucket):
        self._buckets += 1
        self._bucket_starts.append(now())
        return self._reduce(bucket.buffer())

    def micro_batch(self, last: bool):
        return contextlib.nullcontext() if last else self.ddp.no_sync()

    def finish(self) -> None:
        """DDP has already synchronised inside backward. Buckets reduced on a GPU are timed
        from their hand-over to their end by their events (``_reduce``), which the timer
        reads when the step ends."""
        for began, ended, nbytes in self._on_device:
            self.timer.device_comm(began, ended, nbytes)
        self._on_device.clear()
        self._step_buckets = self._buckets
        last = self.workload.last_ready
        self._early = sum(1 for t in self._bucket_starts if t < last)

    def validation_pass(self, backward_order: Sequence[int]) -> None:
        # DDP's reducer runs only inside backward; the same hook arithmetic on the
        # same Gloo group reduces the known values, over one flat buffer.
        fb = FlatBuffer(self.grads)
        fb.pack(self.grads)
        self._reduce(fb.flat).wait()
        fb.unpack(self.grads)

    def close(self, timeout_s: float = 30.0) -> None:
        """Wait until Gloo's threads have dropped every completion callback.

        A Gloo thread runs a bucket's callback (``_reduce``) and releases it after the
        rank's wait has already returned; releasing a Python function takes the GIL,
        and a thread that asks for it while the interpreter is shutting down is ended by
        ``pthread_exit``, which aborts the process from inside Gloo's C++ ("terminate
        called without an active exception", seen in CI on a run's last rank to exit).
        """
        deadline = now() + timeout_s
        while len(self._callbacks) and now() < deadline:
            dilation.sleep(0.001)

    def knobs(self) -> dict:
        return {**super().knobs(), "bucket_cap_mb": self.bucket_mb,
                "broadcast_buffers": self.broadcast_buffers, "buckets_per_step": self._step_buckets,
                "find_unused_parameters": self.find_unused,
                "buckets_before_last_grad": self._early}


def _ddp_comm_hook(state, bucket):  # DDP rejects a return annotation that is a string
    """DDP's communication hook: the bucket to ``DDPStrategy._hook`` of the strategy
    ``state`` refers to (a weak reference, ``DDPStrategy.__init__`` says why)."""
    return state()._hook(bucket)
