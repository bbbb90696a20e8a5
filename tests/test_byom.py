"""Bring your own model: ``--model package.module:factory`` on both workloads, every strategy.

The factories are in ``tests/models_for_tests.py``; ``quirky`` has a tied
embedding/output weight, a frozen layer and a layer forward never calls.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from commbench import profile
from commbench.allreduce import parse_config
from commbench.flags import ConfigError
from commbench.timing import StepTimer
from commbench.workloads import RealWorkload, make_workload
from commbench.workloads.objective import first_tensor, loss_rule
from tests import models_for_tests as m
from tests.conftest import ToolRun, of_kind, run_tool

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUIRKY = ["--model", "tests.models_for_tests:quirky", "--model-kwargs", '{"dim": 8}',
          "--input-shape", "6", "--vocab", "32"]
#: quirky's parameters that take a gradient, tied weight once; and the two it never uses
QUIRKY_SYNCED = ["embed.weight", "mix.weight", "mix.bias"]
QUIRKY_UNUSED = ["unused.weight", "unused.bias"]
QUIRKY_FROZEN = ["frozen.weight", "frozen.bias"]
SHORT = ["--steps", "2", "--warmup", "1", "--batch-size", "4", "--quiet"]


def _step(wl) -> list[int]:
    seen: list[int] = []
    timer = StepTimer()
    timer.begin_step(0, False)
    wl.forward(timer)
    wl.backward(timer, seen.append)
    wl.optimizer_step(timer)
    return seen


@pytest.mark.parametrize("factory,shape,rule", [
    (m.quirky, (4, 6), "token cross-entropy"),
    (m.mlp, (4, 3, 8, 8), "cross-entropy"),
    (m.with_loss, (4, 4), "module.loss"),
    (lambda: torch.nn.Linear(4, 1), (4, 4), "cross-entropy"),
    (lambda: torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Flatten(0)), (4, 4),
     "mean square"),
])
def test_loss_rule_fits_the_output(factory, shape, rule):
    net = factory()
    x = torch.randint(0, 32, shape) if factory is m.quirky else torch.randn(shape)
    assert loss_rule(net, first_tensor(net(x))) == rule


def test_real_workload_syncs_each_trained_parameter_once():
    cfg = parse_config(["--workload", "real", *QUIRKY, "--batch-size", "4"])
    wl = make_workload(cfg, 0, 1)
    assert isinstance(wl, RealWorkload) and wl.loss_rule == "token cross-entropy"
    assert wl.param_names == QUIRKY_SYNCED  # tied weight once, frozen and unused left out
    assert wl.unused == QUIRKY_UNUSED and wl.frozen == QUIRKY_FROZEN
    assert sorted(wl.backward_order) == [0, 1, 2]
    frozen = wl.net.frozen.weight.detach().clone()
    for _ in range(2):  # each hook fires once per step, in the learnt order
        assert _step(wl) == wl.backward_order
    assert wl.net.unused.weight.grad is None and wl.net.frozen.weight.grad is None
    assert torch.equal(wl.net.frozen.weight, frozen)
    assert wl.net.head.weight is wl.net.embed.weight


def test_replay_learns_the_same_parameters_on_the_meta_device():
    real = make_workload(parse_config(["--workload", "real", *QUIRKY]), 0, 1)
    replay = make_workload(parse_config([*QUIRKY, "--compute-ms", "6"]), 0, 1)
    assert replay.param_names == real.param_names and replay.unused == real.unused
    assert replay.backward_order == real.backward_order  # learnt from the meta pass
    assert _step(replay) == replay.backward_order


def test_warning_names_the_unused_parameters(capsys):
    make_workload(parse_config(["--workload", "real", *QUIRKY]), 0, 1)
    err = capsys.readouterr().err
    assert "backward never reaches" in err and "unused.weight, unused.bias" in err
    make_workload(parse_config(["--workload", "real", *QUIRKY]), 0, 1, job_rank=1)
    assert capsys.readouterr().err == ""  # rank 0 says it


@pytest.mark.parametrize("args,flag,cause", [
    (["--model", "tests.models_for_tests:nope"], "--model", "has no nope"),
    (["--model", "no_such_package.nets:build"], "--model", "cannot import no_such_package"),
    (["--model", "tests.models_for_tests:not_a_module"], "--model", "not a torch.nn.Module"),
    (["--model", "tests.models_for_tests:NOT_CALLABLE"], "--model", "not a callable"),
    (["--model", "tests.models_for_tests:needs_depth"], "--model-kwargs", "depth"),
    (["--model", "tests.models_for_tests:mlp", "--model-kwargs", "width=8,bogus=1"],
     "--model-kwargs", "bogus"),
    (["--model", "tests.models_for_tests:mlp", "--model-kwargs", "width"], "--model-kwargs",
     "KEY=VALUE"),
    (["--model", "tests.models_for_tests:mlp", "--input-shape", "5"], "--input-shape",
     "rejects"),
    (["--model", "tests.models_for_tests:mlp"], "--input-shape", "default"),
    (["--model", "tests.models_for_tests:mlp", "--input-shape", "3,a"], "--input-shape",
     "expected sizes"),
    (["--model", "resnet18", "--model-kwargs", "depth=3"], "--model-kwargs", "depth"),
    (["--model", "nets.py"], "--model", "unknown model"),
])
@pytest.mark.parametrize("workload", ["real", "synthetic"])
def test_bad_model_input_names_the_flag(args, flag, cause, workload):
    with pytest.raises(ConfigError) as e:
        parse_config(["--workload", workload, *args])
    assert flag in str(e.value) and cause in str(e.value)


def test_profile_of_a_user_model_replays_and_refuses_another(tmp_path: Path):
    path = tmp_path / "quirky.json"
    assert profile.main([*QUIRKY, "--batch-size", "4", "--iters", "2", "--warmup", "1",
                         "-o", str(path)]) == 0
    prof = json.loads(path.read_text())
    assert [g["name"] for g in prof["grads"]] == QUIRKY_SYNCED
    assert prof["unused"] == QUIRKY_UNUSED and prof["model_kwargs"] == {"dim": 8}
    cfg = parse_config([*QUIRKY, "--compute-profile", str(path)])
    wl = make_workload(cfg, 0, 1)
    assert wl.param_names == QUIRKY_SYNCED and wl.unused == QUIRKY_UNUSED
    other = [a if a != '{"dim": 8}' else "dim=12" for a in QUIRKY]
    with pytest.raises(ConfigError, match="--compute-profile.*recorded for"):
        parse_config([*other, "--compute-profile", str(path)])
    with pytest.raises(ConfigError, match="--compute-profile.*recorded for"):
        parse_config(["--model", "resnet18", "--compute-profile", str(path)])
    # the profile tool checks the same way
    assert profile.main(["--model", "tests.models_for_tests:needs_depth", "-o",
                         str(tmp_path / "x.json")]) == 2


def _check_runs(run: ToolRun, strategies: list[str], synced: list[str],
                unused: list[str]) -> list[dict]:
    sums = of_kind(run.records, "summary")
    assert [s["strategy"] for s in sums] == strategies
    for s in sums:
        assert s["wrong"] == 0 and s["elements_checked"] > 0, s["strategy"]
        assert s["grad_tensors"] == len(synced) and s["unused_params"] == unused
    return sums


@pytest.mark.parametrize("workload", ["real", "synthetic"])
def test_tied_frozen_unused_under_mpirun(tmp_path: Path, workload: str):
    """No hang (``launch`` times out), a warning, nothing wrong: flat, bucketed (one
    bucket per tensor, so every gradient has a bucket to hold back) and DDP."""
    strategies = ["flat", "bucketed", "ddp"]
    run = run_tool("mpirun", 2, "commbench.allreduce", [
        "--workload", workload, *QUIRKY, "--strategy", ",".join(strategies), "--algo",
        "native", "--bucket-mb", "0", "--compute-ms", "20", *SHORT], tmp_path / "r.jsonl")
    sums = _check_runs(run, strategies, QUIRKY_SYNCED, QUIRKY_UNUSED)
    assert "backward never reaches 2 parameter(s)" in run.stderr
    assert "unused.weight, unused.bias" in run.stderr
    assert sums[1]["knobs"]["buckets"] == len(QUIRKY_SYNCED)
    assert sums[2]["knobs"]["find_unused_parameters"] is True
    if workload == "real":
        assert all(s["frozen_params"] == QUIRKY_FROZEN for s in sums)
        assert sums[0]["loss_rule"] == "token cross-entropy"
        # every rank holds the same model after training
        assert all(len(set(s["param_checksum_ranks"])) == 1 for s in sums)


@pytest.mark.parametrize("launcher,strategies", [
    ("mpirun", ["flat", "bucketed", "ddp"]),
    ("horovodrun", ["flat", "bucketed", "horovod", "ddp"]),
])
def test_user_factory_under_launchers(tmp_path: Path, launcher: str, strategies: list[str]):
    run = run_tool(launcher, 2, "commbench.allreduce", [
        "--workload", "real", "--model", "tests.models_for_tests:mlp", "--model-kwargs",
        "depth=3,width=16", "--input-shape", "3,8,8", "--strategy", ",".join(strategies),
        "--algo", "native", *SHORT], tmp_path / "r.jsonl")
    sums = _check_runs(run, strategies, [f"{i}.{w}" for i in (1, 3, 5, 7)
                                         for w in ("weight", "bias")], [])
    assert all(s["model"] == "tests.models_for_tests:mlp" for s in sums)
    assert sums[0]["config"]["model_kwargs"] == {"depth": 3, "width": 16}
    assert all(len(set(s["param_checksum_ranks"])) == 1 for s in sums)


def test_quirky_model_under_horovod(tmp_path: Path):
    """Horovod's optimizer hooks every parameter that takes a gradient, the unused ones
    too: its synchronize() reduces zeros for them, nothing waits."""
    run = run_tool("horovodrun", 2, "commbench.allreduce", [
        "--workload", "real", *QUIRKY, "--strategy", "horovod", *SHORT], tmp_path / "r.jsonl")
    _check_runs(run, ["horovod"], QUIRKY_SYNCED, QUIRKY_UNUSED)


def test_bad_factory_exits_2_on_every_rank_before_any_collective(tmp_path: Path):
    out = tmp_path / "r.jsonl"
    run = run_tool("mpirun", 2, "commbench.allreduce",
                   ["--model", "tests.models_for_tests:not_a_module"], out, expect_rc=2)
    assert "--model tests.models_for_tests:not_a_module" in run.stderr
    assert "not a torch.nn.Module" in run.stderr
    assert not out.exists()
