"""What every tool writes and how: one results file, runs, step records, summaries, a table.

``commbench.lifecycle.run_job`` gives every tool the same life (flags, backend,
checks, abort, exit status); inside a tool's body this module gives every
tool the same records, so ``commbench.allreduce``, ``commbench.microbench``,
``commbench.staleness`` and ``commbench.ps`` differ only in what they run:

1. ``Output.open``: the machine's 1-minute load as the job starts, torch
   threads per rank (``commbench.cores``: the cores shared among the ranks on
   the machine), library versions, the results file (``--output``, else
   ``<output_dir>/<tool>-<time>-<backend>-np<N>.jsonl``) and its writer on rank 0.
2. ``Output.run``: one run (a strategy, a sweep), with its id and the header
   every one of its records carries: ``results.job_header`` plus the fields
   the tool adds (``results.run_fields``; allreduce adds its buffer rule and
   reads its strategy's knobs again at each record).
3. ``Run.step``: a step's per-rank samples gathered to rank 0, reduced to the
   step's record (``runner.step_record``: the slowest rank's step) and
   written at once, so a job killed later keeps every finished step. A tool
   whose ranks are not in step (the parameter server) hands rank 0 the
   samples itself (``Run.record_step``).
4. ``Run.step_summary``: median, p5/p95 and count of every step field over
   the measured steps (``runner.summarize_steps``) and the wall clock of the
   measured steps on rank 0, bookkeeping between steps included (a strategy
   whose transfers run on while step records are gathered is judged by it).
   ``rank_extras`` / ``summarize_extras``: each rank's peak memory, state
   checksums and held-out accuracy at the end of a run, for its summary.
5. ``Output.close``: a ``job_end`` record (the job's header and ``loadavg_end``,
   the load as the job ends) when the job wrote any; then ``Output.table`` on
   rank 0 (unless ``--quiet``).
"""

from __future__ import annotations

import resource
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from commbench import latency, metrics
from commbench.comm.base import Communicator
from commbench.cores import (
    ThreadPlan,
    load_average,
    load_before_job,
    machine_cores,
    runnable_before_job,
)
from commbench.lifecycle import set_torch_threads
from commbench.linkstats import link_efficiency
from commbench.results import ResultWriter, default_output, job_header, link_info, versions
from commbench.tables import Column, format_table, rank0_print
from commbench.timing import StepSample, now


class ToolConfig(Protocol):
    """What the run layer reads of a tool's configuration."""

    output: str | None
    output_dir: str
    quiet: bool

    def as_dict(self) -> dict: ...


#: ``amend(record, attachments)``: a tool's additions to a step record, from what each rank
#: attached to its sample (rank order)
Amend = Callable[[dict, list[Any]], None]


class Output:
    """One tool invocation's results file and what all its runs share."""

    def __init__(self, comm: Communicator, cfg: ToolConfig, path: str | Path,
                 threads: ThreadPlan, vers: dict, loadavg_start: float | None,
                 loadavg_source: str | None = None,
                 runnable_start: float | None = None, alpha: dict | None = None) -> None:
        self.comm = comm
        self.cfg = cfg
        self.path = path
        self.thread_plan = threads
        self.threads = threads.threads
        self.versions = vers
        self.loadavg_start = loadavg_start
        self.loadavg_source = loadavg_source
        self.runnable_start = runnable_start
        #: the emulated per-message latency between nodes (``commbench.latency``)
        self.alpha = alpha or {}
        self.cores = machine_cores()
        #: joins every record of this job to its ``job_end`` record (one file may hold
        #: several jobs: ``--output`` appends)
        self.job_id = uuid.uuid4().hex[:12]
        self._writer = ResultWriter(path) if comm.rank == 0 else None
        self._closed = False

    @classmethod
    def open(cls, comm: Communicator, tool: str, cfg: ToolConfig) -> Output:
        """Read the machine's load before this job's own work, share the cores out among
        the ranks on the machine, read the versions, name the file (nothing is created
        before the first record).

        The load is rank 0's machine's (every rank's, on the emulated and the container
        cluster): the launcher's reading before the job where it gave one
        (``launch.cluster`` does, before its link test), else read here, after
        start-up (imports, backend, and on the emulated cluster its link test:
        there it is well above the machine's load before the job).
        """
        loadavg_start, source = load_before_job()
        runnable = runnable_before_job()
        threads = set_torch_threads(comm.local_size)
        vers = versions(comm.versions())
        alpha = latency.measure(comm)  # on the idle link, before the job's own work
        path = cfg.output or default_output(cfg.output_dir, comm.name, comm.size, tool)
        return cls(comm, cfg, path, threads, vers, loadavg_start, source, runnable, alpha)

    def header(self, kind: str, run_id: str | None) -> dict:
        return job_header(kind=kind, run_id=run_id, backend=self.comm.name,
                          topo=self.comm.topo, vers=self.versions,
                          torch_threads=self.threads, config=self.cfg.as_dict(),
                          job_id=self.job_id, threads=self.thread_plan, cores=self.cores,
                          loadavg_start=self.loadavg_start,
                          loadavg_source=self.loadavg_source,
                          runnable_start=self.runnable_start, alpha=self.alpha)

    def run(self, fields: dict, live: Callable[[], dict] | None = None) -> Run:
        """A new run whose records all carry ``fields`` besides the job's header, and
        ``live()``'s fields, read at each record: what may change as the run goes (a
        strategy's knobs: async reports the buffers it has allocated so far).

        Its wall clock starts now: make it just before the run's step loop.
        """
        return Run(self, fields, live)

    def write(self, record: dict) -> None:
        """Append ``record`` to the file (rank 0 only: the other ranks hold no writer)."""
        if self._writer is None:
            raise RuntimeError(f"rank {self.comm.rank}: records are written on rank 0 only")
        self._writer.write(record)

    def close(self) -> None:
        """Rank 0: end the file with the ``job_end`` record (no run; ``loadavg_end``, the
        load as the job ends, its own ranks' work included) if the job wrote any."""
        if self._writer is None or self._closed:
            return
        self._closed = True
        if self._writer.count:
            self._writer.write({**self.header("job_end", None),
                                "loadavg_end": load_average()})
        self._writer.close()

    def print(self, text: str) -> None:
        """Print on rank 0 unless ``--quiet``."""
        if not self.cfg.quiet:
            rank0_print(self.comm.rank, text)

    def table(self, columns: list[Column], rows: list[list], title: str,
              footer: list[str]) -> None:
        self.print(format_table(columns, rows, title=title, footer=footer))


class Run:
    """The records of one run: a shared header, step records as steps end, a summary."""

    def __init__(self, out: Output, fields: dict,
                 live: Callable[[], dict] | None = None) -> None:
        self.out = out
        self.run_id = uuid.uuid4().hex[:12]
        self.fields = fields
        self._live = live
        #: rank 0: the step records written so far (without the header)
        self.steps: list[dict] = []
        link = link_info()  # interface bytes are compared with the link's rate in that unit
        self._wire_gbps = link["link_wire_gbps"] or link["link_gbps"]
        self._marks = [now()]  # rank 0: the run's start, then the end of each step's record

    def header(self, kind: str) -> dict:
        live = self._live() if self._live is not None else {}
        return {**self.out.header(kind, self.run_id), **self.fields, **live}

    def write(self, kind: str, fields: dict) -> dict:
        """Write one record of ``kind`` (rank 0); return it."""
        record = {**self.header(kind), **fields}
        self.out.write(record)
        return record

    def step(self, sample: StepSample, attachment: Any = None,
             amend: Amend | None = None) -> None:
        """Gather this step's samples (and what each rank attached) to rank 0, which writes
        the step's record now. Collective: every rank calls it after every step."""
        per_rank = self.out.comm.gather_object((sample, attachment))
        if per_rank is not None:
            self.record_step([p[0] for p in per_rank], [p[1] for p in per_rank], amend)

    def record_step(self, samples: Sequence[StepSample], attachments: list[Any],
                    amend: Amend | None = None) -> dict:
        """Rank 0: the record of one step of ``samples`` (one per rank taking part), amended
        by the tool, written; return it."""
        rec = step_record(samples, len(samples), self._wire_gbps)
        if amend is not None:
            amend(rec, attachments)
        self.steps.append(rec)
        self.write("step", rec)
        self._marks.append(now())
        return rec

    def step_summary(self, samples_per_step: int, wall_clock: bool = True) -> dict:
        """Rank 0: statistics of the measured steps recorded so far; with ``wall_clock``,
        ``wall_s`` (rank 0's time from the last warm-up step's record to the last step's)
        and ``wall_throughput`` (samples over it).

        For a pipeline (asynchronous updates with staleness S) this is its steady-state
        rate only when the warm-up steps filled it (warm-up >= S): the first measured
        steps then wait as every later one does, and the S transfers still in flight at
        the end are the ones the warm-up steps' took the place of. With fewer warm-up
        steps the first S measured steps wait for nothing and the rate is flattered: a
        6-step run at 1 Gbit/s with one warm-up step showed S=2 at 1.55x flat.
        """
        out = summarize_steps(self.steps, samples_per_step)
        calls = metrics.percentile([st["comm_calls"] for st in self.steps
                                    if not st["warmup"] and st.get("comm_calls")], 50)
        out.update(latency.latency_fields(self.out.alpha.get("alpha_us"), calls,
                                          out.get("comm_s")))
        if wall_clock:
            wall_s = self._marks[-1] - self._marks[out["warmup_steps"]]
            skip = 0
            if "traced_step_s" in out:  # the traced window (--trace torch) leaves the wall
                # clock when untraced steps lie around it, as it leaves the medians
                at = [i for i, st in enumerate(self.steps) if st.get("traced")]
                skip = len(at)
                wall_s -= self._marks[at[-1] + 1] - self._marks[at[0]]
            out["wall_s"] = wall_s
            out["wall_throughput"] = metrics.throughput(
                (out["measured_steps"] - skip) * samples_per_step, wall_s)
        return out


# -- step records and summaries: every step field made here, once ---------------------

RANK_FIELDS = ("wait_s", "step_s", "compute_s", "comm_s", "exposed_sync_s", "forward_s",
               "backward_s", "optimizer_s", "buffer_sync_s")


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


def merge_rank_fields(rec: dict, per_rank: list[dict | None]) -> None:
    """Add fields each rank attached to its sample (a strategy's ``record_fields("step")``)
    to the step record ``rec``: the critical-path rank's at the top level, as its compute
    and comm are, and every rank's under ``ranks``."""
    attached = [f or {} for f in per_rank]
    rec.update(attached[rec["critical_rank"]])
    for key in dict.fromkeys(k for f in attached for k in f):
        rec["ranks"][key] = [f.get(key) for f in attached]


CHECKSUMS = ("param_checksum", "buffer_checksum", "state_checksum")


def rank_extras(workload) -> dict:
    """Per-rank facts for the summary: peak memory, and checksums of parameters, buffers
    and both (``state_checksum``: equal on every rank when they are in lock-step)."""
    out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if workload.device.type == "cuda":
        out["peak_cuda_mb"] = torch.cuda.max_memory_allocated(workload.device) / 2**20
    out["param_checksum"] = workload.parameter_checksum()
    out["buffer_checksum"] = workload.buffer_checksum()
    out["state_checksum"] = out["param_checksum"] + out["buffer_checksum"]
    accuracy = workload.evaluate()
    if accuracy is not None:
        out["final_accuracy"] = accuracy
    return out


def summarize_extras(per_rank: list[dict]) -> dict:
    """Max over ranks of each memory figure, and every rank's value under ``*_ranks``."""
    out: dict = {}
    for key in per_rank[0]:
        vals = [e[key] for e in per_rank]
        out[f"{key}_ranks"] = vals
        if key == "final_accuracy":
            # rank 0's model; under --buffers local the others evaluated other buffers
            out[key] = vals[0]
            out["final_accuracy_spread"] = max(vals) - min(vals)
        elif key not in CHECKSUMS:
            out[key] = max(vals)
    return out
