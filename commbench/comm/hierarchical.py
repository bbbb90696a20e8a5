"""Two-level (hierarchical) all-reduce from the node topology.

Ranks are grouped by host (``Topology.hostnames``). Let ``L`` be the largest
number of ranks on a node and split the flat tensor into ``L`` shards (sizes
differ by at most one element). On a node with ``l`` ranks, local rank ``i``
owns shards ``i*L//l .. (i+1)*L//l - 1``: one shard each when ``l == L``, all
of them on a node with one rank, so uneven nodes (3 + 1) work.

Default variant (``hier``), the scheme Horovod uses with NCCL:

1. Reduce-scatter inside the node: each rank gets the node's sum of the
   shards it owns.
2. For every shard, all-reduce it across nodes among the ranks that own it,
   all local ranks working at once, each on its own shards; with the
   project's pipelined ring where the group has point-to-point messages
   (``_inter_node_allreduce`` says why), else the backend's all-reduce. Each node link
   carries ``2(n-1)/n`` of the tensor in total, as a flat ring does, but in
   ``l`` parallel streams of ``1/l`` of the data.
3. All-gather inside the node.

Leader variant (``hier-leader``): reduce to local rank 0, all-reduce among
the nodes' rank-0s, broadcast inside the node. One stream per node carries
the whole tensor across.

On one node, both variants reduce to their intra-node part.

Pipelined in segments (where the inter-node phase runs on the ring, i.e. the cross
groups have point-to-point messages, some node has more than one rank, and the
tensor is above one segment, ``SEGMENT_BYTES``): the tensor is cut into segments and
the three phases run on each in turn, as NCCL's tree and ring algorithms do, so the
intra-node phases of one segment overlap the inter-node phase of another. With the
mpi backend the calling thread alone runs the pipeline (``_Interleaved``): it starts
every segment's intra-node reduce-scatter (or reduce) in turn, then every segment's
all-gather (or broadcast) once that segment is across, and between them advances the
ring of the oldest reduced segment on the cross groups (``ring.ring_steps``),
testing the node's collective and the ring's next message between short sleeps; no
call blocks, and nothing of the library runs on two threads. The node's collectives
there run on point-to-point messages too (``p2pcoll``), not on Open MPI's
non-blocking collectives (libnbc), which aborted a rank now and then
(``_Interleaved``). Under Horovod (its own thread moves the bytes) the ring runs on
a second thread (``_Pipeline``). Every rank issues its node's collectives in the
same fixed order (all first phases, then all last phases), so matching never depends
on timing. Unpipelined (all of one phase, then the next) on Gloo and for tensors of
one segment. On 2 emulated nodes x 4 ranks at 1 Gbit/s, 64 MiB
(``benchmarks/hier_bound.py``): unpipelined hier 1000 ms (intra-node 361 + 93 ms one
after the other against 549 ms inter-node), leader 1092 ms (one run each,
undilated); pipelined in 8 segments on one thread, at time dilation 4, hier 567 ms
(0.99 of its link bound), leader 588 ms, ring 1001 ms, native 971 ms (5 all-reduces
each); with the node's phases on point-to-point messages, hier 568 ms (0.99), leader
596 ms, ring 1003 ms.

Phases are reported as intervals (``on_phase``): pipelined, they overlap,
and each runs from its first segment's start to its last segment's end.

On NCCL (groups that reduce tensors on a device, ``Communicator.device_collectives``)
the two-level all-reduce runs unpipelined, on the calling thread alone, whatever the
groups offer: every rank issues its node's reduce-scatter, then its shards' cross-node
all-reduces in shard order, then its node's all-gather, each finished before the next is
issued. NCCL documents communicators used concurrently, or in an order that differs
between ranks, as a deadlock risk (its kernels wait on each other's peers on the device),
and either pipeline above interleaves the node's communicator with the cross-node ones in
an order that depends on timing (``_Pipeline`` also issues them from two threads). On the
device the pipelining belongs to NCCL itself, which cuts each collective into chunks in
its kernel. Every communicator of the plan is also made and first used in one order on
every rank: the groups are made in ``plan_for``'s order, and the first call sends one
element through each of this rank's groups in the same order (node group, cross-node
groups by shard, leaders; ``_first_use``), so NCCL creates its communicators there, on
the calling thread, and not inside the first timed all-reduce. Both orders are one
global order of which each rank's is a part, so no two ranks wait on each other in
opposite orders (``tests/test_hierarchical.py`` replays every rank's calls on uneven
nodes and checks it). Not yet run on GPUs across nodes (one GPU is all a lent machine has).

(Sergeev & Del Balso 2018, "Horovod", https://arxiv.org/abs/1802.05799;
Thakur, Rabenseifner & Gropp 2005 for the cost model; NCCL cuts its
collectives into chunks that move through the algorithm's steps the same way.)
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

import torch

from commbench import dilation
from commbench.comm.base import Communicator, Group, Handle
from commbench.comm.p2pcoll import (
    Steps,
    allgather_steps,
    bcast_steps,
    reduce_scatter_steps,
    reduce_steps,
)
from commbench.comm.phases import PhaseHook, Phases
from commbench.comm.ring import POLL_S, block, chunk_bounds, poll, ring_allreduce, ring_steps
from commbench.timing import now

# 8 MiB: 8 segments for 64 MiB, so filling and draining the pipeline costs about
# 1/8 of the intra-node phases; each local rank's share of a segment still goes
# across in 1 MiB ring segments. Tunable through COMMBENCH_HIER_SEGMENT_BYTES.
SEGMENT_BYTES = int(os.environ.get("COMMBENCH_HIER_SEGMENT_BYTES", 8 << 20))
T = TypeVar("T")


def _one_thread(p: Plan) -> bool:
    """Whether the pipeline runs on the calling thread alone (``_Interleaved``): where it
    is the library's only caller and the node's ranks have point-to-point messages (the mpi
    backend), on which the node's collectives then run (``p2pcoll``).
    Else (Horovod's process sets, whose background thread moves the bytes and,
    under its MPI controller, is in MPI too) on two threads (``_Pipeline``): testing
    handles between sleeps beside Horovod's thread starved them (ResNet-50's gradient on
    2 emulated nodes x 4 ranks at 1 Gbit/s took 6.4 s a step, one step 43.8 s, against
    2.3 s for Horovod's flat all-reduce), where waiting inside the call runs at the link.
    """
    return p.local.supports_p2p and not p.library_thread


def owned_shards(i: int, n_local: int, L: int) -> range:
    """Shards local rank ``i`` of a node with ``n_local`` ranks owns, of ``L`` in all."""
    return range(i * L // n_local, (i + 1) * L // n_local)


@dataclass
class Plan:
    L: int                               # shards (= largest node's rank count)
    local: Group                         # my node's ranks
    local_index: int
    local_size: int
    my_shards: list[int]
    cross: dict[int, Group | None]       # shard -> owners of it across nodes (mine only)
    leaders: Group | None                # every node's local rank 0 (for the leader variant)
    nodes: int
    #: every rank's cross-node groups have point-to-point messages (the ring, and so the
    #: pipeline, run across nodes); agreed by all ranks, as every node's collectives must be
    cross_p2p: bool
    #: the library has a thread of its own that calls into it (Horovod's background thread)
    library_thread: bool = False
    #: the groups reduce tensors on a device (NCCL): unpipelined, on the calling thread
    #: (module docstring)
    on_device: bool = False
    #: every group of this rank has been used once, in the plan's order (``_first_use``)
    first_used: bool = False


#: each communicator's plan, for as long as the communicator lives: keyed by the object, not
#: its ``id``, which a communicator made after another is freed (a transfer engine's) may
#: reuse on one rank and not on another, and one rank would then skip the splits the others
#: make
_PLANS: weakref.WeakKeyDictionary[Communicator, Plan] = weakref.WeakKeyDictionary()


def plan_for(comm: Communicator) -> Plan:
    """The groups of ``comm``'s topology, made once (collectively) and kept."""
    if comm in _PLANS:
        return _PLANS[comm]
    hosts = comm.topo.hostnames
    order = list(dict.fromkeys(hosts))
    nodes = [[r for r, h in enumerate(hosts) if h == host] for host in order]
    L = max(len(n) for n in nodes)
    local = mine = None
    for members in nodes:  # every rank takes part in every split, in the same order
        g = comm.subgroup(members)
        if g is not None:
            local, mine = g, members
    cross: dict[int, Group | None] = {}
    made: dict[tuple[int, ...], Group | None] = {}
    i = mine.index(comm.rank)
    shards = list(owned_shards(i, len(mine), L))
    for j in range(L):
        owners = tuple(sorted(
            n[next(k for k in range(len(n)) if j in owned_shards(k, len(n), L))]
            for n in nodes))
        if owners not in made:
            made[owners] = comm.subgroup(list(owners))
        if j in shards:
            cross[j] = made[owners]
    leaders_key = tuple(sorted(n[0] for n in nodes))
    leaders = made[leaders_key] if leaders_key in made else comm.subgroup(list(leaders_key))
    mine_p2p = all(g.supports_p2p for g in (*made.values(), leaders)
                   if g is not None and g.size > 1)
    plan = Plan(L=L, local=local, local_index=i, local_size=len(mine), my_shards=shards,
                cross=cross, leaders=leaders, nodes=len(nodes),
                cross_p2p=all(comm.allgather_object(mine_p2p)),
                library_thread=comm.progresses_itself, on_device=comm.device_collectives)
    _PLANS[comm] = plan
    return plan


#: phase names, in the order they run
HIER_PHASES = ("intra_reduce_scatter", "inter_allreduce", "intra_allgather")
LEADER_PHASES = ("intra_reduce", "inter_allreduce", "intra_bcast")


def inter_node_algo(group: Group) -> str:
    """What the inter-node phase runs on ``group``: ``ring`` where it has point-to-point
    messages, else the backend's ``native`` all-reduce of the group."""
    return "ring" if group.supports_p2p else "native"


def plan_inter_node_algo(comm: Communicator) -> str | None:
    """What this rank's inter-node phase runs (None: it has none, e.g. one node)."""
    p = plan_for(comm)
    groups = [g for g in (*p.cross.values(), p.leaders) if g is not None and g.size > 1]
    return inter_node_algo(groups[0]) if groups else None


def plan_wire_dtype(comm: Communicator, dtype: torch.dtype) -> torch.dtype:
    """The dtype the two-level algorithms move a ``dtype`` tensor in on ``comm``: its own,
    unless a group of the plan widens it (Horovod's process sets under Gloo)."""
    if comm.size == 1:
        return dtype
    p = plan_for(comm)
    groups = [g for g in (p.local, *p.cross.values(), p.leaders) if g is not None]
    return max((g.wire_dtype(dtype) for g in groups), key=lambda d: d.itemsize)


def _inter_node_allreduce(group: Group, tensor: torch.Tensor,
                          wait: Callable[[Handle], None] | None = None) -> None:
    """All-reduce across nodes with the project's pipelined ring where the group allows.

    Open MPI's tuned all-reduce between two ranks moved 16 MiB at 0.67 of a
    200 Mbit/s link on the emulated cluster (1.04 s against a 0.70 s bound),
    while the ring, sending half each way at once in 1 MiB segments, took
    0.70 s; with four such flows per node pair (2 x 4 ranks) hierarchical's
    inter-node phase ran at ~0.6 of the link on the native all-reduce.
    """
    if inter_node_algo(group) == "ring":
        ring_allreduce(group, tensor, wait=wait)
    else:
        group.allreduce(tensor)


def segment_bounds(numel: int, element_size: int,
                   segment_bytes: int = SEGMENT_BYTES) -> list[tuple[int, int]]:
    """The pipeline's segments of a ``numel``-element tensor: as many as whole
    ``segment_bytes`` fit (at least one), sizes differing by at most one element."""
    n = max(1, numel * element_size // max(1, segment_bytes))
    return chunk_bounds(numel, min(n, max(1, numel)))


def pipeline_segments(comm: Communicator, numel: int, element_size: int,
                      segment_bytes: int = SEGMENT_BYTES) -> int:
    """How many segments the two-level all-reduce of a tensor of ``numel`` elements runs
    in on ``comm``: 1 = unpipelined (one segment's worth or less, one node, no ring
    across nodes, or one rank on every node: no intra-node phase to overlap, and the
    pipeline's hand-offs cost 2 x 1 at 1 Gbit/s, 64 MiB 611 ms against the ring's 571).
    The same on every rank (topology and tensor size only)."""
    if comm.size == 1:
        return 1
    p = plan_for(comm)
    if p.nodes == 1 or not p.cross_p2p or p.L == 1 or p.on_device:
        return 1
    return len(segment_bounds(numel, element_size, segment_bytes))


def plan_groups(p: Plan) -> list[Group]:
    """This rank's groups of the plan that carry messages, each once, in one order that is
    the same on every rank: the node's group, the cross-node groups by the first shard
    they carry, the leaders' group. Two ranks that share groups meet them in the same
    order (a cross-node group holds one rank per node, as the leaders' group does)."""
    out: list[Group] = []
    for g in (p.local, *(p.cross[j] for j in sorted(p.cross)), p.leaders):
        if g is not None and g.size > 1 and all(g is not h for h in out):
            out.append(g)
    return out


def _first_use(p: Plan, like: torch.Tensor) -> None:
    """On a device (NCCL), at the plan's first all-reduce: one element of ``like``'s dtype
    and device through each of ``plan_groups`` in turn, so that the library creates every
    communicator on the calling thread, in one order on every rank, before any timed
    work (module docstring). Collective: every rank's first two-level all-reduce."""
    if p.first_used or not p.on_device:
        return
    for g in plan_groups(p):
        g.allreduce(like.new_zeros(1))
    p.first_used = True


class _Pipeline(Generic[T]):
    """Runs ``first(k)`` for every segment on the calling thread, ``inter(k, x)`` on a
    thread of its own as each first phase is done, then ``last(k, x)`` on the calling
    thread in segment order as the inter-node thread finishes each.

    Each phase's span runs from its first segment's start to its last segment's end;
    the inter-node phase's from handing segment 0 to the thread until the thread has
    ended (the hand-offs are its cost), so the spans cover the whole call.
    """

    def __init__(self, n: int, first: Callable[[int], T], inter: Callable[[int, T], None],
                 last: Callable[[int, T], None]) -> None:
        self.n, self.first, self.inter, self.last = n, first, inter, last
        self.spans: list[tuple[float, float]] = []
        self._todo: queue.SimpleQueue[tuple[int, T] | None] = queue.SimpleQueue()
        self._done = [threading.Event() for _ in range(n)]
        self._error: BaseException | None = None

    def _inter_loop(self) -> None:
        try:
            while (item := self._todo.get()) is not None:
                self.inter(*item)
                self._done[item[0]].set()
        except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread
            self._error = e
            for d in self._done:
                d.set()

    def run(self, t0: float) -> None:
        """Run every segment; ``t0``: when the call began (the first phase's start)."""
        worker = threading.Thread(target=self._inter_loop, name="commbench-hier-inter",
                                  daemon=True)  # a failed rank's job is aborted, not joined
        worker.start()
        out: list[T] = []
        handed = 0.0
        try:
            for k in range(self.n):
                out.append(self.first(k))
                self._todo.put((k, out[k]))
                if k == 0:
                    handed = now()
        finally:
            self._todo.put(None)
        t1 = now()
        for k in range(self.n):
            self._done[k].wait()
            if self._error is not None:
                raise self._error
            t = now()
            if k == 0:
                t2 = t
            self.last(k, out[k])
        t3 = now()
        worker.join()  # the thread's end is the inter-node phase's
        self.spans = [(t0, t1), (handed, max(t, now())), (t2, t3)]

    def report(self, names: tuple[str, str, str], hook: PhaseHook | None) -> None:
        if hook is not None:
            for name, (a, b) in zip(names, self.spans):
                hook(name, a, b)

    @classmethod
    def of_steps(cls, n: int, steps: _Steps[T], wait: Callable[[Handle], None],
                 ring_wait: Callable[[Handle], None]) -> _Pipeline[T]:
        """The two-thread pipeline of ``steps``: each intra-node handle completed with
        ``wait``, each of the ring's messages with ``ring_wait``."""
        def first(k: int) -> T:
            h, x = steps.first(k)
            if h is not None:
                wait(h)
            return x

        def inter(k: int, x: T) -> None:
            for h in steps.inter(k, x):
                ring_wait(h)

        def last(k: int, x: T) -> None:
            h = steps.last(k, x)
            if h is not None:
                wait(h)

        return cls(n, first, inter, last)


@dataclass
class _Steps(Generic[T]):
    """One two-level all-reduce's phases, each started and left for its caller to
    complete: ``first(k)`` starts segment ``k``'s intra-node phase and returns its handle
    (None: nothing to wait for) and what the inter-node phase works on; ``inter(k, x)``
    is a generator over the messages of segment ``k``'s inter-node phase
    (``ring.ring_steps``); ``last(k, x)`` starts its last phase (handle or None)."""

    first: Callable[[int], tuple[Handle | None, T]]
    inter: Callable[[int, T], Iterator[Handle]]
    last: Callable[[int, T], Handle | None]


class _Interleaved(Generic[T]):
    """The pipeline of ``_Pipeline`` on the calling thread alone.

    The node's collectives run one at a time in the same order as there (every first
    phase, then every last phase, each last phase once its segment's inter-node phase is
    done); the inter-node phases run one segment at a time as their first phases finish.
    Each turn tests the running collective and the ring's pending message, moves on
    whichever is complete, and sleeps ``ring.POLL_S`` when neither was. Why one thread:
    with two in Open MPI 4.1 (``MPI_THREAD_MULTIPLE``), even one at a time under a lock
    of ours, a node's rank aborted in CI with heap corruption inside libnbc's progress
    ("double free or corruption", after "MPI Error in NBC subrequest: 15",
    ``MPI_ERR_TRUNCATE``) in a few percent of runs, never on demand; on one thread nothing
    of the library runs from two threads. With one thread the same abort still came,
    rarer (twice in two sessions' test suites, on 3 fake nodes of 2 ranks, in libnbc's
    reduce-scatter; 18 runs of that test alone under load passed), so the node's
    collectives here are the project's own on point-to-point messages (``p2pcoll``),
    which the ring's messages show sound: nothing of libnbc runs in the pipeline.
    The abort came back on those messages too, always on that layout, and two of its
    three repeats printed vader's failed single copy first ("Read -1, expected 4194304,
    errno = 14"): Open MPI's shared-memory single copy (CMA), not the pipeline
    (docs/microbench.md; the test suite turns it off).

    Spans as ``_Pipeline``'s: first phases from the call's start to the last one's end,
    the inter-node phase from the first segment's hand-off to the last segment's end,
    the last phases from the first one's start to the call's end.
    """

    def __init__(self, n: int, steps: _Steps[T]) -> None:
        self.n, self.steps = n, steps
        self.spans: list[tuple[float, float]] = []

    def run(self, t0: float) -> None:
        n, steps = self.n, self.steps
        out: list[T] = []
        inter_done = 0  # segments whose inter-node phase has ended
        ring: Iterator[Handle] | None = None
        msg: Handle | None = None  # the ring's message it waits for
        handed = t1 = t2 = t_inter = t0
        firsts = lasts = 0  # intra-node phases started, of each kind
        coll: Handle | None = None  # the node's collective in flight
        busy = False  # a collective is in flight (its handle may be None: nothing to do)
        pending: T | None = None  # the first phase in flight's result
        while lasts < n or busy:
            moved = False
            # the node's collectives, one at a time, in their fixed order
            if not busy:
                if firsts < n:
                    coll, pending = steps.first(firsts)
                    firsts += 1
                    busy = True
                elif lasts < inter_done:
                    if lasts == 0:
                        t2 = now()
                    coll = steps.last(lasts, out[lasts])
                    lasts += 1
                    busy = True
            if busy and (coll is None or coll.test()):
                busy, coll, moved = False, None, True
                if len(out) < firsts:  # a first phase ended
                    out.append(pending)  # type: ignore[arg-type]
                    pending = None
                    if len(out) == 1:
                        handed = now()
                    if len(out) == n:
                        t1 = now()
            # the inter-node phase of the oldest segment not yet across
            if ring is None and inter_done < len(out):
                ring, msg = steps.inter(inter_done, out[inter_done]), None
            while ring is not None and (msg is None or msg.test()):
                moved = True
                try:
                    msg = next(ring)
                except StopIteration:
                    ring, msg = None, None
                    inter_done += 1
                    t_inter = now()
                    if inter_done < len(out):
                        ring = steps.inter(inter_done, out[inter_done])
            if not moved:
                dilation.sleep(POLL_S)
        self.spans = [(t0, t1), (handed, t_inter), (t2, now())]

    report = _Pipeline.report


def _run_pipeline(p: Plan, n: int, steps: _Steps[T], ring_wait: Callable[[Handle], None],
                  t0: float, names: tuple[str, str, str], on_phase: PhaseHook | None) -> None:
    """Run ``steps`` in ``n`` segments, on one thread or two (``_one_thread``)."""
    if p.on_device:  # pipeline_segments never pipelines there (module docstring)
        raise RuntimeError("the two-level pipeline interleaves communicators on the host; "
                           "on a device (NCCL) the all-reduce runs unpipelined")
    pipe: _Interleaved[T] | _Pipeline[T]
    if _one_thread(p):
        pipe = _Interleaved(n, steps)
    else:
        pipe = _Pipeline.of_steps(n, steps, lambda h: h.wait(), ring_wait)
    pipe.run(t0)
    pipe.report(names, on_phase)


def _shard_regions(numel: int, p: Plan) -> tuple[list[tuple[int, int]], list[int]]:
    """Shard bounds of a ``numel``-element tensor, and each local rank's element count
    (the contiguous run of the shards it owns)."""
    shard = chunk_bounds(numel, p.L)
    counts = []
    for k in range(p.local_size):
        owned = owned_shards(k, p.local_size, p.L)
        counts.append(shard[owned.stop - 1][1] - shard[owned.start][0])
    return shard, counts


def _cross_allreduce(p: Plan, flat: torch.Tensor, part: torch.Tensor,
                     shard: list[tuple[int, int]], start: int,
                     wait: Callable[[Handle], None] | None = None) -> None:
    """All-reduce across nodes every shard this rank owns (``part`` holds them, from
    element ``start`` of ``flat``; ``part`` is ``flat`` itself on a one-rank node); the
    ring's messages completed by ``wait`` (default: the ring's)."""
    for g, x in _cross_shards(p, flat, part, shard, start):
        _inter_node_allreduce(g, x, wait)


def _cross_shards(p: Plan, flat: torch.Tensor, part: torch.Tensor,
                  shard: list[tuple[int, int]], start: int) -> list[tuple[Group, torch.Tensor]]:
    """Each shard this rank all-reduces across nodes, with the group it does so in."""
    out = []
    for j in p.my_shards:
        g = p.cross[j]
        if g is not None and g.size > 1:
            a, b = shard[j]
            out.append((g, part[a - start:b - start] if p.local_size > 1 else flat[a:b]))
    return out


def _cross_ring(p: Plan, flat: torch.Tensor, part: torch.Tensor,
                shard: list[tuple[int, int]], start: int) -> Iterator[Handle]:
    """``_cross_allreduce`` on the ring, as a generator of its messages (``ring_steps``)."""
    for g, x in _cross_shards(p, flat, part, shard, start):
        yield from ring_steps(g, x)


def hierarchical_allreduce(comm: Communicator, tensor: torch.Tensor,
                           on_phase: PhaseHook | None = None,
                           segment_bytes: int = SEGMENT_BYTES,
                           ring_wait: Callable[[Handle], None] | None = None) -> None:
    """Reduce-scatter in the node, all-reduce shards across nodes, all-gather in the node.

    Pipelined in segments of ``segment_bytes`` where ``pipeline_segments`` says so (module
    docstring). ``on_phase`` is told of each of ``HIER_PHASES`` (pipelined: as one
    interval each, overlapping); a phase that has nothing to do on this layout (one
    rank per node: no intra-node phase) is still reported, with its near-zero duration.
    ``ring_wait`` completes each of the ring's messages where one thread waits for them
    (unpipelined, or Horovod's second thread; default: the ring's own wait unpipelined,
    a blocking wait pipelined): the transfer engine's ``ring.poll`` leaves the core free.
    """
    if comm.size == 1:
        return
    t0 = now()
    p = plan_for(comm)
    flat = tensor.view(-1)
    _first_use(p, flat)
    n = pipeline_segments(comm, flat.numel(), flat.element_size(), segment_bytes)
    if n == 1:
        phases = Phases(on_phase)
        shard, counts = _shard_regions(flat.numel(), p)
        start = sum(counts[:p.local_index])
        part = p.local.reduce_scatter_v(flat, counts) if p.local_size > 1 else flat
        phases.end("intra_reduce_scatter")
        _cross_allreduce(p, flat, part, shard, start, ring_wait)
        phases.end("inter_allreduce")
        if p.local_size > 1:
            p.local.allgather_v(part, counts, flat)
        phases.end("intra_allgather")
        return

    segs = [flat[a:b] for a, b in segment_bounds(flat.numel(), flat.element_size(),
                                                 segment_bytes)]
    layout = [_shard_regions(s.numel(), p) for s in segs]

    p2p = _one_thread(p)  # the node's phases on point-to-point messages (p2pcoll)

    def first(k: int) -> tuple[Handle | None, torch.Tensor]:
        if p.local_size == 1:
            return None, segs[k]
        counts = layout[k][1]
        if p2p:
            part = torch.empty(counts[p.local_index], dtype=flat.dtype)
            return Steps(reduce_scatter_steps(p.local, segs[k], counts, part)), part
        part, h = p.local.ireduce_scatter_v(segs[k], counts)
        return h, part

    def inter(k: int, part: torch.Tensor) -> Iterator[Handle]:
        shard, counts = layout[k]
        return _cross_ring(p, segs[k], part, shard, sum(counts[:p.local_index]))

    def last(k: int, part: torch.Tensor) -> Handle | None:
        if p.local_size == 1:
            return None
        if p2p:
            return Steps(allgather_steps(p.local, part, layout[k][1], segs[k]))
        return p.local.iallgather_v(part, layout[k][1], segs[k])

    _run_pipeline(p, n, _Steps(first, inter, last), ring_wait or block, t0, HIER_PHASES,
                  on_phase)


def leader_allreduce(comm: Communicator, tensor: torch.Tensor,
                     on_phase: PhaseHook | None = None,
                     segment_bytes: int = SEGMENT_BYTES) -> None:
    """Reduce to the node's first rank, all-reduce among those, broadcast in the node.

    Pipelined in segments as ``hierarchical_allreduce``. ``on_phase`` is told of each
    of ``LEADER_PHASES``.
    """
    if comm.size == 1:
        return
    t0 = now()
    p = plan_for(comm)
    flat = tensor.view(-1)
    _first_use(p, flat)
    crosses = p.leaders is not None and p.leaders.size > 1
    n = pipeline_segments(comm, flat.numel(), flat.element_size(), segment_bytes)
    if n == 1:
        phases = Phases(on_phase)
        if p.local_size > 1:
            p.local.reduce(flat, root=0)
        phases.end("intra_reduce")
        if crosses:
            _inter_node_allreduce(p.leaders, flat)
        phases.end("inter_allreduce")
        if p.local_size > 1:
            p.local.bcast(flat, root=0)
        phases.end("intra_bcast")
        return

    segs = [flat[a:b] for a, b in segment_bounds(flat.numel(), flat.element_size(),
                                                 segment_bytes)]

    p2p = _one_thread(p)  # the node's phases on point-to-point messages (p2pcoll)

    def first(k: int) -> tuple[Handle | None, torch.Tensor]:
        if p.local_size == 1:
            return None, segs[k]
        if p2p:
            return Steps(reduce_steps(p.local, segs[k], 0)), segs[k]
        return p.local.ireduce(segs[k], 0), segs[k]

    def inter(k: int, seg: torch.Tensor) -> Iterator[Handle]:
        if crosses:  # the node's leader; the others have nothing to do across nodes
            yield from ring_steps(p.leaders, seg)

    def last(k: int, seg: torch.Tensor) -> Handle | None:
        if p.local_size == 1:
            return None
        return Steps(bcast_steps(p.local, seg, 0)) if p2p else p.local.ibcast(seg, 0)

    _run_pipeline(p, n, _Steps(first, inter, last), poll, t0, LEADER_PHASES, on_phase)
