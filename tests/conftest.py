"""Shared helpers for tests that launch real MPI / Horovod jobs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from launch import commands
from launch.execute import Completed, run
from tests.fakes import command as fake_command
from tests.tiers import (  # noqa: F401 - the suite's tiers' hooks (make check: tests/tiers.py)
    pytest_collection_modifyitems,
    pytest_configure,
)

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
JOB_TIMEOUT = 240  # seconds; a job that takes longer has hung

# Open MPI 4.1.4's shared-memory transport (vader) moves a large message by a single copy
# (CMA, process_vm_readv) from the peer's memory. On ranks oversubscribing 2 cores it now
# and then read from memory the peer no longer held ("Read -1, expected 4194304, errno =
# 14", EFAULT, 4 MiB: a piece of an earlier blocking collective's 8 MiB exchange) and the
# heap of both ranks of a node was corrupt at their next allocation (6 ranks as 3 fake
# nodes of 2, hier_vs_native: 3 aborts in about 64 runs under load, two printing that
# read; with the single copy off, none in 60; docs/microbench.md). Every job a test
# starts (mpirun, horovodrun's mpirun) copies through the shared segment instead; the
# variable reaches them through mpirun's environment.
os.environ.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")


def ctrl_c_reaches_it() -> None:
    """``preexec_fn`` of a process a test will Ctrl-C: SIGINT at its default, as a
    terminal's shell leaves it. A suite started in the background (``cmd &``) inherits
    SIGINT ignored, Python then keeps it ignored, and the Ctrl-C never arrives."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def need(binary: str) -> None:
    if shutil.which(binary) is None and not Path(binary).exists():
        pytest.fail(f"{binary} not found: run scripts/setup.sh first")


def launcher_argv(launcher: str, np: int, program: list[str]) -> list[str]:
    """The command line that starts ``program`` with ``np`` ranks under ``launcher`` (one of
    ``commands.LAUNCHERS``), failing the test if the launcher is not installed."""
    if launcher != "torchrun":  # torchrun is torch's own module
        need("mpirun" if launcher == "mpirun" else commands.horovodrun_path())
    return commands.launcher_argv(launcher, np, program)


def launch(launcher: str, np: int, program: list[str], timeout: float = JOB_TIMEOUT,
           env: dict[str, str] | None = None, **fakes: Any) -> Completed:
    """Run ``program`` under ``launcher`` (one of ``commands.LAUNCHERS``) with ``np`` ranks;
    with ``fakes`` (``tests.fakes.command``'s, e.g. ``nodes="a,a,b"``), through
    ``tests/fakes.py`` with those fakes installed."""
    fakes = {k: v for k, v in fakes.items() if v is not None}
    if fakes:
        program = fake_command(program, **fakes)
    argv = launcher_argv(launcher, np, program)
    res = run(argv, timeout=timeout, env={"OMP_NUM_THREADS": "1", **(env or {})}, cwd=str(ROOT))
    assert not res.timed_out, f"{argv} timed out after {timeout}s\n{res.stdout}\n{res.stderr}"
    return res


def run_check(launcher: str, np: int, script: str, backend: str, ok_line: str,
              env: dict[str, str] | None = None, nodes: str | None = None,
              args: tuple[str, ...] = (), timeout: float = JOB_TIMEOUT) -> None:
    """Run the check script ``tests/mpi/<script> <backend> <args>`` and require its OK line
    (see verdict.py); ``nodes``: every rank's node name (``tests.fakes``), None for the real
    host's; ``timeout``: seconds before the job counts as hung."""
    res = launch(launcher, np, [PY, str(ROOT / "tests" / "mpi" / script), backend, *args],
                 timeout=timeout, env=env, nodes=nodes)
    assert res.returncode == 0, res.stdout + res.stderr
    assert ok_line in res.stdout, res.stdout


@dataclass(frozen=True)
class ToolRun:
    """One run of a tool (``run_tool``): its exit status, what it printed, and the records
    it wrote (``read_jsonl``: without the ``job_end`` record; empty where it wrote no file)."""

    rc: int
    stdout: str
    stderr: str
    records: list[dict]

    @property
    def output(self) -> str:
        """stdout then stderr: where to look for a message, what to show on failure."""
        return self.stdout + self.stderr


def run_tool(launcher: str, np: int, module: str, args: list[str], out: Path, *,
             expect_rc: int | None = 0, timeout: float = JOB_TIMEOUT,
             env: dict[str, str] | None = None, **fakes: Any) -> ToolRun:
    """Run the tool ``python -m <module> <args> --output <out>`` with ``np`` ranks under
    ``launcher`` (with ``fakes``, as ``launch``); require exit status ``expect_rc`` (None:
    any); return its ``ToolRun``."""
    res = launch(launcher, np, [PY, "-m", module, *args, "--output", str(out)], timeout=timeout,
                 env=env, **fakes)
    if expect_rc is not None:
        assert res.returncode == expect_rc, \
            f"exit status {res.returncode}, expected {expect_rc}\n{res.stdout}{res.stderr}"
    return ToolRun(res.returncode, res.stdout, res.stderr,
                   read_jsonl(out) if out.exists() else [])


def of_kind(records: list[dict], kind: str) -> list[dict]:
    """The records of one ``kind`` (``step``, ``summary``, ``update``, ...), in order."""
    return [r for r in records if r["kind"] == kind]


def summaries(records: list[dict]) -> dict[str, dict]:
    """The ``summary`` records of one job, by strategy."""
    return {r["strategy"]: r for r in of_kind(records, "summary")}


def same_parameters_as_flat(summ: dict, *names: str) -> None:
    """Each named run's ranks hold one set of parameters, the job's flat run's to float
    tolerance, and its validation checked elements and found none wrong."""
    want = summ["flat"]["param_checksum_ranks"][0]
    for name in names:
        s = summ[name]
        assert s["wrong"] == 0 and s["elements_checked"] > 0, name
        assert len(set(s["param_checksum_ranks"])) == 1, (name, s["param_checksum_ranks"])
        assert s["param_checksum_ranks"][0] == pytest.approx(want, rel=1e-6), name


def read_jsonl(path: Path, job_end: bool = False) -> list[dict]:
    """The records of a results file; the ``job_end`` record that closes each job (no run,
    no run fields) only with ``job_end``."""
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in recs if job_end or r.get("kind") != "job_end"]


@pytest.fixture
def one_torch_thread():
    """One torch thread in this process, as a rank gets (idle OpenMP threads spin on a busy
    machine and slow replayed backward's own work)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
