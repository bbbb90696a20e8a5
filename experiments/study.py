"""The whole study in one command: the runs every seed claim needs, then the report.

    python -m experiments.study                   # emulated 2 x 4 cluster; says how long first
    python -m experiments.study --quick           # the quick study (its time is printed first)
    python -m experiments.study --claims C2,C4 --dry-run    # list the jobs, run nothing
    python -m experiments.study --hosts a:8,b:8 --launcher horovodrun   # a real cluster
    python -m experiments.study --quick --launcher torchrun # torch.distributed (Gloo)
    python -m experiments.study --quick --dilation 4        # every emulated job at K = 4
    python -m experiments.study --decide --budget 3h        # runs until each claim decides

Each claim (``experiments.claims``: C1-C8, docs/claims.md) plans its runs as one
matched set-up (``analysis.match``): the same cluster, ranks, model, replayed
compute and batch, differing only in the claim's own variable. On the emulated
cluster every job runs time-dilated (``commbench.dilation``); ``--dilation auto``,
the default there, gives every compared set one K, chosen by short probes
(``experiments.runner``). The jobs run resumably (run the same command again and
finished jobs are skipped; Ctrl-C stops cleanly); then ``python -m analysis.report``
writes ``<output>/report/README.md`` and every claim's verdict is printed with
the runs behind it, or, where undecided, the runs and minutes that would decide it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from analysis import sequential, stats
from analysis.alphabeta import LATENCY_FLAG, latency_us
from analysis.load import LoadError, load
from commbench import dilation as dil
from experiments import claims as cl
from experiments.job import Placement, fmt_s
from experiments.runner import CHOICE_FILE, Runner, RunnerError
from launch import commands
from launch.cluster import ClusterError, node_slots, parse_rate
from launch.execute import interruptible

ROOT = Path(__file__).resolve().parents[1]
CLAIMS = tuple(c.id for c in cl.SEED_CLAIMS)
UNTIL_FILE = "repeat-until.json"  # analysis.report reads it
DECIDE_FILE = "decide.json"  # what --decide did, per claim (analysis.report reads it)
#: what the previous layout (launch.study) left in a results folder: its ``auto`` choice
OLD_LAYOUT_FILE = "dilation.json"

FULL = cl.Scale(model="resnet50", profile="h200-resnet50-b256.json", batch=256,
                compute_scale=20.0, steps=20, warmup=3, every_rank=True,
                rates=("1gbit", "200mbit"), fast_algos=("native", "ring", "hier", "hier-leader"),
                slow_algos=("native", "ring", "hier", "hier-leader"),
                bucket_mb=(0, 1, 5, 25, 64, 128), staleness=(0, 1, 2, 4), straggler_factor=2.0,
                accum=(1, 2, 4), real_batches=(16, 64, 128), real_steps=100, conv_steps=200,
                conv_staleness=(0, 1, 2, 4), conv_mitigations="none,lr", conv_seeds=(0, 1, 2),
                conv_lrs=(0.005, 0.01, 0.02, 0.05), conv_momenta=(0.0, 0.9),
                conv_ps=True, profile_batches=(256, 1024), micro_iters=10,
                micro_max=64 << 20, repeats=3)
#: The quick study: every claim's ratio at a quarter of the bytes' time. What makes it quick
#: (against the full study's set-up on 2 x 4): the link at 4 Gbit/s with the replayed
#: compute scaled to match (12.5 = 50 / 4: backward still about as long as flat's transfer,
#: so each claim's ratio is the one at 1 Gbit/s, and every emulated second is a quarter);
#: one link rate for C2; native, ring and hier (no leader variant); async at s = 1 only
#: (with a straggler and without); the microbenchmarks to 16 MiB; the real-workload and
#: convergence jobs at K = 1 (their compute is the host's: dilation cannot stretch it);
#: the convergence grid 2 x 2 (lr 0.01, 0.02 x momentum 0, 0.9) at s = 0 and 4 only.
#: Measured time, runs per claim and the K chosen: docs/claims.md.
QUICK = cl.Scale(model="resnet18", profile="h200-resnet18-b64.json", batch=64,
                 compute_scale=12.5, steps=6, warmup=1, every_rank=False, rates=("4gbit",),
                 fast_algos=("native", "ring", "hier"), slow_algos=(), bucket_mb=(0, 25),
                 staleness=(1,), straggler_factor=2.0, accum=(1, 4), real_batches=(16, 64, 128),
                 real_steps=40, conv_steps=100, conv_staleness=(0, 4),
                 conv_mitigations="none,lr", conv_seeds=(0, 1, 2), conv_lrs=(0.01, 0.02),
                 conv_momenta=(0.0, 0.9), conv_ps=False,
                 profile_batches=(), micro_iters=5, micro_max=16 << 20, repeats=2)


class StudyError(Exception):
    """Bad input; the message names the flag."""


def parse_claims(text: str) -> list[cl.SeedClaim]:
    ids = [c.strip().upper() for c in text.split(",") if c.strip()]
    unknown = [c for c in ids if c not in cl.BY_ID]
    if unknown or not ids:
        raise StudyError(f"--claims: unknown claim {', '.join(unknown) or repr(text)}; the "
                         f"claims are {', '.join(CLAIMS)} (docs/claims.md)")
    return [cl.BY_ID[c] for c in ids]


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
            if words:
                slots = next((w.split("=")[1] for w in words[1:] if w.startswith("slots=")),
                             "1")
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


def make_cluster(a: argparse.Namespace) -> cl.StudyCluster:
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
        return cl.StudyCluster(Placement(len(slots), slots[0] if len(set(slots)) == 1
                                         else tuple(slots), "none", a.launcher, 1.0, hosts))
    listed = a.slots is not None and "," in a.slots
    try:  # default 2 nodes x 4 slots; a per-node list gives the nodes
        per_node = node_slots(a.nodes if a.nodes is not None or listed else 2,
                              a.slots if a.slots is not None else "4")
    except ClusterError as e:
        raise StudyError(str(e)) from None
    return cl.StudyCluster(Placement(len(per_node), tuple(per_node) if listed else per_node[0],
                                     launcher=a.launcher,
                                     dilation="auto" if k in (None, "auto") else float(k)))


def check(cluster: cl.StudyCluster, claims: Sequence[cl.SeedClaim], ranks: Sequence[int],
          scale: cl.Scale) -> None:
    """Refuse what cannot run before any job starts."""
    ids = {c.id for c in claims}
    p = cluster.placement
    wanted = list(ranks or cluster.default_ranks(scale))
    where = p.layout + ("" if p.emulated else f" ({p.hosts})")
    too_many = [r for r in wanted if r > cluster.ranks]
    if too_many:
        raise StudyError(f"--ranks {max(too_many)}: more ranks than the cluster has "
                         f"({where} = {cluster.ranks}); give --nodes/--slots or --hosts for a "
                         "bigger one, or fewer --ranks")
    if any(r < 1 for r in wanted):
        raise StudyError("--ranks: every rank count must be >= 1")
    if p.nodes < 2 and "C2" in ids:
        raise StudyError(f"C2 compares hierarchical with flat all-reduce across nodes, but the "
                         f"cluster has one node ({where}); use --nodes 2 or more, or leave C2 "
                         "out of --claims")
    # Horovod on Gloo has only its collectives: no point-to-point messages (the project's
    # ring; the parameter server)
    needs_p2p = sorted({"C2", "C4"} & ids)
    if p.launcher == "horovodrun-gloo" and needs_p2p:
        verb = "needs" if len(needs_p2p) == 1 else "need"
        raise StudyError(f"--launcher horovodrun-gloo: {' and '.join(needs_p2p)} {verb} "
                         "point-to-point messages (the project's ring; the parameter "
                         "server), which Horovod on Gloo does not offer; use mpirun, "
                         "horovodrun or torchrun, or leave them out of --claims")
    if cluster.ranks < 2 and {"C2", "C3", "C4", "C7"} & ids:
        raise StudyError(f"the cluster has one rank ({where}): nothing to synchronise")
    if "C4" in ids and scale.steps < max(scale.staleness):
        raise StudyError(f"--steps {scale.steps}: C4's async runs go up to staleness "
                         f"{max(scale.staleness)}, which needs at least that many steps "
                         "(or leave C4 out of --claims)")
    for r in scale.rates if p.emulated else ():
        try:
            parse_rate(r)
        except ClusterError as e:
            raise StudyError(str(e)) from None


def parse_duration(text: str, flag: str = "--budget") -> float:
    """``8h``, ``90m``, ``1h30m``, ``45s`` or plain seconds, in seconds."""
    t = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        t += "s"  # plain seconds
    parts = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", t)
    if not t or parts is None:
        raise StudyError(f"{flag} {text!r}: expected a duration such as 8h, 90m, 1h30m or "
                         "3600s")
    h, m, sec = (float(x) if x else 0.0 for x in parts.groups())
    seconds = 3600 * h + 60 * m + sec
    if seconds <= 0:
        raise StudyError(f"{flag} {text!r}: must be more than 0")
    return seconds


def user_latency(a: argparse.Namespace) -> float | None:
    """``--latency-us``: a number above 0, on an emulated cluster only (a real cluster's
    latency is its own: measured into every record, not a model's input); None if not
    given."""
    if a.latency_us is None:
        return None
    try:
        us = latency_us(a.latency_us)
    except ValueError as e:
        raise StudyError(str(e)) from None
    real = ("--hostfile" if a.hostfile else "--hosts" if a.hosts else
            "Slurm (SLURM_JOB_ID is set)" if os.environ.get("SLURM_JOB_ID") else None)
    if real:
        raise StudyError(f"{LATENCY_FLAG} {a.latency_us}: {real} names a real cluster, whose "
                         "per-message latency is measured into every record (alpha_us); "
                         f"the flag prices an emulated cluster's figures at your network's; "
                         "leave it out")
    return us


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m experiments.study",
        description="Run every experiment the seed claims C1-C8 need (docs/claims.md) on the "
                    "emulated cluster or a real one, resumably, then write the report.",
        epilog="Run it again with the same flags to resume: finished jobs are skipped.")
    p.add_argument("--quick", action="store_true",
                   help="the quick study: fewer steps, points and repeats (its time is printed "
                        "before it starts)")
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
                        "auto, the default there, gives the study's compared jobs one K, the "
                        "smallest at which short probes of each cluster's largest job are "
                        "link-bound; 1: none. Emulated clusters only")
    g.add_argument(LATENCY_FLAG, dest="latency_us", default=None, metavar="US",
                   help="your network's inter-node latency per message (microseconds): a "
                        "model input the report prices beside the measured figures "
                        "(analysis.report); emulated clusters only, whose own alpha every "
                        "record carries")
    g = p.add_argument_group("scale (smaller for a smoke test; verdicts then rest on less)")
    g.add_argument("--repeats", type=int, default=None, metavar="N",
                   help="jobs per point, each its own job, shuffled within each cluster: the "
                        "spread every compared figure is judged with (default 3; --quick 2)")
    g.add_argument("--repeat-until", type=float, default=None, metavar="PCT",
                   help="then add repeats to the jobs of each claim whose figure's interval "
                        "is wider than +-PCT %% of it, until every one is within or --budget "
                        "is spent (needs --budget)")
    g.add_argument("--decide", action="store_true",
                   help="then add runs only to the jobs of each claim still undecided (its "
                        "decision's next look: analysis.sequential, 3 to 12 runs a side), "
                        "until every claim is decided, at its cap, or --budget is spent "
                        "(needs --budget)")
    g.add_argument("--budget", default=None, metavar="DURATION",
                   help="wall time the whole study may take with --repeat-until or --decide: "
                        "8h, 90m, 1h30m, 3600s")
    g.add_argument("--steps", type=int, default=None, metavar="N",
                   help="measured steps of each replayed-compute job (default 20; --quick 6)")
    g.add_argument("--compute-scale", type=float, default=None, metavar="F",
                   help="the replayed H200 compute's multiplier (default 20; --quick 12.5: "
                        "backward about as long as flat's transfer at the study's link rate, "
                        "so C3 can overlap)")
    return p


def scaled(scale: cl.Scale, a: argparse.Namespace) -> cl.Scale:
    """``scale`` with the command line's ``--steps``, ``--compute-scale`` and ``--repeats``."""
    if a.steps is not None and a.steps < 1:
        raise StudyError(f"--steps {a.steps}: must be at least 1")
    if a.repeats is not None and a.repeats < 1:
        raise StudyError(f"--repeats {a.repeats}: must be at least 1")
    if a.compute_scale is not None and not a.compute_scale > 0:
        raise StudyError(f"--compute-scale {a.compute_scale:g}: must be > 0")
    return replace(scale, **{k: v for k, v in (("steps", a.steps), ("repeats", a.repeats),
                                               ("compute_scale", a.compute_scale))
                             if v is not None})


def _until(a: argparse.Namespace) -> tuple[float | None, float] | None:
    """(PCT or None for --decide, the budget in seconds), or None for one round."""
    if a.decide and a.repeat_until is not None:
        raise StudyError("--decide and --repeat-until: give one (--decide adds runs until each "
                         "claim is decided; --repeat-until until each figure is that precise)")
    if a.repeat_until is None and not a.decide:
        if a.budget is not None:
            raise StudyError("--budget: it bounds --repeat-until or --decide, neither of "
                             "which was given")
        return None
    flag = "--decide" if a.decide else "--repeat-until"
    if a.repeat_until is not None and not 0 < a.repeat_until < 100:
        raise StudyError(f"--repeat-until {a.repeat_until:g}: a percentage between 0 and 100 "
                         "(the interval's half-width wanted, relative to its figure)")
    if a.budget is None:
        raise StudyError(f"{flag} needs --budget DURATION (how long the study may take "
                         "in all, e.g. 8h): repeats could otherwise run without end")
    return a.repeat_until, parse_duration(a.budget)


def _ranks(text: str | None) -> list[int]:
    try:
        return [int(x) for x in (text or "").split(",") if x.strip()]
    except ValueError:
        raise StudyError(f"--ranks: expected integers, got {text!r}") from None


def _records(out: Path) -> list[dict]:
    try:
        return load([out]).records
    except LoadError:
        return []


def judge_claims(runner: Runner, claims: Sequence[cl.SeedClaim], out: Path, pct: float,
                 judged: list, fixed: set[str]) -> dict[str, int]:
    """Repeats wanted per job: for each claim whose figure is not within +-``pct`` %, as many
    as ``stats.repeats_for_precision`` asks, on the jobs behind its figure (the runs it
    names, through the files they wrote), less those whose repeats the plan fixed
    (``fixed``: the convergence study repeats itself over seeds)."""
    want: dict[str, int] = {}
    judged.clear()
    records = _records(out)
    for claim in claims:
        c = claim.check(records, None)
        sp = c.spread
        if sp is None or sp.kind == stats.NONE:
            continue
        ok = stats.within(sp, pct)
        judged.append({"claim": c.id, "spread": sp.words(), "within": ok,
                       "verdict": c.verdict})
        if not ok:
            n = stats.repeats_for_precision(sp, pct)
            for name in claim_jobs(runner, c, records) - fixed:
                want[name] = max(want.get(name, 0), n)
    return want


def judge_decisions(runner: Runner, claims: Sequence[cl.SeedClaim], out: Path, judged: list,
                    fixed: set[str], started: float, decided_at: dict[str, float]
                    ) -> dict[str, int]:
    """Repeats wanted per job for ``--decide``: for each claim still undecided, its
    decision's next look (``Decision.runs + Decision.wants`` runs a side: one more a side
    from 3, at most ``sequential.MAX_RUNS``) on the jobs behind its figure; a claim on a
    median (C1's share, C3's overlap: an order-statistic interval, no sequence) goes at
    once to the runs ``stats.repeats_to_decide`` names, at most the same cap, so it is
    looked at as few times as can be. Jobs whose repeats the plan fixed (``fixed``) get
    none. ``judged`` is rebuilt: each claim's verdict, figure and runs a side;
    ``decided_at`` keeps the seconds from ``started`` at which each claim was first seen
    decided."""
    want: dict[str, int] = {}
    judged.clear()
    records = _records(out)
    for claim in claims:
        c = claim.check(records, None)
        d = c.decision
        if c.verdict != stats.UNDECIDED and claim.id not in decided_at:
            decided_at[claim.id] = round(time.time() - started)
        n, figure, runs = None, None, None
        if d is not None:
            figure, runs = d.words(), d.runs
            if c.verdict == stats.UNDECIDED and d.wants:
                n = d.runs + d.wants
        elif c.spread is not None and c.spread.kind != stats.NONE:
            figure, runs = c.spread.words(), c.spread.n
            if c.verdict == stats.UNDECIDED:
                need = _runs_named(c)
                n = min(need, sequential.MAX_RUNS) if need else None
        judged.append({"claim": c.id, "verdict": c.verdict, "figure": figure, "runs": runs,
                       "decided_after_s": decided_at.get(c.id)})
        if n is None:
            continue
        for name in claim_jobs(runner, c, records) - fixed:
            want[name] = max(want.get(name, 0), n)
    return want


def claim_jobs(runner: Runner, claim, records: Sequence[dict]) -> set[str]:
    """The names of the jobs behind ``claim``'s figures: the runs it names (``Claim.runs``),
    through the results files they were written to."""
    ids = {i for runs in claim.runs.values() for i in runs}
    files = {Path(r["_file"]).resolve() for r in records
             if str(r.get("run_id")) in ids and r.get("_file")}
    return {j.name for j in runner.jobs
            if files & {f.resolve() for f in runner.outputs(j)}}


def _runs_named(c) -> int | None:
    """The runs a side a claim's reason says would decide it ("about N runs a side",
    ``analysis.claims``' words), else ``stats.repeats_to_decide`` on a median's spread."""
    m = re.search(r"about (\d+) runs a side", c.reason)
    if m:
        return int(m.group(1))
    if c.decision is None and c.spread is not None:
        return stats.repeats_to_decide(c.spread, c.spread.value)
    return None


def verdict_lines(runner: Runner, claims: Sequence[cl.SeedClaim], out: Path) -> list[str]:
    """Each claim's verdict with its runs; where undecided, what it was judged on, and the
    runs a side and the minutes that would decide it (at the measured job seconds)."""
    records = _records(out)
    lines = []
    for claim in claims:
        c = claim.check(records, None)
        jobs = [j for j in runner.jobs if claim.id in j.sets]
        runs = sum(j.repeats or runner.repeats for j in jobs)
        line = f"# {c.id}: {c.verdict} ({runs} runs of {len(jobs)} jobs)"
        if c.verdict == stats.UNDECIDED:
            if c.decision is not None:
                line += f": {c.decision.words()}"
            need = _runs_named(c)
            if need:
                more = sum(max(0, need - (j.repeats or runner.repeats)) * runner.job_seconds(j)
                           for j in jobs)
                line += (";" if c.decision is not None else ":") + (
                    f" about {need} runs a side would decide it, ~{fmt_s(more)} more")
        lines.append(line)
    return lines


def fit_budget(runner: Runner, claims: Sequence[cl.SeedClaim], budget_s: float
               ) -> tuple[list[cl.SeedClaim], list[tuple[cl.SeedClaim, float]]]:
    """The claims whose first round fits ``budget_s`` together, taken in the order asked
    (a job two claims share is counted once), and each claim left out with the seconds one
    round of its own jobs needs. A claim that does not fit is named, not run: a budget
    spent on part of its first round would decide nothing (the full study's C1 alone
    needs about 3 h here at K = 4), while the claims that fit can still be decided."""
    kept: list[cl.SeedClaim] = []
    left: list[tuple[cl.SeedClaim, float]] = []
    for claim in claims:
        ids = {c.id for c in kept} | {claim.id}
        if runner.estimate_s({j.name for j in runner.jobs if j.sets & ids}) <= budget_s:
            kept.append(claim)
        else:
            left.append((claim, runner.estimate_s(
                {j.name for j in runner.jobs if claim.id in j.sets})))
    return kept, left


def left_out_lines(left_out: Sequence[tuple[cl.SeedClaim, float]], budget: str | None
                   ) -> list[str]:
    """A line per claim the budget left out: undecided, not run, and what it would need."""
    return [f"# {c.id}: undecided, not run: one round of its jobs needs ~{fmt_s(need)}, "
            f"more than --budget {budget} leaves beside the claims before it; run it with "
            f"--claims {c.id} and a budget of at least that" for c, need in left_out]


def left_out_records(left_out: Sequence[tuple[cl.SeedClaim, float]]) -> list[dict]:
    """``left_out`` as the study's decide/until file keeps it (``analysis.report``)."""
    return [{"claim": c.id, "one_round_s": round(need, 1)} for c, need in left_out]


def _auto_words(runner: Runner, guess: float, k: float | str) -> str:
    """What the expected time assumes of ``--dilation auto``: the K the probes start at, from
    the last choice; on a machine without one, also the time two rungs up (the probes
    climbed from 4 to 16 on this 2-core machine: docs/claims.md)."""
    if k != "auto":
        return ""
    if runner.from_hints():
        return (f" at K = {dil.text(guess)}, the last K chosen here (dilation auto: probes "
                "first)")
    up = max((j.placement.k for j in runner.priced(2)), default=guess)
    return (f" at K = {dil.text(guess)}, the probes' first rung, to ~"
            f"{fmt_s(runner.estimate_s(rungs=2))} at K = {dil.text(up)} (dilation auto: "
            "probes first choose it)")


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        scale = scaled(QUICK if a.quick else FULL, a)
        until = _until(a)
        claims = parse_claims(a.claims)
        ranks = _ranks(a.ranks)
        cluster = make_cluster(a)
        user_us = user_latency(a)
        check(cluster, claims, ranks, scale)
        out = Path(a.output or f"results/study{'-quick' if a.quick else ''}")
        if out.exists() and not out.is_dir():
            raise StudyError(f"-o/--output: {out} is not a directory")
        if (out / OLD_LAYOUT_FILE).exists() and not (out / CHOICE_FILE).exists():
            raise StudyError(f"-o/--output: {out} was written by the previous layout "
                             "(launch.study, whose dilation auto chose K per cluster, not per "
                             "compared set): its jobs cannot resume here; give a new folder")
        runner = Runner(cl.plan(scale, cluster, claims, ranks), out, scale.repeats)
        k = cluster.placement.dilation
        left_out: list[tuple[cl.SeedClaim, float]] = []
        if until is not None:
            kept, left_out = fit_budget(runner, claims, until[1])
            if not kept:
                claim, need = min(left_out, key=lambda cn: cn[1])
                raise StudyError(f"--budget {a.budget}: {claim.id}'s jobs need ~{fmt_s(need)} "
                                 "for one round, the least of any claim asked for; give at "
                                 "least that")
            if left_out:
                claims = kept
                runner = Runner(cl.plan(scale, cluster, claims, ranks), out, scale.repeats)
        total = runner.estimate_s()
        guess = max((j.placement.k for j in runner.priced()), default=1.0)
    except (StudyError, RunnerError, ValueError) as e:
        print(f"experiments.study: error: {e}", file=sys.stderr)
        return 2
    print(f"# experiments.study{' --quick' if a.quick else ''}: {len(runner.jobs)} points for "
          f"{', '.join(c.id for c in claims)}, "
          f"{sum(j.repeats or scale.repeats for j in runner.jobs)} jobs with repeats; expected "
          f"~{fmt_s(total)}" + _auto_words(runner, guess, k), flush=True)
    for line in left_out_lines(left_out, a.budget):
        print(line, flush=True)
    if a.dry_run:
        runner.dry_run()
        return 0

    def body() -> int:
        started = time.time()
        judged: list = []
        if until is None:
            counts = runner.run()
        elif until[0] is None:  # --decide
            fixed = {j.name for j in runner.jobs if j.repeats is not None}
            decided_at: dict[str, float] = {}
            d = runner.repeat_until(
                lambda: judge_decisions(runner, claims, out, judged, fixed, started,
                                        decided_at), until[1], started)
            (out / DECIDE_FILE).write_text(json.dumps(
                {**d, "claims": judged, "left_out": left_out_records(left_out)}, indent=1))
            counts = {"failed": runner.failed}
        else:
            fixed = {j.name for j in runner.jobs if j.repeats is not None}
            d = runner.repeat_until(
                lambda: judge_claims(runner, claims, out, until[0], judged, fixed), until[1],
                started)
            (out / UNTIL_FILE).write_text(json.dumps(
                {**d, "pct": until[0], "claims": judged,
                 "left_out": left_out_records(left_out)}, indent=1))
            counts = {"failed": runner.failed}
        res = subprocess.run([sys.executable, "-m", "analysis.report", str(out), "-o",
                              str(out / "report"),
                              *([LATENCY_FLAG, f"{user_us:g}"] if user_us else [])], cwd=ROOT)
        for line in verdict_lines(runner, claims, out) + left_out_lines(left_out, a.budget):
            print(line, flush=True)
        print(f"# the study took {fmt_s(time.time() - started)}; results in {out}", flush=True)
        if res.returncode != 0:
            print(f"experiments.study: the report failed (exit {res.returncode})",
                  file=sys.stderr)
            return 1
        return 1 if counts["failed"] else 0

    try:
        return interruptible(body, "experiments.study")
    except RunnerError as e:
        print(f"experiments.study: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
