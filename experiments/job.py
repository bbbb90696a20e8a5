"""One job of an experiment: a tool's typed configuration, where it runs, how often.

A claim of the study or a benchmark plans its runs as ``Job`` objects; the
runner (``experiments.runner``) turns them into ``launch.sweep`` points, one
sweep per launcher. The program is the module that owns the configuration's
class (``commbench.allreduce.Config`` runs ``python -m commbench.allreduce``),
its arguments ``commbench.flags.to_argv(config)``. The configuration answers
its own time (``emulated_s``) and its own shortened form for a dilation probe
(``probe``); the job adds what the tool does not see: start-up and the dilation.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from commbench import dilation as dil
from commbench.flags import to_argv
from commbench.jobtime import Seconds, Where
from launch.cluster import parse_rate
from launch.commands import layout_text

#: wall seconds of the launcher itself (mpirun, the ranks' start-up is the tool's:
#: ``commbench.jobtime.Where.startup_s``)
STARTUP_S = 1.0
#: wall seconds to bring an emulated cluster up, test its link and take it down (paid once per
#: run of consecutive jobs on one cluster shape)
CLUSTER_S = 8.0
#: a job's deadline: this many times its estimate, at least ``MIN_TIMEOUT_S`` (emulated)
TIMEOUT_FACTOR = 4.0
MIN_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Placement:
    """Where a job runs.

    Args:
        nodes: emulated nodes (``launch.cluster``), or a real cluster's hosts' count.
        slots: ranks per node: one number for every node, or one per node ((3, 1)).
        rate: each node link's rate in tc syntax (``1gbit``), or ``none`` (unshaped).
        launcher: ``mpirun``, ``horovodrun``, ``horovodrun-gloo`` or ``torchrun``.
        dilation: time dilation K of the emulated cluster, ``auto`` (the runner chooses one
            per compared set), or None (the experiment's command line decides).
        hosts: a real cluster's hosts (``a:8,b:8``); None: emulated on this machine.
    """

    nodes: int
    slots: int | tuple[int, ...]
    rate: str = "none"
    launcher: str = "mpirun"
    dilation: float | str | None = None
    hosts: str | None = None

    @property
    def node_slots(self) -> list[int]:
        return [self.slots] * self.nodes if isinstance(self.slots, int) else list(self.slots)

    @property
    def ranks(self) -> int:
        return sum(self.node_slots)

    @property
    def emulated(self) -> bool:
        return self.hosts is None

    @property
    def layout(self) -> str:
        return layout_text(self.node_slots)

    @property
    def k(self) -> float:
        """The dilation as a number (1 where none, or not yet chosen)."""
        return self.dilation if isinstance(self.dilation, (int, float)) else 1.0

    def words(self) -> str:
        where = (f"{self.layout} emulated, link {self.rate}" if self.emulated
                 else f"{self.hosts}")
        k = self.dilation
        return (f"{self.launcher}, {where}"
                + ("" if k in (None, 1, 1.0) else ", dilation auto" if k == "auto"
                   else f", dilation {dil.text(k)}"))


@dataclass(frozen=True)
class Job:
    """One planned job: a tool's configuration on its placement.

    Args:
        name: unique within its experiment (the sweep point's name and file stem).
        config: a tool's configuration dataclass (flags declared with ``flags.flag``; it
            answers ``emulated_s(where)`` and ``probe()``); ``--output`` left unset.
        placement: where it runs.
        ranks: ranks of the job (fewer than the placement's slots: C1's points fill the
            first node first); None: every slot.
        repeats: jobs of it, each its own run and file; None: the experiment's default.
        sets: the compared sets it belongs to (claims, cells): jobs compared with one another
            share a set, and every set runs at one dilation K (``experiments.runner``).
        timeout_s: its deadline in emulated seconds; None: ``TIMEOUT_FACTOR`` x its estimate.
    """

    name: str
    config: Any
    placement: Placement
    ranks: int | None = None
    repeats: int | None = None
    sets: frozenset[str] = field(default_factory=frozenset)
    timeout_s: float | None = None

    @classmethod
    def place(cls, name: str, config: Any, nodes: int, slots: int | tuple[int, ...],
              rate: str = "none", launcher: str = "mpirun", *, timeout_s: float | None = None,
              dilation: float | str | None = None, repeats: int | None = None,
              sets: frozenset[str] | set[str] = frozenset()) -> Job:
        """A job on every slot of ``nodes`` x ``slots`` emulated nodes (a benchmark's)."""
        return cls(name, config, Placement(nodes, slots, rate, launcher, dilation),
                   repeats=repeats, sets=frozenset(sets), timeout_s=timeout_s)

    @property
    def program(self) -> str:
        return type(self.config).__module__

    @property
    def args(self) -> list[str]:
        return to_argv(self.config)

    @property
    def nranks(self) -> int:
        return self.ranks if self.ranks is not None else self.placement.ranks

    def where(self) -> Where:
        """The placement as the configuration's estimate sees it."""
        p = self.placement
        return Where(self.nranks, p.node_slots[0], parse_rate(p.rate) if p.emulated else None)

    def seconds(self) -> Seconds:
        return self.config.emulated_s(self.where())

    def estimate_s(self, k: float | None = None, seconds: Seconds | None = None) -> float:
        """Wall seconds of one run of this job at dilation ``k`` (default: its own): the
        launcher, then the tool's own time (``Seconds.wall_s``: its ranks' start-up and host
        work, and K x its emulated seconds; ``seconds`` where already asked). A cluster's
        bring-up and link test are the runner's (``CLUSTER_S``, once per cluster)."""
        k = self.placement.k if k is None else k
        return STARTUP_S + (seconds or self.seconds()).wall_s(k)

    def timeout(self, seconds: Seconds | None = None) -> float:
        """The deadline in emulated seconds (the sweep multiplies it by K)."""
        if self.timeout_s is not None:
            return float(self.timeout_s)
        return float(max(MIN_TIMEOUT_S,
                         round(TIMEOUT_FACTOR * self.estimate_s(1.0, seconds))))

    def at(self, k: float | str | None) -> Job:
        """This job at dilation ``k``."""
        return replace(self, placement=replace(self.placement, dilation=k))

    def probe(self) -> Job:
        """This job shortened for a dilation probe (its configuration's ``probe``)."""
        return replace(self, config=self.config.probe(), repeats=1, name=f"{self.name}-probe")

    def point(self) -> dict:
        """The ``launch.sweep`` point that runs this job (its id hashes what it runs: the
        program, arguments, ranks, layout, rate and K)."""
        p = self.placement
        pt: dict = {"name": self.name, "ranks": self.nranks}
        if p.emulated:
            pt.update(nodes=p.nodes, slots=p.slots if isinstance(p.slots, int) else list(p.slots),
                      rate=p.rate or "none")
            if p.dilation not in (None, 1, 1.0):
                pt["dilation"] = p.dilation
        sec = self.seconds()  # the tool's estimate, asked once
        pt.update(program=self.program, args=self.args, timeout=self.timeout(sec),
                  estimate_s=round(self.estimate_s(seconds=sec)))
        if self.repeats is not None:
            pt["repeats"] = self.repeats
        return pt

    def describe(self) -> str:
        n = "" if not self.repeats or self.repeats == 1 else f", {self.repeats} repeats"
        sets = f"{','.join(sorted(self.sets)):<12} " if self.sets else ""
        return (f"{sets}{self.name}: {self.nranks} ranks, {self.placement.words()}{n}, "
                f"~{fmt_s(self.estimate_s())}")


def fmt_s(s: float) -> str:
    """Seconds in words: ``45 s``, ``12 min``, ``2.5 h``."""
    if s < 90:
        return f"{s:.0f} s"
    return f"{s / 3600:.1f} h" if s >= 5400 else f"{s / 60:.0f} min"
