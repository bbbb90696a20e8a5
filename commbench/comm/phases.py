"""Phases of one all-reduce (reduce-scatter, cross-node all-reduce, all-gather, ...).

An algorithm made of consecutive phases reports each as it ends through
``on_phase(name, start, end)`` (this rank's clock, ``commbench.timing.now``), so
the step timer, the microbenchmark and the ``--timeline`` trace can show
where its time went.
"""

from __future__ import annotations

from collections.abc import Callable

from commbench.timing import now

#: ``on_phase(name, start, end)``: told of each phase as it ends
PhaseHook = Callable[[str, float, float], None]


class Phases:
    """Marks consecutive phases: each one ends where the next begins."""

    __slots__ = ("hook", "t")

    def __init__(self, hook: PhaseHook | None) -> None:
        self.hook = hook
        self.t = now() if hook is not None else 0.0

    def end(self, name: str) -> None:
        if self.hook is not None:
            t = now()
            self.hook(name, self.t, t)
            self.t = t
