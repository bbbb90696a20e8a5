"""Per-step watchdog: a rank stuck in compute or in a collective ends the whole job.

Every rank runs one daemon thread. The step loop calls ``begin_step`` /
``end_step`` (``steploop.run_steps``; ``microbench`` per row); when a step has
run longer than its deadline the thread looks at where the main thread is
(``sys._current_frames``) and:

1. **in compute** (no frame in a communicator, mpi4py or Horovod): this rank
   is the stalled one. It says so at once, with the step and the line it is
   stuck on, and aborts the job (``comm.abort``: MPI_Abort, or the process
   exit horovodrun watches).
2. **in a collective**: this rank is waiting for someone. It asks every
   rank where it is through the communicator's side channel
   (``Communicator.side_channel``: on MPI a duplicate of ``MPI_COMM_WORLD`` used
   only by watchdog threads, which answer queries at every poll; Open MPI runs
   with ``MPI_THREAD_MULTIPLE``) and waits a grace period
   (``grace_s``: 10 % of the deadline, 3-15 s). A stalled rank whose thread
   runs has named itself and aborted the job by then (its own deadline, armed
   within the barrier skew of this one's, falls inside the grace); if not,
   this rank names the ranks that answered "in compute" or did not answer at
   all, and aborts. A silent rank on this host is looked up in ``/proc``:
   stopped, dead or in uninterruptible sleep makes it the cause; running but
   silent means its watchdog cannot get Python's lock (Horovod's enqueue holds
   it while waiting for the stalled rank), and it is listed apart as "also not
   answering". If the step finishes within the grace period it was slow, not
   stuck: nothing happens.
   Where the backend has no side channel (Horovod on Gloo) the message says
   the stalled rank is unknown here and points at Horovod's stall warning,
   which names the ranks missing from the collective.

3. **nobody's watchdog can run** (every waiting rank's main thread stuck in C
   code holding Python's lock): ``faulthandler``'s timer, which needs no
   lock, ends the rank at deadline + grace + 10 s, printing every thread's
   Python stack (``backstop_s``); the launcher then ends the job.

Deadline: ``--step-timeout`` seconds (0 = off). Left at its default
(``None``, "auto") it is ``DEFAULT_STEP_TIMEOUT`` or five times the slowest
step completed so far, whichever is larger: generous enough for the real
workload of a big model on a CPU, a hung job still ends within minutes.

Horovod's own stall check (coordinator-side: a tensor some ranks submitted
and others did not) is set to agree (``horovod_stall_env``): it warns, naming
the missing ranks, at the same deadline and shuts Horovod down only after
this watchdog would have acted.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import MutableMapping
from typing import Any

from commbench import dilation
from commbench.comm.base import Communicator

DEFAULT_STEP_TIMEOUT = 300.0  # seconds; see the module docstring and docs/faults.md
AUTO_FACTOR = 5.0  # auto deadline: this many times the slowest completed step, if larger
BACKSTOP_MARGIN_S = 10.0  # faulthandler's exit comes this long after the grace period
EXIT_STALLED = 1  # a stalled job failed like any rank failure (README: exit status 1)

# where a blocked main thread means "waiting for other ranks", not computing
_COMM_PATHS = (os.sep + os.path.join("commbench", "comm") + os.sep,
               os.sep + "mpi4py" + os.sep, os.sep + "horovod" + os.sep)


def grace_s(timeout: float) -> float:
    """How long a rank blocked in a collective waits, past the deadline, for the
    stalled rank to name itself or for the others' reports."""
    return min(15.0, max(3.0, 0.1 * timeout))


def horovod_stall_env(timeout: float | None, environ: MutableMapping[str, str] | None = None
                      ) -> dict[str, str]:
    """Set Horovod's stall check to agree with the watchdog (before ``hvd.init``).

    Warn (naming the ranks missing from a collective) at the step deadline;
    shut down only after this watchdog's grace period, as a backstop. A value
    the user set (or ``horovodrun --stall-check-*``) is kept. Returns what was set.
    """
    env = os.environ if environ is None else environ
    deadline = dilation.wall(DEFAULT_STEP_TIMEOUT if timeout is None else timeout)
    if deadline <= 0:
        return {}
    want = {"HOROVOD_STALL_CHECK_TIME_SECONDS": str(max(1, int(deadline))),
            "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS":
                str(int(deadline + 2 * grace_s(deadline) + 30))}
    done = {}
    for k, v in want.items():
        if k not in env:
            env[k] = done[k] = v
    return done


def where(frame: Any) -> tuple[bool, str]:
    """(in a collective?, 'file:line in function') of a thread's innermost frame.

    In a collective when any frame of the stack belongs to a communicator,
    mpi4py or Horovod; the place named is the innermost frame in this project
    (or the innermost of all when none is).
    """
    in_comm = False
    place = None
    f = frame
    while f is not None:
        name = f.f_code.co_filename
        if any(p in name for p in _COMM_PATHS):
            in_comm = True
        if place is None and os.sep + "commbench" + os.sep in name:
            rel = name[name.rfind(os.sep + "commbench" + os.sep) + 1:]
            place = f"{rel}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back
    if place is None and frame is not None:
        place = f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
    return in_comm, place or "?"


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


class Watchdog:
    """Deadline per step on this rank; see the module docstring.

    ``timeout``: seconds, ``None`` = auto, ``<= 0`` = off. Start it on every
    rank at the same point (it may build a communicator), call ``begin_step`` /
    ``end_step`` around each step, ``stop`` at the end.
    """

    def __init__(self, prog: str, comm: Communicator, timeout: float | None) -> None:
        self.prog = prog
        self.comm = comm
        self.auto = timeout is None
        # on the wall: under time dilation K (``commbench.dilation``) a step takes K times longer
        self.timeout = dilation.wall(DEFAULT_STEP_TIMEOUT if timeout is None else float(timeout))
        self.enabled = self.timeout > 0
        self.grace = grace_s(self.timeout)
        self.poll = min(1.0, max(0.05, self.timeout / 20))
        self._slowest = 0.0
        self._step: Any = None
        self._t0 = 0.0
        self._main = threading.get_ident()
        self._stop = threading.Event()
        self._side = comm.side_channel() if self.enabled and comm.size > 1 else None
        self._query = 0  # number of this rank's last query; replies carry it
        self._replies: dict[int, tuple] = {}
        # every rank's (host, pid): a silent rank on this host can be looked at in /proc
        self._procs = self._side.allgather((socket.gethostname(), os.getpid())) \
            if self._side else []
        self._thread = None
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="commbench-watchdog",
                                            daemon=True)
            self._thread.start()

    # -- called by the step loop -------------------------------------------
    def begin_step(self, step: Any) -> None:
        self._t0 = time.monotonic()
        self._step = step
        if self.enabled:  # the backstop that needs no GIL; see backstop_s
            faulthandler.dump_traceback_later(self.backstop_s(), exit=True)

    def end_step(self) -> None:
        if self._step is not None:
            self._slowest = max(self._slowest, time.monotonic() - self._t0)
            if self.enabled:
                faulthandler.cancel_dump_traceback_later()
        self._step = None

    def backstop_s(self) -> float:
        """When faulthandler's C thread ends this rank if the step is still running.

        This thread needs Python's lock (GIL) to act; a main thread stuck in C
        code that holds it (Horovod's enqueue waiting for a frozen rank does)
        would keep it from ever running. faulthandler's timer runs without the
        lock: it prints every thread's Python stack and exits with status 1,
        and the launcher then ends the job. It is armed past the point where
        this watchdog would have acted (deadline + grace + 10 s).
        """
        return self.deadline() + self.grace + BACKSTOP_MARGIN_S

    def deadline(self) -> float:
        return max(self.timeout, AUTO_FACTOR * self._slowest) if self.auto else self.timeout

    def stop(self) -> None:
        if self.enabled:
            faulthandler.cancel_dump_traceback_later()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.poll + 1)

    # -- the thread ----------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.wait(self.poll):
                self._serve()
                step, t0 = self._step, self._t0
                if step is not None and time.monotonic() - t0 > self.deadline():
                    self._expired(step, t0)
        except Exception:  # the watchdog must never take a healthy job down by itself
            _say(f"{self.prog}: rank {self.comm.rank}: watchdog failed:\n"
                 f"{traceback.format_exc()}")

    def _state(self) -> tuple[Any, bool, str]:
        """(step or None between steps, in a collective?, where) of the main thread now."""
        in_comm, place = where(sys._current_frames().get(self._main))
        return self._step, in_comm, place

    def _serve(self) -> None:
        """Answer other ranks' queries with this rank's state; keep replies to ours."""
        if self._side is None:
            return
        for src, msg in self._side.receive():
            if msg[0] == "query":
                self._side.send(src, ("reply", msg[1], *self._state()))
            elif msg[0] == "reply" and msg[1] == self._query:
                self._replies[src] = msg[2:]

    def _abort(self) -> None:
        try:
            self.comm.abort(EXIT_STALLED)
        finally:
            os._exit(EXIT_STALLED)

    def _expired(self, step: Any, t0: float) -> None:
        rank = self.comm.rank
        _, in_comm, place = self._state()
        limit = f"the step deadline of {self.deadline():.0f} s (--step-timeout)"
        if not in_comm:  # nobody else holds this rank up: it is the stalled one
            _say(f"{self.prog}: rank {rank} stalled at step {step}: "
                 f"{time.monotonic() - t0:.0f} s in compute at {place}, over {limit}; "
                 "aborting the job")
            self._abort()
            return
        # Waiting for someone: ask every rank where it is, give the stalled one the
        # grace period to name itself, then name who did not answer or computes.
        self._query += 1
        self._replies = {}
        if self._side:
            self._side.announce(("query", self._query))
        end = time.monotonic() + self.grace
        while time.monotonic() < end:
            if self._step is None or self._t0 != t0:
                return  # the step finished: it was slow, not stuck
            self._serve()
            if self._side and len(self._replies) == self.comm.size - 1:
                break
            time.sleep(min(0.1, self.poll))
        if self._step is None or self._t0 != t0:
            return
        _say(f"{self.prog}: rank {rank}: step {step} over {limit}: blocked "
             f"{time.monotonic() - t0:.0f} s in a collective at {place}; "
             f"{self._verdict(step)}; aborting the job")
        self._abort()

    def _verdict(self, step: Any) -> str:
        """Who holds the job up, from the replies to this rank's query (and, for silent
        ranks on this host, their process state)."""
        if self._side is None:
            return ("stalled rank unknown here (no side channel without MPI; Horovod's stall "
                    "warning names the ranks missing from the collective)")
        others = [r for r in range(self.comm.size) if r != self.comm.rank]
        stalled = [f"{r} (in compute at step {rep[0]}, {rep[2]})"
                   for r, rep in sorted(self._replies.items()) if not rep[1]]
        silent = {r: self._silent_state(r) for r in others if r not in self._replies}
        # a rank that is stopped, dead or in the kernel is the cause; one that runs but
        # cannot answer is most likely stuck holding Python's lock inside a library call
        # that waits for the stalled rank (Horovod's enqueue does)
        stalled += [f"{r} (not responding: {why})" for r, (cause, why) in silent.items()
                    if cause]
        blocked = [f"{r} ({why})" for r, (cause, why) in silent.items() if not cause]
        if not stalled:
            stalled, blocked = blocked, []
        if stalled:
            return (f"stalled rank(s): {'; '.join(stalled)}" +
                    (f"; also not answering: {'; '.join(blocked)}" if blocked else ""))
        elsewhere = {r: rep for r, rep in self._replies.items() if rep[0] != step}
        if elsewhere:
            return "ranks in other steps: " + "; ".join(
                f"{r} (step {rep[0]}, {rep[2]})" for r, rep in sorted(elsewhere.items()))
        return "every rank is waiting in a collective of this step (a hung transfer?)"

    def _silent_state(self, rank: int) -> tuple[bool, str]:
        """(is it the cause?, why) for a rank that did not answer, from /proc on this host."""
        if not self._procs or self._procs[rank][0] != socket.gethostname():
            return False, "not responding: frozen, stopped or stuck outside Python"
        pid = self._procs[rank][1]
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True, f"its process {pid} is gone"
        if state in ("T", "t"):
            return True, f"process {pid} is stopped (SIGSTOP or a debugger)"
        if state == "D":
            return True, f"process {pid} is in uninterruptible sleep (I/O, e.g. a hung mount)"
        if state in ("Z", "X"):
            return True, f"process {pid} is dead"
        return False, (f"process {pid} runs but cannot answer: blocked outside Python holding "
                       "its lock, e.g. waiting inside the collective library")


class NullWatchdog:
    """The same interface, doing nothing (tools and tests without a deadline)."""

    enabled = False

    def begin_step(self, step: Any) -> None:
        pass

    def end_step(self) -> None:
        pass

    def stop(self) -> None:
        pass


_current: Watchdog | NullWatchdog = NullWatchdog()


def current() -> Watchdog | NullWatchdog:
    """The watchdog of this process's job (``job.run_job`` installs it).

    One job runs per process, so the watchdog is process-wide, like a signal
    handler; step loops fetch it here rather than having it threaded through
    every tool's call chain.
    """
    return _current


def install(wd: Watchdog | NullWatchdog) -> None:
    global _current
    _current = wd
