"""One Markdown page: the figures, the cost model, and the seed claims C1-C8 checked.

    python -m analysis.report results/ -o report/       # report/README.md + report/figures/

The page flags the runs that started on a busy machine (``analysis.load``),
gives the runs' time dilation and host verdicts (``commbench.hostload``: was a
figure the links', or this machine's), then holds every figure
``analysis.plot`` can draw from the results (and says which it skipped), the
fitted cost model with its prediction errors and its extrapolation (when
microbenchmark records are present), and a table of the seed claims
(docs/claims.md): what was measured here, what the model predicts at the
claim's scale, and a verdict with its reason; every matched set a claim names
is shown with its dilation and host verdict (``match.host_words``).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from analysis import advise, match, overlap, sharded, straggler
from analysis import costmodel as cost
from analysis.alphabeta import (
    LATENCY_FLAG,
    ModelError,
    a100_scenario,
    emulated_alpha_us,
    latency_us,
)
from analysis.claims import check_all
from analysis.cli import UsageError, entry, output_dir, parser, warn
from analysis.costmodel import add_native_is, parse_native_is
from analysis.figures import FIGURES, save
from analysis.load import busy_runs, load, mark_machine_load
from analysis.plot import build as build_figures
from commbench.cores import BUSY_LOAD_FRACTION
from commbench.hostload import is_link_bound

PROG = "analysis.report"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def machine_load_lines(records: list[dict]) -> list[str]:
    """The report's flag for runs that started on a busy machine (``analysis.load``)."""
    mark_machine_load(records)  # done by load(); again for records from elsewhere
    runs = {(r.get("_file"), r.get("run_id")) for r in records if r.get("kind") != "job_end"}
    with_load = {(r.get("_file"), r.get("run_id")) for r in records
                 if r.get("kind") != "job_end" and r.get("started_busy") is not None}
    busy = busy_runs(records)
    lines = ["## Machine load", ""]
    if not with_load:
        return [*lines, "No run records the machine's load (records written before "
                "`loadavg_start` was kept).", ""]
    rule = (f"tasks running or runnable just before the job above {BUSY_LOAD_FRACTION:g} × "
            "the cores, where the launcher counted them; else the 1-minute load average "
            "as it started, which still holds a job that ended up to a minute before")
    if not busy:
        missing = len(runs) - len(with_load)
        return [*lines, f"No run started on a busy machine ({rule}) among the "
                f"{len(with_load)} runs that record it"
                + (f"; {missing} {'run records' if missing == 1 else 'runs record'} no load"
                   if missing else "") + ".", ""]
    lines += [f"**{len(busy)} of {len(with_load)} runs started on a busy machine** ({rule}: "
              "others were running, so their compute and timings are not their own; "
              "rerun them on an idle machine before comparing):", "",
              "| file | run | strategy | ranks | runnable at start | load at start | cores | "
              "load at end | torch threads/rank | thread rule |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in busy:
        end = r.get("loadavg_end")
        lines.append(f"| `{_cell(r.get('_file'))}` | {_cell(r.get('run_id'))} | "
                     f"{_cell(r.get('strategy') or r.get('kind'))} | {r.get('world_size')} | "
                     f"{_num(r.get('runnable_start'))} | {_num(r.get('loadavg_start'))} | "
                     f"{r.get('cores')} | "
                     f"{'n/a' if end is None else f'{end:.2f}'} | {r.get('torch_threads')} | "
                     f"{_cell(r.get('thread_rule'))} |")
    return [*lines, ""]


def host_load_lines(records: list[dict]) -> list[str]:
    """The runs' time dilation and host verdicts (``commbench.hostload``): rows per dilation
    and verdict, then every host-bound row with its reason."""
    rows = [r for r in records if r.get("kind") in ("summary", "microbench")]
    lines = ["## Host load", "",
             "Summaries and microbenchmark rows of schema 4 carry their time dilation K "
             "(durations are emulated: wall ÷ K) and a verdict over their measured steps: "
             "link-bound, or host-bound with the reason (`commbench.hostload`). Claims that "
             "compare comm times prefer matched sets whose runs were all link-bound. From "
             "schema 5 each job also measured the per-message latency between its nodes "
             "through its own library (an 8-byte all-reduce among one rank per node, "
             "`commbench.latency`): on the emulated cluster the host's own, about 1/K of it "
             "at dilation K; a row is latency-bound where its calls x alpha are at least "
             "half of its comm time, and such a figure is not shown converged by dilation "
             "alone.", ""]
    if not rows:
        return [*lines, "No summaries or microbenchmark rows.", ""]
    lines += ["| dilation | rows | " + " | ".join(match.VERDICT_WORDS.values())
              + " | alpha between nodes (us, median) | latency-bound |",
              "|---:|---:|---:|---:|---:|---:|---:|"]
    for k in sorted({match.dilation(r) for r in rows}):
        here = [r for r in rows if match.dilation(r) == k]
        at = [is_link_bound(r) for r in here]
        lines.append(f"| {k:g} | {len(at)} | " + " | ".join(
            str(sum(v is j for v in at)) for j in match.VERDICT_WORDS)
            + f" | {alpha_words(here)} | {sum(bool(r.get('latency_bound')) for r in here)} |")
    host = [r for r in rows if is_link_bound(r) is False]
    if host:
        lines += ["", f"**{len(host)} host-bound rows**: their figures hold this machine's "
                  "scheduling as well as the links; across nodes, rerun them with `--dilation` "
                  "(`launch.cluster`, `launch.sweep`).", "",
                  "| file | run | what | dilation | why |", "|---|---|---|---:|---|"]
        lines += [f"| `{_cell(r.get('_file'))}` | {_cell(r.get('run_id'))} | "
                  f"{_cell(match.run_label(r))} | {match.dilation(r):g} | "
                  f"{_cell(match.host_why(r))} |" for r in host]
    return [*lines, ""]


def alpha_words(rows: list[dict]) -> str:
    """The measured per-message latency between nodes of ``rows`` (``commbench.latency``):
    the median of their ``alpha_us``; "alpha not recorded" where runs across nodes carry
    none (records before schema 5); "one node" where none ran across nodes."""
    across = [r for r in rows if (r.get("nodes") or 1) > 1]
    if not across:
        return "one node"
    alphas = sorted(r["alpha_us"] for r in across if r.get("alpha_us") is not None)
    if not alphas:
        return "alpha not recorded"
    words = f"{statistics.median(alphas):.1f}"
    missing = len(across) - len(alphas)
    return words + (f" ({missing} of {len(across)} rows: alpha not recorded)" if missing else "")


def claim_runs_lines(claims: list) -> list[str]:
    """Per claim: the set-up its verdict comes from with its dilation and host verdict, the
    runs behind each figure, and the figures of the other matched set-ups."""
    lines = ["### Runs behind each claim", ""]
    for c in claims:
        if not c.runs and not c.others:
            lines.append(f"- **{c.id}**: no runs behind a figure ({c.verdict})")
            continue
        where = "; ".join(x for x in (c.setup and f"set-up: {c.setup}",
                                      c.host and f"host: {c.host}") if x)
        lines.append(f"- **{c.id}**" + (f" — {where}" if where else ""))
        lines += [f"  - {label}: " + ", ".join(f"`{i}`" for i in ids)
                  for label, ids in c.runs.items()]
        if c.others:
            lines.append("  - other matched set-ups (not the verdict's):")
            lines += [f"    - {o}" for o in c.others]
    return [*lines, ""]


#: an implementation this far above its link bound is not described by its algorithm's bytes
BOUND_FAR = 1.3


def model_error_lines(res) -> list[str]:
    """The fitted model's error on this folder's own microbenchmarks: per algorithm and
    link level, messages of at least 1 MiB, points it was not fitted on."""
    head = ["### The model's error on these runs", "",
            "Median |predicted ÷ measured − 1| per measured algorithm for messages ≥ 1 MiB, "
            "on the microbenchmark points the fit did not use (goal ≤ "
            f"{cost.ERROR_GOAL:.0%} on the emulated cluster).", ""]
    if res is None:
        return [*head, "No fitted model: no microbenchmark records.", ""]
    rows = cost.error_by_algorithm(res.held_points, res.params)
    if not rows:
        return [*head, "No held-out microbenchmark points of 1 MiB or more.", ""]
    bound = cost.bound_by_algorithm(res.held_points)
    lines = [*head, "| algorithm | level | points | median error | goal met | "
             "measured ÷ link bound |", "|---|---|---:|---:|---|---:|"]
    lines += [f"| {a} | {lv} | {n} | {e:.1%} | {'yes' if e <= cost.ERROR_GOAL else 'no'} | "
              + (f"{bound[a]:.2f}x |" if lv == "inter" and a in bound else "— |")
              for a, lv, n, e in rows]
    far = [a for a, r in bound.items() if r > BOUND_FAR]
    if far:
        lines += ["", "Measured ÷ link bound: the busiest link's bytes at its measured rate, "
                  "median over the same points. " + ", ".join(far) + f" ran above {BOUND_FAR:g}x "
                  "its algorithm's bound: the implementation costs more than its bytes, which "
                  "the model prices, so the model's error there is the implementation's, not "
                  "the algorithm's."]
    return [*lines, ""]


def overlap_lines(records: list[dict], res) -> list[str]:
    """The overlap model: its extrapolation on the one device scenario, its check against
    the bucketed runs of the folder (with the fitted parameters), and ``--bucket-mb
    auto``'s own predictions against the runs that made them (no fit needed)."""
    lines = ["## Overlap model (bucketed sync during backward)", "",
             "Buckets formed as the bucketed strategy forms them, each started when its last "
             "gradient is ready (the compute profile's ready times), served by the transfer "
             "engine one at a time in order, each all-reduce priced on the path it ran "
             "(`analysis/overlap.py`). Scaling efficiency = compute / step.", ""]
    auto = ["```", *overlap.auto_lines(*overlap.auto_checks(records)), "```", ""]
    try:
        dev = overlap.h200()
    except overlap.ModelError as e:
        return [*lines, f"No device scenario: {e}.", "", *auto]
    lines += ["```", *overlap.extrapolation_lines(dev), "```", ""]
    if res is None:
        return [*lines, "Not checked against measured bucketed runs: the model is not fitted "
                "(no microbenchmark records).", "", *auto]
    checks, skipped = overlap.check_runs(records, res.params)
    return [*lines, "```", *overlap.check_lines(checks, skipped), "```", "", *auto]


#: the unit-timed profile whose shape the sharded extrapolation borrows (the H200 one
#: times no forward unit)
UNIT_PROFILE = "cpu-resnet50-b8.json"
SHARDED_RATE = 100.0  # Gbit/s per node for the sharded extrapolation


def sharded_extrapolation_lines() -> list[str]:
    """DDP-style buckets, ZeRO-2, HSDP and ZeRO-3 predicted at 8...1024 ranks on the device
    scenario's node (``analysis.advise``'s schemes): each one's sync share."""
    try:
        dev = overlap.h200()
        shape = overlap.load_profile(match.PROFILES / UNIT_PROFILE)
    except overlap.ModelError as e:
        return [f"No sharded extrapolation: {e}.", ""]
    prof = shape.scaled(dev.profile.compute_s / shape.compute_s)
    cluster = advise.Cluster(dev.local_size, dev.params(SHARDED_RATE))
    schemes = [advise.Scheme("ddp: bucketed 25 MB on thread", "bucketed", "native", 25.0,
                             "thread"),
               advise.ShardedScheme("zero2 25 MB", "zero2", 25.0),
               advise.ShardedScheme("hsdp 25 MB", "hsdp", 25.0),
               advise.ShardedScheme("zero3 prefetch, shared", "zero3"),
               advise.ShardedScheme("zero3 prefetch, separate", "zero3", separate=True)]
    head = f"{'ranks':>6s} " + " ".join(f"{s.name:>30s}" for s in schemes)
    rows = [head]
    for ranks in overlap.RANKS:
        cells = []
        for s in schemes:
            if s.family == "sharded" and s.strategy == "hsdp" and ranks <= dev.local_size:
                cells.append(f"{'(one node)':>30s}")
                continue
            st = s.step(prof, cluster, ranks)
            cells.append(f"{st.exposed_s / st.step_s:>30.1%}")
        rows.append(f"{ranks:6d} " + " ".join(cells))
    return [f"Sync share (exposed sync / step) predicted at scale: {dev.local_size} GPUs per "
            f"node, {SHARDED_RATE:g} Gbit/s per node, {dev.alpha_inter * 1e6:g} µs per "
            f"inter-node message; compute timed as `{UNIT_PROFILE}` (ResNet-50 on this "
            f"machine's CPU, forward unit by unit) scaled to the device scenario's "
            f"{dev.profile.compute_s * 1e3:.1f} ms step (the H200 profile times no forward "
            "unit, which ZeRO-3's schedule needs). A reduce-scatter or an all-gather costs "
            "half a ring all-reduce of its bytes; ZeRO-1 takes ZeRO-2's time.", "",
            "```", *rows, "```", ""]


def sharded_lines(records: list[dict], res) -> list[str]:
    """The sharded family: the folder's runs side by side where it ran them, ZeRO-3's
    schedule in the overlap model against its zero3 runs (``analysis.sharded``; without
    a fit, priced on each run's measured link alone), and the family at scale."""
    lines = ["## Sharded data parallel (ZeRO-1/2/3, HSDP, FSDP2)", ""]
    compared = sharded.comparison_lines(records)
    if compared:
        lines += ["The folder's runs of the family beside the other strategies run on the "
                  "same model, compute, layout, link, K and launcher:", "", "```", *compared,
                  "```", ""]
    memory = sharded.memory_lines(records)
    if memory:
        lines += ["```", *memory, "```", ""]
    lines += sharded_extrapolation_lines()
    if not any(r.get("kind") == "summary" and r.get("strategy") == "zero3" for r in records):
        return lines
    return [*lines, "### Overlap model: ZeRO-3 (per-unit gathers and reduce-scatters)", "",
            "Each unit's all-gather waited for before its forward and again before its "
            "backward (the next unit's prefetched), each unit's reduce-scatter handed over as "
            "its last gradient is ready, the engines serving in order (`analysis/sharded.py`); "
            "each collective at the run's own measured rate of its kind"
            + ("" if res is not None else " (a run without them: on its measured link rate "
               "alone, no latency term: no microbenchmark fit here)") + ".", "",
            "```", *sharded.zero3_lines(records, res.params if res is not None else None),
            "```", ""]


def user_latency(records: Sequence[dict], latency_us: float | None
                 ) -> tuple[float | None, str]:
    """The per-message latency the report's model prices (µs) and the words that say so.

    ``latency_us`` is the user's network's (``--latency-us``), a model input. The report
    sets the model beside figures measured here, and a figure measured on the emulated
    cluster carries that cluster's own alpha (``alpha_us``, commbench.latency); where the
    user's value is below it, the model is priced at the measured alpha instead (clamped,
    with a note), since no figure measured here had less latency per message. Without
    ``latency_us``: (None, "")."""
    if latency_us is None:
        return None, ""
    emulated = emulated_alpha_us(records)
    head = (f"Your network's per-message latency, `{LATENCY_FLAG} {latency_us:g}`, is a model "
            "input: every prediction below (cost model, overlap model, the claims' model "
            "column) prices it, labelled as a model; measured figures are the cluster's own.")
    if emulated is None:
        return latency_us, head + " No record here carries a measured alpha to set it beside."
    alpha, k = emulated
    if latency_us < alpha:
        return alpha, (f"{head} It is below the alpha measured on the emulated cluster "
                       f"({alpha:.1f} µs per 8-byte all-reduce, median, up to K = {k:g}): no "
                       f"figure measured here had less, so the model beside them is priced at "
                       f"{alpha:.1f} µs (clamped); `python -m analysis.costmodel "
                       f"{LATENCY_FLAG} {latency_us:g}` extrapolates at your value.")
    return latency_us, (f"{head} The emulated cluster measured {alpha:.1f} µs (median, up to "
                        f"K = {k:g}): its small-message figures have less latency than your "
                        "network, and the model's row is the one to read for them.")


def build(records: list[dict], out: Path, native_is: dict[str, str] | None = None,
          sources: list[str] | None = None, latency_us: float | None = None) -> Path:
    figdir = out / "figures"
    figdir.mkdir(parents=True, exist_ok=True)
    cost.mark_native(records, native_is)
    drawn, skipped = build_figures(records)
    lines = ["# commbench report", ""]
    if sources:
        lines += [f"Results: {', '.join(f'`{s}`' for s in sources)} "
                  f"({len(records)} records).", ""]
    lines += machine_load_lines(records)
    lines += host_load_lines(records)
    lines += ["## Figures", ""]
    for name, fig in drawn.items():
        save(fig, figdir / name)
        lines += [f"### {FIGURES[name][0]}", "", f"![{name}](figures/{name}.png)", ""]
    if skipped:
        lines += ["Skipped for lack of data:", ""]
        lines += [f"- `{k}`: {v}" for k, v in skipped.items()] + [""]

    lines += ["## Cost model", ""]
    try:  # one device scenario for every prediction at scale: compute and overlap alike
        dev = overlap.h200()
    except overlap.ModelError:
        dev = None
    sc = overlap.model_scenario(dev) if dev is not None else a100_scenario()
    priced, latency_note = user_latency(records, latency_us)
    if priced is not None:
        sc = replace(sc, alpha_inter=priced * 1e-6)
        lines += [latency_note, ""]
    res = None
    try:
        res = cost.analyse(records, native_is, scenario=sc)
    except ModelError as e:
        lines += [f"Not fitted: {e}. The predictions below use the stated device scenario "
                  "only.", ""]
    if res is not None:
        save(cost.fit_figure(res.points, res.fit_points, res.params), figdir / "model_fit")
        lines += ["Fitted by `python -m analysis.costmodel` (see its docstring for the formulas, "
                  "Thakur, Rabenseifner & Gropp 2005).", "", "```",
                  *cost.report_lines(res), "```", "", "![model_fit](figures/model_fit.png)", ""]
    save(cost.extrapolation_figure(sc), figdir / "model_extrapolation")
    if dev is not None:
        where = (f"the device scenario of every prediction in this report (the claims' "
                 f"included): {dev.describe()} (one NVIDIA H200, float32; profiles/README.md)")
    else:
        where = (f"{sc.name} ({sc.grad_bytes / 1e6:.1f} MB float32 gradient, "
                 f"{sc.compute_s * 1e3:.1f} ms compute per step: NVIDIA DeepLearningExamples), "
                 f"{sc.local_size} GPUs per node on NVLink, {sc.alpha_inter * 1e6:g} µs per "
                 "inter-node message (the H200 profile was not found)")
    lines += [f"Extrapolation, no overlap of sync and compute: {where}.", "",
              "![model_extrapolation](figures/model_extrapolation.png)", ""]
    lines += model_error_lines(res)

    lines += overlap_lines(records, res)
    lines += sharded_lines(records, res)
    claims = check_all(records, res)
    lines += ["## Seed claims", "",
              "A claim that compares runs compares only runs of one matched set-up: runs "
              "that differ in the claim's own variable alone (`analysis/match.py`). Where "
              "several set-ups hold the comparison, the verdict comes from the largest (most "
              "ranks, then nodes) and the others are listed below it. Claims that compare "
              "comm times (C1-C4, C7) prefer sets whose runs were all link-bound, and say so "
              "where the set they judge on was host-bound; the host column gives the "
              "verdict's runs' time dilation and host verdict.", "",
              "Repeats of one set-up (`experiments.study --repeats`) are one sample. A ratio "
              "claim (C2, C4, C5, C7) is decided on its paired runs (`analysis/sequential.py`): "
              "the geometric mean of the paired ratios with a 95 % confidence sequence, looked "
              "at from 3 to 12 runs a side, a best-of-k figure at alpha / k; a claim on a "
              "median (C1's share, C3's overlap) needs its order-statistic interval, from 6 "
              "runs. The verdict is reproduced or refuted only when that interval lies on one "
              "side of the threshold; with fewer runs it is `undecided (n runs: range ...)`, "
              "never a verdict on a range or on one run, and the reason says about how many "
              "runs a side would decide it (`experiments.study --decide --budget` adds them).",
              "",
              "| # | claim | measured here | model at the claim's scale | host | spread | "
              "verdict | reason |", "|---|---|---|---|---|---|---|---|"]
    for c in claims:
        fig = f" ([figure](figures/{c.figure}.png))" if c.figure in drawn else ""
        spread = c.spread.words() if c.spread is not None else "—"
        lines.append(f"| {c.id} | {_cell(c.text)} | {_cell(c.measured)}{fig} | "
                     f"{_cell(c.model)} | {_cell(c.host or '—')} | {_cell(spread)} | "
                     f"**{c.verdict}** | {_cell(c.reason)} |")
    lines += ["", *claim_runs_lines(claims), *straggler.report_lines(records),
              *setup_verdict_lines(sources or []), *repeat_until_lines(sources or []),
              *decide_lines(sources or [])]
    page = out / "README.md"
    page.write_text("\n".join(lines), encoding="utf-8")
    return page


#: what ``experiments.study --repeat-until`` did, in its results folder
UNTIL_FILE = "repeat-until.json"


def repeat_until_lines(paths: Sequence[str]) -> list[str]:
    """What ``experiments.study --repeat-until PCT --budget D`` did (``UNTIL_FILE`` in a results
    folder given): the repeats each point ran, the rounds, and why it stopped."""
    found = [Path(p) / UNTIL_FILE for p in paths if (Path(p) / UNTIL_FILE).is_file()]
    if not found:
        return []
    try:
        d = json.loads(found[0].read_text())
    except (OSError, ValueError) as e:
        return ["## Repeats until a precision", "", f"{found[0]} unreadable: {e}", ""]
    lines = ["## Repeats until a precision", "",
             f"`experiments.study --repeat-until {d['pct']:g}` with a budget of "
             f"{d['budget_s'] / 3600:.1f} h: the study took {d['spent_s'] / 3600:.1f} h and "
             f"stopped because {d['stopped']}.", ""]
    for i, r in enumerate(d.get("rounds", []), 1):
        lines.append(f"- round {i}: " + ", ".join(f"{k} +{n}" for k, n in r["added"].items())
                     + f" (~{r['expected_s'] / 60:.0f} min)")
    if d.get("claims"):
        lines += ["", f"| claim | figure | within ±{d['pct']:g} % |", "|---|---|---|"]
        lines += [f"| {c['claim']} | {_cell(c['spread'])} | {'yes' if c['within'] else 'no'} |"
                  for c in d["claims"]]
    lines += ["", "Jobs per point: " + ", ".join(f"{k} {n}" for k, n in
                                                 sorted(d.get("repeats", {}).items())), ""]
    return lines


#: the runner's dilation choices, per compared set, in its results folder
CHOICE_FILE = "dilations.json"


def setup_verdict_lines(paths: Sequence[str]) -> list[str]:
    """Each compared set's K and its set-up verdict (``CHOICE_FILE`` in a results folder
    given): the outcome rule's (its probes' figures at K against 2K), beside the counter
    verdicts the probes at K recorded, which each run's own ``bound`` field repeats for
    that run alone."""
    found = [Path(p) / CHOICE_FILE for p in paths if (Path(p) / CHOICE_FILE).is_file()]
    if not found:
        return []
    try:
        chosen = json.loads(found[0].read_text())
    except (OSError, ValueError) as e:
        return ["## Set-up verdicts", "", f"{found[0]} unreadable: {e}", ""]
    lines = ["## Set-up verdicts", "",
             "A set-up's host verdict is a property of runs at two K (docs/fidelity.md): "
             "link-bound at K where every probe's figures at K agree with those at 2K within "
             "5 % (the outcome rule). The host column above is the counter reading of each "
             "run (`commbench.hostload`), provisional beside it.", "",
             "| compared set | K | set-up verdict | rule | why | counter verdicts at K |",
             "|---|---|---|---|---|---|"]
    for key, c in chosen.items():
        at = next((t for t in c.get("tried", []) if float(t["dilation"]) == c["dilation"]),
                  None)
        counter = "—"
        if at is not None:
            vs = [v for vv in at.get("verdicts", {}).values() for v in vv]
            counter = (f"{sum(v == 'link-bound' for v in vs)} of {len(vs)} link-bound"
                       if vs else "none")
        lines.append(f"| {_cell(key)} | {c['dilation']:g} | {c.get('verdict') or '—'} | "
                     f"{c.get('rule', 'counter')} | {_cell(c.get('why', ''))} | {counter} |")
    return lines + [""]


#: what ``experiments.study --decide`` did, in its results folder
DECIDE_FILE = "decide.json"


def decide_lines(paths: Sequence[str]) -> list[str]:
    """What ``experiments.study --decide --budget D`` did (``DECIDE_FILE`` in a results folder
    given): per claim its verdict, the figure it was decided on, the runs a side it used
    and the time to its verdict; the rounds, and why it stopped."""
    found = [Path(p) / DECIDE_FILE for p in paths if (Path(p) / DECIDE_FILE).is_file()]
    if not found:
        return []
    try:
        d = json.loads(found[0].read_text())
    except (OSError, ValueError) as e:
        return ["## Decide, then stop", "", f"{found[0]} unreadable: {e}", ""]
    lines = ["## Decide, then stop", "",
             f"`experiments.study --decide` with a budget of {d['budget_s'] / 3600:.1f} h: "
             f"the study took {d['spent_s'] / 3600:.1f} h and stopped because "
             f"{d['stopped']}.", ""]
    for i, r in enumerate(d.get("rounds", []), 1):
        lines.append(f"- round {i}: " + ", ".join(f"{k} +{n}" for k, n in r["added"].items())
                     + f" (~{r['expected_s'] / 60:.0f} min)")
    if d.get("claims"):
        lines += ["", "| claim | verdict | decided on | runs a side | time to its verdict |",
                  "|---|---|---|---|---|"]
        for c in d["claims"]:
            at = c.get("decided_after_s")
            lines.append(f"| {c['claim']} | {c['verdict']} | {_cell(c.get('figure') or '—')} | "
                         f"{c.get('runs') if c.get('runs') is not None else '—'} | "
                         + (f"{at / 60:.0f} min" if at is not None else "not decided") + " |")
    for c in d.get("left_out", []):
        lines.append(f"| {c['claim']} | undecided: not run | one round of its jobs needs "
                     f"~{c['one_round_s'] / 3600:.1f} h, beyond the budget | 0 | not decided |")
    return lines + [""]


def body(argv: list[str]) -> int:
    p = parser(PROG, "Write a Markdown report: figures, cost model and the seed claims C1-C8.")
    p.add_argument("paths", nargs="+", help="result files or directories")
    p.add_argument("-o", "--output", default="report", help="directory for README.md + figures")
    add_native_is(p)
    p.add_argument(LATENCY_FLAG, dest="latency_us", default=None, metavar="US",
                   help="your network's inter-node latency per message (microseconds), a "
                        "model input the predictions price; clamped to the emulated alpha "
                        "the records measured where it is below it")
    args = p.parse_args(argv)
    try:
        user_us = None if args.latency_us is None else latency_us(args.latency_us)
    except ValueError as e:
        raise UsageError(str(e)) from None
    out = output_dir(args.output, create=False)
    native_is = parse_native_is(args.native_is)
    loaded = load(args.paths)
    warn(PROG, loaded.warnings)
    page = build(loaded.records, output_dir(out), native_is, [str(x) for x in args.paths],
                 user_us)
    print(f"wrote {page}")
    return 0


main = entry(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
