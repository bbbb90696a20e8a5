"""--compression, --accum-steps and the peers (horovod, ddp) in the same harness."""

from __future__ import annotations

import os

import pytest

from commbench.strategies import STRATEGIES, make_strategy
from commbench.validate import tolerance
from tests.conftest import PY, ROOT, run_check, run_tool, summaries

SCRIPT = "compressed_vs_native.py"
TINY_REAL = ["--workload", "real", "--model", "resnet18", "--image-size", "32",
             "--batch-size", "4", "--num-classes", "10", "--steps", "2", "--warmup", "1"]
#: the same on the small CNN, where DDP's bucket count is not checked (it fits one bucket)
SMALL_REAL = ["smallcnn" if a == "resnet18" else a for a in TINY_REAL]


def _ok(n: int) -> str:
    return f"OK compressed and accumulated == flat native on {n} ranks"


@pytest.mark.mpi
@pytest.mark.parametrize("np_,layout", [(1, None), (2, None), (3, "a,a,b"), (4, "a,a,a,b")])
def test_every_strategy_compressed_or_not_equals_flat_native_mpi(np_, layout):
    run_check("mpirun", np_, SCRIPT, "mpi", _ok(np_), nodes=layout)


@pytest.mark.torchrun
def test_every_strategy_compressed_or_not_equals_flat_native_torch():
    run_check("torchrun", 3, SCRIPT, "torch", _ok(3), nodes="a,a,b")


@pytest.mark.horovod
def test_every_strategy_compressed_or_not_equals_flat_native_horovod():
    run_check("horovodrun", 3, SCRIPT, "horovod", _ok(3), nodes="a,a,b")


@pytest.mark.mpi
@pytest.mark.skipif(os.geteuid() != 0, reason="emulated cluster needs root")
@pytest.mark.parametrize("slots,np_", [(3, 4)])  # uneven 3 + 1 (even nodes: the fake ones)
def test_on_emulated_nodes(slots, np_):
    from launch.cluster import cluster, launch_argv
    from launch.execute import run

    prog = [PY, str(ROOT / "tests" / "mpi" / SCRIPT), "mpi"]
    with cluster(2, slots, rate="1gbit", name="cbc") as spec:
        res = run(launch_argv(spec, "mpirun", np_, prog), timeout=240, cwd=str(ROOT))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert _ok(np_) in res.stdout


def test_tolerance_is_exact_for_float32_and_grows_with_ranks_for_half_types():
    import torch

    assert tolerance(torch.float32, 64) == 1e-6
    assert tolerance(torch.float16, 4) == 4 * 2**-10
    assert tolerance(torch.bfloat16, 8) == 8 * 2**-7


def test_compressed_buffers_carry_half_the_bytes():
    import types

    import torch

    one = types.SimpleNamespace(rank=0, size=1, supports_p2p=False,
                                device_collectives=False)  # construction reduces nothing
    grads = [torch.zeros(10), torch.zeros(5, 2)]
    for comp, nbytes in (("none", 80), ("fp16", 40), ("bf16", 40)):
        s = make_strategy("bucketed", one, grads, bucket_mb=0, compression=comp)
        assert s.nbytes == nbytes and sum(s.knobs()["bucket_bytes"]) == nbytes
        assert s.knobs()["compression"] == comp


@pytest.mark.mpi
def test_accumulation_syncs_once_per_step_and_counts_every_sample(tmp_path):
    recs = run_tool("mpirun", 2, "commbench.allreduce", [
        "--model", "resnet18", "--strategy", "flat,bucketed", "--algo", "native",
        "--bucket-mb", "5", "--accum-steps", "3", "--compute-ms", "15", "--steps", "3",
        "--warmup", "1", "--compression", "fp16"], tmp_path / "r.jsonl").records
    summ = summaries(recs)
    for r in recs:
        if r["kind"] == "step":
            want = 1 if r["strategy"] == "flat" else summ["bucketed"]["knobs"]["buckets"]
            assert r["comm_calls"] == want  # one sync per step of three micro-batches
            assert r["comm_bytes"] == 11_689_512 * 2  # fp16 on the wire
            assert r["compute_s"] >= 3 * 0.015 * 0.95  # three micro-batches of compute
    for s in summ.values():
        assert s["wrong"] == 0 and s["knobs"]["compression"] == "fp16"
        assert s["throughput"] == pytest.approx(2 * 32 * 3 / s["step_s"], rel=0.2)


@pytest.mark.horovod
def test_peers_train_like_flat_under_horovodrun(tmp_path):
    """Horovod's and DDP's own sync, on the same model, seed and data: the same parameters."""
    run = run_tool("horovodrun", 2, "commbench.allreduce", [
        *TINY_REAL, "--strategy", "flat,bucketed,horovod,ddp", "--algo", "native",
        "--bucket-mb", "1"], tmp_path / "r.jsonl")
    summ = summaries(run.records)
    assert set(summ) == {"flat", "bucketed", "horovod", "ddp"}
    ref = summ["flat"]["param_checksum_ranks"][0]
    for name, s in summ.items():
        assert s["wrong"] == 0, name
        a, b = s["param_checksum_ranks"]
        assert a == pytest.approx(b, rel=1e-6), name  # ranks stepped alike
        assert a == pytest.approx(ref, rel=1e-5), name  # and like flat
        assert s["comm_s"] > 0 and s["exposed_sync_s"] >= 0, name
    assert summ["ddp"]["knobs"]["buckets_per_step"] > 1
    assert summ["horovod"]["knobs"]["horovod_fusion_threshold"] == str(64 * 2**20)
    # buffers: each peer's own rule; where it broadcasts, whole models are equal
    rules = {name: s["buffer_rule"] for name, s in summ.items()}
    assert rules == {"flat": "broadcast", "bucketed": "broadcast", "ddp": "ddp-broadcast",
                     "horovod": "horovod-initial-broadcast"}
    assert summ["ddp"]["knobs"]["broadcast_buffers"] is True
    for name in ("flat", "bucketed", "ddp"):
        assert len(set(summ[name]["state_checksum_ranks"])) == 1, name
    assert len(set(summ["horovod"]["buffer_checksum_ranks"])) == 2  # each rank's own batches
    assert "hosts:" in run.stdout and "ddp" in run.stdout


@pytest.mark.horovod
def test_peers_accumulate_and_compress(tmp_path):
    summ = summaries(run_tool("horovodrun", 2, "commbench.allreduce", [
        *SMALL_REAL, "--strategy", "flat,horovod,ddp", "--algo", "native", "--accum-steps",
        "2", "--compression", "fp16"], tmp_path / "r.jsonl",
        env={"HOROVOD_FUSION_THRESHOLD": str(2**20)}).records)
    ref = summ["flat"]["param_checksum_ranks"][0]
    for name, s in summ.items():
        assert s["wrong"] == 0 and s["knobs"]["compression"] == "fp16", name
        # fp16 rounding of the mean differs by summation order: close, not equal
        assert s["param_checksum_ranks"][0] == pytest.approx(ref, rel=1e-3), name
    assert summ["horovod"]["knobs"]["backward_passes_per_step"] == 2
    assert summ["horovod"]["knobs"]["horovod_fusion_threshold"] == str(2**20)


def test_peers_need_a_model():
    assert STRATEGIES["horovod"].needs_model and STRATEGIES["ddp"].needs_model
    assert not any(STRATEGIES[s].needs_model for s in ("flat", "bucketed", "hierarchical"))
