"""The advisor's validation grid judged from a results folder: its plan and its records only.

``experiments.grid`` writes the folder's plan (``grid-plan.json``: per cell the advisor's
ranking and pick, each job's roles, predictions and the signature its records carry) and
runs the jobs; this module reads the plan and the folder's summary records
(``analysis.load``: the dilation probes are left out) and judges each cell:

- **the pick**: the advisor's first scheme, and the job that ran it;
- **the measured best**: the job with the lowest median step among those measured in the
  cell: the best of what was measured (the reference set, three caps and the advisor's top
  3), not the best scheme there is; the table says so;
- **the pick's step / the best's**: the goal "within 5 %" is "pick <= 1.05 x every other
  job measured" (the same statement, since the best is the least of them), decided on the
  paired runs (``analysis.stats.decide``: each side in repeat order, a 95 % confidence
  sequence from 3 runs a side, at alpha / k over the k other jobs): met where every
  comparison holds, NOT met where one fails, else undecided;
- **predicted / measured**, the pick's step (goal: within +-5 %) and exposed sync (within
  +-15 %; where the measured exposed sync is under 5 % of the step, its sync share within
  2 points instead, issue 48's rule), the prediction the plan's, the measured figures the
  pick's runs: met where the ratio's interval lies inside the band, NOT met where it lies
  outside, undecided otherwise and always below 3 runs (the share's difference needs a
  95 % interval: 6 runs, ``analysis.stats.verdict``).

A run's verdict on the host is its set-up's (the runner's outcome rule, K against 2K,
``dilations.json``; ``analysis.load.mark_setup_verdicts``); where any of a cell's runs is
host-bound, or its K did not converge, the cell is not judged: every goal undecided, said
so, and no more runs are asked for it. Runs of one job that are not one set-up (another
revision or K) are not pooled (``experiments.bench.one_setup``): the largest set is
judged and the rest counted.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from analysis import sequential, stats
from analysis.load import LoadError, load
from commbench.hostload import is_link_bound
from commbench.results import write_atomic
from commbench.strategies import SYNC_FLAGS
from commbench.tables import Column, format_table
from experiments.bench import one_setup
from launch.cluster import ClusterError, parse_rate

PLAN_FILE = "grid-plan.json"
PLAN_SCHEMA = 1
TABLE_FILE = "grid.txt"
JSON_FILE = "grid.json"
DECIDE_FILE = "decide.json"  # what --decide did

#: the goals (issue 48): the pick's step within 5 % of the measured best; predicted /
#: measured within 5 % for step, 15 % for exposed sync, or 2 points of sync share where
#: the measured exposed sync is under 5 % of the step
PICK_GOAL = 1.05
STEP_BAND = 0.05
EXPOSED_BAND = 0.15
SHARE_POINTS = 0.02
SMALL_EXPOSED = 0.05
#: planned and measured alpha further apart than this factor get a note
ALPHA_NOTE_FACTOR = 2.0

MET, NOT_MET, UNDECIDED = "met", "NOT met", "undecided"
_WORDS = {stats.REPRODUCED: MET, stats.REFUTED: NOT_MET, stats.UNDECIDED: UNDECIDED}
GOALS = ("pick", "step", "exposed")


# --- the folder -------------------------------------------------------------------------

def signature(rec: dict) -> dict:
    """What identifies a run of a grid job among a folder's records: its cluster, its one
    run (strategy, algorithm), its configuration's workload and steps and every strategy
    flag. A planned job gives the same (``experiments.grid.planned_signature``)."""
    cfg = rec.get("config") or {}
    rate = rec.get("link_shaping")
    try:
        gbit = parse_rate(rate) if isinstance(rate, str) else None
    except ClusterError:
        gbit = None
    profile = cfg.get("compute_profile")
    return {"nodes": rec.get("nodes"), "local_size": rec.get("local_size"), "gbit": gbit,
            "strategy": rec.get("strategy"), "algo": rec.get("algo"),
            "model": cfg.get("model"), "batch_size": cfg.get("batch_size"),
            "compute_profile": Path(profile).name if profile else None,
            "compute_scale": cfg.get("compute_scale"), "steps": cfg.get("steps"),
            "warmup": cfg.get("warmup"), **{k: cfg.get(k) for k in SYNC_FLAGS}}


def _same(a: object, b: object) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) \
            and not isinstance(a, bool) and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=1e-9)
    return a == b


def same_signature(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)


def read_plan(folder: Path) -> dict:
    """The folder's plan; ValueError naming ``-o/--output`` where it is missing or bad."""
    path = Path(folder) / PLAN_FILE
    try:
        doc = json.loads(path.read_text())
    except OSError:
        raise ValueError(f"-o/--output: {folder} holds no {PLAN_FILE}: not a grid's "
                         "folder") from None
    except ValueError as e:
        raise ValueError(f"-o/--output: {path} is not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("schema") != PLAN_SCHEMA \
            or not isinstance(doc.get("cells"), dict):
        raise ValueError(f"-o/--output: {path} is not a grid plan of schema {PLAN_SCHEMA}")
    return doc


def summaries(folder: Path) -> list[dict]:
    """The folder's summary records (the dilation probes left out), each with its set-up's
    verdict where the runner chose its K; none where the folder holds no records yet, and
    ValueError naming ``-o/--output`` where a file is not records."""
    try:
        return [r for r in load([folder]).records if r.get("kind") == "summary"]
    except LoadError as e:
        if "no *.jsonl" in str(e) or "no complete records" in str(e):
            return []  # nothing has run yet
        raise ValueError(f"-o/--output: {e}") from None


# --- one cell ----------------------------------------------------------------------------

@dataclass
class Figure:
    """One judged figure: its point value, the words of its interval (or range, with the
    runs a side), and the goal's verdict."""

    value: float | None
    words: str
    verdict: str | None  # met, NOT met, undecided; None: nothing to judge


@dataclass
class CellVerdict:
    cell: str
    held_out: bool
    pick: str  # the advisor's first scheme
    pick_job: str
    best_job: str | None
    runs: dict[str, int]  # job id -> runs judged
    figures: dict[str, Figure]  # GOALS -> the figure
    jobs: list[dict]  # per job: id, roles, runs, medians, predictions
    dilation: list[float]
    alpha_planned_us: float | None
    alpha_measured_us: float | None
    notes: list[str] = field(default_factory=list)
    wants: dict[str, int] = field(default_factory=dict)  # job name -> runs wanted


def _values(runs: Sequence[dict], key: str) -> list[float]:
    return [float(r[key]) if isinstance(r.get(key), (int, float)) else math.nan for r in runs]


def _median(xs: Sequence[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return float(statistics.median(xs)) if xs else math.nan


def _decide(num: Sequence[float], den: Sequence[float], threshold: float, holds_below: bool,
            k: int = 1) -> sequential.Decision | None:
    try:
        return stats.decide(num, den, threshold, holds_below, k)
    except ValueError:  # a figure of 0 has no log-ratio
        return None


def _next_look(d: sequential.Decision) -> int:
    return d.runs + d.wants if d.verdict == stats.UNDECIDED and d.wants else 0


def pick_figure(pick: str, steps: dict[str, list[float]]) -> tuple[Figure, dict[str, int]]:
    """The pick's step / the measured best's, and the goal's verdict: pick <= ``PICK_GOAL``
    x each other job's step, each decided at alpha / k (k: the other jobs); and the runs a
    side each undecided comparison wants (job id -> runs)."""
    others = [j for j in steps if j != pick]
    if not others:
        return Figure(None, "nothing else measured", UNDECIDED), {}
    best = min(others, key=lambda j: _median(steps[j]))
    decisions = {o: _decide(steps[pick], steps[o], PICK_GOAL, True, len(others))
                 for o in others}
    verdicts = [d.verdict if d else stats.UNDECIDED for d in decisions.values()]
    verdict = (NOT_MET if stats.REFUTED in verdicts else
               MET if all(v == stats.REPRODUCED for v in verdicts) else UNDECIDED)
    wants: dict[str, int] = {}
    for o, d in decisions.items():
        if d is not None and _next_look(d):
            for j in (pick, o):
                wants[j] = max(wants.get(j, 0), _next_look(d))
    d = decisions[best]
    if _median(steps[pick]) <= _median(steps[best]):
        words = "1 (the pick measured fastest; / the next best, " + (
            d.words(".3f") if d else "no ratio") + ")"
        return Figure(1.0, words, verdict), wants
    if d is None:
        return Figure(None, "no ratio (a step of 0)", UNDECIDED), wants
    return Figure(d.value, d.words(".3f"), verdict), wants


def band_figure(predicted: float, measured: Sequence[float], band: float
                ) -> tuple[Figure, int]:
    """predicted / measured against 1 +- ``band``: the interval of the paired ratios
    (``stats.decide`` on each edge); and the runs the next look wants (0: none)."""
    preds = [predicted] * len(measured)
    hi = _decide(preds, measured, 1 + band, True)
    lo = _decide(preds, measured, 1 - band, False)
    if hi is None or lo is None:
        return Figure(None, "no ratio (a figure of 0)", UNDECIDED), 0
    states = (hi.verdict, lo.verdict)
    verdict = (MET if states == (stats.REPRODUCED, stats.REPRODUCED) else
               NOT_MET if stats.REFUTED in states else UNDECIDED)
    shown = lo if lo.verdict == stats.REFUTED else hi
    want = 0 if verdict != UNDECIDED else max(_next_look(hi), _next_look(lo))
    return Figure(shown.value, shown.words(".3f"), verdict), want


def share_figure(predicted_share: float, shares: Sequence[float]) -> tuple[Figure, int]:
    """Predicted - measured sync share against +-``SHARE_POINTS`` (where exposed sync is
    too small for a ratio): the spread of the difference (``stats.diff_spread``), judged
    only on a 95 % interval (``stats.verdict``: 6 runs); and the runs wanted."""
    sp = stats.diff_spread([predicted_share] * len(shares), shares)
    states = (stats.verdict(sp, SHARE_POINTS, True), stats.verdict(sp, -SHARE_POINTS, False))
    verdict = (MET if states == (stats.REPRODUCED, stats.REPRODUCED) else
               NOT_MET if stats.REFUTED in states else UNDECIDED)
    n = sp.n
    words = f"{sp.value * 100:+.1f} points of sync share"
    if sp.kind == stats.SINGLE:
        words += " (one run)"
    elif sp.kind != stats.NONE:
        words += (f" ({sp.kind} {sp.lo * 100:+.1f} to {sp.hi * 100:+.1f}"
                  + (f", n={n})" if sp.kind != stats.RANGE else f" over {n} runs)"))
    want = 0
    if verdict == UNDECIDED:
        want = max(stats.MIN_CI_SAMPLES, min(sequential.MAX_RUNS, n + 1))
        want = 0 if n >= sequential.MAX_RUNS else want
    return Figure(sp.value, words + " (exposed sync under "
                  f"{SMALL_EXPOSED * 100:.0f} % of the step: judged on its share)", verdict), want


def judge_cell(cell: str, plan: dict, records: Sequence[dict]) -> CellVerdict:
    """One cell of the plan judged on the records of its jobs (module docstring)."""
    notes: list[str] = []
    runs: dict[str, list[dict]] = {}
    names = {j["id"]: j["name"] for j in plan["jobs"]}
    for j in plan["jobs"]:
        mine = [r for r in records if same_signature(j["signature"], signature(r))]
        pooled, left = one_setup(mine)
        if left:
            notes.append(f"{j['id']}: {left} of {len(mine)} runs left out (another revision, "
                         "dilation or set-up than the rest; not pooled)")
        runs[j["id"]] = sorted(pooled, key=lambda r: r.get("repeat") or 0)
    pick = plan["pick"]
    pick_job = next(j for j in plan["jobs"]
                    if any(r["what"] == "advisor #1" for r in j["roles"]))
    pick_role = next(r for r in pick_job["roles"] if r["what"] == "advisor #1")
    if pick_role.get("note"):
        notes.append(f"the pick, {pick}: {pick_role['note']}")
    measured = {jid: rs for jid, rs in runs.items() if rs}
    every = [r for rs in measured.values() for r in rs]
    ks = sorted({float(r.get("dilation") or 1.0) for r in every})
    alphas = [float(r["alpha_us"]) for r in every if isinstance(r.get("alpha_us"), (int, float))]
    alpha = _median(alphas) if alphas else None
    planned_alpha = plan.get("alpha_us")
    if alpha and planned_alpha and not (1 / ALPHA_NOTE_FACTOR <= alpha / planned_alpha
                                        <= ALPHA_NOTE_FACTOR):
        notes.append(f"the plan priced alpha at {planned_alpha:.3g} us, the runs measured "
                     f"{alpha:.3g} us: the top {len(plan['top'])} were chosen at another "
                     "network's per-message cost")
    jobs = []
    for j in plan["jobs"]:
        rs = runs[j["id"]]
        p = j.get("predicted") or {}
        step, exposed = _median(_values(rs, "step_s")), _median(_values(rs, "exposed_sync_s"))
        jobs.append({"id": j["id"], "name": j["name"], "run": j["run"],
                     "notes": [r["note"] for r in j["roles"] if r.get("note")],
                     "roles": [r["what"] for r in j["roles"]], "runs": len(rs),
                     "step_s": step, "exposed_s": exposed, "predicted_step_s": p.get("step_s"),
                     "predicted_exposed_s": p.get("exposed_s"),
                     "bound": _bound_words(rs)})
    base = dict(cell=cell, held_out=bool(plan.get("held_out")), pick=pick,
                pick_job=pick_job["id"], runs={k: len(v) for k, v in measured.items()},
                jobs=jobs, dilation=ks, alpha_planned_us=planned_alpha,
                alpha_measured_us=alpha, notes=notes)
    if pick_job["id"] not in measured:
        why = "the pick's job has no runs (not run yet, or it failed)" if measured else \
            "no runs yet"
        return CellVerdict(best_job=None, figures={g: Figure(None, why, None) for g in GOALS},
                           **base)
    steps = {jid: _values(rs, "step_s") for jid, rs in measured.items()}
    best = min(steps, key=lambda j: _median(steps[j]))
    pick_fig, wants = pick_figure(pick_job["id"], steps)
    pred = pick_role["predicted"]
    mine = measured[pick_job["id"]]
    step_fig, step_want = band_figure(pred["step_s"], steps[pick_job["id"]], STEP_BAND)
    exposed = _values(mine, "exposed_sync_s")
    small = _median(exposed) < SMALL_EXPOSED * _median(steps[pick_job["id"]]) \
        or any(not x > 0 for x in exposed)
    if small:
        shares = [e / s if s > 0 else math.nan for e, s in zip(exposed, steps[pick_job["id"]])]
        pred_share = pred["exposed_s"] / pred["step_s"] if pred["step_s"] > 0 else math.nan
        exp_fig, exp_want = share_figure(pred_share, shares)
    else:
        exp_fig, exp_want = band_figure(pred["exposed_s"], exposed, EXPOSED_BAND)
    for w in (step_want, exp_want):
        if w:
            wants[pick_job["id"]] = max(wants.get(pick_job["id"], 0), w)
    figures = {"pick": pick_fig, "step": step_fig, "exposed": exp_fig}
    host = [r for r in every if is_link_bound(r) is False]
    if host:  # this machine, not the schemes: neither met nor NOT met, and no more runs
        why = sorted({str(r.get("setup_bound") or r.get("bound")).split(" (")[0]
                      for r in host})
        notes.insert(0, f"{len(host)} of {len(every)} runs host-bound or not converged "
                        f"({', '.join(why)}): not judged")
        for f in figures.values():
            f.verdict = UNDECIDED
        wants = {}
    lat = [r for r in every if r.get("latency_bound")]
    if lat:
        notes.append(f"{len(lat)} of {len(every)} runs latency-bound (their calls x the "
                     "emulated alpha are half their comm time or more: the host's "
                     "per-message latency / K, not converged by dilation alone)")
    return CellVerdict(best_job=best, figures=figures,
                       wants={names[j]: n for j, n in wants.items()}, **base)


def _bound_words(rs: Sequence[dict]) -> str:
    """The runs' verdicts on the host, ``*`` where it is their set-up's (outcome rule)."""
    words = sorted({(r.get("setup_bound") and r["setup_bound"].split(" (")[0] + "*")
                    or (r.get("bound") or "").split(" (")[0] for r in rs} - {""})
    return ",".join(words) or "n/a"


# --- the folder's verdicts ----------------------------------------------------------------

def judge(folder: Path) -> list[CellVerdict]:
    """Every cell of the folder's plan judged on the folder's records."""
    plan = read_plan(folder)
    recs = summaries(Path(folder))
    return [judge_cell(cell, cp, recs) for cell, cp in plan["cells"].items()]


def wanted(folder: Path, names: set[str] | None = None) -> dict[str, int]:
    """For ``--decide``: the runs a side each job of an undecided cell wants at its next
    look (job name -> runs), among ``names`` where given."""
    out: dict[str, int] = {}
    for v in judge(folder):
        for name, n in v.wants.items():
            if names is None or name in names:
                out[name] = max(out.get(name, 0), n)
    return out


TABLE = [Column("cell", "", 22), Column("K", "", 5), Column("pick", "", 26),
         Column("measured best", "", 26), Column("pick/best", "step", 9, ".3f"),
         Column("", "", 9), Column("pred/meas", "step", 9, ".3f"), Column("", "", 9),
         Column("pred/meas", "exposed", 9, ".3f"), Column("", "", 9), Column("runs", "", 9)]
JOBS = [Column("cell", "", 22), Column("job", "", 14), Column("runs", "", 4),
        Column("step", "ms", 9, ".1f"), Column("pred", "ms", 9, ".1f"),
        Column("p/m", "step", 6, ".3f"), Column("exposed", "ms", 9, ".1f"),
        Column("pred", "ms", 9, ".1f"), Column("p/m", "exposed", 7, ".3f"),
        Column("bound", "", 12), Column("stands for", "", 0)]


def _ms(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else x * 1e3


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b and not math.isnan(b) else None


def _tally(verdicts: Sequence[CellVerdict], goal: str) -> str:
    n = {w: sum(1 for v in verdicts if v.figures[goal].verdict == w)
         for w in (MET, UNDECIDED, NOT_MET)}
    none = sum(1 for v in verdicts if v.figures[goal].verdict is None)
    return (f"{n[MET]} met, {n[UNDECIDED]} undecided, {n[NOT_MET]} NOT met"
            + (f", {none} not run" if none else ""))


def _median_error(verdicts: Sequence[CellVerdict], goal: str) -> str:
    errs = [abs(v.figures[goal].value - 1) for v in verdicts
            if v.figures[goal].value is not None and "share" not in v.figures[goal].words]
    if not errs:
        return "n/a"
    return f"{statistics.median(errs) * 100:.1f} % over {len(errs)} cells"


def render(verdicts: Sequence[CellVerdict], folder: Path) -> str:
    """The cells' table, each cell's figures in words, the jobs' table and the tallies."""
    rows, lines, job_rows = [], [], []
    for v in verdicts:
        f = v.figures
        k = ",".join(f"{x:g}" for x in v.dilation) or "-"
        runs = f"{v.runs.get(v.pick_job, 0)}/{v.runs.get(v.best_job, 0) if v.best_job else 0}"
        rows.append([v.cell, k, v.pick, v.best_job or "-", f["pick"].value,
                     f["pick"].verdict or "-", f["step"].value, f["step"].verdict or "-",
                     None if "share" in f["exposed"].words else f["exposed"].value,
                     f["exposed"].verdict or "-", runs])
        alpha = (f"alpha planned {v.alpha_planned_us:.3g} us" if v.alpha_planned_us else "")
        if v.alpha_measured_us:
            alpha += f", measured {v.alpha_measured_us:.3g} us"
        lines.append(f"{v.cell}{' (held out)' if v.held_out else ''}: pick {v.pick} (job "
                     f"{v.pick_job}, {v.runs.get(v.pick_job, 0)} runs) / measured best "
                     f"{v.best_job or '-'} ({v.runs.get(v.best_job, 0) if v.best_job else 0} "
                     f"runs): {f['pick'].words} [{f['pick'].verdict or '-'}]; predicted / "
                     f"measured step {f['step'].words} [{f['step'].verdict or '-'}], exposed "
                     f"sync {f['exposed'].words} [{f['exposed'].verdict or '-'}]; {alpha}")
        lines += [f"  {n}" for n in v.notes]
        for j in v.jobs:
            job_rows.append([v.cell, j["id"], j["runs"], _ms(j["step_s"]),
                             _ms(j["predicted_step_s"]), _ratio(j["predicted_step_s"],
                                                                j["step_s"]),
                             _ms(j["exposed_s"]), _ms(j["predicted_exposed_s"]),
                             _ratio(j["predicted_exposed_s"], j["exposed_s"]), j["bound"],
                             ", ".join(j["roles"]) + (f" ({j['run']})")])
    held = sum(1 for v in verdicts if v.held_out)
    which = (f"{held} held-out cells: the held-out check" if held == len(verdicts) else
             f"{len(verdicts) - held} tuning cells"
             + (f" and {held} held-out" if held else "") + ": not the held-out check")
    tallies = [
        f"{len(verdicts)} cells judged ({which})",
        f"pick within {(PICK_GOAL - 1) * 100:.0f} % of the measured best: "
        f"{_tally(verdicts, 'pick')} (goal: met in >= 90 % of the held-out cells)",
        f"predicted / measured step within +-{STEP_BAND * 100:.0f} %: {_tally(verdicts, 'step')}; "
        f"median |pred / meas - 1| {_median_error(verdicts, 'step')} (goal <= 5 %)",
        f"predicted / measured exposed sync within +-{EXPOSED_BAND * 100:.0f} % (or +-"
        f"{SHARE_POINTS * 100:g} points of share): {_tally(verdicts, 'exposed')}; median "
        f"|pred / meas - 1| {_median_error(verdicts, 'exposed')} (goal <= 15 %)"]
    cells = format_table(TABLE, rows, title=f"advisor validation grid, {folder}", footer=[
        "pick: the advisor's first scheme; measured best: the best of what was measured in "
        "the cell (the reference set, the caps and the advisor's top 3), not the best scheme "
        "there is; ratios: geometric mean of the paired runs (repeat order), verdicts by "
        "analysis.sequential (95 % confidence sequence, 3 to 12 runs a side; undecided "
        "below 3); runs: the pick's / the best's; K: the runs' dilation",
        *lines, *tallies])
    per_job = format_table(JOBS, job_rows, title="every job (medians over its runs; pred: the "
                           "plan's prediction of the scheme it stands for, first priced role)")
    return cells + "\n\n" + per_job


def report(folder: Path) -> int:
    """Judge ``folder``, print the tables, and write them to ``TABLE_FILE`` and the figures
    to ``JSON_FILE`` there. Returns 0."""
    folder = Path(folder)
    verdicts = judge(folder)
    text = render(verdicts, folder)
    print(text, flush=True)
    write_atomic(folder / TABLE_FILE, text + "\n")
    write_atomic(folder / JSON_FILE, json.dumps(
        {"goals": {"pick": PICK_GOAL, "step_band": STEP_BAND, "exposed_band": EXPOSED_BAND,
                   "share_points": SHARE_POINTS, "small_exposed": SMALL_EXPOSED},
         "cells": [_clean(asdict(v)) for v in verdicts]}, indent=1))
    return 0


def _clean(x):
    """NaN as null (JSON has no NaN)."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x
