"""The step loop: every step of a run on one rank, timed (``commbench.timing``).

Per step, on every rank: a barrier whose duration is recorded as ``wait_s``
(a slow rank's lateness, kept apart from transfer time), then the timed step:
forward, backward (gradients announced to the strategy as they are ready),
the strategy's finish, the optimizer. After the timed step ``on_step`` gets
the sample (``allreduce`` gathers it to rank 0, which writes the step's record
at once: a job killed later keeps every finished step); no collective of the
bookkeeping runs inside a timed step. A rank late from that bookkeeping shows
up in the next step's ``wait_s``, never in its ``step_s``.

On a GPU the workload's device clock (``workload.events``) goes to the timer:
the step then runs from an event on the compute stream to one recorded there
after the optimizer, and its phases and transfers are events read when it ends
(``commbench.timing``); nothing in the loop waits for the whole device.

Rank 0 makes the step's record of every rank's sample
(``commbench.output.step_record``), which splits each collective's duration
into transfer and wait: ``sync_transfer_s`` and ``sync_wait_s`` are not the
pre-step barrier's ``wait_s``.
"""

from __future__ import annotations

from collections.abc import Callable

from commbench import watchdog
from commbench.buffers import BufferSync
from commbench.comm.base import Communicator
from commbench.hostload import HostMonitor
from commbench.linkstats import link_iface, read_iface_bytes
from commbench.strategies.base import Strategy
from commbench.timing import NullTimer, StepSample, StepTimer, now
from commbench.torchtrace import NoTrace

#: called as ``hook(comm, step)`` on every rank inside every step of ``run_steps``, after the
#: pre-step barrier and the strategy's ``begin_step``, where the step's compute begins (its
#: time counts as compute): the place for a program that runs the tools to act on one rank at
#: one step (to make it slow, fail or stop). Empty unless such a program adds to it.
STEP_HOOKS: list[Callable[[Communicator, int], None]] = []

def _local_only(_i: int) -> None:
    """``on_ready`` of a micro-batch that only accumulates."""


def run_steps(comm: Communicator, workload, strategy: Strategy,
              timer: StepTimer | NullTimer, steps: int, warmup: int,
              first_step: int = 0, accum_steps: int = 1,
              on_step: Callable[[StepSample], None] | None = None,
              buffers: BufferSync | None = None,
              trace: NoTrace | None = None,
              host: HostMonitor | None = None) -> list[StepSample]:
    """Run ``warmup + steps`` steps; return this rank's samples (empty for NullTimer).

    ``on_step`` gets each sample as its step ends, outside the timed region
    (``allreduce`` gathers it and rank 0 writes the step's record at once, so
    a job killed later keeps every finished step). The process's watchdog
    (``commbench.watchdog``) is armed from the pre-step barrier to then.

    With ``accum_steps`` k a step is k micro-batches (Horovod's
    ``backward_passes_per_step``): gradients accumulate locally and only the
    last micro-batch's backward announces them, so sync runs once per step.

    ``buffers`` (``commbench.buffers``) broadcasts rank 0's model buffers before
    every forward under the ``broadcast`` rule, timed as ``buffer_sync_s``.

    ``trace`` (``commbench.torchtrace``, ``--trace torch``) puts a window of steps
    under ``torch.profiler``: it starts before a step's barrier and stops after its
    record, outside the timed region; each sample says whether its step was traced.

    ``host`` (``commbench.hostload``) reads the host's counters from the first measured
    step's barrier to the end of the last step.
    """
    samples = []
    trace = trace or NoTrace()
    iface = link_iface() if comm.local_rank == 0 and timer.enabled else None
    wd = watchdog.current()
    for k in range(first_step, first_step + warmup + steps):
        if host is not None and k - first_step == warmup:
            host.start()
        wd.begin_step(k)
        trace.before_step(k)
        t = now()
        comm.barrier()
        wait_s = now() - t
        if iface:
            rx0, tx0 = read_iface_bytes(iface)
        with trace.step(k):
            timer.begin_step(k, k - first_step < warmup, wait_s, events=workload.events)
            strategy.begin_step(timer)
            for hook in STEP_HOOKS:
                hook(comm, k)
            for m in range(accum_steps):
                last = m == accum_steps - 1
                with strategy.micro_batch(last):
                    if buffers is not None:
                        buffers.before_forward(timer)
                    with trace.phase("forward"):
                        workload.forward(timer, strategy.poll, accumulate=m > 0)
                    with trace.phase("backward"):
                        workload.backward(timer, strategy.on_ready if last else _local_only,
                                          strategy.poll, accumulate=m > 0)
            with trace.phase("sync"):
                strategy.finish()
            with trace.phase("optimizer"):
                workload.optimizer_step(timer)
            sample = timer.end_step()
        if sample is not None:
            sample.traced = trace.covers(k)
            if iface:
                rx1, tx1 = read_iface_bytes(iface)
                sample.link_bytes = max(rx1 - rx0, tx1 - tx0)
            samples.append(sample)
            if on_step is not None:
                on_step(sample)
        wd.end_step()
        trace.after_step(k, timer)
    if host is not None:
        host.stop()
    return samples
