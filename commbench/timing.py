"""Per-step phase timing on one rank.

A step is timed from the moment every rank has left a barrier (so waiting for
a slow rank to *arrive* is recorded apart, as ``wait_s``) to the end of the
optimizer update. Inside it the workload marks compute spans and strategies
mark the intervals during which a gradient collective was in flight; comm
time is the union of those intervals. Only this rank's clock is ever used.

Each whole collective's duration on this rank is also kept, in issue order
(``collective_s``): ``commbench.output.step_record`` splits it, over ranks,
into transfer (the shortest duration) and each rank's wait (its own minus
that). A strategy times a collective from when it really started on this
rank (the transfer engine's ``start`` stamp, not when it was queued).

``NullTimer`` has the same interface and does nothing: the instrumentation
overhead benchmark runs the same loop with each.

On a CUDA device (``DeviceEvents``) the host's clock says when work was queued,
not when it ran, and a device-wide synchronise would wait for every stream,
communication's included. There each phase and each transfer is a pair of CUDA
events recorded on the stream that ran it (``device_compute``, ``device_comm``),
and the timer reads them when the step ends: a step runs from an event recorded
as it begins to one recorded on the compute stream after the optimizer, each
interval on the device's clock at both ends (placed on the step's time line by
its offset from the step's first event). Reading an event waits for that event
only, never for the device. On the host nothing of this runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from commbench import dilation
from commbench.metrics import exposed_sync, union_length

#: this rank's clock, in emulated time (``commbench.dilation``: wall time / K)
now = dilation.now
PHASES = ("forward", "backward", "optimizer")


class DeviceEvents:
    """This rank's device clock: CUDA events recorded on a stream, read when the step ends.

    ``cuda`` is the CUDA namespace the events and streams come from (``torch.cuda``);
    tests on a machine without a GPU hand it a stand-in that records each call, so
    what the timing asks of the device (which events, on which stream, and that no
    device-wide synchronise is among them) is checked where no device runs.

    A mark is an event recorded on a stream (default: the current one, the stream the
    caller's kernels run on), so it completes when that stream reaches it: the end of
    the work queued before it there, not when the host queued it. ``mark_seconds``
    reads two marks, waiting for the later one only (the event's own synchronise).
    """

    def __init__(self, device: Any, cuda: Any = None) -> None:
        if cuda is None:
            import torch
            cuda = torch.cuda
        self.device = device
        self.cuda = cuda

    def stream(self) -> Any:
        """The current stream: where the caller's kernels run (the compute stream)."""
        return self.cuda.current_stream(self.device)

    def new_stream(self) -> Any:
        """A stream of its own (a transfer engine's)."""
        return self.cuda.Stream(self.device)

    def using(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        """Make ``stream`` current inside the block (``torch.cuda.stream``)."""
        return self.cuda.stream(stream)

    def event(self) -> Any:
        """An event that keeps time, not yet recorded."""
        return self.cuda.Event(enable_timing=True)

    def mark(self, stream: Any = None) -> Any:
        """An event recorded now on ``stream`` (default: the current stream)."""
        ev = self.event()
        ev.record(stream if stream is not None else self.stream())
        return ev


def device_events(device: Any, cuda: Any = None) -> DeviceEvents | None:
    """The device clock of tensors on ``device`` (a ``torch.device`` or its name): None
    for host memory, which keeps the host's clock."""
    return DeviceEvents(device, cuda) if str(device).split(":")[0] == "cuda" else None


def mark_seconds(start: Any, end: Any) -> float:
    """Emulated seconds from mark ``start`` to mark ``end`` (two recorded CUDA events),
    once ``end`` has completed: waits for that event only."""
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / dilation.factor()


@dataclass
class StepSample:
    """One rank's timings for one step (seconds)."""

    step: int
    warmup: bool
    wait_s: float  # time in the pre-step barrier: skew between ranks, not transfer
    step_s: float
    compute_s: float
    comm_s: float
    exposed_sync_s: float
    comm_calls: int
    comm_bytes: int
    link_bytes: int | None = None  # max(rx, tx) through this node's link (local rank 0 only)
    forward_s: float = 0.0  # the parts of compute_s
    backward_s: float = 0.0
    optimizer_s: float = 0.0
    buffer_sync_s: float = 0.0  # broadcast of model buffers (--buffers broadcast); in exposed sync
    #: seconds per phase of the step's all-reduces (hierarchical, ring: commbench.comm.phases)
    comm_phases: dict[str, float] = field(default_factory=dict)
    #: each whole collective's duration on this rank, in issue order (sorted by start):
    #: the fused buffer, a bucket, a two-level all-reduce (its phases are parts, not
    #: collectives of their own), async's transfer at the step that waits for it
    collective_s: list[float] = field(default_factory=list)
    traced: bool = False  # the step ran under torch.profiler (--trace torch)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _ComputeMarks:
    """A compute phase between two events on the stream that ran it."""

    phase: str
    start: Any
    end: Any

    def record(self, timer: StepTimer) -> None:
        timer._compute_span(self.phase, self.start, self.end)


@dataclass(frozen=True)
class _CommMarks:
    """A transfer between two events on its stream (``StepTimer.device_comm``)."""

    start: Any
    end: Any | None
    nbytes: int
    calls: int
    whole: bool
    within: tuple[Any, Any] | None

    def record(self, timer: StepTimer) -> None:
        lo = timer._at(self.start)
        hi = None if self.end is None else timer._at(self.end)
        if self.within is not None:
            lo = max(lo, timer._at(self.within[0]))
            w_hi = timer._at(self.within[1])
            hi = w_hi if hi is None else min(hi, w_hi)
        timer.comm(lo, max(lo, hi), self.nbytes, self.calls, self.whole)


@dataclass(frozen=True)
class _CollectiveMarks:
    """One collective's whole flight between two events (async's)."""

    start: Any
    end: Any

    def record(self, timer: StepTimer) -> None:
        timer.collective(timer._at(self.start), timer._at(self.end))


class StepTimer:
    """Collects one step's phases; ``end_step`` returns the sample."""

    enabled = True

    def __init__(self) -> None:
        self._intervals: list[tuple[float, float]] = []
        self._compute = 0.0
        self._phases = dict.fromkeys(PHASES, 0.0)
        self._calls = 0
        self._bytes = 0
        self._t0 = 0.0
        self._step = 0
        self._warmup = False
        self._wait = 0.0
        self._buffer_sync = 0.0
        self._phase_s: dict[str, float] = {}
        self._collectives: list[tuple[float, float]] = []  # (start, duration)
        #: the step's device clock (``begin_step``'s ``events``); None: the host's clock
        self.events: DeviceEvents | None = None
        self._origin_mark: Any = None  # the step's first event on the device
        #: device intervals, read at ``end_step``
        self._marked: list[_ComputeMarks | _CommMarks | _CollectiveMarks] = []

    def begin_step(self, step: int, warmup: bool, wait_s: float = 0.0,
                   events: DeviceEvents | None = None) -> None:
        """Start a step; ``events``: the workload's device clock, where it computes on a
        GPU (its phases and transfers are then events, read at ``end_step``)."""
        self._intervals.clear()
        self._compute = 0.0
        self._phases = dict.fromkeys(PHASES, 0.0)
        self._calls = self._bytes = 0
        self._buffer_sync = 0.0
        self._phase_s = {}
        self._collectives = []
        self._marked = []
        self._step, self._warmup, self._wait = step, warmup, wait_s
        self._t0 = now()
        self.events = events
        if events is not None:
            self._origin_mark = events.mark()  # on the compute stream: where the step's work begins

    @contextlib.contextmanager
    def compute(self, phase: str) -> Iterator[None]:
        t = now()
        try:
            yield
        finally:
            self.add_compute(now() - t, phase)

    def add_compute(self, seconds: float, phase: str) -> None:
        """Add ``seconds`` of compute to ``phase`` (forward, backward or optimizer)."""
        self._compute += seconds
        self._phases[phase] += seconds

    clock = staticmethod(now)

    # -- on a device: intervals as events, read when the step ends ------------------------

    def mark(self) -> Any:
        """An event recorded now on the current stream (a step with ``events`` only)."""
        return self.events.mark()

    def device_compute(self, phase: str, start: Any, end: Any) -> None:
        """``phase`` ran on the device between marks ``start`` and ``end`` (events on the
        stream that ran it); its seconds are added when the step ends."""
        self._marked.append(_ComputeMarks(phase, start, end))

    def device_comm(self, start: Any, end: Any | None, nbytes: int = 0, calls: int = 1,
                    whole: bool = True, within: tuple[Any, Any] | None = None) -> None:
        """``comm`` for a collective between two device marks, each an event on the stream
        the transfer ran on (or waited on it), read when the step ends. ``within``: only
        the part between these two marks counts (async's in-step windows), and ``end``
        None means still in flight at ``within``'s end."""
        self._need_device_clock()
        self._marked.append(_CommMarks(start, end, nbytes, calls, whole, within))

    def device_collective(self, start: Any, end: Any) -> None:
        """``collective`` between two device marks (async's whole flight)."""
        self._need_device_clock()
        self._marked.append(_CollectiveMarks(start, end))

    def _need_device_clock(self) -> None:
        if self.events is None:
            raise RuntimeError("timer: a device interval in a step begun without a device "
                               "clock (begin_step's events=)")

    def _at(self, m: Any) -> float:
        """Where device mark ``m`` falls on this step's time line (this rank's clock)."""
        return self._t0 + mark_seconds(self._origin_mark, m)

    def _read_marks(self) -> None:
        """Turn the step's device intervals into the host path's records."""
        for interval in self._marked:
            interval.record(self)
        self._marked = []

    def _compute_span(self, phase: str, start: Any, end: Any) -> None:
        """A device phase's seconds (``add_compute`` for events)."""
        StepTimer.add_compute(self, mark_seconds(start, end), phase)

    def comm(self, start: float, end: float, nbytes: int = 0, calls: int = 1,
             whole: bool = True) -> None:
        """Record that a collective of ``nbytes`` was in flight from ``start`` to ``end``.

        ``whole``: the interval is one collective's whole flight on this rank, so its
        duration is also kept for wait vs transfer (``collective``). False for a part
        of a flight (async's windows inside a step), a marker, or a span that is not
        one collective (Horovod's ``synchronize``).
        """
        self._intervals.append((start, end))
        self._calls += calls
        self._bytes += nbytes
        if whole:
            self.collective(start, end)

    def collective(self, start: float, end: float) -> None:
        """Keep one collective's duration for wait vs transfer, without adding comm time
        (for a flight whose in-step parts ``comm`` already recorded: async)."""
        self._collectives.append((start, end - start))

    def buffer_sync(self, start: float, end: float, nbytes: int = 0) -> None:
        """Record a broadcast of model buffers: sync, but not a gradient collective, so it
        stays out of comm time and busbw (and, not being compute, shows in exposed sync)."""
        self._buffer_sync += end - start

    def comm_phase(self, name: str, start: float, end: float) -> None:
        """One phase of an all-reduce already timed by ``comm`` (its parts, not extra time)."""
        self._phase_s[name] = self._phase_s.get(name, 0.0) + (end - start)

    @contextlib.contextmanager
    def comm_span(self, nbytes: int, calls: int = 1, whole: bool = True) -> Iterator[None]:
        """Time a blocking collective of ``nbytes`` (``whole`` as for ``comm``)."""
        t = now()
        try:
            yield
        finally:
            self.comm(t, now(), nbytes, calls, whole)

    def trace(self) -> list[dict] | None:
        """Every step's intervals where this timer keeps them (``TracingStepTimer``)."""
        return None

    def end_step(self) -> StepSample:
        if self.events is not None:
            # the step ends on the compute stream after the optimizer: waiting for that
            # event waits for the step's own work, not for transfers still in flight
            step_s = mark_seconds(self._origin_mark, self.events.mark())
            self._read_marks()
            return self._sample(step_s)
        step_s = now() - self._t0
        if self._marked:  # compute on a device, timed by a host-clock step (no comm marks)
            self._read_marks()
        return self._sample(step_s)

    def _sample(self, step_s: float) -> StepSample:
        return StepSample(
            step=self._step, warmup=self._warmup, wait_s=self._wait, step_s=step_s,
            compute_s=self._compute, comm_s=union_length(self._intervals),
            exposed_sync_s=exposed_sync(step_s, self._compute),
            comm_calls=self._calls, comm_bytes=self._bytes,
            forward_s=self._phases["forward"], backward_s=self._phases["backward"],
            optimizer_s=self._phases["optimizer"], buffer_sync_s=self._buffer_sync,
            comm_phases=dict(self._phase_s),
            # issue order: starts follow it on every rank, completions need not (DDP's Gloo
            # may finish buckets out of order)
            collective_s=[d for _, d in sorted(self._collectives, key=lambda c: c[0])])


_NULL_CTX = contextlib.nullcontext()


class NullTimer:
    """StepTimer's interface with no clock reads: the uninstrumented loop."""

    enabled = False
    events = None

    def begin_step(self, step: int, warmup: bool, wait_s: float = 0.0,
                   events: DeviceEvents | None = None) -> None:
        pass

    def mark(self) -> None:
        return None

    def device_compute(self, phase: str, start: Any, end: Any) -> None:
        pass

    def device_comm(self, start: Any, end: Any | None, nbytes: int = 0, calls: int = 1,
                    whole: bool = True, within: tuple[Any, Any] | None = None) -> None:
        pass

    def device_collective(self, start: Any, end: Any) -> None:
        pass

    def compute(self, phase: str) -> contextlib.AbstractContextManager[None]:
        return _NULL_CTX

    def add_compute(self, seconds: float, phase: str) -> None:
        pass

    @staticmethod
    def clock() -> float:
        return 0.0

    def comm(self, start: float, end: float, nbytes: int = 0, calls: int = 1,
             whole: bool = True) -> None:
        pass

    def collective(self, start: float, end: float) -> None:
        pass

    def buffer_sync(self, start: float, end: float, nbytes: int = 0) -> None:
        pass

    comm_phase = None  # algorithms skip phase marks when given None

    def comm_span(self, nbytes: int, calls: int = 1,
                  whole: bool = True) -> contextlib.AbstractContextManager[None]:
        return _NULL_CTX

    def end_step(self) -> None:
        return None


class TracingStepTimer(StepTimer):
    """StepTimer that also keeps every interval of every step, for ``--timeline``.

    Per step it keeps the pre-step barrier wait, each compute phase and each
    collective's (start, end, bytes), in seconds from this rank's own origin
    (its first step's start): clocks of two ranks are never compared here.
    A compute phase reported as a duration ends when it is reported. The
    default loop uses StepTimer, which keeps none of this.
    """

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[dict] = []
        self._origin: float | None = None

    def begin_step(self, step: int, warmup: bool, wait_s: float = 0.0,
                   events: DeviceEvents | None = None) -> None:
        super().begin_step(step, warmup, wait_s, events)
        if self._origin is None:
            self._origin = self._t0
        t0 = self._t0 - self._origin
        self.steps.append({"step": step, "warmup": warmup, "wait": [t0 - wait_s, t0],
                           "start": t0, "end": None, "phases": [], "comm": [],
                           "comm_phases": []})

    def add_compute(self, seconds: float, phase: str) -> None:
        super().add_compute(seconds, phase)
        end = now() - self._origin
        self.steps[-1]["phases"].append([phase, end - seconds, end])

    def _compute_span(self, phase: str, start: Any, end: Any) -> None:
        seconds = mark_seconds(start, end)
        StepTimer.add_compute(self, seconds, phase)
        # placed where the device ran it; in a host-clock step, ending when it is read
        to = self._at(end) if self.events is not None else now()
        self.steps[-1]["phases"].append([phase, to - seconds - self._origin, to - self._origin])

    def comm(self, start: float, end: float, nbytes: int = 0, calls: int = 1,
             whole: bool = True) -> None:
        super().comm(start, end, nbytes, calls, whole)
        self.steps[-1]["comm"].append([start - self._origin, end - self._origin, nbytes])

    def comm_phase(self, name: str, start: float, end: float) -> None:
        super().comm_phase(name, start, end)
        self.steps[-1]["comm_phases"].append([name, start - self._origin, end - self._origin])

    def buffer_sync(self, start: float, end: float, nbytes: int = 0) -> None:
        super().buffer_sync(start, end, nbytes)
        self.steps[-1]["phases"].append(["buffer broadcast", start - self._origin,
                                         end - self._origin])

    def trace(self) -> list[dict]:
        return self.steps

    def end_step(self) -> StepSample:
        sample = super().end_step()
        self.steps[-1]["end"] = self.steps[-1]["start"] + sample.step_s
        return sample
