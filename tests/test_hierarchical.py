"""Hierarchical all-reduce: equal to native on even, uneven and single nodes, both backends."""

from __future__ import annotations

import os

import pytest

from commbench.comm.base import FAKE_NODES_ENV
from commbench.comm.hierarchical import owned_shards
from tests.conftest import PY, ROOT, launch, read_jsonl, run_check

SCRIPT = "hier_vs_native.py"


@pytest.mark.parametrize("n_local,L", [(1, 1), (1, 3), (3, 3), (2, 3), (2, 5), (4, 4)])
def test_every_shard_has_exactly_one_owner(n_local, L):
    owned = [j for i in range(n_local) for j in owned_shards(i, n_local, L)]
    assert owned == list(range(L))


@pytest.mark.mpi
@pytest.mark.parametrize("np_,layout", [
    (1, None), (2, "a,b"), (3, "a,a,b"), (4, "a,a,a,b"), (4, "a,b,a,b"), (5, "a,a,b,b,b"),
    (6, "a,a,b,b,c,c"), (4, None),
])
def test_equals_native_mpi(np_, layout):
    env = {FAKE_NODES_ENV: layout} if layout else {}
    run_check("mpirun", np_, SCRIPT, "mpi", f"OK hierarchical == native on {np_} ranks", env)


@pytest.mark.horovod
@pytest.mark.parametrize("launcher,np_,layout", [
    ("horovodrun", 4, "a,a,a,b"), ("horovodrun", 3, "a,a,b"),
    ("horovodrun-gloo", 4, "a,a,b,b"),
])
def test_equals_native_horovod_process_sets(launcher, np_, layout):
    run_check(launcher, np_, SCRIPT, "horovod", f"OK hierarchical == native on {np_} ranks",
              {FAKE_NODES_ENV: layout})


@pytest.mark.mpi
def test_strategy_runs_both_variants_in_the_study(tmp_path):
    out = tmp_path / "r.jsonl"
    res = launch("mpirun", 4, [PY, "-m", "commbench.allreduce", "--strategy",
                               "flat,hierarchical", "--algo", "native,hier,hier-leader",
                               "--model", "resnet18", "--steps", "2", "--warmup", "1",
                               "--compute-ms", "10", "--output", str(out)],
                 env={FAKE_NODES_ENV: "a,a,a,b"})
    assert res.returncode == 0, res.stdout + res.stderr
    runs = {(s["strategy"], s["algo"]): s for s in read_jsonl(out) if s["kind"] == "summary"}
    # flat takes every algo it was given; hierarchical only its own variants
    assert set(runs) == {("flat", "native"), ("flat", "hier"), ("flat", "hier-leader"),
                         ("hierarchical", "hier"), ("hierarchical", "hier-leader")}
    assert all(s["wrong"] == 0 and s["nodes"] == 2 and s["local_sizes"] == [3, 1]
               for s in runs.values())


@pytest.mark.mpi
@pytest.mark.skipif(os.geteuid() != 0, reason="emulated cluster needs root")
@pytest.mark.parametrize("slots,np_", [(2, 4), (3, 4)])  # 2 + 2 and uneven 3 + 1
def test_on_emulated_nodes(tmp_path, slots, np_):
    from launch.cluster import cluster, launch_argv
    from launch.execute import run

    out = tmp_path / "r.jsonl"
    prog = [PY, "-m", "commbench.allreduce", "--strategy", "hierarchical", "--algo",
            "hier,hier-leader", "--model", "resnet18", "--steps", "2", "--warmup", "1",
            "--compute-ms", "10", "--output", str(out)]
    with cluster(2, slots, rate="1gbit", name="cbh") as spec:
        res = run(launch_argv(spec, "mpirun", np_, prog), timeout=240, cwd=str(ROOT))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summaries = [s for s in read_jsonl(out) if s["kind"] == "summary"]
    assert len(summaries) == 2 and all(s["wrong"] == 0 for s in summaries)
    assert all(s["nodes"] == 2 and sum(s["local_sizes"]) == np_ for s in summaries)
