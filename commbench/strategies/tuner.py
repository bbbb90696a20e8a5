"""``--bucket-mb auto``'s tuner: the probe of the transfer paths, the choice of a cap and a
path from the first timed step's gradient times, and its record.

Its state is one object apart from the strategy that runs the buckets, as
``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.PowerSGDState`` holds
PowerSGD's apart from its hook: the hyper-parameters first (the paths it chooses among,
the preferred one, bytes on the wire per gradient byte, the probe's sizes and repeats),
then the state (the probe, the gradient times of the step being timed, the choice).
``BucketedStrategy`` keeps a reference to it (``tuner``) and calls it at four points:

1. ``measure``, once its first buckets are built (DDP's default cap, 25 MB): per path,
   the fastest of ``PROBE_REPS`` all-reduces at each of ``PROBE_BYTES``, queued behind
   one that warms the path, gives the transfer's cost by size
   (``commbench.buckets.ProbeCost``); on an engine path, also the engine's hand-offs
   (``HANDOFF_REPS`` small transfers, each waited for: the engine thread's wake-up
   to begin one submitted while it idles, ``pickup_s``, and the caller's wake-up once it
   has ended, ``handback_s``), which a transfer's own time leaves out and the schedule
   prices (``commbench.buckets.schedule``). Collectives: every rank builds its
   strategies, and probes, in the same order.
2. ``stamp(i, timer)`` as gradient ``i`` is produced, and ``end_step(timer)`` at the end
   of each step: the gradient times of the timed steps (warm-up steps count; steps under
   a ``NullTimer``, as a validation pass's, do not). On a GPU a stamp is an event
   recorded on the compute stream in the gradient's hook (the host runs ahead of the
   device, so its clock says when the gradient was queued, not when it was ready), read
   when ``choose`` runs, after the step has ended.
3. ``choose``, at the start of the step after the first timed one (as DDP rebuilds its
   buckets after its first iteration): rank 0 prices every cap of
   ``commbench.buckets.AUTO_CAPS_MB`` on every path (``choose_cap``), and ``BY_SIZE``
   where two engine paths were probed, and takes the one that predicts the least exposed
   sync (the first on a tie); every rank takes rank 0's probe and choice. The strategy
   then rebuilds its buckets at the chosen cap, on the chosen path, and under ``BY_SIZE``
   asks ``paths_by_size`` for each bucket's path.
4. ``record``: what result records carry under ``knobs.bucket_mb_auto``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from commbench.buckets import AUTO, ProbeCost, choose_cap
from commbench.comm.engine import TRANSFER_PATHS
from commbench.timing import NullTimer, StepTimer, mark_seconds

#: the probe of each transfer path: sizes (bytes) and timed all-reduces each
PROBE_BYTES = (2**13, 2**16, 2**20, 8 * 2**20)
PROBE_REPS = 2
#: the extra path where several engine paths were probed: each bucket on the path the
#: probe prices cheapest for its size, all on the engine's one thread, in order.
#: Small buckets are latency-bound, and the ring pays a Python-driven message per step
#: (2(p-1) steps); Open MPI's all-reduce of a small message is one call into C, and its
#: put pipeline (the ring's reason) moves only large ones (peer_fairness, GPT-tiny on
#: 2 x 2 at K = 4: 64 KiB buckets stepped 18 ms on the ring, 12 on Open MPI's; DDP 15).
BY_SIZE = "by-size"

#: the engine's hand-offs: small transfers timed on each engine path (the first warms), of
#: the probe's smallest size (what is timed does not depend on it; one element would leave
#: the two-level path's shards empty)
HANDOFF_REPS, HANDOFF_BYTES = 5, PROBE_BYTES[0]

#: ``time_transfers(t, path, n)``: the seconds each of ``n`` all-reduces of ``t`` takes on
#: transfer path ``path``, queued back to back as a step's buckets are (the strategy's)
TimeTransfers = Callable[[torch.Tensor, str, int], Sequence[float]]
#: ``time_handoffs(path, n)``: ``(pickup_s, handback_s)`` of each of ``n`` small transfers
#: (``HANDOFF_BYTES``) submitted to path ``path``'s idle engine, each waited for (the
#: strategy's)
TimeHandoffs = Callable[[str, int], Sequence[tuple[float, float]]]


class BucketTuner:
    """``--bucket-mb auto``'s state: what it probed, the gradient times it is collecting,
    what it chose (module docstring).

    Args:
        paths: the transfer paths it chooses among (``iallreduce`` under ``--progress
            poll``), the preferred first.
        preferred: the path a tie goes to under ``BY_SIZE``.
        wire_ratio: bytes on the wire per byte of gradient (0.5 under fp16 or bf16
            compression): the probe times the wire dtype, caps count gradient bytes.
        probe_bytes: the sizes each path is probed at.
        probe_reps: timed all-reduces at each size (after one that warms the path).
    """

    __slots__ = ("paths", "preferred", "wire_ratio", "probe_bytes", "probe_reps",
                 "probe", "why", "ready", "ready_on_device", "timed_steps", "choosing", "choice",
                 "chosen_after_steps")

    def __init__(self, paths: Sequence[str], preferred: str, wire_ratio: float = 1.0,
                 probe_bytes: Sequence[int] = PROBE_BYTES, probe_reps: int = PROBE_REPS) -> None:
        # hyper-parameters
        self.paths = list(paths)
        self.preferred = preferred
        self.wire_ratio = wire_ratio
        self.probe_bytes = tuple(probe_bytes)
        self.probe_reps = probe_reps
        # state
        #: per path: the probe's sizes and times, and its cost by size where they give one
        #: (rank 0's once chosen)
        self.probe: dict[str, dict[str, Any]] = {}
        #: why nothing was priced: per path whose times give no cost, or why no choice
        self.why: dict[str, str] | str | None = None
        #: this step's gradient times, by gradient index (while choosing): this rank's
        #: clock, or on a device events on the compute stream (``ready_seconds``)
        self.ready: dict[int, Any] = {}
        #: whether ``ready`` holds device events (a step timed on a device clock)
        self.ready_on_device = False
        self.timed_steps = 0
        #: still collecting gradient times; False once ``choose`` has run
        self.choosing = True
        #: rank 0's choice: ``chosen`` (the cap, MB), ``chosen_path``, ``backward_s`` and
        #: ``predicted_exposed_s`` (per path, per cap); None until chosen, or where nothing
        #: could be
        self.choice: dict[str, Any] | None = None
        self.chosen_after_steps: int | None = None

    # -- the probe -------------------------------------------------------------------------

    def measure(self, time_transfers: TimeTransfers, like: torch.Tensor,
                time_handoffs: TimeHandoffs | None = None) -> None:
        """Probe every path with ``time_transfers``, in tensors of ``like``'s dtype and
        device (a bucket's buffer: the wire dtype), and every engine path's hand-offs with
        ``time_handoffs`` where given (the median of ``HANDOFF_REPS`` after one that warms,
        as ``pickup_s`` and ``handback_s`` beside the path's times). A path whose times give
        no cost keeps them in the record, without one, and ``why`` says so."""
        fits: dict[str, dict[str, Any]] = {}
        why: dict[str, str] = {}
        for path in self.paths:
            sizes, times = [], []
            for nbytes in self.probe_bytes:
                t = torch.zeros(max(1, nbytes // like.element_size()), dtype=like.dtype,
                                device=like.device)
                for dt in list(time_transfers(t, path, self.probe_reps + 1))[1:]:
                    sizes.append(t.numel() * t.element_size())
                    times.append(dt)
            fits[path] = {"bytes": sizes, "seconds": [round(x, 6) for x in times]}
            if time_handoffs is not None and path in TRANSFER_PATHS:
                pairs = list(time_handoffs(path, HANDOFF_REPS + 1))[1:]
                for key, vals in zip(("pickup_s", "handback_s"), zip(*pairs)):
                    fits[path][key] = round(statistics.median(vals), 6)
            try:
                fits[path]["cost"] = ProbeCost(sizes, times).record()
            except ValueError as e:  # the times stay in the record, beside why
                why[path] = f"the probe's times give no cost: {e}"
        self.probe = fits
        self.why = why or None

    def costs(self) -> dict[str, Callable[[float], float]]:
        """Each candidate path's cost of a bucket by its gradient bytes, from the probe
        (taken in the wire dtype), ``BY_SIZE`` included where two engine paths were
        probed: the cheaper of them at each size."""
        costs: dict[str, Callable[[float], float]] = {
            path: ProbeCost(*zip(*fit["cost"])).scaled(self.wire_ratio)
            for path, fit in self.probe.items() if fit and "cost" in fit}
        engine = [p for p in costs if p in TRANSFER_PATHS]
        if len(engine) > 1:
            costs[BY_SIZE] = lambda b: min(costs[p](b) for p in engine)
        return costs

    def handoffs(self, path: str) -> tuple[float, float]:
        """``(pickup_s, handback_s)`` of the engine that runs path ``path`` (under ``BY_SIZE``
        the preferred path's: its engine runs every bucket), as probed; 0 where not probed
        (no engine: ``iallreduce``)."""
        fit = self.probe.get(self.preferred if path == BY_SIZE else path) or {}
        return fit.get("pickup_s", 0.0), fit.get("handback_s", 0.0)

    def paths_by_size(self, nbytes: Sequence[float]) -> list[str]:
        """Under ``BY_SIZE``, the engine path the probe prices cheapest for a bucket of each
        of ``nbytes`` gradient bytes (the preferred one on a tie)."""
        costs = self.costs()
        engine = [p for p in costs if p in TRANSFER_PATHS]
        return [min(engine, key=lambda p: (costs[p](n), p != self.preferred)) for n in nbytes]

    # -- the timed steps ---------------------------------------------------------------------

    def stamp(self, i: int, timer: StepTimer | NullTimer) -> None:
        """Gradient ``i`` was produced now (on a timer that times)."""
        if self.choosing and timer.enabled:
            self.ready_on_device = timer.events is not None
            self.ready[i] = timer.mark() if self.ready_on_device else timer.clock()

    def end_step(self, timer: StepTimer | NullTimer) -> None:
        """A step ended: one more timed step where ``timer`` timed it."""
        if self.choosing and timer.enabled:
            self.timed_steps += 1

    @property
    def due(self) -> bool:
        """Whether the next step should start with ``choose``: a timed step is in."""
        return self.choosing and self.timed_steps > 0

    def begin_step(self) -> None:
        """A step starts: its gradient times start afresh."""
        self.ready.clear()

    def ready_seconds(self) -> dict[int, float]:
        """The gradient times in seconds: as stamped on the host; on a device, each event's
        time after the first stamped (events on one stream complete in that order)."""
        if not self.ready or not self.ready_on_device:
            return dict(self.ready)
        first = next(iter(self.ready.values()))
        return {i: mark_seconds(first, m) for i, m in self.ready.items()}

    # -- the choice ----------------------------------------------------------------------

    def choose(self, comm: Any, nbytes: Sequence[int], order: Sequence[int],
               dtypes: Sequence[torch.dtype], first_cap_bytes: float) -> dict[str, Any] | None:
        """Rank 0 picks the path and cap from the probe and the last timed step's gradient
        times (``commbench.buckets.choose_cap`` per path, for gradients of ``nbytes`` bytes
        and ``dtypes`` produced in ``order``, the first bucket capped at
        ``first_cap_bytes``; the path whose cap predicts the least exposed sync, the first
        on a tie); every rank takes rank 0's probe and choice (``comm.bcast_object``).
        Returns the choice, None where nothing could be priced (``why`` says why)."""
        why, choice = self.why, None
        if comm.rank == 0:
            costs = self.costs()
            if not costs or not self.ready:
                why = why or "no gradient times were recorded"
            else:
                stamped = self.ready_seconds()
                last = max(stamped.values())
                ready = [stamped.get(i, last) for i in range(len(nbytes))]
                origin = min(ready)
                choices: dict[str, tuple[float, dict[float, float]]] = {}
                for path, cost in costs.items():
                    pickup, handback = self.handoffs(path)
                    choices[path] = choose_cap(list(nbytes), list(order),
                                               [t - origin for t in ready], cost,
                                               first_cap_bytes, list(dtypes),
                                               pickup_s=pickup, handback_s=handback)
                path = min(choices, key=lambda p: choices[p][1][choices[p][0]])  # first: tie
                choice = {"chosen": choices[path][0], "chosen_path": path,
                          "backward_s": last - origin,
                          "predicted_exposed_s": {p: {f"{c:g}": round(e, 6)
                                                      for c, e in pred.items()}
                                                  for p, (_, pred) in choices.items()}}
        self.probe, self.why, self.choice = comm.bcast_object((self.probe, why, choice))
        self.chosen_after_steps = self.timed_steps
        self.choosing = False
        self.ready.clear()
        return self.choice

    @property
    def by_size(self) -> bool:
        """Whether each bucket runs on its own path (``BY_SIZE`` was chosen)."""
        return self.choice is not None and self.choice["chosen_path"] == BY_SIZE

    @property
    def record(self) -> dict[str, Any]:
        """What result records carry under ``knobs.bucket_mb_auto`` (result files and
        ``analysis/`` read this shape): ``requested`` (``auto``), ``chosen`` (the cap in
        MB, None until chosen or where nothing could be), ``probe`` (per path: ``bytes``,
        ``seconds``, on an engine path ``pickup_s`` and ``handback_s``, and, where the times
        give one, ``cost``), ``why`` (where a path's times or
        the choice gave nothing), the choice's ``chosen_path``, ``backward_s`` and
        ``predicted_exposed_s``, and ``chosen_after_steps`` once ``choose`` has run."""
        rec: dict[str, Any] = {"requested": AUTO,
                               "chosen": self.choice["chosen"] if self.choice else None,
                               "probe": self.probe}
        if self.why:
            rec["why"] = self.why
        if self.choice:
            rec.update((k, v) for k, v in self.choice.items() if k != "chosen")
        if self.chosen_after_steps is not None:
            rec["chosen_after_steps"] = self.chosen_after_steps
        return rec
