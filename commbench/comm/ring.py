"""The project's own ring all-reduce on point-to-point messages.

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

Each rank sends and receives ``2(p-1)/p`` of the tensor in ``2(p-1)`` messages.
Any dtype the communicator can move works (float32, float16, bfloat16): the
scratch buffer has the tensor's dtype and the additions are torch's, so a
2-byte tensor stays 2 bytes per element on the wire.
"""

from __future__ import annotations

import torch

from commbench.comm.base import Communicator


def chunk_bounds(n: int, p: int) -> list[tuple[int, int]]:
    """Split ``n`` elements into ``p`` contiguous chunks whose sizes differ by at most one."""
    base, extra = divmod(n, p)
    bounds, start = [], 0
    for i in range(p):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def ring_allreduce(comm: Communicator, tensor: torch.Tensor, tag: int = 7) -> None:
    """Sum ``tensor`` over ``comm``'s ranks in place with a ring of sendrecv calls."""
    p, r = comm.size, comm.rank
    if p == 1:
        return
    flat = tensor.view(-1)
    bounds = chunk_bounds(flat.numel(), p)
    scratch = torch.empty(bounds[0][1] - bounds[0][0], dtype=flat.dtype)
    right, left = (r + 1) % p, (r - 1) % p

    def chunk(i: int) -> torch.Tensor:
        a, b = bounds[i % p]
        return flat[a:b]

    for s in range(p - 1):
        incoming = chunk(r - s - 1)
        buf = scratch[: incoming.numel()]
        comm.sendrecv(chunk(r - s), right, buf, left, tag)
        incoming.add_(buf)
    for s in range(p - 1):
        comm.sendrecv(chunk(r + 1 - s), right, chunk(r - s), left, tag)
