"""The clock rule: rank-side code reads time and sleeps through one clock.

Records hold emulated time (``commbench.dilation``: wall time / K). A rank measures a
duration as a difference of ``timing.now`` (``dilation.now``), sleeps on that clock with
``dilation.sleep``, and on a GPU times what the device ran with its own events
(``torch.cuda.Event`` and ``elapsed_time``, which are not host clocks and are allowed
everywhere). One more clock in a strategy (``time.perf_counter()``) would record wall
time beside emulated time: under ``--dilation K`` its intervals would be K times too long
and nothing else would notice; a ``time.sleep`` in a poller would run K times too fast.

The rule reads every ``.py`` file under ``commbench/`` with ``ast`` (comments and
docstrings do not count) and finds each place that reads a host clock or sleeps:

- the ``time`` module's clocks, ``sleep`` and the calls that read the current time
  (``strftime`` and kin), in any import form (``import time as t``, ``from time import
  perf_counter as pc``), called or passed on as a function; ``timeit.default_timer``;
- ``datetime``'s ``now``/``utcnow``/``today``; ``os.times``;
- timers and waits with a deadline on the wall: a ``timeout=`` keyword on any call,
  ``.wait(t)`` on a ``threading.Event``/``Condition`` and ``.join(t)`` on a
  ``threading.Thread`` made in the same module, ``threading.Timer``,
  ``faulthandler.dump_traceback_later``, ``signal.alarm``/``setitimer``,
  ``asyncio.sleep``.

Each place must be named in ``ALLOWED`` by (file, enclosing function, what) with the
reason its wall clock is meant; an entry that no longer matches anything fails too, so
the list stays the list of what is there. A positional ``Thread.join(t)`` on a thread
the module did not make itself is not seen (``", ".join(parts)`` looks the same without
types); every one of those in the tree also reads ``time.monotonic`` for its deadline,
which is seen.

What dilation cannot place is refused, exit status 2 and one line naming the flags
(``commbench.flags.check_dilation``): ``--trace torch`` and a GPU (``--device cuda``)
under a dilation other than 1.
"""

from __future__ import annotations

import ast
import copy
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from commbench import allreduce, dilation
from commbench.flags import ConfigError, check_dilated_argv, check_dilation, flag_value
from tests.conftest import PY, ROOT

#: what reads a clock or sleeps, by its full dotted name
CLOCKS = frozenset({
    *(f"time.{f}" for f in (
        "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns",
        "process_time", "process_time_ns", "thread_time", "thread_time_ns",
        "clock_gettime", "clock_gettime_ns", "sleep",
        "localtime", "gmtime", "ctime", "asctime", "strftime")),
    "timeit.default_timer",
    "datetime.datetime.now", "datetime.datetime.utcnow", "datetime.datetime.today",
    "datetime.date.today", "os.times",
    "faulthandler.dump_traceback_later", "signal.alarm", "signal.setitimer",
    "threading.Timer", "asyncio.sleep",
})
#: threading objects whose ``wait(t)`` / ``join(t)`` waits on the wall
_WAITABLE = {"threading.Event": "Event.wait", "threading.Condition": "Condition.wait",
             "threading.Thread": "Thread.join"}

#: the wall clocks that are meant: (file, enclosing function, what) -> why
ALLOWED: dict[tuple[str, str, str], str] = {
    # -- the clock itself ------------------------------------------------------------------
    ("commbench/dilation.py", "now", "time.perf_counter"):
        "the emulated clock: perf_counter / K, which timing.now is",
    ("commbench/dilation.py", "sleep", "time.sleep"):
        "the emulated sleep: K times the emulated seconds on the wall",
    # -- the host's own accounting (docs/fidelity.md): the host works on the wall ---------
    ("commbench/hostload.py", "polled.wrapper", "time.perf_counter_ns"):
        "host load: wall time around a busy-polling call, less its CPU time, is its "
        "run-queue wait; both must be on the wall, as the scheduler's are",
    ("commbench/hostload.py", "polled.wrapper", "time.thread_time_ns"):
        "host load: the thread's CPU time inside a busy-polling call",
    ("commbench/hostload.py", "HostMonitor.start", "time.perf_counter"):
        "host load: the window's wall seconds, the denominator of CPU and idle shares "
        "(HostWindow.window_s)",
    ("commbench/hostload.py", "HostMonitor.stop", "time.perf_counter"):
        "host load: the window's end, as HostMonitor.start",
    ("commbench/cores.py", "runnable_tasks", "time.sleep"):
        "the machine's runnable tasks sampled over wall time, read by the launcher "
        "before a job (no rank's measurement)",
    # -- deadlines: the watchdog and the job's end work on the wall (dilation.wall) ---------
    ("commbench/watchdog.py", "Watchdog.begin_step", "time.monotonic"):
        "the step deadline's start; the deadline is dilation.wall(seconds)",
    ("commbench/watchdog.py", "Watchdog.begin_step", "faulthandler.dump_traceback_later"):
        "the backstop that ends a rank stuck holding the GIL, on the wall as the deadline",
    ("commbench/watchdog.py", "Watchdog.end_step", "time.monotonic"):
        "the slowest step so far, for the auto deadline (wall, as the deadline)",
    ("commbench/watchdog.py", "Watchdog.stop", "timeout="):
        "joins the watchdog's thread for at most two polls",
    ("commbench/watchdog.py", "Watchdog._run", "Event.wait"):
        "the watchdog's poll interval, on the wall as its deadline",
    ("commbench/watchdog.py", "Watchdog._run", "time.monotonic"):
        "whether the step is past its wall deadline",
    ("commbench/watchdog.py", "Watchdog._expired", "time.monotonic"):
        "the grace period and the stalled time it reports, on the wall",
    ("commbench/watchdog.py", "Watchdog._expired", "time.sleep"):
        "polls the side channel during the grace period (wall)",
    ("commbench/lifecycle.py", "report_bad_input", "time.sleep"):
        "bad input: ranks other than 0 wait for rank 0's message to reach the launcher "
        "(a wall grace period; nothing is timed)",
    ("commbench/comm/torchdist.py", "join_waiters", "time.monotonic"):
        "close: at most WAITERS_JOIN_S for the waiting threads to end (a wall deadline)",
    ("commbench/results.py", "code_revision", "timeout="):
        "a deadline for the git calls that name the code's revision (wall; not timed)",
    # -- names and stamps, not durations ----------------------------------------------------
    ("commbench/results.py", "default_output", "time.strftime"):
        "the results file's name (date and time of day), not a duration",
    ("commbench/torchtrace.py", "TorchTrace._export", "time.time_ns"):
        "the trace file's name, as tensorboard_trace_handler names it; not a duration",
    # -- waits outside any timed region -----------------------------------------------------
    ("commbench/latency.py", "_wait_idle", "time.sleep"):
        "ranks outside the latency group wait for it without spinning; nothing is timed "
        "and the interval only sets how soon they notice",
    ("commbench/comm/torchdist.py", "_WorkHandle.wait", "time.sleep"):
        "NCCL: polls the work's CUDA event between short sleeps; runs on a GPU only, where "
        "the dilation is 1 (refused otherwise: flags.check_dilation), so dilation.sleep "
        "would sleep the same",
}


@dataclass(frozen=True)
class Hit:
    path: str   # relative to the repository root
    line: int
    where: str  # the enclosing function's qualified name, or <module>
    what: str   # the clock, e.g. time.perf_counter, or timeout=

    @property
    def key(self) -> tuple[str, str, str]:
        return self.path, self.where, self.what

    def __str__(self) -> str:
        return f"{self.path}:{self.line} in {self.where}: {self.what}"


class _Scan(ast.NodeVisitor):
    """The clock reads and sleeps of one module (``scan``)."""

    def __init__(self, path: str, tree: ast.Module) -> None:
        self.path = path
        self.hits: list[Hit] = []
        self._stack: list[str] = []
        self._bound: dict[str, str] = {}  # local name -> what it is bound to (dotted)
        for node in ast.walk(tree):  # imports anywhere in the module, functions' included
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self._bound[a.asname] = a.name
                    else:  # "import os.path" binds "os"
                        top = a.name.split(".")[0]
                        self._bound[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    self._bound[a.asname or a.name] = f"{node.module}.{a.name}"
        self._waitables: dict[str, str] = {}  # receiver (as written) -> its wait's name
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
                kind = _WAITABLE.get(self._dotted(node.value.func) or "")
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets if kind else ():
                    self._waitables[ast.unparse(t)] = kind

    def _dotted(self, node: ast.expr) -> str | None:
        """``node``'s full dotted name, imports resolved (``t.sleep`` -> ``time.sleep``)."""
        if isinstance(node, ast.Name):
            return self._bound.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self._dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def _hit(self, node: ast.AST, what: str) -> None:
        where = ".".join(self._stack) or "<module>"
        self.hits.append(Hit(self.path, node.lineno, where, what))

    def _scope(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self._stack.append(node.name)
        self.generic_visit(node)
        self._stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scope

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = self._dotted(node)
        if name in CLOCKS:
            self._hit(node, name)
            return
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if self._bound.get(node.id) in CLOCKS:  # from time import perf_counter
            self._hit(node, self._bound[node.id])

    def visit_Call(self, node: ast.Call) -> None:
        if any(kw.arg == "timeout" for kw in node.keywords):
            self._hit(node, "timeout=")
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in ("wait", "join") and node.args:
            kind = self._waitables.get(ast.unparse(f.value))
            if kind is not None and kind.endswith(f".{f.attr}"):
                self._hit(node, kind)
        self.generic_visit(node)


def scan(source: str, path: str) -> list[Hit]:
    """Every place in ``source`` (the file at ``path``) that reads a clock or sleeps."""
    tree = ast.parse(source, filename=path)
    s = _Scan(path, tree)
    s.visit(tree)
    return s.hits


def rank_side_files() -> list[Path]:
    return sorted(p for p in (ROOT / "commbench").rglob("*.py")
                  if "__pycache__" not in p.parts)


def all_hits() -> Iterator[Hit]:
    for p in rank_side_files():
        yield from scan(p.read_text(), p.relative_to(ROOT).as_posix())


def broken(hits: list[Hit]) -> list[Hit]:
    """The hits the allow-list does not name."""
    return [h for h in hits if h.key not in ALLOWED]


# -- the rule on the tree --------------------------------------------------------------

def test_rank_side_code_reads_only_the_emulated_clock():
    bad = broken(list(all_hits()))
    assert not bad, ("rank-side code reads a clock or sleeps other than through timing.now "
                     "/ dilation.sleep (or device events); use those, or name the place in "
                     "ALLOWED with the reason its wall clock is meant:\n  "
                     + "\n  ".join(map(str, bad)))


def test_every_allowed_entry_is_still_there():
    seen = {h.key for h in all_hits()}
    stale = [k for k in ALLOWED if k not in seen]
    assert not stale, f"ALLOWED names places the tree no longer has: {stale}"


def test_every_allowed_entry_says_why():
    assert all(len(why.split()) >= 4 for why in ALLOWED.values())


# -- the rule on planted sources -------------------------------------------------------

STRATEGY = "commbench/strategies/flat.py"


@pytest.mark.parametrize("source,what", [
    ("import time\n\ndef finish(self):\n    t0 = time.perf_counter()\n", "time.perf_counter"),
    ("import time as t\n\ndef finish(self):\n    t.sleep(0.001)\n", "time.sleep"),
    ("from time import monotonic as clock\n\ndef finish(self):\n    return clock()\n",
     "time.monotonic"),
    ("import time\n\nCLOCK = time.perf_counter_ns\n", "time.perf_counter_ns"),
    ("from timeit import default_timer\n\ndef f():\n    default_timer()\n",
     "timeit.default_timer"),
    ("from datetime import datetime\n\ndef f():\n    return datetime.now()\n",
     "datetime.datetime.now"),
    ("import datetime\n\ndef f():\n    return datetime.datetime.utcnow()\n",
     "datetime.datetime.utcnow"),
    ("import threading\n\nclass S:\n    def __init__(self):\n        self.ev = threading.Event()"
     "\n\n    def finish(self):\n        self.ev.wait(0.5)\n", "Event.wait"),
    ("def finish(self):\n    self.q.get(timeout=1.0)\n", "timeout="),
    ("import threading\n\ndef start(f):\n    threading.Timer(0.1, f).start()\n",
     "threading.Timer"),
])
def test_a_planted_clock_in_a_strategy_breaks_the_rule(source, what):
    hits = scan(source, STRATEGY)
    assert [h.what for h in hits] == [what]
    assert broken(hits) == hits


def test_a_planted_clock_names_its_place():
    src = ("import time\n\nclass FlatStrategy:\n    def finish(self):\n"
           "        t0 = time.perf_counter()\n")
    (hit,) = scan(src, STRATEGY)
    assert str(hit) == f"{STRATEGY}:5 in FlatStrategy.finish: time.perf_counter"


def test_an_allowed_clock_elsewhere_in_its_file_is_not_allowed():
    """The allow-list names a function, not a file: a new clock in the same file fails."""
    src = "import time\n\ndef sleep(s):\n    time.sleep(s)\n\ndef other():\n    time.sleep(1)\n"
    hits = scan(src, "commbench/dilation.py")
    assert [h.where for h in broken(hits)] == ["other"]


@pytest.mark.parametrize("source", [
    "from commbench.timing import now\n\ndef finish(self):\n    t0 = now()\n",
    "from commbench import dilation\n\ndef poll():\n    dilation.sleep(0.001)\n",
    "import torch\n\ndef f():\n    ev = torch.cuda.Event(enable_timing=True)\n"
    "    return ev.elapsed_time(ev)\n",
    "def f(parts):\n    return ', '.join(parts)\n",
    "def f(store, keys):\n    store.wait(keys)\n",
    "import time\n\n# time.perf_counter() in a comment\ndef f():\n"
    "    '''time.sleep(1) in a docstring'''\n",
    "import threading\n\ndef f(done: threading.Event):\n    done.wait()\n",
])
def test_the_emulated_clock_and_device_events_pass(source):
    assert scan(source, STRATEGY) == []


# -- what time dilation cannot place is refused ------------------------------------------

def test_dilation_refuses_a_gpu_and_torch_traces():
    check_dilation("cuda", "commbench", k=1)  # nothing to refuse undilated
    check_dilation("cpu", "torch", k=1)
    check_dilation("cpu", "commbench", k=4)
    with pytest.raises(ConfigError, match=r"^--device cuda under --dilation 4 "):
        check_dilation("cuda", None, k=4)
    with pytest.raises(ConfigError, match=r"^--trace torch under --dilation 2\.5 "):
        check_dilation("cpu", "torch", k=2.5)


def test_allreduce_refuses_trace_torch_under_dilation(monkeypatch, tmp_path):
    out = ["--output", str(tmp_path / "r.jsonl")]
    assert allreduce.parse_config(["--trace", "torch", *out]).trace == "torch"
    monkeypatch.setattr(dilation, "_K", 4.0)
    with pytest.raises(ConfigError, match="--trace torch under --dilation 4"):
        allreduce.parse_config(["--trace", "torch", *out])
    assert allreduce.parse_config(out).trace is None  # dilated, untraced: fine


def test_allreduce_refuses_a_gpu_under_dilation(monkeypatch, tmp_path):
    cfg = allreduce.parse_config(["--workload", "real", "--model", "smallcnn", "--output",
                                  str(tmp_path / "r.jsonl")])
    cfg.device = "cuda"  # as on a GPU machine (this one has none)
    allreduce.resolve_defaults(copy.deepcopy(cfg), cuda=True)
    monkeypatch.setattr(dilation, "_K", 2.0)
    with pytest.raises(ConfigError, match="--device cuda under --dilation 2"):
        allreduce.resolve_defaults(cfg, cuda=True)
    synthetic = allreduce.parse_config(["--output", str(tmp_path / "r.jsonl")])
    synthetic.device = "cuda"  # replayed compute: its tensors stay in host memory
    allreduce.resolve_defaults(synthetic, cuda=True)


def test_a_planned_command_line_is_checked_as_the_tool_would():
    assert flag_value(["--trace", "commbench", "--trace=torch"], "--trace") == "torch"
    assert flag_value(["--steps", "3"], "--trace") is None
    check_dilated_argv(["--trace", "torch"], 1)
    check_dilated_argv(["--trace", "commbench", "--device", "cuda"], 8)  # the tool's to judge
    with pytest.raises(ConfigError, match=r"^--trace torch under --dilation 8 "):
        check_dilated_argv(["--trace=torch"], 8)
    with pytest.raises(ConfigError, match=r"^--trace torch under --dilation auto \(its "):
        check_dilated_argv(["--trace", "torch"], 2, "--dilation auto (its probes run ...)")


def test_a_sweep_refuses_a_torch_trace_under_dilation_before_any_point_runs():
    from launch.sweep import SweepError, make_sweep

    grid = {"nodes": [2], "slots": [1], "dilation": [1, 4]}
    with pytest.raises(SweepError, match=r"^point .*: --trace torch under --dilation 4 "):
        make_sweep({"args": ["--trace", "torch"]}, grid)
    make_sweep({"args": ["--trace", "torch"]}, {**grid, "dilation": [1]})
    make_sweep({"args": ["--steps", "3"]}, grid)


def test_an_experiment_refuses_a_torch_trace_at_dilation_auto(tmp_path):
    """``auto`` judges K against 2K: its probes run dilated whatever K it then picks, so a
    job that cannot be dilated is refused when the runner is made, before any probe."""
    from experiments.job import Job
    from experiments.runner import Runner, RunnerError

    def job(dilation, **kw):
        return Job.place("traced", allreduce.Config(**kw), 2, 1, "1gbit", dilation=dilation)

    with pytest.raises(RunnerError, match=r"^job traced: --trace torch under --dilation auto"):
        Runner([job("auto", trace="torch")], tmp_path)
    with pytest.raises(RunnerError, match=r"^job traced: --trace torch under --dilation 4 "):
        Runner([job(4.0, trace="torch")], tmp_path)
    Runner([job(1.0, trace="torch")], tmp_path)
    Runner([job("auto")], tmp_path)
    assert not list(tmp_path.iterdir())


def test_the_refusal_is_one_line_and_exit_2(tmp_path):
    res = subprocess.run([PY, "-m", "commbench.allreduce", "--trace", "torch", "--output",
                          str(tmp_path / "r.jsonl")], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ, dilation.DILATION_ENV: "4"})
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.strip().splitlines() == [
        "commbench.allreduce: error: --trace torch under --dilation 4 (COMMBENCH_DILATION=4): "
        "torch.profiler's trace runs on the wall clock and the collectives placed in it on "
        "emulated time (wall / K), so they would land in the wrong places; trace at "
        "--dilation 1"]
    assert not list(tmp_path.iterdir())
