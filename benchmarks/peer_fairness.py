"""The project's bucketed against Horovod and DDP, per model and layout, same replayed compute.

A sweep of cells: every model with a committed profile (``--models``: the
H200 ResNet-18 b64, ResNet-50 b256 and ResNet-101 b64 profiles and the CPU
GPT-tiny b32 transformer) on every layout (``--layouts``, default 2x1, 2x2,
2x4), on an emulated cluster at ``--rate`` (default 1 Gbit/s) that
``launch.sweep`` brings up and measures the link of. In each cell the
profile's compute is scaled so that backward lasts ``--balance`` (default 1)
times the gradient's link bound: the bytes a ring all-reduce moves through each
node link (``analysis.costmodel.link_bytes``, ``ring``: what DDP's Gloo and the
project's ring move; Rabenseifner's fewer bytes are a bound Open MPI's native
was measured at half of) at the nominal rate. Then bucketing has something to
hide behind; at the profiles' own speed backward could hide only a few per
cent of the all-reduce and the comparison would rank all-reduce libraries instead.

Two jobs per cell, one at a time:

1. ``mpirun``: ``--strategy bucketed,ddp``: the project's bucketed on the mpi
   backend (its transfer engine; ``--transfer`` as the tool's default unless
   ``--transfer`` is given) against DDP on Gloo.
2. ``horovodrun``: ``--strategy bucketed,horovod``: bucketed on the horovod
   backend against ``hvd.DistributedOptimizer``. DDP runs apart: with
   Horovod's background thread spinning beside Gloo's on ranks sharing 2
   cores, DDP's exposed sync was 2.3 s against 0.4 s under ``mpirun``.

``--bucket-mb`` (a size or ``auto``) is bucketed's; DDP keeps its own default
cap (25 MB) whatever bucketed is given. Optional extra jobs: ``--sweep`` (more
bucketed caps, mpirun) and ``--slow-rank R:F`` (flat and bucketed with a
straggler, mpirun, on the first cell).

Run it at a dilation the fidelity check calls link-bound (``--dilation 4``;
``auto`` probes each cluster): 8 ranks share this machine's 2 cores.

It prints one row per run (step, its spread, compute, exposed sync, comm per
step, overlap, buckets, link efficiency = the gradient's link bound at the
measured rate / comm per step, #wrong, the run's verdict), then per cell the
ratios of bucketed to the best peer (the faster of DDP and Horovod in step
time): step, exposed sync, and link efficiency; and whether the goals held
(step <= 1.00, exposed sync <= 1.10, link efficiency >= 0.95). Bucketed is
judged by its better launcher in the cell (each launcher's bucketed against its
own job's peer is printed too). The load average is printed first (warning
above 1.5).

``--repeats N`` runs every job N times (``launch.sweep --repeats``: each
repeat a job of its own, shuffled within its cluster, so the machine's drift
spreads over every cell). Each ratio is then of the medians over the repeats,
with its spread (``analysis.stats.ratio_spread``: the range of every pairwise
ratio below 6 repeats, a bootstrap 95 % interval from 6), printed as measured.
Each goal is decided on the paired repeats (``analysis.stats.decide``: each
side in repeat order, a 95 % confidence sequence from 3 runs a side, at alpha
/ k for the picks: bucketed is the best of its launchers, the best peer the
best of the peers): met, NOT met, or undecided where the interval straddles
the goal, and undecided below 3 repeats (``undecided (2 runs: range ...)``),
never a verdict on one run. Horovod's step moved up to 15 % between single
runs of one cell, more than most gaps the goals judge. A run's verdict (the
``bound`` column) is its set-up's where the job was placed at ``--dilation
auto`` (``*``: the runner's outcome rule, the probes' figures at K against 2K,
``dilations.json``), else the run's own counter reading; where any compared run
is host-bound, the cell's goals are neither met nor NOT met (undecided, said so).

Run it from the repository root, as root, with nothing else measuring::

    python -m benchmarks.peer_fairness --dilation 4          # ~50 min on 2 cores
    python -m benchmarks.peer_fairness --models resnet50 --layouts 2x2 --dilation 4
    python -m benchmarks.peer_fairness --dilation 4 --bucket-mb auto --repeats 2   # ~90 min
    python -m benchmarks.peer_fairness --dry-run             # the commands only
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analysis import sequential, stats
from analysis.load import mark_setup_verdicts
from analysis.overlap import Profile, load_profile
from commbench.buckets import DEFAULT_BUCKET_MB, parse_bucket_mb
from commbench.comm.engine import TRANSFER_CHOICES
from commbench.hostload import is_link_bound
from commbench.strategies import BucketedSettings
from commbench.tables import Column, format_table
from commbench.workloads.spec import slow_rank
from experiments.bench import (
    ROOT,
    Benchmark,
    add_output_flags,
    layouts,
    names_arg,
    one_setup,
    parser,
    records,
    repeats_arg,
)
from experiments.job import Job
from experiments.replay import balanced_scale, measured_steps, replay_config, ring_bound_bytes
from experiments.runner import Runner
from launch.cluster import ClusterError, parse_rate

JOB_TIMEOUT_S = 900.0
#: each model's committed profile and the batch it was recorded at
PROFILES = {"resnet18": ("profiles/h200-resnet18-b64.json", 64),
            "resnet50": ("profiles/h200-resnet50-b256.json", 256),
            "resnet101": ("profiles/h200-resnet101-b64.json", 64),
            "gpt-tiny": ("profiles/cpu-gpt-tiny-b32.json", 32)}
PEERS = ("ddp", "horovod")
#: the goals of a cell: bucketed / best peer
STEP_GOAL, EXPOSED_GOAL, LINK_GOAL = 1.00, 1.10, 0.95


@dataclass(frozen=True)
class Cell:
    model: str
    nodes: int
    slots: int
    profile: Profile
    scale: float  # on the profile's times
    bound_bytes: float  # the gradient's bytes through the busiest node link
    steps: int  # measured steps: --steps, or more where steps are short

    @property
    def name(self) -> str:
        return f"{self.model} {self.nodes}x{self.slots}"

    @property
    def ranks(self) -> int:
        return self.nodes * self.slots


def cells(args: argparse.Namespace) -> list[Cell]:
    gbit = parse_rate(args.rate)
    if gbit is None:
        raise SystemExit("error: --rate: the cells are balanced against the link, so the link "
                         "must be shaped (e.g. 1gbit)")
    out = []
    for model in args.models:
        prof = load_profile(ROOT / PROFILES[model][0])
        for nodes, slots in args.layouts:
            b = ring_bound_bytes(prof, nodes, slots)
            scale = balanced_scale(prof, nodes, slots, gbit, args.balance)
            steps = measured_steps(prof, scale, b * 8 / (gbit * 1e9), args.steps)
            out.append(Cell(model, nodes, slots, prof, round(scale, 4), b, steps))
    return out


def plan(args: argparse.Namespace) -> list[Job]:
    """Each cell's two jobs (module docstring), then the optional extra jobs; a cell's jobs,
    every launcher's, are one compared set (one K)."""
    jobs = []

    def job(cell: Cell, name: str, launcher: str, strategies: list[str],
            bucket_mb: float | str | None = None, straggler=None,
            transfer: str | None = None) -> Job:
        path, batch = PROFILES[cell.model]
        transfer = transfer or args.transfer
        sync = BucketedSettings(bucket_mb=args.bucket_mb if bucket_mb is None else bucket_mb,
                                **({"transfer": transfer} if transfer else {}))
        cfg = replay_config(cell.model, ROOT / path, batch, cell.scale, cell.steps,
                            args.warmup, strategies, sync=sync, slow_rank=straggler)
        return Job.place(f"{cell.name} {name}", cfg, cell.nodes, cell.slots, args.rate,
                         launcher, timeout_s=JOB_TIMEOUT_S, repeats=args.repeats,
                         sets={cell.name})

    all_cells = cells(args)
    for cell in all_cells:
        for launcher in args.launchers:
            peer = "ddp" if launcher == "mpirun" else "horovod"
            jobs.append(job(cell, launcher, launcher, ["bucketed", peer]))
            jobs += [job(cell, f"{launcher} {mb}/{path}", launcher, ["bucketed"], mb,
                         transfer=path) for mb, path in args.variants]
        jobs += [job(cell, f"mpirun {mb:g} MB", "mpirun", ["bucketed"], mb)
                 for mb in args.sweep]
    if args.slow_rank:
        r, f = args.slow_rank
        jobs.append(job(all_cells[0], f"mpirun slow {r}:{f:g}", "mpirun",
                        ["flat", "bucketed"], straggler=args.slow_rank))
    return jobs


def ms(v: float | None) -> float | None:
    return None if v is None else v * 1e3


TABLE = [Column("job", "", 29), Column("strategy", "", 9), Column("cap", "MB", 7),
         Column("buckets", "", 7), Column("step", "ms", 7, ".0f"), Column("p5", "ms", 6, ".0f"),
         Column("p95", "ms", 6, ".0f"), Column("compute", "ms", 7, ".0f"),
         Column("exposed", "ms", 7, ".0f"), Column("comm", "ms", 7, ".0f"),
         Column("overlap", "", 7, ".3f"), Column("link eff", "", 8, ".3f"),
         Column("#wrong", "", 6), Column("bound", "", 10)]


def bucket_of(s: dict) -> str | None:
    k = s.get("knobs") or {}
    mb = k.get("bucket_mb", k.get("bucket_cap_mb"))
    if mb is None:
        return None
    return f"{mb:g}" + ("*" if k.get("bucket_mb_auto") else "")


def caps_of(runs: Sequence[dict]) -> str:
    """The caps of a side's runs in words: ``cap 2* MB, 45 buckets`` where every run ran
    the same, else each cap with its count of runs (``--bucket-mb auto`` may choose
    differently run to run: the choice is an outcome, and the runs pool)."""
    got = Counter((bucket_of(s), buckets_of(s)) for s in runs)
    if len(got) == 1:
        (cap, n), = got
        return f"cap {cap} MB, {n} buckets"
    return "caps " + ", ".join(f"{cap} MB ({n} buckets) x {c}"
                               for (cap, n), c in got.most_common())


def buckets_of(s: dict) -> int | None:
    k = s.get("knobs") or {}
    return k.get("buckets", k.get("num_buckets"))


def link_efficiency(cell: Cell, s: dict) -> float | None:
    """The gradient's link bound at the measured link rate / comm per step."""
    gbps, comm = s.get("link_gbps"), s.get("comm_s")
    if not gbps or not comm:
        return None
    return cell.bound_bytes * 8 / (gbps * 1e9) / comm


def bound_of(s: dict) -> str:
    """A run's verdict as the table shows it: its set-up's (the runner's outcome rule, K
    against 2K, marked ``*``) where the run was placed at ``auto``, else its own counter
    reading."""
    if s.get("setup_bound"):
        return s["setup_bound"].split(" (")[0] + "*"
    return (s.get("bound") or "").split(" (")[0]


def row(cell: Cell, job: Job, s: dict) -> list:
    st = s["stats"]
    name = job.name + (f" r{s.get('repeat') or 0}" if (job.repeats or 1) > 1 else "")
    return [name, s["strategy"], bucket_of(s), buckets_of(s), ms(st["step_s"]["median"]),
            ms(st["step_s"]["p5"]), ms(st["step_s"]["p95"]), ms(s["compute_s"]),
            ms(s["exposed_sync_s"]), ms(s.get("comm_s")), s.get("overlap"),
            link_efficiency(cell, s), s.get("wrong"), bound_of(s)]


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fmt(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.3f}"


#: a goal's verdict from ``stats.decide``'s, in this benchmark's words
MET, NOT_MET, UNDECIDED = "met", "NOT met", "undecided"
_WORDS = {stats.REPRODUCED: MET, stats.REFUTED: NOT_MET, stats.UNDECIDED: UNDECIDED}


def spread(num: list[dict], den: list[dict], figure) -> stats.Spread:
    """The ratio of ``figure``'s median over ``num``'s repeats to its median over ``den``'s,
    with its spread (``stats.ratio_spread``: one run each is one value, fewer than 6 a side
    the range of every pairwise ratio, from 6 a bootstrap 95 % interval)."""
    def values(ss: list[dict]) -> list[float]:
        return [math.nan if v is None else v for v in map(figure, ss)]
    return stats.ratio_spread(values(num), values(den))


def median_of(ss: list[dict], key: str) -> float:
    return float(np.median([s[key] for s in ss]))


@dataclass
class Verdict:
    """Bucketed against the best peer in one cell: each goal's ratio with its spread over
    the repeats, and whether the goal is met, NOT met or undecided (the interval straddles
    the goal), or None where a job failed."""

    cell: str
    step: stats.Spread | None
    exposed: stats.Spread | None
    link: stats.Spread | None
    met: dict[str, str | None]
    lines: list[str]


def by_strategy(runs: dict[str, list[dict]]
                ) -> tuple[dict[tuple[str, str], list[dict]], list[str]]:
    """(job name, strategy) -> its summaries, one per repeat, pooled only where they are one
    set-up (``experiments.bench.one_setup``: every ``analysis.match`` field, revision and
    dilation included); and a line for each side whose other runs were left out."""
    out: dict[tuple[str, str], list[dict]] = {}
    for name, ss in runs.items():
        for s in ss:
            out.setdefault((name, s["strategy"]), []).append(s)
    notes = []
    for key, ss in out.items():
        out[key], left = one_setup(ss)
        if left:
            notes.append(f"  {key[0]} {key[1]}: {left} of {len(ss)} runs left out (another "
                         "revision, dilation or set-up than the rest; not pooled)")
    return out, notes


def judge(cell: Cell, runs: dict[str, list[dict]]) -> Verdict:
    """Bucketed against the best peer in one cell. ``runs`` maps each job's name within the
    cell (``mpirun``, ``horovodrun``, ``mpirun auto/ring``, ...) to its summaries, every
    repeat's; the verdict is on the launchers' own jobs (the flags given), variants get a
    line each against their launcher's peer.

    Bucketed is its better launcher's, the best peer the peer with the lower median step
    over the repeats. Each goal is decided on the paired repeats (``decided``): met when
    the 95 % interval lies on the goal's side, NOT met when it lies on the other,
    undecided when it straddles the goal or there are fewer than 3 repeats a side. The
    step goal (bucketed <= the best peer) is bucketed <= every peer, so it is met only
    when met against each peer and NOT met as soon as it is NOT met against one: which
    peer is best may itself be undecided; there bucketed is the best of its launchers
    (alpha / launchers). The other goals are against the best peer, also a pick (alpha /
    launchers x peers). The spreads (``Verdict.step`` ...) stay the ratios of medians
    as measured."""
    runs_of, pooled = by_strategy(runs)
    peers = {name: ss for (name, strategy), ss in runs_of.items() if strategy in PEERS}
    eff = lambda s: link_efficiency(cell, s)  # noqa: E731
    lines, bucketed = list(pooled), []
    for (name, strategy), bs in runs_of.items():
        if strategy != "bucketed":
            continue
        if name in peers:
            bucketed.append((name, bs))
        peer = peers.get(name.split(" ")[0])
        if peer is not None:
            lines.append(f"  {name}: bucketed ({caps_of(bs)}) / {peer[0]['strategy']}: step "
                         f"{spread(bs, peer, lambda s: s['step_s']).words('.3f')}, exposed "
                         f"sync {spread(bs, peer, lambda s: s['exposed_sync_s']).words('.3f')},"
                         f" link efficiency {spread(bs, peer, eff).words('.3f')}")
    if not bucketed or not peers:
        return Verdict(cell.name, None, None, None, dict.fromkeys(GOALS),
                       [f"{cell.name}: a job failed: no verdict", *lines])
    bl, b = min(bucketed, key=lambda x: median_of(x[1], "step_s"))
    pl, p = min(peers.items(), key=lambda x: median_of(x[1], "step_s"))
    steps = {name: spread(b, ps, lambda s: s["step_s"]) for name, ps in peers.items()}
    step = steps[pl]
    exposed = spread(b, p, lambda s: s["exposed_sync_s"])
    link = spread(b, p, eff)
    # bucketed is the best of its launchers' runs; against the best peer, also the best
    # of the peers: each decided at alpha / k for the picks (analysis.sequential)
    picks = len(bucketed)
    each_peer = {name: decided(b, ps, lambda s: s["step_s"], STEP_GOAL, True, picks)
                 for name, ps in peers.items()}
    verdicts = [v for v, _ in each_peer.values()]
    step_verdict = (NOT_MET if NOT_MET in verdicts else MET
                    if all(v == MET for v in verdicts) else UNDECIDED)
    ex_verdict, ex_d = decided(b, p, lambda s: s["exposed_sync_s"], EXPOSED_GOAL, True,
                               picks * len(peers))
    link_verdict, link_d = decided(b, p, eff, LINK_GOAL, False, picks * len(peers))
    met = {"step": step_verdict, "exposed": ex_verdict, "link": link_verdict}
    if math.isnan(link.value):
        met["link"] = None
    host = [s for s in b + [s for ps in peers.values() for s in ps]
            if is_link_bound(s) is False]
    if host:  # a side with a host-bound run holds this machine: neither met nor NOT met
        met = {g: (UNDECIDED if v is not None else None) for g, v in met.items()}
    reps = f", {min(len(b), len(p))} repeats" if max(len(b), len(p)) > 1 else ""
    head = (f"{cell.name} (compute x {cell.scale:g}, {cell.steps} steps{reps}): bucketed ({bl}) "
            f"/ best peer ({p[0]['strategy']}, {pl}): step "
            f"{_words(each_peer[pl][1], step)} [{met['step']}], exposed sync "
            f"{_words(ex_d, exposed)} [{met['exposed']}], link efficiency "
            f"{_words(link_d, link)} [{met['link'] or 'n/a'}]")
    if host:
        names = ", ".join(sorted({s["strategy"] for s in host}))
        head += f"; {len(host)} compared runs host-bound ({names}): the goals are not judged"
    return Verdict(cell.name, step, exposed, link, met, [head + latency_note(b + p), *lines])


def latency_note(summaries: list[dict]) -> str:
    """Where any of a cell's compared runs is latency-bound (``commbench.latency``: its
    calls x the emulated alpha are at least half its comm time), that, with the alpha:
    such a figure holds this host's per-message latency divided by K, and is not called
    converged by dilation alone."""
    lat = [s for s in summaries if s.get("latency_bound")]
    if not lat:
        return ""
    alphas = sorted(s["alpha_us"] for s in lat if isinstance(s.get("alpha_us"), (int, float)))
    alpha = f", emulated alpha {alphas[len(alphas) // 2]:.1f} us" if alphas else ""
    k = max(float(s.get("dilation") or 1.0) for s in lat)
    return (f"; latency-bound ({len(lat)} of {len(summaries)} runs{alpha} at K = {k:g}: the "
            "host's per-message latency / K, not converged by dilation alone)")


def decided(num: list[dict], den: list[dict], figure, goal: float, holds_below: bool,
            k: int) -> tuple[str, sequential.Decision | None]:
    """A goal on ``figure``'s ratio, decided on the paired runs (``stats.decide``: each
    side in repeat order, a 95 % confidence sequence from 3 runs a side, the figure the
    best of ``k``): met, NOT met, or undecided (below 3 runs a side, or straddling)."""
    def values(ss: list[dict]) -> list[float]:
        ordered = sorted(ss, key=lambda s: s.get("repeat") or 0)
        return [math.nan if v is None else v for v in map(figure, ordered)]
    try:
        d = stats.decide(values(num), values(den), goal, holds_below, k)
    except ValueError:  # a figure of 0 has no log-ratio
        return UNDECIDED, None
    return _WORDS[d.verdict], d


def _words(d: sequential.Decision | None, sp: stats.Spread) -> str:
    """The decision's figure as judged (its interval, or ``undecided (n runs: range ...)``),
    else the spread's words."""
    return d.words(".3f") if d is not None else sp.words(".3f")


GOALS = ("step", "exposed", "link")


def tally(verdicts: list[Verdict]) -> str:
    """How many cells met each goal, and how many were undecided or NOT met."""
    def count(goal: str) -> str:
        n = {w: sum(1 for v in verdicts if v.met[goal] == w) for w in (MET, UNDECIDED, NOT_MET)}
        return f"{n[MET]}" + "".join(f" ({n[w]} {w})" for w in (UNDECIDED, NOT_MET) if n[w])
    return (f"goals met in {len(verdicts)} cells: step <= {STEP_GOAL:.2f} in {count('step')}, "
            f"exposed sync <= {EXPOSED_GOAL:.2f} in {count('exposed')}, link efficiency >= "
            f"{LINK_GOAL:.2f} in {count('link')}")


def straggler_lines(by_job: dict[str, list[dict]], base: dict[str, dict]) -> list[str]:
    out = []
    slow = [ss for name, ss in by_job.items() if " slow " in name]
    for s in slow[0] if slow else []:
        b = base.get(s["strategy"])
        if b is None:
            continue
        out.append(f"straggler, {s['strategy']}: transfer "
                   f"{fmt(ratio(s.get('sync_transfer_s'), b.get('sync_transfer_s')))}x the run "
                   f"without; most any rank waited {ms(s.get('sync_wait_max_s')) or 0:.0f} ms "
                   f"(imbalance {ms(s.get('imbalance_s')) or 0:.0f} ms, straggler rank "
                   f"{s.get('straggler_rank')})")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = parser("benchmarks.peer_fairness", __doc__)

    def launchers(text: str) -> list[str]:
        out = [x.strip() for x in text.split(",") if x.strip()]
        if not out or set(out) - {"mpirun", "horovodrun"}:
            raise argparse.ArgumentTypeError(f"{text!r}: mpirun, horovodrun or both")
        return out

    def bucket(text: str) -> float | str:
        try:
            return parse_bucket_mb(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    p.add_argument("--models", type=names_arg(tuple(PROFILES)), default=list(PROFILES),
                   help=f"models by their committed profile: {', '.join(PROFILES)}")
    p.add_argument("--layouts", type=layouts, default=[(2, 1), (2, 2), (2, 4)],
                   help="NODESxRANKS,...")
    p.add_argument("--launchers", type=launchers, default=["mpirun", "horovodrun"],
                   help="mpirun (bucketed against DDP), horovodrun (against Horovod)")
    p.add_argument("--rate", default="1gbit", help="link rate per node (tc syntax)")
    p.add_argument("--balance", type=float, default=1.0,
                   help="backward / the gradient's link bound, by scaling the profile")
    p.add_argument("--bucket-mb", type=bucket, default=DEFAULT_BUCKET_MB, metavar="MB|auto",
                   help="bucketed's cap (DDP keeps its default)")
    p.add_argument("--transfer", default=None,
                   help="bucketed's transfer path (default: the tool's)")
    def variants(text: str) -> list[tuple[float | str, str]]:
        out = []
        for v in (x.strip() for x in text.split(",") if x.strip()):
            mb, _, path = v.partition("/")
            if path not in TRANSFER_CHOICES:
                raise argparse.ArgumentTypeError(f"variant {v!r}: write CAP/PATH, PATH one of "
                                                 f"{', '.join(TRANSFER_CHOICES)}")
            out.append((bucket(mb), path))
        return out

    p.add_argument("--variants", type=variants, default=[], metavar="CAP/PATH,...",
                   help="more bucketed runs per cell and launcher, e.g. auto/ring,25/thread: "
                        "a job each")
    p.add_argument("--sweep", type=lambda t: [float(x) for x in t.split(",") if x.strip()],
                   default=[], help="more bucketed caps (MB), an mpirun job each per cell")
    p.add_argument("--slow-rank", type=lambda t: slow_rank(t) if t else None,
                   default=None, metavar="R:F",
                   help="an mpirun job of flat and bucketed with this straggler, first cell")
    p.add_argument("--repeats", type=repeats_arg, default=1, metavar="N",
                   help="run every job N times (launch.sweep --repeats: each a job of its "
                        "own, shuffled within its cluster); each goal is then judged on the "
                        "spread of its ratio over the repeats: met, NOT met or undecided")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    add_output_flags(p, "peer-fairness")
    return p


def refuse(args: argparse.Namespace) -> str | None:
    try:
        cells(args)
    except ClusterError as e:
        return str(e)
    return None


def check(args: argparse.Namespace, jobs: list[Job], runner: Runner) -> int:
    all_cells = cells(args)
    by_job = {job.name: [s for path in runner.outputs(job) for s in records(path, "summary")]
              for job in jobs}
    # a run placed at auto is judged by its set-up's verdict (dilations.json), not its own
    mark_setup_verdicts([s for ss in by_job.values() for s in ss])
    rows, footer = [], []
    verdicts = []
    for cell in all_cells:
        mine = [j for j in jobs if j.name.startswith(cell.name + " ")]
        rows += [row(cell, j, s) for j in mine for s in by_job[j.name]]
        runs = {j.name.removeprefix(cell.name + " "): by_job[j.name] for j in mine
                if j.placement.launcher in j.name and " MB" not in j.name
                and " slow " not in j.name}
        verdicts.append(judge(cell, runs))
        footer += verdicts[-1].lines
    first = all_cells[0]
    footer += straggler_lines(by_job, {s["strategy"]: s
                                       for s in by_job.get(f"{first.name} mpirun", [])})
    footer.append(tally(verdicts))
    ks = sorted({float(s.get("dilation") or 1.0) for ss in by_job.values() for s in ss})
    k = ", ".join(f"{x:g}" for x in ks) if ks else (args.dilation or 1)
    print(format_table(TABLE, rows, title=f"peer_fairness  links {args.rate}  dilation {k}  "
                       f"backward = {args.balance:g} x the gradient's link bound  "
                       f"at least {args.steps} steps (+{args.warmup} warm-up)"
                       + (f"  {args.repeats} repeats" if args.repeats > 1 else ""),
                       footer=["medians over measured steps of the critical-path rank; cap * "
                               "= chosen by --bucket-mb auto; Horovod's comm is an upper bound "
                               "(first ready gradient to the end of synchronize); bound * = "
                               "the set-up's verdict (outcome rule: K against 2K, "
                               "dilations.json), else the run's own counter reading",
                               *([] if args.repeats == 1 else [
                                   "ratios: of the medians over the repeats; range: of every "
                                   "pairwise ratio (fewer than 6 repeats); a goal is met or "
                                   "NOT met only where the whole spread says so"]),
                               *footer, f"{time.monotonic() - args.started:.0f} s; records: "
                               f"{runner.outdir}"]))
    return 0


BENCHMARK = Benchmark("peer-fairness", build_parser, plan, check, refuse)
main = BENCHMARK.main


if __name__ == "__main__":
    sys.exit(main())
