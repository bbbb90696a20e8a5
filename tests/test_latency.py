"""The per-message latency between nodes every job measures (``commbench.latency``): its
record fields, the latency-bound rule, the table's lines, and real jobs on each library."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from analysis.report import alpha_words
from commbench import latency
from commbench.comm.base import Topology
from tests.conftest import run_tool


def test_latency_share_is_calls_times_alpha_over_the_time():
    f = latency.latency_fields(10.0, 50, 1e-3)  # 50 calls x 10 us = 0.5 ms of 1 ms
    assert f == {"latency_share": 0.5, "latency_bound": True}
    f = latency.latency_fields(10.0, 4, 1e-3)
    assert f["latency_share"] == pytest.approx(0.04) and f["latency_bound"] is False


@pytest.mark.parametrize("alpha,calls,secs", [(None, 4, 1.0), (10.0, 0, 1.0), (10.0, 4, 0.0),
                                              (10.0, math.nan, 1.0)])
def test_no_latency_share_without_alpha_calls_or_time(alpha, calls, secs):
    assert latency.latency_fields(alpha, calls, secs) == {"latency_share": None,
                                                          "latency_bound": None}


def test_one_node_measures_nothing_and_says_why():
    comm = SimpleNamespace(topo=Topology(rank=0, size=2, local_rank=0, local_size=2,
                                         cross_rank=0, cross_size=1, hostnames=("a", "a")))
    f = latency.measure(comm)
    assert f["alpha_us"] is None and f["alpha_calls"] == 0
    assert "one node" in f["alpha_note"]
    assert latency.footer_lines(f, 4.0, []) == [
        "alpha between nodes: one node: no link between nodes to measure"]


def test_footer_names_the_dilation_and_the_latency_bound_rows():
    f = {"alpha_us": 2.5, "alpha_p5_us": 2.1, "alpha_p95_us": 3.0, "alpha_note": "8-byte"}
    rows = [("flat/native", {"latency_bound": True, "latency_share": 0.8}),
            ("flat/ring", {"latency_bound": False, "latency_share": 0.1})]
    lines = latency.footer_lines(f, 8.0, rows)
    assert lines[0].startswith("alpha between nodes: 2.5 us (p5-p95 2.1-3.0; 8-byte)")
    assert "K = 8" in lines[0] and "divided by about K" in lines[0]
    assert lines[1].startswith("latency-bound: flat/native (80%)")
    assert "flat/ring" not in lines[1]
    assert "K =" not in latency.footer_lines(f, 1.0, rows)[0]


def test_report_says_alpha_not_recorded_for_older_records():
    old = {"nodes": 2, "schema": 4}
    new = {"nodes": 2, "alpha_us": 12.0}
    assert alpha_words([old]) == "alpha not recorded"
    assert alpha_words([{"nodes": 1}]) == "one node"
    assert alpha_words([new, {**new, "alpha_us": 14.0}]) == "13.0"
    assert alpha_words([new, old]) == "12.0 (1 of 2 rows: alpha not recorded)"


MICRO = ["-b", "8", "-e", "8", "-n", "3", "-w", "1", "--quiet"]


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun", "horovodrun"])
def test_every_library_records_alpha_between_nodes(tmp_path, launcher):
    """4 ranks on two (fake) nodes: the job's first rank on each node ran 50 8-byte
    all-reduces through the job's own library, and every record says what it measured; the
    microbenchmark's 8-byte row is then latency-bound (one call is about alpha)."""
    run = run_tool(launcher, 4, "commbench.microbench", MICRO, tmp_path / "m.jsonl",
                   nodes="a,a,b,b", timeout=240)
    rows = [r for r in run.records if r["kind"] == "microbench"]
    assert rows
    for r in rows:
        assert r["alpha_calls"] == latency.CALLS and r["alpha_ranks"] == 2
        assert 0 < r["alpha_p5_us"] <= r["alpha_us"] <= r["alpha_p95_us"]
        assert r["alpha_note"].startswith("8-byte all-reduce among one rank per node (2)")
        assert r["latency_share"] is not None and r["latency_share"] > 0
    assert {r["alpha_us"] for r in rows} == {rows[0]["alpha_us"]}  # one job, one alpha


def test_one_node_job_records_no_alpha(tmp_path):
    run = run_tool("mpirun", 2, "commbench.microbench", MICRO, tmp_path / "m.jsonl")
    rows = [r for r in run.records if r["kind"] == "microbench"]
    assert rows and all(r["alpha_us"] is None and r["latency_bound"] is None for r in rows)
    assert all("one node" in r["alpha_note"] for r in rows)
