"""ZeRO-3 against the FSDP2 peer, and against its own runs with prefetch off and with a
separate reduce-scatter group: step and exposed sync per model and layout, same replay.

The sharded family's timing questions (issue "sharded data parallel"): is the project's
ZeRO-3 as fast as PyTorch's FSDP2 on the same replayed compute, what does its gather
prefetch buy, and what does a second communicator for the reduce-scatters buy (FSDP
users ask why all-gathers and reduce-scatters do not overlap: on one communicator they
run in order).

A cell is a model with a CPU compute profile that times forward unit by unit
(``forward_units``: zero3 gathers a unit's parameters before the unit's forward, so
the replay must call each unit's forward at its time; the committed H200 profiles
lack the units) on a layout (``--layouts``, default 2x4) at ``--rate`` (default
1 Gbit/s). The profile's compute is scaled as ``peer_fairness`` scales it: backward
lasts ``--balance`` times the bytes a ring all-reduce of the gradient moves through a
node link (ZeRO-3 moves 1.5 times that: its gathers in forward and backward and its
reduce-scatters). Four jobs per cell, all under ``torchrun`` (the peer runs on
torch.distributed only; the project's ZeRO-3 runs there on the same Gloo group). The
first three keep zero3's root unit gathered from forward to backward
(``--reshard-root off``), as FSDP2 keeps its root module, so that both sides gather
the same bytes:

1. ``--strategy zero3,fsdp``: prefetch on, one engine (``shared``) for both collectives,
   against FSDP2 with its explicit forward prefetch (``--strategy fsdp``);
2. ``--strategy zero3 --prefetch off``;
3. ``--strategy zero3 --reduce-scatter-group separate``;
4. ``--strategy zero3 --reshard-root on``: the root freed after forward and gathered
   again for backward, as ZeRO §7.2 counts it (3Ψ(n−1)/n a rank).

``--jobs`` runs some of them (a verdict needs both its jobs). Waits for a unit's gather
count as sync, not compute, on both sides (the workload's
``stall``: docs/strategies.md, "Timing a unit's wait").

It prints one row per run (step, compute, exposed sync, comm, the all-gathers' and
the reduce-scatters' time per step, #wrong, the run's verdict), then per cell:

- the goals, zero3 ÷ FSDP2 in the first job: step <= 1.00 and exposed sync <= 1.10;
- prefetch on ÷ off (step and exposed sync), separate ÷ shared (exposed sync) and the
  root kept ÷ resharded (step), each with its interval and whether it is below 1.

Each is decided on the paired repeats as ``peer_fairness`` decides (``analysis.stats
.decide``: a 95 % confidence sequence from 3 runs a side; undecided below, or where the
interval straddles the goal; a cell with a host-bound run is not judged). With
``--dilation auto`` a cell's three jobs are one compared set (one K).

Run it from the repository root, as root, with nothing else measuring::

    python -m benchmarks.shard_timing --dilation auto --repeats 3
    python -m benchmarks.shard_timing --models gpt-tiny --layouts 2x2 --dry-run
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from analysis.load import mark_setup_verdicts
from analysis.overlap import Profile, load_profile
from benchmarks.peer_fairness import (
    MET,
    NOT_MET,
    UNDECIDED,
    _words,
    bound_of,
    by_strategy,
    decided,
    ms,
    spread,
)
from commbench.hostload import is_link_bound
from commbench.profilefile import ProfileError
from commbench.profilefile import read as read_profile
from commbench.strategies import Sync
from commbench.tables import Column, format_table
from experiments.bench import (
    ROOT,
    Benchmark,
    add_output_flags,
    layouts,
    names_arg,
    parser,
    records,
    repeats_arg,
)
from experiments.job import Job
from experiments.replay import balanced_scale, measured_steps, replay_config, ring_bound_bytes
from experiments.runner import Runner
from launch.cluster import ClusterError, parse_rate

JOB_TIMEOUT_S = 900.0
#: each model's CPU profile with forward units, the batch it was recorded at, and the
#: command that records it (profiles/README.md)
PROFILES = {
    "resnet50": ("profiles/cpu-resnet50-b8.json", 8,
                 "python -m commbench.profile --model resnet50 --batch-size 8 --image-size 224 "
                 "--threads 1 --iters 5 --warmup 2 -o profiles/cpu-resnet50-b8.json"),
    "gpt-tiny": ("profiles/cpu-gpt-tiny-b32-units.json", 32,
                 "python -m commbench.profile --model gpt-tiny --batch-size 32 --threads 1 "
                 "--iters 10 --warmup 3 -o profiles/cpu-gpt-tiny-b32-units.json"),
}
#: the goals: zero3 ÷ the FSDP2 peer, in one job
STEP_GOAL, EXPOSED_GOAL = 1.00, 1.10
#: each cell's jobs: (name, strategies, the zero3 settings away from the defaults)
JOBS = (("zero3+fsdp", ["zero3", "fsdp"], {"reshard_root": "off"}),
        ("prefetch off", ["zero3"], {"prefetch": "off", "reshard_root": "off"}),
        ("separate", ["zero3"], {"reduce_scatter_group": "separate", "reshard_root": "off"}),
        ("reshard root", ["zero3"], {"reshard_root": "on"}))


@dataclass(frozen=True)
class Cell:
    model: str
    nodes: int
    slots: int
    profile: Profile
    scale: float
    steps: int

    @property
    def name(self) -> str:
        return f"{self.model} {self.nodes}x{self.slots}"


def profile_path(model: str) -> Path:
    return ROOT / PROFILES[model][0]


def lacking_units(model: str) -> str | None:
    """Why ``model``'s profile cannot serve (missing, or without forward units), with the
    command that records it; None where it can."""
    path = profile_path(model)
    how = f"record it with: {PROFILES[model][2]}"
    if not path.exists():
        return f"{model}: no profile at {path.relative_to(ROOT)}; {how}"
    try:
        prof = read_profile(path)
    except ProfileError as e:
        return f"{model}: {e}"
    if not prof.units:
        return (f"{model}: {path.relative_to(ROOT)} times no forward unit (zero3 gathers per "
                f"unit, so the replay must run forward unit by unit); {how}")
    return None


def cells(args: argparse.Namespace) -> list[Cell]:
    gbit = parse_rate(args.rate)
    if gbit is None:
        raise ClusterError("--rate: the cells are balanced against the link, so the link "
                           "must be shaped (e.g. 1gbit)")
    out = []
    for model in args.models:
        prof = load_profile(profile_path(model))
        for nodes, slots in args.layouts:
            b = ring_bound_bytes(prof, nodes, slots)
            scale = balanced_scale(prof, nodes, slots, gbit, args.balance)
            steps = measured_steps(prof, scale, 1.5 * b * 8 / (gbit * 1e9), args.steps)
            out.append(Cell(model, nodes, slots, prof, round(scale, 4), steps))
    return out


def plan(args: argparse.Namespace) -> list[Job]:
    """Each cell's three jobs (module docstring), one compared set."""
    jobs = []
    for cell in cells(args):
        path, batch, _ = PROFILES[cell.model]
        for name, strategies, settings in JOBS:
            if name not in args.jobs:
                continue
            cfg = replay_config(cell.model, ROOT / path, batch, cell.scale, cell.steps,
                                args.warmup, strategies, sync=Sync(**settings))
            jobs.append(Job.place(f"{cell.name} {name}", cfg, cell.nodes, cell.slots,
                                  args.rate, "torchrun", timeout_s=JOB_TIMEOUT_S,
                                  repeats=args.repeats, sets={cell.name}))
    return jobs


TABLE = [Column("job", "", 30), Column("strategy", "", 8), Column("step", "ms", 7, ".0f"),
         Column("compute", "ms", 7, ".0f"), Column("exposed", "ms", 7, ".0f"),
         Column("comm", "ms", 7, ".0f"), Column("gather", "ms", 7, ".0f"),
         Column("scatter", "ms", 7, ".0f"), Column("#wrong", "", 6), Column("bound", "", 10)]


def phase_ms(s: dict, phase: str) -> float | None:
    """The run's time in ``phase`` per step (``comm_phases_s``: the median step's)."""
    v = (s.get("comm_phases_s") or {}).get(phase)
    return ms(v)


def row(job: Job, s: dict) -> list:
    name = job.name + (f" r{s.get('repeat') or 0}" if (job.repeats or 1) > 1 else "")
    return [name, s["strategy"], ms(s["stats"]["step_s"]["median"]), ms(s["compute_s"]),
            ms(s["exposed_sync_s"]), ms(s.get("comm_s")), phase_ms(s, "allgather"),
            phase_ms(s, "reduce_scatter"), s.get("wrong"), bound_of(s)]


def step(s: dict) -> float:
    return s["step_s"]


def exposed(s: dict) -> float:
    return s["exposed_sync_s"]


def compare(label: str, num: list[dict], den: list[dict], figure, goal: float,
            host: bool) -> tuple[str, str]:
    """``label``: ``figure``'s ratio of ``num`` to ``den`` in words, and its verdict against
    ``goal`` (at most): met, NOT met or undecided; undecided where ``host``."""
    verdict, d = decided(num, den, figure, goal, True, 1)
    if host:
        verdict = UNDECIDED
    return f"{label} {_words(d, spread(num, den, figure))} [{verdict}]", verdict


def judge(cell: Cell, runs: dict[str, list[dict]]) -> tuple[list[str], dict[str, str]]:
    """The cell's lines and its two goals' verdicts (None where a job failed)."""
    sides, notes = by_strategy(runs)
    zero3, fsdp = sides.get(("zero3+fsdp", "zero3")), sides.get(("zero3+fsdp", "fsdp"))
    off, separate = sides.get(("prefetch off", "zero3")), sides.get(("separate", "zero3"))
    resharded = sides.get(("reshard root", "zero3"))
    every = [s for ss in sides.values() for s in ss]
    host = [s for s in every if is_link_bound(s) is False]
    lines, met = [], {"step": None, "exposed": None}
    head = f"{cell.name} (compute x {cell.scale:g}, {cell.steps} steps)"
    if not zero3 or not fsdp:
        lines.append(f"{head}: the zero3+fsdp job failed: no verdict")
    else:
        a, met["step"] = compare("zero3 / fsdp: step", zero3, fsdp, step, STEP_GOAL, bool(host))
        b, met["exposed"] = compare("exposed sync", zero3, fsdp, exposed, EXPOSED_GOAL,
                                    bool(host))
        lines.append(f"{head}: {a}, {b}")
    if zero3 and off:
        a, _ = compare("prefetch on / off: step", zero3, off, step, 1.0, bool(host))
        b, _ = compare("exposed sync", zero3, off, exposed, 1.0, bool(host))
        lines.append(f"  {a}, {b}")
    if zero3 and separate:
        a, _ = compare("separate / shared reduce-scatter group: exposed sync", separate, zero3,
                       exposed, 1.0, bool(host))
        lines.append(f"  {a}")
    if zero3 and resharded:
        a, _ = compare("root kept / resharded after forward: step", zero3, resharded, step,
                       1.0, bool(host))
        b, _ = compare("exposed sync", zero3, resharded, exposed, 1.0, bool(host))
        lines.append(f"  {a}, {b}")
    if host:
        names = ", ".join(sorted({s["strategy"] for s in host}))
        lines.append(f"  {len(host)} compared runs host-bound ({names}): not judged")
    return lines + notes, met


def build_parser() -> argparse.ArgumentParser:
    p = parser("benchmarks.shard_timing", __doc__)

    p.add_argument("--models", type=names_arg(tuple(PROFILES)), default=list(PROFILES),
                   help=f"models by their CPU profile with forward units: {', '.join(PROFILES)}")
    p.add_argument("--layouts", type=layouts, default=[(2, 4)], help="NODESxRANKS,...")
    p.add_argument("--rate", default="1gbit", help="link rate per node (tc syntax)")
    p.add_argument("--balance", type=float, default=1.0,
                   help="backward / a ring all-reduce's link bound, by scaling the profile")
    p.add_argument("--repeats", type=repeats_arg, default=3, metavar="N",
                   help="run every job N times; the ratios are decided on the paired repeats")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--jobs", type=names_arg(tuple(name for name, _, _ in JOBS), "job"),
                   default=[name for name, _, _ in JOBS],
                   help="which of each cell's jobs to run (the verdicts need theirs): "
                        + ", ".join(name for name, _, _ in JOBS))
    add_output_flags(p, "shard-timing")
    return p


def refuse(args: argparse.Namespace) -> str | None:
    for model in args.models:
        why = lacking_units(model)
        if why:
            return why
    try:
        cells(args)
    except ClusterError as e:
        return str(e)
    return None


def check(args: argparse.Namespace, jobs: list[Job], runner: Runner) -> int:
    by_job = {job.name: [s for path in runner.outputs(job) for s in records(path, "summary")]
              for job in jobs}
    mark_setup_verdicts([s for ss in by_job.values() for s in ss])
    rows, footer, tally = [], [], {MET: 0, NOT_MET: 0, UNDECIDED: 0}
    for cell in cells(args):
        mine = [j for j in jobs if j.name.startswith(cell.name + " ")]
        rows += [row(j, s) for j in mine for s in by_job[j.name]]
        lines, met = judge(cell, {j.name.removeprefix(cell.name + " "): by_job[j.name]
                                  for j in mine})
        footer += lines
        for v in met.values():
            if v is not None:
                tally[v] += 1
    ks = sorted({float(s.get("dilation") or 1.0) for ss in by_job.values() for s in ss})
    k = ", ".join(f"{x:g}" for x in ks) if ks else (args.dilation or 1)
    print(format_table(TABLE, rows, title=(
        f"shard_timing  links {args.rate}  dilation {k}  backward = {args.balance:g} x a ring "
        f"all-reduce's link bound  at least {args.steps} steps (+{args.warmup} warm-up)  "
        f"{args.repeats} repeats"),
        footer=["medians over measured steps of the critical-path rank; gather, scatter: the "
                "all-gathers' and reduce-scatters' time per step; bound * = the set-up's "
                "verdict (K against 2K, dilations.json)",
                f"goals: zero3 / fsdp step <= {STEP_GOAL:.2f}, exposed sync <= "
                f"{EXPOSED_GOAL:.2f}; the other ratios are judged against 1",
                *footer,
                f"goals: {tally[MET]} met, {tally[NOT_MET]} NOT met, {tally[UNDECIDED]} "
                "undecided",
                f"{time.monotonic() - args.started:.0f} s; records: {runner.outdir}"]))
    return 0


BENCHMARK = Benchmark("shard-timing", build_parser, plan, check, refuse)
main = BENCHMARK.main


if __name__ == "__main__":
    sys.exit(main())
