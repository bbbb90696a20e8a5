"""Run a tool or a check script with test fakes installed: what tests launch instead of
``python -m commbench.X`` when one rank must misbehave or the ranks must see other nodes.

::

    mpirun -np 4 python -m tests.fakes --nodes a,a,a,b -m commbench.allreduce --algo hier
    mpirun -np 3 python -m tests.fakes --fault kill:1:3 -m commbench.allreduce --steps 6
    mpirun -np 3 python -m tests.fakes --nodes a,a,b tests/mpi/hier_vs_native.py mpi

Every rank installs the fakes by wrapping the product's own objects, then runs
the module as ``python -m`` would (or the script as ``python`` would), with
``runpy``; the product knows nothing of them.

- ``--nodes a,a,b``: rank r says its node is the r-th name (wraps
  ``commbench.comm.base.hostname``), so two-level schemes can be tested on
  uneven layouts on one machine. Only the project's topology sees it; the MPI
  library still sees the real host.
- ``--corrupt-rank R``: on rank R every all-reduce of the algorithm registry
  (``commbench.comm.algos.ALGOS``) comes out with its first element off
  by one, so the tests can show that validation (``#wrong``) catches it.
- ``--fault KIND:RANK:STEP``: rank RANK misbehaves at step STEP (0 = the first
  warm-up step), in a step hook of ``commbench.steploop.STEP_HOOKS``, after the
  pre-step barrier, where compute would run: ``kill`` (SIGKILL: a crashed
  node, the OOM killer), ``hang`` (sleeps forever in Python: a stuck data
  loader; its own watchdog sees it in compute), ``stop`` (SIGSTOP: a frozen
  process, no thread of it runs; the other ranks' watchdogs must name it),
  ``raise`` (raises ``InjectedFault``: any bug in a rank).
- ``--fault-stamp FILE``: the faulty rank first writes the time the fault
  struck (``time.time()``) to FILE.
- ``--extra-args "RANK:ARGS"``: rank RANK's command line gets ``ARGS`` (split
  on spaces) appended, so one rank runs a different configuration.

Tests build these command lines with ``command``.
"""

from __future__ import annotations

import argparse
import functools
import os
import runpy
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

KINDS = ("kill", "hang", "stop", "raise")
FLAGS = ("--nodes", "--corrupt-rank", "--fault", "--fault-stamp", "--extra-args")


class InjectedFault(RuntimeError):
    """The error a ``raise`` fault raises."""


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int


def parse_fault(spec: str) -> Fault:
    """``'kill:1:3'`` -> Fault('kill', 1, 3); ValueError naming the problem otherwise."""
    parts = spec.split(":")
    if len(parts) != 3 or parts[0] not in KINDS:
        raise ValueError(f"--fault {spec!r}: expected KIND:RANK:STEP with KIND one of "
                         f"{', '.join(KINDS)}")
    try:
        return Fault(parts[0], int(parts[1]), int(parts[2]))
    except ValueError:
        raise ValueError(f"--fault {spec!r}: RANK and STEP must be integers") from None


def command(program: Sequence[str], *, nodes: str | None = None,
            corrupt_rank: int | None = None, fault: str | None = None,
            fault_stamp: str | os.PathLike | None = None,
            extra_args: str | None = None) -> list[str]:
    """``program`` (``[python, '-m', module, ...]`` or ``[python, script, ...]``) run
    through this module with the fakes given (the flags above, by their names)."""
    python, *rest = program
    values = (nodes, corrupt_rank, fault, fault_stamp, extra_args)
    opts = [x for flag, v in zip(FLAGS, values) if v is not None for x in (flag, str(v))]
    return [python, "-m", "tests.fakes", *opts, *rest]


# -- the fakes, each installed by wrapping a product object ------------------------------

def _rank() -> int:
    from commbench.comm import launcher_rank

    return launcher_rank()


def fake_nodes(spec: str) -> None:
    from commbench.comm import base

    names = spec.split(",")
    rank = _rank()
    if rank >= len(names):
        raise SystemExit(f"tests.fakes: --nodes {spec} names no node for rank {rank}")
    base.hostname = lambda: names[rank]


def corrupt_rank(bad_rank: int) -> None:
    from commbench.comm.algos import ALGOS

    def corrupted(algo: Any) -> Any:
        @functools.wraps(algo)
        def run(comm: Any, tensor: Any, on_phase: Any = None) -> None:
            algo(comm, tensor, on_phase=on_phase)
            if comm.rank == bad_rank and tensor.numel():
                tensor.view(-1)[0] += 1
        return run

    for name, algo in list(ALGOS.items()):
        ALGOS[name] = corrupted(algo)


def inject_fault(fault: Fault, stamp: str | None) -> None:
    from commbench import steploop

    def at_step(comm: Any, step: int) -> None:
        if comm.rank != fault.rank or step != fault.step:
            return
        if stamp:  # when the fault struck, for the tests' fault-to-exit times
            with open(stamp, "w") as out:
                out.write(f"{time.time():.6f}\n")
        if fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.kind == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)  # a SIGCONT later finds it still stuck:
        if fault.kind in ("hang", "stop"):
            while True:
                time.sleep(3600)
        raise InjectedFault(f"injected fault on rank {comm.rank} at step {step} (--fault)")

    steploop.STEP_HOOKS.append(at_step)


def extra_args(spec: str) -> list[str]:
    """The arguments ``--extra-args RANK:ARGS`` adds to this rank's command line."""
    who, _, args = spec.partition(":")
    return args.split() if who.strip() == str(_rank()) else []


# -- the program ---------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tests.fakes",
        usage="%(prog)s [FAKES] (-m MODULE | SCRIPT) [ARGS ...]",
        description="Run a commbench tool or a check script with test fakes installed.")
    p.add_argument("--nodes", help="node name of every rank, comma-separated")
    p.add_argument("--corrupt-rank", type=int, help="rank whose all-reduces come out wrong")
    p.add_argument("--fault", help="KIND:RANK:STEP, KIND one of " + ", ".join(KINDS))
    p.add_argument("--fault-stamp", help="file the faulty rank writes the time to")
    p.add_argument("--extra-args", help="RANK:ARGS appended to that rank's command line")
    return p


def main(argv: list[str]) -> None:
    """Split ``argv`` into the fakes' flags and what to run; install the fakes; run it."""
    p = _parser()
    i = 0
    while i < len(argv) and argv[i] in FLAGS:  # every flag of the fakes takes one value
        i += 2
    opts, target = argv[:i], argv[i:]
    ns = p.parse_args(opts)
    if not target or (target[0] == "-m" and len(target) < 2):
        p.error("name what to run: -m MODULE or SCRIPT")
    try:
        fault = parse_fault(ns.fault) if ns.fault else None
    except ValueError as e:
        p.error(str(e))
    if ns.nodes:
        fake_nodes(ns.nodes)
    if ns.corrupt_rank is not None:
        corrupt_rank(ns.corrupt_rank)
    if fault is not None:
        inject_fault(fault, ns.fault_stamp)
    more = extra_args(ns.extra_args) if ns.extra_args else []
    if target[0] == "-m":
        module, args = target[1], target[2:]
        sys.argv = [module, *args, *more]  # runpy puts the module's file in argv[0]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, args = target[0], target[1:]
        sys.argv = [script, *args, *more]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as python does
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
