"""Launch commands as argument lists: one small function per way users start jobs.

Each returns the argv to execute (never a shell string), so tests compare
lists and ``launch.execute.run`` runs them in one place.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def python_module(module: str, args: Sequence[str] = (), python: str | None = None) -> list[str]:
    return [python or sys.executable, "-m", module, *args]


def mpirun(np: int, program: Sequence[str], *, hosts: str | None = None,
           hostfile: str | None = None, oversubscribe: bool = True,
           mca: dict[str, str] | None = None, env: Sequence[str] = ()) -> list[str]:
    """``mpirun -np N [--host H | --hostfile F] ... program`` (Open MPI)."""
    if np <= 0:
        raise ValueError(f"np must be > 0, got {np}")
    cmd = ["mpirun", "-np", str(np)]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if oversubscribe:
        cmd.append("--oversubscribe")
    if hosts:
        cmd += ["--host", hosts]
    if hostfile:
        cmd += ["--hostfile", hostfile]
    for k, v in (mca or {}).items():
        cmd += ["--mca", k, v]
    for name in env:
        cmd += ["-x", name]
    return [*cmd, *program]


def horovodrun(np: int, program: Sequence[str], *, hosts: str | None = None,
               controller: str = "mpi", horovodrun_bin: str | None = None,
               extra: Sequence[str] = ()) -> list[str]:
    """``horovodrun -np N -H hosts --mpi|--gloo program``.

    ``hosts`` defaults to ``localhost:N``.
    """
    if np <= 0:
        raise ValueError(f"np must be > 0, got {np}")
    if controller not in ("mpi", "gloo"):
        raise ValueError(f"controller must be mpi or gloo, got {controller!r}")
    exe = horovodrun_bin or os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return [exe, "-np", str(np), "-H", hosts or f"localhost:{np}", f"--{controller}",
            *extra, *program]
