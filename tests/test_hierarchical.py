"""Hierarchical all-reduce: equal to native on even, uneven and single nodes, both backends."""

from __future__ import annotations

import itertools
import os
import threading

import pytest
import torch

from commbench.comm.base import DONE, Communicator, Group, topology_from_hostnames
from commbench.comm.hierarchical import (
    HIER_PHASES,
    _Interleaved,
    _Pipeline,
    _run_pipeline,
    _Steps,
    hierarchical_allreduce,
    leader_allreduce,
    owned_shards,
    pipeline_segments,
    plan_for,
    plan_groups,
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


# -- on a device (NCCL): one thread, one order of communicators on every rank ----------

class _RecGroup(Group):
    """A group that moves nothing and logs every call: (thread, members, operation)."""

    supports_p2p = True  # as if NCCL offered messages: the pipeline would then run on host
    nonblocking_collectives = True

    def __init__(self, members: tuple[int, ...], rank: int, log: list) -> None:
        self.members, self.rank, self.size, self.log = members, members.index(rank), \
            len(members), log
        self.name = "recording"

    def _call(self, op: str) -> None:
        self.log.append((threading.get_ident(), self.members, op))

    def allreduce(self, tensor):
        self._call("allreduce")

    def reduce_scatter_v(self, tensor, counts):
        self._call("reduce_scatter")
        start = sum(counts[:self.rank])
        return tensor.view(-1)[start:start + counts[self.rank]].clone()

    def allgather_v(self, part, counts, out):
        self._call("allgather")

    def reduce(self, tensor, root=0):
        self._call("reduce")

    def bcast(self, tensor, root=0):
        self._call("bcast")

    def isend(self, tensor, dest, tag=0):
        self._call("isend")
        return DONE

    def irecv(self, tensor, source, tag=0):
        self._call("irecv")
        return DONE


class _RecCommBase(Communicator):
    """One rank of a job laid out by ``hosts``, whose groups are ``_RecGroup``s; ``made``
    lists the groups it was asked to make, in order."""

    progresses_itself = True  # as the torch backend: the host pipeline would use 2 threads
    name = "recording"

    def __init__(self, rank: int, hosts: list[str], on_device: bool) -> None:
        self.topo = topology_from_hostnames(rank, hosts)
        self._on_device = on_device
        self.log: list = []
        self.made: list[tuple[int, ...]] = []

    @property
    def device_collectives(self) -> bool:
        return self._on_device

    def subgroup(self, ranks):
        self.made.append(tuple(ranks))
        return _RecGroup(tuple(ranks), self.rank, self.log) if self.rank in ranks else None

    def allgather_object(self, obj):
        return [obj] * self.size  # every rank's groups are alike


def _not_used(self, *args, **kwargs):
    raise AssertionError("the two-level all-reduce called the whole communicator")


# the rest of the interface: never called by the two-level algorithms
_RecComm = type("_RecComm", (_RecCommBase,), dict.fromkeys(
    _RecCommBase.__abstractmethods__, _not_used))


def _replay(hosts: list[str], on_device: bool, algo) -> list[_RecCommBase]:
    """Every rank's calls of one two-level all-reduce of 1000 float32 in 64-byte segments
    (so that a host plan pipelines), each rank replayed alone (nothing moves)."""
    comms = [_RecComm(r, hosts, on_device) for r in range(len(hosts))]
    for c in comms:
        algo(c, torch.zeros(1000), segment_bytes=64)
    return comms


def _switches(log: list, groups: set) -> list:
    """The groups of ``groups`` in the order ``log`` uses them, each run of calls on one
    group counted once (the order NCCL's communicators are taken in)."""
    out: list = []
    for _, members, _ in log:
        if members in groups and (not out or out[-1] != members):
            out.append(members)
    return out


LAYOUTS = [list("aaab"), list("aaabbc"), list("aabb"), list("aaaabbbb"), list("abab")]


@pytest.mark.parametrize("algo", [hierarchical_allreduce, leader_allreduce],
                         ids=["hier", "hier-leader"])
@pytest.mark.parametrize("hosts", LAYOUTS, ids=["".join(h) for h in LAYOUTS])
def test_on_a_device_one_thread_and_one_order_of_communicators(hosts, algo):
    comms = _replay(hosts, True, algo)
    me = threading.get_ident()
    assert all(t == me for c in comms for t, _, _ in c.log)  # the calling thread only
    assert len({tuple(c.made) for c in comms}) == 1  # groups made in one order everywhere
    for c in comms:  # first, one all-reduce through each of its groups (NCCL makes them)
        groups = [g.members for g in plan_groups(plan_for(c))]
        assert c.log[:len(groups)] == [(me, g, "allreduce") for g in groups]
    for a, b in itertools.combinations(comms, 2):  # shared groups: taken in one order
        shared = {m for _, m, _ in a.log} & {m for _, m, _ in b.log}
        assert _switches(a.log, shared) == _switches(b.log, shared), (a.rank, b.rank)


def test_on_the_host_the_same_calls_pipeline_on_two_threads():
    """The contrast: the same fake groups off a device pipeline on two threads (the reason
    a device plan does not), and do no first-use round."""
    comms = _replay(list("aaab"), False, hierarchical_allreduce)
    assert any(len({t for t, _, _ in c.log}) == 2 for c in comms)
    assert pipeline_segments(comms[0], 1000, 4, 64) > 1
    assert not plan_for(comms[0]).first_used


def test_on_a_device_the_pipeline_is_refused():
    comm = _RecComm(0, list("aaab"), True)
    p = plan_for(comm)
    assert pipeline_segments(comm, 1000, 4, 64) == 1
    with pytest.raises(RuntimeError, match="unpipelined"):
        _run_pipeline(p, 2, _Steps(lambda k: (None, k), lambda k, x: iter(()),
                                   lambda k, x: None), lambda h: h.wait(), 0.0,
                      HIER_PHASES, None)
