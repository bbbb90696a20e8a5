"""The interface every synchronisation strategy implements.

A strategy is built once per run from the communicator, the gradient tensors
(in parameter order) and its settings (an instance of its own frozen
``settings_class``, a ``CommonSettings``: ``BucketedSettings`` for bucketed),
plus the order backward produces the gradients and, for the peers that wrap a
model and the ZeRO strategies that step it, the workload. Each step the runner
calls ``begin_step(timer)``; the workload calls ``on_ready(i)`` as gradient
``i`` is produced (backward order) and ``poll()`` while it computes; then the
runner calls ``finish()``, after which every gradient holds the mean over
ranks (the ZeRO strategies have instead stepped the parameters by then, each
rank its shard, and gathered them: the workload's optimizer step is theirs).
Strategies time their collectives on the timer they were given.
After the run (and its validation pass) whoever built the strategy closes it
(``close()``, or ``with make_strategy(...) as strategy:``).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import torch

from commbench.buffers import check_rule
from commbench.comm.algos import check_algo
from commbench.comm.base import Communicator
from commbench.strategies.settings import COMPRESSIONS, CommonSettings
from commbench.timing import NullTimer, StepTimer


def unpack_mean(summed: torch.Tensor, grad: torch.Tensor, ranks: float) -> None:
    """``grad = summed / ranks``, in one pass where both live on one device.

    Buffers stay in host memory (MPI here is not CUDA-aware), so on a GPU the
    mean is copied to the device, then divided there.
    """
    if summed.device == grad.device:
        torch.div(summed, ranks, out=grad)
    else:
        grad.copy_(summed).div_(ranks)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def stall_of(workload: Any) -> Callable[[], contextlib.AbstractContextManager[None]]:
    """The workload's ``stall`` (a wait for sync inside its compute, taken out of the
    phase's compute: ``workloads.base``); a no-op where the workload has none."""
    return getattr(workload, "stall", contextlib.nullcontext)


class Strategy(abc.ABC):
    name: str = "?"
    #: whether --algo applies (the strategy runs one of ALGOS on a buffer)
    uses_algo: bool = False
    #: the ALGOS it accepts (None: any), and the one it runs when --algo names none of them
    algos: tuple[str, ...] | None = None
    default_algo: str = "native"
    #: the frozen class of its settings (``commbench.strategies.SETTINGS`` registers it)
    settings_class: type[CommonSettings] = CommonSettings

    @classmethod
    def algos_for(cls, requested: list[str]) -> list[str]:
        """Which of the requested --algo values this strategy runs (one run each)."""
        if cls.algos is None:
            return list(requested)
        return [a for a in requested if a in cls.algos] or [cls.default_algo]

    def __init__(self, comm: Communicator, grads: Sequence[torch.Tensor],
                 settings: CommonSettings | None = None, *,
                 backward_order: Sequence[int] | None = None, workload: Any = None) -> None:
        """Every strategy's constructor.

        Args:
            comm: the communicator.
            grads: the gradient tensors, in parameter order.
            settings: the run's settings, an instance of ``settings_class`` (default: its
                defaults); another strategy's settings are a TypeError.
            backward_order: indices of ``grads`` in the order backward produces them
                (default: reverse parameter order, as DDP assumes); the same on every rank.
            workload: the workload, for the peers that wrap its model (``needs_model``).
        """
        settings = settings if settings is not None else self.settings_class()
        if not isinstance(settings, self.settings_class):
            raise TypeError(f"--strategy {self.name} is built from {self.settings_class.__name__}, "
                            f"not {type(settings).__name__}")
        compression = settings.compression
        if self.needs_model and workload is None:
            raise ValueError(f"--strategy {self.name} wraps the workload's model and "
                             "optimizer: build it with workload=")
        self.comm = comm
        self.grads = list(grads)
        self.settings = settings
        self.backward_order = list(backward_order) if backward_order is not None else \
            list(reversed(range(len(self.grads))))
        self.compression = compression
        #: the dtype gradients are cast to before the all-reduce (their own without compression)
        self.wire = COMPRESSIONS[compression] or self.grads[0].dtype
        self.nbytes = sum(g.numel() * self.wire.itemsize for g in self.grads)
        self.timer: StepTimer | NullTimer = NullTimer()

    @classmethod
    def check(cls, comm: Communicator, algo: str) -> None:
        """Raise ValueError, naming the cause, if this strategy cannot run on ``comm``.

        Called on every rank before any run starts, so an impossible
        combination ends the job before it writes anything.
        """
        if cls.uses_algo:
            check_algo(comm, algo)

    @classmethod  # noqa: B027 - most strategies need no model check
    def check_workload(cls, workload: Any) -> None:
        """Raise ValueError, naming the cause, if this strategy cannot run on the job's
        model: ``check``'s part that needs the workload (built once for it where the job
        runs a strategy that sets ``checks_workload``)."""

    #: whether ``check_workload`` says anything (the job then builds the workload to check)
    checks_workload: bool = False

    def begin_step(self, timer: StepTimer | NullTimer) -> None:
        self.timer = timer

    def on_ready(self, i: int) -> None:  # noqa: B027 - most strategies wait for finish()
        """Gradient ``i`` has been produced."""

    #: called while compute runs, to drive collectives that advance only when tested (a
    #: non-blocking MPI all-reduce); None when the strategy has nothing to drive. Not the
    #: ``progress`` setting, which says how bucketed's all-reduces advance.
    poll = None

    #: the strategy needs the real model (``workload=`` in its constructor)
    needs_model: bool = False

    #: the model-buffer rule the strategy follows whatever ``--buffers`` asks (a peer with
    #: machinery of its own: Horovod's), else None (``commbench.buffers``)
    own_buffer_rule: str | None = None

    @classmethod
    def buffer_rule(cls, requested: str) -> str:
        """The buffer rule a run follows when ``--buffers requested`` is given."""
        return cls.own_buffer_rule or check_rule(requested)

    def micro_batch(self, last: bool) -> contextlib.AbstractContextManager[None]:
        """Context for one micro-batch's forward and backward under ``--accum-steps``.

        Only the last micro-batch of a step announces its gradients (``on_ready``);
        the others accumulate locally. Peers that hook the model themselves (DDP)
        suppress their own sync here.
        """
        return contextlib.nullcontext()

    @abc.abstractmethod
    def finish(self) -> None:
        """Complete the step's synchronisation; gradients then hold the mean."""

    def close(self) -> None:  # noqa: B027 - most strategies hold nothing to release
        """Release what the strategy opened (a transfer engine's thread and
        communicator). Called once, on every rank, after the run and its validation,
        by whoever built the strategy."""

    def __enter__(self) -> Strategy:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # Closed on the way out of a run that ended normally. After an error the job
        # aborts (``commbench.lifecycle.run_job``): closing could wait forever for transfers
        # in flight that the other ranks will never complete.
        if exc_type is None:
            self.close()

    def finish_run(self) -> None:  # noqa: B027 - most strategies end with their last step
        """Complete what is still in flight at the end of a run (before validation)."""

    def record_fields(self, kind: str, steps: Sequence[dict] = ()) -> dict:
        """The strategy's own fields for a result record, beside the run layer's.

        ``kind="step"``: this rank's fields for the step that just finished; the
        step's record takes the critical-path rank's, and every rank's under ``ranks``
        (``commbench.output.merge_rank_fields``).
        ``kind="summary"``: the run's fields, from its step ``records`` (rank 0).
        None of its own by default.
        """
        return {}

    def knobs(self) -> dict:
        """The strategy's settings, for result records."""
        return {"compression": self.compression, "cast_dtype": dtype_name(self.wire)}

    def validation_pass(self, backward_order: Sequence[int]) -> None:
        """Reduce the values now in ``grads`` the way a step does (``validate.count_wrong``)."""
        self.begin_step(NullTimer())
        for i in backward_order:
            self.on_ready(i)
        self.finish()
