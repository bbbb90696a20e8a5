"""What every emulated-cluster benchmark shares: layouts, the load check, running jobs, records.

A benchmark plans jobs (each a ``python -m launch.cluster run ... -- program``
argv writing one results file), prints the load average first (timings on a
busy 2-core machine measure the machine), runs the jobs one at a time, then
reads the records back and prints its table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from launch.execute import run

ROOT = Path(__file__).resolve().parents[1]  # the jobs run here: this checkout's commbench
LOAD_WARN = 1.5  # 1-minute load average above which timings are suspect on 2 cores


def parse_layout(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)x(\d+)", text.strip())
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise argparse.ArgumentTypeError(f"layout {text!r}: write NODESxRANKS, e.g. 2x4")
    return int(m.group(1)), int(m.group(2))


def layouts(text: str) -> list[tuple[int, int]]:
    return [parse_layout(x) for x in text.split(",") if x.strip()]


def cluster_argv(nodes: int, slots: int | Sequence[int], rate: str, program: Sequence[str],
                 timeout_s: float, launcher: str = "mpirun") -> list[str]:
    """``python -m launch.cluster run`` of ``program`` on ``nodes`` x ``slots`` ranks
    (``slots`` one number for every node, or one per node: ``[3, 1]``)."""
    per_node = str(slots) if isinstance(slots, int) else ",".join(map(str, slots))
    return [sys.executable, "-m", "launch.cluster", "run", "--nodes", str(nodes),
            "--slots", per_node, "--rate", rate, "--launcher", launcher,
            "--timeout", str(timeout_s), "--", *program]


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


def run_jobs(jobs: Sequence[tuple[str, list[str]]], timeout_s: float) -> int:
    """Run (label, argv) jobs one after another from the repository root; return failures."""
    failed = 0
    for k, (label, argv) in enumerate(jobs, 1):
        print(f"# job {k}/{len(jobs)}: {label}", flush=True)
        res = run(argv, timeout=timeout_s + 60, cwd=str(ROOT))
        if res.returncode != 0 or res.timed_out:
            failed += 1
            print(f"# job failed (exit {res.returncode}{', timed out' if res.timed_out else ''})"
                  f":\n{res.stdout[-2000:]}{res.stderr[-2000:]}", file=sys.stderr)
    return failed


def add_output_flags(p: argparse.ArgumentParser, stem: str) -> None:
    """``--outdir`` (default ``results/<stem>-<time>``) and ``--dry-run``."""
    p.add_argument("--outdir", type=Path, default=None,
                   help=f"where the jobs' records go (default: results/{stem}-<time>)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")


def outdir_of(args: argparse.Namespace, stem: str) -> Path:
    return args.outdir or ROOT / "results" / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def execute(jobs: Sequence[tuple[str, list[str]]], outdir: Path, dry_run: bool,
            timeout_s: float) -> int | None:
    """Print the jobs' commands (``dry_run``: return None), or run them one at a time
    between two load readings and return the failures."""
    if dry_run:
        for _, argv in jobs:
            print(shlex.join(argv))
        return None
    print_load("before starting")
    outdir.mkdir(parents=True, exist_ok=True)
    failed = run_jobs(jobs, timeout_s)
    print_load("after the jobs")
    return failed


def records(path: Path, kind: str) -> list[dict]:
    """Records of ``kind`` in a results file (a truncated last line is skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("kind") == kind:
            out.append(rec)
    return out
