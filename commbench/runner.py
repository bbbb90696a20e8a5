"""The step loop and what is made of its samples: records and summaries.

Per step, on every rank: a barrier whose duration is recorded as ``wait_s``
(a slow rank's lateness, kept apart from transfer time), then the timed step:
forward, backward (gradients announced to the strategy as they are ready),
the strategy's finish, the optimizer. After the timed step ``on_step`` gets
the sample (``allreduce`` gathers it to rank 0, which writes the step's record
at once: a job killed later keeps every finished step); no collective of the
bookkeeping runs inside a timed step. A rank late from that bookkeeping shows
up in the next step's ``wait_s``, never in its ``step_s``.

Inside the step, each collective's duration on every rank is split into
transfer and wait (``wait_vs_transfer``): ``sync_transfer_s`` and
``sync_wait_s`` are not the pre-step barrier's ``wait_s``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from commbench import metrics, watchdog
from commbench.buffers import BufferSync
from commbench.comm.base import Communicator
from commbench.linkstats import link_efficiency, link_iface, read_iface_bytes
from commbench.strategies.base import Strategy
from commbench.timing import NullTimer, StepSample, StepTimer, now
from commbench.torchtrace import NoTrace

#: called as ``hook(comm, step)`` on every rank inside every step of ``run_steps``, after the
#: pre-step barrier and the strategy's ``begin_step``, where the step's compute begins (its
#: time counts as compute): the place for a program that runs the tools to act on one rank at
#: one step (to make it slow, fail or stop). Empty unless such a program adds to it.
STEP_HOOKS: list[Callable[[Communicator, int], None]] = []

RANK_FIELDS = ("wait_s", "step_s", "compute_s", "comm_s", "exposed_sync_s", "forward_s",
               "backward_s", "optimizer_s", "buffer_sync_s")


def _local_only(_i: int) -> None:
    """``on_ready`` of a micro-batch that only accumulates."""


def run_steps(comm: Communicator, workload, strategy: Strategy,
              timer: StepTimer | NullTimer, steps: int, warmup: int,
              first_step: int = 0, accum_steps: int = 1,
              on_step: Callable[[StepSample], None] | None = None,
              buffers: BufferSync | None = None,
              trace: NoTrace | None = None) -> list[StepSample]:
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
    """
    samples = []
    trace = trace or NoTrace()
    iface = link_iface() if comm.local_rank == 0 and timer.enabled else None
    wd = watchdog.current()
    for k in range(first_step, first_step + warmup + steps):
        wd.begin_step(k)
        trace.before_step(k)
        t = now()
        comm.barrier()
        wait_s = now() - t
        if iface:
            rx0, tx0 = read_iface_bytes(iface)
        with trace.step(k):
            timer.begin_step(k, k - first_step < warmup, wait_s)
            strategy.begin_step(timer)
            for hook in STEP_HOOKS:
                hook(comm, k)
            for m in range(accum_steps):
                last = m == accum_steps - 1
                with strategy.micro_batch(last):
                    if buffers is not None:
                        buffers.before_forward(timer)
                    with trace.phase("forward"):
                        workload.forward(timer, strategy.progress, accumulate=m > 0)
                    with trace.phase("backward"):
                        workload.backward(timer, strategy.on_ready if last else _local_only,
                                          strategy.progress, accumulate=m > 0)
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
    return samples


#: a rank is named the straggler only where its compute exceeds the fastest rank's by at
#: least this fraction of its own: below it, jitter would name a rank at random (2 ranks of
#: 100 ms replayed compute on a loaded 2-core machine differed by up to 5.5 ms)
STRAGGLER_MIN_IMBALANCE = 0.10


def wait_vs_transfer(per_rank: Sequence[StepSample]) -> dict:
    """Split one step's collectives into transfer and each rank's wait.

    For collective k (the k-th a rank issued in the step; every rank issues
    them in the same order), ``transfer_k = min over ranks of duration_k[r]``:
    the rank that arrived last waits for nobody, so its duration is the
    transfer itself. ``wait_k[r] = duration_k[r] - transfer_k`` is the time
    rank r spent in the collective waiting for later ranks. This is PyTorch
    profiler's distributed view and DeepSpeed's straggler summary: durations
    only, no clocks of two ranks compared, no clock synchronisation.

    A two-level all-reduce is one collective here, not one per phase: inside
    a phase ranks do unequal work (under ``hier-leader`` only node leaders run
    the cross-node all-reduce; on uneven nodes some shards have no cross-node
    peer), so the shortest duration of a phase would be an idle rank's and the
    working ranks' transfer would read as wait. Per-phase times stay in
    ``comm_phases_s``.

    Returns ``sync_transfer_s`` (the sum of the transfers; the same for every
    rank by definition), ``sync_wait_s`` (every rank's sum of waits) and
    ``collectives`` (the number matched). Those are None when no rank timed a
    collective in the step (Horovod's peer, which exposes no per-collective
    times; async's first s steps, which wait for no transfer) or when ranks
    timed different numbers of them: then which of one rank's collectives is
    which of another's is unknown, and a guess would turn skew into transfer.
    """
    counts = [len(s.collective_s) for s in per_rank]
    if not per_rank or max(counts) == 0 or min(counts) != max(counts):
        return {"sync_transfer_s": None, "sync_wait_s": None, "collectives": None}
    transfers = [min(durs) for durs in zip(*(s.collective_s for s in per_rank))]
    waits = [sum(d - t for d, t in zip(s.collective_s, transfers)) for s in per_rank]
    return {"sync_transfer_s": sum(transfers), "sync_wait_s": waits,
            "collectives": counts[0]}


def imbalance(per_rank: Sequence[StepSample]) -> tuple[float, int | None]:
    """(slowest minus fastest rank's compute, the straggler rank or None).

    The straggler is the rank with the most compute, named only where the
    imbalance is at least ``STRAGGLER_MIN_IMBALANCE`` of that rank's compute
    (and never for one rank).
    """
    compute = [s.compute_s for s in per_rank]
    slow = max(range(len(compute)), key=compute.__getitem__)
    gap = compute[slow] - min(compute)
    named = len(compute) > 1 and gap > 0 and gap >= STRAGGLER_MIN_IMBALANCE * compute[slow]
    return gap, slow if named else None


def step_record(per_rank: Sequence[StepSample], world_size: int,
                link_wire_gbps: float | None = None) -> dict:
    """Reduce one step's per-rank samples: the step takes as long as its slowest rank.

    Compute, comm and exposed sync are those of that critical-path rank, so
    ``step_s = compute_s + exposed_sync_s`` holds within the record; every
    rank's raw numbers are kept under ``ranks``.

    Wait vs transfer (``wait_vs_transfer``): ``sync_transfer_s``, the
    critical-path rank's ``sync_wait_s`` (every rank's under ``ranks``) and the
    number of collectives matched; ``ranks.collectives`` is how many each rank
    timed. Ranks of a synchronous step end together, so which one is critical
    is close to chance: with a straggler its ``sync_wait_s`` is ~0 in some
    steps and ~the imbalance in others (as its ``exposed_sync_s`` is);
    ``sync_wait_max_s``, the most any rank waited, is the steady measure of
    time lost to a straggler. Where nothing overlapped the step's compute (flat, hierarchical),
    ``exposed_sync_s`` is about ``sync_wait_s + sync_transfer_s`` (plus packing
    the buffer); where collectives overlapped backward (bucketed, async, DDP)
    the two count hidden time too, and explain exposed sync only in part.
    ``imbalance_s`` and ``straggler_rank`` come from compute (``imbalance``).
    """
    crit = max(range(len(per_rank)), key=lambda r: per_rank[r].step_s)
    c = per_rank[crit]
    split = wait_vs_transfer(per_rank)
    waits = split["sync_wait_s"]
    imbalance_s, straggler = imbalance(per_rank)
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
        "sync_transfer_s": split["sync_transfer_s"],
        "sync_wait_s": waits[crit] if waits is not None else None,
        "sync_wait_max_s": max(waits) if waits is not None else None,
        "collectives": split["collectives"],
        "imbalance_s": imbalance_s,
        "straggler_rank": straggler,
        "comm_calls": c.comm_calls,
        "comm_bytes": c.comm_bytes,
        "busbw_gbps": metrics.busbw(c.comm_bytes, c.comm_s, world_size)
        if c.comm_calls else None,
        "link_bytes": link_bytes,
        "link_efficiency": link_efficiency(link_bytes, link_wire_gbps, c.comm_s),
        "traced": c.traced,  # under torch.profiler (--trace torch)
        "comm_phases_s": c.comm_phases,
        "ranks": {**{f: [getattr(s, f) for s in per_rank] for f in RANK_FIELDS},
                  "comm_phases_s": [s.comm_phases for s in per_rank],
                  "sync_wait_s": waits, "collectives": [len(s.collective_s) for s in per_rank]},
    }


SUMMARY_FIELDS = ("step_s", "compute_s", "forward_s", "backward_s", "optimizer_s", "comm_s",
                  "buffer_sync_s", "exposed_sync_s", "sync_share", "overlap", "busbw_gbps",
                  "wait_s", "sync_wait_s", "sync_wait_max_s", "sync_transfer_s", "imbalance_s",
                  "throughput",
                  "link_bytes", "link_efficiency")


def summarize_steps(steps: Sequence[dict], samples_per_step: int) -> dict:
    """Median/p5/p95/count of every step field over the measured (non-warm-up) steps.

    The summary's plain fields (``step_s``, ``sync_share``, …) are the medians;
    ``straggler_rank`` is the rank named straggler in most measured steps (None
    when no step named one).

    Steps traced by ``torch.profiler`` (``--trace torch``) pay the profiler's
    cost, so where a run also has untraced measured steps the medians are of
    those only, and the traced ones are summarised beside them:
    ``traced_steps``, ``traced_step_s`` (their median) and ``trace_overhead``
    (one run's own comparison: ``traced_step_s`` ÷ the median of the untraced
    steps next to the window, as many on each side as there are traced steps,
    − 1; neighbours, because step times drift over a run: untraced gpt-tiny
    steps here ran ~8 % slower in the first 20 measured steps than later).
    Where every measured step was traced the medians are of them (and say so:
    ``traced_steps == measured_steps``).
    """
    measured = [s for s in steps if not s["warmup"]]
    traced = [s for s in measured if s.get("traced")]
    out: dict = {"measured_steps": len(measured), "warmup_steps": len(steps) - len(measured),
                 "traced_steps": len(traced)}
    neighbours: list[float] = []
    if traced and len(traced) < len(measured):
        out["traced_step_s"] = metrics.percentile([s["step_s"] for s in traced], 50)
        at = [i for i, s in enumerate(measured) if s.get("traced")]
        lo, hi, n = at[0], at[-1], len(traced)
        near = measured[max(0, lo - n):lo] + measured[hi + 1:hi + 1 + n]
        neighbours = [s["step_s"] for s in near]
        measured = [s for s in measured if not s.get("traced")]
    stats = {}
    for f in SUMMARY_FIELDS:
        if f == "throughput":
            vals = [samples_per_step / s["step_s"] for s in measured if s["step_s"] > 0]
        else:
            vals = [s[f] for s in measured if s.get(f) is not None]
        stats[f] = metrics.summarize(vals)
        out[f] = stats[f]["median"]
    if "traced_step_s" in out:
        near = metrics.percentile(neighbours, 50)
        out["trace_overhead"] = out["traced_step_s"] / near - 1 if near > 0 else None
    names = list(dict.fromkeys(k for s in measured for k in s.get("comm_phases_s") or {}))
    if names:  # medians of each phase of the all-reduce (critical-path rank's)
        stats["comm_phases_s"] = {k: metrics.summarize(
            [s["comm_phases_s"][k] for s in measured if k in (s.get("comm_phases_s") or {})])
            for k in names}
        out["comm_phases_s"] = {k: v["median"] for k, v in stats["comm_phases_s"].items()}
    named = Counter(s["straggler_rank"] for s in measured if s.get("straggler_rank") is not None)
    out["straggler_rank"] = named.most_common(1)[0][0] if named else None
    out["stats"] = stats
    return out
