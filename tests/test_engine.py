"""The background transfer engine: order, stamps, errors and close (with a stand-in
communicator, then under mpirun); async and bucketed on it equal flat native on every
transfer path, dtype and launcher; --transfer ring is refused where there is no p2p."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from commbench.allreduce import parse_config
from commbench.comm.base import topology_from_hostnames
from commbench.comm.engine import (
    TransferEngine,
    check_transfer_path,
    engine_paths,
    resolve_path,
)
from commbench.flags import ConfigError
from tests.conftest import run_check, run_tool, summaries

# --- without processes: a one-rank stand-in communicator ------------------------------


class _SlowComm:
    """One rank; each all-reduce takes ``delay_s`` and records its tensor's first value;
    a tensor starting with -1 fails."""

    name = "stand-in"
    supports_p2p = False
    progresses_itself = False  # the engine's thread runs each transfer itself
    size, rank = 1, 0

    def __init__(self, delay_s: float = 0.02) -> None:
        self.delay_s = delay_s
        self.order: list[float] = []
        self.dups: list[_SlowComm] = []
        self.closed = False

    def dup(self) -> _SlowComm:
        twin = type(self)(self.delay_s)  # a subclass's twin is of its class
        self.dups.append(twin)
        return twin

    def allreduce(self, tensor: torch.Tensor) -> None:
        if float(tensor[0]) == -1:
            raise ValueError("refused by the stand-in")
        time.sleep(self.delay_s)
        self.order.append(float(tensor[0]))

    def close(self) -> None:
        self.closed = True


def test_transfers_run_in_issue_order_on_the_engines_own_communicator():
    comm = _SlowComm()
    engine = TransferEngine(comm, "thread")
    ts = [engine.submit(torch.full((3,), float(i))) for i in range(4)]
    ts[-1].wait()
    assert all(t.test() for t in ts)
    assert comm.dups[0].order == [0.0, 1.0, 2.0, 3.0] and comm.order == []
    for a, b in zip(ts, ts[1:]):
        assert a.queued <= a.start <= a.end <= b.start <= b.end
    assert ts[3].start - ts[3].queued >= 2 * comm.delay_s  # queued behind two others
    engine.close()
    assert comm.dups[0].closed


def test_after_runs_on_the_engines_thread_before_the_transfer_counts_as_done():
    seen: list[tuple[str, float]] = []
    engine = TransferEngine(_SlowComm(), "thread")
    t = engine.submit(torch.tensor([2.0]), after=lambda: seen.append(
        (threading.current_thread().name, float(time.perf_counter()))))
    t.wait()
    assert len(seen) == 1 and seen[0][0] == engine.thread.name
    assert t.start <= t.end <= seen[0][1]  # stamped before the callback: not transfer time
    engine.close()


class _Handle:
    def __init__(self, done: threading.Event) -> None:
        self.done = done

    def wait(self) -> None:
        self.done.wait()


class _SelfProgressingComm(_SlowComm):
    """A library that runs each op on a thread of its own (as Horovod does)."""

    progresses_itself = True

    def iallreduce(self, tensor: torch.Tensor) -> _Handle:
        done = threading.Event()

        def run() -> None:
            time.sleep(self.delay_s)
            self.order.append(float(tensor[0]))
            done.set()
        threading.Thread(target=run).start()
        return _Handle(done)


def test_a_library_that_progresses_itself_gets_every_transfer_at_submit():
    comm = _SelfProgressingComm(delay_s=0.05)
    engine = TransferEngine(comm, "thread")
    t0 = time.perf_counter()
    ts = [engine.submit(torch.full((2,), float(i))) for i in range(3)]
    for t in ts:
        t.wait()
    # handed over at once: the three ran side by side, not one after another
    assert time.perf_counter() - t0 < 3 * comm.delay_s
    assert sorted(comm.dups[0].order) == [0.0, 1.0, 2.0]
    for a, b in zip(ts, ts[1:]):  # start: the later of queued and the previous end
        assert b.start == max(b.queued, a.end) and a.end <= b.end
    engine.close()


def test_an_error_is_raised_by_wait_and_test_and_the_engine_goes_on():
    engine = TransferEngine(_SlowComm(), "thread")
    bad, good = engine.submit(torch.tensor([-1.0])), engine.submit(torch.tensor([5.0]))
    with pytest.raises(ValueError, match="refused by the stand-in"):
        bad.wait()
    with pytest.raises(ValueError, match="refused"):
        bad.test()
    good.wait()
    assert good.error is None and bad.end is not None
    engine.close()


def test_close_leaves_no_thread_and_refuses_later_transfers():
    with TransferEngine(_SlowComm(), "thread") as engine:
        t = engine.submit(torch.ones(2))
        thread = engine.thread
    assert t.test()  # close ran what was queued
    assert not thread.is_alive() and thread not in threading.enumerate()
    engine.close()  # idempotent
    with pytest.raises(RuntimeError, match="after close"):
        engine.submit(torch.ones(1))


def test_ring_needs_point_to_point_and_unknown_paths_are_refused():
    with pytest.raises(ValueError, match="--transfer ring needs point-to-point"):
        check_transfer_path(_SlowComm(), "ring")
    with pytest.raises(ValueError, match="unknown transfer path"):
        TransferEngine(_SlowComm(), "carrier-pigeon")
    with pytest.raises(ValueError, match="unknown transfer path"):
        TransferEngine(_SlowComm(), "auto")  # the strategy resolves auto first
    check_transfer_path(_SlowComm(), "auto")  # always runs: it falls back to thread


class _P2PComm(_SlowComm):
    """The stand-in with point-to-point messages (its ring is never run here)."""

    supports_p2p = True


def test_a_transfer_may_run_on_another_path_than_its_engines():
    engine = TransferEngine(_P2PComm(), "ring")
    ts = [engine.submit(torch.full((2,), float(i)), path="thread") for i in range(3)]
    ts[-1].wait()
    assert engine.comm.order == [0.0, 1.0, 2.0]  # the backend's all-reduce, in issue order
    engine.close()
    with TransferEngine(_SlowComm(), "thread") as engine, \
            pytest.raises(ValueError, match="--transfer ring needs point-to-point"):
        engine.submit(torch.ones(2), path="ring")
    with TransferEngine(_SelfProgressingComm(), "thread") as engine, \
            pytest.raises(ValueError, match="runs this engine's transfers itself"):
        engine.submit(torch.ones(2), path="ring")


def test_a_transfer_may_run_another_collective_in_order_on_the_engines_thread():
    """``run``: the owner's collective in place of the all-reduce (ZeRO's reduce-scatters),
    in issue order and stamped, on the engine's thread also where the library would take
    the all-reduces itself (Horovod's)."""
    seen: list[tuple[str, float]] = []

    def double(t: torch.Tensor) -> None:
        seen.append((threading.current_thread().name, float(t[0])))
        t.mul_(2)

    for comm in (_SlowComm(), _SelfProgressingComm()):
        seen.clear()
        with TransferEngine(comm, "thread") as engine:
            x = torch.full((2,), 3.0)
            ts = [engine.submit(torch.ones(1)), engine.submit(x, run=double),
                  engine.submit(torch.full((1,), 4.0))]
            for t in ts:
                t.wait()
            assert x.tolist() == [6.0, 6.0] and seen == [(engine.thread.name, 3.0)]
            assert sorted(engine.comm.order) == [1.0, 4.0]  # the others: all-reduces
            assert ts[1].start <= ts[1].end <= ts[2].end
            with pytest.raises(ValueError, match="a path or a run, not both"):
                engine.submit(x, run=double, path="thread")


def test_hier_runs_where_the_engines_thread_is_the_librarys_only_caller_and_differs():
    def comm(hosts: str, p2p=True, itself=False):
        c = _SlowComm()
        c.supports_p2p, c.progresses_itself = p2p, itself
        c.topo = topology_from_hostnames(0, hosts.split(","))
        return c

    assert engine_paths(comm("a,a,b,b")) == ["thread", "ring", "hier"]
    assert engine_paths(comm("a,a,b")) == ["thread", "ring", "hier"]  # uneven nodes too
    assert engine_paths(comm("a,b")) == ["thread", "ring"]  # one rank a node: the ring
    assert engine_paths(comm("a,a,a")) == ["thread", "ring"]  # one node: no link to spare
    assert engine_paths(comm("a,a,b,b", p2p=False)) == ["thread", "hier"]
    assert engine_paths(comm("a,a,b,b", itself=True)) == ["thread", "ring"]
    with pytest.raises(ValueError, match="--transfer hier: the stand-in backend runs"):
        check_transfer_path(comm("a,a,b,b", itself=True), "hier")


def test_auto_is_each_strategys_path_where_the_backend_has_it():
    class P2P(_SlowComm):
        supports_p2p = True

    assert resolve_path(P2P(), "auto", "ring") == "ring"
    assert resolve_path(_SlowComm(), "auto", "ring") == "thread"  # no point-to-point
    assert resolve_path(P2P(), "auto", "thread") == "thread"
    assert resolve_path(_SlowComm(), "thread", "ring") == "thread"  # given: kept


def test_transfer_flag_is_parsed_and_checked():
    assert parse_config(["--output", "/tmp/x.jsonl"]).sync.transfer == "auto"
    assert parse_config(["--transfer", "ring", "--output", "/tmp/x.jsonl"]).sync.transfer == "ring"
    with pytest.raises(ConfigError, match="--transfer"):
        parse_config(["--transfer", "nbc", "--output", "/tmp/x.jsonl"])


# --- under launchers -------------------------------------------------------------------

SMALL_SEGMENTS = {"COMMBENCH_RING_SEGMENT_BYTES": "512"}  # many ring segments per chunk


@pytest.mark.mpi
# hier runs where nodes differ and one has two ranks: a,a,b,b
@pytest.mark.parametrize("np_,layout,paths", [(2, None, "'thread', 'ring'"),
                                               (3, None, "'thread', 'ring'"),
                                               (4, "a,a,b,b", "'thread', 'ring', 'hier'")])
def test_engine_order_stamps_errors_and_close_mpi(np_, layout, paths):
    run_check("mpirun", np_, "engine_unit.py", "mpi",
              f"OK transfer engine on {np_} ranks, paths [{paths}]", SMALL_SEGMENTS,
              nodes=layout)


@pytest.mark.mpi
@pytest.mark.parametrize("np_,layout,paths", [
    (1, None, "'thread', 'ring'"), (2, None, "'thread', 'ring'"),
    (3, "a,a,b", "'thread', 'ring', 'hier'"), (4, "a,a,a,b", "'thread', 'ring', 'hier'")])
def test_engine_strategies_equal_flat_native_mpi(np_, layout, paths):
    run_check("mpirun", np_, "engine_vs_flat.py", "mpi",
              f"OK engine == flat native on {np_} ranks, paths [{paths}]",
              SMALL_SEGMENTS, nodes=layout)


@pytest.mark.torchrun
def test_engine_unit_torch():
    run_check("torchrun", 2, "engine_unit.py", "torch",
              "OK transfer engine on 2 ranks, paths ['thread', 'ring']", SMALL_SEGMENTS)


@pytest.mark.torchrun
def test_engine_strategies_equal_flat_native_torch():
    run_check("torchrun", 3, "engine_vs_flat.py", "torch",
              "OK engine == flat native on 3 ranks, paths ['thread', 'ring']",
              SMALL_SEGMENTS, nodes="a,a,b")


@pytest.mark.horovod
def test_engine_strategies_equal_flat_native_horovod_mpi_controller():
    run_check("horovodrun", 3, "engine_vs_flat.py", "horovod",
              "OK engine == flat native on 3 ranks, paths ['thread', 'ring']",
              SMALL_SEGMENTS, nodes="a,a,b")


@pytest.mark.horovod
def test_engine_thread_path_equals_flat_native_horovod_gloo():
    run_check("horovodrun-gloo", 2, "engine_vs_flat.py", "horovod",
              "OK engine == flat native on 2 ranks, paths ['thread']")


@pytest.mark.horovod
def test_ring_transfer_is_refused_under_gloo(tmp_path):
    out = tmp_path / "r.jsonl"
    run = run_tool("horovodrun-gloo", 2, "commbench.allreduce",
                   ["--strategy", "async", "--transfer", "ring"], out, expect_rc=None)
    assert run.rc != 0  # the workers exit 2; horovodrun itself says 1
    assert "--transfer ring needs point-to-point" in run.output
    assert "Exit code: 2" in run.output and not out.exists()


@pytest.mark.mpi
def test_job_records_the_transfer_path(tmp_path):
    summ = summaries(run_tool("mpirun", 2, "commbench.allreduce", [
        "--model", "smallcnn", "--strategy", "async,bucketed", "--transfer", "ring",
        "--staleness", "1", "--compute-ms", "20", "--steps", "2", "--warmup", "1"],
        tmp_path / "r.jsonl").records)
    for name in ("async", "bucketed"):
        s = summ[name]
        assert s["wrong"] == 0 and s["elements_checked"] > 0
        assert s["knobs"]["transfer_path"] == "ring" and s["config"]["transfer"] == "ring"
        # the ring moved the bytes: its transfers were timed (async's comm_s, the time a
        # step blocked on a transfer s steps old, is 0 when it ended during compute, as it
        # mostly does on 2 ranks: 3 of 4 runs here, before and after the ring's rewrite)
        assert s["sync_transfer_s"] > 0
    assert summ["bucketed"]["comm_s"] > 0


