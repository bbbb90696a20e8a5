"""The torch.distributed backend (``commbench.comm.torchdist``): its choices and refusals
without processes, then real ``torchrun`` jobs on Gloo.

One job per rank count checks everything a rank can check (``check_all``): all-reduce
in float32, float16 and bfloat16 (Gloo reduces all three on this torch), its
non-blocking form, reduce-scatter and all-gather with uneven counts (blocking and not),
broadcast, reduce, point-to-point messages with tags and from any source, the object
collectives, subgroups (and the refusal of an unordered one), the project's ring and
two-level all-reduces on uneven fake nodes, two threads on ``comm`` and its ``dup``, the
transfer engine on both paths, and the side channel while the main thread is inside a
collective. The 2-rank job then closes the communicator; the 3-rank job ends with one
rank's ``abort(3)`` while the others wait in a barrier, which torchrun must end.

The worker is this module run under torchrun (``python -m tests.test_torchdist MODE``),
as the scripts in ``tests/mpi`` are under mpirun.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

from commbench.comm import base
from commbench.comm.engine import TransferEngine, engine_paths
from commbench.comm.hierarchical import hierarchical_allreduce, leader_allreduce
from commbench.comm.placement import TensorPlacement, decide
from commbench.comm.ring import ring_allreduce
from commbench.comm.torchdist import (
    GlooCommunicator,
    NcclCommunicator,
    connect,
    rendezvous_env,
)
from commbench.flags import DeviceRequest
from launch.execute import Completed, run
from tests.conftest import PY, ROOT

JOB_TIMEOUT_S = 120  # a job that takes longer has hung
TORCHRUN_ENV = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


# --- without processes ----------------------------------------------------------------

def test_rendezvous_is_read_from_torchruns_variables():
    rdv = rendezvous_env(TORCHRUN_ENV)
    assert (rdv.rank, rdv.world_size, rdv.local_rank, rdv.master_port) == (1, 2, 1, 29500)
    with pytest.raises(ValueError, match="RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, "
                                         "MASTER_PORT are not set: start the job with torchrun"):
        rendezvous_env({})
    with pytest.raises(ValueError, match="MASTER_PORT is not set"):
        rendezvous_env({k: v for k, v in TORCHRUN_ENV.items() if k != "MASTER_PORT"})
    with pytest.raises(ValueError, match="integers"):
        rendezvous_env({**TORCHRUN_ENV, "RANK": "one"})
    with pytest.raises(ValueError, match="RANK 2 is not a rank of a job of WORLD_SIZE 2"):
        rendezvous_env({**TORCHRUN_ENV, "RANK": "2"})


def test_without_a_rendezvous_the_communicator_is_refused_at_once(monkeypatch):
    for k in TORCHRUN_ENV:
        monkeypatch.delenv(k, raising=False)
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="start the job with torchrun"):
        connect(TensorPlacement("gloo"))


def test_dist_backend_picks_the_library():
    def library(dist_backend: str, device: str) -> str:
        return decide("torch", dist_backend, DeviceRequest(device)).library

    assert library("gloo", "cpu") == "gloo"
    assert library("auto", "cpu") == "gloo"
    here = torch.cuda.is_available() and dist.is_nccl_available()
    if here:
        assert library("auto", "cuda") == "nccl"
    with pytest.raises(ValueError, match="--dist-backend 'mpi': choose from gloo, nccl, auto"):
        library("mpi", "cpu")
    # NCCL reduces CUDA tensors only; without CUDA it is refused whatever the device
    with pytest.raises(ValueError, match="--dist-backend nccl reduces CUDA tensors only.*use "
                                         "--device cuda or --dist-backend gloo"):
        library("nccl", "cpu")
    if not here:
        with pytest.raises(ValueError, match="needs CUDA and NCCL.*use --dist-backend gloo"):
            decide("torch", "nccl", DeviceRequest("cuda"), cuda=True, nccl=False)


def test_each_library_is_a_class_of_its_own():
    """Gloo and NCCL differ by what their classes declare, not by tests of a name."""
    assert (GlooCommunicator.library, GlooCommunicator.supports_p2p,
            GlooCommunicator.completes_in_wait) == ("gloo", True, True)
    assert (NcclCommunicator.library, NcclCommunicator.supports_p2p,
            NcclCommunicator.completes_in_wait) == ("nccl", False, False)
    with pytest.raises(ValueError, match="runs on gloo or nccl, not 'mpi'"):
        connect(TensorPlacement("mpi"))


# --- the worker: runs under torchrun --------------------------------------------------

def fake_node(rank: int) -> str:
    """Ranks alternate between two nodes: 2 ranks are 2 nodes of one, 3 ranks are nodes of
    2 and 1 whose ranks are not contiguous (0, 2 | 1)."""
    return f"node{rank % 2}"


def tri(n: int) -> float:
    """1 + 2 + ... + n: the sum over ranks of (rank + 1)."""
    return n * (n + 1) / 2


def completed_by_test(*handles, limit_s: float = 20) -> bool:
    """Test ``handles`` between short sleeps, as the ring's ``poll`` does, never waiting."""
    end = time.monotonic() + limit_s
    while not all([h.test() for h in handles]):  # every handle tested each round
        if time.monotonic() > end:
            return False
        time.sleep(0.001)
    return True


def check_capabilities(comm, bad: list[str]) -> None:
    n, r = comm.size, comm.rank
    caps = (comm.name, comm.supports_p2p, comm.supports_recv_any, comm.progresses_itself,
            comm.nonblocking_collectives)
    if caps != ("torch-gloo", True, True, True, True):
        bad.append(f"capabilities (name, p2p, recv_any, progresses, nonblocking): {caps}")
    want = base.topology_from_hostnames(r, [fake_node(i) for i in range(n)])
    if comm.topo != want:
        bad.append(f"topology {comm.topo}, expected {want}")
    v = comm.versions()
    if v != {"torch": torch.__version__, "torch_distributed": "gloo"}:
        bad.append(f"versions {v}")


def check_collectives(comm, bad: list[str]) -> None:
    n, r = comm.size, comm.rank
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        t = (torch.arange(7) + r).to(dt)
        comm.allreduce(t)
        if t.dtype != dt or not torch.equal(t, (torch.arange(7) * n + n * (n - 1) // 2).to(dt)):
            bad.append(f"allreduce {dt}: {t}")
    t = torch.full((10_000,), float(r + 1))
    h = comm.iallreduce(t)
    h.wait()
    if not (h.test() and torch.equal(t, torch.full((10_000,), tri(n)))):
        bad.append("iallreduce + wait: wrong sum or not done")
    t = torch.full((3,), float(r + 1))
    if not completed_by_test(comm.iallreduce(t)) or not torch.equal(t, torch.full((3,), tri(n))):
        bad.append("iallreduce completed by test: wrong sum")
    root = n - 1
    for name, start in (("bcast", comm.bcast), ("ibcast", comm.ibcast)):
        t = torch.full((5,), float(r))
        h = start(t, root)
        if h is not None:
            h.wait()
        if not torch.equal(t, torch.full((5,), float(root))):
            bad.append(f"{name} from {root}: {t}")
    for name, start in (("reduce", comm.reduce), ("ireduce", comm.ireduce)):
        t = torch.full((5,), float(r + 1))
        h = start(t, root)
        if h is not None:
            h.wait()
        if r == root and not torch.equal(t, torch.full((5,), tri(n))):
            bad.append(f"{name} onto {root}: {t}")


def check_v_forms(g, bad: list[str], label: str) -> None:
    """reduce_scatter_v / allgather_v and their non-blocking forms on ``g`` (a communicator
    or a group): uneven counts, an empty part on every rank but one, and equal counts."""
    p, me = g.size, g.rank
    cases = [([2 * i + 1 for i in range(p)], torch.float32),
             ([2 * i + 1 for i in range(p)], torch.bfloat16),
             ([0] * (p - 1) + [5], torch.float32),
             ([4] * p, torch.float32)]
    for counts, dt in cases:
        total, off = sum(counts), sum(counts[:me])
        x = (torch.arange(total) % 11).to(dt) * (me + 1)
        full = (torch.arange(total) % 11).to(dt) * tri(p)
        what = f"{label} counts {counts} {dt}"
        part = g.reduce_scatter_v(x.clone(), counts)
        if not torch.equal(part, full[off:off + counts[me]]):
            bad.append(f"{what}: reduce_scatter_v gave {part}")
        out = torch.full((total,), -1.0, dtype=dt)
        g.allgather_v(part, counts, out)
        if not torch.equal(out, full):
            bad.append(f"{what}: allgather_v gave {out}")
        part2, h = g.ireduce_scatter_v(x.clone(), counts)
        h.wait()
        if not torch.equal(part2, full[off:off + counts[me]]):
            bad.append(f"{what}: ireduce_scatter_v gave {part2}")
        out2 = torch.full((total,), -1.0, dtype=dt)
        if not completed_by_test(g.iallgather_v(part2, counts, out2)) \
                or not torch.equal(out2, full):
            bad.append(f"{what}: iallgather_v completed by test gave {out2}")


def check_p2p(comm, bad: list[str]) -> None:
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    # tags keep messages apart: tag 2 is received before tag 1, the other order they left in
    sends = [comm.isend(torch.full((100,), float(r)), right, tag=1),
             comm.isend(torch.full((100,), r + 0.5), right, tag=2)]
    got1, got2 = torch.empty(100), torch.empty(100)
    h2, h1 = comm.irecv(got2, left, tag=2), comm.irecv(got1, left, tag=1)
    for h in (h2, h1, *sends):
        h.wait()
    if not (torch.equal(got1, torch.full((100,), float(left)))
            and torch.equal(got2, torch.full((100,), left + 0.5))):
        bad.append(f"isend/irecv with tags: tag 1 {got1[0]}, tag 2 {got2[0]} from {left}")
    # one tag: in the order posted
    sends = [comm.isend(torch.full((10,), float(k)), right, tag=3) for k in range(3)]
    recvs = [torch.empty(10) for _ in range(3)]
    handles = [comm.irecv(t, left, tag=3) for t in recvs]
    for h in (*handles, *sends):
        h.wait()
    if [float(t[0]) for t in recvs] != [0.0, 1.0, 2.0]:
        bad.append(f"messages with one tag out of order: {[float(t[0]) for t in recvs]}")
    # completed by test alone (Gloo's messages say so only from inside wait)
    got = torch.empty(5)
    if not completed_by_test(comm.isend(torch.full((5,), float(r)), right, tag=7),
                             comm.irecv(got, left, tag=7)) \
            or not torch.equal(got, torch.full((5,), float(left))):
        bad.append(f"isend/irecv completed by test: {got}")
    got = torch.empty(4)
    comm.sendrecv(torch.full((4,), float(r)), right, got, left, tag=4)
    if not torch.equal(got, torch.full((4,), float(left))):
        bad.append(f"sendrecv: {got}")
    if r == 0:
        comm.send(torch.full((2,), 42.0), n - 1, tag=5)
    if r == n - 1:
        t = torch.empty(2)
        comm.recv(t, 0, tag=5)
        if not torch.equal(t, torch.full((2,), 42.0)):
            bad.append(f"send/recv: {t}")
    if r == 0:
        sources = []
        for _ in range(n - 1):
            t = torch.empty(1)
            src = comm.recv_any(t, tag=9)
            sources.append(src)
            if float(t[0]) != src:
                bad.append(f"recv_any: rank {src}'s message says {float(t[0])}")
        if sorted(sources) != list(range(1, n)):
            bad.append(f"recv_any sources {sources}")
    else:
        time.sleep(0.05 * (n - r))  # the last rank's message first
        comm.send(torch.tensor([float(r)]), 0, tag=9)


def check_objects(comm, bad: list[str]) -> None:
    n, r = comm.size, comm.rank
    if comm.allgather_object((r, "x" * r)) != [(i, "x" * i) for i in range(n)]:
        bad.append("allgather_object")
    gathered = comm.gather_object({"rank": r})
    if gathered != ([{"rank": i} for i in range(n)] if r == 0 else None):
        bad.append(f"gather_object: {gathered}")
    if comm.bcast_object({"from": r}, root=n - 1) != {"from": n - 1}:
        bad.append("bcast_object")


def check_subgroups(comm, bad: list[str]) -> None:
    n, r = comm.size, comm.rank
    evens, odds = list(range(0, n, 2)), list(range(1, n, 2))
    groups = [comm.subgroup(evens), comm.subgroup(odds)]  # every rank makes both
    members = evens if r % 2 == 0 else odds
    g, other = groups[r % 2], groups[1 - r % 2]
    if g is None or other is not None or (g.rank, g.size) != (members.index(r), len(members)):
        bad.append(f"subgroups: mine {g and (g.rank, g.size)}, the other's {other}")
        return
    t = torch.tensor([float(r)])
    g.allreduce(t)
    if float(t[0]) != sum(members):
        bad.append(f"group {members} allreduce: {float(t[0])}")
    t = torch.tensor([float(r)])
    g.bcast(t, root=g.size - 1)
    if float(t[0]) != members[-1]:
        bad.append(f"group {members} bcast from its last rank: {float(t[0])}")
    check_v_forms(g, bad, f"group {members}")
    if g.size > 1:
        right, left = (g.rank + 1) % g.size, (g.rank - 1) % g.size
        got = torch.empty(3)
        hs = [g.isend(torch.full((3,), float(r)), right, tag=6), g.irecv(got, left, tag=6)]
        for h in hs:
            h.wait()
        if not torch.equal(got, torch.full((3,), float(members[left]))):
            bad.append(f"group {members} isend/irecv: {got}")
    whole = comm.subgroup(list(range(n)))
    t = torch.ones(2)
    whole.allreduce(t)
    if not torch.equal(t, torch.full((2,), float(n))):
        bad.append("subgroup of every rank: allreduce")
    try:
        comm.subgroup([n - 1, 0])  # refused before any rank makes a group
        bad.append("subgroup with ranks out of order was accepted")
    except ValueError:
        pass


def check_two_level(comm, bad: list[str]) -> None:
    """The project's ring and two-level all-reduces (on the fake nodes), pipelined in small
    segments, equal the library's all-reduce."""
    algos = {"ring": ring_allreduce, "hier": hierarchical_allreduce,
             "hier-leader": leader_allreduce}
    r = comm.rank
    want = (torch.arange(10_007) % 13).float() * (r + 1)
    comm.allreduce(want)
    for name, algo in algos.items():
        t = (torch.arange(10_007) % 13).float() * (r + 1)
        algo(comm, t, segment_bytes=4096)
        if not torch.equal(t, want):
            bad.append(f"{name} differs from the library's allreduce in "
                       f"{int((t != want).sum())} elements")


def check_dup(comm, bad: list[str]) -> None:
    """Two threads, each on its own communicator, at different paces on different ranks;
    then the transfer engine (its own dup) beside the main thread's collectives."""
    n, r = comm.size, comm.rank
    twin = comm.dup()
    if (twin.name, twin.topo) != (comm.name, comm.topo):
        bad.append("dup has another name or topology")
    sums: dict[int, list[float]] = {0: [], 1: []}

    def work(c, k: int) -> None:
        for i in range(12):
            if (i + r + k) % 3 == 0:
                time.sleep(0.002)
            t = torch.full((257,), float(100 * k + i + r))
            c.allreduce(t)
            sums[k].append(float(t[0]))

    threads = [threading.Thread(target=work, args=(c, k)) for k, c in enumerate((comm, twin))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    for k in (0, 1):
        want = [n * (100 * k + i) + n * (n - 1) / 2 for i in range(12)]
        if sums[k] != want:
            bad.append(f"thread {k} on {'the dup' if k else 'comm'}: {sums[k]}")
    twin.close()
    for path in engine_paths(comm):
        with TransferEngine(comm, path) as engine:
            tensors = [torch.full((k,), float(r + 1)) for k in (1, 1009, 5000)]
            transfers = [engine.submit(t) for t in tensors]
            comm.barrier()  # the main thread's collective while the engine's run
            for t in transfers:
                t.wait()
        if not all(torch.equal(t, torch.full_like(t, tri(n))) for t in tensors):
            bad.append(f"transfer engine, {path} path: wrong sums")


def check_side_channel(comm, bad: list[str]) -> None:
    """Every rank's thread greets every other through the side channel; rank 0's main
    thread is in a barrier meanwhile, which the others enter once greeted."""
    n, r = comm.size, comm.rank
    side = comm.side_channel()
    if side.receive() != []:
        bad.append("side channel: a message before any was sent")
    if side.allgather(("pid", r)) != [("pid", i) for i in range(n)]:
        bad.append("side channel allgather")
    got: dict[int, object] = {}
    greeted = threading.Event()

    def serve() -> None:
        side.announce(("hello", r))
        end = time.monotonic() + 30
        while len(got) < n - 1 and time.monotonic() < end:
            got.update(side.receive())
            time.sleep(0.01)
        greeted.set()

    thread = threading.Thread(target=serve)
    thread.start()
    if r != 0:
        greeted.wait(40)
    comm.barrier()
    thread.join(40)
    if got != {s: ("hello", s) for s in range(n) if s != r}:
        bad.append(f"side channel: received {got}")


CHECKS = (check_capabilities, check_collectives, check_v_forms, check_p2p, check_objects,
          check_subgroups, check_two_level, check_dup, check_side_channel)


def check_all(comm) -> list[str]:
    bad: list[str] = []
    for check in CHECKS:
        if check is check_v_forms:
            check(comm, bad, "comm")
        else:
            check(comm, bad)
    return bad


def nccl_worker() -> int:
    """One rank on its GPU: tensors stay on the device, handles finish the work, what NCCL
    lacks is refused, and the rest of the interface runs."""
    comm = connect(decide("torch", "auto", DeviceRequest("cuda")))
    device = comm.placement().comm_device
    bad = []
    caps = (comm.name, comm.supports_p2p, comm.supports_recv_any, device.type)
    if caps != ("torch-nccl", False, False, "cuda"):
        bad.append(f"capabilities (name, p2p, recv_any, device): {caps}")
    if "nccl" not in comm.versions():
        bad.append(f"versions {comm.versions()}")
    t = torch.ones(1 << 20, device=device)
    comm.allreduce(t)
    h = comm.iallreduce(t)
    h.wait()
    if not h.test() or t.device != device or not torch.equal(t, torch.ones_like(t)):
        bad.append(f"allreduce on the device: {t.device}")
    counts = [t.numel()]
    out = torch.empty_like(t)
    comm.allgather_v(comm.reduce_scatter_v(t, counts), counts, out)
    if out.device != device or not torch.equal(out, t):
        bad.append("reduce_scatter_v + allgather_v on the device")
    for refused in (lambda: comm.isend(t, 0), lambda: comm.recv_any(t)):
        try:
            refused()
            bad.append("NCCL accepted a point-to-point message")
        except NotImplementedError:
            pass
    twin = comm.dup()
    twin.allreduce(t)
    twin.close()
    side = comm.side_channel()
    side.send(0, "to myself")
    if side.receive() != [(0, "to myself")]:
        bad.append("side channel")
    comm.barrier()
    comm.close()
    print("\n".join(bad) if bad else "OK torch-nccl on 1 rank", flush=True)
    return 1 if bad else 0


def worker(mode: str) -> int:
    """One rank: every check, the verdict on rank 0, then ``close`` or ``abort(3)``."""
    if mode == "nccl":
        return nccl_worker()
    rank = int(os.environ["RANK"])
    base.hostname = lambda: fake_node(rank)  # read when the topology is built
    comm = connect(TensorPlacement("gloo"))
    bad_all = comm.allgather_object(check_all(comm))
    errors = [f"rank {i}: {m}" for i, b in enumerate(bad_all) for m in b]
    if rank == 0:
        print("\n".join(errors) if errors else f"OK torch-gloo on {comm.size} ranks", flush=True)
    if mode == "close":
        comm.close()
        comm.close()  # a second close does nothing
        print(f"rank {rank} closed: initialised {dist.is_initialized()}", flush=True)
    elif mode == "abort":
        if rank == comm.size - 1:
            comm.abort(3)
        comm.barrier()  # the aborting rank never comes: torchrun must end this one
        print(f"rank {rank}: barrier returned", flush=True)
    return 1 if errors else 0


# --- the jobs ---------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torchrun(nproc: int, mode: str) -> tuple[Completed, float]:
    """This module's worker on ``nproc`` ranks under torchrun; (result, seconds taken)."""
    argv = [PY, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            "--monitor-interval", "0.1", "-m", "tests.test_torchdist", mode]
    t0 = time.monotonic()
    res = run(argv, timeout=JOB_TIMEOUT_S, env={"OMP_NUM_THREADS": "1"}, cwd=str(ROOT))
    assert not res.timed_out, f"timed out after {JOB_TIMEOUT_S} s\n{res.stdout}{res.stderr}"
    return res, time.monotonic() - t0


def test_every_check_on_two_ranks_then_close():
    res, _ = run_torchrun(2, "close")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "OK torch-gloo on 2 ranks" in res.stdout, res.stdout + res.stderr
    for rank in (0, 1):
        assert f"rank {rank} closed: initialised False" in res.stdout


@pytest.mark.skipif(not (torch.cuda.is_available() and dist.is_nccl_available()),
                    reason="NCCL needs a CUDA device (run it on a GPU machine)")
def test_nccl_keeps_tensors_on_the_device():
    res, _ = run_torchrun(1, "nccl")
    assert res.returncode == 0 and "OK torch-nccl on 1 rank" in res.stdout, \
        res.stdout + res.stderr


def test_every_check_on_three_ranks_then_abort_ends_the_job():
    res, took = run_torchrun(3, "abort")
    assert "OK torch-gloo on 3 ranks" in res.stdout, res.stdout + res.stderr
    assert res.returncode != 0 and "barrier returned" not in res.stdout
    # torchrun exits 1 and names the worker's own exit status in its failure report
    assert re.search(r"exitcode\s*:\s*3\b", res.stderr), res.stderr
    assert took < 60, f"the job took {took:.0f} s to end after the abort"


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1]))
