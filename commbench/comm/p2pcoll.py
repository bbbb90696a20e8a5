"""A node's collectives on point-to-point messages, for the one-thread two-level pipeline.

The pipelined two-level all-reduce on one thread (``hierarchical._Interleaved``) runs its
intra-node phases between the ring's messages, testing each between short sleeps. On
Open MPI 4.1 it ran them on the library's non-blocking collectives (libnbc's
``MPI_Ireduce_scatter``, ``MPI_Iallgatherv``, ``MPI_Igatherv``, ``MPI_Ibcast``), and a
node's ranks aborted now and then inside libnbc's progress: "MPI Error in NBC subrequest:
15" (``MPI_ERR_TRUNCATE``), then heap corruption, on 6 ranks as 3 fake nodes of 2, in a
few percent of runs under load and never alone, with one thread and with two. The ring's
own point-to-point messages, tens of thousands of them in the same runs, never failed.
So the intra-node phases run here on the group's ``isend``/``irecv`` as well, nothing
of libnbc in the pipeline:

- reduce-scatter: every rank sends each other rank that rank's part of its tensor, and
  sums the others' copies of its own part as they land (pairwise exchange: each rank
  sends and receives ``(l-1)/l`` of the tensor, against all of it into the root for
  libnbc's binomial reduce then scatter);
- all-gather: every rank sends its part to every other, each part received in place;
- reduce to a root: reduce-scatter, then the parts sent to the root (Rabenseifner's);
- broadcast from a root: the root scatters the parts, then an all-gather (van de Geijn's).

Each is a generator of the messages its caller must see complete before it goes on, as
``ring.ring_steps`` is; ``Steps`` makes one a ``Handle``. The messages of a collective
carry its own tag, and a rank posts its receives in the order its peers send, so a
collective's messages cannot match another's, and those of the same collective on the
next segment match in order (MPI's non-overtaking rule). Parts of zero elements send
nothing (every rank knows every count).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from commbench.comm.base import Group, Handle
from commbench.comm.ring import chunk_counts, offsets

#: each collective's tag (the ring's are 7 and 8)
RS_TAG, AG_TAG, GATHER_TAG, SCATTER_TAG = 11, 12, 13, 14
RING_RS_TAG, RING_AG_TAG = 15, 16


def reduce_scatter_steps(g: Group, flat: torch.Tensor, counts: list[int],
                         part: torch.Tensor) -> Iterator[Handle]:
    """The group's sum of ``flat``, rank ``i``'s part of it (``counts[i]`` elements from
    ``offsets(counts)[i]``) into ``part`` on rank ``i``; ``flat`` is read, not written."""
    r, p = g.rank, g.size
    off = offsets(counts)
    part.copy_(flat[off[r]:off[r] + counts[r]])
    if p == 1:
        return
    sends = [g.isend(flat[off[j]:off[j] + counts[j]], j, RS_TAG)
             for j in ((r + s) % p for s in range(1, p)) if counts[j]]
    if counts[r]:
        scratch = torch.empty(p - 1, counts[r], dtype=flat.dtype)
        recvs = [g.irecv(scratch[s - 1], (r - s) % p, RS_TAG) for s in range(1, p)]
        for s, h in enumerate(recvs):
            yield h
            part.add_(scratch[s])
    yield from sends


def allgather_steps(g: Group, part: torch.Tensor, counts: list[int],
                    out: torch.Tensor) -> Iterator[Handle]:
    """Every rank's ``part`` into its place in ``out`` (``offsets(counts)``) on every rank."""
    r, p = g.rank, g.size
    off = offsets(counts)
    mine = out[off[r]:off[r] + counts[r]]
    if mine.data_ptr() != part.data_ptr():
        mine.copy_(part)
    if p == 1:
        return
    sends = [g.isend(part, (r + s) % p, AG_TAG) for s in range(1, p)] if counts[r] else []
    recvs = [g.irecv(out[off[j]:off[j] + counts[j]], j, AG_TAG)
             for j in ((r - s) % p for s in range(1, p)) if counts[j]]
    yield from recvs
    yield from sends


def ring_reduce_scatter_steps(g: Group, flat: torch.Tensor, counts: list[int],
                              part: torch.Tensor) -> Iterator[Handle]:
    """``reduce_scatter_steps`` as a ring: in ``p - 1`` steps each rank sends its right
    neighbour one part, the sum so far of the part it received the step before (at first
    its own copy), and adds its own copy to the part it receives; the part that ends on
    rank ``r`` is ``r``'s. Each rank sends and receives ``(p-1)/p`` of the tensor, as in the
    pairwise exchange, but to one neighbour only: on ranks placed node by node one
    message a step crosses each node boundary, so a node's link carries ``(n-1)/n`` of the
    tensor, not ``l(N-1)/N`` (the ring all-reduce's first half, ``ring.ring_steps``).
    ``flat`` is read, not written."""
    r, p = g.rank, g.size
    off = offsets(counts)
    piece = lambda j: flat[off[j]:off[j] + counts[j]]  # noqa: E731
    if p == 1:
        part.copy_(piece(r))
        return
    right, left = (r + 1) % p, (r - 1) % p
    sends, acc = [], piece((r - 1) % p)  # what goes right at step 0: this rank's own copy
    for s in range(p - 1):
        out_j, in_j = (r - s - 1) % p, (r - s - 2) % p
        recv = part if s == p - 2 else torch.empty(counts[in_j], dtype=flat.dtype)
        h = g.irecv(recv, left, RING_RS_TAG) if counts[in_j] else None
        if counts[out_j]:
            sends.append((g.isend(acc, right, RING_RS_TAG), acc))
        if h is not None:
            yield h
            recv.add_(piece(in_j))
        acc = recv
    yield from (h for h, _ in sends)


def ring_allgather_steps(g: Group, part: torch.Tensor, counts: list[int],
                         out: torch.Tensor) -> Iterator[Handle]:
    """``allgather_steps`` as a ring: in ``p - 1`` steps each rank passes its right
    neighbour the part it received the step before (at first its own); ``(n-1)/n`` of the
    tensor through each node's link on ranks placed node by node."""
    r, p = g.rank, g.size
    off = offsets(counts)
    piece = lambda j: out[off[j]:off[j] + counts[j]]  # noqa: E731
    mine = piece(r)
    if mine.data_ptr() != part.data_ptr():
        mine.copy_(part)
    if p == 1:
        return
    right, left = (r + 1) % p, (r - 1) % p
    sends = []
    for s in range(p - 1):
        out_j, in_j = (r - s) % p, (r - s - 1) % p
        h = g.irecv(piece(in_j), left, RING_AG_TAG) if counts[in_j] else None
        if counts[out_j]:
            sends.append(g.isend(piece(out_j), right, RING_AG_TAG))
        if h is not None:
            yield h
    yield from sends


def reduce_scatter_by(algo: str, g: Group, flat: torch.Tensor,
                      counts: list[int]) -> torch.Tensor:
    """Blocking: this rank's part of the group's sum of ``flat``, by the backend's
    ``reduce_scatter_v`` (``algo`` ``native``) or the ring (``ring``)."""
    if algo != "ring":
        return g.reduce_scatter_v(flat, counts)
    part = torch.empty(counts[g.rank], dtype=flat.dtype)
    Steps(ring_reduce_scatter_steps(g, flat, counts, part)).wait()
    return part


def allgather_by(algo: str, g: Group, part: torch.Tensor, counts: list[int],
                 out: torch.Tensor) -> None:
    """Blocking: every rank's ``part`` into ``out``, by the backend's ``allgather_v``
    (``native``) or the ring (``ring``)."""
    if algo == "ring":
        Steps(ring_allgather_steps(g, part, counts, out)).wait()
    else:
        g.allgather_v(part, counts, out)


def reduce_steps(g: Group, flat: torch.Tensor, root: int = 0) -> Iterator[Handle]:
    """The group's sum of ``flat`` into ``flat`` on ``root`` (the others' ``flat`` is left
    as it was): a reduce-scatter, then every part sent to the root."""
    r, p = g.rank, g.size
    counts = chunk_counts(flat.numel(), p)
    off = offsets(counts)
    part = torch.empty(counts[r], dtype=flat.dtype)
    yield from reduce_scatter_steps(g, flat, counts, part)
    if r == root:
        flat[off[r]:off[r] + counts[r]].copy_(part)
        yield from [g.irecv(flat[off[j]:off[j] + counts[j]], j, GATHER_TAG)
                    for j in range(p) if j != root and counts[j]]
    elif counts[r]:
        yield g.isend(part, root, GATHER_TAG)


def bcast_steps(g: Group, flat: torch.Tensor, root: int = 0) -> Iterator[Handle]:
    """``root``'s ``flat`` into every rank's: the root scatters the parts, then an
    all-gather."""
    r, p = g.rank, g.size
    counts = chunk_counts(flat.numel(), p)
    off = offsets(counts)
    mine = flat[off[r]:off[r] + counts[r]]
    if r == root:
        sends = [g.isend(flat[off[j]:off[j] + counts[j]], j, SCATTER_TAG)
                 for j in range(p) if j != root and counts[j]]
        yield from sends
    elif counts[r]:
        yield g.irecv(mine, root, SCATTER_TAG)
    yield from allgather_steps(g, mine, counts, flat)


class Steps(Handle):
    """A generator of messages (``reduce_scatter_steps`` and the others) as one handle:
    ``test`` moves it on past every message already complete, ``wait`` waits for each."""

    __slots__ = ("_gen", "_msg", "_done")

    def __init__(self, gen: Iterator[Handle]) -> None:
        self._gen = gen
        self._msg: Handle | None = None
        self._done = False

    def _next(self) -> None:
        self._msg = next(self._gen, None)
        self._done = self._msg is None

    def test(self) -> bool:
        while not self._done and (self._msg is None or self._msg.test()):
            self._next()
        return self._done

    def wait(self) -> None:
        while not self._done:
            if self._msg is not None:
                self._msg.wait()
            self._next()
