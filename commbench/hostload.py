"""Host load over a run's measured steps: did the run measure the links, or this machine?

Where ranks outnumber cores (the emulated cluster on one machine), part of a
figure can be the host's: a rank that has its data but waits for a core, a
poller that takes the core a copy needed. Fidelity monitors (Mininet-HiFi,
Handigol et al., CoNEXT 2012) check invariants during the run and distrust a
result when one fails. The signals kept here, per rank, over the measured
steps only (``HostMonitor.start`` / ``stop``):

- the rank's CPU time and its run-queue wait (runnable, not running), summed
  over all its threads (``/proc/self/task/*/schedstat``: the scheduler's own
  accounting, in ns), each as a share of the window's wall time;
- the machine's idle share over the same window (``/proc/stat``).

Run-queue wait is the signal that names the host: time a thread could have run
and did not. Idle share alone cannot judge a run whose ranks busy-poll (Open
MPI's blocking collectives spin, so its ranks are always runnable), which is
why the verdict (``verdict``) reads run-queue wait where it is on a rank that
has work, with the thresholds chosen from measurement (``docs/fidelity.md``).

Not to be confused with ``benchmarks/replay_fidelity.py``, which checks that
replayed compute stands for real compute.

Only the standard library.
"""

from __future__ import annotations

import functools
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TypeVar

from commbench import dilation
from commbench.linkstats import SHAPING_ENV, read_iface_bytes

LINK_BOUND = "link-bound"
HOST_BOUND = "host-bound"


def read_schedstat(task_dir: str = "/proc/self/task") -> tuple[float, float, int] | None:
    """(CPU seconds, run-queue wait seconds, threads) summed over this process's threads;
    None where the kernel keeps no schedstat (not Linux, or schedstats off)."""
    cpu = wait = 0
    threads = 0
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"{task_dir}/{tid}/schedstat") as f:
                fields = f.read().split()
        except OSError:  # a thread that ended meanwhile
            continue
        if len(fields) < 2:
            continue
        cpu += int(fields[0])
        wait += int(fields[1])
        threads += 1
    if not threads:
        return None
    return cpu / 1e9, wait / 1e9, threads


def read_cpu_times(path: str = "/proc/stat") -> tuple[float, float] | None:
    """(idle jiffies incl. iowait, all jiffies) of the machine; None without /proc/stat."""
    try:
        with open(path) as f:
            line = f.readline().split()
    except OSError:
        return None
    if not line or line[0] != "cpu":
        return None
    values = [int(v) for v in line[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return float(idle), float(sum(values[:8]))  # guest time is already in user


class _Polling:
    """CPU time and run-queue wait spent inside blocking library calls (``polled``), summed
    over this process's threads. Open MPI's blocking calls busy-poll: a rank inside one is
    always runnable, so where ranks outnumber cores it waits for a core whether or not it
    has data to move, and that wait says nothing of the host's part in the figure."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cpu_ns = 0
        self.runq_ns = 0
        self.inside = threading.local()

    def totals(self) -> tuple[float, float]:
        with self.lock:
            return self.cpu_ns / 1e9, self.runq_ns / 1e9


POLLING = _Polling()
F = TypeVar("F", bound=Callable)


def polled(fn: F) -> F:
    """Decorate a blocking call that busy-polls (an MPI collective, ``Wait``): its CPU time
    and run-queue wait are counted in ``POLLING`` (outer call only, where calls nest).

    A thread in a busy-polling call never sleeps, so its wall time there is its CPU time
    plus its wait for a core: two clocks read around the call (~1 us) give both. Reading
    ``/proc/thread-self/schedstat`` instead cost ~29 us a call, as much as a small
    message's all-reduce in the microbenchmark."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if getattr(POLLING.inside, "on", False):
            return fn(*args, **kwargs)
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        POLLING.inside.on = True
        try:
            return fn(*args, **kwargs)
        finally:
            POLLING.inside.on = False
            cpu = time.thread_time_ns() - c0
            wall = time.perf_counter_ns() - t0
            with POLLING.lock:
                POLLING.cpu_ns += cpu
                POLLING.runq_ns += max(0, wall - cpu)

    return wrapper  # type: ignore[return-value]


@dataclass
class HostWindow:
    """One rank's host signals over a window of wall time."""

    window_s: float          # wall seconds (not emulated: the host works on the wall)
    cpu_s: float | None      # this rank's CPU time, all threads
    runq_s: float | None     # this rank's run-queue wait, all threads
    threads: int | None
    idle_share: float | None  # the machine's idle share over the window
    link_bytes: int | None = None  # max(rx, tx) through this node's link (where read)
    poll_cpu_s: float | None = None   # of cpu_s, inside busy-polling library calls
    poll_runq_s: float | None = None  # of runq_s, inside busy-polling library calls

    def as_dict(self) -> dict:
        return asdict(self)


class HostMonitor:
    """Reads the counters at ``start`` and ``stop``; ``window`` gives the difference."""

    def __init__(self, iface: str | None = None) -> None:
        self.iface = iface  # this node's link, read by one rank per node (linkstats)
        self._l0 = None
        self._p0 = (0.0, 0.0)
        self._t0 = None
        self._s0 = None
        self._c0 = None
        self._result: HostWindow | None = None

    def start(self) -> None:
        self._s0 = read_schedstat()
        self._c0 = read_cpu_times()
        self._l0 = read_iface_bytes(self.iface) if self.iface else None
        self._p0 = POLLING.totals()
        self._t0 = time.perf_counter()
        self._result = None

    def stop(self) -> HostWindow | None:
        if self._t0 is None:
            return None
        t1 = time.perf_counter()
        p1 = POLLING.totals()
        s1, c1 = read_schedstat(), read_cpu_times()
        link = None
        if self._l0 is not None:
            rx, tx = read_iface_bytes(self.iface)
            link = max(rx - self._l0[0], tx - self._l0[1])
        s0, c0 = self._s0, self._c0
        cpu = runq = None
        threads = None
        if s0 is not None and s1 is not None:
            cpu, runq, threads = s1[0] - s0[0], s1[1] - s0[1], s1[2]
        idle = None
        if c0 is not None and c1 is not None and c1[1] > c0[1]:
            idle = (c1[0] - c0[0]) / (c1[1] - c0[1])
        self._result = HostWindow(window_s=t1 - self._t0, cpu_s=cpu, runq_s=runq,
                                  threads=threads, idle_share=idle, link_bytes=link,
                                  poll_cpu_s=p1[0] - self._p0[0],
                                  poll_runq_s=p1[1] - self._p0[1])
        self._t0 = None
        return self._result

    @property
    def result(self) -> HostWindow | None:
        return self._result


def summarize(windows: Sequence[dict | HostWindow | None], cores: int | None) -> dict | None:
    """Every rank's window reduced for the record: per-rank shares of the wall window (all
    of it, and the part outside busy-polling library calls: ``work_``), their medians and
    maxima; None when no rank measured one."""
    ws = [w.as_dict() if isinstance(w, HostWindow) else w for w in windows]
    ws = [w for w in ws if w and w.get("window_s")]
    if not ws:
        return None

    def share(key: str, less: str | None = None) -> list[float | None]:
        return [None if w.get(key) is None else
                max(0.0, w[key] - (w.get(less) or 0.0 if less else 0.0)) / w["window_s"]
                for w in ws]

    def median(xs: list[float | None]) -> float | None:
        known = [x for x in xs if x is not None]
        return statistics.median(known) if known else None

    cpu, runq = share("cpu_s"), share("runq_s")
    work_cpu, work_runq = share("cpu_s", "poll_cpu_s"), share("runq_s", "poll_runq_s")
    idle = [w["idle_share"] for w in ws if w.get("idle_share") is not None]
    return {
        "window_s": max(w["window_s"] for w in ws),
        "cores": cores,
        "ranks": len(ws),
        "cpu_share": cpu,
        "runq_share": runq,
        "work_cpu_share": work_cpu,
        "work_runq_share": work_runq,
        "runq_share_median": median(runq),
        "work_runq_share_median": median(work_runq),
        "idle_share": min(idle) if idle else None,
        "link_bytes": max((w["link_bytes"] for w in ws if w.get("link_bytes") is not None),
                          default=None),
    }


#: the verdict's limit on the host's share of a rank's window outside busy-polling (its CPU
#: time and its wait for a core there): the part dilation takes out, so doubling K moves a
#: figure by up to half of it; at 5 % a link-bound figure stays within 2.5 % (plus what the
#: library does inside its calls) of its value at 2K. Chosen from measurement
#: (docs/fidelity.md): hierarchical on 2 x 4 at 1 Gbit/s, whose steps moved 8 %, 6 % and
#: 1.4 % as K went 1 -> 2 -> 4 -> 8, had 43 %, 23 % and 12 % of host share at 1, 2 and 4;
#: the 2 x 1 control moved 7 % from K = 1 to 2 with 9 %, then 2.7 % and 2.1 % with 4 % and 3 %
HOST_LIMIT = 0.05


def record_fields(windows: Sequence[dict | HostWindow | None]) -> dict:
    """What a record carries of its host windows: ``host`` (``summarize``) and ``bound``
    (``verdict``)."""
    host = summarize(windows, os.cpu_count())
    return {"host": host, "bound": verdict(host)}


def host_shares(host: dict) -> list[float]:
    """Each rank's host share of its window: CPU time and run-queue wait outside busy-polling
    library calls (the whole shares for a record from before polling was counted apart)."""
    cpu = host.get("work_cpu_share") or host.get("cpu_share") or []
    runq = host.get("work_runq_share") or host.get("runq_share") or []
    return [(c or 0.0) + (q or 0.0) for c, q in zip(cpu, runq)
            if c is not None or q is not None]


def on_emulated_cluster(environ: dict[str, str] | None = None) -> bool:
    """Whether this rank runs where time dilation exists: on the emulated cluster
    (``launch.cluster``), which gives every rank its link shaping (``COMMBENCH_LINK_SHAPING``,
    ``launch.links.link_env``) and, above K = 1, its dilation (``commbench.dilation``)."""
    env = os.environ if environ is None else environ
    return dilation.factor() != 1 or bool(env.get(SHAPING_ENV))


def verdict(host: dict | None, cluster: bool | None = None) -> str | None:
    """``link-bound`` or ``host-bound (why)`` from a record's ``host``; None without one.

    Host-bound where some rank's host share (``host_shares``: its CPU time and its wait for
    a core, outside busy-polling library calls, summed over the rank's threads, so above
    100 % where several ran at once) exceeds ``HOST_LIMIT`` of its window: that is the part
    time dilation shrinks, so the figure would move with K. What the reason advises depends
    on ``cluster`` (default: ``on_emulated_cluster()``): on the emulated cluster a larger
    dilation; elsewhere, where there is no dilation, fewer ranks than cores or the emulated
    cluster with ``--dilation``.

    Wait inside busy-polling calls is not counted: an Open MPI rank in a blocking call is
    always runnable, data or not, and where ranks outnumber cores it waits for a core ~75 %
    of the window; native and ring on 2 x 4, whose ranks waited so, gave the same figures
    at K = 1, 2, 4 and 8 (docs/fidelity.md). A saturated link does not make a run
    link-bound either: a step's host work outside its collectives (packing buffers, the
    optimizer) still shrinks with K; hierarchical steps whose collectives ran the link at
    98 % of its rate at K = 2 were 6 % slower than at K = 4.
    """
    if not host or host.get("runq_share_median") is None:
        return None
    shares = host_shares(host)
    if not shares:
        return None
    worst = max(range(len(shares)), key=shares.__getitem__)
    if shares[worst] > HOST_LIMIT:
        cpu = (host.get("work_cpu_share") or host.get("cpu_share"))[worst] or 0.0
        return (f"{HOST_BOUND} (rank {worst} spent {shares[worst]:.0%} of the window (summed "
                f"over its threads) on host work or waiting for a core, outside polling "
                f"({cpu:.0%} on a core); limit {HOST_LIMIT:.0%}: {_remedy(host, cluster)})")
    return LINK_BOUND


def _remedy(host: dict, cluster: bool | None) -> str:
    """What would take the host out of a host-bound figure, where the run was made."""
    if on_emulated_cluster() if cluster is None else cluster:
        return "doubling the dilation would move the figure by up to half of it"
    ranks, cores = host.get("ranks"), host.get("cores")
    here = f" ({ranks} ranks on {cores} cores here)" if ranks and cores and ranks > cores else ""
    return ("the figure holds this machine's scheduling as well as the links; with no time "
            f"dilation outside the emulated cluster, run fewer ranks than cores{here}, or run "
            "on the emulated cluster (python -m launch.cluster) at a time dilation K > 1")


def is_link_bound(rec: dict) -> bool | None:
    """A record's verdict: True link-bound, False host-bound (or not converged), None not
    judged. Its set-up's verdict where the analysis found one (``setup_bound``: the
    experiment runner's outcome rule, K against 2K, ``analysis.load.mark_setup_verdicts``),
    else the run's own counter reading (``bound``), provisional."""
    b = rec.get("setup_bound") or rec.get("bound")
    return None if not b else b == LINK_BOUND


def footer_lines(records: Sequence[dict], label, dilation: float, real_compute: bool = False
                 ) -> list[str]:
    """A table's footer on the host: the dilation, and each record's verdict (``label(rec)``
    names its row); one line when every row is link-bound."""
    lines = []
    if dilation != 1:
        lines.append(f"time dilation {dilation:g}: links at rate / {dilation:g}, every time "
                     f"emulated (wall / {dilation:g})"
                     + (f"; real compute stands for a node {dilation:g}x faster than this "
                        "machine's share" if real_compute else ""))
    judged = [(label(r), r.get("bound")) for r in records if r.get("bound")]
    if judged and all(b == LINK_BOUND for _, b in judged):
        lines.append("host: every row link-bound (commbench.hostload)")
    else:
        lines += [f"host: {name}: {b}" for name, b in judged]
    return lines
