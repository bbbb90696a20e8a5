"""The advisor's validation grid: each cell's runs planned by the advisor, run, and judged.

    python -m experiments.grid --dry-run                  # the tuning cells: jobs and time
    python -m experiments.grid -o results/grid            # run them (resumable), then judge
    python -m experiments.grid --cells 'resnet18/*' --repeats 3 -o results/grid-r18
    python -m experiments.grid --judge-only -o results/grid   # judge what a folder holds
    python -m experiments.grid --held-out                 # once, after tuning is finished

Issue 48 part 3. The cells are ``experiments/advise_grid.toml``'s (``experiments.heldout``:
4 models x 2 layouts x 3 link rates, 12 of them held out). In each cell
``commbench.allreduce`` replays the model's committed compute profile on the emulated
cluster, scaled as ``benchmarks.peer_fairness`` scales it (``experiments.replay``: backward
lasts the grid's ``balance`` x the gradient's ring bound through a node link at its
``balance_rate``, the same at every rate of one model and layout), and runs, one job each:

1. **the advisor's top 3** for that cell: ``analysis.advise.advise`` in-process on the
   scaled profile, ``nodes x slots`` ranks, the cell's link rate, and the emulated
   network's per-message latency (below); its exact schemes only (the recommendation
   never is an approximate one);
2. **the fixed reference set**: flat native, DDP at its 25 MB default, bucketed auto,
   hierarchical hier;
3. **three caps**: bucketed at 1, 25 and 128 MB.

A top-3 scheme that one of 2 or 3 already runs is not run twice: the job stands for both.
Each scheme name the advisor emits maps to one configuration (``run_as``); where the
toolkit cannot run the scheme as named (``flat rd``, ``flat rabenseifner``: it has no
recursive doubling or Rabenseifner of its own) it runs the library's own all-reduce,
``native``, which the advisor prices as the cheapest flat algorithm, and says so. The
reference set's bucketed runs name their transfer path, ``ring``: what ``--transfer auto``
runs for bucketed on the mpi backend (``commbench.comm.engine``), so that the job and the
advisor's ``bucketed ... on ring`` are one.

**The inter-node alpha the plan prices at.** ``analysis.advise`` refuses an alpha fitted on
the emulated cluster for a real one (its per-message latency is the host's, divided by the
dilation K), and without a fit or ``--latency-us`` it prices an RDMA-class 10 us. Neither
is this network's. The plan gives the advisor the emulated network's own alpha, as a
user gives theirs: ``--latency-us`` where given, else ``HOST_ALPHA_US`` (12.4 us, an
8-byte Open MPI all-reduce between 2 emulated nodes at K = 1, docs/fidelity.md) / K,
K the cell's dilation (``--dilation K``, or under ``auto`` the K the runner's ladder
starts the cell's probes at, or has already chosen in the folder). It is written in the
folder's plan (``grid-plan.json``) and a resumed run reuses it, so the top 3 do not move
when K is chosen. Every run measures the alpha it ran on (``alpha_us``): the judge prints
both. The intra-node level is the advisor's default (an H200 node): on the emulated
cluster it is this host's shared memory, host work that dilation makes K times faster in
emulated time, far above every grid link rate.

Every cell is one compared set (one K, ``--dilation auto`` by default as the grid file
says); every job runs ``--repeats`` times (the grid file's 3 by default), shuffled within
its cluster. Then ``experiments.grid_judge`` reads the folder's records and prints, per
cell, the advisor's pick, the measured best (the best of what was measured), the pick's
step / the best's, and predicted / measured step and exposed sync, each judged by the
fair-verdict rule with its runs a side; the table goes to ``grid.txt`` and ``grid.json``.
``--decide --budget D`` adds runs to the jobs of undecided cells until they decide or D is
spent (``Runner.repeat_until``).

The held-out cells are judged once, after tuning: they run only with ``--held-out``, at the
grid file's repeats and dilation. Bad input exits 2 naming the flag, before any job runs.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from pathlib import Path

from analysis.advise import (
    ASYNC_PATHS,
    EXACT,
    HIER_ALGOS,
    PATHS,
    TOPOLOGY,
    ClusterFlags,
    Prediction,
    Scheme,
    ShardedScheme,
    advise,
    cap_words,
    cluster_params,
    predicted,
    profile_input,
    sharded_schemes,
)
from analysis.alphabeta import FLAT_ALGOS, LATENCY_FLAG, ModelError, latency_arg
from analysis.cli import UsageError
from analysis.overlap import Profile
from commbench import dilation as dil
from commbench.allreduce import runs_of
from commbench.comm.algos import ALGOS
from commbench.flags import nonneg_int, positive_int
from commbench.results import write_atomic
from commbench.strategies import STRATEGIES, Sync
from experiments import grid_judge
from experiments.bench import dilation_arg
from experiments.heldout import GRID, Cell, Grid, GridError, load_grid
from experiments.job import Job, fmt_s
from experiments.replay import balanced_scale, measured_steps, replay_config, ring_bound_bytes
from experiments.runner import Runner, RunnerError
from experiments.study import StudyError, parse_duration
from launch.cluster import parse_rate
from launch.execute import interruptible

PROG = "experiments.grid"
ROOT = Path(__file__).resolve().parents[1]
PLAN_FILE = grid_judge.PLAN_FILE
#: the emulated network's per-message latency at K = 1 (us): an 8-byte all-reduce between 2
#: emulated nodes through Open MPI, 12.4 us at K = 1 and 2.26 us at K = 8 (docs/fidelity.md;
#: commbench.latency measures the same figure into every record): about the host's / K
HOST_ALPHA_US = 12.4
#: the transfer path of the reference set's bucketed runs: what --transfer auto runs for
#: bucketed on the mpi backend (commbench.comm.engine.resolve_path), written out
REFERENCE_PATH = "ring"
#: measured steps a run has at least (more where steps are short: experiments.replay), and
#: warm-up steps before them; benchmarks.peer_fairness's defaults
DEFAULT_STEPS, DEFAULT_WARMUP = 4, 1
LAUNCHER = "mpirun"  # DDP on Gloo runs under it too (benchmarks.peer_fairness)


class BadInput(Exception):
    """A command line the grid cannot run; the message names the flag."""


# --- a scheme as a job runs it --------------------------------------------------------

#: the strategies a run names ``--algo`` for: those where it is a choice (the others have
#: one form)
ALGO_STRATEGIES = tuple(name for name, s in STRATEGIES.items()
                        if s.uses_algo and (s.algos is None or len(s.algos) > 1))
#: zero3's settings a run names (``Sync``'s fields and the flags' names)
ZERO3_FLAGS = ("prefetch", "reduce_scatter_group", "reshard_root")


@dataclass(frozen=True)
class RunAs:
    """One scheme as ``commbench.allreduce`` runs it: ``--strategy``, ``--algo`` and the
    strategy's flags; ``note`` says where the run is not the scheme as named."""

    strategy: str
    algo: str = "native"
    bucket_mb: float | str | None = None
    transfer: str | None = None
    compression: str = "none"
    accum_steps: int = 1
    staleness: int | None = None
    #: zero3's settings (``--prefetch``, ``--reduce-scatter-group``, ``--reshard-root``)
    prefetch: str | None = None
    reduce_scatter_group: str | None = None
    reshard_root: str | None = None
    note: str = field(default="", compare=False)

    @property
    def key(self) -> tuple:
        """What makes two runs one: every setting but the note."""
        return (self.strategy, self.algo, self.bucket_mb, self.transfer, self.compression,
                self.accum_steps, self.staleness, self.prefetch, self.reduce_scatter_group,
                self.reshard_root)

    def sync(self) -> Sync:
        """The strategies' flags of the job (the rest at their defaults)."""
        values = {"compression": self.compression, "accum_steps": self.accum_steps}
        for name in ("bucket_mb", "transfer", "staleness", *ZERO3_FLAGS):
            if getattr(self, name) is not None:
                values[name] = getattr(self, name)
        return Sync(**values)

    def words(self) -> str:
        """The run as flags: ``--strategy bucketed --bucket-mb 25 --transfer ring``."""
        out = f"--strategy {self.strategy}"
        if self.strategy in ALGO_STRATEGIES:
            out += f" --algo {self.algo}"
        if self.bucket_mb is not None:
            mb = self.bucket_mb
            out += f" --bucket-mb {mb if isinstance(mb, str) else format(mb, 'g')}"
        for name in ("transfer", "staleness", *ZERO3_FLAGS):
            if getattr(self, name) is not None:
                out += f" --{name.replace('_', '-')} {getattr(self, name)}"
        if self.compression != "none":
            out += f" --compression {self.compression}"
        if self.accum_steps != 1:
            out += f" --accum-steps {self.accum_steps}"
        return out


def _cap(text: str, scheme: str) -> float | str:
    if text == "auto":
        return "auto"
    if text == "per-tensor":
        return 0.0
    m = re.fullmatch(r"(\d+(?:\.\d+)?) MB", text)
    if m is None:
        raise ValueError(f"scheme {scheme!r}: cannot read the bucket cap {text!r}")
    return float(m.group(1))


def run_as(scheme: str) -> RunAs:
    """The configuration that runs the advisor's scheme ``scheme`` (a name of
    ``analysis.advise``'s tables, approximate ones included); ValueError naming a scheme
    it does not know."""
    if m := re.fullmatch(r"fp16 wire, (.+)", scheme):
        return replace(run_as(m.group(1)), compression="fp16")
    if m := re.fullmatch(r"accumulate (\d+), (.+)", scheme):
        return replace(run_as(m.group(2)), accum_steps=int(m.group(1)))
    if m := re.fullmatch(r"async S=(\d+) on (\S+)", scheme):
        if m.group(2) in ASYNC_PATHS:
            return RunAs("async", staleness=int(m.group(1)), transfer=m.group(2))
    elif m := re.fullmatch(r"flat (\S+)", scheme):
        algo = m.group(1)
        if algo in ALGOS:
            return RunAs("flat", algo)
        if algo in FLAT_ALGOS:
            return RunAs("flat", "native",
                         note=f"run as flat native: the toolkit has no {algo} of its own; the "
                              "advisor prices native as the cheapest of "
                              f"{', '.join(FLAT_ALGOS)}")
    elif m := re.fullmatch(r"hierarchical (\S+)", scheme):
        if m.group(1) in HIER_ALGOS:
            return RunAs("hierarchical", m.group(1))
    elif m := re.fullmatch(r"bucketed (.+) on (\S+)", scheme):
        if m.group(2) in PATHS:
            return RunAs("bucketed", bucket_mb=_cap(m.group(1), scheme), transfer=m.group(2))
    elif m := re.fullmatch(rf"zero2 (.+?)( {TOPOLOGY})?", scheme):
        return RunAs("zero2", "hier" if m.group(2) else "ring",
                     bucket_mb=_cap(m.group(1), scheme))
    elif m := re.fullmatch(r"hsdp (.+)", scheme):
        return RunAs("hsdp", bucket_mb=_cap(m.group(1), scheme))
    elif scheme in ZERO3_SCHEMES:
        return RunAs("zero3", ZERO3_ROWS[scheme].algo,
                     **dict(zip(ZERO3_FLAGS, ZERO3_SCHEMES[scheme])))
    raise ValueError(f"unknown scheme {scheme!r}: not a name analysis.advise gives")


def reference_run(entry: dict) -> RunAs:
    """A scheme of the grid file's reference set or caps (its ``strategy``, ``algo``,
    ``bucket_mb``, ``transfer``) as a run; bucketed on ``REFERENCE_PATH`` unless it names
    its path."""
    mb = entry.get("bucket_mb")
    mb = float(mb) if isinstance(mb, (int, float)) and not isinstance(mb, bool) else mb
    strategy = entry["strategy"]
    transfer = entry.get("transfer", REFERENCE_PATH if strategy == "bucketed" else None)
    return RunAs(strategy, entry.get("algo", "native"), mb, transfer)


#: the advisor's zero3 rows (``analysis.advise.sharded_schemes``, the topology-aware one
#: included), by name
ZERO3_ROWS = {s.name: s for s in sharded_schemes((), units=True, multi_node=True)
              if s.strategy == "zero3"}
#: each zero3 row -> zero3's settings, as ``ZERO3_FLAGS`` (the root's None where it is the
#: default, resharded)
ZERO3_SCHEMES = {s.name: ("on" if s.prefetch else "off",
                          "separate" if s.separate else "shared",
                          None if s.reshard_root else "off")
                 for s in ZERO3_ROWS.values()}


def advisor_scheme(run: RunAs) -> Scheme | ShardedScheme | None:
    """The advisor's scheme that prices ``run``, or None where it prices none (DDP, async,
    a changed-maths run)."""
    if run.compression != "none" or run.accum_steps != 1:
        return None
    if run.strategy == "flat" and run.algo in (*FLAT_ALGOS, "native"):
        return Scheme(f"flat {run.algo}", "flat", run.algo)
    if run.strategy == "hierarchical" and run.algo in HIER_ALGOS:
        return Scheme(f"hierarchical {run.algo}", "hierarchical", run.algo)
    if run.strategy == "bucketed" and run.transfer in PATHS and run.bucket_mb is not None:
        return Scheme(f"bucketed {cap_words(run.bucket_mb)} on {run.transfer}", "bucketed",
                      PATHS[run.transfer], run.bucket_mb)
    # zero2 and zero3 priced on the ring unless topology-aware (``--algo hier``)
    algo = "hier" if run.algo == "hier" else "ring"
    if run.strategy in ("zero2", "hsdp") and run.bucket_mb not in (None, "auto"):
        name = f"{run.strategy} {cap_words(run.bucket_mb)}"
        if run.strategy == "hsdp":
            return ShardedScheme(name, "hsdp", run.bucket_mb)
        return ShardedScheme(name + (f" {TOPOLOGY}" if algo == "hier" else ""), "zero2",
                             run.bucket_mb, algo=algo)
    if run.strategy == "zero3":
        settings = (run.prefetch or "on", run.reduce_scatter_group or "shared",
                    None if run.reshard_root in (None, "on") else run.reshard_root)
        return next((ZERO3_ROWS[name] for name, flags in ZERO3_SCHEMES.items()
                     if flags == settings and ZERO3_ROWS[name].algo == algo), None)
    return None


# --- the plan ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Role:
    """What a job stands for in its cell: ``what`` (``flat-native``, ``advisor #1``), the
    advisor's scheme name that prices it (None: unpriced), and that prediction."""

    what: str
    scheme: str | None
    predicted: Prediction | None
    note: str = ""  # where the job does not run the scheme as named (RunAs.note)


@dataclass(frozen=True)
class PlannedJob:
    id: str  # within the cell: the first reference's id, or advisor-N
    run: RunAs
    roles: tuple[Role, ...]
    job: Job

    @property
    def prediction(self) -> Prediction | None:
        """The prediction its first priced role gives (the advisor's own for a top-3)."""
        return next((r.predicted for r in self.roles if r.predicted is not None), None)


@dataclass(frozen=True)
class CellPlan:
    cell: Cell
    compute_scale: float
    steps: int
    warmup: int
    alpha_us: float
    alpha_from: str
    ranking: tuple[Prediction, ...]  # the advisor's exact schemes, ranked
    top: tuple[str, ...]
    jobs: tuple[PlannedJob, ...]

    @property
    def pick(self) -> str:
        return self.top[0]


@dataclass(frozen=True)
class CellInput:
    """What a cell's plan needs before the advisor: its profile, scale and steps."""

    cell: Cell
    path: Path
    profile: Profile
    compute_scale: float
    steps: int


def cell_input(grid: Grid, cell: Cell, steps: int, root: Path = ROOT) -> CellInput:
    """The cell's profile (checked against its model and batch), the compute scale that
    balances backward against the ring's bound at the grid's ``balance_rate``, and its
    measured steps at its own rate. BadInput naming ``--cells`` where the profile is not
    there or not the model's."""
    m = cell.model
    path = root / m.profile
    if not path.exists():
        how = f": record it first: {m.record}" if m.record else ""
        raise BadInput(f"--cells {cell.id}: the profile of {m.id}, {m.profile}, is not "
                       f"recorded yet{how}")
    try:
        prof = profile_input(str(path), m.model, m.batch)
    except UsageError as e:
        raise BadInput(f"--cells {cell.id}: {e}") from None
    compute = grid.settings.get("compute", {})
    balance_gbit = parse_rate(str(compute.get("balance_rate", cell.rate)))
    scale = round(balanced_scale(prof, cell.nodes, cell.slots, balance_gbit,
                                 float(compute.get("balance", 1.0))), 4)
    bound_s = ring_bound_bytes(prof, cell.nodes, cell.slots) * 8 / (parse_rate(cell.rate) * 1e9)
    return CellInput(cell, path, prof, scale, measured_steps(prof, scale, bound_s, steps))


def _job(ci: CellInput, job_id: str, run: RunAs, warmup: int, dilation: float | str | None
         ) -> Job:
    m = ci.cell.model
    cfg = replay_config(m.model, ci.path, m.batch, ci.compute_scale, ci.steps, warmup,
                        [run.strategy], [run.algo], run.sync(),
                        **({"input_shape": m.input_shape} if m.input_shape else {}))
    return Job.place(f"{ci.cell.id} {job_id}", cfg, ci.cell.nodes, ci.cell.slots, ci.cell.rate,
                     LAUNCHER, dilation=dilation, sets={ci.cell.id})


def plan_cell(grid: Grid, ci: CellInput, alpha_us: float, alpha_from: str, *,
              warmup: int = DEFAULT_WARMUP, dilation: float | str | None = "auto") -> CellPlan:
    """One cell's jobs: the grid's reference set and caps, then the advisor's top
    ``grid.advisor_top`` (predicted in-process at ``alpha_us``) that none of them runs
    already; each job with the roles it stands for and their predictions."""
    cell = ci.cell
    ranks = cell.nodes * cell.slots
    prof = ci.profile.scaled(ci.compute_scale)
    cluster = cluster_params(ClusterFlags(cell.slots, parse_rate(cell.rate), alpha_us), None,
                             cell.nodes > 1)
    try:
        advice = advise(prof, cluster, ranks, EXACT)
    except ModelError as e:
        raise BadInput(f"--cells {cell.id}: the advisor cannot price it: {e}") from None
    by_name = {p.scheme: p for p in advice.exact}
    top = tuple(p.scheme for p in advice.exact[:grid.advisor_top])

    def price(run: RunAs) -> tuple[str | None, Prediction | None]:
        scheme = advisor_scheme(run)
        if scheme is None:
            return None, None
        if scheme.name in by_name:
            return scheme.name, by_name[scheme.name]
        return scheme.name, predicted(scheme, scheme.step(prof, cluster, ranks))

    runs: dict[tuple, tuple[str, RunAs, list[Role]]] = {}
    for entry in grid.schemes:
        run = reference_run(entry)
        role = Role(entry["id"], *price(run))
        runs.setdefault(run.key, (entry["id"], run, []))[2].append(role)
    for i, name in enumerate(top, 1):
        run = run_as(name)
        role = Role(f"advisor #{i}", name, by_name[name], run.note)
        runs.setdefault(run.key, (f"advisor-{i}", run, []))[2].append(role)
    jobs = tuple(PlannedJob(jid, run, tuple(roles), _job(ci, jid, run, warmup, dilation))
                 for jid, run, roles in runs.values())
    return CellPlan(cell, ci.compute_scale, ci.steps, warmup, alpha_us, alpha_from,
                    tuple(advice.exact), top, jobs)


# --- the plan as the folder keeps it, and records' identity -----------------------------

def planned_signature(job: Job) -> dict:
    """``signature`` of the records ``job``'s runs will write (one run per job)."""
    (strategy, algo, _), = runs_of(job.config)
    p = job.placement
    return grid_judge.signature({
        "nodes": p.nodes, "local_size": max(p.node_slots), "link_shaping": p.rate,
        "strategy": strategy, "algo": algo,
        "config": json.loads(json.dumps(job.config.as_dict()))})


def _pred(p: Prediction | None) -> dict | None:
    return None if p is None else {"scheme": p.scheme, "step_s": p.step_s,
                                   "exposed_s": p.exposed_s, "compute_s": p.compute_s}


def plan_record(cp: CellPlan) -> dict:
    """A cell's plan as ``grid-plan.json`` keeps it: what the judge reads beside the
    records (the predictions, the pick, each job's roles and signature)."""
    c = cp.cell
    return {
        "model": c.model.id, "layout": c.layout, "rate": c.rate, "held_out": c.held_out,
        "link_gbps": parse_rate(c.rate), "compute_scale": cp.compute_scale,
        "steps": cp.steps, "warmup": cp.warmup, "alpha_us": cp.alpha_us,
        "alpha_from": cp.alpha_from, "top": list(cp.top), "pick": cp.pick,
        "ranking": [_pred(p) for p in cp.ranking],
        "jobs": [{"id": j.id, "name": j.job.name, "run": j.run.words(), "args": j.job.args,
                  "roles": [{"what": r.what, "scheme": r.scheme, "note": r.note,
                             "predicted": _pred(r.predicted)} for r in j.roles],
                  "predicted": _pred(j.prediction),
                  "signature": planned_signature(j.job)} for j in cp.jobs],
    }


def read_plan(folder: Path) -> dict:
    """The folder's plan (``grid_judge.PLAN_FILE``); an empty one where there is none."""
    if not (folder / PLAN_FILE).exists():
        return {"schema": grid_judge.PLAN_SCHEMA, "cells": {}}
    try:
        return grid_judge.read_plan(folder)
    except ValueError as e:
        raise BadInput(str(e)) from None


def merge_plans(old: dict, plans: Sequence[CellPlan], grid_path: Path) -> dict:
    """The folder's plan with ``plans``' cells added. A cell the folder planned before must
    be planned the same now (its top 3 and every job's arguments), or its runs would be
    judged against predictions that did not choose them: BadInput naming ``-o``."""
    cells = dict(old.get("cells", {}))
    for cp in plans:
        new = plan_record(cp)
        was = cells.get(cp.cell.id)
        if was is not None:
            args = [j.get("args") for j in was.get("jobs", [])]
            if was.get("top") != new["top"] or args != [j["args"] for j in new["jobs"]]:
                raise BadInput(
                    f"-o/--output: {cp.cell.id} was planned differently in this folder (top "
                    f"{was.get('top')}, now {new['top']}; or its jobs' flags changed): the "
                    "advisor, the grid file, --steps or --warmup changed since; give a new "
                    "folder")
        cells[cp.cell.id] = new
    return {"schema": grid_judge.PLAN_SCHEMA, "grid": str(grid_path), "cells": cells}


# --- the command line ---------------------------------------------------------------------

def select_cells(grid: Grid, text: str | None, held_out: bool) -> tuple[list[Cell], list[str]]:
    """The cells ``--cells`` names (ids or globs, comma list): by default every tuning cell,
    with ``--held-out`` every held-out one. A held-out cell runs only with ``--held-out``:
    named alone it is BadInput; matched by a glob beside tuning cells it is left out, said
    in the second value."""
    if text is None:
        return list(grid.held_out if held_out else grid.tuning), []
    wanted: set[str] = set()
    left: list[str] = []
    for pattern in (x.strip() for x in text.split(",")):
        if not pattern:
            continue
        hits = [c for c in grid.cells if fnmatchcase(c.id, pattern)]
        if not hits:
            m = grid.models
            raise BadInput(f"--cells {pattern}: no such cell; a cell is MODEL/LAYOUT/RATE with "
                           f"MODEL one of {', '.join(x.id for x in m)}, LAYOUT "
                           f"{', '.join(grid.layouts)}, RATE {', '.join(grid.rates)} "
                           "(globs allowed: 'resnet18/*')")
        ok = [c for c in hits if held_out or not c.held_out]
        if not ok:
            raise BadInput(f"--cells {pattern}: {', '.join(c.id for c in hits)} "
                           f"{'is' if len(hits) == 1 else 'are'} held out (judged once, after "
                           "tuning): add --held-out to run them")
        wanted |= {c.id for c in ok}
        left += [c.id for c in hits if c not in ok and c.id not in left]
    if not wanted:
        raise BadInput("--cells: names no cell")
    return [c for c in grid.cells if c.id in wanted], left


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m {PROG}",
        description="Run the advisor's validation grid (issue 48): per cell the advisor's "
                    "top 3, a fixed reference set and three caps, replayed on the emulated "
                    "cluster; then judge the advisor's pick and predictions against them.",
        epilog="Run it again with the same flags to resume: finished jobs are skipped.")
    p.add_argument("--cells", default=None, metavar="ID|GLOB[,...]",
                   help="cells to run, MODEL/LAYOUT/RATE ids or globs ('resnet18/*', "
                        "'*/2x4/*'); default every tuning cell")
    p.add_argument("--held-out", action="store_true",
                   help="allow the held-out cells (judged once, after tuning): alone, every "
                        "held-out cell; at the grid file's repeats and dilation")
    p.add_argument("--repeats", type=positive_int, default=None, metavar="N",
                   help="runs of every job, shuffled within each cell (default: the grid "
                        "file's, 3: the fewest that decide)")
    p.add_argument("--dilation", type=dilation_arg, default=None, metavar="K|auto",
                   help="time dilation of the emulated cluster (default: the grid file's, "
                        "auto: each cell at the K its probes call link-bound)")
    p.add_argument("--steps", type=positive_int, default=DEFAULT_STEPS, metavar="N",
                   help="measured steps per run at least (more where steps are short: 3 s "
                        "of them)")
    p.add_argument("--warmup", type=nonneg_int, default=DEFAULT_WARMUP, metavar="N",
                   help="warm-up steps before them")
    p.add_argument(LATENCY_FLAG, dest="latency_us", type=latency_arg, default=None, metavar="US",
                   help="the emulated inter-node alpha the advisor plans with (default: "
                        f"{HOST_ALPHA_US:g} us / K)")
    p.add_argument("-o", "--output", type=Path, default=None,
                   help="results folder, resumable (default results/grid, with --held-out "
                        "results/grid-heldout)")
    p.add_argument("--dry-run", action="store_true",
                   help="print each cell's plan, every job's command and the time estimate; "
                        "run nothing")
    p.add_argument("--judge-only", action="store_true",
                   help="judge the records in -o/--output; run nothing")
    p.add_argument("--decide", action="store_true",
                   help="then add runs to the jobs of cells still undecided until each "
                        "decides or --budget is spent")
    p.add_argument("--budget", default=None, metavar="DURATION",
                   help="wall time --decide may take in all: 8h, 90m, 1h30m, 3600s")
    p.add_argument("--grid", type=Path, default=GRID, help="the grid file")
    return p


@dataclass
class Setup:
    """A checked command line: the grid, its cells, and how they run."""

    grid: Grid
    cells: list[Cell]
    left_out: list[str]
    out: Path
    repeats: int
    dilation: float | str
    budget_s: float | None


def check_args(a: argparse.Namespace) -> Setup:
    """Every flag checked before any plan is made; BadInput names the flag."""
    try:
        grid = load_grid(a.grid)
    except GridError as e:
        raise BadInput(f"--grid: {e}") from None
    if a.judge_only and (a.dry_run or a.decide):
        raise BadInput("--judge-only: it runs nothing; drop --dry-run and --decide")
    measure = grid.settings.get("measure", {})
    repeats = a.repeats or int(measure.get("repeats", 3))
    try:
        dilation = a.dilation if a.dilation is not None else \
            dil.parse(str(measure.get("dilation", "auto")), allow_auto=True)
    except dil.DilationError as e:
        raise BadInput(f"--grid: [measure] {e}") from None
    cells, left = select_cells(grid, a.cells, a.held_out)
    if a.held_out and any(c.held_out for c in cells):
        want = int(measure.get("repeats", 3))
        if repeats < want:
            raise BadInput(f"--repeats {repeats}: the held-out cells run at least the grid "
                           f"file's {want} (fewer voids the held-out check)")
        if a.dilation is not None and a.dilation != measure.get("dilation", "auto"):
            given = a.dilation if isinstance(a.dilation, str) else dil.text(a.dilation)
            raise BadInput(f"--dilation {given}: the held-out cells run at the grid "
                           f"file's dilation ({measure.get('dilation', 'auto')})")
    if a.decide != (a.budget is not None):
        raise BadInput("--decide needs --budget DURATION (how long it may take in all)"
                       if a.decide else "--budget: it bounds --decide, which was not given")
    try:
        budget_s = parse_duration(a.budget) if a.budget is not None else None
    except StudyError as e:
        raise BadInput(str(e)) from None
    out = a.output or ROOT / "results" / ("grid-heldout" if a.held_out else "grid")
    if out.exists() and not out.is_dir():
        raise BadInput(f"-o/--output: {out} is not a directory")
    if a.judge_only and not (out / PLAN_FILE).exists():
        raise BadInput(f"-o/--output: {out} holds no {PLAN_FILE}: not a grid's folder")
    return Setup(grid, cells, left, out, repeats, dilation, budget_s)


def planned_ks(inputs: Sequence[CellInput], dilation: float | str, out: Path,
               warmup: int) -> dict[str, float]:
    """The K each cell runs at, as the runner prices it: ``--dilation K``; under ``auto``
    the K already chosen for the cell in ``out``, else where its probes' ladder starts
    (the last K chosen for such a probe on this machine, else ranks / cores)."""
    probes = [_job(ci, "k", RunAs("flat"), warmup, dilation) for ci in inputs]
    priced = Runner(probes, out).priced()
    return {ci.cell.id: j.placement.k for ci, j in zip(inputs, priced)}


def make_plans(s: Setup, a: argparse.Namespace) -> list[CellPlan]:
    """Each selected cell's plan, at the alpha the folder's plan used where it planned the
    cell before, else ``--latency-us``, else ``HOST_ALPHA_US`` / K."""
    inputs = [cell_input(s.grid, c, a.steps) for c in s.cells]
    stored = read_plan(s.out)["cells"]
    ks = planned_ks(inputs, s.dilation, s.out, a.warmup)
    plans = []
    for ci in inputs:
        was = stored.get(ci.cell.id)
        if was is not None:
            alpha, why = float(was["alpha_us"]), was["alpha_from"]
        elif a.latency_us is not None:
            alpha, why = a.latency_us, LATENCY_FLAG
        else:
            k = ks[ci.cell.id]
            alpha = HOST_ALPHA_US / k
            why = (f"the host's {HOST_ALPHA_US:g} us / K = {dil.text(k)}"
                   + (", the K its probes start at" if s.dilation == "auto" else ""))
        plans.append(plan_cell(s.grid, ci, alpha, why, warmup=a.warmup, dilation=s.dilation))
    return plans


def plan_lines(cp: CellPlan) -> list[str]:
    """A cell's plan in words: its set-up, the advisor's top, and what each job stands for."""
    c = cp.cell

    def ms(p: Prediction | None) -> str:
        return "" if p is None else f" ({p.step_s * 1e3:.1f} ms)"

    out = [f"# {c.id}{' (held out)' if c.held_out else ''}: compute x {cp.compute_scale:g}, "
           f"{cp.steps} steps (+{cp.warmup} warm-up); alpha {cp.alpha_us:.3g} us "
           f"({cp.alpha_from}); advisor's top {len(cp.top)}: "
           + ", ".join(f"{n}{ms(p)}" for n, p in
                       zip(cp.top, (next(q for q in cp.ranking if q.scheme == n)
                                    for n in cp.top)))]
    for j in cp.jobs:
        roles = ", ".join(r.what + (f" ({r.scheme})" if r.scheme and r.what.startswith("adv")
                                    else "") for r in j.roles)
        notes = "".join(f"; {r.what}: {r.note}" for r in j.roles if r.note)
        out.append(f"#   {j.id}: {j.run.words()}: {roles}{ms(j.prediction)}{notes}")
    return out


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        s = check_args(a)
        if a.judge_only:
            return grid_judge.report(s.out)
        plans = make_plans(s, a)
        plan_doc = merge_plans(read_plan(s.out), plans, s.grid.path)
        runner = Runner([j.job for cp in plans for j in cp.jobs], s.out, s.repeats)
        total = runner.estimate_s()
        if s.budget_s is not None and total > s.budget_s:
            raise BadInput(f"--budget {a.budget}: the first round needs ~{fmt_s(total)}; give "
                           "at least that")
    except (BadInput, RunnerError, GridError, ValueError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    ks = sorted({j.placement.k for j in runner.priced()})
    kind = "held-out" if all(c.held_out for c in s.cells) else \
        "tuning" if not any(c.held_out for c in s.cells) else "tuning and held-out"
    print(f"# {PROG}: {len(plans)} {kind} cells, {len(runner.jobs)} jobs, "
          f"{len(runner.jobs) * s.repeats} runs ({s.repeats} repeats); expected "
          f"~{fmt_s(total)} at K = {', '.join(map(dil.text, ks))}"
          + (f" (dilation auto: the K each cell's probes start at, not counting the probes; "
             f"~{fmt_s(runner.estimate_s(rungs=1))} if they climb one rung)"
             if s.dilation == "auto" else ""), flush=True)
    if s.left_out:
        print(f"# left out, held out (--held-out runs them): {', '.join(s.left_out)}")
    for cp in plans:
        print("\n".join(plan_lines(cp)))
    if a.dry_run:
        runner.dry_run()
        return 0

    def body() -> int:
        s.out.mkdir(parents=True, exist_ok=True)
        write_atomic(s.out / PLAN_FILE, json.dumps(plan_doc, indent=1))
        started = time.time()
        try:
            if s.budget_s is None:
                runner.run()
            else:
                names = {j.name for j in runner.jobs}
                got = runner.repeat_until(lambda: grid_judge.wanted(s.out, names),
                                          s.budget_s, started)
                write_atomic(s.out / grid_judge.DECIDE_FILE, json.dumps(got, indent=1))
        except RunnerError as e:
            print(f"{PROG}: error: {e}", file=sys.stderr)
            return 1
        status = grid_judge.report(s.out)
        print(f"# the grid took {fmt_s(time.time() - started)}; results in {s.out}", flush=True)
        return 1 if runner.failed else status

    return interruptible(body, PROG)


if __name__ == "__main__":
    sys.exit(main())
