"""``--trace torch``: a window of measured steps under ``torch.profiler``, one trace per rank.

The traces are what PyTorch's own tools open: Perfetto (ui.perfetto.dev),
TensorBoard's profiler plugin and Holistic Trace Analysis
(``hta.trace_analysis.TraceAnalysis(trace_dir=...)``). Each rank writes
``rank<R>.<ns>.pt.trace.json`` into the run's folder, the name and format
``torch.profiler.tensorboard_trace_handler`` writes, with ``distributedInfo``
(backend, rank, world size) in its header: torch adds that only when
``torch.distributed`` is initialised (the DDP peer), so under the mpi and
horovod backends this module adds it through the profiler's
``add_metadata_json``.

What the trace holds, per traced step:

1. live ``record_function`` ranges on the step's thread: ``ProfilerStep#<k>``
   (the name ``profiler.step()`` gives a step: HTA splits iterations on it)
   around the timed step, and inside it ``forward``, ``backward``, ``sync``
   (the strategy's finish: waiting for what is still in flight) and
   ``optimizer``, with every torch operator they ran;
2. the step's collectives as the strategy timed them (``timing.StepTimer.comm``),
   each a ``commbench collective`` range with its bytes (and the broadcast of
   model buffers, ``buffer broadcast``), and the phases of a two-level or ring
   all-reduce (``comm_phase``) on a second track. They are
   added to the file after the profiler stops: collectives run on the
   transfer engine's thread or inside MPI, where no ``record_function`` of
   this thread reaches (the profiler records ranges of the thread that
   started it), and each is placed from its offset to the start of its step,
   both read on this rank's clock (a few microseconds off the profiler's).

The window is ``--trace-steps`` measured steps in the middle of the run (so
untraced steps lie on both sides of it): the profiler starts before the
first one's pre-step barrier and stops after the last one's record, both
outside every timed step, and each step record says whether its step was
traced (``traced``), so one run compares traced steps with their untraced
neighbours (``runner.summarize_steps``). Steps outside the window pay a no-op
context manager per phase.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from commbench.results import write_atomic

DEFAULT_STEPS = 5  # enough for HTA's per-iteration medians, small enough to open quickly
TRACKS = {"collectives": 1, "collective phases": 2}  # tids no thread of ours has (init's)

_NULL = contextlib.nullcontext()


def window_start(warmup: int, steps: int, count: int) -> int:
    """The first traced step: ``count`` of the ``steps`` measured steps (after ``warmup``)
    in the middle of them, so untraced steps lie on both sides of the window."""
    return warmup + (steps - count) // 2


def trace_dir(results: str | Path, run_id: str) -> Path:
    """Where one run's traces go: beside the results file, one folder per run."""
    results = Path(results)
    return results.parent / f"{results.stem}.torch-trace" / run_id


class NoTrace:
    """``TorchTrace``'s interface, tracing nothing: the step loop's default."""

    def covers(self, step: int) -> bool:
        return False

    def before_step(self, step: int) -> None:
        pass

    def step(self, step: int) -> contextlib.AbstractContextManager:
        return _NULL

    def phase(self, name: str) -> contextlib.AbstractContextManager:
        return _NULL

    def after_step(self, step: int, timer) -> None:
        pass


class TorchTrace(NoTrace):
    """Steps ``first`` .. ``first + count - 1`` under ``torch.profiler``; the trace of
    this rank written into ``directory`` after the last of them.

    Args:
        directory: the run's trace folder (the same on every rank).
        first: the first traced step.
        count: how many steps to trace.
        backend, rank, world_size: for ``distributedInfo``.
        cuda: record CUDA kernels too.
    """

    def __init__(self, directory: str | Path, first: int, count: int, backend: str,
                 rank: int, world_size: int, cuda: bool = False) -> None:
        if count < 1:
            raise ValueError(f"--trace-steps must be >= 1, got {count}")
        self.directory = Path(directory)
        self.first, self.last = first, first + count - 1
        self.distributed_info = {"backend": backend, "rank": rank, "world_size": world_size}
        self.cuda = cuda
        self.path: Path | None = None  # the trace file, once written
        self._prof = None
        self._active = False

    def covers(self, step: int) -> bool:
        return self.first <= step <= self.last

    def before_step(self, step: int) -> None:
        """Start the profiler before the window's first step (outside its timed region)."""
        if step != self.first:
            return
        acts = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * self.cuda
        self._prof = profile(activities=acts, on_trace_ready=self._export)
        self._prof.start()
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            # torch wrote none: rank and world size for HTA, TensorBoard and Perfetto
            self._prof.add_metadata_json("distributedInfo", json.dumps(self.distributed_info))
        self._active = True

    def step(self, step: int) -> contextlib.AbstractContextManager:
        if not self._active:
            return _NULL

        return record_function(f"ProfilerStep#{step}")

    def phase(self, name: str) -> contextlib.AbstractContextManager:
        if not self._active:
            return _NULL

        return record_function(name)

    def after_step(self, step: int, timer) -> None:
        """After the window's last step (its record written): stop, write, add the
        collectives ``timer`` (a ``TracingStepTimer``) kept for the traced steps."""
        if step != self.last or self._prof is None:
            return
        self._active = False
        self._prof.stop()  # calls _export
        self._prof = None
        add_collectives(self.path, [s for s in timer.steps if self.covers(s["step"])])

    def _export(self, prof) -> None:
        """``tensorboard_trace_handler``'s file name, ``rank`` as the worker's name."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / (f"rank{self.distributed_info['rank']}."
                                      f"{time.time_ns()}.pt.trace.json")
        prof.export_chrome_trace(str(self.path))


def add_collectives(path: Path, steps: list[dict]) -> int:
    """Add the collectives (and their phases) of ``steps`` to the trace at ``path``,
    each placed by its offset from the start of its step's ``ProfilerStep#<k>`` range;
    return how many events were added.

    ``steps`` are ``TracingStepTimer.steps`` entries: seconds from that timer's
    own origin, so only differences within a step are used.
    """
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    starts = {e["name"]: e for e in events
              if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")}
    pid = next((e["pid"] for e in starts.values()), os.getpid())
    added = [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
              "args": {"name": f"commbench {track}"}} for track, tid in TRACKS.items()]
    for s in steps:
        anchor = starts.get(f"ProfilerStep#{s['step']}")
        if anchor is None:
            continue

        def event(name: str, start: float, end: float, track: str, args: dict,
                  s=s, anchor=anchor) -> dict:
            return {"ph": "X", "cat": "user_annotation", "name": name, "pid": pid,
                    "tid": TRACKS[track], "ts": anchor["ts"] + (start - s["start"]) * 1e6,
                    "dur": (end - start) * 1e6, "args": {"step": s["step"], **args}}

        for i, (start, end, nbytes) in enumerate(s["comm"]):
            added.append(event("commbench collective", start, end, "collectives",
                               {"index": i, "bytes": nbytes}))
        for name, start, end in s["comm_phases"]:
            added.append(event(name, start, end, "collective phases", {}))
        for name, start, end in s["phases"]:  # --buffers broadcast: sync, not a collective
            if name == "buffer broadcast":
                added.append(event(name, start, end, "collectives", {}))
    events.extend(added)
    write_atomic(path, json.dumps(trace))
    return len(added) - len(TRACKS)
