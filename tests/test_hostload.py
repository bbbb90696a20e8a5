"""commbench.hostload: the scheduler's and the machine's counters, a run's host summary, and
the link-bound / host-bound verdict on counters recorded from real runs. No process is
started: the counters are read from this test process, fake /proc files and recorded
windows."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from commbench import hostload
from commbench.hostload import (
    HOST_BOUND,
    LINK_BOUND,
    HostMonitor,
    HostWindow,
    footer_lines,
    is_link_bound,
    read_cpu_times,
    read_schedstat,
    record_fields,
    summarize,
    verdict,
)

HAS_SCHEDSTAT = Path("/proc/self/schedstat").exists()


def spin(cpu_s: float, limit_s: float = 5.0) -> None:
    """Keep this thread on a core until it has had ``cpu_s`` of CPU time (at most ``limit_s``
    on the wall: the machine is shared)."""
    t0, end = time.thread_time(), time.perf_counter() + limit_s
    while time.thread_time() - t0 < cpu_s and time.perf_counter() < end:
        pass


# --- reading the counters ------------------------------------------------------------------

def test_read_schedstat_sums_every_thread(tmp_path):
    task = tmp_path / "task"
    for tid, text in {"100": "1000000000 500000000 10\n", "101": "250000000 250000000 3\n",
                      "102": "7\n"}.items():  # 102: too few fields, skipped
        (task / tid).mkdir(parents=True)
        (task / tid / "schedstat").write_text(text)
    (task / "103").mkdir()  # a thread that ended between the listing and the read
    assert read_schedstat(str(task)) == (1.25, 0.75, 2)


def test_read_schedstat_none_without_counters(tmp_path):
    assert read_schedstat(str(tmp_path / "absent")) is None
    assert read_schedstat(str(tmp_path)) is None  # no threads
    (tmp_path / "1").mkdir()
    assert read_schedstat(str(tmp_path)) is None  # no schedstat (schedstats off)


@pytest.mark.skipif(not HAS_SCHEDSTAT, reason="the kernel keeps no schedstat")
def test_read_schedstat_real_process_grows_with_work():
    before = read_schedstat()
    spin(0.05)
    after = read_schedstat()
    assert before is not None and after is not None
    assert after[0] - before[0] >= 0.045  # the scheduler saw the busy loop
    assert after[1] >= before[1] >= 0.0
    assert after[2] >= 1


STAT = """cpu  100 5 50 800 20 0 4 1 30 0
cpu0 50 2 25 400 10 0 2 1 15 0
intr 12345
"""


def test_read_cpu_times(tmp_path):
    f = tmp_path / "stat"
    f.write_text(STAT)
    # idle + iowait; user..steal (guest time is already counted in user)
    assert read_cpu_times(str(f)) == (820.0, 980.0)
    f.write_text("cpu 10 0 5 85\n")  # a kernel without iowait and later fields
    assert read_cpu_times(str(f)) == (85.0, 100.0)


def test_read_cpu_times_none_without_the_machines_line(tmp_path):
    assert read_cpu_times(str(tmp_path / "absent")) is None
    f = tmp_path / "stat"
    f.write_text("")
    assert read_cpu_times(str(f)) is None
    f.write_text("cpu0 1 2 3 4\n")
    assert read_cpu_times(str(f)) is None


def test_read_cpu_times_real():
    times = read_cpu_times()
    assert times is not None
    idle, total = times
    assert 0 <= idle <= total and total > 0


# --- the monitor ---------------------------------------------------------------------------

def test_monitor_stop_before_start():
    monitor = HostMonitor()
    assert monitor.stop() is None and monitor.result is None


@pytest.mark.skipif(not HAS_SCHEDSTAT, reason="the kernel keeps no schedstat")
def test_monitor_window_over_work():
    monitor = HostMonitor()
    monitor.start()
    spin(0.03)
    w = monitor.stop()
    assert isinstance(w, HostWindow) and monitor.result is w
    assert w.window_s > 0 and 0.025 <= w.cpu_s <= w.window_s * (os.cpu_count() or 1) + 0.01
    assert w.runq_s >= 0 and w.threads >= 1
    assert w.idle_share is None or 0.0 <= w.idle_share <= 1.0
    assert w.link_bytes is None  # no interface named
    assert w.as_dict()["cpu_s"] == w.cpu_s
    assert w.poll_cpu_s == 0.0  # no polled call in the window
    # stopped: a second stop measures nothing and keeps the result; start clears it
    assert monitor.stop() is None and monitor.result is w
    monitor.start()
    assert monitor.result is None


def test_monitor_reads_the_link_bytes():
    received = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        received.bind(("127.0.0.1", 0))
        monitor = HostMonitor("lo")
        monitor.start()
        for _ in range(10):
            sender.sendto(b"x" * 1000, received.getsockname())
        w = monitor.stop()
    finally:
        sender.close()
        received.close()
    assert w is not None and w.link_bytes >= 10 * 1000  # payload, plus headers and others'


def test_monitor_names_a_missing_interface():
    with pytest.raises(ValueError, match="COMMBENCH_LINK_IFACE=nosuch0"):
        HostMonitor("nosuch0").start()


# --- recorded runs -------------------------------------------------------------------------
# Measured on a 2-core machine: the microbenchmark at 16 MiB on the emulated cluster, 2 nodes
# x 4 ranks at 1 Gbit/s unless said otherwise. Per rank: the share of the window on a core and
# waiting for one; the machine's idle share.

#: hier at K = 1: host-bound (its figure moved 9 % when K doubled)
HIER_K1 = dict(cpu=[0.08, 0.05, 0.07, 0.06, 0.09, 0.05, 0.07, 0.06],
               runq=[0.12, 0.16, 0.15, 0.19, 0.15, 0.22, 0.19, 0.22], idle=0.432)
#: hier at K = 4: link-bound
HIER_K4 = dict(cpu=[0.03, 0.02, 0.02, 0.02, 0.03, 0.02, 0.03, 0.02],
               runq=[0.03, 0.05, 0.03, 0.04, 0.03, 0.05, 0.04, 0.05], idle=0.748)
#: the project's ring (busy-polls in MPI_Wait) at K = 1: link-bound (link efficiency 1.0)
RING_K1 = dict(cpu=[0.25] * 8, runq=[0.75] * 8, idle=0.0)
#: Open MPI's native all-reduce (busy-polls) at K = 4: host-bound
NATIVE_K4 = dict(cpu=[0.25] * 8, runq=[0.75] * 8, idle=0.0)
#: 2 nodes x 1 rank, ring at 200 Mbit/s, K = 1: link-bound, no link efficiency recorded
RING_2X1 = dict(cpu=[0.9936, 0.9920], runq=[0.0054, 0.0047], idle=0.0)


def windows(cpu: list[float], runq: list[float], idle: float | None, window_s: float = 2.5,
            link_bytes: int | None = None) -> list[dict]:
    """Every rank's window (``HostWindow.as_dict``) with these shares of ``window_s``."""
    return [{"window_s": window_s, "cpu_s": c * window_s, "runq_s": q * window_s, "threads": 3,
             "idle_share": idle, "link_bytes": link_bytes} for c, q in zip(cpu, runq)]


def host(run: dict, **kw) -> dict:
    h = summarize(windows(**run, **kw), cores=2)
    assert h is not None
    return h


def test_summarize_a_recorded_run():
    h = host(HIER_K1, link_bytes=40_000_000)
    assert h["cores"] == 2 and h["ranks"] == 8 and h["window_s"] == 2.5
    assert h["cpu_share"] == pytest.approx(HIER_K1["cpu"])
    assert h["runq_share"] == pytest.approx(HIER_K1["runq"])
    assert h["runq_share_median"] == pytest.approx(0.175)
    assert h["idle_share"] == 0.432 and h["link_bytes"] == 40_000_000
    # no polling recorded apart: all of it counts as outside polling
    assert h["work_cpu_share"] == h["cpu_share"] and h["work_runq_share"] == h["runq_share"]
    assert h["work_runq_share_median"] == h["runq_share_median"]


def test_summarize_mixed_and_partial_windows():
    ws = [HostWindow(window_s=2.0, cpu_s=0.5, runq_s=0.1, threads=3, idle_share=0.4,
                     link_bytes=1000),
          None,                                    # a rank that measured nothing
          {"window_s": 0.0, "cpu_s": 1.0, "runq_s": 1.0, "threads": 1, "idle_share": 0.0},
          {"window_s": 4.0, "cpu_s": None, "runq_s": None, "threads": None, "idle_share": 0.2,
           "link_bytes": 3000},                    # no schedstat on this rank
          {"window_s": 1.0, "cpu_s": 0.1, "runq_s": 0.3, "threads": 2, "idle_share": None}]
    h = summarize(ws, cores=None)
    assert h["ranks"] == 3 and h["cores"] is None and h["window_s"] == 4.0
    assert h["cpu_share"] == [0.25, None, 0.1] and h["runq_share"] == [0.05, None, 0.3]
    assert h["runq_share_median"] == pytest.approx(0.175)
    assert h["idle_share"] == 0.2  # the machine's least idle window
    assert h["link_bytes"] == 3000


def test_summarize_takes_polling_out_of_the_work_shares():
    ws = [{"window_s": 2.0, "cpu_s": 0.5, "runq_s": 1.5, "threads": 3, "idle_share": 0.0,
           "poll_cpu_s": 0.4, "poll_runq_s": 1.4},
          # polling read across the window's edge can exceed it: never below zero
          {"window_s": 2.0, "cpu_s": 0.5, "runq_s": 1.5, "threads": 3, "idle_share": 0.0,
           "poll_cpu_s": 0.6, "poll_runq_s": 1.6},
          {"window_s": 2.0, "cpu_s": 0.5, "runq_s": 1.5, "threads": 3, "idle_share": 0.0,
           "poll_cpu_s": None, "poll_runq_s": None}]  # no polling measured
    h = summarize(ws, cores=2)
    assert h["cpu_share"] == [0.25] * 3 and h["runq_share"] == [0.75] * 3
    assert h["work_cpu_share"] == pytest.approx([0.05, 0.0, 0.25])
    assert h["work_runq_share"] == pytest.approx([0.05, 0.0, 0.75])
    assert h["runq_share_median"] == 0.75
    assert h["work_runq_share_median"] == pytest.approx(0.05)


def test_summarize_without_windows():
    assert summarize([], cores=2) is None
    assert summarize([None, None], cores=2) is None
    assert summarize([{"window_s": 0.0, "cpu_s": 0.0, "runq_s": 0.0}], cores=2) is None


def test_no_verdict_without_host_counters():
    assert verdict(None) is None
    assert verdict({}) is None
    h = summarize([{"window_s": 1.0, "cpu_s": None, "runq_s": None, "threads": None,
                    "idle_share": 0.5}], cores=2)
    assert h is not None and h["runq_share_median"] is None
    assert verdict(h) is None  # no run-queue wait measured: not judged


def polled_windows(cpu: list[float], runq: list[float], poll_cpu: list[float],
                   poll_runq: list[float], window_s: float = 2.0) -> list[dict]:
    """Windows whose shares of ``window_s`` inside busy-polling calls are recorded apart."""
    return [{"window_s": window_s, "cpu_s": c * window_s, "runq_s": q * window_s,
             "threads": 3, "idle_share": 0.0, "poll_cpu_s": pc * window_s,
             "poll_runq_s": pq * window_s}
            for c, q, pc, pq in zip(cpu, runq, poll_cpu, poll_runq)]


def test_hier_k1_is_host_bound():
    b = verdict(host(HIER_K1))
    assert b.startswith(f"{HOST_BOUND} (rank 7 spent 28% of the window (summed over its "
                        "threads) on host work or waiting for a core, outside polling (6% on "
                        "a core); limit 5%")
    assert is_link_bound({"bound": b}) is False


def test_hier_k4_host_share_at_the_limit():
    # ranks 1 and 5: 2 % on a core + 5 % waiting = 7 % > 5 %: host-bound, conservatively
    # (hier's figure moved 1.7 % from K = 4 to 8); K = 8's counters are link-bound
    assert verdict(host(HIER_K4)).startswith(f"{HOST_BOUND} (rank 1 spent 7%")
    k8 = dict(cpu=[0.02] * 8, runq=[0.02] * 8, idle=0.83)
    assert verdict(host(k8)) == LINK_BOUND


def test_busy_polling_wait_is_not_the_hosts():
    # native and ring on 2 x 4: each rank on a core 25 % and waiting 75 % of the window,
    # nearly all of it inside MPI's blocking calls, figures the same at K = 1, 2, 4, 8
    inside = polled_windows(cpu=[0.25] * 8, runq=[0.75] * 8, poll_cpu=[0.24] * 8,
                            poll_runq=[0.74] * 8)
    assert verdict(summarize(inside, cores=2)) == LINK_BOUND
    # the same counters without the split (records from before it): the host's, all of it
    assert verdict(host(NATIVE_K4)).startswith(f"{HOST_BOUND} (rank 0 spent 100%")
    assert verdict(host(RING_K1)).startswith(HOST_BOUND)


def test_ring_2x1_at_200mbit_is_link_bound():
    # the second known case: 2 ranks on 2 cores, 99 % of the window in MPI_Wait
    ws = polled_windows(cpu=RING_2X1["cpu"], runq=RING_2X1["runq"],
                        poll_cpu=[0.9911, 0.9873], poll_runq=[0.0054, 0.0047])
    assert verdict(summarize(ws, cores=2)) == LINK_BOUND
    # counters that do not say how much was polling count all of it as host work
    assert verdict(host(RING_2X1)).startswith(f"{HOST_BOUND} (rank 0 spent 100%")


def test_verdict_limit():
    at = dict(cpu=[0.01] * 4, runq=[hostload.HOST_LIMIT - 0.01] * 4, idle=0.5)
    assert verdict(host(at, window_s=1.0)) == LINK_BOUND  # at the limit is not above it
    above = dict(at, cpu=[0.01, 0.01, 0.03, 0.01])
    assert verdict(host(above, window_s=1.0)).startswith(f"{HOST_BOUND} (rank 2 spent 7%")
    on_core = dict(cpu=[0.10, 0.0], runq=[0.0, 0.0], idle=0.5)  # host work, no contention
    assert verdict(host(on_core, window_s=1.0)).startswith(f"{HOST_BOUND} (rank 0 spent 10%")


#: a plain ``horovodrun -np 8`` on 2 cores, no emulated cluster: rank 3's threads (Horovod's
#: background thread, torch's) together on a core or waiting for one 196 % of the window
HOROVODRUN_NP8 = dict(cpu=[0.5, 0.5, 0.5, 0.96, 0.5, 0.5, 0.5, 0.5],
                      runq=[0.5, 0.5, 0.5, 1.0, 0.5, 0.5, 0.5, 0.5], idle=0.0)


def test_a_host_bound_reason_off_the_emulated_cluster_advises_what_exists_there():
    b = verdict(host(HOROVODRUN_NP8), cluster=False)
    assert b.startswith(f"{HOST_BOUND} (rank 3 spent 196% of the window (summed over its "
                        "threads) on host work")
    assert "dilation would move" not in b
    assert "run fewer ranks than cores (8 ranks on 2 cores here)" in b
    assert "on the emulated cluster (python -m launch.cluster) at a time dilation K > 1" in b
    # fewer ranks than cores already: only the emulated cluster is left to advise
    few = verdict(summarize(windows(cpu=[0.3, 0.01], runq=[0.0, 0.0], idle=0.5), cores=4),
                  cluster=False)
    assert "cores here" not in few and "time dilation K > 1" in few


def test_a_host_bound_reason_on_the_emulated_cluster_advises_more_dilation():
    b = verdict(host(HOROVODRUN_NP8), cluster=True)
    assert b.endswith("limit 5%: doubling the dilation would move the figure by up to half "
                      "of it)")


def test_on_the_emulated_cluster_is_told_by_link_shaping_or_dilation(monkeypatch):
    from commbench import dilation
    from commbench.linkstats import SHAPING_ENV

    assert hostload.on_emulated_cluster({}) is (dilation.factor() != 1)
    assert hostload.on_emulated_cluster({SHAPING_ENV: "1gbit"}) is True
    assert hostload.on_emulated_cluster({SHAPING_ENV: "none"}) is True  # unshaped nodes
    monkeypatch.setattr(dilation, "_K", 4.0)
    assert hostload.on_emulated_cluster({}) is True
    monkeypatch.setattr(dilation, "_K", 1.0)
    monkeypatch.delenv(SHAPING_ENV, raising=False)
    assert "doubling the dilation" not in verdict(host(HIER_K1))  # the default: from here
    monkeypatch.setenv(SHAPING_ENV, "1gbit")
    assert "doubling the dilation" in verdict(host(HIER_K1))


def test_verdict_of_a_record_from_before_the_polling_split():
    # a stored record's host, without the work_ fields: judged on the whole shares
    old = {"cpu_share": HIER_K1["cpu"], "runq_share": HIER_K1["runq"],
           "runq_share_median": 0.175, "idle_share": 0.432}
    assert verdict(old).startswith(HOST_BOUND)
    assert verdict(dict(old, cpu_share=[0.01] * 8, runq_share=[0.02] * 8)) == LINK_BOUND


# --- polled calls --------------------------------------------------------------------------

def test_polled_counts_the_calls_cpu_time_once_where_calls_nest():
    @hostload.polled
    def inner() -> str:
        spin(0.02)
        return "inner"

    @hostload.polled
    def outer() -> str:
        spin(0.02)
        return inner()

    cpu0, runq0 = hostload.POLLING.totals()
    assert outer() == "inner" and outer.__name__ == "outer"
    cpu1, runq1 = hostload.POLLING.totals()
    assert 0.035 <= cpu1 - cpu0 < 0.055  # 40 ms, not 60: the inner call is the outer's
    assert runq1 >= runq0


@pytest.mark.skipif(not HAS_SCHEDSTAT, reason="the kernel keeps no schedstat")
def test_polled_after_an_exception_still_counts():
    @hostload.polled
    def fails() -> None:
        spin(0.01)
        raise RuntimeError("MPI error")

    with pytest.raises(RuntimeError, match="MPI error"):
        fails()
    cpu0, _ = hostload.POLLING.totals()
    hostload.polled(spin)(0.02)  # not taken for a nested call
    assert hostload.POLLING.totals()[0] - cpu0 >= 0.015


@pytest.mark.skipif(not HAS_SCHEDSTAT, reason="the kernel keeps no schedstat")
def test_monitor_counts_polling_apart():
    monitor = HostMonitor()
    monitor.start()
    spin(0.01)
    hostload.polled(spin)(0.03)
    w = monitor.stop()
    assert 0.025 <= w.poll_cpu_s <= w.cpu_s
    assert 0.0 <= w.poll_runq_s <= w.runq_s + 1e-3
    h = summarize([w], cores=2)
    assert h["work_cpu_share"][0] < h["cpu_share"][0]


def test_record_fields():
    quiet = dict(cpu=[0.01] * 4, runq=[0.01] * 4, idle=0.9)
    fields = record_fields(windows(**quiet))
    assert set(fields) == {"host", "bound"}
    assert fields["host"] == summarize(windows(**quiet), os.cpu_count())
    assert fields["host"]["cores"] == os.cpu_count() and fields["bound"] == LINK_BOUND
    assert record_fields(windows(**HIER_K1))["bound"].startswith(HOST_BOUND)
    assert record_fields([None]) == {"host": None, "bound": None}


def test_is_link_bound():
    assert is_link_bound({"bound": LINK_BOUND}) is True
    assert is_link_bound({"bound": f"{HOST_BOUND} (why)"}) is False
    assert is_link_bound({"bound": None}) is None and is_link_bound({}) is None


# --- the table's footer --------------------------------------------------------------------

def name(rec: dict) -> str:
    return rec["algo"]


def test_footer_every_row_link_bound_is_one_line():
    recs = [{"algo": "hier", "bound": LINK_BOUND}, {"algo": "ring", "bound": LINK_BOUND},
            {"algo": "flat"}]  # not judged
    assert footer_lines(recs, name, 1.0) == ["host: every row link-bound (commbench.hostload)"]


def test_footer_names_each_row_unless_all_link_bound():
    hb = verdict(host(HIER_K1))
    recs = [{"algo": "hier", "bound": hb}, {"algo": "ring", "bound": LINK_BOUND},
            {"algo": "flat", "bound": None}]
    assert footer_lines(recs, name, 1) == [f"host: hier: {hb}", "host: ring: link-bound"]


def test_footer_without_verdicts_is_empty():
    assert footer_lines([], name, 1.0) == []
    assert footer_lines([{"algo": "hier"}], name, 1.0) == []


def test_footer_says_the_dilation():
    recs = [{"algo": "ring", "bound": LINK_BOUND}]
    assert footer_lines(recs, name, 4.0) == [
        "time dilation 4: links at rate / 4, every time emulated (wall / 4)",
        "host: every row link-bound (commbench.hostload)"]
    lines = footer_lines([], name, 2.5, real_compute=True)
    assert lines == ["time dilation 2.5: links at rate / 2.5, every time emulated (wall / 2.5); "
                     "real compute stands for a node 2.5x faster than this machine's share"]
