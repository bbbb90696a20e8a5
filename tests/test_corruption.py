"""A wrong all-reduce is caught whatever runs it: rank 1's contribution off by one.

Real 2-rank jobs of ``python -m commbench.allreduce`` through ``tests/fakes.py
--corrupt-rank 1``, which makes rank 1's contribution to every all-reduce it takes part
in off by one in its first element, at the level the all-reduce really runs: the
communicator (the transfer engine's thread for ``bucketed`` and ``async``; MPI's
``Iallreduce`` for ``bucketed --progress poll``; Horovod's queue), the engine's ring, DDP's
Gloo group (``torch.distributed.all_reduce`` from its comm hook), Horovod's optimizer
(``allreduce_async_`` per gradient). Validation (``commbench.validate``) then finds one
wrong element per all-reduced buffer on each rank, and the job exits 1. Flat on the
algorithm registry: ``tests/test_jobs.py``.
"""

from __future__ import annotations

import pytest

from tests.conftest import of_kind, run_tool

RANKS = 2
SMALL = ["--model", "resnet18", "--compute-ms", "10", "--steps", "2", "--warmup", "1",
         "--algo", "native"]
TIMEOUT = 180  # seconds; one of these jobs takes ~10-20 s on the 2-core machine


def _buffers(summary: dict) -> int:
    """How many buffers the strategy's validation pass all-reduces (one wrong element
    each, on every rank, when one rank's contribution is off)."""
    strategy = summary["strategy"]
    if strategy == "bucketed":
        return summary["knobs"]["buckets"]  # one engine transfer per bucket
    if strategy == "horovod":
        return summary["grad_tensors"]  # synchronize() all-reduces gradient by gradient
    return 1  # async: one fused buffer through the engine; ddp: one flat buffer on Gloo


@pytest.mark.parametrize("launcher,strategy", [
    pytest.param("mpirun", ["--strategy", "bucketed", "--progress", "thread"],
                 id="bucketed-engine-thread", marks=pytest.mark.mpi),
    pytest.param("mpirun", ["--strategy", "async", "--staleness", "1"],
                 id="async-staleness-1", marks=pytest.mark.mpi),
    pytest.param("mpirun", ["--strategy", "ddp"], id="ddp", marks=pytest.mark.mpi),
    pytest.param("horovodrun", ["--strategy", "horovod"], id="horovod",
                 marks=pytest.mark.horovod),
    # the fake's other paths: MPI's Iallreduce (bucketed --progress poll), the engine's
    # ring (async --transfer ring), Horovod's own queue (the engine hands bucketed's
    # buckets to Horovod's iallreduce)
    pytest.param("mpirun", ["--strategy", "bucketed,async", "--progress", "poll",
                            "--transfer", "ring", "--staleness", "1"],
                 id="bucketed-poll-async-ring", marks=pytest.mark.mpi),
    pytest.param("horovodrun", ["--strategy", "bucketed"], id="bucketed-horovod-handoff",
                 marks=pytest.mark.horovod),
])
def test_a_wrong_contribution_fails_validation(tmp_path, launcher, strategy):
    run = run_tool(launcher, RANKS, "commbench.allreduce", [*SMALL, *strategy],
                   tmp_path / "r.jsonl", expect_rc=1, timeout=TIMEOUT, corrupt_rank=1)
    assert "wrong elements in validation" in run.stderr, run.output
    runs = of_kind(run.records, "summary")
    assert [s["strategy"] for s in runs] == strategy[1].split(",")
    for summary in runs:
        print(f"[corruption] {launcher} {summary['strategy']}: {summary['wrong']} wrong of "
              f"{summary['elements_checked']}")
        assert summary["wrong"] == RANKS * _buffers(summary), summary
