"""The formulas of the metrics (docs/metrics.md, "Definitions"), written once.

Every figure commbench prints or records comes from these functions, so a
number in a table, a record and a plot always means the same thing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

# GB/s as nccl-tests reports it: 1e9 bytes per second.
GB = 1e9


def busbw_factor(op: str, n: int) -> float:
    """Bus-bandwidth correction for ``op`` on ``n`` ranks (nccl-tests doc/PERFORMANCE.md).

    For all-reduce every rank must send and receive ``2(n-1)/n`` of the data
    however the algorithm is built, so ``busbw = algbw * 2(n-1)/n`` is
    comparable with the link's bandwidth.
    """
    if n < 1:
        raise ValueError(f"rank count must be >= 1, got {n}")
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op in ("reduce_scatter", "allgather"):
        return (n - 1) / n
    if op in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    raise ValueError(f"no busbw factor for {op!r}")


def ring_bytes(nbytes: float, n: int) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce of ``nbytes`` on ``n``
    ranks: reduce-scatter then all-gather, ``n - 1`` chunks of ``nbytes / n`` each, so
    ``2(n-1)/n * nbytes`` (Patarasuk & Yuan 2009; the all-reduce's busbw factor). With the
    ranks of one node in a row of the ring, it is also what each node link carries."""
    return busbw_factor("allreduce", n) * nbytes


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: bytes of the buffer over the time of the operation."""
    if seconds <= 0:
        return math.nan
    return nbytes / seconds / GB


def busbw(nbytes: float, seconds: float, n: int, op: str = "allreduce") -> float:
    """Bus bandwidth in GB/s: algbw times the op's factor for ``n`` ranks."""
    return algbw(nbytes, seconds) * busbw_factor(op, n)


def exposed_sync(step_s: float, compute_s: float) -> float:
    """Time of the step spent waiting for gradients that compute did not hide."""
    return max(0.0, step_s - compute_s)


def sync_share(exposed_s: float, step_s: float) -> float:
    """Exposed sync as a fraction of the step: the headline number."""
    return exposed_s / step_s if step_s > 0 else math.nan


def overlap(exposed_s: float, comm_s: float) -> float:
    """1 - exposed/comm: the fraction of communication compute hid (1 = all hidden)."""
    if comm_s <= 0:
        return math.nan
    return 1.0 - exposed_s / comm_s


def throughput(samples: float, seconds: float) -> float | None:
    """Samples per second; None for an empty interval."""
    return samples / seconds if seconds > 0 else None


def scaling_efficiency(throughput_n: float, n: int, throughput_1: float) -> float:
    """throughput(n) / (n * throughput(1))."""
    return throughput_n / (n * throughput_1) if throughput_1 > 0 and n > 0 else math.nan


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping ``(start, end)`` intervals."""
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` in [0, 100] (numpy's default method)."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Median, p5, p95, min, max and count of ``values``."""
    return {
        "median": percentile(values, 50),
        "p5": percentile(values, 5),
        "p95": percentile(values, 95),
        "min": min(values) if values else math.nan,
        "max": max(values) if values else math.nan,
        "count": len(values),
    }
