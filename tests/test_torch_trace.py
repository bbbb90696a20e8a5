"""--trace torch: torch.profiler traces per rank that Holistic Trace Analysis loads.

One 2-rank job under mpirun (real gpt-tiny compute, bucketed sync) makes the
traces every test here reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commbench.allreduce import parse_config
from commbench.flags import ConfigError
from tests.conftest import run_tool

PHASES = {"forward", "backward", "sync", "optimizer"}
WARMUP, STEPS, TRACED = 1, 4, 2
FIRST = WARMUP + (STEPS - TRACED) // 2  # the window: the middle of the measured steps
WINDOW = range(FIRST, FIRST + TRACED)


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[list[dict], Path]:
    recs = run_tool("mpirun", 2, "commbench.allreduce", [
        "--workload", "real", "--model", "gpt-tiny", "--batch-size", "4", "--strategy",
        "bucketed", "--bucket-mb", "0.1", "--first-bucket-mb", "0.1", "--steps", str(STEPS),
        "--warmup", str(WARMUP), "--trace", "torch", "--trace-steps", str(TRACED)],
        tmp_path_factory.mktemp("trace") / "gpt.jsonl", timeout=300).records
    summary = next(r for r in recs if r["kind"] == "summary")
    return recs, Path(summary["torch_trace_dir"])


@pytest.mark.mpi
def test_step_records_say_which_steps_were_traced(job):
    recs, _ = job
    steps = [r for r in recs if r["kind"] == "step"]
    # the window is in the middle of the measured steps: untraced steps on both sides
    assert [r["traced"] for r in steps] == [r["step"] in WINDOW for r in steps]
    assert 0 < FIRST - WARMUP and FIRST + TRACED < WARMUP + STEPS
    assert not any(r["kind"] == "trace" for r in recs)  # the timeline's records: --trace only
    # the medians are of the untraced steps; the traced ones' cost is stated beside them
    summary = next(r for r in recs if r["kind"] == "summary")
    assert summary["traced_steps"] == TRACED and summary["measured_steps"] == STEPS
    assert summary["stats"]["step_s"]["count"] == STEPS - TRACED
    traced = sorted(r["step_s"] for r in steps if r["traced"])
    assert summary["traced_step_s"] == pytest.approx(sum(traced) / 2)
    # the wall clock leaves the window out as the medians do: it holds the untraced steps
    untraced = [r["step_s"] for r in steps[WARMUP:] if not r["traced"]]
    assert summary["wall_s"] >= sum(untraced)
    assert summary["wall_throughput"] == pytest.approx(
        len(untraced) * summary["batch_size"] * 2 / summary["wall_s"])
    # against its neighbours: the untraced step on each side of the window
    near = [r["step_s"] for r in steps[WARMUP:] if not r["traced"]]
    assert summary["trace_overhead"] == pytest.approx(
        summary["traced_step_s"] / (sum(near) / 2) - 1)


@pytest.mark.mpi
def test_one_trace_per_rank_beside_the_results_with_distributed_info(job):
    recs, folder = job
    results_file = Path(recs[0]["config"]["output"])
    assert folder.parent == results_file.parent / f"{results_file.stem}.torch-trace"
    files = sorted(folder.glob("rank*.pt.trace.json"))
    assert [f.name.split(".")[0] for f in files] == ["rank0", "rank1"]
    for rank, f in enumerate(files):
        trace = json.loads(f.read_text())
        assert trace["distributedInfo"] == {"backend": "mpi", "rank": rank, "world_size": 2}
        names = [e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"]
        assert [n for n in names if n.startswith("ProfilerStep#")] == [
            f"ProfilerStep#{k}" for k in WINDOW]
        assert PHASES <= set(names)


@pytest.mark.mpi
def test_collectives_are_placed_inside_their_steps(job):
    """Every collective the strategy timed in a traced step is in that rank's trace, with its
    bytes, inside its step's ProfilerStep range."""
    recs, folder = job
    traced = [r for r in recs if r["kind"] == "step" and r["traced"]]
    for rank, f in enumerate(sorted(folder.glob("rank*.pt.trace.json"))):
        events = [e for e in json.loads(f.read_text())["traceEvents"] if e.get("ph") == "X"]
        steps = {int(e["name"].split("#")[1]): e for e in events
                 if e["name"].startswith("ProfilerStep#")}
        colls = [e for e in events if e["name"] == "commbench collective"]
        assert len(colls) == sum(r["ranks"]["collectives"][rank] for r in traced) > 0
        for c in colls:
            s = steps[c["args"]["step"]]
            assert c["args"]["bytes"] > 0
            # a few microseconds of slack: placed by this rank's clock, not the profiler's
            assert s["ts"] - 50 <= c["ts"] and c["ts"] + c["dur"] <= s["ts"] + s["dur"] + 50


@pytest.mark.mpi
def test_holistic_trace_analysis_loads_both_ranks_with_the_phases(job):
    hta = pytest.importorskip("hta.trace_analysis")
    _, folder = job
    analysis = hta.TraceAnalysis(trace_dir=str(folder))
    assert sorted(analysis.t.get_ranks()) == [0, 1]
    sym = analysis.t.symbol_table.get_sym_table()
    for rank in (0, 1):
        names = {sym[i] for i in analysis.t.get_trace(rank)["name"]}
        assert PHASES | {"commbench collective"} <= names, rank
    # HTA counts an iteration from one ProfilerStep to the next: all but the last traced
    assert set(analysis.get_profiler_steps()) <= set(WINDOW)
    assert analysis.get_profiler_steps()


def test_trace_flag_keeps_the_timeline_and_takes_torch():
    assert parse_config(["--trace"]).trace == "commbench"
    assert parse_config(["--timeline"]).trace == "commbench"
    assert parse_config([]).trace is None
    cfg = parse_config(["--trace", "torch", "--steps", "3"])
    assert (cfg.trace, cfg.trace_steps) == ("torch", 3)  # default 5, at most --steps
    assert parse_config(["--trace", "torch", "--trace-steps", "2"]).trace_steps == 2


@pytest.mark.parametrize("argv,message", [
    (["--trace", "perfetto"], "--trace"),
    (["--trace-steps", "2"], "--trace-steps: needs --trace torch"),
    (["--trace", "torch", "--trace-steps", "30", "--steps", "20"], "--trace-steps 30"),
    (["--trace", "torch", "--trace-steps", "0"], "--trace-steps"),
])
def test_bad_trace_flags_name_the_flag(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(argv)


@pytest.mark.horovod
def test_horovod_backend_writes_its_rank_into_each_trace(tmp_path):
    """Under Horovod torch.distributed is not initialised either: distributedInfo is ours."""
    recs = run_tool("horovodrun", 2, "commbench.allreduce", [
        "--model", "gpt-tiny", "--compute-ms", "20", "--algo", "native", "--steps", "2",
        "--warmup", "0", "--trace", "torch", "--quiet"], tmp_path / "hvd.jsonl",
        timeout=300).records
    summary = next(r for r in recs if r["kind"] == "summary")
    assert summary["backend"] == "horovod" and summary["wrong"] == 0
    files = sorted(Path(summary["torch_trace_dir"]).glob("rank*.pt.trace.json"))
    infos = [json.loads(f.read_text())["distributedInfo"] for f in files]
    assert infos == [{"backend": "horovod", "rank": r, "world_size": 2} for r in range(2)]
