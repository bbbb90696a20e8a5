"""A run's per-step phases on every rank as a Chrome trace (Perfetto, chrome://tracing).

    mpirun -np 4 python -m commbench.allreduce --strategy bucketed --timeline -o run.jsonl
    python -m analysis.timeline run.jsonl -o run.trace.json     # open in ui.perfetto.dev

Workers started with ``--timeline`` write one ``kind: "trace"`` record per
run, after it: for every rank and step, the barrier wait before the step,
the compute phases (forward, backward, optimizer) and each collective's
start, end and bytes. Here every run becomes a group of processes, one per
rank, with threads ``step`` (the barrier wait, then the step), ``compute``
and ``comm 0``, ``comm 1``, ... (collectives in flight at the same time go to
separate lanes), like Horovod's timeline.

Each rank's times count from its own first step start (they leave the same
barrier together), so ranks line up to within that barrier's exit skew; no
two ranks' clocks are subtracted. Runs are laid one after another.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from analysis.cli import UsageError, entry, parser, warn, writing
from analysis.load import load

PROG = "analysis.timeline"
US = 1e6  # trace times are in microseconds
GAP_S = 0.05  # space between two runs on the time axis


def _lanes(intervals: list[list]) -> list[int]:
    """Lane per interval so intervals of one lane never overlap (first free lane)."""
    ends: list[float] = []
    lanes = [0] * len(intervals)
    for i in sorted(range(len(intervals)), key=lambda k: intervals[k][0]):
        start, end = intervals[i][0], intervals[i][1]
        for lane, last in enumerate(ends):
            if last <= start:
                ends[lane], lanes[i] = end, lane
                break
        else:
            ends.append(end)
            lanes[i] = len(ends) - 1
    return lanes


def run_label(rec: dict) -> str:
    algo = f"/{rec['algo']}" if rec.get("algo") else ""
    return f"{rec.get('strategy', '?')}{algo} np{rec.get('world_size', '?')}"


def trace_events(records: list[dict]) -> list[dict]:
    """Chrome trace events ("X" complete events plus names) of ``trace`` records."""
    events: list[dict] = []
    offset = 0.0
    pid = 0
    for rec in records:
        label = run_label(rec)
        firsts = [(s.get("wait") or [s["start"]])[0] for steps in rec.get("ranks") or []
                  for s in steps[:1]]
        offset -= min(firsts, default=0.0)  # the first barrier wait starts at the run's start
        run_end = 0.0
        for rank, steps in enumerate(rec.get("ranks") or []):
            if not steps:
                continue
            pid += 1
            events.append({"ph": "M", "name": "process_name", "pid": pid,
                           "args": {"name": f"{label} ({rec.get('run_id')}) rank {rank}"}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid,
                           "args": {"sort_index": pid}})
            threads = {"step": 0, "compute": 1}

            def x(name: str, tid_name: str, start: float, end: float, args: dict,
                  _pid: int = pid, _threads: dict = threads, _offset: float = offset) -> None:
                tid = _threads.setdefault(tid_name, len(_threads))
                events.append({"ph": "X", "name": name, "cat": tid_name.split()[0],
                               "pid": _pid, "tid": tid, "ts": (_offset + start) * US,
                               "dur": max(0.0, end - start) * US, "args": args})

            for s in steps:
                k = s.get("step")
                w0, w1 = s.get("wait") or (s["start"], s["start"])
                x("barrier wait", "step", w0, w1, {"step": k})
                if s.get("end") is not None:
                    x(f"step {k}" + (" (warm-up)" if s.get("warmup") else ""), "step",
                      s["start"], s["end"], {"step": k, "warmup": s.get("warmup")})
                    run_end = max(run_end, s["end"])
                for phase, start, end in s.get("phases") or []:
                    x(phase, "compute", start, end, {"step": k})
                comm = s.get("comm") or []
                for (start, end, nbytes), lane in zip(comm, _lanes(comm)):
                    x("allreduce", f"comm {lane}", start, end, {"step": k, "bytes": nbytes})
                for phase, start, end in s.get("comm_phases") or []:
                    x(phase, "all-reduce phases", start, end, {"step": k})
            for name, tid in threads.items():
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                               "args": {"name": name}})
        offset += run_end + GAP_S
    return events


def body(argv: list[str]) -> int:
    p = parser(PROG, "Write the per-rank step phases of runs recorded with --timeline as a "
                     "Chrome trace JSON (open it in ui.perfetto.dev or chrome://tracing).")
    p.add_argument("paths", nargs="+", help="result files or directories")
    p.add_argument("-o", "--output", required=True, help="trace JSON file to write")
    p.add_argument("--run", metavar="RUN_ID", action="append",
                   help="only this run (its run_id); repeatable")
    args = p.parse_args(argv)
    loaded = load(args.paths)
    warn(PROG, loaded.warnings)
    traces = loaded.of_kind("trace")
    if args.run:
        traces = [r for r in traces if r.get("run_id") in args.run]
    if not traces:
        raise UsageError("no trace records in the input (run commbench.allreduce with "
                         "--timeline)" + (f" for run {', '.join(args.run)}" if args.run else ""))
    out = Path(args.output)
    if out.is_dir():
        raise UsageError(f"-o/--output: {out} is a directory")
    events = trace_events(traces)
    with writing(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}),
                       encoding="utf-8")
    print(f"{len(traces)} run(s), {len(events)} events -> {out}", file=sys.stderr)
    return 0


main = entry(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
