"""Resumable sweeps: a grid of points, each its own job with a deadline.

A sweep file (TOML or JSON) names the launcher, fixed arguments and a grid::

    [sweep]
    launcher = "mpirun"        # mpirun | horovodrun | horovodrun-gloo | torchrun
    program = "commbench.allreduce"
    args = ["--steps", "10", "--warmup", "2"]
    timeout = 900              # seconds per point
    output = "results/sweep-flat"

    [grid]                     # every combination is one point
    ranks = [2, 4]
    algo = ["native", "ring"]
    model = ["resnet18", "resnet50"]
    # nodes/slots/rate run the point on an emulated cluster (launch.cluster);
    # slots = [4] is 4 on every node, slots = ["3,1"] one uneven layout (nodes then optional)
    # dilation = [1, 4] runs each point at time dilation 1 and 4 (emulated clusters only);
    # ("auto", one K chosen per compared set by probes, is the experiment runner's:
    # python -m experiments.study, the benchmarks)

or the same from flags::

    python -m launch.sweep --set ranks=2,4 --set algo=native,ring -o results/s -- --steps 10
    python -m launch.sweep --set slots=3+1,2+2 --set rate=1gbit -o results/u   # two layouts
    python -m launch.sweep --set slots=4 --set nodes=2 --set rate=1gbit --dilation 4 -o r/d

In ``--set`` commas separate a key's values, so per-node slots there are
joined with ``+`` (``slots=3+1``); in a file write ``"3,1"``, ``"3+1"`` or ``[3, 1]``.

Each point writes ``<output>/<point id>.jsonl``; a finished point also
``<id>.done.json``, a failed one ``<id>.failed.json`` (exit status, timeout,
the end of its output), and the sweep goes on. Running the same sweep again
skips points that are done and re-runs failed or interrupted ones (an
interrupted point's partial results are discarded first).

``--repeats N`` (``repeats = N`` in [sweep]) runs every point N times, each
repeat a job of its own with its own file (``<id>-r<r>.jsonl`` for r > 0), in
an order shuffled with ``shuffle_seed`` within each cluster configuration
(``Sweep.jobs``); the records carry ``repeat`` and the code's ``revision``.
Raising N on a finished sweep runs only the new repeats.

A caller that plans its own jobs (``experiments.runner``) gives a list of points
rather than a grid: each point holds grid keys plus, optionally, its own
``program``, ``args`` (after the sweep's), ``name`` (for its id and progress
line), ``timeout``, ``repeats`` (its own, instead of the sweep's) and
``estimate_s`` (its expected seconds, which the progress line's estimate of what
remains then weighs points by).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from commbench import dilation as dil
from commbench.buckets import parse_bucket_mb
from commbench.cores import LOADAVG_ENV, RUNNABLE_ENV, load_average, runnable_tasks
from commbench.flags import MOVED_STRATEGIES, ConfigError, check_dilated_argv
from commbench.results import REPEAT_ENV, write_atomic
from launch import commands
from launch.cluster import (
    ClusterError,
    ClusterSpec,
    check_machine,
    cluster,
    launch_argv,
    measure_link,
    node_slots,
    parse_rate,
    parse_slots,
)
from launch.commands import LAUNCHERS
from launch.execute import interruptible, run

# grid keys the launcher consumes -> type of each value
LAUNCH_KEYS: dict[str, type] = {
    "ranks": int, "nodes": int,
    "slots": int,  # or per node: "3,1" / "3+1" / [3, 1] (see _check_slots)
    "rate": str,
    "dilation": float,  # time dilation K of the point's emulated cluster (commbench.dilation)
}
# grid keys the program takes, as the flag ``--key-with-dashes`` -> type of each value
PROGRAM_KEYS: dict[str, type] = {
    "strategy": str, "algo": str, "backend": str, "workload": str, "model": str,
    "batch_size": int, "compute_ms": float, "steps": int, "bucket_mb": float,
    "accum_steps": int, "compression": str, "staleness": int,
}
GRID_KEYS: dict[str, type] = {**LAUNCH_KEYS, **PROGRAM_KEYS}
SWEEP_KEYS: dict[str, type] = {"launcher": str, "program": str, "args": list, "timeout": float,
                               "output": str, "hosts": str, "repeats": int,
                               "shuffle_seed": int}
# keys a point of an explicit list (``points=``) may carry besides the grid keys
POINT_KEYS: dict[str, type] = {"program": str, "args": list, "name": str, "timeout": float,
                               "estimate_s": float, "repeats": int}
# point keys that say how to run a point, not what it is: left out of its id
RUN_ONLY = ("timeout", "estimate_s", "repeats")
CLUSTER_NAME = "cbsw"  # the emulated cluster a sweep brings up (launch.cluster --name)


class SweepError(Exception):
    """Bad sweep description; the message names the key."""


@dataclass
class Sweep:
    launcher: str = "mpirun"
    program: str = "commbench.allreduce"
    args: list[str] = field(default_factory=list)
    timeout: float = 900.0
    output: str = "results/sweep"
    #: a real cluster's hosts (``a:8,b:8``) for points without nodes/slots; None: this host
    hosts: str | None = None
    grid: dict[str, list] = field(default_factory=dict)
    #: explicit points (grid keys plus ``POINT_KEYS``) instead of the grid's combinations
    point_list: list[dict] | None = None
    #: jobs per point (``jobs``): each repeat its own job, shuffled within its cluster
    repeats: int = 1
    #: the shuffle's seed: the same sweep runs its repeats in the same order
    shuffle_seed: int = 0

    def points(self) -> list[dict]:
        if self.point_list is not None:
            return [dict(p) for p in self.point_list]
        keys = list(self.grid)
        return [dict(zip(keys, combo)) for combo in itertools.product(*self.grid.values())]

    def jobs(self) -> list[tuple[str, dict, int]]:
        """Every job of the sweep, in the order it runs: (id, point, repeat).

        One repeat: the points in order, each with its ``point_id``. With ``repeats`` N,
        every point runs N times (a point's own ``repeats`` wins: a job that repeats
        itself inside, as the convergence study over seeds, runs once), each repeat a job
        of its own (repeat 0 keeps the point's id, repeat r > 0 adds ``-r<r>``, so raising
        N later runs only the new repeats).
        Points are grouped by the cluster they run on (layout, link rate and dilation;
        points on this host or real hosts are one group), groups in the order of their
        first point, so each cluster comes up once; within a group the jobs are shuffled
        (``random.Random(shuffle_seed)``), so that the machine's drift over the sweep spreads
        over every point rather than favouring the first repeats (Hoefler & Belli 2015)."""
        points = self.points()
        ids = [point_id(p, self) for p in points]
        if self.repeats == 1 and all(p.get("repeats", 1) == 1 for p in points):
            return [(i, p, 0) for i, p in zip(ids, points)]
        groups: dict[tuple, list[tuple[str, dict, int]]] = {}
        for i, p in zip(ids, points):
            layout = layout_of(p)
            key = (None,) if layout is None else (tuple(layout), p.get("rate"),
                                                  str(p.get("dilation", 1.0)))
            groups.setdefault(key, []).extend(
                (repeat_id(i, r), p, r) for r in range(p.get("repeats", self.repeats)))
        rng = random.Random(self.shuffle_seed)
        out = []
        for jobs in groups.values():
            rng.shuffle(jobs)
            out += jobs
        return out


def _check_value(key: str, value, typ: type):
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, typ) or isinstance(value, bool):
        raise SweepError(f"{key}: expected {typ.__name__}, got {value!r}")
    return value


def _check_slots(name: str, value) -> int | list[int]:
    """A point's slots: an int (every node, as before) or a per-node list of ints, from
    ``[3, 1]``, ``"3,1"`` or ``"3+1"``; ``name`` names the setting in errors."""
    text = value.replace("+", ",") if isinstance(value, str) else value
    try:
        per_node = parse_slots(text, name)
    except ClusterError as e:
        raise SweepError(str(e)) from None
    every_node = isinstance(value, int) or (isinstance(value, str) and len(per_node) == 1)
    return per_node[0] if every_node else per_node


def _grid_value(name: str, key: str, value):
    """``value`` of grid key ``key`` checked (``name`` says where it was given)."""
    if key == "slots":
        return _check_slots(name, value)
    if key == "dilation":
        if isinstance(value, str) and value.strip().lower() == "auto":
            raise SweepError(f"{name} auto: a sweep runs the K it is given; auto (one K per "
                             "compared set, chosen by probes) is the experiment runner's: "
                             "python -m experiments.study or a benchmark's --dilation auto")
        try:
            return float(dil.parse(value, name))
        except dil.DilationError as e:
            raise SweepError(str(e)) from None
    if key == "bucket_mb":  # MB or auto
        try:
            return parse_bucket_mb(value)
        except ValueError as e:
            raise SweepError(f"{name}: {e}") from None
    return _check_value(name, value, GRID_KEYS[key])


def layout_of(point: dict, where: str = "grid") -> list[int] | None:
    """Slots per node of a point on an emulated cluster (None: no cluster)."""
    if "slots" not in point:
        return None
    try:
        return node_slots(point.get("nodes"), point["slots"], nodes_flag=f"{where}.nodes",
                          slots_flag=f"{where}.slots")
    except ClusterError as e:
        raise SweepError(str(e)) from None


def _check_points(points: list[dict]) -> list[dict]:
    checked = []
    for i, pt in enumerate(points):
        out = {}
        for k, v in pt.items():
            if k in GRID_KEYS:
                out[k] = _grid_value(f"points[{i}].{k}", k, v)
            elif k in POINT_KEYS:
                out[k] = _check_value(f"points[{i}].{k}", v, POINT_KEYS[k])
            else:
                raise SweepError(f"points[{i}]: unknown key {k!r}; known: "
                                 f"{', '.join([*GRID_KEYS, *POINT_KEYS])}")
        if not all(isinstance(a, str) for a in out.get("args", [])):
            raise SweepError(f"points[{i}].args: expected a list of strings")
        checked.append(out)
    return checked


def make_sweep(sweep: dict, grid: dict, points: list[dict] | None = None) -> Sweep:
    """Check a parsed description: unknown keys and wrong types are errors naming the key.
    ``points``, an explicit list, replaces the grid."""
    for k, v in sweep.items():
        if k not in SWEEP_KEYS:
            raise SweepError(f"[sweep] unknown key {k!r}; known: {', '.join(SWEEP_KEYS)}")
        _check_value(f"sweep.{k}", v, SWEEP_KEYS[k])
    if sweep.get("launcher", "mpirun") not in LAUNCHERS:
        raise SweepError(f"sweep.launcher: {sweep['launcher']!r} is not one of "
                         f"{', '.join(LAUNCHERS)}")
    if not all(isinstance(a, str) for a in sweep.get("args", [])):
        raise SweepError("sweep.args: expected a list of strings")
    checked = {}
    for k, values in grid.items():
        if k not in GRID_KEYS:
            raise SweepError(f"[grid] unknown key {k!r}; known: {', '.join(GRID_KEYS)}")
        values = values if isinstance(values, list) else [values]
        if not values:
            raise SweepError(f"grid.{k}: empty list")
        checked[k] = [_grid_value(f"grid.{k}", k, v) for v in values]
    for value in checked.get("strategy", []):
        for name in value.split(","):
            if name.strip() in MOVED_STRATEGIES:
                raise SweepError(f"grid.strategy: {name.strip()} is a program of its own now: "
                                 f"set sweep.program = \"{MOVED_STRATEGIES[name.strip()]}\" "
                                 "(--program) and leave strategy out of the grid")
    if points is not None and grid:
        raise SweepError("give a grid or a list of points, not both")
    s = Sweep(**{k: v for k, v in sweep.items()}, grid=checked,
              point_list=None if points is None else _check_points(points))
    for p in s.points():
        ranks, nodes, slots = p.get("ranks"), p.get("nodes"), p.get("slots")
        if nodes is not None and slots is None:
            raise SweepError("grid: nodes and slots go together")
        if ranks is not None and ranks < 1:
            raise SweepError(f"grid.ranks: must be >= 1, got {ranks}")
        layout = layout_of(p)
        if layout is not None and ranks is not None and ranks > sum(layout):
            raise SweepError(f"grid: {ranks} ranks is more than "
                             f"{commands.layout_text(layout)}")
        if "rate" in p:
            try:
                parse_rate(p["rate"])
            except ClusterError as e:
                raise SweepError(f"grid.rate: {e}") from None
        if "dilation" in p:
            if p["dilation"] != 1 and (layout is None or s.hosts):
                raise SweepError(f"dilation {p['dilation']}: time dilation applies to "
                                 "emulated links only (points with nodes/slots, on "
                                 "launch.cluster); this point runs on "
                                 f"{'the hosts ' + s.hosts if s.hosts else 'this host, unshaped'}")
            try:  # what dilation cannot place, refused before any point runs
                check_dilated_argv(point_args(p, s), p["dilation"])
            except ConfigError as e:
                raise SweepError(f"point {p.get('name') or point_id(p, s)}: {e}") from None
    if s.timeout <= 0 or any(p.get("timeout", 1) <= 0 for p in s.points()):
        raise SweepError("timeout: must be > 0")
    if s.repeats < 1 or any(p.get("repeats", 1) < 1 for p in s.points()):
        raise SweepError(f"repeats: must be >= 1, got "
                         f"{min(s.repeats, *(p.get('repeats', 1) for p in s.points()))}")
    return s


def load_file(path: str) -> tuple[dict, dict]:
    p = Path(path)
    try:
        if p.suffix == ".toml":
            import tomllib  # Python 3.11+ (3.9 supported): an ImportError is a SweepError

            data = tomllib.loads(p.read_text())
        else:
            data = json.loads(p.read_text())
    except FileNotFoundError:
        raise SweepError(f"sweep file {path} not found") from None
    except (ValueError, ImportError) as e:
        raise SweepError(f"sweep file {path}: {e}") from None
    unknown = set(data) - {"sweep", "grid"}
    if unknown:
        raise SweepError(f"{path}: unknown table(s) {sorted(unknown)}; use [sweep] and [grid]")
    return data.get("sweep", {}), data.get("grid", {})


def parse_set(items: list[str]) -> dict:
    grid = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or key not in GRID_KEYS:
            raise SweepError(f"--set {item!r}: use KEY=V1,V2 with KEY one of "
                             f"{', '.join(GRID_KEYS)}")
        typ = GRID_KEYS[key]
        if key in ("slots", "dilation", "bucket_mb"):  # checked with the grid ("3+1"; "auto")
            grid[key] = [v for v in values.split(",") if v]
            continue
        try:
            grid[key] = [typ(v) for v in values.split(",") if v]
        except ValueError:
            raise SweepError(f"--set {key}: expected {typ.__name__} values, got {values!r}") \
                from None
    return grid


def _show(value) -> str:
    """A grid value as labels write it: per-node slots [3, 1] as ``3+1``."""
    return "+".join(map(str, value)) if isinstance(value, list) else str(value)


def repeat_id(pid: str, repeat: int) -> str:
    """The job id of ``repeat`` of the point ``pid``: the point's own id for repeat 0 (a
    sweep raised to more repeats keeps its first files), ``<pid>-r<repeat>`` after."""
    return pid if repeat == 0 else f"{pid}-r{repeat}"


def point_id(point: dict, sweep: Sweep) -> str:
    """Stable id of a point: the same parameters give the same id in every run."""
    what = {k: v for k, v in point.items() if k not in RUN_ONLY}
    key = json.dumps({"p": what, "program": sweep.program, "args": sweep.args,
                      "launcher": sweep.launcher}, sort_keys=True)
    label = point.get("name") or "-".join(
        f"{k}{_show(v)}" for k, v in point.items() if k in GRID_KEYS)
    label = label.replace("/", "_").replace(" ", "_")[:80]
    return f"{label}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"


def point_args(point: dict, sweep: Sweep) -> list[str]:
    """The program's flags at ``point``: the sweep's, the point's own, then its grid keys."""
    flags = [a for k, v in point.items() if k in PROGRAM_KEYS
             for a in ("--" + k.replace("_", "-"), str(v))]
    return [*sweep.args, *point.get("args", []), *flags]


def point_program(point: dict, sweep: Sweep, out: Path) -> list[str]:
    return commands.python_module(point.get("program", sweep.program),
                                  [*point_args(point, sweep), "--output", str(out)])


class _Clusters:
    """Keeps one emulated cluster up across consecutive points that share its shape."""

    def __init__(self) -> None:
        self.key = None
        self.stack = contextlib.ExitStack()
        self.spec = None
        self.link = None

    def get(self, slots: list[int], rate: str | None, dilation: float = 1.0):
        """The cluster with ``slots`` per node (a list, one per node), links at ``rate``, at
        time dilation ``dilation``."""
        key = (tuple(slots), rate, dilation)
        if key != self.key:
            self.close()
            self.spec = self.stack.enter_context(cluster(None, list(slots), rate,
                                                         name=CLUSTER_NAME, dilation=dilation))
            self.link = measure_link(self.spec) if len(slots) > 1 else None
            self.key = key
        return self.spec, self.link

    def close(self) -> None:
        self.stack.close()
        self.key = None

    def __enter__(self) -> _Clusters:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def launch_point(point: dict, sweep: Sweep, out: Path, clusters: _Clusters,
                 repeat: int = 0) -> list[str]:
    """The point's command. The machine's load and its running tasks are read here, just
    before the point runs (after its cluster's link test), and go to the ranks, so the
    records say how busy the machine was before this job loaded it (``commbench.cores``);
    read by rank 0 at start-up they would include the job's own start-up. ``repeat``
    (above 0) goes to the ranks as ``REPEAT_ENV``, which the records carry."""
    prog = point_program(point, sweep, out)
    layout = layout_of(point)
    extra = {REPEAT_ENV: str(repeat)} if repeat else {}
    if layout is not None:
        spec, link = clusters.get(layout, point.get("rate"), point.get("dilation", 1.0))
        np = point.get("ranks", spec.ranks)
        return launch_argv(spec, sweep.launcher, np, prog, link, load_average(),
                           runnable_tasks(), extra)
    if sweep.hosts:  # other machines: this one's load says nothing of theirs
        return commands.launcher_argv(sweep.launcher, point.get("ranks", 1), prog,
                                      hosts=sweep.hosts, env=extra or None)
    argv = commands.launcher_argv(sweep.launcher, point.get("ranks", 1), prog)
    load, runnable = load_average(), runnable_tasks()
    env = [f"{k}={v:g}" for k, v in ((LOADAVG_ENV, load), (RUNNABLE_ENV, runnable))
           if v is not None] + [f"{k}={v}" for k, v in extra.items()]
    return ["env", *env, *argv] if env else argv


def planned_command(point: dict, sweep: Sweep, out: Path) -> list[str]:
    """The command the sweep will run for ``point`` (on the emulated cluster it brings up
    for the point; nothing is made here): what ``--dry-run`` prints."""
    layout = layout_of(point)
    if layout is None:
        return launch_point(point, sweep, out, _Clusters())
    spec = ClusterSpec(nodes=None, slots=layout, rate_gbps=parse_rate(point.get("rate")),
                       name=CLUSTER_NAME, dilation=point.get("dilation", 1.0))
    return launch_argv(spec, sweep.launcher, point.get("ranks", spec.ranks),
                       point_program(point, sweep, out))


def _fmt_s(s: float) -> str:
    return f"{int(s // 60)}m{int(s % 60):02d}s" if s >= 60 else f"{s:.0f}s"


def _eta(todo: list[tuple[str, dict, int]], k: int, elapsed: float) -> float:
    """Seconds left after ``k`` of ``todo``: by the points' ``estimate_s`` where every point
    has one (scaled by how the finished ones compared), else by the mean so far."""
    est = [p.get("estimate_s") for _, p, _ in todo]
    if all(e for e in est):
        return sum(est[k:]) * elapsed / sum(est[:k])
    return elapsed / k * (len(todo) - k)


def run_sweep(sweep: Sweep, log=sys.stderr) -> dict[str, int]:
    outdir = Path(sweep.output)
    outdir.mkdir(parents=True, exist_ok=True)
    points = sweep.points()
    ids = [point_id(p, sweep) for p in points]
    jobs = sweep.jobs()
    write_atomic(outdir / "sweep.json", json.dumps(
        {"sweep": {k: v for k, v in vars(sweep).items() if k not in ("grid", "point_list")},
         "grid": sweep.grid,
         "points": [{"id": i, **p} for i, p in zip(ids, points)],
         "jobs": [{"id": i, "repeat": r} for i, _, r in jobs]}, indent=1))
    counts = {"done": 0, "failed": 0, "skipped": 0}
    todo = [j for j in jobs if not (outdir / f"{j[0]}.done.json").exists()]
    counts["skipped"] = len(jobs) - len(todo)
    what = "points" if len(jobs) == len(points) else "jobs"
    if counts["skipped"]:
        print(f"[sweep] {counts['skipped']} of {len(jobs)} {what} already done; skipping them",
              file=log, flush=True)
    clusters = _Clusters()
    t0 = time.time()
    try:
        for k, (pid, point, repeat) in enumerate(todo, 1):
            out = outdir / f"{pid}.jsonl"
            for stale in (out, outdir / f"{pid}.failed.json"):
                stale.unlink(missing_ok=True)  # interrupted or failed before: start clean
            label = point.get("name") or " ".join(f"{a}={_show(b)}" for a, b in point.items()
                                                  if a in GRID_KEYS)
            if point.get("repeats", sweep.repeats) > 1:
                label += f" repeat {repeat + 1}/{point.get('repeats', sweep.repeats)}"
            t = time.time()
            try:
                argv = launch_point(point, sweep, out, clusters, repeat)
                # deadlines are emulated: a dilated point runs K times longer on the wall
                res = run(argv, timeout=point.get("timeout", sweep.timeout)
                          * point.get("dilation", 1.0))
                ok = res.returncode == 0 and not res.timed_out
                info = {"id": pid, "point": point, "repeat": repeat, "argv": argv,
                        "returncode": res.returncode,
                        "dilation": point.get("dilation", 1.0),
                        "timed_out": res.timed_out, "seconds": time.time() - t}
                if not ok:
                    info["stderr_tail"] = res.stderr[-4000:]
                    info["stdout_tail"] = res.stdout[-2000:]
            except Exception as e:  # a point that cannot even start is a failed point
                ok = False
                info = {"id": pid, "point": point, "repeat": repeat,
                        "error": f"{type(e).__name__}: {e}",
                        "seconds": time.time() - t}
            marker = outdir / f"{pid}.{'done' if ok else 'failed'}.json"
            tmp = marker.with_suffix(".tmp")
            tmp.write_text(json.dumps(info, indent=1))
            tmp.replace(marker)
            counts["done" if ok else "failed"] += 1
            elapsed = time.time() - t0
            eta = _eta(todo, k, elapsed)
            status = "ok" if ok else ("TIMEOUT" if info.get("timed_out") else "FAILED")
            print(f"[sweep] {what[:-1]} {counts['skipped'] + k}/{len(jobs)} {label}: {status} "
                  f"{info['seconds']:.1f}s  elapsed {_fmt_s(elapsed)}  eta {_fmt_s(eta)}",
                  file=log, flush=True)
    finally:
        clusters.close()
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launch.sweep",
                                description="Run a grid of commbench jobs, resumably.")
    p.add_argument("file", nargs="?", help="sweep file (.toml or .json)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=V1,V2",
                   help="grid axis (adds to / overrides the file's grid)")
    p.add_argument("--launcher", choices=LAUNCHERS,
                   help="how each point's ranks start (default mpirun; torchrun: the torch "
                        "backend, one torchrun per emulated node)")
    p.add_argument("--program", help="module to run (default commbench.allreduce)")
    p.add_argument("--timeout", type=float, help="seconds per point")
    p.add_argument("-o", "--output", help="results directory")
    p.add_argument("--repeats", type=int, metavar="N",
                   help="run every point N times, each repeat a job of its own, shuffled "
                        "within each cluster (default 1; sweep.repeats in a file)")
    p.add_argument("--dilation", metavar="K", help="time dilation of every point's "
                   "emulated cluster (launch.cluster --dilation; the same as --set "
                   "dilation=K)")
    p.epilog = "Arguments after -- are passed to every point's program."
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    a = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    try:
        sweep_d, grid_d = load_file(a.file) if a.file else ({}, {})
        grid_d.update(parse_set(a.set))
        if a.dilation is not None:
            try:
                grid_d["dilation"] = [_grid_value("--dilation", "dilation", a.dilation)]
            except dil.DilationError as e:
                raise SweepError(str(e)) from None
        for k in ("launcher", "program", "timeout", "output", "repeats"):
            if getattr(a, k) is not None:
                sweep_d[k] = getattr(a, k)
        if extra:
            sweep_d["args"] = [*sweep_d.get("args", []), *extra]
        sweep = make_sweep(sweep_d, grid_d)
        if any("slots" in pt for pt in sweep.points()):
            try:
                check_machine()
            except ClusterError as e:
                raise SweepError(str(e)) from None
    except SweepError as e:
        print(f"launch.sweep: error: {e}", file=sys.stderr)
        return 2

    def body() -> int:
        counts = run_sweep(sweep)
        print(f"[sweep] {counts['done']} done, {counts['failed']} failed, "
              f"{counts['skipped']} skipped (already done); results in {sweep.output}",
              file=sys.stderr)
        return 1 if counts["failed"] else 0

    return interruptible(body, "launch.sweep")


if __name__ == "__main__":
    sys.exit(main())
