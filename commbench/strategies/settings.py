"""The settings every strategy is built from: one typed, frozen record.

Every strategy's constructor takes the same ``StrategySettings`` and reads
the fields that concern it (``flat`` its ``algo``, ``bucketed`` its bucket
caps, ``async`` its staleness, ...); the others leave the rest alone, as a
DDP comm hook's state ignores what another hook needs. The flags of
``commbench.allreduce`` map one to one onto its fields (``--bucket-mb`` ->
``bucket_mb``), so a run's record says which settings it had.

Each strategy checks the fields it reads when it is built and raises a
ValueError that names the flag; a field no strategy of the run reads is not
checked.
"""

from __future__ import annotations

from dataclasses import dataclass

from commbench.comm.engine import DEFAULT_TRANSFER_PATH

#: the unit of ``bucket_mb``: DDP's ``bucket_cap_mb`` counts 2**20 bytes
MB = 2**20
DEFAULT_BUCKET_MB = 25.0  # DDP's default bucket_cap_mb
#: DDP's first bucket (``dist._DEFAULT_FIRST_BUCKET_BYTES``): a 25 MB first bucket kept the
#: link idle until it filled (benchmarks/peer_fairness.py, 2 x 4 at 1 Gbit/s: bucketed / DDP
#: step 1.060 before, 0.945 after, one run each)
FIRST_BUCKET_MB = 1.0


@dataclass(frozen=True)
class StrategySettings:
    """What a strategy is built with, besides the communicator and the gradients.

    Args:
        algo: ``--algo``, the all-reduce a fusing strategy runs (``ALGOS``);
            ``async`` takes only ``native``.
        compression: ``--compression``: ``none``, ``fp16`` or ``bf16``, the dtype
            gradients travel in (every strategy).
        bucket_mb: ``--bucket-mb``: bucketed's and DDP's cap in MB; 0 = per tensor.
        first_bucket_mb: ``--first-bucket-mb``: bucketed's first bucket's cap.
        progress: ``--progress``: bucketed's ``thread`` (transfer engine) or ``poll``.
        transfer: ``--transfer``: the transfer engine's path, ``thread`` or ``ring``
            (async; bucketed with ``progress="thread"``).
        staleness: ``--staleness``: async's s >= 0.
        staleness_lr: ``--staleness-lr``: async scales applied gradients by 1/s.
        staleness_warmup: ``--staleness-warmup``: async's synchronous first steps.
        accum_steps: ``--accum-steps``: Horovod's ``backward_passes_per_step``.
        broadcast_buffers: DDP's ``broadcast_buffers`` (``--buffers broadcast``).

    Example::

        make_strategy("bucketed", comm, grads, StrategySettings(bucket_mb=5))
    """

    algo: str = "native"
    compression: str = "none"
    bucket_mb: float = DEFAULT_BUCKET_MB
    first_bucket_mb: float = FIRST_BUCKET_MB
    progress: str = "thread"
    transfer: str = DEFAULT_TRANSFER_PATH
    staleness: int = 0
    staleness_lr: bool = False
    staleness_warmup: int = 0
    accum_steps: int = 1
    broadcast_buffers: bool = True
