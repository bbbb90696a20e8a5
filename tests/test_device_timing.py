"""Timing on a GPU, checked on the CPU through a stand-in for ``torch.cuda``.

The device path of the phase timing (``commbench.timing.DeviceEvents``) cannot run
here: no GPU. Its seam is the CUDA namespace the events and streams come from, so a
stand-in that keeps a scripted device clock and records every call shows what the
timing asks of the device: each phase's and transfer's ends are events on the stream
that ran it, read when the step ends; no device-wide synchronise on the training path;
DDP's compute ends before its reducer makes the compute stream wait; the engine's
transfers and the tuner's gradient-ready stamps are events.
"""

from __future__ import annotations

import contextlib
import re
import threading
from pathlib import Path

import pytest
import torch

from commbench.comm.engine import TransferEngine
from commbench.steploop import run_steps
from commbench.strategies.base import Strategy
from commbench.strategies.bucketed import BucketedSettings, BucketedStrategy
from commbench.strategies.tuner import BucketTuner
from commbench.timing import DeviceEvents, NullTimer, StepTimer, TracingStepTimer
from commbench.workloads.real import RealWorkload

ROOT = Path(__file__).resolve().parent.parent


class _Stream:
    def __init__(self, cuda: _Cuda, name: str) -> None:
        self.cuda, self.name = cuda, name

    def wait_event(self, ev: _Event) -> None:
        self.cuda.calls.append(("wait_event", self.name, ev.id))

    def wait_stream(self, other: _Stream) -> None:
        self.cuda.calls.append(("wait_stream", self.name, other.name))


class _Event:
    def __init__(self, cuda: _Cuda) -> None:
        self.cuda = cuda
        cuda.made += 1
        self.id = cuda.made
        self.t: float | None = None
        self.stream: str | None = None

    def record(self, stream: _Stream) -> None:
        self.t, self.stream = self.cuda.t, stream.name
        self.cuda.calls.append(("record", stream.name, self.id))

    def synchronize(self) -> None:
        assert self.t is not None, "waited for an event never recorded"
        self.cuda.calls.append(("event_synchronize", self.id))

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: _Event) -> float:
        assert self.t is not None and end.t is not None
        return (end.t - self.t) * 1e3  # ms, as CUDA's


class _Cuda:
    """Stand-in for ``torch.cuda``: streams, events on a device clock the test moves
    (``t``, seconds), and the record of every call (``calls``)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.t = 0.0
        self.made = 0
        self.compute = _Stream(self, "compute")
        self.streams = 0
        self._current = threading.local()

    def current_stream(self, device=None) -> _Stream:
        return self._current.__dict__.get("s", self.compute)

    def Stream(self, device=None) -> _Stream:  # noqa: N802 - torch.cuda's name
        self.streams += 1
        return _Stream(self, f"side{self.streams}")

    @contextlib.contextmanager
    def stream(self, s: _Stream):
        prev = self.current_stream()
        self._current.s = s
        try:
            yield
        finally:
            self._current.s = prev

    def Event(self, enable_timing: bool = False) -> _Event:  # noqa: N802
        assert enable_timing
        return _Event(self)

    def synchronize(self, device=None) -> None:
        self.calls.append(("device_synchronize",))

    def kinds(self) -> set[str]:
        return {c[0] for c in self.calls}


def _compute_records(cuda: _Cuda) -> list[int]:
    return [c[2] for c in cuda.calls if c[0] == "record" and c[1] == "compute"]


# --- the step timer on a device ----------------------------------------------------------


def test_a_device_step_is_read_from_its_events_when_it_ends():
    cuda = _Cuda()
    ev = DeviceEvents("cuda:0", cuda)
    timer = StepTimer()
    timer.begin_step(0, False, events=ev)  # the step's first event, on the compute stream
    f0 = timer.mark()
    cuda.t = 0.010
    f1 = timer.mark()
    timer.device_compute("forward", f0, f1)
    c0 = timer.mark()  # a collective from 10 to 40 ms, on the device's clock
    cuda.t = 0.030
    timer.device_compute("backward", f1, timer.mark())
    cuda.t = 0.040
    c1 = ev.mark(ev.new_stream())
    timer.device_comm(c0, c1, nbytes=100)
    assert "event_synchronize" not in cuda.kinds()  # nothing is read before the step ends
    cuda.t = 0.045
    s = timer.end_step()
    assert s.step_s == pytest.approx(0.045)
    assert (s.forward_s, s.backward_s, s.compute_s) == pytest.approx((0.010, 0.020, 0.030))
    assert s.comm_s == pytest.approx(0.030) and s.comm_bytes == 100
    assert s.collective_s == pytest.approx([0.030])
    assert s.exposed_sync_s == pytest.approx(0.015)
    assert "device_synchronize" not in cuda.kinds()
    # the step's end: an event recorded on the compute stream, waited for alone
    assert ("event_synchronize", _compute_records(cuda)[-1]) in cuda.calls


def test_a_window_clips_a_flight_and_an_unfinished_one_runs_to_its_end():
    cuda = _Cuda()
    ev = DeviceEvents("cuda", cuda)
    comm = ev.new_stream()
    early = ev.mark(comm)  # began before the step
    cuda.t = 1.0
    timer = StepTimer()
    timer.begin_step(0, False, events=ev)
    lo = timer.mark()
    cuda.t = 1.2
    done = ev.mark(comm)
    late = ev.mark(comm)
    cuda.t = 1.5
    hi = timer.mark()
    timer.device_comm(early, done, 0, calls=0, whole=False, within=(lo, hi))  # 1.0 - 1.2
    timer.device_comm(late, None, 0, calls=0, whole=False, within=(lo, hi))  # 1.2 - 1.5
    s = timer.end_step()
    assert s.comm_s == pytest.approx(0.5) and s.collective_s == []


def test_a_device_interval_needs_a_step_begun_on_the_device():
    timer = StepTimer()
    timer.begin_step(0, False)
    with pytest.raises(RuntimeError, match="events="):
        timer.device_comm(object(), object())
    NullTimer().device_comm(object(), None)  # the uninstrumented loop reads nothing


def test_the_timeline_places_device_phases_where_the_device_ran_them():
    cuda = _Cuda()
    ev = DeviceEvents("cuda", cuda)
    timer = TracingStepTimer()
    timer.begin_step(0, False, events=ev)
    cuda.t = 0.002
    a = timer.mark()
    cuda.t = 0.005
    timer.device_compute("forward", a, timer.mark())
    timer.end_step()
    (phase,) = timer.steps[0]["phases"]
    assert phase[0] == "forward"
    assert phase[2] - phase[1] == pytest.approx(0.003)
    assert phase[1] - timer.steps[0]["start"] == pytest.approx(0.002)


# --- a whole step: the workload's phases and a strategy's collective ----------------------


class _OneRank:
    """One rank: a barrier that returns."""

    rank, size, local_rank = 0, 1, 1  # local_rank != 0: no link counters read

    def barrier(self) -> None:
        pass


class _StreamWaitingStrategy(Strategy):
    """A strategy whose ``finish`` does what flat's does on NCCL: a collective on a
    communication stream from 'now' to 50 ms later, after which the compute stream is
    made to wait for it."""

    name = "stand-in"

    def __init__(self, cuda: _Cuda, events: DeviceEvents, grads) -> None:
        super().__init__(_OneRank(), grads)
        self.cuda, self.events = cuda, events
        self.comm_stream = events.new_stream()
        self.waited_at: list[int] = []

    def finish(self) -> None:
        start = self.events.mark(self.comm_stream)
        self.cuda.t += 0.050
        end = self.events.mark(self.comm_stream)
        self.cuda.compute.wait_event(end)
        self.waited_at.append(len(self.cuda.calls) - 1)
        self.timer.device_comm(start, end, 8)


def _workload(cuda: _Cuda, forward_s: float, backward_s: float, optimizer_s: float):
    wl = RealWorkload("smallcnn", rank=0, batch_size=2, num_classes=10, image_size=32)
    wl.events = DeviceEvents("cuda", cuda)  # the seam: this workload 'computes on a GPU'

    def advance(s: float):
        def hook(*_args) -> None:
            cuda.t += s
        return hook
    # the device's time moves as the model's work runs: forward as the model returns,
    # backward as each gradient is computed (before it is accumulated and announced),
    # the optimizer as it steps
    wl.net.register_forward_hook(advance(forward_s))
    per_grad = backward_s / len(wl.params)
    for p in wl.params:
        p.register_hook(advance(per_grad))
    wl.opt.register_step_post_hook(advance(optimizer_s))
    return wl


def test_phases_are_events_on_the_compute_stream_and_no_device_wide_synchronise():
    cuda = _Cuda()
    wl = _workload(cuda, 0.010, 0.020, 0.005)
    strategy = _StreamWaitingStrategy(cuda, wl.events, wl.grads)
    (s,) = run_steps(_OneRank(), wl, strategy, StepTimer(), steps=1, warmup=0)
    assert "device_synchronize" not in cuda.kinds()
    # compute is the model's work only; the collective the compute stream waited for
    # is exposed sync, not compute
    assert s.forward_s == pytest.approx(0.010)
    assert s.backward_s == pytest.approx(0.020)
    assert s.optimizer_s == pytest.approx(0.005)
    assert s.step_s == pytest.approx(0.085)
    assert s.exposed_sync_s == pytest.approx(0.050) and s.comm_s == pytest.approx(0.050)
    # every event is read after the step's last record, the step's end on the compute stream
    first_read = min(i for i, c in enumerate(cuda.calls) if c[0] == "event_synchronize")
    assert all(c[0] != "record" for c in cuda.calls[first_read:])
    assert cuda.calls[first_read - 1][:2] == ("record", "compute")
    # the compute stream waited once, inside finish: between backward's end and the optimizer
    (wait,) = strategy.waited_at
    assert [c for c in cuda.calls if c[0].startswith("wait")] == [cuda.calls[wait]]


def test_ddp_compute_ends_in_the_last_gradients_hook_before_the_reducer_waits():
    """DDP's reducer, at the end of backward (an autograd callback), makes the compute
    stream wait for its all-reduces: an event after ``loss.backward()`` would complete
    after the communication. The workload's end of backward is the last hook's event."""
    cuda = _Cuda()
    wl = _workload(cuda, 0.0, 0.020, 0.0)
    comm_stream = _Stream(cuda, "nccl")
    waits: list[int] = []

    def reducer_wait() -> None:  # DDP's finalize_backward: the stream waits, comm takes 30 ms
        cuda.t += 0.030
        cuda.compute.wait_stream(comm_stream)
        waits.append(len(cuda.calls) - 1)

    last = wl.params[wl.backward_order[-1]]
    last.register_post_accumulate_grad_hook(
        lambda _p: torch.autograd.Variable._execution_engine.queue_callback(reducer_wait))
    timer = StepTimer()
    for sync_in_backward, want in ((False, 0.050), (True, 0.020)):
        wl.sync_in_backward = sync_in_backward
        timer.begin_step(0, False, events=wl.events)
        wl.forward(timer)
        wl.backward(timer, lambda i: None)
        s = timer.end_step()
        # the project's strategies: backward ends once it has returned (nothing made the
        # compute stream wait inside it); DDP: at the last hook, before the reducer's wait
        assert s.backward_s == pytest.approx(want)
    assert len(waits) == 2 and "device_synchronize" not in cuda.kinds()


def test_no_device_wide_synchronise_in_the_training_path_source():
    """What the stand-in cannot reach (the strategies' GPU branches) is read: no module
    that runs inside a timed step calls ``torch.cuda.synchronize``."""
    modules = ["commbench/timing.py", "commbench/steploop.py", "commbench/comm/engine.py",
               *map(str, (ROOT / "commbench/workloads").glob("*.py")),
               *map(str, (ROOT / "commbench/strategies").glob("*.py"))]
    found = [m for m in modules
             if re.search(r"cuda\.synchronize\(", (ROOT / m).read_text())]
    assert found == []


# --- the transfer engine and the tuner ------------------------------------------------------


class _Comm:
    name = "stand-in"
    supports_p2p = False
    progresses_itself = False
    size, rank = 1, 0

    def __init__(self, cuda: _Cuda) -> None:
        self.cuda = cuda
        self.ran_on: list[str] = []
        self.host_waits = 0

    def dup(self) -> _Comm:
        return self

    def allreduce(self, tensor: torch.Tensor) -> None:
        self.ran_on.append(self.cuda.current_stream().name)
        self.cuda.t += 0.004

    def close(self) -> None:
        pass


class _Handle:
    """A device library's handle: ``wait_on_device`` queues the current stream behind the
    work (4 ms on the device), ``wait`` is the host's."""

    def __init__(self, comm: _Comm) -> None:
        self.comm = comm

    def wait_on_device(self) -> None:
        self.comm.allreduce(torch.zeros(1))

    def wait(self) -> None:
        self.comm.host_waits += 1


class _HandingOffComm(_Comm):
    progresses_itself = True  # the library runs each op: the engine only waits for it

    def iallreduce(self, tensor: torch.Tensor) -> _Handle:
        return _Handle(self)


@pytest.mark.parametrize("comm_class", [_Comm, _HandingOffComm])
def test_the_engine_stamps_device_transfers_with_events_on_its_own_stream(comm_class):
    cuda = _Cuda()
    comm = comm_class(cuda)
    with TransferEngine(comm, "thread", events=DeviceEvents("cuda", cuda)) as engine:
        t = engine.submit(torch.zeros(4))
        t.wait()
    assert t.on_device
    # ready: on the submitting (compute) stream; begun and ended on the engine's stream,
    # which waited for ready; the library ran (or was waited for) with that stream current
    ready = [c for c in cuda.calls if c[0] == "record" and c[2] == t.ready.id]
    assert ready == [("record", "compute", t.ready.id)]
    i_wait = cuda.calls.index(("wait_event", "side1", t.ready.id))
    assert cuda.calls[i_wait + 1] == ("record", "side1", t.start_mark.id)
    assert t.end_mark.stream == "side1" and comm.ran_on == ["side1"]
    assert t.seconds() == pytest.approx(0.004)
    # a library's own work: its end is the engine stream's, then the host waits
    assert comm.host_waits == (comm_class is _HandingOffComm)
    assert "device_synchronize" not in cuda.kinds()


def test_the_engine_on_the_host_keeps_the_hosts_stamps():
    cuda = _Cuda()
    with TransferEngine(_Comm(cuda), "thread") as engine:
        t = engine.submit(torch.zeros(4))
        t.wait()
    assert not t.on_device and t.start_mark is None and cuda.calls == []
    assert t.seconds() == t.end - t.start


def test_the_tuners_gradient_stamps_are_events_read_after_the_step():
    cuda = _Cuda()
    tuner = BucketTuner(["thread"], "thread")
    timer = StepTimer()
    timer.begin_step(0, False, events=DeviceEvents("cuda", cuda))
    for k, i in enumerate([2, 1, 0]):
        cuda.t = 0.1 * k + 5.0
        tuner.stamp(i, timer)
    assert all(c[0] == "record" for c in cuda.calls)  # stamped in the hooks, not read
    timer.end_step()
    assert tuner.ready_seconds() == pytest.approx({2: 0.0, 1: 0.1, 0: 0.2})


class _BucketComm(_Comm):
    device_collectives = False  # the seam below says where the buckets are


def _device_step(s: BucketedStrategy, cuda: _Cuda):
    """One step of ``s`` with its buckets on the (stand-in) GPU: every gradient announced in
    backward's order, then ``finish``; the step's sample."""
    s.events = DeviceEvents("cuda", cuda)  # the seam: the buckets 'stay on the GPU'
    timer = StepTimer()
    timer.begin_step(0, False, events=s.events)
    s.begin_step(timer)
    for i in s.backward_order:
        s.on_ready(i)
    s.finish()
    return timer.end_step()


def test_bucketed_times_its_device_buckets_by_the_engines_events():
    cuda = _Cuda()
    grads = [torch.full((4,), float(i)) for i in range(3)]
    s = BucketedStrategy(_BucketComm(cuda), grads,
                         BucketedSettings(bucket_mb=0, progress="thread", transfer="thread"))
    sample = _device_step(s, cuda)
    s.close()
    # each bucket from the engine's start event to its end event: 4 ms each, one at a time
    assert sample.comm_calls == 3 and sample.comm_s == pytest.approx(0.012)
    assert sample.collective_s == pytest.approx([0.004] * 3)
    assert "device_synchronize" not in cuda.kinds()
    for i, g in enumerate(grads):
        assert torch.equal(g, torch.full_like(g, float(i)))  # the mean over one rank


class _PollHandle(_Handle):
    def test(self) -> bool:
        return True


class _PollComm(_BucketComm):
    def iallreduce(self, tensor: torch.Tensor) -> _PollHandle:
        return _PollHandle(self)


def test_polled_device_buckets_end_on_an_event_queued_behind_their_collective():
    cuda = _Cuda()
    comm = _PollComm(cuda)
    grads = [torch.full((4,), float(i)) for i in range(2)]
    s = BucketedStrategy(comm, grads, BucketedSettings(bucket_mb=0, progress="poll"))
    sample = _device_step(s, cuda)
    # issued on the compute stream; each end queued on the strategy's own stream behind
    # its collective (4 ms each on the device), never by the host's poll
    assert comm.ran_on == ["side1", "side1"] and comm.host_waits == 0
    assert sample.comm_calls == 2 and sample.collective_s == pytest.approx([0.004, 0.004])
    assert "device_synchronize" not in cuda.kinds()
