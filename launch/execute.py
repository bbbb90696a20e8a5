"""Run a launch command with a deadline; on timeout or interrupt kill its whole process group.

The one place launch commands are executed, so no rank, mpirun or orted
outlives a test or a sweep that gave up on it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


@dataclass
class Completed:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the launching process dies (Linux), so a killed
    sweep or test does not orphan its mpirun, which then ends its ranks."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run(argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
        cwd: str | None = None, capture: bool = True) -> Completed:
    """Run ``argv`` in its own session; never leave processes behind. Output is captured,
    or with ``capture=False`` streamed to this process's stdout and stderr as it comes
    (a long job's log; ``Completed`` then holds none)."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    pipe = subprocess.PIPE if capture else None
    proc = subprocess.Popen(list(argv), stdout=pipe, stderr=pipe,
                            text=True, env=full_env, cwd=cwd, start_new_session=True,
                            preexec_fn=_die_with_parent)
    try:
        out, err = proc.communicate(timeout=timeout)
        return Completed(list(argv), proc.returncode, out or "", err or "")
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        return Completed(list(argv), proc.returncode, out or "", err or "", timed_out=True)
    except BaseException:
        _kill_group(proc)
        raise
    finally:
        # Ranks of a finished mpirun belong to its group too; make sure none linger.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


INTERRUPTED = "interrupted; the same command resumes"
INTERRUPTED_STATUS = 130  # 128 + SIGINT, as a shell reports a job ended by Ctrl-C


def interruptible(body: Callable[[], int], prog: str) -> int:
    """Run a parent process's ``body`` (a sweep, a study, a benchmark): the one place its
    signals are turned into unwinding. SIGTERM raises SystemExit(143) inside ``body``, so
    the running job's process group and its emulated cluster are cleaned up on the way
    out; Ctrl-C (SIGINT) does the same through KeyboardInterrupt, then prints one line
    instead of a traceback and returns 130. Finished jobs are kept, so the same command
    resumes."""
    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        return body()
    except KeyboardInterrupt:
        print(f"{prog}: {INTERRUPTED}", file=sys.stderr, flush=True)
        return INTERRUPTED_STATUS
    finally:
        signal.signal(signal.SIGTERM, previous)
