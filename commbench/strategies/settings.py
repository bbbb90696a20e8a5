"""What every strategy's settings share: the common settings class, and the engine's.

Each strategy owns a frozen settings class, registered beside it
(``commbench.strategies.SETTINGS``): ``flat`` and ``hierarchical``
``FlatSettings``, ``bucketed`` ``BucketedSettings``, ``async``
``AsyncSettings``, ``ddp`` ``DDPSettings``, ``horovod`` ``HorovodSettings``,
``zero1`` ``Zero1Settings`` and ``zero2`` ``Zero2Settings`` (``ZeroSettings``),
``zero3`` ``Zero3Settings``.
Each derives from ``CommonSettings``, which holds what every strategy reads
(``algo``, ``compression``, ``accum_steps``, ``broadcast_buffers``), as a DDP
comm hook's state holds only what its hook needs.

Each flag of ``commbench.allreduce`` that sets a strategy is declared once,
on the field it sets (``commbench.flags.flag``): ``--bucket-mb`` is
``BucketedSettings.bucket_mb``, with its one default; a strategy that reads
the same flag takes the field with ``flags.same_flag`` (DDP's ``bucket_mb``),
and ``--transfer`` is declared here, on ``EngineSettings``, the base of the
two strategies that run a transfer engine. The tool adds these flags to its
parser from the fields (``commbench.strategies.Sync``).

Each value is checked once, when a settings object is made: a ValueError
names the flag. A settings class also says what the tool needs to know of it
without naming strategies: the transfer path its engine runs
(``engine_transfer``), what a job of so many steps cannot run
(``check_steps``), and notes on how to read its figures (``notes``). What
depends on the communicator (a ring needs point-to-point messages) is checked
by the strategy's ``check``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from commbench.comm.engine import DEFAULT_TRANSFER_PATH, TRANSFER_CHOICES
from commbench.flags import field_flags, flag, positive_int

#: ``--compression``: the dtype gradients travel in (None: their own), cast before the
#: all-reduce and back after, as ``hvd.Compression.fp16`` does.
COMPRESSIONS: dict[str, torch.dtype | None] = {
    "none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def check_choice(name: str, value: object, choices) -> None:
    """ValueError naming ``--name`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"--{name.replace('_', '-')} must be one of {', '.join(choices)}, "
                         f"got {value!r}")


def check_int(name: str, value: object, least: int) -> None:
    """ValueError naming ``--name`` unless ``value`` is an integer >= ``least``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"--{name.replace('_', '-')} must be an integer >= {least}, "
                         f"got {value!r}")


@dataclass(frozen=True)
class CommonSettings:
    """What every strategy is built with, besides the communicator and the gradients.

    Args:
        algo: the all-reduce a fusing strategy runs (``commbench.comm.algos.ALGOS``),
            one of ``--algo`` per run.
        compression: the dtype gradients travel in.
        accum_steps: micro-batches per step, synchronised once (Horovod's
            ``backward_passes_per_step``).
        broadcast_buffers: model buffers follow ``--buffers broadcast`` (DDP's
            ``broadcast_buffers``), per run.
    """

    algo: str = "native"
    compression: str = flag(
        "--compression", default="none", choices=tuple(COMPRESSIONS),
        help="cast gradients to this dtype for the all-reduce and back after "
             "(hvd.Compression.fp16)")
    accum_steps: int = flag(
        "--accum-steps", default=1, metavar="K", type=positive_int,
        help="gradient accumulation: K micro-batches per step, synchronised once (Horovod's "
             "backward_passes_per_step)")
    broadcast_buffers: bool = True

    def __post_init__(self) -> None:
        check_choice("compression", self.compression, COMPRESSIONS)
        check_int("accum_steps", self.accum_steps, 1)

    @classmethod
    def flag_fields(cls) -> tuple[str, ...]:
        """The fields a flag sets: the flags that apply to this class's strategies."""
        return tuple(f.name for f, _ in field_flags(cls))

    @property
    def engine_transfer(self) -> str | None:
        """The ``--transfer`` path the strategy's transfer engine runs (``auto`` included),
        None where it runs no engine: the communicator must offer it."""
        return None

    def check_steps(self, steps: int) -> None:  # noqa: B027 - most settings fit any job
        """Raise ValueError, naming the flag, where a run of ``steps`` measured steps
        cannot apply these settings."""

    def notes(self, warmup: int) -> list[str]:
        """Lines for the table's footer on how to read a run after ``warmup`` warm-up
        steps under these settings (none by default)."""
        return []


@dataclass(frozen=True)
class EngineSettings(CommonSettings):
    """The settings of a strategy that runs its all-reduces on a transfer engine
    (``commbench.comm.engine``): ``bucketed`` (``--progress thread``) and ``async``.

    Args:
        transfer: the engine's path, ``thread``, ``ring``, ``hier`` or ``auto`` (each
            strategy's own where the backend has it).
    """

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

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("transfer", self.transfer, TRANSFER_CHOICES)

    @property
    def engine_transfer(self) -> str | None:
        return self.transfer
