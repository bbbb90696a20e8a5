"""The project's own ring all-reduce on point-to-point messages, pipelined.

A known algorithm, so its cost can be compared with the backend's native
all-reduce and with the α-β model (Patarasuk & Yuan 2009; Thakur,
Rabenseifner & Gropp 2005):

1. Split the flat tensor into ``p`` chunks (sizes differ by at most one
   element, so any length works, including fewer elements than ranks).
2. Reduce-scatter, ``p-1`` steps: at step ``s`` rank ``r`` sends chunk
   ``(r-s) mod p`` to ``r+1``, receives chunk ``(r-s-1) mod p`` from ``r-1``
   and adds it to its own copy. Rank ``r`` then holds the full sum of chunk
   ``(r+1) mod p``.
3. All-gather, ``p-1`` steps: at step ``s`` rank ``r`` sends chunk
   ``(r+1-s) mod p`` and receives chunk ``(r-s) mod p`` into place.

Each rank sends and receives ``2(p-1)/p`` of the tensor in ``2(p-1)`` steps.

Pipelining: every chunk travels as segments of ``segment_bytes`` with
non-blocking sends and receives. The chunk a rank sends at step ``s+1`` is
the one it received at step ``s``, so segment ``j`` is forwarded as soon as
it has arrived (and, in the reduce-scatter, been added), while segment
``j+1`` is still on the wire: the link never waits for a whole chunk's
arithmetic, and a slow hop delays one segment, not the whole step. This is
how NCCL's ring works; without it the ring reached ~0.7-0.8 of a 1 Gbit/s
link on the emulated cluster. Messages between two ranks match in posting
order, which both sides keep monotone in (step, segment) within each phase;
the two phases use two tags (``tag`` and ``tag + 1``).

How the ring waits for a message is the caller's (``WAITS``): ``block``,
``Handle.wait``, by default (Open MPI busy-polls inside it;
COMMBENCH_RING_WAIT=poll changes the default, for measuring); ``poll``
tests the handle between short sleeps, so a background ring leaves the
cores to compute (``commbench.comm.engine``). ``ring_steps`` is the same ring
as a generator of the messages it waits for, so a caller can advance it
between other work on one thread (the two-level pipeline in
``commbench.comm.hierarchical``).

Any dtype the communicator can move works (float32, float16, bfloat16): the
scratch buffer has the tensor's dtype and the additions are torch's, so a
2-byte tensor stays 2 bytes per element on the wire.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Callable

import torch

from commbench import dilation
from commbench.comm.base import Communicator, Handle
from commbench.comm.phases import PhaseHook, Phases
from commbench.polling import POLL_FIRST_S, POLL_S, SEGMENT_BYTES


def chunk_bounds(n: int, p: int) -> list[tuple[int, int]]:
    """Split ``n`` elements into ``p`` contiguous chunks whose sizes differ by at most one."""
    base, extra = divmod(n, p)
    bounds, start = [], 0
    for i in range(p):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def chunk_counts(n: int, p: int) -> list[int]:
    """The sizes of ``chunk_bounds(n, p)``'s chunks: a v-collective's counts (the first
    ``n % p`` one larger, the last ones empty where ``n < p``)."""
    return [b - a for a, b in chunk_bounds(n, p)]


def offsets(counts: list[int]) -> list[int]:
    """Where each part starts in a tensor of consecutive parts of ``counts`` elements (an
    MPI v-collective's displacements)."""
    return list(itertools.accumulate(counts, initial=0))[:-1]


RING_PHASES = ("reduce_scatter", "allgather")


def block(h: Handle) -> None:
    """Wait for ``h`` inside the library (Open MPI busy-polls a core meanwhile)."""
    h.wait()


def poll(h: Handle, poll_s: float = POLL_S) -> None:
    """Wait for ``h`` by testing it between sleeps, leaving the core free: the first sleep
    ``POLL_FIRST_S`` (at most ``poll_s``), each next one twice the last, at most ``poll_s``."""
    sleep_s = min(POLL_FIRST_S, poll_s)
    while not h.test():
        dilation.sleep(sleep_s)
        sleep_s = min(2 * sleep_s, poll_s)


WAITS: dict[str, Callable[[Handle], None]] = {"block": block, "poll": poll}
DEFAULT_WAIT = WAITS[os.environ.get("COMMBENCH_RING_WAIT", "block")]


def ring_allreduce(comm: Communicator, tensor: torch.Tensor, tag: int = 7,
                   segment_bytes: int = SEGMENT_BYTES,
                   on_phase: PhaseHook | None = None,
                   wait: Callable[[Handle], None] | None = None) -> None:
    """Sum ``tensor`` over ``comm``'s ranks in place with a pipelined ring.

    ``on_phase`` is told of each of ``RING_PHASES`` as it ends; ``wait(handle)``
    completes one message (default: ``handle.wait()``).
    """
    wait = DEFAULT_WAIT if wait is None else wait
    for h in ring_steps(comm, tensor, tag, segment_bytes, on_phase):
        wait(h)


def ring_steps(comm: Communicator, tensor: torch.Tensor, tag: int = 7,
               segment_bytes: int = SEGMENT_BYTES,
               on_phase: PhaseHook | None = None) -> Iterator[Handle]:
    """``ring_allreduce`` as a generator: it yields each message it must see complete
    before it goes on, and the caller resumes it once that message has (by waiting, or
    by testing it between other work: the two-level pipeline runs a ring and its node's
    collectives on one thread this way)."""
    p, r = comm.size, comm.rank
    if p == 1:
        return
    phases = Phases(on_phase)
    flat = tensor.view(-1)
    bounds = chunk_bounds(flat.numel(), p)
    seg = max(1, segment_bytes // flat.element_size())
    right, left = (r + 1) % p, (r - 1) % p

    def segments(c: int) -> list[tuple[int, int]]:
        a, b = bounds[c % p]
        return [(x, min(x + seg, b)) for x in range(a, b, seg)]

    # The all-gather's messages carry their own tag, so its receives can be posted while
    # reduce-scatter messages from the same neighbour are still arriving, and its first send
    # leaves as soon as this rank's chunk is reduced: no rank waits for its last
    # reduce-scatter sends before the all-gather starts (that barrier idled the cross-node
    # link for a round trip at every phase change).
    ag_tag = tag + 1
    rs_sends: list[list[Handle]] = []  # by step: the sends that read chunk r - step

    # Reduce-scatter: one chunk of scratch, segment j of every step lands in slot j.
    scratch = torch.empty(bounds[0][1] - bounds[0][0], dtype=flat.dtype)

    def slot(j: int, a: int, b: int) -> torch.Tensor:
        return scratch[j * seg: j * seg + (b - a)]

    rs_sends.append([comm.isend(flat[a:b], right, tag) for a, b in segments(r)])
    recvs = [comm.irecv(slot(j, a, b), left, tag) for j, (a, b) in enumerate(segments(r - 1))]
    for s in range(p - 1):
        cur, nxt = segments(r - s - 1), segments(r - s - 2)
        last = s == p - 2
        nxt_recvs: list[Handle] = []
        forwarded: list[Handle] = []
        for j, (a, b) in enumerate(cur):
            yield recvs[j]
            flat[a:b].add_(slot(j, a, b))
            if not last:
                forwarded.append(comm.isend(flat[a:b], right, tag))  # forward at once
                if j < len(nxt):  # slot j is free again: post the next step's segment j
                    na, nb = nxt[j]
                    nxt_recvs.append(comm.irecv(slot(j, na, nb), left, tag))
        if not last:
            rs_sends.append(forwarded)
            nxt_recvs += [comm.irecv(slot(j, a, b), left, tag)
                          for j, (a, b) in enumerate(nxt) if j >= len(cur)]
            recvs = nxt_recvs
    phases.end("reduce_scatter")

    # All-gather: send the reduced chunk r + 1 at once (no reduce-scatter send reads it);
    # receive chunk r - s straight into place once the reduce-scatter sends that read it
    # are done, and forward each segment as it lands.
    sends = [comm.isend(flat[a:b], right, ag_tag) for a, b in segments(r + 1)]
    steps = [segments(r - s) for s in range(p - 1)]
    recvs_by_step: list[list[Handle]] = []

    def post(s: int) -> Iterator[Handle]:  # step s's receives, two steps ahead of their data
        if s < len(steps):
            yield from rs_sends[s]
            recvs_by_step.append([comm.irecv(flat[a:b], left, ag_tag) for a, b in steps[s]])

    yield from post(0)
    yield from post(1)
    for s, segs in enumerate(steps):
        yield from post(s + 2)
        for (a, b), h in zip(segs, recvs_by_step[s]):
            yield h
            if s < p - 2:
                sends.append(comm.isend(flat[a:b], right, ag_tag))
    for h in sends:
        yield h
    phases.end("allgather")
