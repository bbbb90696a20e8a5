"""Hierarchical all-reduce: equal to native on even, uneven and single nodes, both backends."""

from __future__ import annotations

import os

import pytest

from commbench.comm.hierarchical import (
    _Interleaved,
    _Pipeline,
    _Steps,
    owned_shards,
    segment_bounds,
)
from commbench.metrics import union_length
from tests.conftest import PY, ROOT, of_kind, read_jsonl, run_check, run_tool

SCRIPT = "hier_vs_native.py"


@pytest.mark.parametrize("n_local,L", [(1, 1), (1, 3), (3, 3), (2, 3), (2, 5), (4, 4)])
def test_every_shard_has_exactly_one_owner(n_local, L):
    owned = [j for i in range(n_local) for j in owned_shards(i, n_local, L)]
    assert owned == list(range(L))


@pytest.mark.parametrize("numel,size,seg,n", [
    (1, 4, 8 << 20, 1), (2 << 20, 4, 8 << 20, 1), (16 << 20, 4, 8 << 20, 8),
    (16 << 20, 2, 8 << 20, 4), (1_000_003, 4, 262_147, 15), (3, 4, 1, 3),
])
def test_segments_cover_the_tensor(numel, size, seg, n):
    bounds = segment_bounds(numel, size, seg)
    assert len(bounds) == n
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))


def test_pipeline_overlaps_and_keeps_the_node_order():
    """First phases run in order on the caller, each segment's inter-node work after its
    first phase and before its last, last phases in order; spans cover the whole run."""
    import time

    events: list[tuple[str, int]] = []

    def step(kind: str, seconds: float):
        def f(k: int, *_):
            events.append((kind, k))
            time.sleep(seconds)
            return k
        return f

    pipe = _Pipeline(4, step("first", 0.01), step("inter", 0.02), step("last", 0.005))
    t0 = time.perf_counter()
    pipe.run(t0)
    took = time.perf_counter() - t0
    assert [k for kind, k in events if kind == "first"] == [0, 1, 2, 3]
    assert [k for kind, k in events if kind == "last"] == [0, 1, 2, 3]
    for k in range(4):
        assert (events.index(("first", k)) < events.index(("inter", k))
                < events.index(("last", k)))
    assert events.index(("inter", 0)) < events.index(("first", 3))  # overlapped
    assert took < 4 * 0.035  # less than the phases one after another
    assert union_length(pipe.spans) >= 0.95 * took


class _Timed:
    """A handle that completes ``seconds`` after it was made (``test`` only)."""

    def __init__(self, seconds: float) -> None:
        import time
        self.at = time.perf_counter() + seconds

    def test(self) -> bool:
        import time
        return time.perf_counter() >= self.at


def test_interleaved_keeps_the_node_order_on_one_thread_and_overlaps():
    """The one-thread pipeline starts the node's collectives in _Pipeline's order (every
    first phase, then every last phase once its segment is across), one at a time; runs
    each segment's ring messages between its first and last phases, oldest segment first;
    overlaps the phases; and its spans cover the call."""
    import threading
    import time

    events: list[tuple[str, int]] = []
    threads = set()
    in_flight = []

    def first(k: int):
        threads.add(threading.get_ident())
        events.append(("first", k))
        in_flight.append(_Timed(0.01))
        return in_flight[-1], k

    def inter(k: int, x: int):
        assert x == k
        for _ in range(2):
            threads.add(threading.get_ident())
            events.append(("inter", k))
            yield _Timed(0.01)

    def last(k: int, x: int):
        assert all(h.test() for h in in_flight)  # one node collective at a time
        events.append(("last", k))
        in_flight.append(_Timed(0.005))
        return in_flight[-1]

    pipe = _Interleaved(4, _Steps(first, inter, last))
    t0 = time.perf_counter()
    pipe.run(t0)
    took = time.perf_counter() - t0
    assert threads == {threading.get_ident()}
    kinds = [kind for kind, _ in events if kind != "inter"]
    assert kinds == ["first"] * 4 + ["last"] * 4
    assert [k for kind, k in events if kind != "inter"] == [0, 1, 2, 3] * 2
    assert [k for kind, k in events if kind == "inter"] == [0, 0, 1, 1, 2, 2, 3, 3]
    for k in range(4):
        assert (events.index(("first", k)) < events.index(("inter", k))
                < events.index(("last", k)))
    assert took < 0.04 + 0.08 + 0.02  # less than the phases one after another
    assert union_length(pipe.spans) >= 0.95 * took


def test_interleaved_with_nothing_to_wait_for():
    """One-rank nodes (no node collectives: handles None) and ranks with nothing across
    nodes (an empty ring): every segment still runs, in order."""
    done = []

    def inter(k, x):
        return iter(())

    pipe = _Interleaved(3, _Steps(lambda k: (None, k), inter, lambda k, x: done.append(k)))
    pipe.run(0.0)
    assert done == [0, 1, 2]


def test_pipeline_reraises_the_inter_node_error():
    def boom(k: int, x: int) -> None:
        raise RuntimeError(f"segment {k} failed")

    pipe = _Pipeline(3, lambda k: k, boom, lambda k, x: None)
    with pytest.raises(RuntimeError, match="segment 0 failed"):
        pipe.run(0.0)


@pytest.mark.mpi
@pytest.mark.parametrize("np_,layout", [
    (1, None), (2, "a,b"), (3, "a,a,b"), (4, "a,a,a,b"), (4, "a,b,a,b"), (6, "a,a,b,b,c,c"),
    (4, None),
])
def test_equals_native_mpi(np_, layout):
    run_check("mpirun", np_, SCRIPT, "mpi", f"OK hierarchical == native on {np_} ranks",
              nodes=layout)


@pytest.mark.horovod
# on Gloo float32 only: each of Horovod's collectives there costs 0.3-1 s on 4 ranks
# sharing 2 cores (43 s for every dtype), and the dtypes' own paths are the mpi cases'
@pytest.mark.parametrize("launcher,np_,layout,dtypes", [
    ("horovodrun", 3, "a,a,b", ()), ("horovodrun-gloo", 4, "a,a,b,b", ("float32",)),
])
def test_equals_native_horovod_process_sets(launcher, np_, layout, dtypes):
    run_check(launcher, np_, SCRIPT, "horovod", f"OK hierarchical == native on {np_} ranks",
              nodes=layout, args=dtypes)


@pytest.mark.torchrun
# torch's groups take their ranks in job order: a,b,a gives the node [0, 2] and [1]
@pytest.mark.parametrize("np_,layout", [(1, None), (3, "a,b,a")])
def test_equals_native_torch_groups(np_, layout):
    run_check("torchrun", np_, SCRIPT, "torch", f"OK hierarchical == native on {np_} ranks",
              nodes=layout)


@pytest.mark.mpi
def test_strategy_runs_both_variants_in_the_study(tmp_path):
    recs = run_tool("mpirun", 4, "commbench.allreduce", [
        "--strategy", "flat,hierarchical", "--algo", "native,hier,hier-leader",
        "--model", "smallcnn", "--steps", "2", "--warmup", "1", "--compute-ms", "10"],
        tmp_path / "r.jsonl", nodes="a,a,a,b").records
    runs = {(s["strategy"], s["algo"]): s for s in of_kind(recs, "summary")}
    # flat takes every algo it was given; hierarchical only its own variants
    assert set(runs) == {("flat", "native"), ("flat", "hier"), ("flat", "hier-leader"),
                         ("hierarchical", "hier"), ("hierarchical", "hier-leader")}
    assert all(s["wrong"] == 0 and s["nodes"] == 2 and s["local_sizes"] == [3, 1]
               for s in runs.values())


@pytest.mark.mpi
@pytest.mark.skipif(os.geteuid() != 0, reason="emulated cluster needs root")
@pytest.mark.parametrize("slots,np_", [(3, 4)])  # uneven 3 + 1 (even nodes: the fake ones)
def test_on_emulated_nodes(tmp_path, slots, np_):
    from launch.cluster import cluster, launch_argv
    from launch.execute import run

    out = tmp_path / "r.jsonl"
    prog = [PY, "-m", "commbench.allreduce", "--strategy", "hierarchical", "--algo",
            "hier,hier-leader", "--model", "smallcnn", "--steps", "2", "--warmup", "1",
            "--compute-ms", "10", "--output", str(out)]
    with cluster(2, slots, rate="1gbit", name="cbh") as spec:
        res = run(launch_argv(spec, "mpirun", np_, prog), timeout=240, cwd=str(ROOT))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summaries = [s for s in read_jsonl(out) if s["kind"] == "summary"]
    assert len(summaries) == 2 and all(s["wrong"] == 0 for s in summaries)
    assert all(s["nodes"] == 2 and sum(s["local_sizes"]) == np_ for s in summaries)
