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
- ``--corrupt-rank R``: rank R's contribution to every all-reduce it takes
  part in is off by one in its first element, so the tests can show that
  validation (``#wrong``) catches it, whatever runs the all-reduce: the
  algorithm registry (``commbench.comm.algos.ALGOS``), the communicators'
  own ``allreduce``/``iallreduce`` (the transfer engine's ``thread`` path,
  bucketed's ``poll`` path, Horovod's handoff), the engine's ``ring`` path,
  and the peers' all-reduces, which are not the project's communicator:
  ``torch.distributed.all_reduce`` as DDP's comm hook calls it, and the
  ``allreduce_async_`` that Horovod's ``DistributedOptimizer`` calls for each
  gradient. An all-reduce made inside another (``native`` calls
  ``comm.allreduce``) is corrupted once, by the outer one.
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
import threading
import time
from collections.abc import Callable, Sequence
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


#: how deep this thread is in corrupted all-reduces (an inner one is left alone)
_inside = threading.local()


def _contributes_wrong(allreduce: Callable[..., Any], at: int) -> Callable[..., Any]:
    """``allreduce``, whose positional argument ``at`` is the tensor it sums in place, with
    this rank's contribution off by one in its first element (unless it is called inside
    another such all-reduce, which has already made it wrong)."""

    @functools.wraps(allreduce)
    def run(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_inside, "depth", 0)
        tensor = args[at]
        if depth == 0 and tensor.numel():
            tensor.view(-1)[0] += 1
        _inside.depth = depth + 1
        try:
            return allreduce(*args, **kwargs)
        finally:
            _inside.depth = depth

    return run


def _corrupt_horovod_optimizer() -> None:
    """Horovod's ``DistributedOptimizer`` all-reduces each gradient (in its hooks and in
    ``synchronize``) with the ``allreduce_async_`` its module imported; wrap that once
    the horovod peer is built (its communicator has imported horovod.torch by then)."""
    from commbench.strategies.peers import HorovodStrategy

    build = HorovodStrategy.__init__

    @functools.wraps(build)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        from horovod.torch import optimizer

        if not hasattr(optimizer.allreduce_async_, "__wrapped__"):  # once, for all runs
            optimizer.allreduce_async_ = _contributes_wrong(optimizer.allreduce_async_, at=0)
        build(self, *args, **kwargs)

    HorovodStrategy.__init__ = init


def corrupt_rank(bad_rank: int) -> None:
    """On rank ``bad_rank``, wrap every all-reduce entry point this module's docstring
    lists so that the rank's contribution is off by one; other ranks wrap nothing."""
    if _rank() != bad_rank:
        return
    import torch.distributed as dist

    from commbench.comm import engine
    from commbench.comm.algos import ALGOS
    from commbench.comm.horovod import HorovodCommunicator
    from commbench.comm.mpi import MpiCommunicator

    for name, algo in list(ALGOS.items()):  # (comm, tensor, on_phase=None)
        ALGOS[name] = _contributes_wrong(algo, at=1)
    engine.ring_allreduce = _contributes_wrong(engine.ring_allreduce, at=1)  # --transfer ring
    for cls in (MpiCommunicator, HorovodCommunicator):  # their dups and MPI twins are too
        cls.allreduce = _contributes_wrong(cls.allreduce, at=1)
        cls.iallreduce = _contributes_wrong(cls.iallreduce, at=1)
    dist.all_reduce = _contributes_wrong(dist.all_reduce, at=0)  # the ddp peer's buckets
    _corrupt_horovod_optimizer()


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
    p.add_argument("--corrupt-rank", type=int,
                   help="rank whose contribution to every all-reduce is off by one")
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
