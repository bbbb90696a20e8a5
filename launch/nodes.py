"""Run one command on each node, as one job: start all, wait for all, end all when one fails.

torchrun starts the workers of one machine only; a job across nodes is one torchrun per
node, each told its node rank (``launch.commands.torchrun_on_nodes``). The callers run
one command per job (``launch.execute.run``, which ends its process group on a
deadline), so this is that command::

    python -m launch.nodes [--rsh AGENT] --node HOST COMMAND [--node HOST COMMAND ...]

Each COMMAND is one simple command as a shell string (``env K=V python -m ...``); it
runs on HOST as ``AGENT HOST "cd DIR && exec COMMAND"``, DIR being this process's
working directory (where mpirun starts remote ranks too). ``exec`` makes the node's
process the command itself, so that signals and the parent-death signal reach it, not
a shell around it; a compound command goes in ``sh -c '...'``. AGENT is ``ssh`` by
default (``"ssh -p 2222"`` for another port), or an rsh agent such as the emulated
cluster's, which runs the string inside the node's network namespace under its host
name. A HOST that is this machine (``localhost``, its host name) runs here without the
agent, as Open MPI does.

The nodes' output passes through as it comes, unprefixed. Exit status: 0 when every
node's command exited 0; else the first failure's (128 + N for signal N), and the
other nodes are ended as soon as it happens (SIGTERM to each node's process group,
SIGKILL after ``GRACE_S``), as on SIGTERM, SIGINT or SIGHUP to this process (exit
status 128 + the signal); 2 on bad input. Through ssh, ending a node ends its local
ssh only: the remote torchrun is not signalled, and its workers fail at their next
collective, once the other nodes' workers are gone.

Standard library only (and ``launch.execute``, which is too).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from launch.execute import _die_with_parent

#: seconds a node's command has to end after SIGTERM before SIGKILL (torchrun passes the
#: SIGTERM to its workers); within launch.execute's 5 s before it kills this process
GRACE_S = 3.0
POLL_S = 0.05  # how often the nodes are looked at: a failure ends the others this soon
#: signals that end the job (each node's, then this process)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def is_this_machine(host: str) -> bool:
    """Whether ``host`` names this machine (by name only: no lookup that could hang)."""
    return host in ("localhost", "127.0.0.1", "::1", socket.gethostname())


def node_argv(rsh: Sequence[str], host: str, command: str, cwd: str) -> list[str]:
    """The argv that runs ``command`` (a shell string) on ``host`` in ``cwd``."""
    remote = f"cd {shlex.quote(cwd)} && exec {command}"
    if is_this_machine(host):
        return ["sh", "-c", remote]
    return [*rsh, host, remote]


def status_of(returncode: int) -> int:
    """An exit status as a shell reports it: 128 + N for a process ended by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def end(procs: Sequence[subprocess.Popen], grace: float = GRACE_S) -> None:
    """SIGTERM every node's process group, then SIGKILL what is left after ``grace``.
    Groups of nodes that have exited are signalled too: what they started may remain."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace
        while sig == signal.SIGTERM and time.monotonic() < deadline \
                and any(p.poll() is None for p in procs):
            time.sleep(POLL_S)
    for p in procs:
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass


def run_nodes(commands: Sequence[tuple[str, str]], rsh: Sequence[str], cwd: str,
              stopped: Callable[[], int | None] = lambda: None, log=sys.stderr) -> int:
    """Run each ``(host, command)`` on its host; the exit status as the module says.
    ``stopped``: the signal that asked this process to end, or None (asked between polls,
    so that no exception lands in the middle of starting or ending a node)."""
    procs: list[subprocess.Popen] = []
    hosts: dict[int, str] = {}
    try:
        for host, command in commands:
            # own session: a node's command is ended by its group; and SIGTERM if this
            # process dies, so that no node outlives a killed job
            p = subprocess.Popen(node_argv(rsh, host, command, cwd), stdin=subprocess.DEVNULL,
                                 start_new_session=True, preexec_fn=_die_with_parent)
            procs.append(p)
            hosts[p.pid] = host
        running = list(procs)
        while running:
            signum = stopped()
            if signum is not None:
                print(f"launch.nodes: {signal.Signals(signum).name}: ending the nodes",
                      file=log, flush=True)
                return 128 + signum
            for p in list(running):
                if p.poll() is None:
                    continue
                running.remove(p)
                if p.returncode != 0:
                    status = status_of(p.returncode)
                    if running:
                        print(f"launch.nodes: node {hosts[p.pid]} exited with status {status}; "
                              f"ending the other {len(running)}", file=log, flush=True)
                    return status
            time.sleep(POLL_S)
        return 0
    finally:
        end(procs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launch.nodes",
                                description="Run one command per node as one job.")
    p.add_argument("--rsh", default="ssh", metavar="AGENT",
                   help="how to reach a node: AGENT HOST COMMAND (default ssh; e.g. "
                        "\"ssh -p 2222\", or launch.cluster's rsh agent)")
    p.add_argument("--node", nargs=2, action="append", default=[], metavar=("HOST", "COMMAND"),
                   help="a node and the shell command it runs (once per node)")
    a = p.parse_args(argv)
    try:
        rsh = shlex.split(a.rsh)
    except ValueError as e:
        print(f"launch.nodes: error: --rsh {a.rsh!r}: {e}", file=sys.stderr)
        return 2
    if not a.node or not rsh:
        print("launch.nodes: error: give --node HOST COMMAND once per node, and --rsh a "
              "program", file=sys.stderr)
        return 2
    got: list[int] = []
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: got.append(signum))
    try:
        return run_nodes([(h, c) for h, c in a.node], rsh, os.getcwd(),
                         lambda: got[0] if got else None)
    except OSError as e:  # the agent cannot be started
        print(f"launch.nodes: error: --rsh {a.rsh!r}: {e.strerror}: {e.filename}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
