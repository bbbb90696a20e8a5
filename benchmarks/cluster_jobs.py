"""What every emulated-cluster benchmark shares: layouts, the load check, its jobs as sweeps.

A benchmark plans its jobs as tool configurations (``ToolJob``: a
``commbench.allreduce.Config``, ``commbench.microbench.MicroConfig``, ... and
the cluster it runs on); nothing here runs a rank or reads a file its own way:

- ``execute`` runs the jobs as ``launch.sweep`` sweeps (one per launcher),
  each job a point whose command line is ``commbench.flags.to_argv`` of its
  configuration, on an emulated cluster that ``launch.sweep`` brings up
  (measuring its link first, and keeping it up across consecutive jobs of the
  same shape). The load average is printed before and after: timings on a
  busy 2-core machine measure the machine. With ``--dry-run`` it prints each
  job's command instead (``launch.study.launch_command``: what the sweep
  would run once its cluster is up). Given the ``--outdir`` of an interrupted
  run, finished jobs are skipped (``launch.sweep`` resumes).
- ``records`` reads a job's results with ``commbench.results.read_records``.

Every benchmark takes ``--dilation K|auto`` (``add_output_flags``): its jobs run
time-dilated (``commbench.dilation``; ``launch.sweep``'s ``auto`` probes each
cluster), so figures that ranks outnumbering cores would otherwise bend can be
taken with this machine's cores out of them. A job that names its own K keeps it.
"""

from __future__ import annotations

import argparse
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
from typing import Any

from commbench import dilation as dil
from commbench.flags import to_argv
from commbench.results import read_records
from launch import sweep as sweeps
from launch.cluster import ClusterError, check_machine
from launch.study import launch_command

ROOT = Path(__file__).resolve().parents[1]  # default results go here: results/<stem>-<time>
LOAD_WARN = 1.5  # 1-minute load average above which timings are suspect on 2 cores


def parse_layout(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)x(\d+)", text.strip())
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise argparse.ArgumentTypeError(f"layout {text!r}: write NODESxRANKS, e.g. 2x4")
    return int(m.group(1)), int(m.group(2))


def layouts(text: str) -> list[tuple[int, int]]:
    return [parse_layout(x) for x in text.split(",") if x.strip()]


def load_average() -> tuple[str, float]:
    """``uptime``'s line and its 1-minute load average."""
    try:
        line = subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        line = ""
    return line.strip() or "uptime: unavailable", os.getloadavg()[0]


def print_load(when: str) -> float:
    """Print the load average (warning above ``LOAD_WARN``); return it."""
    line, load = load_average()
    print(f"# {when}: {line}", flush=True)
    if load > LOAD_WARN:
        print(f"# warning: load average {load:.2f} > {LOAD_WARN}: something else is running; "
              "these timings measure it too", file=sys.stderr)
    return load


def dilation_arg(text: str) -> float | str:
    """``--dilation``'s type: a number from 1 to 64, or ``auto``; anything else exits 2."""
    try:
        return dil.parse(text, allow_auto=True)
    except dil.DilationError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"--dilation {text}: ")) from None


def add_output_flags(p: argparse.ArgumentParser, stem: str) -> None:
    """``--outdir`` (default ``results/<stem>-<time>``), ``--dry-run`` and ``--dilation``."""
    p.add_argument("--dilation", type=dilation_arg, default=None, metavar="K|auto",
                   help="run every job time-dilated by K (launch.cluster --dilation: links at "
                        "rate / K, everything else on emulated time K times slower; records "
                        "and figures in emulated time); auto: the smallest of 1, 2, 4, 8 whose "
                        "short probe is link-bound, per cluster (default: 1)")
    p.add_argument("--outdir", type=Path, default=None,
                   help=f"where the jobs' records go (default: results/{stem}-<time>); the "
                        "folder of an interrupted run resumes it")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")


def outdir_of(args: argparse.Namespace, stem: str) -> Path:
    return (args.outdir or ROOT / "results" / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
            ).resolve()


# -- jobs ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ToolJob:
    """One job of a benchmark: a tool's configuration and the emulated cluster it runs on.

    The program is the module that owns the configuration's class
    (``commbench.microbench.MicroConfig`` runs ``python -m commbench.microbench``), its
    arguments ``to_argv(config)``; ``launch.sweep`` adds ``--output``, so ``config``
    leaves it unset.
    """

    name: str  # unique within the benchmark: the sweep point's name
    config: Any  # a tool's configuration dataclass (its flags declared with flags.flag)
    nodes: int
    slots: int | tuple[int, ...]  # ranks per node: one number for every node, or one each
    rate: str = "none"  # link rate per node (tc syntax), or none
    launcher: str = "mpirun"
    timeout_s: float = 600.0  # emulated: the sweep multiplies it by the dilation
    dilation: float | str | None = None  # time dilation K, "auto", or None: the command line's
    repeats: int = 1  # jobs of it (launch.sweep --repeats): each a run of its own, own file

    @property
    def program(self) -> str:
        return type(self.config).__module__

    @property
    def ranks(self) -> int:
        return self.nodes * self.slots if isinstance(self.slots, int) else sum(self.slots)

    def point(self) -> dict:
        """The ``launch.sweep`` point that runs this job on all its cluster's ranks."""
        return {"name": self.name, "ranks": self.ranks, "nodes": self.nodes,
                "slots": self.slots if isinstance(self.slots, int) else list(self.slots),
                "rate": self.rate, "program": self.program, "args": to_argv(self.config),
                "timeout": float(self.timeout_s),
                **({} if self.dilation in (None, 1, 1.0) else {"dilation": self.dilation}),
                **({} if self.repeats == 1 else {"repeats": self.repeats})}


class Planned:
    """A benchmark's jobs as ``launch.sweep`` sweeps: one per launcher, in the order the
    jobs first name it, in ``outdir`` (``outdir/<launcher>`` when there are several)."""

    def __init__(self, jobs: Sequence[ToolJob], outdir: Path) -> None:
        self.jobs = list(jobs)
        self.outdir = outdir
        names = [j.name for j in self.jobs]
        if len(set(names)) != len(names):
            raise ValueError(f"job names repeat: {names}")
        self.sweeps: list[sweeps.Sweep] = []
        self._where: dict[str, tuple[sweeps.Sweep, dict]] = {}  # name -> sweep, its point
        self.failed = 0  # jobs that failed when run
        launchers = list(dict.fromkeys(j.launcher for j in self.jobs))
        for launcher in launchers:
            mine = [j for j in self.jobs if j.launcher == launcher]
            where = outdir if len(launchers) == 1 else outdir / launcher
            sweep = sweeps.make_sweep({"launcher": launcher, "output": str(where)}, {},
                                      [j.point() for j in mine])
            self.sweeps.append(sweep)
            for job, pt in zip(mine, sweep.points()):  # checked as the sweep will run them
                self._where[job.name] = (sweep, pt)

    def output(self, job: ToolJob) -> Path:
        """The results file the sweep gives ``job``: named by its planned point's id (the
        point as planned, with the dilation ``execute`` gave it)."""
        return self.outputs(job)[0]

    def outputs(self, job: ToolJob) -> list[Path]:
        """The results file of each of ``job``'s repeats, repeat 0 first (named as
        ``launch.sweep.repeat_id`` names each repeat's job)."""
        sweep, pt = self._where[job.name]
        pid = sweeps.point_id(pt, sweep)
        return [Path(sweep.output) / f"{sweeps.repeat_id(pid, r)}.jsonl"
                for r in range(pt.get("repeats", sweep.repeats))]

    def commands(self) -> list[tuple[ToolJob, list[str]]]:
        """Each job's command, as the sweep will run it on its cluster."""
        return [(job, launch_command(pt, sweep, self.output(job)))
                for job in self.jobs for sweep, pt in [self._where[job.name]]]


def output_of(job: ToolJob, sweep_dir: Path) -> Path:
    """The results file ``launch.sweep`` gives ``job`` in a sweep writing to ``sweep_dir``:
    named by the point's id, which depends on the point and its launcher alone, so a job
    can name another's file before either runs (a profile the next job replays)."""
    sweep = sweeps.make_sweep({"launcher": job.launcher, "output": str(sweep_dir)}, {},
                              [job.point()])
    return sweep_dir / f"{sweeps.point_id(sweep.points()[0], sweep)}.jsonl"


def describe(job: ToolJob) -> str:
    slots = job.slots if isinstance(job.slots, int) else "+".join(map(str, job.slots))
    k = "" if job.dilation in (None, 1, 1.0) else f", dilation {job.dilation}"
    n = "" if job.repeats == 1 else f", {job.repeats} repeats"
    return (f"{job.name}: {job.launcher}, {job.nodes} nodes x {slots} ranks, link "
            f"{job.rate}{k}{n}")


def execute(jobs: Sequence[ToolJob], args: argparse.Namespace, stem: str) -> Planned | None:
    """Print the jobs' commands (``args.dry_run``: return None), or run them between two
    load readings, in ``args.outdir`` (``outdir_of``); the returned plan says where each
    job's results are (``outdir``) and how many failed."""
    k = getattr(args, "dilation", None)
    if k is not None:
        jobs = [j if j.dilation is not None else replace(j, dilation=k) for j in jobs]
    planned = Planned(list(jobs), outdir_of(args, stem))
    if args.dry_run:
        for job, argv in planned.commands():
            print(f"# {describe(job)}")
            print(shlex.join(argv))
        return None
    try:
        check_machine()  # the emulated cluster: root, network namespaces, tc
    except ClusterError as e:
        raise SystemExit(f"error: {e}") from None

    def on_term(signum, frame):
        raise SystemExit(128 + signum)  # unwind: the running job and cluster are cleaned up

    signal.signal(signal.SIGTERM, on_term)
    print_load("before starting")
    for sweep in planned.sweeps:
        counts = sweeps.run_sweep(sweep)
        if counts["failed"]:
            print(f"# {counts['failed']} job(s) failed: why is in {sweep.output}/*.failed.json",
                  file=sys.stderr)
        planned.failed += counts["failed"]
    print_load("after the jobs")
    return planned


def records(path: Path, kind: str) -> list[dict]:
    """Records of ``kind`` in a job's results file (``commbench.results.read_records``: a
    truncated last line is skipped with a warning, any other bad line is an error); none
    where the job wrote no file (it failed: the sweep said so, and why)."""
    if not path.exists():
        return []
    return [r for r in read_records(path) if r.get("kind") == kind]
