"""Real jobs: python -m commbench.allreduce under mpirun and horovodrun, records checked."""

from __future__ import annotations

import pytest

from commbench import SCHEMA_VERSION
from tests.conftest import run_tool

ARGS = ["--model", "resnet18", "--steps", "3", "--warmup", "1", "--compute-ms", "20",
        "--algo", "native,ring"]

STEP_FIELDS = {"schema", "kind", "run_id", "strategy", "algo", "backend", "world_size", "nodes",
               "local_size", "workload", "model", "batch_size", "step_s", "compute_s", "comm_s",
               "exposed_sync_s", "sync_share", "busbw_gbps", "versions", "hostnames", "config",
               "step", "warmup", "ranks", "wait_s"}
SUMMARY_FIELDS = (STEP_FIELDS - {"step", "warmup", "ranks"}) | {"wrong", "stats",
                                                                  "measured_steps"}


def check_records(recs: list[dict], world_size: int, backend: str) -> None:
    steps = [r for r in recs if r["kind"] == "step"]
    summaries = [r for r in recs if r["kind"] == "summary"]
    assert sorted(s["algo"] for s in summaries) == ["native", "ring"]
    assert len(steps) == 2 * (3 + 1)
    for r in steps:
        assert STEP_FIELDS <= set(r), STEP_FIELDS - set(r)
        assert len(r["ranks"]["step_s"]) == world_size
        # the step's time is its slowest rank's
        assert r["step_s"] == pytest.approx(max(r["ranks"]["step_s"]))
        assert r["step_s"] == pytest.approx(r["compute_s"] + r["exposed_sync_s"])
        assert 0 <= r["sync_share"] <= 1
        assert r["comm_s"] > 0 and r["busbw_gbps"] > 0
        assert r["comm_bytes"] == 11_689_512 * 4
    assert [r["warmup"] for r in steps[:4]] == [True, False, False, False]
    for s in summaries:
        assert SUMMARY_FIELDS <= set(s), SUMMARY_FIELDS - set(s)
        assert s["wrong"] == 0
        assert s["elements_checked"] == 11_689_512 * world_size
        assert s["measured_steps"] == 3 and s["stats"]["step_s"]["count"] == 3
        assert s["world_size"] == world_size and s["backend"] == backend
        assert s["strategy"] == "flat" and s["model"] == "resnet18"
        assert s["versions"]["torch"] and s["versions"]["mpi_library"]
        assert len(s["hostnames"]) == world_size


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [3])  # other sizes: every other job test
def test_mpirun(tmp_path, np_):
    run = run_tool("mpirun", np_, "commbench.allreduce", ARGS, tmp_path / "r.jsonl")
    check_records(run.records, np_, "mpi")
    assert "#wrong" in run.stdout and "(GB/s)" in run.stdout


@pytest.mark.horovod
def test_horovodrun(tmp_path):
    recs = run_tool("horovodrun", 2, "commbench.allreduce", ARGS, tmp_path / "r.jsonl").records
    check_records(recs, 2, "horovod")
    assert recs[-1]["versions"]["horovod"] == "0.28.1"


@pytest.mark.mpi
def test_backend_forced_under_mpirun(tmp_path):
    recs = run_tool("mpirun", 2, "commbench.allreduce",
                    [*ARGS, "--algo", "native", "--backend", "horovod"],
                    tmp_path / "r.jsonl").records
    assert {r["backend"] for r in recs} == {"horovod"}


@pytest.mark.horovod
def test_horovodrun_gloo_native_runs_and_ring_is_refused(tmp_path):
    out = tmp_path / "r.jsonl"
    s = run_tool("horovodrun-gloo", 2, "commbench.allreduce", [*ARGS, "--algo", "native"],
                 out).records[-1]
    assert s["backend"] == "horovod" and s["versions"]["horovod_controller"] == "gloo"
    assert s["wrong"] == 0
    out.unlink()
    run = run_tool("horovodrun-gloo", 2, "commbench.allreduce",
                   [*ARGS, "--algo", "native,ring"], out, expect_rc=None)
    assert run.rc != 0
    assert "--algo ring needs point-to-point messages" in run.output
    assert not out.exists()  # refused before the native run wrote anything


@pytest.mark.mpi
@pytest.mark.parametrize("algo", ["native", "ring"])
def test_a_wrong_element_fails_the_run(tmp_path, algo):
    run = run_tool("mpirun", 3, "commbench.allreduce", [*ARGS, "--algo", algo],
                   tmp_path / "r.jsonl", expect_rc=1, corrupt_rank=1)
    assert "wrong elements in validation" in run.stderr
    summary = run.records[-1]
    assert summary["kind"] == "summary" and summary["wrong"] >= 1


# -- wait vs transfer inside the step ----------------------------------------------------

def _allreduce(tmp_path, name: str, args: list[str]) -> list[dict]:
    return run_tool("mpirun", 2, "commbench.allreduce", args, tmp_path / f"{name}.jsonl",
                    timeout=180).records


@pytest.mark.mpi
def test_wait_and_transfer_in_records_and_table(tmp_path):
    recs = _allreduce(tmp_path, "r", ["--steps", "3", "--warmup", "1",
                                      "--strategy", "flat,bucketed", "--model", "resnet18"])
    summaries = {(s["strategy"], s["algo"]): s for s in recs if s["kind"] == "summary"}
    assert {"flat", "bucketed"} == {k[0] for k in summaries}
    for r in (r for r in recs if r["kind"] == "step"):
        n = summaries[(r["strategy"], r["algo"])]["knobs"].get("buckets", 1)
        assert r["collectives"] == n and r["ranks"]["collectives"] == [n, n]
        assert r["sync_transfer_s"] > 0 and r["sync_wait_s"] >= 0
        assert all(w >= 0 for w in r["ranks"]["sync_wait_s"])
        assert r["sync_wait_s"] == r["ranks"]["sync_wait_s"][r["critical_rank"]]
        assert r["sync_wait_max_s"] == max(r["ranks"]["sync_wait_s"])
        # transfer is the shortest rank's time in the collectives, within the critical
        # rank's comm time (the engine runs buckets one after another)
        assert r["sync_transfer_s"] <= r["comm_s"] + 1e-9
        assert r["imbalance_s"] >= 0 and r["straggler_rank"] in (None, 0, 1)
    for s in summaries.values():
        assert s["schema"] == SCHEMA_VERSION
        for f in ("sync_wait_s", "sync_wait_max_s", "sync_transfer_s", "imbalance_s"):
            assert s[f] >= 0 and s["stats"][f]["count"] == 3
        assert "straggler_rank" in s


@pytest.mark.mpi
def test_a_straggler_shows_as_wait_not_transfer(tmp_path):
    args = ["--steps", "4", "--warmup", "1", "--strategy", "flat", "--algo", "native",
            "--model", "resnet18", "--compute-ms", "50"]
    slow = _allreduce(tmp_path, "slow", [*args, "--slow-rank", "1:3"])
    even = _allreduce(tmp_path, "even", args)[-1]
    summary = slow[-1]
    steps = [r for r in slow if r["kind"] == "step" and not r["warmup"]]
    # rank 1 computes 150 ms against rank 0's 50: rank 0 waits for it in the all-reduce
    assert summary["straggler_rank"] == 1 and summary["imbalance_s"] > 0.05
    for r in steps:
        assert r["straggler_rank"] == 1
        assert r["ranks"]["sync_wait_s"][0] > 0.5 * r["imbalance_s"]
        assert r["ranks"]["sync_wait_s"][1] < 0.5 * r["imbalance_s"]
    # without a straggler the waits are small next to the straggler's
    assert even["straggler_rank"] is None
    assert summary["sync_wait_max_s"] > 0.5 * summary["imbalance_s"]
    assert even["stats"]["sync_wait_max_s"]["max"] < 0.5 * summary["imbalance_s"]
