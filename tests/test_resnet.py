"""Real ResNet workload, compute profiles and their replay."""

from __future__ import annotations

import json

import pytest

from commbench.profile import record
from commbench.timing import StepTimer, now
from commbench.workloads import SyntheticWorkload
from commbench.workloads.compute_profile import ProfileError, load
from tests.conftest import ROOT, run_tool

SMALL = ["--workload", "real", "--model", "resnet18", "--image-size", "32", "--batch-size",
         "4", "--num-classes", "10", "--steps", "2", "--warmup", "1"]


@pytest.fixture(scope="module")
def profile_file(tmp_path_factory):
    prof = record("resnet18", batch_size=4, image_size=32, num_classes=10, iters=3, warmup=1)
    path = tmp_path_factory.mktemp("prof") / "r18.json"
    path.write_text(json.dumps(prof))
    return path


@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun"])
def test_real_workload_trains_in_lock_step(tmp_path, launcher):
    run = run_tool(launcher, 2, "commbench.allreduce", SMALL, tmp_path / "r.jsonl")
    summaries = [r for r in run.records if r["kind"] == "summary"]
    assert len(summaries) == 2
    for s in summaries:
        assert s["workload"] == "real" and s["image_size"] == 32 and s["wrong"] == 0
        # synced gradients + the same SGD step: every rank holds the same parameters
        a, b = s["param_checksum_ranks"]
        assert a == b
        assert s["forward_s"] > 0 and s["backward_s"] > 0 and s["optimizer_s"] > 0
        assert s["compute_s"] == pytest.approx(s["forward_s"] + s["backward_s"]
                                               + s["optimizer_s"], rel=0.05)
        assert s["peak_rss_mb"] > 50 and len(s["peak_rss_mb_ranks"]) == 2
        assert s["torch_threads"] >= 1


def test_profile_records_every_gradient(profile_file):
    prof = json.loads(profile_file.read_text())
    assert len(prof["grads"]) == 62 and len(prof["backward_order"]) == 62
    assert prof["backward_order"][0].startswith("fc.")  # backward starts at the last layer
    ready = {g["name"]: g["ready_s"] for g in prof["grads"]}
    assert ready["conv1.weight"] == pytest.approx(prof["backward_s"], rel=0.2)
    assert all(0 < t <= prof["backward_s"] for t in ready.values())


def test_replay_follows_the_profile(profile_file, one_torch_thread):
    prof = load(profile_file, "resnet18", 10)
    for scale in (1.0, 0.5):
        wl = SyntheticWorkload("resnet18", 0, rank=0, num_classes=10, profile=prof,
                               compute_scale=scale)
        warm = StepTimer()
        warm.begin_step(0, True)
        wl.forward(warm)
        wl.backward(warm, lambda i: None)  # first backward: autograd's own warm-up
        seen: list[tuple[int, float]] = []
        timer = StepTimer()
        timer.begin_step(0, False)
        wl.forward(timer)
        t0 = now()
        wl.backward(timer, lambda i, seen=seen, t0=t0: seen.append((i, now() - t0)))
        sample = timer.end_step()
        assert [wl.param_names[i] for i, _ in seen] == prof["backward_order"]
        assert sample.backward_s == pytest.approx(prof["backward_s"] * scale, rel=0.10)
        ready = {g["name"]: g["ready_s"] * scale for g in prof["grads"]}
        for i, t in seen:
            assert t >= ready[wl.param_names[i]] - 1e-3  # never before its profiled time


def test_profile_times_each_unit_and_the_replay_calls_it(profile_file, one_torch_thread):
    """Recorded on this CPU: each basic block's forward, after the stem, one after
    another; the replay calls each block's module once, in that order."""
    prof = load(profile_file, "resnet18", 10)
    blocks = [f"layer{s}.{b}" for s in range(1, 5) for b in range(2)]
    units = prof["forward_units"]
    assert [u["name"] for u in units] == ["", *blocks]
    assert all(0 <= u["start_s"] < u["end_s"] <= prof["forward_s"] for u in units)
    assert units[1]["start_s"] > units[0]["start_s"]  # the stem ran first
    wl = SyntheticWorkload("resnet18", 0, rank=0, num_classes=10, profile=prof)
    fired: list[str] = []
    for n in blocks:
        wl.net.get_submodule(n).register_forward_pre_hook(lambda _m, _a, n=n: fired.append(n))
    timer = StepTimer()
    timer.begin_step(0, False)
    wl.forward(timer)
    assert fired == blocks


def test_replay_job_total_time(tmp_path, profile_file):
    prof = json.loads(profile_file.read_text())
    s = run_tool("mpirun", 1, "commbench.allreduce", [
        "--model", "resnet18", "--num-classes", "10", "--compute-profile", str(profile_file),
        "--steps", "3", "--warmup", "1", "--algo", "native"], tmp_path / "r.jsonl").records[-1]
    total = prof["forward_s"] + prof["backward_s"] + prof["optimizer_s"]
    assert s["compute_s"] == pytest.approx(total, rel=0.10)


def test_mismatched_and_broken_profiles(tmp_path, profile_file):
    with pytest.raises(ProfileError, match="not resnet50"):
        load(profile_file, "resnet50", 10)
    with pytest.raises(ProfileError, match="not resnet18 with 1000"):
        load(profile_file, "resnet18", 1000)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match="cannot read"):
        load(bad, "resnet18", 10)


def test_digits_buffers_broadcast_or_local(tmp_path):
    """BatchNorm statistics: broadcast keeps whole models equal; local keeps only parameters.

    Checksums, not accuracies, decide: two different models can score the same.
    """
    run = run_tool("mpirun", 2, "commbench.allreduce", [
        "--workload", "real", "--dataset", "digits", "--image-size", "32", "--batch-size",
        "32", "--lr", "0.05", "--steps", "30", "--warmup", "1", "--algo", "native",
        "--buffers", "broadcast,local"], tmp_path / "r.jsonl")
    recs = run.records
    summ = {r["buffer_rule"]: r for r in recs if r["kind"] == "summary"}
    assert set(summ) == {"broadcast", "local"}
    bcast, local = summ["broadcast"], summ["local"]
    assert bcast["config"]["num_classes"] == 10
    assert bcast["buffer_bytes"] > 0
    # broadcast: parameters and buffers equal on every rank, so one model is evaluated
    assert len(set(bcast["state_checksum_ranks"])) == 1
    assert len(set(bcast["param_checksum_ranks"])) == 1
    assert bcast["final_accuracy_spread"] == 0
    # chance is 0.1 (+-0.016 over the 359 held-out digits); 30 synced SGD steps get past it
    assert bcast["final_accuracy"] > 0.15
    # local: parameters in lock-step, buffers each rank's own
    assert len(set(local["param_checksum_ranks"])) == 1
    assert len(set(local["buffer_checksum_ranks"])) == 2
    assert local["final_accuracy"] == local["final_accuracy_ranks"][0]
    # the broadcast is timed as its own phase of sync, and only under broadcast
    steps = [r for r in recs if r["kind"] == "step" and not r["warmup"]]
    for r in steps:
        if r["buffer_rule"] == "broadcast":
            assert all(t > 0 for t in r["ranks"]["buffer_sync_s"])
            assert r["exposed_sync_s"] >= r["buffer_sync_s"]
        else:
            assert r["ranks"]["buffer_sync_s"] == [0.0, 0.0]
    assert "final accuracy" in run.stdout and "the same on every rank" in run.stdout
    assert local["wall_throughput"] > 0 and local["wall_s"] > 0


@pytest.mark.parametrize("path", sorted((ROOT / "profiles").glob("*.json")),
                         ids=lambda p: p.name)
def test_shipped_profiles_load_for_their_model(path):
    prof = json.loads(path.read_text())
    assert load(path, prof["model"], prof["num_classes"]) == prof
    if path.name.startswith("cpu-"):  # measured here, named for it
        assert prof["device"] == "cpu"
    else:
        assert prof["device"] != "cpu" and prof["peak_cuda_mb"] > 0
    assert 0 < prof["forward_s"] < prof["backward_s"]
