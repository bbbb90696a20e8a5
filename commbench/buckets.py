"""DDP's bucket rule, on byte counts only: which gradients share a bucket.

Only the standard library, so the analysis's cost model (``analysis.overlap``)
forms buckets with the very rule the bucketed strategy runs, without torch.
"""

from __future__ import annotations

from collections.abc import Sequence

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
