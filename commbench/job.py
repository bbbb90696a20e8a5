"""The life of a commbench job on one rank, the same for every tool.

1. Parse and check the flags; bad input ends every rank with exit status 2
   and one line naming the flag, before any library starts.
2. Start the backend the launcher implies (or ``--backend``).
3. Check the requested combination on every rank (same verdict everywhere,
   so no collective is needed); an impossible one exits 2.
4. Run the tool's body, which returns the number of wrong elements its
   validation found. An exception on any rank aborts the whole job (MPI
   abort or, under Gloo, the process exit horovodrun watches) with the rank
   and the error printed, exit status 1; wrong elements give exit status 1.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch

from commbench.comm import Communicator, detect_backend, launcher_rank, make_communicator
from commbench.config import ConfigError
from commbench.report import rank0_print


def cores_available() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def set_torch_threads(local_size: int) -> int:
    """One thread per rank when ranks outnumber cores, else share the cores out."""
    threads = max(1, cores_available() // max(1, local_size))
    torch.set_num_threads(threads)
    return threads


def run_job(prog: str, argv: list[str] | None, parse: Callable[[list[str] | None], Any],
            check: Callable[[Communicator, Any], None],
            body: Callable[[Communicator, Any], int]) -> int:
    """Steps 1-4 above; return the exit status."""
    try:
        cfg = parse(argv)
    except ConfigError as e:
        rank0_print(launcher_rank(), f"{prog}: error: {e}", file=sys.stderr)
        return 2
    comm = make_communicator(detect_backend() if cfg.backend == "auto" else cfg.backend)
    try:
        check(comm, cfg)
    except ValueError as e:
        rank0_print(comm.rank, f"{prog}: error: {e}", file=sys.stderr)
        comm.close()
        return 2
    try:
        wrong = body(comm, cfg)
        comm.close()
    except Exception:
        sys.stderr.write(f"{prog}: rank {comm.rank} failed:\n{traceback.format_exc()}")
        sys.stderr.flush()
        comm.abort(1)
        return 1
    if wrong:
        rank0_print(comm.rank, f"{prog}: {wrong} wrong elements in validation", file=sys.stderr)
        return 1
    return 0
