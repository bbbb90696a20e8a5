"""Bucketed all-reduce, DDP-style: buckets reduced while backward still runs.

1. Once, from the gradients' shapes and the order backward produces them,
   group the gradients into buckets of at most ``bucket_mb`` MB (MB = 2**20
   bytes, as DDP's ``bucket_cap_mb``). A tensor larger than the cap gets a
   bucket of its own; ``bucket_mb=0`` gives one bucket per tensor. Each
   bucket owns a flat buffer.
2. As backward produces gradient ``i`` (``on_ready``), copy it into its
   bucket's buffer (DDP copies too when gradients are not views of its
   buckets; here the workload owns the gradient tensors).
3. When a bucket's last gradient is in, start its non-blocking all-reduce
   (``comm.iallreduce``), but never before every earlier bucket's: all ranks
   then issue their collectives in the same order whatever order their
   gradients arrive in (MPI matches collectives by issue order; DDP has the
   same rule).
4. While compute runs, ``progress`` tests the handles in flight: Open MPI
   advances a non-blocking collective only inside MPI calls (DESIGN.md §8).
   Horovod progresses on its own thread; the test only observes.
5. A bucket that ``progress`` sees complete is divided by the rank count
   into its gradients at once, while backward still runs (DDP divides in its
   hook too; with ``gradient_as_bucket_view`` it needs no copy at all).
   ``finish`` waits for the rest, then unpacks them.

Comm time is what was really in flight: each bucket from its issue to the
moment its handle was first seen complete (a test in ``progress`` or the wait
in ``finish``), so with polling every 0.5 ms an end is late by at most that.
Exposed sync (step - compute) and overlap (1 - exposed/comm) follow.

Differences from DDP (Li et al., VLDB 2020, https://arxiv.org/abs/2006.15704):
caps are upper bounds here (DDP closes a bucket once it reaches the cap and
makes its first bucket 1 MiB); buckets stay as built from the order given at
construction (DDP rebuilds them once from the order of the first iteration);
the mean is taken after the sum, as ``flat`` does, not by pre-dividing.

Args:
    comm: the communicator.
    grads: gradient tensors in parameter order.
    bucket_mb: bucket cap in MB (2**20 bytes); 0 = one all-reduce per tensor.
    backward_order: indices of ``grads`` in the order backward produces them
        (default: reverse parameter order, as DDP assumes). Must be the same
        on every rank.

Example::

    mpirun -np 4 python -m commbench.allreduce --strategy flat,bucketed --algo native \\
        --bucket-mb 25 --compute-ms 300
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from commbench.comm.base import Communicator, Handle
from commbench.strategies.base import Strategy
from commbench.timing import NullTimer, StepTimer

MB = 2**20  # DDP's bucket_cap_mb unit
DEFAULT_BUCKET_MB = 25.0  # DDP's default bucket_cap_mb


def assign_buckets(nbytes: Sequence[int], order: Sequence[int], cap_bytes: float,
                   dtypes: Sequence[torch.dtype] | None = None) -> list[list[int]]:
    """Group tensor indices, taken in ``order``, into buckets of at most ``cap_bytes``.

    A tensor is added to the open bucket if the bucket stays within the cap
    (and holds the same dtype); otherwise the bucket is closed and the tensor
    opens the next one, alone if it exceeds the cap by itself. ``cap_bytes=0``
    gives one bucket per tensor.
    """
    if sorted(order) != list(range(len(nbytes))):
        raise ValueError("backward order must name every gradient exactly once")
    buckets: list[list[int]] = []
    size = 0
    for i in order:
        fits = buckets and size + nbytes[i] <= cap_bytes and (
            dtypes is None or dtypes[i] == dtypes[buckets[-1][0]])
        if fits:
            buckets[-1].append(i)
            size += nbytes[i]
        else:
            buckets.append([i])
            size = nbytes[i]
    return buckets


class _Bucket:
    __slots__ = ("indices", "buffer", "views", "nbytes", "pending", "handle", "start")

    def __init__(self, indices: list[int], grads: Sequence[torch.Tensor]) -> None:
        self.indices = indices
        self.buffer = torch.empty(sum(grads[i].numel() for i in indices),
                                  dtype=grads[indices[0]].dtype)
        self.views: dict[int, torch.Tensor] = {}
        offset = 0
        for i in indices:
            n = grads[i].numel()
            self.views[i] = self.buffer[offset:offset + n].view_as(grads[i])
            offset += n
        self.nbytes = self.buffer.numel() * self.buffer.element_size()
        self.pending: set[int] = set()
        self.handle: Handle | None = None
        self.start = 0.0


class BucketedStrategy(Strategy):
    name = "bucketed"

    def __init__(self, comm: Communicator, grads: Sequence[torch.Tensor],
                 bucket_mb: float = DEFAULT_BUCKET_MB,
                 backward_order: Sequence[int] | None = None) -> None:
        super().__init__(comm, grads)
        if not bucket_mb >= 0 or bucket_mb == float("inf"):
            raise ValueError(f"--bucket-mb must be a finite number >= 0, got {bucket_mb}")
        self.bucket_mb = float(bucket_mb)
        order = list(backward_order) if backward_order is not None else \
            list(reversed(range(len(self.grads))))
        groups = assign_buckets([g.numel() * g.element_size() for g in self.grads], order,
                                self.bucket_mb * MB, [g.dtype for g in self.grads])
        self.buckets = [_Bucket(idx, self.grads) for idx in groups]
        self._bucket_of = {i: b for b, bucket in enumerate(self.buckets) for i in bucket.indices}
        self._next = 0  # first bucket not yet started; buckets start strictly in order
        self._in_flight: list[_Bucket] = []
        self.progress = self._progress
        self.begin_step(self.timer)

    def begin_step(self, timer: StepTimer | NullTimer) -> None:
        super().begin_step(timer)
        if self._in_flight or self._next not in (0, len(self.buckets)):
            raise RuntimeError("bucketed: a step began before the previous one finished")
        for b in self.buckets:
            b.pending = set(b.indices)
            b.handle = None
        self._next = 0

    def on_ready(self, i: int) -> None:
        bucket = self.buckets[self._bucket_of[i]]
        if i not in bucket.pending:
            raise RuntimeError(f"bucketed: gradient {i} announced twice in one step")
        bucket.views[i].copy_(self.grads[i])
        bucket.pending.discard(i)
        if not bucket.pending:
            self._start_ready_buckets()

    def _start_ready_buckets(self) -> None:
        """Start every bucket that is full and has no unstarted bucket before it."""
        while self._next < len(self.buckets) and not self.buckets[self._next].pending:
            b = self.buckets[self._next]
            b.start = self.timer.clock()
            b.handle = self.comm.iallreduce(b.buffer)
            self._in_flight.append(b)
            self._next += 1

    def _poll(self) -> list[_Bucket]:
        """Test every bucket in flight; record the end of those seen complete; return them."""
        done, still = [], []
        for b in self._in_flight:
            if b.handle.test():
                self.timer.comm(b.start, self.timer.clock(), b.nbytes)
                done.append(b)
            else:
                still.append(b)
        self._in_flight = still
        return done

    def _progress(self) -> None:
        """Drive the buckets in flight; unpack those that completed."""
        if self._in_flight:
            for b in self._poll():
                self._unpack(b)

    def _unpack(self, b: _Bucket) -> None:
        """Write the bucket's mean into its gradients (final: backward is done with them).

        Division and copy in one pass.
        """
        for i, v in b.views.items():
            torch.div(v, self.comm.size, out=self.grads[i])

    def finish(self) -> None:
        # Gradients never announced (a workload that skips on_ready) are taken as they are.
        for b in self.buckets[self._next:]:
            for i in list(b.pending):
                b.views[i].copy_(self.grads[i])
            b.pending.clear()
        self._start_ready_buckets()
        # Complete everything before unpacking: host work here would stall the
        # transfers still in flight, which advance only inside MPI calls.
        done: list[_Bucket] = []
        while self._in_flight:
            done += self._poll()  # those already complete end now, not after a wait
            if self._in_flight:
                b = self._in_flight.pop(0)
                b.handle.wait()
                self.timer.comm(b.start, self.timer.clock(), b.nbytes)
                done.append(b)
        for b in done:
            self._unpack(b)

    def knobs(self) -> dict:
        return {"bucket_mb": self.bucket_mb, "buckets": len(self.buckets),
                "bucket_bytes": [b.nbytes for b in self.buckets],
                "collective": "iallreduce"}
