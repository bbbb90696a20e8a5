"""Test-only fault injection: make one rank die, hang, freeze or fail at a given step.

Set ``COMMBENCH_TEST_FAULT=KIND:RANK:STEP`` in the job's environment (read
once, at the first step); ``runner.run_steps`` calls ``at_step`` inside every
step, after the pre-step barrier, where compute would run:

- ``kill``: the rank sends itself SIGKILL (a crashed node, the OOM killer);
- ``hang``: the rank sleeps forever in Python (a stuck data loader): its
  watchdog sees it in compute and names it;
- ``stop``: the rank sends itself SIGSTOP (a frozen process, no thread of it
  runs): the other ranks' watchdogs must name it;
- ``raise``: the rank raises ``InjectedFault`` (any bug in a rank).

``COMMBENCH_TEST_FAULT_STAMP=FILE`` makes the faulty rank write the time the
fault struck (``time.time()``) to FILE first.
``COMMBENCH_TEST_EXTRA_ARGS=RANK:ARGS`` appends ``ARGS`` (split on spaces)
to that rank's command line before parsing, so tests can give one rank a
different configuration. Like ``COMMBENCH_TEST_CORRUPT_RANK`` and
``COMMBENCH_TEST_NODE_OF_RANK``, these exist for the test suite only.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

FAULT_ENV = "COMMBENCH_TEST_FAULT"
EXTRA_ARGS_ENV = "COMMBENCH_TEST_EXTRA_ARGS"
STAMP_ENV = "COMMBENCH_TEST_FAULT_STAMP"  # file the faulty rank writes time.time() to
KINDS = ("kill", "hang", "stop", "raise")


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
        raise ValueError(f"{FAULT_ENV}={spec!r}: expected KIND:RANK:STEP with KIND one of "
                         f"{', '.join(KINDS)}")
    try:
        return Fault(parts[0], int(parts[1]), int(parts[2]))
    except ValueError:
        raise ValueError(f"{FAULT_ENV}={spec!r}: RANK and STEP must be integers") from None


_UNREAD = object()
_fault: Fault | None | object = _UNREAD


def _configured() -> Fault | None:
    global _fault
    if _fault is _UNREAD:
        spec = os.environ.get(FAULT_ENV)
        _fault = parse_fault(spec) if spec else None
    return _fault  # type: ignore[return-value]


def at_step(rank: int, step: int) -> None:
    """Inject the configured fault if this is its rank and step (a no-op otherwise)."""
    f = _configured()
    if f is None or f.rank != rank or f.step != step:
        return
    stamp = os.environ.get(STAMP_ENV)
    if stamp:  # when the fault struck, for the tests' fault-to-exit times
        with open(stamp, "w") as out:
            out.write(f"{time.time():.6f}\n")
    if f.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if f.kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)  # a SIGCONT later finds it still stuck:
    if f.kind in ("hang", "stop"):
        while True:
            time.sleep(3600)
    raise InjectedFault(f"injected fault on rank {rank} at step {step} ({FAULT_ENV})")


def extra_args(rank: int) -> list[str]:
    """Arguments ``COMMBENCH_TEST_EXTRA_ARGS`` adds to ``rank``'s command line."""
    spec = os.environ.get(EXTRA_ARGS_ENV)
    if not spec:
        return []
    who, _, args = spec.partition(":")
    return args.split() if who.strip() == str(rank) else []
