"""The convergence study over seeds: time to accuracy per configuration, and paired ratios.

``commbench.staleness`` trains one model per (strategy, staleness s, mitigation)
and seed, and writes one ``staleness_summary`` record per run. This module pools
those runs over seeds into one ``ConvergencePoint`` per configuration.

Why time to accuracy. Stale updates trade progress per update for updates per
second: each step waits less, but each update uses older gradients. Neither
throughput nor accuracy after a fixed number of steps says which wins; the wall
time until held-out accuracy reaches a target does, because it counts both.
Dutta et al., "Slow and Stale Gradients Can Win the Race: Error-Runtime
Trade-offs in Distributed SGD", AISTATS 2018, compare SGD variants by error
against wall time for this reason; Chen et al., "Revisiting Distributed
Synchronous SGD", 2016, compare synchronous (with backup workers) and
asynchronous training by the time to reach a test accuracy, and find that
staleness costs accuracy that throughput does not show.

Why seeds. One run's time to accuracy is one draw: the initial weights and the
held-out split (both set by the seed) move it, and a run may never reach the
target at all. A point therefore keeps every seed's outcome: the times of the
runs that reached the target, how many did (``reached`` of ``n``), and the final
accuracies of all of them; a mean over the runs that reached alone would favour
lucky seeds. ``time_ratio`` compares a configuration with synchronous training
seed by seed (the same weights and split on both sides, so the seed's own luck
cancels), within the job that ran both.

Runs are pooled only where everything but the seed agrees: besides the
configuration, the target accuracy and the training set-up (``SETUP_FIELDS``:
model, data set, ranks, nodes, batch, image size, steps, learning rate,
evaluation interval, warm-up steps, time dilation). Which seeds a job was asked
to run (``config.seeds``) is not part of it: jobs of seeds 0,1 and of 2,3 pool.

Only the standard library and ``analysis.load``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from analysis.load import get

#: the record's kind this module reads (one per run of ``commbench.staleness``)
KIND = "staleness_summary"

#: what must agree, besides the configuration and the target, for runs to be pooled:
#: name -> reader of a ``staleness_summary`` record (its run fields, then its ``config``)
SETUP_FIELDS: dict[str, Callable[[dict], Any]] = {
    "model": lambda r: r.get("model"),
    "dataset": lambda r: get(r, "dataset", "digits"),  # the study's only one so far
    "ranks": lambda r: r.get("world_size"),
    "nodes": lambda r: r.get("nodes"),
    "batch_size": lambda r: get(r, "batch_size"),
    "image_size": lambda r: get(r, "image_size"),
    "steps": lambda r: get(r, "steps"),
    "lr": lambda r: get(r, "lr"),
    "momentum": lambda r: get(r, "momentum", 0.9),  # runs before the flag: 0.9
    "eval_every": lambda r: get(r, "eval_every"),
    "staleness_warmup": lambda r: (r.get("config") or {}).get("staleness_warmup"),
    # wall time / emulated time: the times of runs at two dilations are not comparable
    "dilation": lambda r: r.get("dilation") or 1.0,
    "revision": lambda r: r.get("revision"),  # the code that ran (results.code_revision)
}


@dataclass
class ConvergencePoint:
    """One configuration of the study over its seeds: every run of one (strategy,
    staleness, mitigation) at one target accuracy and set-up.

    Lists marked "per run" hold one entry per run, in the order the runs were read
    (``seeds[i]`` is run i's seed); ``times_to_accuracy`` holds those of the runs that
    reached the target only, in the same order.
    """

    strategy: str  # async or ps
    staleness: int | None  # the bound s (``staleness_config``); None for ps
    mitigation: str  # none, lr or warmup
    target_accuracy: float | None
    setup: tuple[tuple[str, Any], ...]  # (name, value) of ``SETUP_FIELDS``
    seeds: list[int | None]  # per run (None: a record from before seeds were recorded)
    time_to_accuracy_s: list[float | None]  # per run; None: never reached the target
    times_to_accuracy: list[float]  # of the runs that reached the target
    reached: int  # runs that reached the target
    n: int  # runs
    reached_share: float  # reached / n
    final_accuracies: list[float | None]  # per run
    throughput_vs_sync: list[float | None]  # per run: against its job's s=0 of its seed
    run_ids: list[str | None] = field(default_factory=list)  # per run
    job_ids: list[str | None] = field(default_factory=list)  # per run

    @property
    def is_reference(self) -> bool:
        """Whether this is synchronous training (async, s = 0, no mitigation)."""
        return self.strategy == "async" and self.staleness == 0 and self.mitigation == "none"

    @property
    def label(self) -> str:
        """``s=2``, ``s=2 with lr``, ``ps``, ``ps with lr``."""
        name = "ps" if self.strategy == "ps" else f"s={self.staleness}"
        return name if self.mitigation == "none" else f"{name} with {self.mitigation}"


def _num(x: Any) -> float | None:
    """``x`` as a float; None where it is missing or not a number."""
    if x is None or isinstance(x, bool):
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _seed(r: dict) -> int | None:
    """A run's seed: the record's own (``commbench.staleness --seeds``), else its job's
    ``--seed`` (records before ``--seeds``)."""
    seed = get(r, "seed")
    return None if seed is None else int(seed)


def group_key(r: dict) -> tuple:
    """What a run is pooled by: (strategy, staleness, mitigation, target accuracy, set-up)."""
    return (r.get("strategy"), r.get("staleness_config"), r.get("mitigation") or "none",
            _num(get(r, "target_accuracy")),
            tuple((name, read(r)) for name, read in SETUP_FIELDS.items()))


def points(records: Iterable[dict]) -> list[ConvergencePoint]:
    """One ``ConvergencePoint`` per configuration, target and set-up of the
    ``staleness_summary`` records among ``records`` (other kinds are passed over), in
    the order of their first runs (the study's: synchronous first)."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        if r.get("kind") == KIND:
            groups.setdefault(group_key(r), []).append(r)
    out = []
    for (strategy, s, mitigation, target, setup), runs in groups.items():
        times = [_num(r.get("time_to_accuracy_s")) for r in runs]
        reached = [t for t in times if t is not None]
        out.append(ConvergencePoint(
            strategy=strategy, staleness=s, mitigation=mitigation, target_accuracy=target,
            setup=setup, seeds=[_seed(r) for r in runs], time_to_accuracy_s=times,
            times_to_accuracy=reached, reached=len(reached), n=len(runs),
            reached_share=len(reached) / len(runs),
            final_accuracies=[_num(r.get("final_accuracy")) for r in runs],
            throughput_vs_sync=[_num(r.get("throughput_vs_sync")) for r in runs],
            run_ids=[r.get("run_id") for r in runs], job_ids=[r.get("job_id") for r in runs]))
    return out


def reference(pts: Sequence[ConvergencePoint],
              point: ConvergencePoint) -> ConvergencePoint | None:
    """The synchronous point (async, s = 0, no mitigation) of ``point``'s target and
    set-up among ``pts``; None where there is none."""
    for p in pts:
        if p.is_reference and (p.target_accuracy, p.setup) == (point.target_accuracy,
                                                               point.setup):
            return p
    return None


def _key(job, seed, by_seed: bool) -> tuple:
    return (None, seed) if by_seed else (job, seed)


def _reached_by_run(p: ConvergencePoint, by_seed: bool = False) -> dict[tuple, float]:
    """(job, seed) -> time to accuracy of ``p``'s runs that reached the target; with
    ``by_seed``, (None, seed)."""
    out: dict[tuple, float] = {}
    seen: set[tuple] = set()
    for job, seed, t in zip(p.job_ids or [None] * p.n, p.seeds, p.time_to_accuracy_s):
        key = _key(job, seed, by_seed)
        if key in seen:
            raise ValueError(f"{p.label}: two runs of seed {seed} in job {job} (a results "
                             "file read twice?)" if not by_seed else
                             f"{p.label}: two runs of seed {seed} at one setting")
        seen.add(key)
        if t is not None:
            out[key] = t
    return out


#: the training settings a study may vary (``experiments.claims``' C4 grid): a
#: configuration is compared at its best one (``best_setting``)
SETTING_FIELDS = ("lr", "momentum")


def setting(p: ConvergencePoint) -> tuple:
    """``p``'s (lr, momentum)."""
    d = dict(p.setup)
    return tuple(d.get(f) for f in SETTING_FIELDS)


def base_setup(p: ConvergencePoint) -> tuple:
    """``p``'s set-up without its training settings: what points of one grid share."""
    return tuple(kv for kv in p.setup if kv[0] not in SETTING_FIELDS)


def median_time(p: ConvergencePoint) -> float:
    """The median time to accuracy over ``p``'s runs, a run that never reached the target
    counted as infinitely slow (inf where half never did)."""
    times = sorted(math.inf if t is None else t for t in p.time_to_accuracy_s)
    if not times:
        return math.inf
    mid = len(times) // 2
    return times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2


def best_setting(pts: Sequence[ConvergencePoint]) -> ConvergencePoint:
    """The point of the lowest median time to accuracy (``median_time``), then the most
    runs that reached it, then the first."""
    return min(pts, key=lambda p: (median_time(p), -p.reached))


def time_ratio(point: ConvergencePoint, reference: ConvergencePoint,
               by_seed: bool = False) -> list[float]:
    """Paired ratios time_to_accuracy(``point``) / time_to_accuracy(``reference``), one per
    seed where both runs reached the target, in ``point``'s run order.

    ``reference`` is synchronous training (``reference(points, point)``). A run is
    paired with the reference's run of the same seed in the same job (the study runs
    every seed's synchronous run first, in the job that runs the others; records
    without a job id pair by seed); ``by_seed``: with the reference's run of the same seed
    in any job, and ``point`` may then be at another training setting (``SETTING_FIELDS``:
    a grid's job each). Above 1: slower to the target than synchronous. Raises ValueError
    where the two differ in target accuracy or set-up (never pooled).
    """
    mine_setup, ref_setup = ((base_setup(point), base_setup(reference)) if by_seed
                             else (point.setup, reference.setup))
    if (point.target_accuracy, mine_setup) != (reference.target_accuracy, ref_setup):
        what = ("target accuracy" if point.target_accuracy != reference.target_accuracy
                else "set-up")
        raise ValueError(f"{point.label} and {reference.label}: not the same {what}")
    ref = _reached_by_run(reference, by_seed)
    return [t / ref[key] for key, t in _reached_by_run(point, by_seed).items()
            if key in ref and ref[key] > 0]


def time_ratio_or_never(point: ConvergencePoint, reference: ConvergencePoint,
                        by_seed: bool = False) -> list[float]:
    """``time_ratio`` over every seed whose synchronous run reached the target, with
    ``inf`` where ``point``'s run of that seed never did: a run that never gets there is
    slower than any that does, and leaving it out would favour the lucky seeds."""
    ratios = time_ratio(point, reference, by_seed)  # checks target and set-up
    ref = _reached_by_run(reference, by_seed)
    mine = _reached_by_run(point, by_seed)
    seen = {_key(job, seed, by_seed)
            for job, seed in zip(point.job_ids or [None] * point.n, point.seeds)}
    return ratios + [math.inf for key in ref if key in seen and key not in mine]
