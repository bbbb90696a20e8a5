"""Compute on shared cores: the thread rule, the load in the header, the analysis's flag."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from analysis import load as aload
from analysis.report import machine_load_lines
from commbench.comm.base import topology_from_hostnames
from commbench.cores import (
    BUSY_LOAD_FRACTION,
    MACHINE_RANKS_ENV,
    RULE_MACHINE,
    RULE_NODE,
    ThreadPlan,
    load_average,
    machine_ranks,
    started_busy,
    thread_plan,
)
from commbench.lifecycle import set_torch_threads
from commbench.output import Output
from commbench.results import job_header
from launch.cluster import ClusterSpec, launch_argv
from tests.conftest import ROOT

# -- the thread rule ------------------------------------------------------------------


def test_without_the_launchers_count_the_node_ranks_share_the_cores():
    plan = thread_plan(2, environ={}, cores=8)
    assert plan == ThreadPlan(threads=4, rule=RULE_NODE, machine_ranks=2, cores=8)


def test_the_launchers_machine_ranks_share_the_cores():
    # 2 emulated nodes x 1 rank on a 2-core machine: 1 thread each, not 2
    plan = thread_plan(1, environ={MACHINE_RANKS_ENV: "2"}, cores=2)
    assert plan == ThreadPlan(threads=1, rule=RULE_MACHINE, machine_ranks=2, cores=2)
    assert thread_plan(2, environ={MACHINE_RANKS_ENV: "4"}, cores=16).threads == 4


def test_more_ranks_than_cores_get_one_thread():
    assert thread_plan(8, environ={}, cores=2).threads == 1
    assert thread_plan(1, environ={MACHINE_RANKS_ENV: "8"}, cores=2).threads == 1
    assert thread_plan(0, environ={}, cores=2).threads == 2  # no node ranks known: one


def test_a_launcher_count_below_the_nodes_own_ranks_is_not_believed():
    plan = thread_plan(4, environ={MACHINE_RANKS_ENV: "1"}, cores=8)
    assert (plan.threads, plan.machine_ranks, plan.rule) == (2, 4, RULE_MACHINE)


@pytest.mark.parametrize("raw", ["0", "-2", "two", "1.5"])
def test_a_bad_machine_ranks_value_is_named(raw):
    with pytest.raises(ValueError, match=f"{MACHINE_RANKS_ENV}="):
        machine_ranks({MACHINE_RANKS_ENV: raw})
    assert machine_ranks({MACHINE_RANKS_ENV: " "}) is None and machine_ranks({}) is None


def test_set_torch_threads_applies_the_plan():
    before = torch.get_num_threads()
    try:
        plan = set_torch_threads(1, environ={MACHINE_RANKS_ENV: "1000"})
        assert plan.threads == 1 and plan.rule == RULE_MACHINE
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_load_average_is_the_machines_one_minute_load():
    load = load_average()
    assert load is not None and load >= 0
    assert load == pytest.approx(float(Path("/proc/loadavg").read_text().split()[0]), abs=1.0)


def test_started_busy_is_load_above_three_quarters_of_the_cores():
    assert BUSY_LOAD_FRACTION == 0.75
    assert started_busy(1.6, 2) is True
    assert started_busy(1.5, 2) is False  # not above
    assert started_busy(None, 2) is None and started_busy(1.0, None) is None


# -- the launchers that put several nodes on one machine -----------------------------


def _entrypoint():
    """docker/entrypoint.py (a script in the image, not a package module)."""
    name = "commbench_docker_entrypoint"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "docker" / "entrypoint.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_emulated_cluster_tells_every_rank_the_machines_ranks_and_leaves_them_unbound():
    spec = ClusterSpec(nodes=2, slots=2, name="cbt")
    for launcher in ("mpirun", "horovodrun"):
        argv = launch_argv(spec, launcher, 3, ["prog"])
        assert f"{MACHINE_RANKS_ENV}=3" in argv, argv
    argv = launch_argv(spec, "mpirun", 3, ["prog"])
    assert argv[argv.index(MACHINE_RANKS_ENV) - 1] == "-x"  # forwarded to the other nodes
    assert argv[argv.index("hwloc_base_binding_policy") + 1] == "none"


def test_compose_cluster_counts_all_ranks_but_real_hosts_count_their_own():
    ep = _entrypoint()
    s = ep.read_settings({"WORKERS": "2", "SLOTS": "1", "LAUNCHER": "mpirun"})
    argv = ep.job_argv(s, {})
    assert f"{MACHINE_RANKS_ENV}=2" in argv
    assert argv[argv.index(MACHINE_RANKS_ENV) - 1] == "-x"
    assert argv[argv.index("hwloc_base_binding_policy") + 1] == "none"
    real = ep.job_argv(ep.read_settings({"HOSTS": "hostA:2,hostB:2", "LAUNCHER": "mpirun"}), {})
    assert not any(a.startswith(MACHINE_RANKS_ENV) for a in real)
    assert "hwloc_base_binding_policy" not in real


# -- the header and the closing record -------------------------------------------------


class _Comm:
    """What the run layer reads of a communicator, for one rank alone."""

    rank, size, local_size, name = 0, 1, 1, "mpi"
    topo = topology_from_hostnames(0, ["hostA"])

    def versions(self) -> dict:
        return {"mpi": "test"}


class _Cfg:
    quiet = True
    output_dir = "results"

    def __init__(self, output: Path) -> None:
        self.output = str(output)

    def as_dict(self) -> dict:
        return {"output": self.output}


def test_job_header_carries_the_thread_rule_cores_and_load():
    plan = ThreadPlan(threads=1, rule=RULE_MACHINE, machine_ranks=2, cores=2)
    h = job_header(kind="step", run_id="r", backend="mpi", topo=_Comm.topo, vers={},
                   torch_threads=1, config={}, job_id="j", threads=plan, cores=4,
                   loadavg_start=0.5)
    assert {k: h[k] for k in ("job_id", "torch_threads", "thread_rule", "machine_ranks",
                              "rank_cores", "cores", "loadavg_start")} == {
        "job_id": "j", "torch_threads": 1, "thread_rule": RULE_MACHINE, "machine_ranks": 2,
        "rank_cores": 2, "cores": 4, "loadavg_start": 0.5}


def test_every_record_has_the_start_load_and_the_job_ends_with_its_end_load(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv(MACHINE_RANKS_ENV, "3")
    path = tmp_path / "r.jsonl"
    before = torch.get_num_threads()
    try:
        out = Output.open(_Comm(), "test", _Cfg(path))
        run = out.run({"strategy": "flat"})
        run.write("summary", {"wrong": 0})
        out.close()
        out.close()  # a second close writes nothing more
    finally:
        torch.set_num_threads(before)
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["kind"] for r in recs] == ["summary", "job_end"]
    summary, end = recs
    plan = thread_plan(1, environ={MACHINE_RANKS_ENV: "3"})
    assert summary["torch_threads"] == out.threads == plan.threads
    assert summary["thread_rule"] == RULE_MACHINE and summary["machine_ranks"] == 3
    assert summary["rank_cores"] == plan.cores and summary["cores"] == os.cpu_count()
    assert summary["loadavg_start"] >= 0
    assert end["job_id"] == summary["job_id"] and end["run_id"] is None
    assert end["loadavg_start"] == summary["loadavg_start"] and end["loadavg_end"] >= 0


def test_a_job_that_wrote_nothing_leaves_no_file(tmp_path):
    path = tmp_path / "none.jsonl"
    out = Output.open(_Comm(), "test", _Cfg(path))
    out.close()
    assert not path.exists()


# -- the analysis's flag -------------------------------------------------------------


def _rec(kind: str, job: str, run: str | None, start: float | None, cores: int | None = 2,
         **kw) -> dict:
    return {"schema": 1, "kind": kind, "job_id": job, "run_id": run, "loadavg_start": start,
            "cores": cores, "strategy": "flat", "world_size": 2, "torch_threads": 1,
            "thread_rule": RULE_MACHINE, "_file": "f.jsonl", **kw}


def _records() -> list[dict]:
    return [
        _rec("step", "j1", "quiet", 0.4), _rec("summary", "j1", "quiet", 0.4),
        _rec("job_end", "j1", None, 0.4, loadavg_end=1.9),
        _rec("step", "j2", "busy", 1.8), _rec("summary", "j2", "busy", 1.8),
        _rec("job_end", "j2", None, 1.8, loadavg_end=3.1),
        _rec("summary", None, "old", None, cores=None),  # written before the load was kept
    ]


def test_loading_marks_busy_starts_and_gives_runs_their_end_load(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "_file"}) + "\n"
                            for r in _records()))
    recs = aload.load([path]).records
    by_run = {(r["kind"], r["run_id"]): r for r in recs}
    assert by_run[("summary", "quiet")]["started_busy"] is False
    assert by_run[("summary", "quiet")]["loadavg_end"] == 1.9
    assert by_run[("step", "busy")]["started_busy"] is True
    assert by_run[("step", "busy")]["loadavg_end"] == 3.1
    assert by_run[("summary", "old")]["started_busy"] is None
    assert "loadavg_end" not in by_run[("summary", "old")]
    assert [r["run_id"] for r in aload.busy_runs(recs)] == ["busy"]
    cols, _ = aload.tidy(recs)
    assert {"started_busy", "loadavg_start", "loadavg_end", "thread_rule"} <= set(cols)


def test_report_lists_runs_that_started_on_a_busy_machine():
    text = "\n".join(machine_load_lines(_records()))
    assert "**1 of 2 runs started on a busy machine**" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| `f.jsonl` | busy |"))
    assert "| n/a | 1.80 | 2 | 3.10 | 1 | machine ranks from the launcher |" in row
    assert "| quiet |" not in text


def test_report_says_when_no_run_started_busy_or_none_recorded_the_load():
    quiet = [r for r in _records() if r["job_id"] != "j2"]
    text = "\n".join(machine_load_lines(quiet))
    assert "No run started on a busy machine" in text and "1 run records no load" in text
    old = [r for r in _records() if r["job_id"] is None]
    assert "No run records the machine's load" in "\n".join(machine_load_lines(old))


def test_the_launchers_load_reading_is_preferred():
    from commbench.cores import LOADAVG_ENV, load_before_job

    assert load_before_job({LOADAVG_ENV: "0.42"}) == (0.42, "launcher, before the job")
    load, source = load_before_job({})
    assert source.startswith("rank 0 at start-up") and (load is None or load >= 0)
    with pytest.raises(ValueError, match=LOADAVG_ENV):
        load_before_job({LOADAVG_ENV: "busy"})


def test_the_runnable_count_decides_where_the_launcher_read_it():
    """A sweep's previous job leaves the 1-minute load high for a minute after it ended
    though nothing runs: the runnable count before the job decides, where there is one."""
    assert started_busy(6.0, 2, runnable_start=0.0) is False
    assert started_busy(0.2, 2, runnable_start=4.0) is True
    assert started_busy(None, 2, runnable_start=1.0) is False
    assert started_busy(6.0, None, runnable_start=0.0) is None
    recs = [_rec("summary", "j3", "after-sweep-job", 6.0, runnable_start=0.0),
            _rec("summary", "j4", "beside-a-job", 0.9, runnable_start=8.0)]
    aload.mark_machine_load(recs)
    assert [r["started_busy"] for r in recs] == [False, True]
    text = "\n".join(machine_load_lines(recs))
    assert "**1 of 2 runs started on a busy machine**" in text
    row = next(ln for ln in text.splitlines() if "| beside-a-job |" in ln)
    assert "| 8.00 | 0.90 | 2 |" in row and "after-sweep-job" not in text


def test_the_launchers_runnable_count_reaches_the_header():
    from commbench.cores import RUNNABLE_ENV, runnable_before_job, runnable_tasks

    assert runnable_before_job({RUNNABLE_ENV: "3"}) == 3.0
    assert runnable_before_job({}) is None
    for bad in ("busy", "-1"):
        with pytest.raises(ValueError, match=RUNNABLE_ENV):
            runnable_before_job({RUNNABLE_ENV: bad})
    n = runnable_tasks(samples=3, interval_s=0.01)
    assert n is None or n >= 0
    spec = ClusterSpec(nodes=2, slots=1, name="cbt")
    argv = launch_argv(spec, "mpirun", 2, ["prog"], runnable_before=2.0)
    assert f"{RUNNABLE_ENV}=2" in argv
    assert argv[argv.index(RUNNABLE_ENV) - 1] == "-x"  # forwarded to the other nodes
