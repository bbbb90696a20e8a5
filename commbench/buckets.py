"""DDP's bucket rule, on byte counts only: which gradients share a bucket.

Only the standard library, so the analysis's cost model (``analysis.overlap``)
forms buckets with the very rule the bucketed strategy runs, without torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

#: the unit of ``--bucket-mb``: DDP's ``bucket_cap_mb`` counts 2**20 bytes
MB = 2**20
DEFAULT_BUCKET_MB = 25.0  # DDP's default bucket_cap_mb
#: DDP's first bucket (``dist._DEFAULT_FIRST_BUCKET_BYTES``): a 25 MB first bucket kept the
#: link idle until it filled (benchmarks/peer_fairness.py, 2 x 4 at 1 Gbit/s: bucketed / DDP
#: step 1.060 before, 0.945 after, one run each)
FIRST_BUCKET_MB = 1.0


def assign_buckets(nbytes: Sequence[int], order: Sequence[int], cap_bytes: float,
                   dtypes: Sequence[object] | None = None,
                   first_cap_bytes: float | None = None) -> list[list[int]]:
    """Group tensor indices, taken in ``order``, into buckets of at most ``cap_bytes``.

    A tensor is added to the open bucket if the bucket stays within the cap
    (and holds the same dtype); otherwise the bucket is closed and the tensor
    opens the next one, alone if it exceeds the cap by itself. ``cap_bytes=0``
    gives one bucket per tensor. The first bucket's cap is ``first_cap_bytes``
    where that is smaller (DDP's 1 MiB: the link starts early in backward).
    """
    if sorted(order) != list(range(len(nbytes))):
        raise ValueError("backward order must name every gradient exactly once")
    buckets: list[list[int]] = []
    size = 0
    for i in order:
        cap = cap_bytes if len(buckets) != 1 or first_cap_bytes is None else \
            min(cap_bytes, first_cap_bytes)
        fits = buckets and size + nbytes[i] <= cap and (
            dtypes is None or dtypes[i] == dtypes[buckets[-1][0]])
        if fits:
            buckets[-1].append(i)
            size += nbytes[i]
        else:
            buckets.append([i])
            size = nbytes[i]
    return buckets


#: ``--bucket-mb auto``: the caps it chooses among (MB); the first bucket's cap is the smaller
#: of its own and the cap. Caps below 1 MB split a small gradient: GPT-tiny's 0.48 MB went
#: as one bucket after backward at every cap from 1 MB, 1.33 x Horovod's step on 2 x 1
#: (peer_fairness, K = 4), where Horovod's 1 ms cycle sent it in pieces during backward.
AUTO = "auto"
AUTO_CAPS_MB = (1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2,
                1.0, 2.0, 4.0, 8.0, 16.0, 25.0, 32.0, 64.0, 128.0, 256.0)
#: ``choose_cap``'s tolerance: a share of the best predicted exposed sync, plus a share of
#: backward (so that a best of 0 still admits larger caps that also hide everything)
AUTO_SLACK, AUTO_SLACK_BACKWARD = 0.10, 0.002


def parse_bucket_mb(text: str | float) -> float | str:
    """``--bucket-mb``'s value: a finite number of MB >= 0, or ``auto``."""
    if isinstance(text, str) and text.strip().lower() == AUTO:
        return AUTO
    try:
        mb = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"--bucket-mb: {text!r} is neither a number of MB nor 'auto'") from None
    if not 0 <= mb < float("inf"):
        raise ValueError(f"--bucket-mb must be a finite number >= 0 or 'auto', got {text!r}")
    return mb


def schedule(full_s: Sequence[float], allreduce_s: Sequence[float], backward_s: float, *,
             pickup_s: float = 0.0, handback_s: float = 0.0) -> tuple[list[float], float]:
    """Bucket end times and exposed sync, as the transfer engine serves the buckets.

    The engine (``commbench.comm.engine``) runs one transfer at a time, in order, on one
    thread that waits on its queue when it has nothing to do. Bucket ``k`` is handed to
    it at ``full_s[k]`` and holds the link ``allreduce_s[k]``:

    - submitted while the engine is busy (``full_k < end_{k-1}``), it starts as the one
      before ends: ``start_k = end_{k-1}`` (it is waiting in the queue);
    - submitted to an idle engine, it starts once that thread has woken:
      ``start_k = full_k + pickup_s``;
    - ``end_k = start_k + allreduce_s[k]``.

    The step's thread waits for the last transfer at the end of backward (``finish``):
    where that transfer is still running at ``backward_s``, the thread resumes
    ``handback_s`` after it ends (it is woken by the transfer's event), and exposed sync is
    ``end_last + handback_s - backward_s``; else 0. ``pickup_s`` and ``handback_s`` are the
    host's hand-offs between the two threads, which the probe of a transfer's own time
    (start to end on the engine's thread) leaves out: the tuner measures them
    (``BucketTuner``); 0 gives the link-only schedule.
    """
    if len(full_s) != len(allreduce_s):
        raise ValueError(f"{len(full_s)} bucket ready times but {len(allreduce_s)} durations")
    ends: list[float] = []
    end = -math.inf  # the engine is idle before the first bucket
    for r, t in zip(full_s, allreduce_s):
        end = (end if r < end else r + pickup_s) + t
        ends.append(end)
    if not ends or ends[-1] <= backward_s:
        return ends, 0.0
    return ends, ends[-1] + handback_s - backward_s


def choose_cap(nbytes: Sequence[int], order: Sequence[int], ready_s: Sequence[float],
               cost: Callable[[float], float], first_cap_bytes: float | None = None,
               dtypes: Sequence[object] | None = None,
               caps_mb: Sequence[float] = AUTO_CAPS_MB, *,
               pickup_s: float = 0.0, handback_s: float = 0.0
               ) -> tuple[float, dict[float, float]]:
    """The cap (MB) whose buckets end the all-reduce soonest after backward, and each
    candidate's predicted exposed sync (s).

    Gradient ``i`` is ready at ``ready_s[i]`` (any common origin: one step's stamps); a
    bucket of ``b`` bytes holds the link ``cost(b)`` seconds (``ProbeCost``: measured on
    this job's ranks); buckets run one at a time in order, with the engine's hand-offs
    ``pickup_s`` and ``handback_s`` (``schedule``). Smaller caps start the link earlier;
    each bucket pays the path's latency. Among caps whose
    exposed sync is within ``AUTO_SLACK`` of the best (+ ``AUTO_SLACK_BACKWARD`` of
    backward) the largest wins: fewer collectives, less host work per step and less
    latency in the comm time, for a predicted loss below the model's own error
    (peer_fairness, ResNet-18 on 2 x 2: 118 ms predicted, 124 ms measured; ResNet-101 on
    2 x 2: 333 ms predicted, 425 measured). A tolerance of 2 % of backward + exposed
    chose 25 MB for ResNet-101 on 2 x 2 where 8 MB was predicted 14 % better.
    """
    if len(ready_s) != len(nbytes):
        raise ValueError(f"{len(ready_s)} ready times for {len(nbytes)} gradients")
    if not caps_mb:
        raise ValueError("no candidate caps")
    backward = max(ready_s, default=0.0)
    exposed: dict[float, float] = {}
    for cap in caps_mb:
        groups = assign_buckets(nbytes, order, cap * MB, dtypes, first_cap_bytes)
        full = [max(ready_s[i] for i in g) for g in groups]
        times = [cost(sum(nbytes[i] for i in g)) for g in groups]
        exposed[cap] = schedule(full, times, backward, pickup_s=pickup_s,
                                handback_s=handback_s)[1]
    best = min(exposed.values())
    slack = AUTO_SLACK * best + AUTO_SLACK_BACKWARD * backward + 1e-9
    return max(c for c, e in exposed.items() if e <= best + slack), exposed


class ProbeCost:
    """Seconds one all-reduce of ``b`` bytes takes on a path, from probes at a few sizes:
    the fastest time at each size (a transfer slowed once by something else on the
    ranks' cores says nothing of the path), made non-decreasing in size, joined by
    straight lines; below the smallest size its time (the path's latency), above the
    largest the last segment's slope.

    Not one line through all the probes: fitted by least squares, latency + bytes / rate
    is set by the largest sizes: on 2 x 2 ranks it priced 64 KiB on Open MPI's all-reduce
    at 1.03 ms, where the probe took 0.13 (the ring's 0.86), and auto put GPT-tiny's
    64 KiB buckets on the ring, 1.31 x DDP's step (peer_fairness, K = 4), where Open
    MPI's ran them at 0.80.
    """

    def __init__(self, sizes: Sequence[float], seconds: Sequence[float]) -> None:
        if len(sizes) != len(seconds) or len(set(sizes)) < 2:
            raise ValueError("a transfer's cost needs times at two sizes or more")
        fastest = {n: min(t for m, t in zip(sizes, seconds) if m == n) for n in set(sizes)}
        self.points: list[tuple[float, float]] = []
        slowest = 0.0  # so far: a larger size never costs less than a smaller one
        for n in sorted(fastest):
            slowest = max(slowest, fastest[n])
            self.points.append((n, slowest))
        (n0, _), (n1, t1) = self.points[0], self.points[-1]
        if not t1 > self.points[0][1]:
            raise ValueError(f"the times do not grow with size ({n0:g} to {n1:g} bytes)")
        (na, ta) = self.points[-2]
        # s per byte beyond the largest probe: the last segment's, else the whole range's
        self._tail = (t1 - ta) / (n1 - na) if t1 > ta else (t1 - self.points[0][1]) / (n1 - n0)

    def __call__(self, nbytes: float) -> float:
        pts = self.points
        if nbytes <= pts[0][0]:
            return pts[0][1]
        for (na, ta), (nb, tb) in zip(pts, pts[1:]):
            if nbytes <= nb:
                return ta + (tb - ta) * (nbytes - na) / (nb - na)
        return pts[-1][1] + self._tail * (nbytes - pts[-1][0])

    def scaled(self, factor: float) -> Callable[[float], float]:
        """The cost of ``b`` bytes of gradient sent as ``b * factor`` bytes on the wire."""
        return lambda nbytes: self(nbytes * factor)

    def record(self) -> list[list[float]]:
        """The points, as records carry them: ``[[bytes, seconds], ...]``."""
        return [[n, round(t, 6)] for n, t in self.points]
