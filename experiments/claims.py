"""The seed claims C1-C8 as experiments: each one object that plans its runs and judges them.

A ``SeedClaim`` holds the claim's words, its ``plan`` (the jobs it needs on a
study's cluster at a ``Scale``) and its check (``analysis.claims``' function of
the same id, which reads the result records only). The study
(``experiments.study``) runs the union of the claims' jobs, each once: a job two
claims need carries both in its ``sets`` (the 8-rank flat native run is C1's
largest point, C2-C4's synchronous reference and C7's k = 1), and so every
claim that shares a job shares its dilation K. What each claim checks, and its
threshold: docs/claims.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from analysis import claims as checks
from commbench.allreduce import Config
from commbench.microbench import MicroConfig
from commbench.staleness import StudyConfig
from commbench.strategies import AsyncSettings, BucketedSettings, CommonSettings, FlatSettings
from experiments.job import Job, Placement

PROFILES = "profiles"  # committed H200 profiles, relative to the repository root


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
    rates: tuple[str, ...]  # C2's link rates (emulated cluster); the first is every claim's
    fast_algos: tuple[str, ...]  # the reference run's algorithms (C2 at the first rate)
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
    micro_max: int  # the microbenchmarks' largest message (bytes)
    #: jobs per point: every compared figure then has a spread over repeats
    repeats: int
    #: the convergence study's grid of training settings, one job each: each staleness is
    #: compared at its best (commbench.staleness's lr and momentum by default)
    conv_lrs: tuple[float, ...] = (0.02,)
    conv_momenta: tuple[float, ...] = (0.9,)


@dataclass(frozen=True)
class StudyCluster:
    """Where the study runs: ``placement`` holds every job's nodes, slots, launcher and K
    (the rate is each job's own: C2 runs at two)."""

    placement: Placement

    @property
    def ranks(self) -> int:
        return self.placement.ranks

    def default_ranks(self, scale: Scale) -> list[int]:
        """C1's rank counts: 1..N on up to 8 ranks with ``every_rank``, else powers of two;
        and the whole cluster, N."""
        n = self.ranks
        if scale.every_rank and n <= 8:
            return list(range(1, n + 1))
        return sorted({*(2 ** i for i in range(n.bit_length()) if 2 ** i < n), n})


Plan = Callable[[Scale, StudyCluster, Sequence[int]], list[Job]]


@dataclass(frozen=True)
class SeedClaim:
    """One seed claim: its words, the jobs it needs, and its check."""

    id: str
    text: str
    plan: Plan
    check: Callable  # (records, fitted cost model or None) -> analysis.claims.Claim


# -- the jobs ----------------------------------------------------------------------------

def synthetic(scale: Scale, strategy: str = "flat", algos: Sequence[str] = ("native",), *,
              profile: str | None = None, batch: int | None = None,
              sync: CommonSettings | None = None,
              slow_rank: tuple[int, float] | None = None) -> Config:
    """``commbench.allreduce`` on the replayed H200 profile of ``scale``."""
    return Config(workload="synthetic", model=scale.model,
                  compute_profile=f"{PROFILES}/{profile or scale.profile}",
                  compute_scale=scale.compute_scale, batch_size=batch or scale.batch,
                  steps=scale.steps, warmup=scale.warmup, quiet=True,
                  strategies=[strategy], algos=list(algos), slow_rank=slow_rank,
                  sync=sync)


def _job(cluster: StudyCluster, name: str, config, rate: str | None = None,
         ranks: int | None = None, repeats: int | None = None, host: bool = False) -> Job:
    """A job of the study on its cluster. ``host``: its compute is real passes, the host's
    own work, which time dilation does not stretch (only the links and replayed compute):
    under ``auto`` it runs at K = 1 rather than at its set's K (a claim of compute, C5, C6,
    C8, or of accuracy, C4's convergence, is not judged on the links)."""
    p = cluster.placement
    k = 1.0 if host and p.dilation == "auto" else p.dilation
    return Job(name, config, replace(p, rate=rate or p.rate, dilation=k), ranks=ranks,
               repeats=repeats)


def _rate(scale: Scale, cluster: StudyCluster, i: int = 0) -> str:
    return scale.rates[i] if cluster.placement.emulated else "none"


def reference(scale: Scale, cluster: StudyCluster) -> Job:
    """The whole cluster's flat run at the first rate: everyone's synchronous reference."""
    return _job(cluster, f"flat-np{cluster.ranks}",
                synthetic(scale, algos=scale.fast_algos), _rate(scale, cluster))


def plan_c1(scale: Scale, cluster: StudyCluster, ranks: Sequence[int]) -> list[Job]:
    """Flat native on 1..N ranks (filling the first node first), and the cost model's
    microbenchmarks: one node (its shared memory) and every node (the link)."""
    n, rate = cluster.ranks, _rate(scale, cluster)
    jobs = [reference(scale, cluster)]
    jobs += [_job(cluster, f"flat-np{p}", synthetic(scale), rate, ranks=p)
             for p in ranks or cluster.default_ranks(scale) if p != n]

    def micro(algos: str) -> MicroConfig:
        # sync_each: each timed call starts together, as a training step's all-reduce does
        # (back to back, Open MPI's native ran at about half its speed across 2 nodes: its
        # put protocol over TCP when ranks enter apart, docs/microbench.md)
        return MicroConfig(minbytes=64 << 10, maxbytes=scale.micro_max, stepfactor=4,
                           iters=scale.micro_iters, warmup_iters=2, sync_each=True,
                           quiet=True, algos=algos.split(","))

    local = cluster.placement.node_slots[0]
    if local >= 2:
        jobs.append(_job(cluster, f"microbench-np{local}", micro("native,ring"), rate,
                         ranks=local))
    if cluster.placement.nodes >= 2:
        jobs.append(_job(cluster, f"microbench-np{n}", micro("native,ring,hier"), rate))
    return jobs


def plan_c2(scale: Scale, cluster: StudyCluster, ranks: Sequence[int]) -> list[Job]:
    """Flat native and ring, hier and hier-leader on the whole cluster, at each rate."""
    jobs = [reference(scale, cluster)]
    for i, rate in enumerate(scale.rates[1:] if cluster.placement.emulated else (), 1):
        jobs.append(_job(cluster, f"flat-np{cluster.ranks}-{rate}",
                         synthetic(scale, algos=scale.slow_algos), _rate(scale, cluster, i)))
    return jobs


def plan_c3(scale: Scale, cluster: StudyCluster, ranks: Sequence[int]) -> list[Job]:
    """Bucketed at each cap (0 = per tensor) beside flat."""
    return [reference(scale, cluster)] + [
        _job(cluster, f"bucketed-{mb:g}mb", synthetic(
            scale, "bucketed", sync=BucketedSettings(bucket_mb=float(mb))),
            _rate(scale, cluster)) for mb in scale.bucket_mb]


def plan_c4(scale: Scale, cluster: StudyCluster, ranks: Sequence[int]) -> list[Job]:
    """Async at each staleness beside flat, without and with a straggler (the last rank,
    on the last node); and the convergence study on digits (time to accuracy), one job per
    training setting of its grid (lr x momentum: each staleness is compared at its best)."""
    n, rate = cluster.ranks, _rate(scale, cluster)
    jobs = [reference(scale, cluster)]
    for straggler in (None, (n - 1, scale.straggler_factor)):
        suffix = "-straggler" if straggler else ""
        if straggler:
            jobs.append(_job(cluster, f"flat-np{n}{suffix}",
                             synthetic(scale, slow_rank=straggler), rate))
        jobs += [_job(cluster, f"async-s{s}{suffix}", synthetic(
            scale, "async", sync=AsyncSettings(staleness=s), slow_rank=straggler), rate)
            for s in scale.staleness]
    grid = [(lr, m) for lr in scale.conv_lrs for m in scale.conv_momenta]
    for lr, m in grid:
        study = StudyConfig(staleness=list(scale.conv_staleness),
                            mitigations=scale.conv_mitigations.split(","),
                            steps=scale.conv_steps, seeds=list(scale.conv_seeds), eval_every=10,
                            quiet=True, ps=scale.conv_ps, lr=lr, momentum=m)
        name = "convergence-digits" + (f"-lr{lr:g}-m{m:g}" if len(grid) > 1 else "")
        # it repeats itself over seeds, in one job
        jobs.append(_job(cluster, name, study, rate, repeats=1, host=True))
    return jobs


def _real(scale: Scale, cluster: StudyCluster) -> list[Job]:
    """The real workload (small CNN on digits, held-out accuracy) at each batch."""
    return [_job(cluster, f"real-digits-b{b}", Config(
        strategies=["flat"], algos=["native"], workload="real", model="smallcnn",
        dataset="digits", image_size=32, num_classes=10,
        lr=0.02,  # commbench.staleness's: 0.05 diverges on 4 ranks
        batch_size=b, steps=scale.real_steps, warmup=scale.warmup, quiet=True),
        _rate(scale, cluster), host=True) for b in scale.real_batches]


def plan_c5(scale: Scale, cluster: StudyCluster, ranks: Sequence[int]) -> list[Job]:
    """The real workload at each batch; the replayed compute of the claim's own batches."""
    jobs = _real(scale, cluster)
    for b in scale.profile_batches:
        profile = f"h200-{scale.model}-b{b}.json"
        if (profile, b) == (scale.profile, scale.batch):  # the reference run is one of them
            jobs.append(reference(scale, cluster))
        else:
            jobs.append(_job(cluster, f"flat-np{cluster.ranks}-b{b}",
                             synthetic(scale, profile=profile, batch=b), _rate(scale, cluster)))
    return jobs


def plan_real(scale: Scale, cluster: StudyCluster, ranks: Sequence[int]) -> list[Job]:
    """C6 and C8: peak memory and final accuracy of the real workload at each batch."""
    return _real(scale, cluster)


def plan_c7(scale: Scale, cluster: StudyCluster, ranks: Sequence[int]) -> list[Job]:
    """Flat native at each accumulation k (k = 1 is the reference)."""
    return [reference(scale, cluster)] + [
        _job(cluster, f"accum-k{k}", synthetic(scale, sync=FlatSettings(accum_steps=k)),
             _rate(scale, cluster)) for k in scale.accum if k != 1]


SEED_CLAIMS = (
    SeedClaim("C1", "at global batch > 2048, gradient sync is ~35% of the training step",
              plan_c1, checks.c1),
    SeedClaim("C2", "hierarchical (two-level) all-reduce cuts communication cost ~40%",
              plan_c2, checks.c2),
    SeedClaim("C3", "bucketed gradient sync cuts comm calls and overlaps with backward",
              plan_c3, checks.c3),
    SeedClaim("C4", "async updates have ~3x theoretical speed-up, but staleness hurts",
              plan_c4, checks.c4),
    SeedClaim("C5", "throughput rises with batch size at little accuracy cost", plan_c5,
              checks.c5),
    SeedClaim("C6", "activation memory grows linearly with batch", plan_real, checks.c6),
    SeedClaim("C7", "gradient accumulation keeps the effective batch and cuts sync frequency",
              plan_c7, checks.c7),
    SeedClaim("C8", "report per-iteration time, peak memory, final accuracy", plan_real,
              checks.c8),
)
BY_ID = {c.id: c for c in SEED_CLAIMS}


def plan(scale: Scale, cluster: StudyCluster, claims: Sequence[SeedClaim] = SEED_CLAIMS,
         ranks: Sequence[int] = ()) -> list[Job]:
    """Every job the ``claims`` need, each once (its ``sets``: the claims it serves), those
    sharing a link rate together, in the order of the rates."""
    jobs: dict[str, Job] = {}
    for claim in claims:
        for job in claim.plan(scale, cluster, ranks):
            have = jobs.get(job.name)
            if have is not None and have.config != job.config:
                raise ValueError(f"{claim.id} plans {job.name} unlike another claim")
            sets = (have.sets if have else frozenset()) | {claim.id}
            jobs[job.name] = replace(have or job, sets=sets)
    order = list(scale.rates)
    return sorted(jobs.values(), key=lambda j: order.index(j.placement.rate)
                  if j.placement.rate in order else 0)
