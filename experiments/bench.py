"""A benchmark as one object: its flags, its plan and its check, run by the one runner.

Each module under ``benchmarks/`` (``peer_fairness``, ``hier_bound``, ...) holds
one ``Benchmark``: ``plan(args)`` returns its ``Job`` list, ``check(args, jobs,
runner)`` reads what the runner's jobs wrote (``runner.outputs(job)``), prints its
table and verdicts and returns the exit status. ``Benchmark.main`` is the same
for all: ``--outdir``, ``--dry-run`` and ``--dilation`` (``add_output_flags``),
the runner, Ctrl-C. A judge pools into one side only records of one set-up
(``one_setup``).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from analysis import match
from commbench import dilation as dil
from commbench.results import read_records
from experiments.job import Job
from experiments.runner import Runner, RunnerError, one_sweep
from launch.execute import interruptible

ROOT = Path(__file__).resolve().parents[1]  # default results go here: results/<stem>-<time>


def parser(module: str, doc: str | None, defaults: bool = True) -> argparse.ArgumentParser:
    """A benchmark's parser: ``python -m <module>``, its docstring's first line, and its
    defaults in the help (``defaults``)."""
    kw = {"formatter_class": argparse.ArgumentDefaultsHelpFormatter} if defaults else {}
    return argparse.ArgumentParser(prog=f"python -m {module}",
                                   description=(doc or "").splitlines()[0], **kw)


def parse_layout(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)x(\d+)", text.strip())
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise argparse.ArgumentTypeError(f"layout {text!r}: write NODESxRANKS, e.g. 2x4")
    return int(m.group(1)), int(m.group(2))


def layouts(text: str) -> list[tuple[int, int]]:
    return [parse_layout(x) for x in text.split(",") if x.strip()]


def repeats_arg(text: str) -> int:
    """``--repeats``' type: a whole number of runs, at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of runs, at least 1")
    return int(text)


def names_arg(choices: Sequence[str], what: str = "model") -> Callable[[str], list[str]]:
    """A type for a comma list of names out of ``choices`` (``--models``; ``what`` they
    are): unknown or none exits 2, naming the choices."""
    def parse(text: str) -> list[str]:
        out = [m.strip() for m in text.split(",") if m.strip()]
        bad = [m for m in out if m not in choices]
        if bad or not out:
            raise argparse.ArgumentTypeError(f"unknown {what}(s) {bad or text!r}; choose from "
                                             f"{', '.join(choices)}")
        return out
    return parse


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
                        "and figures in emulated time); auto: one K per compared set, the "
                        "smallest at which short probes of its clusters are link-bound "
                        "(experiments.runner; default: 1)")
    p.add_argument("--outdir", type=Path, default=None,
                   help=f"where the jobs' records go (default: results/{stem}-<time>); the "
                        "folder of an interrupted run resumes it")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")


def outdir_of(args: argparse.Namespace, stem: str) -> Path:
    return (args.outdir or ROOT / "results" / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
            ).resolve()


def output_of(job: Job, sweep_dir: Path) -> Path:
    """The results file the runner gives ``job`` in a sweep writing to ``sweep_dir``: named
    by the point's id, which depends on the point and its launcher alone, so a job can name
    another's file before either runs (a profile the next job replays)."""
    return one_sweep(job, sweep_dir)[1]


def records(path: Path, kind: str) -> list[dict]:
    """Records of ``kind`` in a job's results file (``commbench.results.read_records``: a
    truncated last line is skipped with a warning, any other bad line is an error), each
    with ``_file``, the file's path (``analysis.load.mark_setup_verdicts`` finds the set's
    verdict beside it); none where the job wrote no file (it failed: the runner said so,
    and why)."""
    if not path.exists():
        return []
    return [{**r, "_file": str(path)} for r in read_records(path) if r.get("kind") == kind]


def one_setup(runs: Sequence[dict]) -> tuple[list[dict], int]:
    """The runs of one side of a comparison that may be pooled: the largest set of them that
    match on every ``analysis.match`` field (revision and dilation included); and how many
    were left out (runs of another revision, K, cluster...)."""
    if not runs:
        return [], 0
    groups = match.matched_sets(runs)
    best = max(groups, key=len)
    return best, len(runs) - len(best)


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: its name (the results folder's stem), flags, plan and check."""

    stem: str
    build_parser: Callable[[], argparse.ArgumentParser]
    plan: Callable[[argparse.Namespace], list[Job]]
    #: (args, jobs, runner) -> exit status, after printing the table and verdicts
    check: Callable[[argparse.Namespace, list[Job], Runner], int]
    #: (args) -> an error message for flags that cannot run, or None
    refuse: Callable[[argparse.Namespace], str | None] = lambda args: None

    def jobs(self, args: argparse.Namespace) -> list[Job]:
        """The planned jobs at the command line's ``--dilation`` where a job names none."""
        k = getattr(args, "dilation", None)
        jobs = self.plan(args)
        return [j if j.placement.dilation is not None or k is None else j.at(k) for j in jobs]

    def main(self, argv: list[str] | None = None) -> int:
        args = self.build_parser().parse_args(argv)
        args.outdir = outdir_of(args, self.stem)  # jobs may name each other's files there
        why = self.refuse(args)
        if why:
            print(f"error: {why}", file=sys.stderr)
            return 2
        jobs = self.jobs(args)
        try:
            runner = Runner(jobs, args.outdir)
        except RunnerError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if args.dry_run:
            runner.dry_run()
            return 0

        def body() -> int:
            args.started = time.monotonic()  # the jobs' and the check's wall time
            try:
                runner.run()
            except RunnerError as e:
                raise SystemExit(f"error: {e}") from None
            status = self.check(args, runner.resolved(), runner)
            return 1 if runner.failed else status

        return interruptible(body, f"benchmarks.{self.stem.replace('-', '_')}")
