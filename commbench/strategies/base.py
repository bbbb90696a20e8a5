"""The interface every synchronisation strategy implements.

A strategy is built once per run from the communicator, the gradient tensors
(in parameter order) and its knobs. Each step the runner calls
``begin_step(timer)``; the workload calls ``on_ready(i)`` as gradient ``i``
is produced (backward order) and ``progress()`` while it computes; then the
runner calls ``finish()``, after which every gradient holds the mean over
ranks. Strategies time their collectives on the timer they were given.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

import torch

from commbench.comm.base import Communicator
from commbench.strategies.algos import check_algo
from commbench.timing import NullTimer, StepTimer


class Strategy(abc.ABC):
    name: str = "?"
    #: whether --algo applies (the strategy runs one of ALGOS on a buffer)
    uses_algo: bool = False
    #: the ALGOS it accepts (None: any), and the one it runs when --algo names none of them
    algos: tuple[str, ...] | None = None
    default_algo: str = "native"

    @classmethod
    def algos_for(cls, requested: list[str]) -> list[str]:
        """Which of the requested --algo values this strategy runs (one run each)."""
        if cls.algos is None:
            return list(requested)
        return [a for a in requested if a in cls.algos] or [cls.default_algo]

    def __init__(self, comm: Communicator, grads: Sequence[torch.Tensor]) -> None:
        self.comm = comm
        self.grads = list(grads)
        self.nbytes = sum(g.numel() * g.element_size() for g in self.grads)
        self.timer: StepTimer | NullTimer = NullTimer()

    @classmethod
    def check(cls, comm: Communicator, algo: str) -> None:
        """Raise ValueError, naming the cause, if this strategy cannot run on ``comm``.

        Called on every rank before any run starts, so an impossible
        combination ends the job before it writes anything.
        """
        if cls.uses_algo:
            check_algo(comm, algo)

    def begin_step(self, timer: StepTimer | NullTimer) -> None:
        self.timer = timer

    def on_ready(self, i: int) -> None:  # noqa: B027 - most strategies wait for finish()
        """Gradient ``i`` has been produced."""

    #: called while compute runs; None when the strategy has nothing to drive
    progress = None

    @abc.abstractmethod
    def finish(self) -> None:
        """Complete the step's synchronisation; gradients then hold the mean."""

    def knobs(self) -> dict:
        """The strategy's settings, for result records."""
        return {}
