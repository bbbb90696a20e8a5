"""Compute on shared cores: how many torch threads a rank gets, and how busy the machine was.

Every rank of a job runs its forward and backward passes on torch's intra-op
threads. Share the cores out among the ranks that run *on the same physical
machine*, not only among the ranks of the same (emulated) node: the emulated
cluster (``launch.cluster``) and the container cluster (``docker/``) put
several nodes on one machine, each node sees only its own ranks, and on a
2-core machine 2 nodes x 1 rank each took 2 threads, four compute threads on
two cores, and computed about 4x slower than 2 ranks on one host.

The rule, written once (``thread_plan``):

1. A launcher that knows how many ranks of the job run on this machine
   (all of them, for the emulated and the container cluster) exports
   ``COMMBENCH_MACHINE_RANKS`` to every rank; threads = cores // that
   (rule ``"machine ranks from the launcher"``).
2. Otherwise the ranks of this node are the ranks of this machine (a real
   cluster, or one host): threads = cores // local ranks
   (rule ``"ranks on this node"``).
3. At least one thread, when ranks outnumber cores.

The cores shared out are those the rank may run on (its CPU affinity): a
launcher that binds each rank to its own cores has shared them out already.
Open MPI's daemons bind from core 0 up on every node, and on emulated nodes
of one machine they all pick the same cores, so ``launch`` starts those jobs
unbound (``hwloc_base_binding_policy none``).

Load: each job records the machine's cores and its 1-minute load average as
it starts and as it ends (``load_average``), and, where a launcher counted
them, the tasks running or runnable just before it (``runnable_tasks``). A job
that started with those tasks (else that load) above ``BUSY_LOAD_FRACTION`` x
cores shared the machine with other work, so its compute and its timings are
not its own; ``started_busy`` says so, and the analysis flags such runs. The
load average alone would also flag a job started within a minute of another
one's end, such as every job of a sweep after the first.

Only the standard library: the launchers and the analysis import this too.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass

#: set by launchers that start several nodes on one machine: the job's ranks on this machine
MACHINE_RANKS_ENV = "COMMBENCH_MACHINE_RANKS"
#: the 1-minute load average a launcher read before starting the job (``launch.cluster``
#: reads it before its link test); without it rank 0 reads the load at its start-up,
#: which then includes the job's own start-up
LOADAVG_ENV = "COMMBENCH_LOADAVG_BEFORE"
#: the tasks a launcher saw running or runnable just before the job, itself left out
#: (``runnable_tasks``): unlike the 1-minute load average, it does not still hold a job
#: that ended a minute ago (a sweep's previous job), so it decides ``started_busy``
RUNNABLE_ENV = "COMMBENCH_RUNNABLE_BEFORE"
RULE_MACHINE = "machine ranks from the launcher"
RULE_NODE = "ranks on this node"

#: a job that starts with a 1-minute load above this share of the cores ran beside other work
BUSY_LOAD_FRACTION = 0.75


def cores_available() -> int:
    """Cores this process may run on (its CPU affinity), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def machine_cores() -> int:
    """The machine's cores: what its load average is compared with (a rank that an MPI
    launcher bound to one core still shares the machine's load)."""
    return os.cpu_count() or 1


def load_average() -> float | None:
    """The machine's 1-minute load average (runnable and waiting tasks); None if unknown."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):  # no /proc/loadavg, or not Unix
        return None


def runnable_tasks(samples: int = 10, interval_s: float = 0.1) -> float | None:
    """Tasks running or runnable on the machine now, this reader left out: the median of
    ``samples`` readings of /proc/stat's ``procs_running``, ``interval_s`` apart. None
    where /proc/stat has no such line (not Linux)."""
    readings = []
    for i in range(samples):
        if i:
            time.sleep(interval_s)
        try:
            with open("/proc/stat") as f:
                line = next((ln for ln in f if ln.startswith("procs_running ")), None)
        except OSError:
            return None
        if line is None:
            return None
        readings.append(max(0, int(line.split()[1]) - 1))
    return float(statistics.median(readings))


def runnable_before_job(environ: Mapping[str, str] | None = None) -> float | None:
    """The launcher's ``runnable_tasks`` before the job (``RUNNABLE_ENV``); None when it
    gave none (the job's own ranks would be counted if read here)."""
    raw = (os.environ if environ is None else environ).get(RUNNABLE_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"{RUNNABLE_ENV}={raw!r}: expected a number >= 0")
    return value


def load_before_job(environ: Mapping[str, str] | None = None) -> tuple[float | None, str]:
    """(the load the job started with, where it was read): the launcher's reading before
    the job (``LOADAVG_ENV``), else this process's now."""
    raw = (os.environ if environ is None else environ).get(LOADAVG_ENV, "").strip()
    if raw:
        try:
            return float(raw), "launcher, before the job"
        except ValueError:
            raise ValueError(f"{LOADAVG_ENV}={raw!r}: expected a number") from None
    return load_average(), "rank 0 at start-up (includes the job's own)"


@dataclass(frozen=True)
class ThreadPlan:
    """Torch threads per rank, and why."""

    threads: int
    rule: str           # RULE_MACHINE or RULE_NODE
    machine_ranks: int  # the ranks the cores were shared among
    cores: int          # the cores this rank may run on (its CPU affinity)


def machine_ranks(environ: Mapping[str, str] | None = None) -> int | None:
    """``COMMBENCH_MACHINE_RANKS`` as a whole number >= 1, None when unset or empty.

    Raises ValueError naming the variable for any other value.
    """
    env = os.environ if environ is None else environ
    raw = env.get(MACHINE_RANKS_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{MACHINE_RANKS_ENV}={raw!r}: give the number of ranks of this job "
                         "on this machine (a whole number >= 1), or unset it")
    return value


def thread_plan(local_size: int, environ: Mapping[str, str] | None = None,
                cores: int | None = None) -> ThreadPlan:
    """Threads per rank by the rule above, for a rank with ``local_size`` ranks on its node.

    A launcher's count below the node's own ranks cannot be right (the node's ranks
    are on this machine): the larger of the two is used.
    """
    cores = cores_available() if cores is None else cores
    local = max(1, local_size)
    from_launcher = machine_ranks(environ)
    if from_launcher is None:
        ranks, rule = local, RULE_NODE
    else:
        ranks, rule = max(from_launcher, local), RULE_MACHINE
    return ThreadPlan(threads=max(1, cores // ranks), rule=rule, machine_ranks=ranks,
                      cores=cores)


def started_busy(loadavg_start: float | None, cores: int | None,
                 runnable_start: float | None = None) -> bool | None:
    """True when others were running as the job started: the tasks running or runnable
    just before it (``runnable_start``, where a launcher read it) or else the 1-minute
    load average, above ``BUSY_LOAD_FRACTION`` x cores. The runnable count decides where
    there is one: a load average still holds a job that ended up to a minute before
    (a sweep's previous job) though nothing runs now. None when the figures are missing
    (records from before they were kept)."""
    if not cores:
        return None
    if runnable_start is not None:
        return runnable_start > BUSY_LOAD_FRACTION * cores
    if loadavg_start is None:
        return None
    return loadavg_start > BUSY_LOAD_FRACTION * cores
