"""Bounded-staleness asynchronous updates: step t's all-reduce is applied at step t+s.

1. When backward has produced every gradient, pack them into a fused buffer
   (``flat``'s buffer; cast to the ``--compression`` dtype as flat does) and
   hand it to the strategy's transfer engine (``commbench.comm.engine``).
   Each step in flight has its own buffer: at most s+1 exist.
2. The transfers run while later steps compute, one after another in issue
   order, on the engine's background thread and a communicator of its own
   (so they never interleave with the runner's barriers and gathers).
   ``--transfer thread`` (default) runs the backend's blocking tuned
   all-reduce there; ``--transfer ring`` the project's ring on non-blocking
   point-to-point messages, tested between short sleeps (light on a CPU that
   computes). Why not a non-blocking collective from the training loop: Open
   MPI's ``Iallreduce`` (libnbc) advances only inside MPI calls, does its
   reductions inside ``MPI_Test`` (single calls took 40-110 ms for 47 MB on
   2-4 ranks) and was measured 2-3x slower across nodes than the blocking
   all-reduce: on it, s = 1 took 2.38 s per step on 2 emulated nodes x 4
   ranks at 1 Gbit/s (ResNet-18, 300 ms compute) against flat's 1.13 s.
3. At the end of step t, wait only for the all-reduce started at step t-s,
   write its mean into the gradients, and let the optimizer apply it. With
   s = 0 that is the all-reduce just started: synchronous training, the same
   mean as ``flat`` (to float tolerance; the ring adds in another order).

The first s steps have nothing to apply yet: their gradients are set to
zero, so the SGD step changes no parameter (momentum buffers start at zero
and stay there). The last s all-reduces of a run are still in flight when it
ends; ``finish_run`` waits for them and their gradients are never applied.
A run of N steps therefore makes N - s updates, which is why a staleness
larger than ``--steps`` is refused. ``close`` stops the engine.

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

Comm time per step is the part of each transfer's flight (from when the
engine began it, not when it was queued behind another, to its end) that
falls inside the step up to the end of ``finish``; bytes and calls count at
the step that issued the transfer. ``apply_wait_s`` is the time ``finish``
blocked on the all-reduce from s steps ago. For wait vs transfer
(``commbench.output.wait_vs_transfer``) a transfer's whole flight (engine
start to end) counts at the step that waits for it, step t+s on every rank;
the first s steps wait for none and have no split.
Where the fused buffers stay on a GPU (NCCL), the transfers are stamped with the
engine's device events (``commbench.comm.engine``) and the step's window runs
from its first event to an event on the compute stream at ``finish``, all read
when the step ends: a transfer still in flight then counts up to the window's
end. Staged through host memory, the host's stamps are right (packing waits for
the device).

Built like every strategy (``Strategy.__init__``); its settings are
``AsyncSettings``:

    algo: only ``native`` (what runs a transfer is ``transfer``'s choice).
    compression: ``none``, ``fp16`` or ``bf16`` (wire dtype, as flat).
    staleness: s >= 0.
    staleness_lr: scale the applied gradient by 1/s.
    staleness_warmup: steps run with s = 0 before staleness s starts.
    transfer: the engine's path, ``thread`` or ``ring`` (``TRANSFER_PATHS``); ``auto``
        is ``thread``.

Example::

    mpirun -np 4 python -m commbench.allreduce --strategy flat,async --algo native \\
        --staleness 2 --compute-ms 300 --transfer thread
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from commbench import metrics
from commbench.comm.algos import wire_dtype
from commbench.comm.base import Communicator
from commbench.comm.engine import PATH_COLLECTIVE, Transfer, TransferEngine, resolve_path
from commbench.flags import flag, nonneg_int
from commbench.flatbuf import FlatBuffer
from commbench.strategies.base import dtype_name, unpack_mean
from commbench.strategies.flat import FlatStrategy
from commbench.strategies.settings import EngineSettings, check_int
from commbench.timing import NullTimer, StepTimer, now


@dataclass(frozen=True)
class AsyncSettings(EngineSettings):
    """``async``'s settings: the common ones, the engine's ``transfer``, and its staleness.

    Args:
        staleness: s >= 0: step t's all-reduce is applied at step t+s.
        staleness_lr: scale the applied gradient by 1/s.
        staleness_warmup: steps run with s = 0 before staleness s starts.

    ``algo`` is only ``native``: the engine's ``transfer`` picks what runs.

    Example::

        make_strategy("async", comm, grads, AsyncSettings(staleness=2, transfer="ring"))
    """

    staleness: int = flag(
        "--staleness", default=0, metavar="S", type=nonneg_int,
        help="--strategy async: step t's all-reduce runs while later steps compute and is "
             "applied at step t+S; 0 = synchronous")
    staleness_lr: bool = flag(
        "--staleness-lr", default=False, action="store_true",
        help="--strategy async: scale the learning rate by 1/staleness (Zhang et al. 2016)")
    staleness_warmup: int = flag(
        "--staleness-warmup", default=0, metavar="N", type=nonneg_int,
        help="--strategy async: run the first N steps synchronously, then staleness S")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.algo != "native":
            raise ValueError(f"--strategy async runs its transfers on the transfer engine "
                             f"(--algo native, --transfer thread|ring), not --algo {self.algo}")
        check_int("staleness", self.staleness, 0)
        check_int("staleness_warmup", self.staleness_warmup, 0)

    def check_steps(self, steps: int) -> None:
        """A run of N steps applies N - S updates: S must be <= N."""
        if self.staleness > steps:
            raise ValueError(f"--staleness {self.staleness}: larger than --steps {steps}; "
                             "a run of N steps applies N - S updates, so S must be <= N")

    def notes(self, warmup: int) -> list[str]:
        """Async's wall clock starts with its pipeline part-empty where ``warmup`` < S
        (``Run.step_summary``)."""
        if warmup < self.staleness:
            return [f"note: async's wall throughput is flattered: --warmup {warmup} < "
                    f"--staleness {self.staleness} leaves its first measured steps nothing to "
                    "wait for; use --warmup >= --staleness"]
        return []


@dataclass
class _InFlight:
    step: int
    slot: int
    handle: Transfer  # the engine's: its start and end stamps are this rank's clock
    logged_until: float  # comm time already recorded up to here


#: the algorithm each transfer path runs, for ``wire_dtype`` (the ring sends bytes as
#: they are; the backend's all-reduce may widen)
_PATH_ALGO = {"thread": "native", "ring": "ring", "hier": "hier"}


class AsyncStrategy(FlatStrategy):
    name = "async"
    algos = ("native",)  # the engine's --transfer picks what runs, not --algo
    settings_class = AsyncSettings
    settings: AsyncSettings

    def __init__(self, comm: Communicator, grads: Sequence[torch.Tensor],
                 settings: AsyncSettings | None = None, *,
                 backward_order: Sequence[int] | None = None, workload: Any = None) -> None:
        super().__init__(comm, grads, settings, backward_order=backward_order,
                         workload=workload)
        self.staleness = self.settings.staleness
        self.staleness_lr = bool(self.settings.staleness_lr)
        self.staleness_warmup = self.settings.staleness_warmup
        # auto: the backend's blocking all-reduce, the path async's figures were taken on
        self.transfer = resolve_path(comm, self.settings.transfer, "thread")
        # One fused host buffer per step in flight (the first is flat's); packing casts,
        # or copies off a device, one tensor at a time where it must.
        self._slots = [FlatBuffer(self.grads, flat=self.buffer)]
        self._free = [0]
        self._queue: deque[_InFlight] = deque()  # issued, not yet applied; oldest first
        self._t = 0  # steps finished
        self._step_t0 = 0.0
        #: one dict per finished step: staleness applied, applied step, wait, lr scale
        self.step_log: list[dict] = []
        # Opened at the first transfer (a collective: every rank gets there at the same
        # step), closed by close().
        self._engine: TransferEngine | None = None
        self._step_mark = None  # on a device: the step's first event (its window's start)

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
        self._step_mark = timer.mark() if self._on_device() else None

    def _on_device(self) -> bool:
        """Whether this step's transfers are timed by device events."""
        return self.events is not None and self.timer.events is not None

    def _slot(self) -> int:
        if not self._free:
            self._slots.append(FlatBuffer(self.grads, dtype=self.wire, device=self.buffer.device))
            self._free.append(len(self._slots) - 1)
        return self._free.pop()

    def _issue(self, step: int) -> _InFlight:
        slot = self._slot()
        self._slots[slot].pack(self.grads)
        if self._engine is None:
            self._engine = TransferEngine(self.comm, self.transfer, events=self.events)
        handle = self._engine.submit(self._slots[slot].flat)
        tr = _InFlight(step, slot, handle, logged_until=handle.queued)
        # bytes and call count at the issuing step
        self.timer.comm(handle.queued, handle.queued, self.nbytes, whole=False)
        self._queue.append(tr)
        return tr

    def _wait(self, tr: _InFlight) -> float:
        """Block until ``tr`` is complete; return the seconds blocked."""
        t = now()
        try:
            tr.handle.wait()
        except Exception as e:
            raise RuntimeError(f"async: all-reduce of step {tr.step} failed") from e
        return max(0.0, tr.handle.end - t)

    def _apply(self, tr: _InFlight, scale: float) -> None:
        """Write the mean of ``tr``'s all-reduce, times ``scale``, into the gradients."""
        div = self.comm.size if scale == 1.0 else self.comm.size / scale
        for g, v in zip(self.grads, self._slots[tr.slot].views):
            unpack_mean(v, g, div)  # divide and copy back in one pass, as flat
        self._free.append(tr.slot)

    def _log_comm(self, end_of_window: float) -> None:
        """Record each transfer's flight inside this step (up to ``end_of_window``):
        from when the engine began it, not from when it was queued."""
        if self._step_mark is not None:
            return self._log_device_comm()
        for tr in self._queue:
            end, start = tr.handle.end, tr.handle.start  # end first: set after start
            if start is None:
                continue  # queued behind an earlier transfer: not in flight yet
            lo = max(tr.logged_until, self._step_t0, start)
            hi = min(end if end is not None else end_of_window, end_of_window)
            if hi > lo:
                self.timer.comm(lo, hi, 0, calls=0, whole=False)
            tr.logged_until = max(tr.logged_until, hi)

    def _log_device_comm(self) -> None:
        """``_log_comm`` on a device: each begun transfer's flight between its engine
        events, clipped to this step's window (its first event to one on the compute
        stream now), read when the step ends."""
        window = (self._step_mark, self.timer.mark())
        for tr in self._queue:
            h = tr.handle
            end = h.end_mark if h.end is not None else None  # end first: set after start
            if h.start_mark is None:
                continue  # queued behind an earlier transfer: not in flight yet
            self.timer.device_comm(h.start_mark, end, 0, calls=0, whole=False, within=window)

    def finish(self) -> None:
        t = self._t
        s = self.staleness_at(t)
        self._issue(t)
        entry = {"step": t, "staleness": None, "applied_step": None, "apply_wait_s": 0.0,
                 "lr_scale": None, "in_flight": 0}
        oldest = self._queue[0]
        if oldest.step <= t - s:
            if oldest.step < t - s:  # cannot happen with a non-decreasing schedule
                raise RuntimeError(f"async: step {oldest.step}'s gradient was skipped")
            entry["apply_wait_s"] = self._wait(oldest)
            self._log_comm(now())
            # its whole flight, for wait vs transfer, at the step that waits for it:
            # the same step on every rank
            if self._step_mark is not None:
                self.timer.device_collective(oldest.handle.start_mark, oldest.handle.end_mark)
            else:
                self.timer.collective(oldest.handle.start, oldest.handle.end)
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

    def finish_run(self) -> None:
        """Complete what is in flight (never applied)."""
        self.drain()

    def record_fields(self, kind: str, steps: Sequence[dict] = ()) -> dict:
        """Per step: its entry of the schedule (``step_log``: the staleness applied, the
        wait for it); the summary: how often each staleness was applied and the median
        wait (``summarize_schedule``)."""
        if kind == "summary":
            return summarize_schedule(steps)
        if not self.step_log:
            return {}
        entry = self.step_log[-1]
        # A transfer's bytes count at the step that issued it, its flight spreads over later
        # steps: bytes / in-step comm time is no bandwidth.
        return {"staleness": entry["staleness"], "applied_step": entry["applied_step"],
                "lr_scale": entry["lr_scale"], "in_flight": entry["in_flight"],
                "apply_wait_s": entry["apply_wait_s"], "busbw_gbps": None}

    def validation_pass(self, backward_order: Sequence[int]) -> None:
        """The delay pipeline's own pack, engine transfer and unpack, at s = 0
        (the delay itself is what tests/mpi/async_delay.py checks)."""
        self.drain()
        self.begin_step(NullTimer())
        tr = self._issue(-1)
        self._queue.pop()
        self._wait(tr)
        self._apply(tr, 1.0)

    def close(self) -> None:
        """Complete what is in flight and stop the transfer engine."""
        self.drain()
        if self._engine is not None:
            self._engine.close()
            self._engine = None

    def knobs(self) -> dict:
        return {**super().knobs(), "staleness": self.staleness,
                "staleness_lr": self.staleness_lr, "staleness_warmup": self.staleness_warmup,
                "buffers": len(self._slots), "transfer_path": self.transfer,
                "wire_dtype": dtype_name(wire_dtype(self.comm, _PATH_ALGO[self.transfer],
                                                    self.wire)),
                "collective": PATH_COLLECTIVE[self.transfer]}


def summarize_schedule(steps: Sequence[dict]) -> dict:
    """Over the measured steps: how often each staleness was applied (``None``: no update)
    and the time blocked on the all-reduce from s steps ago."""
    measured = [s for s in steps if not s["warmup"]]
    hist = Counter("none" if s["staleness"] is None else str(s["staleness"]) for s in measured)
    waits = [s["apply_wait_s"] for s in measured]
    return {"staleness_applied": dict(sorted(hist.items())),
            "apply_wait_s": metrics.summarize(waits)["median"] if waits else None,
            "updates_applied": sum(1 for s in steps if s["staleness"] is not None)}
