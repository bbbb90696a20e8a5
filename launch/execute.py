"""Run a launch command with a deadline; on timeout or interrupt kill its whole process group.

The one place launch commands are executed, so no rank, mpirun or orted
outlives a test or a sweep that gave up on it.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
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
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run(argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
        cwd: str | None = None) -> Completed:
    """Run ``argv`` in its own session; capture output; never leave processes behind."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=full_env, cwd=cwd, start_new_session=True,
                            preexec_fn=_die_with_parent)
    try:
        out, err = proc.communicate(timeout=timeout)
        return Completed(list(argv), proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        return Completed(list(argv), proc.returncode, out, err, timed_out=True)
    except BaseException:
        _kill_group(proc)
        raise
    finally:
        # Ranks of a finished mpirun belong to its group too; make sure none linger.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
