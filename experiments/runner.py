"""The one runner of planned jobs: the machine check, the load reading, one dilation K per
compared set, the sweeps per launcher, each job's files, and a repeat-and-judge loop.

Every experiment (the study's claims, each benchmark) hands its ``Job`` list to
``Runner``; nothing else runs a job:

- **Files.** One ``launch.sweep`` sweep per launcher, in ``outdir`` (in
  ``outdir/<launcher>`` when there are several); ``outputs(job)`` names every
  repeat's results file. A folder of an interrupted run resumes: finished jobs
  are skipped.
- **One K per compared set.** Jobs placed at dilation ``auto`` are grouped into
  compared sets (jobs sharing a set name in ``Job.sets``, transitively: a job
  two claims share ties their sets); each set runs at one K, chosen across all
  its launchers and clusters, so runs compared with one another always share
  it. The choice is a ladder of short probes (each configuration's ``probe()``)
  of each cluster's largest job: it starts at the K the last choice for that
  probe left (``~/.cache/commbench/dilation-hints.json``), or else at the
  smallest K of ``AUTO_FACTORS`` with no more ranks than cores x K. It judges
  by the outcome rule: K is link-bound when every probe's figures at K agree
  with those at 2K within 5 % (``outcome``: the interval of each figure's ratio,
  from its measured steps, inside +-5 %; a pair neither inside nor wholly outside
  gets one more probe run a side, up to 3, then is read on its medians); it steps
  down while they agree, up while they move, and chooses the smallest K that agrees, or 32,
  "did not converge by K = 32". The choice, its verdict and each probe's figures
  and counter verdicts are kept in ``<outdir>/dilations.json`` (a resumed run
  reuses it); a run's own ``bound`` field stays the counter reading of that one
  run (``commbench.hostload``), provisional beside its set's verdict.
- **Repeat and judge.** ``repeat_until(judge, budget_s)`` runs, asks ``judge``
  which jobs want more repeats, adds them while the measured (or estimated)
  job seconds fit the budget, runs again, and stops when nothing is wanted or
  nothing fits.
- **Signals.** ``launch.execute.interruptible`` is the one unwinder: SIGTERM
  unwinds (the running job and its cluster are cleaned up); Ctrl-C prints one
  line, "interrupted; the same command resumes", and exits 130.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from analysis import stats
from commbench import dilation as dil
from commbench.cores import BUSY_LOAD_FRACTION, load_average
from commbench.flags import ConfigError, check_dilated_argv
from commbench.hostload import LINK_BOUND
from commbench.results import read_records, write_atomic
from experiments.job import CLUSTER_S, Job, fmt_s
from launch import sweep as sweeps
from launch.cluster import ClusterError, check_machine

#: the ladder ``auto`` climbs (``commbench.dilation``'s, up to 32: latency-bound cells need it)
AUTO_FACTORS = (1, 2, 4, 8, 16, 32)
HINTS = Path(os.environ.get("COMMBENCH_CACHE", Path.home() / ".cache" / "commbench")) \
    / "dilation-hints.json"
CHOICE_FILE = "dilations.json"
PROBE_DIR = dil.PROBE_DIR


class RunnerError(Exception):
    """A plan that cannot run; the message names why."""


def read_load(when: str, log=None) -> float | None:
    """Print the 1-minute load average with ``when``, warning where it is above
    ``BUSY_LOAD_FRACTION`` of the cores (timings then measure the other work too)."""
    log = log or sys.stdout
    load, cores = load_average(), os.cpu_count() or 1
    if load is None:
        print(f"# load average {when}: unavailable", file=log, flush=True)
        return None
    busy = load > BUSY_LOAD_FRACTION * cores
    print(f"# load average {load:.2f} on {cores} cores {when}"
          + (": something else is running, and its load is in these timings" if busy else ""),
          file=log, flush=True)
    return load


def compared_sets(jobs: Sequence[Job]) -> list[list[Job]]:
    """Jobs grouped so that jobs sharing a set name are in one group (transitively); a job
    without sets is a group of its own. Groups in the order of their first job."""
    parent = list(range(len(jobs)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[str, int] = {}
    for i, job in enumerate(jobs):
        for s in job.sets:
            if s in first:
                parent[root(i)] = root(first[s])
            else:
                first[s] = i
    groups: dict[int, list[Job]] = {}
    for i, job in enumerate(jobs):
        groups.setdefault(root(i), []).append(job)
    return list(groups.values())


def set_key(group: Sequence[Job]) -> str:
    names = sorted({s for j in group for s in j.sets}) or [group[0].name]
    return ",".join(names)


def _cluster_key(job: Job) -> str:
    """``mpirun:2x4@1gbit`` (``3+1`` for uneven nodes): the cluster a job runs on."""
    p = job.placement
    slots = p.node_slots
    layout = f"{len(slots)}x{slots[0]}" if len(set(slots)) == 1 else "+".join(map(str, slots))
    return f"{p.launcher}:{layout}@{p.rate}"


def _hint_key(job: Job) -> str:
    """Whose last K a ladder starts from: the program on its cluster and ranks, and the model
    where the job names one. Without the model, GPT-tiny's K = 16 (latency-bound) started
    ResNet-50's ladder on the same 2 x 4 at 16, 7 min a probe, where 8 was its rung."""
    model = getattr(job.config, "model", None)
    return f"{job.program}:{_cluster_key(job)}:{job.nranks}" + (f":{model}" if model else "")


def _hints() -> dict:
    """The last K chosen for each probe (``HINTS``); none where the file is unreadable."""
    try:
        return json.loads(HINTS.read_text())
    except (OSError, ValueError):
        return {}


def one_sweep(job: Job, folder: Path) -> tuple[sweeps.Sweep, Path]:
    """A sweep of ``job`` alone writing to ``folder``, and the results file it gives the job
    (named by the point's id: the point and its launcher alone decide it)."""
    sweep = sweeps.make_sweep({"launcher": job.placement.launcher, "output": str(folder)},
                              {}, [job.point()])
    return sweep, folder / f"{sweeps.point_id(sweep.points()[0], sweep)}.jsonl"


def _auto_sets(jobs: Sequence[Job]) -> list[list[Job]]:
    """The compared sets of the jobs placed at ``auto``."""
    return compared_sets([j for j in jobs if j.placement.dilation == "auto"])


#: the outcome rule's tolerance: a figure within this of its value at 2K has not moved
OUTCOME_TOLERANCE = 0.05
#: probe runs the ladder pools at each K of a pair the interval leaves unresolved, the
#: calibration's count (benchmarks.hostload_calibration: 3 runs at each K); a pair still
#: unresolved at this many is read on the ratio of its pooled medians
PROBE_RUNS = 3


def probe_samples(records: Sequence[dict]) -> dict[str, list[float]]:
    """The samples of each figure the outcome rule compares, by row: per strategy and
    algorithm the step time (``step_s``, emulated) of each measured step (the step records,
    warm-up left out), or the summary's median where a row wrote no steps; per
    microbenchmark row (algorithm, size) its mean call time; other kinds give none."""
    steps: dict[str, list[float]] = {}
    out: dict[str, list[float]] = {}
    for r in records:
        kind, key = r.get("kind"), f"step:{r.get('strategy', '')}:{r.get('algo', '')}"
        if kind == "step" and not r.get("warmup") and isinstance(r.get("step_s"), (int, float)):
            steps.setdefault(key, []).append(float(r["step_s"]))
        elif kind == "summary" and isinstance(r.get("step_s"), (int, float)):
            out.setdefault(key, []).append(float(r["step_s"]))
        elif kind == "microbench" and isinstance(r.get("time_us"), dict):
            out.setdefault(f"call:{r.get('algo', '')}:{r.get('size', '')}", []).append(
                float(r["time_us"]["avg"]))
    return {**out, **steps}


def _pooled(runs: Sequence[Sequence[dict]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for records in runs:
        for f, xs in probe_samples(records).items():
            out.setdefault(f, []).extend(xs)
    return out


def probe_figures(records: Sequence[dict]) -> dict[str, float]:
    """Each figure of ``probe_samples`` as its median."""
    return {f: float(statistics.median(xs)) for f, xs in probe_samples(records).items()}


def outcome(at_k: Sequence[Sequence[dict]], at_2k: Sequence[Sequence[dict]],
            final: bool = False, tolerance: float = OUTCOME_TOLERANCE
            ) -> tuple[str | None, dict[str, dict]]:
    """The outcome rule on one probe's runs at K and at 2K (each a list of one run's
    records): each figure's samples pooled over the runs, the interval of its ratio K / 2K
    (``analysis.stats.agreement``) inside +-``tolerance`` (converged), wholly outside
    (moved), or neither (unresolved); the probe moved where any figure moved, converged
    where every one did, else unresolved. ``final`` (no more runs to come): a figure still
    unresolved is read on its ratio of medians instead, inside the tolerance or not (its
    reading says ``by: medians``). None where the sides share no figure. The second value:
    per figure, the reading, the ratio, its interval and the samples a side."""
    a, b = _pooled(at_k), _pooled(at_2k)
    readings: dict[str, dict] = {}
    for f in a:
        if f not in b or not all(x > 0 for x in b[f]):
            continue
        state, sp = stats.agreement(a[f], b[f], tolerance)
        by = "interval"
        if state == stats.UNRESOLVED and final:
            by = "medians"
            state = stats.CONVERGED if abs(sp.value - 1) <= tolerance else stats.MOVED
        readings[f] = {"reading": state, "by": by, "ratio": sp.value, "lo": sp.lo,
                       "hi": sp.hi, "samples": [len(a[f]), len(b[f])]}
    if not readings:
        return None, readings
    states = {r["reading"] for r in readings.values()}
    if stats.MOVED in states:
        return stats.MOVED, readings
    return (stats.CONVERGED if states == {stats.CONVERGED} else stats.UNRESOLVED), readings


def _start_k(job: Job, hints: dict) -> int:
    """Where the ladder starts for ``job``'s probe: the last choice (the nearest rung of the
    ladder at or above it), else the smallest K with no more ranks than cores x K."""
    if _hint_key(job) in hints:
        want = float(hints[_hint_key(job)])
        return next((k for k in AUTO_FACTORS if k >= want), AUTO_FACTORS[-1])
    cores = os.cpu_count() or 1
    return next((k for k in AUTO_FACTORS if job.nranks <= cores * k), AUTO_FACTORS[-1])


def _check_placeable(job: Job) -> None:
    """What time dilation cannot place (``commbench.flags.check_dilation``: a GPU, a
    torch.profiler trace), refused when the experiment is planned rather than when its
    first probe starts: ``auto``'s ladder judges K against 2K, so its probes run at K >= 2
    whatever it then picks."""
    k = job.placement.dilation
    if not job.placement.emulated or k in (None, 1, 1.0):
        return
    auto = k == "auto"
    try:
        check_dilated_argv(job.args, AUTO_FACTORS[1] if auto else float(k),
                           "--dilation auto (its probes run at K >= 2)" if auto else None)
    except ConfigError as e:
        raise RunnerError(f"job {job.name}: {e}") from None


@dataclass
class Runner:
    """Runs ``jobs`` in ``outdir``; ``repeats``: jobs per point where a job does not say."""

    jobs: Sequence[Job]
    outdir: Path
    repeats: int = 1
    log: object = None  # where progress goes (None: stderr)
    chosen: dict[str, dict] = field(default_factory=dict)
    failed: int = 0

    def __post_init__(self) -> None:
        self.log = self.log or sys.stderr
        names = [j.name for j in self.jobs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise RunnerError(f"job names repeat: {', '.join(dup)}")
        for job in self.jobs:
            _check_placeable(job)
        self.outdir = Path(self.outdir)
        path = self.outdir / CHOICE_FILE
        if path.exists():
            self.chosen = json.loads(path.read_text())
        self.jobs = list(self.jobs)

    # -- the dilation -----------------------------------------------------------------

    def chosen_k(self, group: Sequence[Job]) -> float | None:
        """The K chosen before for a compared set: that of every earlier choice whose sets
        share a name with ``group``'s and whose clusters hold all of ``group``'s (a study
        run for C2 alone, then for all claims, keeps C2's K); None where none was. Two such
        choices that disagree are an error: the folder holds runs of both."""
        names = {s for j in group for s in j.sets} or {group[0].name}
        clusters = {_cluster_key(j) for j in group}
        ks = {float(c["dilation"]) for key, c in self.chosen.items()
              if (names & set(c.get("sets", ())) and clusters <= set(c.get("clusters", ())))
              or key == set_key(group)}
        if len(ks) > 1:
            raise RunnerError(f"{self.outdir / CHOICE_FILE}: the compared set "
                              f"{set_key(group)} was given K = "
                              f"{', '.join(map(dil.text, sorted(ks)))} by earlier runs; give "
                              "a new folder, or --dilation K")
        return ks.pop() if ks else None

    def resolved(self) -> list[Job]:
        """The jobs with every ``auto`` replaced by its compared set's chosen K (jobs of a
        set not yet chosen keep ``auto``)."""
        out = {j.name: j for j in self.jobs}
        for group in _auto_sets(self.jobs):
            k = self.chosen_k(group)
            if k is not None:
                for j in group:
                    out[j.name] = j.at(k)
        return [out[j.name] for j in self.jobs]

    def choose_dilations(self) -> None:
        """Probe each compared set placed at ``auto`` not yet chosen (module docstring)."""
        for group in _auto_sets(self.jobs):
            key = set_key(group)
            if self.chosen_k(group) is not None:
                continue
            largest: dict[str, Job] = {}
            for j in group:  # each cluster's (launcher, layout, rate) largest job
                c = _cluster_key(j)
                if c not in largest or j.nranks > largest[c].nranks:
                    largest[c] = j
            pick = self._ladder(key, list(largest.values()))
            self.chosen[key] = {**pick, "sets": sorted({s for j in group for s in j.sets}),
                                "clusters": sorted(largest)}
            write_atomic(self.outdir / CHOICE_FILE, json.dumps(self.chosen, indent=1))
            self._remember(list(largest.values()), pick["dilation"])

    def _probe(self, job: Job, k: int, run: int = 1) -> list[dict]:
        """The records of ``job``'s probe at ``k``, its ``run``-th there (a one-point sweep
        of its own, in a folder of its own)."""
        probe = job.probe().at(float(k))
        where = self.outdir / PROBE_DIR / (f"{_cluster_key(job).replace(':', '-')}-k{k}"
                                           + (f"-r{run}" if run > 1 else ""))
        for stale in where.glob("*.done.json"):
            stale.unlink()  # a probe always runs anew
        sweep, out = one_sweep(probe, where)
        counts = sweeps.run_sweep(sweep, self.log)
        if counts["failed"]:
            raise RunnerError(f"dilation auto: the probe of {job.name} at K = {k} failed: see "
                              f"{where}/*.failed.json")
        try:
            return list(read_records(out))
        except (OSError, ValueError) as e:
            raise RunnerError(f"dilation auto: the probe of {job.name} at K = {k} left no "
                              f"readable records: {e}") from None

    def _ladder(self, key: str, probes: list[Job]) -> dict:
        """The outcome rule (docs/fidelity.md, calibrated by benchmarks.hostload_calibration):
        a set is link-bound at K when every figure of every probe at K agrees with its
        figure at 2K (``outcome``: the interval of the ratio inside +-``OUTCOME_TOLERANCE``).
        Each K is probed once; a pair the interval leaves unresolved gets one more probe run
        at both K until ``PROBE_RUNS``, then is read on its pooled medians. From the start
        K: where K and 2K agree, step down while they still do; where they do not, step up;
        the smallest K that agrees with 2K is chosen, else the ladder's top, said as "did
        not converge by K = ...". The counter verdicts each probe recorded are kept beside
        (``tried``), and where no probe gives a figure, they decide instead."""
        seen: dict[int, dict[str, list[list[dict]]]] = {}

        def at(k: int, runs: int = 1) -> dict[str, list[list[dict]]]:
            got = seen.setdefault(k, {j.name: [] for j in probes})
            for j in probes:
                while len(got[j.name]) < runs:
                    got[j.name].append(self._probe(j, k, len(got[j.name]) + 1))
            return got

        readings: dict[int, dict] = {}

        def agree(k: int) -> bool | None:
            for runs in range(1, PROBE_RUNS + 1):
                lo, hi = at(k, runs), at(2 * k, runs)
                final = runs == PROBE_RUNS
                got = {j.name: outcome(lo[j.name], hi[j.name], final) for j in probes}
                states = {s for s, _ in got.values()}
                readings[k] = {n: r for n, (_, r) in got.items()}
                if None in states:
                    return None
                if stats.MOVED in states:
                    return False
                if states == {stats.CONVERGED}:
                    return True
                print(f"[runner] dilation auto, {key}: K = {k} against {2 * k}: unresolved "
                      f"on {runs} probe run{'s' if runs > 1 else ''} a side; one more each",
                      file=self.log, flush=True)
            raise AssertionError("unreachable: the final reading decides")

        k = max(_start_k(j, _hints()) for j in probes)
        k = min(k, AUTO_FACTORS[-2])  # K is judged against 2K: the top rung is only a 2K
        judged: dict[int, bool | None] = {}
        pick = None
        while pick is None:
            judged[k] = a = agree(k)
            print(f"[runner] dilation auto, {key}: K = {k} against {2 * k}: "
                  + {None: "no figure to compare", True: "agree (link-bound)",
                     False: "moved (host-bound)"}[a], file=self.log, flush=True)
            i = AUTO_FACTORS.index(k)
            if a is None:
                pick = self._by_counters(key, probes, at)
            elif a:
                if i == 0 or judged.get(AUTO_FACTORS[i - 1]) is False:
                    pick = {"dilation": float(k), "verdict": LINK_BOUND,
                            "why": f"smallest K whose figures agree with 2K's within "
                                   f"{OUTCOME_TOLERANCE:.0%}"}
                else:
                    k = AUTO_FACTORS[i - 1]
            elif any(judged.get(f) for f in AUTO_FACTORS[i + 1:]):
                up = next(f for f in AUTO_FACTORS[i + 1:] if judged.get(f))
                pick = {"dilation": float(up), "verdict": LINK_BOUND,
                        "why": f"smallest K whose figures agree with 2K's within "
                               f"{OUTCOME_TOLERANCE:.0%}"}
            elif i == len(AUTO_FACTORS) - 2:
                top = AUTO_FACTORS[-1]
                pick = {"dilation": float(top), "verdict": f"did not converge by K = {top}",
                        "why": f"the figures still moved between K = {k} and {top}"}
            else:
                k = AUTO_FACTORS[i + 1]
        pick.setdefault("rule", "outcome")
        pick["tried"] = [{"dilation": f, "agrees_with_2k": judged.get(f),
                          "runs": min(len(rs) for rs in seen[f].values()),
                          "verdicts": {n: [r["bound"] for run in rs for r in run
                                           if r.get("bound")] for n, rs in seen[f].items()},
                          "figures": {n: {g: float(statistics.median(xs))
                                          for g, xs in _pooled(rs).items()}
                                      for n, rs in seen[f].items()},
                          **({"readings": readings[f]} if f in readings else {})}
                         for f in sorted(seen)]
        print(f"[runner] dilation auto, {key}: K = {dil.text(pick['dilation'])} "
              f"({pick['why']})", file=self.log, flush=True)
        return pick

    def _by_counters(self, key: str, probes: list[Job], at: Callable) -> dict:
        """The probes give no figure to compare (a program that writes none): the counter
        verdicts they recorded decide, the smallest K at which every one is link-bound, as
        before the outcome rule; none at all: K = 1."""
        for k in AUTO_FACTORS:
            verdicts = [r["bound"] for runs in at(k).values() for run in runs for r in run
                        if r.get("bound")]
            if not verdicts:
                return {"dilation": 1.0, "verdict": None,
                        "why": "the probes' programs judge no host load"}
            if all(v == LINK_BOUND for v in verdicts):
                return {"dilation": float(k), "verdict": LINK_BOUND, "rule": "counter",
                        "why": "smallest K whose probes recorded link-bound (no figure to "
                               "compare)"}
        return {"dilation": float(AUTO_FACTORS[-1]), "verdict": "host-bound",
                "why": "host-bound at every K tried (no figure to compare)"}

    def _remember(self, probes: list[Job], k: float) -> None:
        """Keep ``k`` as the next ladder's start for these probes (``HINTS``), merged into
        what is there now (another run may have written since); a cache: a failure to
        write it is a warning."""
        hints = _hints()
        hints.update({_hint_key(j): k for j in probes})
        try:
            HINTS.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(HINTS, json.dumps(hints, indent=1))
        except OSError as e:
            print(f"[runner] warning: the dilation hints were not kept ({HINTS}: {e})",
                  file=self.log, flush=True)

    # -- the sweeps -------------------------------------------------------------------

    def sweeps(self, pending: float | None = None) -> list[tuple[sweeps.Sweep, list[Job]]]:
        """One sweep per launcher (in the order the jobs first name it), with its jobs. A job
        whose set's K is not chosen yet stands at ``pending`` (a dry run's 1); without it,
        such a job is an error (its files are not named yet)."""
        jobs = self.resolved()
        waiting = sorted(j.name for j in jobs if j.placement.dilation == "auto")
        if waiting and pending is None:
            raise RunnerError(f"dilation auto: no K chosen yet for {', '.join(waiting)} "
                              "(Runner.run chooses it)")
        jobs = [j.at(pending) if j.placement.dilation == "auto" else j for j in jobs]
        launchers = list(dict.fromkeys(j.placement.launcher for j in jobs))
        out = []
        for launcher in launchers:
            mine = [j for j in jobs if j.placement.launcher == launcher]
            where = self.outdir if len(launchers) == 1 else self.outdir / launcher
            hosts = {j.placement.hosts for j in mine} - {None}
            sweep = sweeps.make_sweep(
                {"launcher": launcher, "output": str(where), "repeats": self.repeats,
                 **({"hosts": hosts.pop()} if hosts else {})}, {}, [j.point() for j in mine])
            out.append((sweep, mine))
        return out

    def outputs(self, job: Job | str) -> list[Path]:
        """The results file of each of ``job``'s repeats, repeat 0 first."""
        name = job if isinstance(job, str) else job.name
        for sweep, mine in self.sweeps():
            for j, pt in zip(mine, sweep.points()):
                if j.name == name:
                    pid = sweeps.point_id(pt, sweep)
                    return [Path(sweep.output) / f"{sweeps.repeat_id(pid, r)}.jsonl"
                            for r in range(pt.get("repeats", sweep.repeats))]
        raise KeyError(name)

    def commands(self) -> list[tuple[Job, list[str]]]:
        """Each job's command, as its sweep will run it (``auto`` not yet chosen: at 1)."""
        out = []
        for sweep, mine in self.sweeps(pending=1.0):
            for j, pt in zip(mine, sweep.points()):
                pid = sweeps.point_id(pt, sweep)
                out.append((j, sweeps.planned_command(
                    pt, sweep, Path(sweep.output) / f"{pid}.jsonl")))
        return out

    def priced(self, rungs: int = 0) -> list[Job]:
        """The jobs at the K they will run at: chosen, or for a set not chosen yet, where its
        ladder will start (the last choice for its probes, else ranks / cores), or
        ``rungs`` rungs above it."""
        hints = _hints()
        out = {j.name: j for j in self.resolved()}
        for group in _auto_sets(list(out.values())):
            i = AUTO_FACTORS.index(max(_start_k(j, hints) for j in group))
            k = AUTO_FACTORS[min(i + rungs, len(AUTO_FACTORS) - 1)]
            out.update({j.name: j.at(float(k)) for j in group})
        return [out[j.name] for j in self.jobs]

    def from_hints(self) -> bool:
        """Whether every set not chosen yet starts its ladder at a remembered K (one of its
        jobs, its probe, has one)."""
        hints = _hints()
        return all(any(_hint_key(j) in hints for j in group)
                   for group in _auto_sets(self.resolved()))

    def estimate_s(self, names: set[str] | None = None, rungs: int = 0) -> float:
        """Wall seconds of every job (or those named) and its repeats at the K it will run
        at (``priced``), with a bring-up per cluster."""
        total, last = 0.0, None
        for j in self.priced(rungs):
            if names is not None and j.name not in names:
                continue
            total += j.estimate_s() * (j.repeats or self.repeats)
            if j.placement.emulated and _cluster_key(j) != last:
                total += CLUSTER_S
                last = _cluster_key(j)
        return total

    def dry_run(self, log=None) -> None:
        log = log or sys.stdout
        planned = {j.name: j for j in self.jobs}
        for job, argv in self.commands():
            print(f"# {planned[job.name].describe()}", file=log)
            print(shlex.join(argv), file=log)

    def run(self, check: bool = True) -> dict[str, int]:
        """Check the machine (emulated jobs), choose every ``auto`` K, run every sweep
        between two load readings; return the counts (done, failed, skipped)."""
        if check and any(j.placement.emulated for j in self.jobs):
            try:
                check_machine()
            except ClusterError as e:
                raise RunnerError(str(e)) from None
        self.outdir.mkdir(parents=True, exist_ok=True)
        read_load("before the first job", self.log)
        self.choose_dilations()
        counts = {"done": 0, "failed": 0, "skipped": 0}
        for sweep, _ in self.sweeps():
            got = sweeps.run_sweep(sweep, self.log)
            if got["failed"]:
                print(f"# {got['failed']} job(s) failed: why is in "
                      f"{sweep.output}/*.failed.json", file=self.log, flush=True)
            for k in counts:
                counts[k] += got[k]
        self.failed += counts["failed"]
        read_load("after the jobs", self.log)
        return counts

    # -- repeat and judge ---------------------------------------------------------------

    def job_seconds(self, job: Job) -> float:
        """Mean wall seconds of ``job``'s finished repeats (``.done.json``), else its
        estimate."""
        secs = []
        for out in self.outputs(job):
            done = out.with_suffix(".done.json")
            if done.exists():
                secs.append(json.loads(done.read_text()).get("seconds") or 0.0)
        return sum(secs) / len(secs) if secs else next(
            j for j in self.priced() if j.name == job.name).estimate_s()

    def repeat_until(self, judge: Callable[[], dict[str, int]], budget_s: float,
                     started: float) -> dict:
        """Run; then while ``judge()`` wants more repeats of some jobs (job name -> total
        repeats wanted), add one more to each such job in turn while their seconds fit what
        is left of ``budget_s`` (counted from ``started``), and run again. Returns what
        happened: the rounds, why it stopped, and each job's repeats."""
        counts = self.run()
        rounds: list[dict] = []
        while True:
            if counts["failed"]:
                stopped = f"{counts['failed']} jobs failed"
                break
            want = {n: w for n, w in judge().items() if w > self._repeats_of(n)}
            if not want:
                stopped = "every judged figure is decided"
                break
            left = budget_s - (time.time() - started)
            by_name = {j.name: j for j in self.jobs}
            cost = {n: self.job_seconds(by_name[n]) for n in want}
            added: dict[str, int] = {}
            spend, grew = 0.0, True
            while grew:
                grew = False
                for n in sorted(want):
                    if self._repeats_of(n) + added.get(n, 0) < want[n] \
                            and spend + cost[n] <= left:
                        added[n] = added.get(n, 0) + 1
                        spend += cost[n]
                        grew = True
            if not added:
                stopped = (f"the budget is spent: {fmt_s(max(left, 0))} left, and the next "
                           f"job takes ~{fmt_s(min(cost.values()))}")
                break
            self.jobs = [_more(j, added.get(j.name, 0), self.repeats) for j in self.jobs]
            rounds.append({"added": added, "expected_s": round(spend)})
            print(f"# repeat: {sum(added.values())} more jobs (~{fmt_s(spend)}; "
                  f"{fmt_s(left)} of the budget left)", file=self.log, flush=True)
            counts = self.run(check=False)
        print(f"# repeat: {stopped}", file=self.log, flush=True)
        return {"budget_s": budget_s, "spent_s": round(time.time() - started),
                "rounds": rounds, "stopped": stopped,
                "repeats": {j.name: self._repeats_of(j.name) for j in self.jobs}}

    def _repeats_of(self, name: str) -> int:
        job = next(j for j in self.jobs if j.name == name)
        return job.repeats or self.repeats


def _more(job: Job, n: int, default: int) -> Job:
    return job if not n else replace(job, repeats=(job.repeats or default) + n)
