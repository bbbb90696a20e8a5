"""benchmarks/gpu_check.py without a GPU: one line naming the cause, exit 2, nothing started."""

from __future__ import annotations

import subprocess

import pytest
import torch

from tests.conftest import PY, ROOT


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: run the check")
def test_without_cuda_exits_2_naming_the_cause(tmp_path):
    res = subprocess.run([PY, "-m", "benchmarks.gpu_check", "-o", str(tmp_path / "gpu")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "torch sees no CUDA device" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "gpu").exists()
