"""The toolkit's own benchmarks: their job lists and rank programs (not their figures)."""

from __future__ import annotations

import json

import pytest

from benchmarks import horovod_presence
from tests.conftest import PY, launch


def test_horovod_presence_runs_each_mode_on_each_layout(capsys):
    assert horovod_presence.main(["--dry-run", "--layouts", "2x1,2x4", "--cycle-ms", "1,50"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 * 3 and all("launch.cluster run" in ln for ln in lines)
    modes = [ln.split("--rank-job ")[1].split()[0:3:2] for ln in lines]
    assert modes == [["none", "0"], ["init", "1"], ["init", "50"]] * 2


@pytest.mark.horovod
def test_horovod_presence_rank_job_with_horovod_initialised(tmp_path):
    """The rank program under mpirun on this host: Horovod initialised, each algorithm's
    sum checked, one line from rank 0."""
    out = tmp_path / "p.jsonl"
    res = launch("mpirun", 2, [PY, "-m", "benchmarks.horovod_presence", "--rank-job", "init",
                               "--cycle", "5", "--size", "1M", "--iters", "1", "--warmup", "0",
                               "--output", str(out)])
    assert res.returncode == 0, res.stdout + res.stderr
    rec = json.loads(out.read_text())
    assert rec["mode"] == "init" and rec["cycle_ms"] == 5 and rec["world_size"] == 2
    assert set(rec["median_s"]) == set(horovod_presence.ALGOS)
    assert all(t > 0 for t in rec["median_s"].values())
