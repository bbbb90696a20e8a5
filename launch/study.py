"""The whole study in one command: the runs every seed claim needs, then the report.

    python -m launch.study                       # emulated 2 x 4 cluster; says how long first
    python -m launch.study --quick               # fewer steps and points, ResNet-18 (~10 min)
    python -m launch.study --claims C2,C4 --dry-run      # list the jobs, run nothing
    python -m launch.study --hosts a:8,b:8 --launcher horovodrun   # a real cluster
    python -m launch.study --quick --launcher torchrun   # the torch backend (Gloo), torchrun
    python -m launch.study --quick --dilation 4        # every emulated job at dilation 4

On the emulated cluster every job runs time-dilated (``commbench.dilation``):
``--dilation auto``, the default there, probes each cluster (layout and link
rate) with its largest job, shortened, at K = 1, 2, 4, 8 and runs all of that
cluster's jobs at the smallest K whose probe is link-bound (``launch.sweep``'s
``Dilations``), so runs compared with one another share K.

Each claim of shared/DESIGN.md §1 gets its runs as one matched set-up
(``analysis.match``): the same cluster, ranks, model, replayed compute and
batch, differing only in the claim's own variable.

- C1 (sync share vs workers): flat native on 1…N ranks (fill-first on the
  nodes, so ranks beyond one node's slots cross the link).
- C2 (hierarchical vs flat): flat native, ring, hier and hier-leader on all
  ranks of the 2-node cluster, at two link rates (one matched set each).
- C3 (buckets): bucketed at each ``bucket_mb`` (0 = per tensor) beside flat.
- C4 (async): async s in {0, 1, 2, 4} and flat, without and with a straggler
  (``--slow-rank``; one matched set each), plus the convergence study on
  digits (``commbench.staleness``): s in {0, 1, 2, 4}, without and with the
  staleness-aware learning rate, over seeds 0, 1, 2, for the time to a target
  held-out accuracy (what staleness costs, speed and accuracy together).
- C5, C6, C8 (batch, memory, accuracy): the real workload (small CNN on
  digits, held-out accuracy) at three batch sizes; the full study adds the
  synthetic workload at batch 256 and 1024 with the H200 profiles of those
  batches, for throughput at the claim's own batches.
- C7 (accumulation): flat native at k in {1, 2, 4}.

Runs shared by claims run once (the 8-rank flat native run is C1's largest
point, C2-C4's synchronous reference and C7's k = 1). The jobs go through
``launch.sweep`` (resumable: run the same command again and finished jobs are
skipped; a progress line per job with the time left), then
``python -m analysis.report`` writes ``<output>/report/README.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from analysis import stats
from analysis.claims import check_all
from analysis.load import LoadError, load
from commbench import dilation as dil
from commbench import metrics
from commbench.allreduce import Config, runs_of
from commbench.cores import BUSY_LOAD_FRACTION
from commbench.flags import ToolConfig, to_argv
from commbench.microbench import MicroConfig
from commbench.models.registry import parameter_shapes
from commbench.results import write_atomic
from commbench.staleness import StudyConfig, seeded_runs
from commbench.strategies.settings import StrategySettings
from launch import commands, links
from launch import sweep as sweeps
from launch.cluster import (
    ClusterError,
    ClusterSpec,
    check_machine,
    launch_argv,
    node_slots,
    parse_rate,
)

CLAIMS = ("C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8")
ROOT = Path(__file__).resolve().parents[1]
PROFILES = "profiles"  # committed H200 profiles, relative to the repository root

# Rough figures for the time estimate only (the progress line's estimate of what remains
# is rescaled by how long finished jobs really took):
STARTUP_S = 20.0  # the launcher + every rank importing torch on a 2-core machine, + validation
LINK_EFFICIENCY = 0.95  # tbf-shaped links carry 0.944-0.956 of their rate (DESIGN.md §9)
SHM_BYTES_S = 1.1e9  # one node's shared memory, busbw (DESIGN.md §9)
HOST_S_PER_PARAM = 2.6e-9  # writing gradients + SGD per parameter and rank per core
# (README: 270 ms for 25.6 M parameters with 8 ranks on 2 cores)
REAL_S_PER_SAMPLE = 6e-4  # small CNN on digits at 32 px, per sample on one core (2 ranks on
# 2 cores trained ~3200 samples/s)
ASSUMED_GBPS = 1.0  # a real cluster's link, for the estimate only (its rate is not known)


class StudyError(Exception):
    """Bad input; the message names the flag."""


@dataclass(frozen=True)
class Scale:
    """What one study runs: the full study or ``--quick``."""

    model: str  # synthetic workload's model
    profile: str  # replayed H200 compute, recorded at ``batch``
    batch: int
    #: factor on the profile's times (``--compute-scale``): an H200 beside a 25-100 Gbit/s
    #: link computes about as long as that link moves the gradient; at the emulated
    #: 1 Gbit/s, unscaled H200 backward would be ~2 % of flat's transfer and nothing
    #: could overlap it (C3 would be refuted by the set-up, not by bucketing). Scaled so
    #: that backward takes about as long as flat's transfer on 2 x 4 at 1 Gbit/s.
    compute_scale: float
    steps: int
    warmup: int
    every_rank: bool  # C1 at every rank count up to 8 (else powers of two), and the cluster's
    rates: tuple[str, str]  # C2's two link rates (emulated cluster)
    slow_algos: tuple[str, ...]  # C2 algorithms at the second rate
    bucket_mb: tuple[float, ...]
    staleness: tuple[int, ...]
    straggler_factor: float
    accum: tuple[int, ...]
    real_batches: tuple[int, ...]  # C5/C6 on the real workload
    real_steps: int
    conv_steps: int  # convergence study on digits, to a target accuracy (time to accuracy)
    conv_staleness: tuple[int, ...]
    conv_mitigations: str
    conv_seeds: tuple[int, ...]  # its repeats: every configuration once per seed
    conv_ps: bool
    profile_batches: tuple[int, ...]  # C5 with replayed compute at the claim's batches
    micro_iters: int  # timed all-reduces per size in the cost model's microbenchmarks
    #: jobs per point (``launch.sweep --repeats``): every compared figure then has a spread
    #: over repeats (a 95 % interval from 6, the range below; ``analysis.stats``)
    repeats: int


FULL = Scale(model="resnet50", profile="h200-resnet50-b256.json", batch=256, compute_scale=20.0,
             steps=20, warmup=3,
             every_rank=True, rates=("1gbit", "200mbit"),
             slow_algos=("native", "ring", "hier", "hier-leader"),
             bucket_mb=(0, 1, 5, 25, 64, 128), staleness=(0, 1, 2, 4), straggler_factor=2.0,
             accum=(1, 2, 4), real_batches=(16, 64, 128), real_steps=100, conv_steps=200,
             conv_staleness=(0, 1, 2, 4), conv_mitigations="none,lr", conv_seeds=(0, 1, 2),
             conv_ps=True, profile_batches=(256, 1024),
             micro_iters=10, repeats=3)
QUICK = Scale(model="resnet18", profile="h200-resnet18-b64.json", batch=64, compute_scale=50.0,
              steps=6, warmup=1,
              every_rank=False, rates=("1gbit", "200mbit"), slow_algos=("ring", "hier"),
              bucket_mb=(0, 25), staleness=(0, 1, 4), straggler_factor=2.0, accum=(1, 4),
              real_batches=(16, 64, 128), real_steps=40, conv_steps=100,
              conv_staleness=(0, 1, 2, 4), conv_mitigations="none,lr", conv_seeds=(0, 1, 2),
              conv_ps=False, profile_batches=(),
              micro_iters=5, repeats=2)


@dataclass(frozen=True)
class Cluster(commands.NodeSlots):
    """Where the jobs run: the emulated cluster (``rates`` shaped) or a real one (``hosts``)."""

    nodes: int
    slots: int | tuple[int, ...]  # every node's, or one per node (3 + 1: (3, 1))
    launcher: str = "mpirun"
    hosts: str | None = None  # a real cluster; None: emulated
    dilation: float | str = 1.0  # time dilation of the emulated cluster, or "auto"

    @property
    def node_slots(self) -> list[int]:
        """Slots of each node, in the order ranks fill them."""
        return [self.slots] * self.nodes if isinstance(self.slots, int) else list(self.slots)

    @property
    def emulated(self) -> bool:
        return self.hosts is None


def default_ranks(scale: Scale, cluster: Cluster) -> list[int]:
    """C1's rank counts: 1..N on up to 8 ranks in the full study, else powers of two; and
    the whole cluster, N."""
    n = cluster.ranks
    if scale.every_rank and n <= 8:
        return list(range(1, n + 1))
    return sorted({*(2 ** i for i in range(n.bit_length()) if 2 ** i < n), n})


@dataclass
class Job:
    """One job of the study: a tool's typed configuration (its program is the module that
    owns it: ``commbench.allreduce.Config`` runs ``python -m commbench.allreduce``), the ranks
    and link rate it runs on, and the claims it serves."""

    name: str
    claims: set[str]
    ranks: int
    config: ToolConfig
    rate: str | None = None  # emulated link rate
    estimate_s: float = 0.0
    #: jobs of this point; None: the study's ``--repeats`` (the convergence study repeats
    #: itself over seeds, inside one job)
    repeats: int | None = None

    @property
    def program(self) -> str:
        return type(self.config).__module__

    @property
    def args(self) -> list[str]:
        """The tool's command line for ``config`` (``commbench.flags.to_argv``)."""
        return to_argv(self.config)

    def point(self, cluster: Cluster) -> dict:
        p: dict = {"name": self.name, "ranks": self.ranks}
        if cluster.emulated:
            slots = cluster.slots if isinstance(cluster.slots, int) else list(cluster.slots)
            p.update(nodes=cluster.nodes, slots=slots, rate=self.rate or "none")
            if cluster.dilation != 1:
                p["dilation"] = cluster.dilation
        p.update(program=self.program, args=self.args, estimate_s=round(self.estimate_s),
                 timeout=float(max(600, round(4 * self.estimate_s))))
        if self.repeats is not None:
            p["repeats"] = self.repeats
        return p


# -- the plan ---------------------------------------------------------------------------

def _synthetic(scale: Scale, strategy: str = "flat", algos: str = "native", *,
               profile: str | None = None, batch: int | None = None,
               sync: StrategySettings | None = None, slow_rank: tuple[int, float] | None = None
               ) -> Config:
    """``commbench.allreduce`` on the replayed H200 profile of ``scale``."""
    return Config(workload="synthetic", model=scale.model,
                  compute_profile=f"{PROFILES}/{profile or scale.profile}",
                  compute_scale=scale.compute_scale, batch_size=batch or scale.batch,
                  steps=scale.steps, warmup=scale.warmup, quiet=True,
                  strategies=[strategy], algos=algos.split(","), slow_rank=slow_rank,
                  sync=sync or StrategySettings())


def plan(scale: Scale, cluster: Cluster, claims: Sequence[str] = CLAIMS,
         ranks: Sequence[int] | None = None) -> list[Job]:
    """Every job the ``claims`` need, each once, those sharing a link rate together."""
    jobs: dict[str, Job] = {}
    n = cluster.ranks
    rates = scale.rates if cluster.emulated else (None,)
    fast = rates[0]

    def add(name: str, claim: str, nranks: int, config: ToolConfig,
            rate: str | None = fast) -> None:
        if name in jobs:
            jobs[name].claims.add(claim)
        else:
            jobs[name] = Job(name, {claim}, nranks, config, rate)

    # the 8-rank flat run at the first rate: C1's largest point and everyone's reference
    for claim in ("C2", "C3", "C4", "C7"):
        add(f"flat-np{n}", claim, n, _synthetic(scale, algos="native,ring,hier,hier-leader"))
    for p in ranks or default_ranks(scale, cluster):
        add(f"flat-np{p}", "C1", p, _synthetic(scale))  # (p = n is the reference above)
    for rate in rates[1:]:
        add(f"flat-np{n}-{rate}", "C2", n, _synthetic(scale, algos=",".join(scale.slow_algos)),
            rate)
    for mb in scale.bucket_mb:
        add(f"bucketed-{mb:g}mb", "C3", n,
            _synthetic(scale, "bucketed", sync=StrategySettings(bucket_mb=float(mb))))
    slow = (n - 1, scale.straggler_factor)  # the last rank: on the last node
    for straggler in (None, slow):
        suffix = "-straggler" if straggler else ""
        if straggler:
            add(f"flat-np{n}{suffix}", "C4", n, _synthetic(scale, slow_rank=straggler))
        for s in scale.staleness:
            add(f"async-s{s}{suffix}", "C4", n,
                _synthetic(scale, "async", sync=StrategySettings(staleness=s),
                           slow_rank=straggler))
    add("convergence-digits", "C4", n,
        StudyConfig(staleness=list(scale.conv_staleness),
                    mitigations=scale.conv_mitigations.split(","), steps=scale.conv_steps,
                    seeds=list(scale.conv_seeds), eval_every=10, quiet=True, ps=scale.conv_ps))
    jobs["convergence-digits"].repeats = 1  # it repeats itself over seeds, in one job
    for b in scale.real_batches:
        for claim in ("C5", "C6", "C8"):
            add(f"real-digits-b{b}", claim, n,
                Config(strategies=["flat"], algos=["native"], workload="real",
                       model="smallcnn", dataset="digits", image_size=32, num_classes=10,
                       lr=0.02,  # commbench.staleness's: 0.05 diverges on 4 ranks
                       batch_size=b, steps=scale.real_steps, warmup=scale.warmup, quiet=True))
    for b in scale.profile_batches:  # replayed compute of the claim's own batches
        profile = f"h200-{scale.model}-b{b}.json"
        if (profile, b) == (scale.profile, scale.batch):  # the reference run is one of them
            jobs[f"flat-np{n}"].claims.add("C5")
        else:
            add(f"flat-np{n}-b{b}", "C5", n, _synthetic(scale, profile=profile, batch=b))
    # the cost model's fit and its check (C1's extrapolation, the error on these runs):
    # ring, native and hierarchical all-reduces of 64 KiB..64 MiB on one node (fixes the
    # intra-node alpha-beta) and on every node at the first rate (fixes the link's)
    local = cluster.node_slots[0]

    def micro(algos: str) -> MicroConfig:
        # sync_each: each timed call starts together, as a training step's all-reduce does
        # (back to back, Open MPI's native ran at about half its speed across 2 nodes: its
        # put protocol over TCP when ranks enter apart, docs/microbench.md)
        return MicroConfig(minbytes=64 << 10, maxbytes=64 << 20, stepfactor=4,
                           iters=scale.micro_iters, warmup_iters=2, sync_each=True,
                           quiet=True, algos=algos.split(","))

    if local >= 2:
        add(f"microbench-np{local}", "C1", local, micro("native,ring"))
    if cluster.nodes >= 2:
        add(f"microbench-np{n}", "C1", n, micro("native,ring,hier"))
    for k in scale.accum:
        if k != 1:
            add(f"accum-k{k}", "C7", n, _synthetic(scale, sync=StrategySettings(accum_steps=k)))
    wanted = set(claims)
    out = [j for j in jobs.values() if j.claims & wanted]
    out.sort(key=lambda j: rates.index(j.rate))  # stable: one cluster per rate, brought up once
    for j in out:
        j.estimate_s = estimate(j, scale, cluster)
    return out


def _shaping(rate: str | None) -> str | None:
    """``link_shaping`` as ``launch.cluster.launch_argv`` gives it to the ranks."""
    r = parse_rate(rate)
    return None if r is None else links.shaping_text(r)


def _gbps(rate: str | None) -> float | None:
    r = parse_rate(rate)
    return None if r is None else r * LINK_EFFICIENCY


# -- how long ------------------------------------------------------------------------------

def _params(model: str) -> int:
    return sum(math.prod(s) for _, s in parameter_shapes(model, 10 if model == "smallcnn"
                                                         else 1000))


def _ring_s(job: Job, cluster: Cluster, nbytes: float) -> float:
    """Seconds a ring all-reduce of ``nbytes`` takes on ``job``'s ranks: the bytes each
    rank sends through shared memory (all on the first node) or the link."""
    moved = metrics.ring_bytes(nbytes, job.ranks)
    if job.ranks <= cluster.node_slots[0]:  # all on the first node
        return moved / SHM_BYTES_S
    gbps = _gbps(job.rate) if cluster.emulated else ASSUMED_GBPS
    return moved * 8 / ((gbps or ASSUMED_GBPS) * 1e9)


def estimate(job: Job, scale: Scale, cluster: Cluster) -> float:
    """Seconds ``job`` should take here: start-up, then per run (warm-up + steps +
    validation) compute + the all-reduce's bytes through the link (or shared memory).
    Rough: the study rescales it by how long the finished jobs took."""
    cores = os.cpu_count() or 1
    share = max(1.0, job.ranks / cores)  # ranks sharing each core
    cfg = job.config
    if isinstance(cfg, StudyConfig):
        runs = len(seeded_runs(cfg))
        step = 32 * REAL_S_PER_SAMPLE * share
        return STARTUP_S + runs * cfg.steps * step * 1.2  # + evaluations
    if isinstance(cfg, MicroConfig):  # every size, each algorithm: ~ its link time
        per_iter = _ring_s(job, cluster, sum(cfg.sizes())) * len(cfg.algos)
        return STARTUP_S + (cfg.iters + cfg.warmup_iters) * per_iter
    if not isinstance(cfg, Config):
        raise TypeError(f"no estimate for {type(cfg).__name__}")
    params = _params(cfg.model)
    batch, k = cfg.batch_size, cfg.sync.accum_steps
    if cfg.workload == "real":
        compute = batch * REAL_S_PER_SAMPLE * share
    else:
        prof = json.loads((ROOT / cfg.compute_profile).read_text())
        compute = (prof["forward_s"] + prof["backward_s"] + prof["optimizer_s"]) \
            * cfg.compute_scale
        compute += params * HOST_S_PER_PARAM * share
        compute *= cfg.slow_rank[1] if cfg.slow_rank else 1.0
    comm = _ring_s(job, cluster, params * 4)
    steps = cfg.steps + cfg.warmup + 1
    return STARTUP_S + len(runs_of(cfg)) * steps * (k * compute + comm)


def _fmt(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    return f"{s / 3600:.1f} h" if s >= 5400 else f"{s / 60:.0f} min"


# -- input -------------------------------------------------------------------------------

def parse_claims(text: str) -> list[str]:
    claims = [c.strip().upper() for c in text.split(",") if c.strip()]
    unknown = [c for c in claims if c not in CLAIMS]
    if unknown or not claims:
        raise StudyError(f"--claims: unknown claim {', '.join(unknown) or repr(text)}; the "
                         f"claims are {', '.join(CLAIMS)} (shared/DESIGN.md §1)")
    return claims


def parse_hosts(hosts: str | None, hostfile: str | None) -> str | None:
    """``a:8,b:8`` from ``--hosts`` or an Open MPI host file (``a slots=8`` per line)."""
    if hostfile:
        try:
            lines = Path(hostfile).read_text().splitlines()
        except OSError as e:
            raise StudyError(f"--hostfile {hostfile}: {e.strerror}") from None
        out = []
        for line in lines:
            words = line.split("#")[0].split()
            if not words:
                continue
            slots = next((w.split("=")[1] for w in words[1:] if w.startswith("slots=")), "1")
            out.append(f"{words[0]}:{slots}")
        hosts = ",".join(out)
        if not hosts:
            raise StudyError(f"--hostfile {hostfile}: no hosts in it")
    if hosts is None:
        return None
    try:
        return commands.NodeSet.parse(hosts, "--hosts").hosts_arg()
    except ValueError as e:
        raise StudyError(str(e)) from None


def make_cluster(a: argparse.Namespace) -> Cluster:
    hosts = parse_hosts(a.hosts, a.hostfile)
    try:
        k = dil.parse(a.dilation, allow_auto=True) if a.dilation is not None else None
    except dil.DilationError as e:
        raise StudyError(str(e)) from None
    if hosts:
        if k not in (None, 1.0):
            raise StudyError(f"--dilation {a.dilation}: time dilation applies to emulated links "
                             f"only, and --{'hostfile' if a.hostfile else 'hosts'} names a real "
                             "cluster; leave --dilation out")
        slots = commands.NodeSet.parse(hosts).node_slots
        return Cluster(len(slots), slots[0] if len(set(slots)) == 1 else tuple(slots),
                       a.launcher, hosts)

    listed = a.slots is not None and "," in a.slots
    try:  # default 2 nodes x 4 slots; a per-node list gives the nodes
        per_node = node_slots(a.nodes if a.nodes is not None or listed else 2,
                              a.slots if a.slots is not None else "4")
    except ClusterError as e:
        raise StudyError(str(e)) from None
    slots = per_node[0] if not listed else tuple(per_node)
    return Cluster(len(per_node), slots, a.launcher, dilation="auto" if k is None else k)


def check(cluster: Cluster, claims: Sequence[str], ranks: Sequence[int] | None,
          scale: Scale) -> None:
    """Refuse what cannot run before any job starts."""
    wanted = list(ranks or default_ranks(scale, cluster))
    where = cluster.layout + ("" if cluster.emulated else f" ({cluster.hosts})")
    too_many = [r for r in wanted if r > cluster.ranks]
    if too_many:
        raise StudyError(f"--ranks {max(too_many)}: more ranks than the cluster has "
                         f"({where} = {cluster.ranks}); give --nodes/--slots or --hosts for a "
                         "bigger one, or fewer --ranks")
    if any(r < 1 for r in wanted):
        raise StudyError("--ranks: every rank count must be >= 1")
    if cluster.nodes < 2 and "C2" in claims:
        raise StudyError(f"C2 compares hierarchical with flat all-reduce across nodes, but the "
                         f"cluster has one node ({where}); use --nodes 2 or more, or leave C2 "
                         "out of --claims")
    # Every launcher's backend but Horovod on Gloo has point-to-point messages and receives
    # from any rank: MPI, and the torch backend on Gloo (torchrun; on CPUs its library is
    # Gloo). Horovod on Gloo has only its collectives.
    needs_p2p = sorted({"C2", "C4"} & set(claims))
    if cluster.launcher == "horovodrun-gloo" and needs_p2p:
        verb = "needs" if len(needs_p2p) == 1 else "need"
        raise StudyError(f"--launcher horovodrun-gloo: {' and '.join(needs_p2p)} {verb} "
                         "point-to-point messages (the project's ring; the parameter "
                         "server), which Horovod on Gloo does not offer; use mpirun, "
                         "horovodrun or torchrun, or leave them out of --claims")
    if cluster.ranks < 2 and {"C2", "C3", "C4", "C7"} & set(claims):
        raise StudyError(f"the cluster has one rank ({where}): nothing to synchronise")
    if cluster.emulated:
        for r in scale.rates:
            try:
                parse_rate(r)
            except ClusterError as e:
                raise StudyError(str(e)) from None


def parse_duration(text: str, flag: str = "--budget") -> float:
    """``8h``, ``90m``, ``1h30m``, ``45s`` or plain seconds, in seconds; a StudyError naming
    ``flag`` otherwise."""
    t = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        seconds = float(t)
    else:
        parts = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", t)
        if not t or parts is None:
            raise StudyError(f"{flag} {text!r}: expected a duration such as 8h, 90m, 1h30m or "
                             "3600s")
        h, m, sec = (float(x) if x else 0.0 for x in parts.groups())
        seconds = 3600 * h + 60 * m + sec
    if seconds <= 0:
        raise StudyError(f"{flag} {text!r}: must be more than 0")
    return seconds


def repeat_until_args(pct: float | None, budget: str | None) -> tuple[float, float] | None:
    """``--repeat-until`` and ``--budget`` checked: (percent, seconds), or None."""
    if pct is None:
        if budget is not None:
            raise StudyError("--budget: it bounds --repeat-until, which was not given")
        return None
    if not 0 < pct < 100:
        raise StudyError(f"--repeat-until {pct:g}: a percentage between 0 and 100 (the "
                         "interval's half-width wanted, relative to its figure)")
    if budget is None:
        raise StudyError("--repeat-until needs --budget DURATION (how long the study may take "
                         "in all, e.g. 8h): repeats could otherwise run without end")
    return pct, parse_duration(budget)


#: a repeat's job id: its point's id and ``-r<repeat>`` (``launch.sweep.Sweep.jobs``)
_REPEAT_SUFFIX = re.compile(r"-r\d+$")


def claim_points(claim, records: Sequence[dict]) -> set[str]:
    """The sweep point ids of the runs behind ``claim``'s figures (their files' names, less
    a repeat's suffix)."""
    ids = {i for runs in claim.runs.values() for i in runs}
    return {_REPEAT_SUFFIX.sub("", Path(r["_file"]).stem) for r in records
            if str(r.get("run_id")) in ids and r.get("_file")}


def _job_seconds(out: Path, pid: str) -> float | None:
    """Mean wall seconds of a point's finished jobs (their ``.done.json``), None if none."""
    secs = []
    for f in out.glob(f"{pid}*.done.json"):
        if _REPEAT_SUFFIX.sub("", f.name.removesuffix(".done.json")) == pid:
            secs.append(json.loads(f.read_text()).get("seconds") or 0.0)
    return sum(secs) / len(secs) if secs else None


UNTIL_FILE = "repeat-until.json"


def repeat_until(sweep: sweeps.Sweep, out: Path, pct: float, budget_s: float,
                 started: float, log=sys.stderr) -> dict[str, int]:
    """Add repeats to the points behind every claim whose compared figure is not yet within
    +-``pct`` % (``stats.within``: a 95 % interval whose larger half is at most ``pct`` % of
    the figure), as many as ``stats.repeats_for_precision`` asks, one more job per point in
    turn while the jobs' measured wall time fits what is left of ``budget_s`` (counted from
    ``started``, the study's start); run them (``launch.sweep``, resumed); judge again; stop
    when every figure is within, or nothing more fits. What happened goes to
    ``<out>/repeat-until.json``, which the report states."""
    points = {sweeps.point_id(p, sweep): p for p in sweep.point_list or []}
    counts = {"done": 0, "failed": 0}
    rounds: list[dict] = []
    stopped = ""
    while True:
        try:
            records = load([out]).records
        except LoadError as e:
            stopped = f"the results could not be read: {e}"
            break
        judged = []
        need: dict[str, int] = {}
        for c in check_all(records, None):
            sp = c.spread
            if sp is None or sp.kind == stats.NONE:
                continue
            ok = stats.within(sp, pct)
            judged.append({"claim": c.id, "spread": sp.words(), "within": ok,
                           "verdict": c.verdict})
            if not ok:
                want = stats.repeats_for_precision(sp, pct)
                for pid in claim_points(c, records):
                    if pid in points:
                        need[pid] = max(need.get(pid, 0), want)
        if not need:
            stopped = f"every compared figure is within +-{pct:g} %"
            break
        left = budget_s - (time.time() - started)
        cost = {pid: _job_seconds(out, pid) or points[pid].get("estimate_s") or 60.0
                for pid in need}
        added: dict[str, int] = {}
        spend = 0.0
        grew = True
        while grew:  # one more job per needy point in turn, while the budget allows
            grew = False
            for pid, want in sorted(need.items()):
                now_n = points[pid].get("repeats", sweep.repeats) + added.get(pid, 0)
                if now_n < want and spend + cost[pid] <= left:
                    added[pid] = added.get(pid, 0) + 1
                    spend += cost[pid]
                    grew = True
        if not added:
            stopped = (f"the budget is spent: {_fmt(max(left, 0))} left, and the next job "
                       f"takes ~{_fmt(min(cost.values()))}")
            break
        for pid, n in added.items():
            points[pid]["repeats"] = points[pid].get("repeats", sweep.repeats) + n
        rounds.append({"added": {points[pid].get("name", pid): n for pid, n in added.items()},
                       "expected_s": round(spend), "before": judged})
        print(f"# repeat-until {pct:g} %: {sum(added.values())} more jobs (~{_fmt(spend)}; "
              f"{_fmt(left)} of the budget left) for "
              + ", ".join(j["claim"] for j in judged if not j["within"]), file=log, flush=True)
        more = sweeps.run_sweep(sweep, log)
        for k in counts:
            counts[k] += more[k]
        if more["failed"]:
            stopped = f"{more['failed']} jobs failed"
            break
    write_atomic(out / UNTIL_FILE, json.dumps({
        "pct": pct, "budget_s": budget_s, "spent_s": round(time.time() - started),
        "rounds": rounds, "claims": judged if not stopped.startswith("the results") else [],
        "stopped": stopped,
        "repeats": {p.get("name", pid): p.get("repeats", sweep.repeats)
                    for pid, p in points.items()}}, indent=1))
    print(f"# repeat-until {pct:g} %: {stopped}", file=log, flush=True)
    return counts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m launch.study",
        description="Run every experiment the seed claims C1-C8 need (shared/DESIGN.md §1) "
                    "on the emulated cluster or a real one, resumably, then write the report.",
        epilog="Run it again with the same flags to resume: finished jobs are skipped.")
    p.add_argument("--quick", action="store_true",
                   help="fewer steps and points, ResNet-18 with its H200 profile (~10 min on 2 "
                        "cores)")
    p.add_argument("--claims", type=str, default=",".join(CLAIMS), metavar="C1,C2,...",
                   help="only the jobs these claims need (default: all)")
    p.add_argument("--ranks", type=str, default=None, metavar="N,N",
                   help="C1's rank counts (default 1..8 on 8 ranks; --quick or more ranks: "
                        "powers of two, and the whole cluster)")
    p.add_argument("--dry-run", action="store_true", help="list every job; run nothing")
    p.add_argument("-o", "--output", default=None,
                   help="results directory (default results/study or results/study-quick); "
                        "the report goes to its report/")
    g = p.add_argument_group("where (default: an emulated cluster on this machine, as root)")
    g.add_argument("--nodes", type=int, default=None,
                   help="emulated nodes (default 2, or as many as --slots lists)")
    g.add_argument("--slots", default=None, metavar="S|S1,S2,...",
                   help="ranks per emulated node: one number for every node (default 4) or "
                        "one per node (3,1)")
    g.add_argument("--hosts", default=None, metavar="A:8,B:8",
                   help="a real cluster's hosts and slots (no link shaping: one link rate)")
    g.add_argument("--hostfile", default=None, help="or an Open MPI host file (HOST slots=N)")
    g.add_argument("--launcher", choices=commands.LAUNCHERS, default="mpirun",
                   help="how ranks start, and so the backend (default mpirun: MPI; "
                        "horovodrun: Horovod; torchrun: torch.distributed on Gloo, one "
                        "torchrun per node)")
    g.add_argument("--dilation", default=None, metavar="K|auto",
                   help="time dilation of the emulated cluster (launch.cluster --dilation): "
                        "auto, the default there, runs each cluster's jobs at the smallest of "
                        "1, 2, 4, 8 at which a short probe of its largest job is link-bound; "
                        "1: none. Emulated clusters only")
    g = p.add_argument_group("scale (smaller for a smoke test; verdicts then rest on less)")
    g.add_argument("--repeats", type=int, default=None, metavar="N",
                   help="jobs per point, each its own job, shuffled within each cluster: the "
                        "spread every compared figure is judged with (default 3; --quick 2)")
    g.add_argument("--repeat-until", type=float, default=None, metavar="PCT",
                   help="then add repeats to the points behind each claim whose figure's "
                        "interval is wider than +-PCT %% of it, until every one is within or "
                        "--budget is spent (needs --budget)")
    g.add_argument("--budget", default=None, metavar="DURATION",
                   help="wall time the whole study may take with --repeat-until: 8h, 90m, "
                        "1h30m, 3600s")
    g.add_argument("--steps", type=int, default=None, metavar="N",
                   help="measured steps of each replayed-compute job (default 20; --quick 6)")
    g.add_argument("--compute-scale", type=float, default=None, metavar="F",
                   help="the replayed H200 compute's multiplier (default 20; --quick 50: "
                        "backward about as long as flat's transfer at 1 Gbit/s, so C3 can "
                        "overlap)")
    return p


def scaled(scale: Scale, steps: int | None, compute_scale: float | None,
           repeats: int | None = None) -> Scale:
    """``scale`` with the command line's ``--steps``, ``--compute-scale`` and ``--repeats``."""
    if steps is not None and steps < 1:
        raise StudyError(f"--steps {steps}: must be at least 1")
    if repeats is not None and repeats < 1:
        raise StudyError(f"--repeats {repeats}: must be at least 1")

    if compute_scale is not None and not compute_scale > 0:
        raise StudyError(f"--compute-scale {compute_scale:g}: must be > 0")
    return replace(scale, steps=scale.steps if steps is None else steps,
                   compute_scale=scale.compute_scale if compute_scale is None
                   else compute_scale, repeats=scale.repeats if repeats is None else repeats)


def launch_command(point: dict, sweep: sweeps.Sweep, out: Path) -> list[str]:
    """The command ``launch.sweep`` will run for ``point`` (on the emulated cluster it
    brings up for the point's link rate; nothing is made here)."""
    if "slots" not in point:
        return sweeps.launch_point(point, sweep, out, sweeps._Clusters())

    k = point.get("dilation", 1.0)
    spec = ClusterSpec(nodes=point.get("nodes"), slots=point["slots"],
                       rate_gbps=parse_rate(point["rate"]), name=sweeps.CLUSTER_NAME,
                       dilation=1.0 if k == "auto" else k)
    return launch_argv(spec, sweep.launcher, point["ranks"],
                       sweeps.point_program(point, sweep, out))


def _describe(job: Job, cluster: Cluster) -> str:
    k = cluster.dilation
    where = (f"{job.ranks} ranks on {cluster.layout} emulated, link {job.rate}"
             + ("" if k == 1 else ", dilation auto (probed first)" if k == "auto"
                else f", dilation {dil.text(k)}")
             if cluster.emulated else f"{job.ranks} ranks on {cluster.hosts}")
    return (f"{','.join(sorted(job.claims)):<12} {job.name:<22} {where}, "
            f"~{_fmt(job.estimate_s)}")


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        scale = scaled(QUICK if a.quick else FULL, a.steps, a.compute_scale, a.repeats)
        until = repeat_until_args(a.repeat_until, a.budget)
        claims = parse_claims(a.claims)
        if "C4" in claims and scale.steps < max(scale.staleness):
            raise StudyError(f"--steps {scale.steps}: C4's async runs go up to staleness "
                             f"{max(scale.staleness)}, which needs at least that many steps "
                             "(or leave C4 out of --claims)")
        ranks = None
        if a.ranks:
            try:
                ranks = [int(x) for x in a.ranks.split(",") if x.strip()]
            except ValueError:
                raise StudyError(f"--ranks: expected integers, got {a.ranks!r}") from None
        cluster = make_cluster(a)
        check(cluster, claims, ranks, scale)
        jobs = plan(scale, cluster, claims, ranks)
        out = Path(a.output or f"results/study{'-quick' if a.quick else ''}")
        if out.exists() and not out.is_dir():
            raise StudyError(f"-o/--output: {out} is not a directory")
        sweep = sweeps.make_sweep(
            {"launcher": cluster.launcher, "output": str(out), "repeats": scale.repeats,
             **({} if cluster.emulated else {"hosts": cluster.hosts})},
            {}, [j.point(cluster) for j in jobs])
        if not a.dry_run and cluster.emulated:
            try:
                check_machine()
            except ClusterError as e:
                raise StudyError(str(e)) from None
    except (StudyError, sweeps.SweepError) as e:
        print(f"launch.study: error: {e}", file=sys.stderr)
        return 2

    runs = sum(j.repeats or scale.repeats for j in jobs)
    total = sum(j.estimate_s * (j.repeats or scale.repeats) for j in jobs)
    k = cluster.dilation if cluster.emulated else 1.0
    how = ("" if k == 1 else f", x {dil.text(k)} for the dilation" if k != "auto"
           else "; dilation auto: x the K it picks per cluster (1-8), after probes")
    print(f"# launch.study{' --quick' if a.quick else ''}: {len(jobs)} points for "
          f"{', '.join(claims)}, {runs} jobs with repeats; expected time "
          f"~{_fmt(total * (k if k != 'auto' else 1))} (estimated from the link rates and "
          f"replayed compute{how}; the progress line corrects it as jobs finish)", flush=True)
    if not a.dry_run:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
        print(f"# load average {load:.2f} on {cores} cores before the first job"
              + (": something else is running, and its load will be in every timing"
                 if load > BUSY_LOAD_FRACTION * cores else ""), flush=True)
    if a.dry_run:
        for job, pt in zip(jobs, sweep.points()):
            print(f"# {_describe(job, cluster)}")
            print(shlex.join(launch_command(pt, sweep, out / f"{sweeps.point_id(pt, sweep)}"
                                                            ".jsonl")))
        return 0

    def on_term(signum, frame):
        raise SystemExit(128 + signum)  # unwind: the running job and cluster are cleaned up

    signal.signal(signal.SIGTERM, on_term)
    started = time.time()
    counts = sweeps.run_sweep(sweep)
    if until is not None and not counts["failed"]:
        more = repeat_until(sweep, out, *until, started)
        for k in ("done", "failed"):
            counts[k] += more[k]
    print(f"# {counts['done']} done, {counts['failed']} failed, {counts['skipped']} skipped "
          f"(already done); results in {out}", file=sys.stderr, flush=True)
    report = out / "report"
    res = subprocess.run([sys.executable, "-m", "analysis.report", str(out), "-o", str(report)],
                         cwd=ROOT)
    if res.returncode != 0:
        print(f"launch.study: the report failed (exit {res.returncode})", file=sys.stderr)
        return 1
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
