"""The step loop and what is made of its samples: records and summaries.

Per step, on every rank: a barrier whose duration is recorded as ``wait_s``
(a slow rank's lateness, kept apart from transfer time), then the timed step:
forward, backward (gradients announced to the strategy as they are ready),
the strategy's finish, the optimizer. After the timed step ``on_step`` gets
the sample (``allreduce`` gathers it to rank 0, which writes the step's record
at once: a job killed later keeps every finished step); no collective of the
bookkeeping runs inside a timed step. A rank late from that bookkeeping shows
up in the next step's ``wait_s``, never in its ``step_s``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from commbench import faults, metrics, watchdog
from commbench.buffers import BufferSync
from commbench.comm.base import Communicator
from commbench.linkstats import link_efficiency, link_iface, read_iface_bytes
from commbench.strategies.base import Strategy
from commbench.timing import NullTimer, StepSample, StepTimer, now

RANK_FIELDS = ("wait_s", "step_s", "compute_s", "comm_s", "exposed_sync_s", "forward_s",
               "backward_s", "optimizer_s", "buffer_sync_s")


def _local_only(_i: int) -> None:
    """``on_ready`` of a micro-batch that only accumulates."""


def run_steps(comm: Communicator, workload, strategy: Strategy,
              timer: StepTimer | NullTimer, steps: int, warmup: int,
              first_step: int = 0, accum_steps: int = 1,
              on_step: Callable[[StepSample], None] | None = None,
              buffers: BufferSync | None = None) -> list[StepSample]:
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
    """
    samples = []
    iface = link_iface() if comm.local_rank == 0 and timer.enabled else None
    wd = watchdog.current()
    for k in range(first_step, first_step + warmup + steps):
        wd.begin_step(k)
        t = now()
        comm.barrier()
        wait_s = now() - t
        if iface:
            rx0, tx0 = read_iface_bytes(iface)
        timer.begin_step(k, k - first_step < warmup, wait_s)
        strategy.begin_step(timer)
        faults.at_step(comm.rank, k)  # test-only fault injection; nothing unless set
        for m in range(accum_steps):
            last = m == accum_steps - 1
            with strategy.micro_batch(last):
                if buffers is not None:
                    buffers.before_forward(timer)
                workload.forward(timer, strategy.progress, accumulate=m > 0)
                workload.backward(timer, strategy.on_ready if last else _local_only,
                                  strategy.progress, accumulate=m > 0)
        strategy.finish()
        workload.optimizer_step(timer)
        sample = timer.end_step()
        if sample is not None:
            if iface:
                rx1, tx1 = read_iface_bytes(iface)
                sample.link_bytes = max(rx1 - rx0, tx1 - tx0)
            samples.append(sample)
            if on_step is not None:
                on_step(sample)
        wd.end_step()
    return samples


def step_record(per_rank: Sequence[StepSample], world_size: int,
                link_wire_gbps: float | None = None) -> dict:
    """Reduce one step's per-rank samples: the step takes as long as its slowest rank.

    Compute, comm and exposed sync are those of that critical-path rank, so
    ``step_s = compute_s + exposed_sync_s`` holds within the record; every
    rank's raw numbers are kept under ``ranks``.
    """
    crit = max(range(len(per_rank)), key=lambda r: per_rank[r].step_s)
    c = per_rank[crit]
    link = [s.link_bytes for s in per_rank if s.link_bytes is not None]
    link_bytes = max(link) if link else None
    return {
        "step": c.step,
        "warmup": c.warmup,
        "critical_rank": crit,
        "step_s": c.step_s,
        "compute_s": c.compute_s,
        "forward_s": c.forward_s,
        "backward_s": c.backward_s,
        "optimizer_s": c.optimizer_s,
        "buffer_sync_s": c.buffer_sync_s,
        "comm_s": c.comm_s,
        "exposed_sync_s": c.exposed_sync_s,
        "sync_share": metrics.sync_share(c.exposed_sync_s, c.step_s),
        "overlap": metrics.overlap(c.exposed_sync_s, c.comm_s),
        "wait_s": max(s.wait_s for s in per_rank),
        "comm_calls": c.comm_calls,
        "comm_bytes": c.comm_bytes,
        "busbw_gbps": metrics.busbw(c.comm_bytes, c.comm_s, world_size)
        if c.comm_calls else None,
        "link_bytes": link_bytes,
        "link_efficiency": link_efficiency(link_bytes, link_wire_gbps, c.comm_s),
        "comm_phases_s": c.comm_phases,
        "ranks": {**{f: [getattr(s, f) for s in per_rank] for f in RANK_FIELDS},
                  "comm_phases_s": [s.comm_phases for s in per_rank]},
    }


SUMMARY_FIELDS = ("step_s", "compute_s", "forward_s", "backward_s", "optimizer_s", "comm_s",
                  "buffer_sync_s", "exposed_sync_s", "sync_share", "overlap", "busbw_gbps",
                  "wait_s", "throughput", "link_bytes", "link_efficiency")


def summarize_steps(steps: Sequence[dict], samples_per_step: int) -> dict:
    """Median/p5/p95/count of every step field over the measured (non-warm-up) steps.

    The summary's plain fields (``step_s``, ``sync_share``, …) are the medians.
    """
    measured = [s for s in steps if not s["warmup"]]
    out: dict = {"measured_steps": len(measured), "warmup_steps": len(steps) - len(measured)}
    stats = {}
    for f in SUMMARY_FIELDS:
        if f == "throughput":
            vals = [samples_per_step / s["step_s"] for s in measured if s["step_s"] > 0]
        else:
            vals = [s[f] for s in measured if s.get(f) is not None]
        stats[f] = metrics.summarize(vals)
        out[f] = stats[f]["median"]
    names = list(dict.fromkeys(k for s in measured for k in s.get("comm_phases_s") or {}))
    if names:  # medians of each phase of the all-reduce (critical-path rank's)
        stats["comm_phases_s"] = {k: metrics.summarize(
            [s["comm_phases_s"][k] for s in measured if k in (s.get("comm_phases_s") or {})])
            for k in names}
        out["comm_phases_s"] = {k: v["median"] for k, v in stats["comm_phases_s"].items()}
    out["stats"] = stats
    return out
