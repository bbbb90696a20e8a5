"""The settings every strategy is built from: one typed, frozen record, and its flags.

Every strategy's constructor takes the same ``StrategySettings`` and reads
the fields that concern it (``flat`` its ``algo``, ``bucketed`` its bucket
caps, ``async`` its staleness, ...); the others leave the rest alone, as a
DDP comm hook's state ignores what another hook needs.

Each flag of ``commbench.allreduce`` that sets a strategy is declared here,
on the field it sets (``commbench.flags.flag``): ``--bucket-mb`` is
``bucket_mb``, with its one default. The tool adds these flags to its parser
from the fields and builds the record from the parsed values by field name,
so a new strategy setting is one field here and the code that reads it.

Each value is checked once, here, when the record is made: a ValueError
names the flag. What depends on the communicator (a ring needs
point-to-point messages) is checked by the strategy's ``check``.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace

import torch

from commbench.buckets import AUTO, DEFAULT_BUCKET_MB, FIRST_BUCKET_MB, parse_bucket_mb
from commbench.comm.engine import DEFAULT_TRANSFER_PATH, TRANSFER_CHOICES
from commbench.flags import flag, nonneg_float, nonneg_int, positive_int

#: ``--compression``: the dtype gradients travel in (None: their own), cast before the
#: all-reduce and back after, as ``hvd.Compression.fp16`` does.
COMPRESSIONS: dict[str, torch.dtype | None] = {
    "none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def bucket_mb_arg(text: str) -> float | str:
    """``--bucket-mb``'s argparse type: MB >= 0, or ``auto``."""
    try:
        return parse_bucket_mb(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--bucket-mb: ")) from None


#: ``--progress``: how bucketed's all-reduces advance while backward computes
PROGRESS = ("poll", "thread")


@dataclass(frozen=True)
class StrategySettings:
    """What a strategy is built with, besides the communicator and the gradients.

    Args:
        algo: the all-reduce a fusing strategy runs (``commbench.comm.algos.ALGOS``),
            one of ``--algo`` per run; ``async`` takes only ``native``.
        compression: the dtype gradients travel in (every strategy).
        bucket_mb: bucketed's and DDP's cap in MB; 0 = per tensor.
        first_bucket_mb: bucketed's first bucket's cap.
        progress: bucketed's ``thread`` (transfer engine) or ``poll``.
        transfer: the transfer engine's path, ``thread``, ``ring`` or ``auto`` (each
            strategy's own where the backend has it)
            (async; bucketed with ``progress="thread"``).
        staleness: async's s >= 0.
        staleness_lr: async scales applied gradients by 1/s.
        staleness_warmup: async's synchronous first steps.
        accum_steps: Horovod's ``backward_passes_per_step``.
        broadcast_buffers: DDP's ``broadcast_buffers`` (``--buffers broadcast``), per run.

    Example::

        make_strategy("bucketed", comm, grads, StrategySettings(bucket_mb=5))
    """

    algo: str = "native"
    compression: str = flag(
        "--compression", default="none", choices=tuple(COMPRESSIONS),
        help="cast gradients to this dtype for the all-reduce and back after "
             "(hvd.Compression.fp16)")
    bucket_mb: float | str = flag(
        "--bucket-mb", default=DEFAULT_BUCKET_MB, metavar="MB|auto", type=bucket_mb_arg,
        help="--strategy bucketed and ddp: bucket cap in MB (2**20 bytes, as DDP's "
             "bucket_cap_mb); 0 = one all-reduce per tensor; auto (bucketed): the cap a "
             "probe of the transfer path and the first step's gradient times predict ends "
             "sync soonest (DDP then keeps its default, 25)")
    first_bucket_mb: float = flag(
        "--first-bucket-mb", default=FIRST_BUCKET_MB, metavar="MB", type=nonneg_float,
        help="--strategy bucketed: the first bucket's cap, DDP's 1 MiB by default, so the "
             "first all-reduce starts early in backward")
    progress: str = flag(
        "--progress", default="thread", choices=PROGRESS,
        help="--strategy bucketed: how buckets' all-reduces advance during backward: poll = "
             "MPI non-blocking all-reduce tested from the compute loop, thread = blocking "
             "all-reduces on a comm thread (Horovod's design)")
    transfer: str = flag(
        "--transfer", default=DEFAULT_TRANSFER_PATH, choices=TRANSFER_CHOICES,
        help="--strategy async and bucketed (--progress thread): how the background transfer "
             "engine runs each all-reduce: thread = the backend's blocking all-reduce on its "
             "own thread (Open MPI spins a core while it waits, and its large-message "
             "protocol runs back-to-back buckets at about half the link), ring = the "
             "project's ring on point-to-point messages, tested between sleeps (light on the "
             "CPU; needs point-to-point), hier = the two-level all-reduce (node, ring across "
             "nodes, node: fewer bytes through each node link where nodes hold several "
             "ranks; mpi backend), auto = bucketed on ring and async on thread, each where "
             "the backend has it (else thread)")
    staleness: int = flag(
        "--staleness", default=0, metavar="S", type=nonneg_int,
        help="--strategy async: step t's all-reduce runs while later steps compute and is "
             "applied at step t+S; 0 = synchronous")
    staleness_lr: bool = flag(
        "--staleness-lr", default=False, action="store_true",
        help="--strategy async: scale the learning rate by 1/staleness (Zhang et al. 2016)")
    staleness_warmup: int = flag(
        "--staleness-warmup", default=0, metavar="N", type=nonneg_int,
        help="--strategy async: run the first N steps synchronously, then staleness S")
    accum_steps: int = flag(
        "--accum-steps", default=1, metavar="K", type=positive_int,
        help="gradient accumulation: K micro-batches per step, synchronised once (Horovod's "
             "backward_passes_per_step)")
    broadcast_buffers: bool = True

    def __post_init__(self) -> None:
        for name, choices in (("compression", COMPRESSIONS), ("progress", PROGRESS),
                              ("transfer", TRANSFER_CHOICES)):
            value = getattr(self, name)
            if value not in choices:
                raise ValueError(f"--{name} must be one of {', '.join(choices)}, got {value!r}")
        parse_bucket_mb(self.bucket_mb)  # MB >= 0 or auto
        if not 0 <= self.first_bucket_mb < math.inf:
            raise ValueError(f"--first-bucket-mb must be a finite number >= 0, "
                             f"got {self.first_bucket_mb}")
        for name, least in (("staleness", 0), ("staleness_warmup", 0), ("accum_steps", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= {least}, "
                                 f"got {value!r}")

    @property
    def bucket_cap_mb(self) -> float:
        """A fixed cap: ``bucket_mb``, or DDP's default where it is ``auto`` (which only the
        bucketed strategy resolves, from its probe)."""
        return DEFAULT_BUCKET_MB if self.bucket_mb == AUTO else float(self.bucket_mb)

    def for_run(self, algo: str | None, buffers: str) -> StrategySettings:
        """These settings for one run: its ``--algo`` and its ``--buffers`` rule."""
        return replace(self, algo=algo or "native", broadcast_buffers=buffers == "broadcast")
