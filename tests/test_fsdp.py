"""The FSDP2 peer (``--strategy fsdp``): FSDP2 on a CPU mesh over Gloo at all, then jobs
under torchrun that step the parameters as flat does (2 and 4 ranks, uneven nodes, the
replay unit by unit and without units, the real model, accumulation), the collectives
each step records, and what it refuses."""

from __future__ import annotations

import pytest

from commbench.allreduce import parse_config
from commbench.flags import ConfigError
from commbench.strategies import SETTINGS, STRATEGIES
from commbench.strategies.fsdp import FSDPSettings
from tests.conftest import (
    PY,
    ROOT,
    launch,
    of_kind,
    run_tool,
    same_parameters_as_flat,
    summaries,
)
from tests.test_forward_units import with_units

R18 = ROOT / "profiles" / "h200-resnet18-b64.json"
STEPS = ["--steps", "3", "--warmup", "1"]
R18_UNITS = 8  # layer1.0 .. layer4.1, and the root


@pytest.mark.torchrun
def test_fsdp2_trains_on_a_cpu_mesh_over_gloo():
    """The smoke test: fully_shard per block then the root, forward prefetch by
    unshard(async_op=True), sum-only reductions; three SGD steps == unsharded SGD."""
    res = launch("torchrun", 2, [PY, str(ROOT / "tests" / "mpi" / "check_fsdp_smoke.py")],
                 timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "OK fsdp2 smoke" in res.stdout, res.stdout


@pytest.mark.torchrun
@pytest.mark.parametrize("np_,nodes", [(2, None), (4, None), (3, "a,a,b")])
def test_fsdp_steps_as_flat_unit_by_unit(tmp_path, np_, nodes):
    """The replay of a ResNet-18 profile with forward units: each block sharded, then the
    root; every step all-gathers each unit (forward, and again in backward) and
    reduce-scatters it once."""
    prof = with_units(R18, tmp_path / "r18.json")
    recs = run_tool("torchrun", np_, "commbench.allreduce",
                    ["--model", "resnet18", "--compute-profile", str(prof), *STEPS,
                     "--strategy", "flat,fsdp"], tmp_path / "r.jsonl", nodes=nodes,
                    timeout=300).records
    summ = summaries(recs)
    same_parameters_as_flat(summ, "fsdp")
    k, grad_bytes = summ["fsdp"]["knobs"], summ["flat"]["grad_bytes"]
    assert k["units"] == R18_UNITS + 1 and k["unit_names"][1:] == [
        f"layer{s}.{b}" for s in range(1, 5) for b in range(2)]
    assert sum(k["unit_bytes"]) == grad_bytes
    assert k["gathers_prefetched_per_step"] == R18_UNITS  # each block's forward gather
    assert set(summ["fsdp"]["comm_phases_s"]) == {"allgather", "reduce_scatter"}
    steps = [r for r in of_kind(recs, "step") if r["strategy"] == "fsdp"]
    # per step: the root's gather once (kept after forward), each block's twice, and one
    # reduce-scatter a unit
    assert steps and all(r["comm_calls"] == 1 + 2 * R18_UNITS + (R18_UNITS + 1)
                         for r in steps)
    assert all(r["comm_bytes"] == grad_bytes for r in steps)
    # handed over: about 3 gradients' worth (n-1)/n, less the root's second gather
    handed = k["library_bytes_per_step"] if np_ == 2 else None
    if handed is not None:
        root = k["unit_bytes"][0]
        assert handed == pytest.approx(3 * grad_bytes / 2 - root / 2, rel=0.01)
    # each rank's bytes, every step (rank 0's is the knob)
    for r in steps:
        ranks = r["ranks"]["library_bytes"]
        assert len(ranks) == np_ and all(b > 0 for b in ranks)
    assert steps[-1]["ranks"]["library_bytes"][0] == k["library_bytes_per_step"]


@pytest.mark.torchrun
def test_fsdp_without_forward_units_shards_the_root_alone(tmp_path):
    """--compute-ms replays forward as one wait: no unit's module computes, so the root is
    the one unit, gathered once and reduce-scattered once a step."""
    recs = run_tool("torchrun", 2, "commbench.allreduce",
                    ["--model", "resnet18", "--compute-ms", "20", *STEPS,
                     "--strategy", "flat,fsdp"], tmp_path / "r.jsonl", timeout=300).records
    summ = summaries(recs)
    same_parameters_as_flat(summ, "fsdp")
    assert summ["fsdp"]["knobs"]["units"] == 1
    assert summ["fsdp"]["knobs"]["gathers_prefetched_per_step"] == 0  # nothing to prefetch
    steps = [r for r in of_kind(recs, "step") if r["strategy"] == "fsdp"]
    assert steps and all(r["comm_calls"] == 2 for r in steps)


@pytest.mark.torchrun
def test_fsdp_on_the_real_model_and_with_accumulation_steps_as_flat(tmp_path):
    real = ["--workload", "real", "--model", "resnet18", "--image-size", "32",
            "--batch-size", "4", "--num-classes", "10", *STEPS]
    recs = run_tool("torchrun", 2, "commbench.allreduce", [*real, "--strategy", "flat,fsdp"],
                    tmp_path / "real.jsonl", timeout=300).records
    summ = summaries(recs)
    # SGD with momentum 0.9: the state is the shards'
    same_parameters_as_flat(summ, "fsdp")
    assert summ["fsdp"]["knobs"]["units"] == R18_UNITS + 1
    # the model computes on the host's thread: a blocking reduce-scatter inside
    # loss.backward() is sync, not backward compute (Workload.blocked)
    steps = [r for r in of_kind(recs, "step") if r["strategy"] == "fsdp"]
    assert steps and all(r["exposed_sync_s"] >= r["comm_phases_s"]["reduce_scatter"] - 1e-3
                         for r in steps)
    prof = with_units(R18, tmp_path / "r18.json")
    summ = summaries(run_tool("torchrun", 2, "commbench.allreduce",
                              ["--model", "resnet18", "--compute-profile", str(prof), *STEPS,
                               "--strategy", "flat,fsdp", "--accum-steps", "2"],
                              tmp_path / "accum.jsonl", timeout=300).records)
    same_parameters_as_flat(summ, "fsdp")


# --- what it refuses ----------------------------------------------------------------------


def test_fsdp_is_registered_and_refuses_compression():
    assert STRATEGIES["fsdp"].needs_model and SETTINGS["fsdp"] is FSDPSettings
    assert FSDPSettings(accum_steps=4).accum_steps == 4
    with pytest.raises(ConfigError, match="--strategy fsdp with --compression fp16"):
        parse_config(["--strategy", "flat,fsdp", "--compression", "fp16"])


@pytest.mark.mpi
def test_fsdp_outside_the_torch_backend_exits_2_naming_torchrun(tmp_path):
    run = run_tool("mpirun", 2, "commbench.allreduce",
                   ["--model", "resnet18", "--compute-ms", "5", "--steps", "1", "--warmup",
                    "0", "--strategy", "fsdp"], tmp_path / "r.jsonl", expect_rc=2)
    assert "--strategy fsdp" in run.stderr and "torchrun" in run.stderr, run.output
    assert run.stderr.count("needs the torch backend") == 1, run.output  # said once
    assert not run.records
