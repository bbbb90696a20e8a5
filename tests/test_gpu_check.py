"""benchmarks/gpu_check.py on the CPU: without a GPU one line naming the cause, exit 2, nothing
started; its plan (the checks, their command lines, what is skipped and why) and its verdicts
on records, which run on the GPU machine only."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess

import pytest
import torch

from benchmarks import gpu_check
from benchmarks.gpu_check import FAIL, OK, SKIP, Check
from commbench import allreduce, microbench
from tests.conftest import PY, ROOT, launch


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: run the check")
def test_without_cuda_exits_2_naming_the_cause(tmp_path):
    res = subprocess.run([PY, "-m", "benchmarks.gpu_check", "-o", str(tmp_path / "gpu")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "torch sees no CUDA device" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "gpu").exists()


# -- the plan and the verdicts, on the CPU -------------------------------------------------

NO_MPI = {"torchrun": "python -m torch.distributed.run", "mpirun": None, "horovodrun": None}
ALL = {**NO_MPI, "mpirun": "/usr/bin/mpirun"}


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def _tool_args(argv: list[str], module: str) -> list[str]:
    return argv[argv.index(module) + 1:]


def test_plan_runs_the_issue_checks_first_and_skips_what_the_machine_lacks(tmp_path):
    checks = gpu_check.plan(tmp_path, 1, NO_MPI, device_timing=False)
    assert [c.name for c in checks] == ["nccl", "sync-off", "gloo", "device-bench", "mpi",
                                        "profile"]
    c = _by_name(checks)
    assert c["mpi"].argv is None and "mpirun" in c["mpi"].skip
    assert c["device-bench"].argv is None and gpu_check.DEVICE_TIMING_FLAG in \
        c["device-bench"].skip
    nccl = c["nccl"].argv
    assert nccl[nccl.index("--nproc-per-node") + 1] == "1"  # NCCL: one rank on one GPU
    assert "nccl" == nccl[nccl.index("--dist-backend") + 1]
    for name in ("sync-off", "gloo"):  # two ranks share the GPU, on Gloo
        argv = c[name].argv
        assert argv[argv.index("--nproc-per-node") + 1] == "2"
        assert argv[argv.index("--dist-backend") + 1] == "gloo"
    gloo = c["gloo"].argv
    assert gloo[gloo.index("--strategy") + 1] == "bucketed,async,ddp"
    assert "--sync-off-rank" in c["sync-off"].argv


def test_plan_with_every_launcher_and_two_gpus(tmp_path):
    c = _by_name(gpu_check.plan(tmp_path, 4, ALL, device_timing=True))
    assert all(x.argv for x in c.values())
    for name in ("nccl", "device-bench"):  # a rank per GPU, at most 2
        argv = c[name].argv
        assert argv[argv.index("--nproc-per-node") + 1] == "2"
    bench = _tool_args(c["device-bench"].argv, "commbench.microbench")
    assert bench[bench.index("-b") + 1] == "8" and bench[bench.index("-e") + 1] == str(256 << 20)


def test_every_planned_command_line_is_one_the_tools_take(tmp_path):
    """Each job's flags parse with its tool's parser, and each run's strategy settings take
    them (a typo would otherwise show only on the GPU)."""
    c = _by_name(gpu_check.plan(tmp_path, 2, ALL, device_timing=True))
    lines = [_tool_args(c[n].argv, "commbench.allreduce") for n in ("nccl", "gloo", "mpi")]
    lines.append(_tool_args(c["sync-off"].argv, "--sync-off-rank"))
    for args in lines:
        cfg = allreduce.Config.from_dict(vars(allreduce.build_parser().parse_args(args)))
        cfg.run_settings()
    microbench.build_parser().parse_args(_tool_args(c["device-bench"].argv,
                                                    "commbench.microbench"))
    ns = gpu_check.build_parser().parse_args(_tool_args(c["sync-off"].argv, "benchmarks.gpu_check"))
    assert ns.sync_off_rank == lines[-1]


def test_device_timing_is_seen_from_the_microbenchmark_parser(monkeypatch):
    def parser(with_flag: bool):
        p = argparse.ArgumentParser()
        if with_flag:
            p.add_argument("-z", gpu_check.DEVICE_TIMING_FLAG, action="store_true")
        return lambda: p

    monkeypatch.setattr(microbench, "build_parser", parser(True))
    assert gpu_check.has_device_timing()
    monkeypatch.setattr(microbench, "build_parser", parser(False))
    assert not gpu_check.has_device_timing()


def test_plan_prints_the_environment_and_runs_nothing(tmp_path, capsys):
    assert gpu_check.main(["--plan", "-o", str(tmp_path / "gpu")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# python ") and "torch" in out[0] and "NCCL" in out[0]
    assert any(line.startswith("# launchers: torchrun") for line in out)
    assert [line.split(":")[0] for line in out if not line.startswith("#")] == [
        "nccl", "sync-off", "gloo", "device-bench", "mpi", "profile"]
    assert not (tmp_path / "gpu").exists()
    for line in out:
        if line.startswith("gloo: "):
            shlex.split(line.removeprefix("gloo: "))  # a command a shell takes


def test_budget_must_be_positive(capsys):
    assert gpu_check.main(["--budget-s", "0"]) == 2
    assert "--budget-s" in capsys.readouterr().err


def test_a_check_left_too_little_budget_is_skipped_unrun(tmp_path):
    c = Check("x", ["false"], 60, lambda c: gpu_check.Verdict(OK, "ran"))
    v = gpu_check.run_check(c, gpu_check.MIN_START_S - 1)
    assert v.status == SKIP and "budget" in v.text
    skipped = Check("y", None, 60, lambda c: gpu_check.Verdict(OK, "ran"), skip="no mpirun")
    assert gpu_check.run_check(skipped, 300) == gpu_check.Verdict(SKIP, "no mpirun")


def _summary(strategy: str, **kw) -> dict:
    s = {"strategy": strategy, "wrong": 0, "device": "cuda:0", "peak_cuda_mb": 900.0,
         "param_checksum_ranks": [1.5, 1.5], "backend": "torch-gloo",
         "knobs": {"staging": "pinned host buffers"} if strategy == "bucketed" else {},
         "step_s": 0.30, "compute_s": 0.25, "backward_s": 0.16, "comm_s": 0.10,
         "exposed_sync_s": 0.05}
    s.update(kw)
    return s


REF = {"compute_s": 0.25, "backward_s": 0.16}


def test_gloo_runs_that_overlap_and_keep_their_compute_pass():
    runs = [_summary(s) for s in ("bucketed", "async", "ddp")]
    v = gpu_check.judge_gloo(runs, REF)
    assert v.status == OK, v.text
    assert "bucketed overlap 0.50" in v.text and "ddp overlap 0.50" in v.text


@pytest.mark.parametrize("change,why", [
    ({"wrong": 3}, "#wrong 3"),
    ({"exposed_sync_s": 0.10}, "exposed sync 100.0 ms >= comm"),
    ({"compute_s": 0.27}, "beyond 5%"),
    ({"param_checksum_ranks": [1.5, 1.25]}, "parameters differ"),
    ({"knobs": {}}, "not staged"),
])
def test_gloo_fails_naming_the_cause(change, why):
    v = gpu_check.judge_gloo([_summary("bucketed", **change)], REF)
    assert v.status == FAIL and why in v.text, v.text


def test_overlap_is_not_judged_where_backward_cannot_hide_comm():
    short = _summary("ddp", backward_s=0.05, exposed_sync_s=0.10)
    v = gpu_check.judge_gloo([short], REF)
    assert v.status == OK and "not judged: backward 50.0 ms < comm" in v.text
    # async's transfer hides under the next step's whole compute
    assert gpu_check.judge_gloo([_summary("async", backward_s=0.05)], REF).status == OK


def test_gloo_without_its_reference_fails():
    v = gpu_check.judge_gloo([_summary("bucketed")], None)
    assert v.status == FAIL and "no reference" in v.text


def test_nccl_job_checks_where_gradients_live():
    s = _summary("flat", backend="torch-nccl", versions={"nccl": "2.26.2"}, knobs={})
    assert gpu_check.judge_job([s], nccl=True).status == OK
    staged = {**s, "knobs": {"staging": "pinned host buffer"}}
    v = gpu_check.judge_job([staged], nccl=True)
    assert v.status == FAIL and "staged through" in v.text
    assert gpu_check.judge_job([], nccl=True).status == FAIL


def _rows(**kw) -> list[dict]:
    rows = [{"size": n, "wrong": 0, "timer": gpu_check.BACK_TO_BACK, "world_size": 1,
             "device": "cuda:0", "time_us": {"avg": 10.0 + n / 1e6}, "algbw": n / 1e4,
             "busbw": 0.0, "versions": {"nccl": "2.26.2"}} for n in gpu_check.bench_sizes()]
    rows[-1].update(kw)
    return rows


def test_device_bench_verdicts():
    assert [r["size"] for r in _rows()][:3] == [8, 16, 32] and len(_rows()) == 26
    v = gpu_check.judge_bench(_rows())
    assert v.status == OK and "one rank" in v.text, v.text
    assert "#wrong" in gpu_check.judge_bench(_rows(wrong=4)).text
    v = gpu_check.judge_bench(_rows(timer="cuda-events-per-call"))
    assert v.status == FAIL and "cuda-events-per-call" in v.text
    v = gpu_check.judge_bench(_rows()[:-1])
    assert v.status == FAIL and str(256 << 20) in v.text


@pytest.mark.torchrun
def test_the_sync_off_reference_runs_the_tools_steps_without_sync(tmp_path):
    """The reference's rank program on the CPU (two ranks under torchrun, Gloo): the tool's
    run sequence and step loop, no gradient sync, rank 0's medians as JSON."""
    out = tmp_path / "ref.json"
    res = launch("torchrun", 2, [
        PY, "-m", "benchmarks.gpu_check", "--sync-off-rank", "--workload", "real", "--device",
        "cpu", "--model", "smallcnn", "--batch-size", "8", "--image-size", "32", "--steps", "3",
        "--warmup", "1", "--quiet", "--output", str(out), "--dist-backend", "gloo",
        "--buffers", "local"])
    assert res.returncode == 0, res.stdout + res.stderr
    ref = json.loads(out.read_text())
    assert ref["measured_steps"] == 3
    assert 0 < ref["backward_s"] < ref["compute_s"] <= ref["step_s"]


def test_tools_that_do_not_import_stop_the_check_before_it_starts(monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "tools_import", lambda: "the tools do not import here "
                        "(No module named 'numpy'): install what it names")
    assert gpu_check.main(["--plan"]) == 2
    assert "No module named 'numpy'" in capsys.readouterr().err


def test_the_tools_import_here():
    assert gpu_check.tools_import() == ""
