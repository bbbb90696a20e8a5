"""Bounded-staleness asynchronous updates: step t's all-reduce is applied at step t+s.

1. When backward has produced every gradient, pack them into a fused buffer
   (``flat``'s buffer; cast to the ``--compression`` dtype as flat does) and
   start its all-reduce non-blocking (``comm.iallreduce``). Each step in
   flight has its own buffer: at most s+1 exist.
2. The transfers run while later steps compute. Under the mpi backend one
   background thread per strategy runs them in issue order, each a blocking
   all-reduce on a communicator of its own (Horovod's design: its background
   thread runs the collectives; mpi4py releases the GIL inside MPI calls).
   Polling a non-blocking all-reduce from the training loop was tried and
   measured worse here: Open MPI's ``Iallreduce`` does its reductions and
   copies inside ``MPI_Test`` (single calls took 40-110 ms for 47 MB on 2-4
   ranks) and, on 2 ranks, inside the start call (~100 ms), stalling the loop
   in large pieces. Under Horovod its own thread advances them and
   ``progress`` only observes (``comm.iallreduce`` + ``test``).
3. At the end of step t, wait only for the all-reduce started at step t-s,
   write its mean into the gradients, and let the optimizer apply it. With
   s = 0 that is the all-reduce just started: synchronous training, the same
   mean as ``flat`` (to float tolerance; the non-blocking and blocking
   all-reduces may add in different orders).

The first s steps have nothing to apply yet: their gradients are set to
zero, so the SGD step changes no parameter (momentum buffers start at zero
and stay there). The last s all-reduces of a run are still in flight when it
ends; ``end_run`` waits for them and their gradients are never applied.
A run of N steps therefore makes N - s updates, which is why a staleness
larger than ``--steps`` is refused.

Mitigations (both optional):

* ``staleness_lr``: scale the applied gradient by 1/s (for SGD with momentum
  the same as scaling the learning rate by 1/s), Zhang et al. 2016,
  "Staleness-aware async-SGD for distributed deep learning",
  https://arxiv.org/abs/1511.05950. s = 0 keeps the rate.
* ``staleness_warmup``: the first N steps run synchronously (s = 0), then
  staleness s. Early training moves the parameters fastest, where stale
  gradients point furthest from the current descent direction. The switch
  opens a gap of s steps that apply nothing (a pipeline's depth can only
  grow by leaving a step empty).

Comm time per step is the part of each transfer's flight (issue to first
seen complete) that falls inside the step up to the end of ``finish``;
bytes and calls count at the step that issued the transfer. ``apply_wait_s``
is the time ``finish`` blocked on the all-reduce from s steps ago.

Args:
    comm: the communicator.
    grads: gradient tensors in parameter order.
    algo: only ``native`` (the backend's non-blocking all-reduce).
    compression: ``none``, ``fp16`` or ``bf16`` (wire dtype, as flat).
    staleness: s >= 0.
    staleness_lr: scale the applied gradient by 1/s.
    staleness_warmup: steps run with s = 0 before staleness s starts.

Example::

    mpirun -np 4 python -m commbench.allreduce --strategy flat,async --algo native \\
        --staleness 2 --compute-ms 300
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from commbench.comm.base import Communicator, Handle
from commbench.strategies.flat import FlatStrategy
from commbench.timing import NullTimer, StepTimer, now

POLL_S = 0.0005  # the transfer thread's sleep between tests of its all-reduce


@dataclass
class _Transfer:
    step: int
    slot: int
    start: float
    handle: Handle | None = None  # polled mode
    done: threading.Event = field(default_factory=threading.Event)  # threaded mode
    end: float | None = None  # first moment the all-reduce was seen complete
    logged_until: float = 0.0  # comm time already recorded up to here
    error: BaseException | None = None


class _TransferThread:
    """Runs queued all-reduces one after another on a communicator of its own.

    Its own communicator keeps its collectives out of the order of the main
    thread's (the runner's barrier, validation): MPI matches collectives per
    communicator by issue order, and two threads' order differs between ranks.
    """

    def __init__(self, comm: Communicator, buffers: list[torch.Tensor]) -> None:
        self.comm = comm
        self.buffers = buffers
        self.queue: queue.SimpleQueue[_Transfer | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="async-allreduce", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            tr = self.queue.get()
            if tr is None:
                return
            try:
                # Non-blocking, tested between short sleeps: a blocking all-reduce spins a
                # core while it waits for the other ranks, which the compute of a CPU
                # workload needs (Open MPI busy-polls inside blocking calls).
                handle = self.comm.iallreduce(self.buffers[tr.slot])
                while not handle.test():
                    time.sleep(POLL_S)
            except BaseException as e:  # noqa: BLE001 - handed to the main thread's wait
                tr.error = e
            tr.end = now()
            tr.done.set()

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()


class AsyncStrategy(FlatStrategy):
    name = "async"
    algos = ("native",)  # the project's ring is blocking; only the backend's is non-blocking

    def __init__(self, comm: Communicator, grads: Sequence[torch.Tensor],
                 algo: str = "native", compression: str = "none", staleness: int = 0,
                 staleness_lr: bool = False, staleness_warmup: int = 0) -> None:
        if algo != "native":
            raise ValueError(f"--strategy async runs the backend's non-blocking all-reduce "
                             f"(--algo native), not --algo {algo}")
        if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
            raise ValueError(f"--staleness must be an integer >= 0, got {staleness!r}")
        if not isinstance(staleness_warmup, int) or staleness_warmup < 0:
            raise ValueError(f"--staleness-warmup must be an integer >= 0, got "
                             f"{staleness_warmup!r}")
        super().__init__(comm, grads, algo=algo, compression=compression)
        self.staleness = staleness
        self.staleness_lr = bool(staleness_lr)
        self.staleness_warmup = staleness_warmup
        # cast, or copy from a device to the host buffer: one copy per tensor
        self._copy_in = self.wire != self.grads[0].dtype or self.grads[0].device.type != "cpu"
        self._slots = [self.buffer]
        self._slot_views = [self._views]
        self._free = [0]
        self._queue: deque[_Transfer] = deque()  # issued, not yet applied; oldest first
        self._t = 0  # steps finished
        self._step_t0 = 0.0
        #: one dict per finished step: staleness applied, applied step, wait, lr scale
        self.step_log: list[dict] = []
        # mpi: a transfer thread on its own communicator (every rank builds it, in the
        # same order: a collective); horovod: its own thread progresses, we poll.
        self._tcomm = comm.subgroup(list(range(comm.size))) if comm.name == "mpi" else None
        self._thread: _TransferThread | None = None
        if self._tcomm is None:
            self.progress = self._progress

    # -- schedule --------------------------------------------------------------
    def staleness_at(self, step: int) -> int:
        """The staleness in force at ``step`` (0 during the warm-up)."""
        return 0 if step < self.staleness_warmup else self.staleness

    def lr_scale(self, staleness: int) -> float:
        """Factor on an applied gradient of ``staleness`` (1/s with --staleness-lr)."""
        return 1.0 / staleness if self.staleness_lr and staleness > 0 else 1.0

    # -- the step ----------------------------------------------------------------
    def begin_step(self, timer: StepTimer | NullTimer) -> None:
        super().begin_step(timer)
        self._step_t0 = now()

    def _slot(self) -> int:
        if not self._free:
            self._slots.append(torch.empty_like(self.buffer))
            views, offset = [], 0
            for g in self.grads:
                views.append(self._slots[-1][offset:offset + g.numel()].view_as(g))
                offset += g.numel()
            self._slot_views.append(views)
            self._free.append(len(self._slots) - 1)
        return self._free.pop()

    def _issue(self, step: int) -> _Transfer:
        slot = self._slot()
        buf = self._slots[slot]
        if self._copy_in:
            for g, v in zip(self.grads, self._slot_views[slot]):
                v.copy_(g)
        else:
            torch.cat([g.view(-1) for g in self.grads], out=buf)
        start = now()
        tr = _Transfer(step, slot, start, logged_until=start)
        if self._tcomm is not None:
            if self._thread is None:  # started at the first transfer, ended by end_run
                self._thread = _TransferThread(self._tcomm, self._slots)
            self._thread.queue.put(tr)
        else:
            tr.handle = self.comm.iallreduce(buf)
        self.timer.comm(start, start, self.nbytes)  # bytes and call count at the issuing step
        self._queue.append(tr)
        return tr

    def _poll(self) -> None:
        if self._tcomm is not None:
            return  # the thread stamps ``end`` itself
        for tr in self._queue:
            if tr.end is None and tr.handle.test():
                tr.end = now()

    def _progress(self) -> None:
        if self._queue:
            self._poll()

    def _wait(self, tr: _Transfer) -> float:
        """Block until ``tr`` is complete; return the seconds blocked."""
        t = now()
        if tr.handle is None:
            tr.done.wait()
            if tr.error is not None:
                raise RuntimeError(f"async: all-reduce of step {tr.step} failed") from tr.error
            return max(0.0, tr.end - t)
        if tr.end is not None:
            return 0.0
        tr.handle.wait()
        tr.end = now()
        return tr.end - t

    def _apply(self, tr: _Transfer, scale: float) -> None:
        """Write the mean of ``tr``'s all-reduce, times ``scale``, into the gradients."""
        div = self.comm.size if scale == 1.0 else self.comm.size / scale
        for g, v in zip(self.grads, self._slot_views[tr.slot]):
            if v.device == g.device:
                torch.div(v, div, out=g)  # divide and copy back in one pass, as flat
            else:
                g.copy_(v).div_(div)
        self._free.append(tr.slot)

    def _log_comm(self, end_of_window: float) -> None:
        """Record each transfer's flight inside this step (up to ``end_of_window``)."""
        for tr in self._queue:
            lo = max(tr.logged_until, self._step_t0)
            hi = min(tr.end if tr.end is not None else end_of_window, end_of_window)
            if hi > lo:
                self.timer.comm(lo, hi, 0, calls=0)
            tr.logged_until = max(tr.logged_until, hi)

    def finish(self) -> None:
        t = self._t
        s = self.staleness_at(t)
        self._issue(t)
        self._poll()
        entry = {"step": t, "staleness": None, "applied_step": None, "apply_wait_s": 0.0,
                 "lr_scale": None, "in_flight": 0}
        oldest = self._queue[0]
        if oldest.step <= t - s:
            if oldest.step < t - s:  # cannot happen with a non-decreasing schedule
                raise RuntimeError(f"async: step {oldest.step}'s gradient was skipped")
            entry["apply_wait_s"] = self._wait(oldest)
            self._log_comm(now())
            self._queue.popleft()
            scale = self.lr_scale(s)
            self._apply(oldest, scale)
            entry.update(staleness=t - oldest.step, applied_step=oldest.step, lr_scale=scale)
        else:
            # Nothing from s steps ago yet (first s steps, or just after the warm-up):
            # a zero gradient, so the optimizer leaves the parameters as they are.
            self._log_comm(now())
            for g in self.grads:
                g.zero_()
        entry["in_flight"] = len(self._queue)
        self.step_log.append(entry)
        self._t += 1

    # -- end of a run ---------------------------------------------------------------
    def drain(self) -> int:
        """Wait for every transfer still in flight and drop it; return how many."""
        n = len(self._queue)
        while self._queue:
            tr = self._queue.popleft()
            self._wait(tr)
            self._free.append(tr.slot)
        return n

    def end_run(self) -> list[dict]:
        """Complete what is in flight (never applied), stop the transfer thread, and
        return the per-step log."""
        self.drain()
        self._stop_thread()
        return list(self.step_log)

    def _stop_thread(self) -> None:
        if self._thread is not None:
            self._thread.close()
            self._thread = None

    def validation_pass(self, backward_order: Sequence[int]) -> None:
        """The delay pipeline's own pack, non-blocking all-reduce and unpack, at s = 0
        (the delay itself is what tests/mpi/async_delay.py checks)."""
        self.drain()
        self.begin_step(NullTimer())
        tr = self._issue(-1)
        self._queue.pop()
        self._wait(tr)
        self._apply(tr, 1.0)
        self._stop_thread()

    def knobs(self) -> dict:
        return {**super().knobs(), "staleness": self.staleness,
                "staleness_lr": self.staleness_lr, "staleness_warmup": self.staleness_warmup,
                "buffers": len(self._slots), "collective": "iallreduce"}


def merge_step_log(rec: dict, logs: Sequence[list[dict]], k: int) -> None:
    """Add step ``k`` of every rank's ``step_log`` to the step record ``rec``.

    The schedule fields are the same on every rank; ``apply_wait_s`` is the
    critical-path rank's (as compute and comm are), every rank's under ``ranks``.
    """
    mine = logs[rec["critical_rank"]][k]
    rec.update(staleness=mine["staleness"], applied_step=mine["applied_step"],
               lr_scale=mine["lr_scale"], in_flight=mine["in_flight"],
               apply_wait_s=mine["apply_wait_s"])
    rec["ranks"]["apply_wait_s"] = [log[k]["apply_wait_s"] for log in logs]
    # A transfer's bytes count at the step that issued it, its flight spreads over later
    # steps: bytes / in-step comm time is no bandwidth.
    rec["busbw_gbps"] = None


def summarize_step_log(steps: Sequence[dict]) -> dict:
    """Over the measured steps: how often each staleness was applied (``None``: no update)
    and the time blocked on the all-reduce from s steps ago."""
    from collections import Counter

    from commbench import metrics

    measured = [s for s in steps if not s["warmup"]]
    hist = Counter("none" if s["staleness"] is None else str(s["staleness"]) for s in measured)
    waits = [s["apply_wait_s"] for s in measured]
    return {"staleness_applied": dict(sorted(hist.items())),
            "apply_wait_s": metrics.summarize(waits)["median"] if waits else None,
            "updates_applied": sum(1 for s in steps if s["staleness"] is not None)}
