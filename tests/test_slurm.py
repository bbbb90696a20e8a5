"""Slurm: batch scripts made by launch.slurm, run for real under a single-node Slurm."""

from __future__ import annotations

import subprocess

import pytest

from launch.slurm import batch_script
from tests import slurm_local
from tests.conftest import PY, ROOT, read_jsonl


def test_script_for_a_real_cluster():
    text = batch_script([PY, "-m", "commbench.allreduce", "--steps", "50"], nodes=4,
                        tasks_per_node=8, partition="gpu", time_limit="00:30:00")
    assert "#SBATCH --nodes=4" in text and "#SBATCH --ntasks-per-node=8" in text
    assert "#SBATCH --partition=gpu" in text and "#SBATCH --time=00:30:00" in text
    assert "srun --ntasks=32 --mpi=pmix --nodes=4 --ntasks-per-node=8" in text
    assert text.rstrip().endswith("-m commbench.allreduce --steps 50")
    mp = batch_script(["prog"], nodes=2, tasks_per_node=2, launcher="mpirun")
    assert "mpirun -np 4" in mp and "--oversubscribe" not in mp
    with pytest.raises(ValueError, match="launcher"):
        batch_script(["prog"], nodes=1, tasks_per_node=1, launcher="pdsh")


def test_torchrun_script_runs_one_torchrun_per_node_meeting_on_the_first():
    text = batch_script([PY, "-m", "commbench.allreduce", "--steps", "50"], nodes=4,
                        tasks_per_node=8, launcher="torchrun")
    lines = text.splitlines()
    master = lines.index('MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" '
                         '| sed -n 1p)')
    step = lines[master + 1]  # after MASTER_ADDR is known, in the script's shell
    assert step.startswith("srun --nodes=4 --ntasks=4 --ntasks-per-node=1 --cpus-per-task=8 "
                           "--kill-on-bad-exit=1 ")
    assert (f"{PY} -m torch.distributed.run --nnodes 4 --nproc-per-node 8 --rdzv-backend "
            'c10d --rdzv-endpoint "$MASTER_ADDR:29500" --rdzv-id "$SLURM_JOB_ID" '
            "-m commbench.allreduce --steps 50") in step
    assert "#SBATCH --nodes=4" in text and "--mpi=" not in step
    with pytest.raises(ValueError, match="--launcher torchrun: torchrun starts Python"):
        batch_script(["prog"], nodes=1, tasks_per_node=1, launcher="torchrun")


@pytest.mark.mpi
@pytest.mark.parametrize("launcher", ["srun", "mpirun", "torchrun"])
def test_sbatch_runs_the_study(tmp_path, launcher):
    why = slurm_local.available()
    if why:
        pytest.skip(why)
    out = tmp_path / "r.jsonl"
    script = tmp_path / "job.sbatch"
    script.write_text(batch_script(
        [PY, "-m", "commbench.allreduce", "--model", "resnet18", "--steps", "2", "--warmup", "1",
         "--compute-ms", "10", "--output", str(out)],
        nodes=1, tasks_per_node=2, launcher=launcher, log=str(tmp_path / "job-%j.out"),
        workdir=str(ROOT), time_limit="00:05:00"))
    with slurm_local.local_slurm(tmp_path / "slurm") as env:
        res = subprocess.run(["sbatch", "--wait", str(script)], env={**__import__("os").environ,
                             **env}, capture_output=True, text=True, timeout=300)
    logs = "".join(p.read_text() for p in tmp_path.glob("job-*.out"))
    assert res.returncode == 0, res.stdout + res.stderr + logs
    assert "commbench job" in logs
    recs = read_jsonl(out)
    summaries = [r for r in recs if r["kind"] == "summary"]
    assert len(summaries) == 2 and all(s["wrong"] == 0 for s in summaries)
    backend = "torch-gloo" if launcher == "torchrun" else "mpi"
    assert all(s["world_size"] == 2 and s["backend"] == backend for s in summaries)
