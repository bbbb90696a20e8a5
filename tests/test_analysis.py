"""analysis/: loading, CSV export, plots, timeline and report, on real result files.

The results are made once per module by real ``commbench.allreduce`` and
``commbench.microbench`` jobs under mpirun (a few seconds each); the tests
then check the matplotlib objects (axes labels, series) rather than files.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path

import pytest

from analysis import figures, load, plot, timeline
from tests.conftest import PY, ROOT, run_tool

pytestmark = pytest.mark.mpi

COMMON = ["--steps", "3", "--warmup", "1", "--compute-ms", "20", "--model", "smallcnn",
          "--quiet"]
A = "commbench.allreduce"


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """Results files of a few small jobs, each of which must have written records."""
    d = tmp_path_factory.mktemp("results")
    for np_, module, args, name in [
        (1, A, [*COMMON, "--algo", "native"], "flat-np1"),
        (2, A, [*COMMON, "--strategy", "flat,bucketed", "--algo", "native,ring", "--timeline"],
         "np2"),
        (2, A, [*COMMON, "--strategy", "bucketed", "--bucket-mb", "5"], "bucket5-np2"),
        (2, A, [*COMMON, "--algo", "native", "--batch-size", "64"], "batch64-np2"),
        (2, "commbench.microbench", ["-b", "8", "-e", "64K", "-f", "8", "-n", "3", "-w", "1",
                                     "--quiet"], "microbench-np2"),
    ]:
        assert run_tool("mpirun", np_, module, args, d / f"{name}.jsonl").records
    return d


def _cli(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", module, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def _legend(fig) -> list[str]:
    """The figure's legend entries (each panel's legend, beside its axes)."""
    return [t.get_text() for ax in fig.axes if ax.get_legend()
            for t in ax.get_legend().get_texts()]


def _series(ax) -> dict[str, tuple[list, list]]:
    """label -> (x, y) of every labelled line, error-bar series included."""
    out = {c.get_label(): c.lines[0] for c in ax.containers if hasattr(c, "lines")}
    out.update({ln.get_label(): ln for ln in ax.get_lines()
                if not ln.get_label().startswith("_")})
    return {k: (list(v.get_xdata()), list(v.get_ydata())) for k, v in out.items()}


# -- loading and export -----------------------------------------------------------

def test_load_reads_every_kind_with_file_and_line(results):
    loaded = load.load([results])
    kinds = {r["kind"] for r in loaded.records}
    assert {"step", "summary", "microbench", "trace"} <= kinds
    assert not loaded.warnings
    r = loaded.of_kind("summary")[0]
    assert Path(r["_file"]).parent == results and r["_line"] >= 1


def test_export_csv_has_a_row_per_record_and_dotted_columns(results, tmp_path):
    out = tmp_path / "summary.csv"
    res = _cli("analysis.export", str(results), "--kind", "summary", "-o", str(out))
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    summaries = load.load([results]).of_kind("summary")
    assert len(rows) == len(summaries)
    assert {"strategy", "world_size", "stats.sync_share.p95", "knobs.bucket_mb"} <= set(rows[0])
    assert {row["strategy"] for row in rows} == {"flat", "bucketed"}


# -- plots ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def drawn(results):
    figs, skipped = plot.build(load.load([results]).records)
    return figs, skipped


def test_sync_share_vs_ranks_has_one_series_per_strategy(results):
    fig, why, series = figures.sync_share_vs_ranks(load.load([results]).records)
    assert why is None
    ax = fig.axes[0]
    assert ax.get_xlabel() == "ranks"
    assert "sync share" in ax.get_ylabel()
    labels = _legend(fig)
    assert {"flat (native)", "flat (ring)", "bucketed 25 MB", "bucketed 5 MB"} <= set(labels)
    # the batch-64 run is another set-up, at one rank count: not on these lines
    assert all(r["batch_size"] == 32 for s in series for r in s.runs)
    assert "1 more set-up not drawn" in fig.get_supxlabel()
    assert _series(ax)["flat (native)"][0] == [1, 2]  # measured on 1 and 2 ranks


def test_scaling_figure_has_throughput_and_efficiency(drawn):
    figs, _ = drawn
    ax1, ax2 = figs["scaling"].axes
    assert ax1.get_ylabel() == "throughput (samples/s)"
    assert ax2.get_ylabel().replace("\n", " ").startswith("scaling efficiency (vs 1 rank")
    eff = _series(ax2)
    flat = eff["flat (native)"]
    assert flat[0] == [1, 2] and flat[1][0] == pytest.approx(1.0)
    # a series measured on one rank count only has no efficiency to draw
    assert not any(lab.startswith("flat (ring)") for lab in eff)
    assert any(lab.startswith("flat (ring)") for lab in _series(ax1))


def test_overlap_figure_bars_per_strategy(drawn):
    figs, _ = drawn
    ax = figs["overlap"].axes[0]
    assert ax.get_xlabel() == "time per step (ms, median)"
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert any(t.startswith("bucketed") for t in ticks) and any(t.startswith("flat") for t in ticks)
    assert set(_legend(figs["overlap"])) == {
        "comm time (collective in flight)", "exposed sync: wait for slower ranks",
        "exposed sync: transfer and the rest (exposed - wait)",
        "wait + transfer (sums over the step's collectives)"}


def _summary(strategy: str, schema: int = 2, **ms: float) -> dict:
    """A hand-made summary: ``ms`` are medians in ms (comm, exposed, wait, transfer)."""
    names = {"comm": "comm_s", "exposed": "exposed_sync_s", "wait": "sync_wait_s",
             "transfer": "sync_transfer_s"}
    return {"kind": "summary", "schema": schema, "strategy": strategy, "algo": None,
            **{names[k]: v / 1e3 for k, v in ms.items()}}


def test_overlap_stacks_exposed_sync_as_wait_and_transfer():
    recs = [_summary("flat", comm=40, exposed=60, wait=20, transfer=40),
            _summary("bucketed", comm=30, exposed=10, wait=15, transfer=30),  # overlapped
            _summary("horovod", comm=50, exposed=30)]  # no per-collective times
    fig, why, _ = figures.overlap(recs)
    assert why is None
    ax = fig.axes[0]
    bars = {c.get_label(): [(p.get_y() + p.get_height() / 2, p.get_x(), p.get_width())
                            for p in c.patches] for c in ax.containers}
    ticks = [t.get_text() for t in ax.get_yticklabels()]  # bucketed, flat, horovod
    row = {t: i + 0.2 for i, t in enumerate(ticks)}
    wait = {y: w for y, _, w in bars["exposed sync: wait for slower ranks"]}
    rest = {y: (x, w) for y, x, w in bars["exposed sync: transfer and the rest (exposed - wait)"]}
    assert wait[row["flat"]] == pytest.approx(20) and rest[row["flat"]] == pytest.approx((20, 40))
    # a wait longer than exposed sync (hidden behind compute) fills the bar, no more
    assert wait[row["bucketed"]] == pytest.approx(10) and rest[row["bucketed"]][1] == 0
    plain = bars["exposed sync (not hidden; no wait/transfer split)"]
    assert [(y, w) for y, _, w in plain] == [(pytest.approx(row["horovod"]), pytest.approx(30))]
    marks = _series(ax)["wait + transfer (sums over the step's collectives)"]
    assert sorted(marks[0]) == pytest.approx([45, 60])


def test_schema_1_and_2_records_load_together(tmp_path):
    old, new = tmp_path / "v1.jsonl", tmp_path / "v2.jsonl"
    old.write_text(json.dumps(_summary("flat", schema=1, comm=40, exposed=60)) + "\n")
    new.write_text(json.dumps(_summary("flat", comm=40, exposed=60, wait=1, transfer=39))
                   + "\n")
    loaded = load.load([old, new])
    assert sorted(r["schema"] for r in loaded.records) == [1, 2]
    fig, _, _ = figures.overlap(loaded.records)
    assert fig is not None


def test_busbw_figure_has_one_line_per_algorithm(drawn):
    figs, _ = drawn
    ax = figs["busbw_vs_size"].axes[0]
    assert ax.get_xlabel() == "message size (bytes)" and ax.get_ylabel() == "bus bandwidth (GB/s)"
    # one host: no link, so no line drawn as a ceiling
    assert set(_legend(figs["busbw_vs_size"])) == {"native", "ring", "hier", "hier-leader"}
    assert ax.get_ylim()[0] == 0


def test_bucket_and_batch_sweeps(drawn):
    figs, _ = drawn
    b1, b2 = figs["bucket_sweep"].axes
    assert b1.get_xlabel().startswith("bucket cap (MB")
    bucketed = [xy for lab, xy in _series(b2).items() if lab.startswith("bucketed")]
    assert len(bucketed) == 1 and sorted(bucketed[0][0]) == [5.0, 25.0]
    m1, m2 = figs["batch_size"].axes
    assert m1.get_xlabel() == "batch size per rank (samples)"
    assert "peak RSS per rank" in m2.get_ylabel()


def test_figures_without_data_are_skipped_with_reason(drawn):
    figs, skipped = drawn
    assert "staleness" in skipped and skipped["staleness"].startswith("no data")
    assert set(figs) | set(skipped) == set(figures.FIGURES)


def test_plot_cli_writes_png_and_svg_and_lists_skips(results, tmp_path):
    res = _cli("analysis.plot", str(results), "-o", str(tmp_path / "plots"))
    assert res.returncode == 0, res.stderr
    for name in ("sync_share_vs_ranks", "busbw_vs_size", "overlap"):
        assert (tmp_path / "plots" / f"{name}.png").exists()
        assert (tmp_path / "plots" / f"{name}.svg").exists()
    assert "skipped staleness: no data" in res.stdout


# -- bad input (exit 2 cases of every tool: tests/test_bad_input.py) ---------------

def _good_lines(results: Path) -> list[str]:
    return (results / "np2.jsonl").read_text().splitlines()


def _bad(res: subprocess.CompletedProcess, *words: str) -> None:
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_empty_file_alone_exits_2_and_beside_others_warns(results, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    _bad(_cli("analysis.plot", str(empty), "-o", str(tmp_path / "p")), str(empty))
    assert not (tmp_path / "p").exists()
    res = _cli("analysis.plot", str(empty), str(results / "np2.jsonl"), "-o",
               str(tmp_path / "p"))
    assert res.returncode == 0 and f"{empty}: empty file, skipped" in res.stderr


def test_truncated_last_line_is_skipped_with_warning_and_still_plots(results, tmp_path):
    lines = _good_lines(results)
    cut = tmp_path / "running.jsonl"
    cut.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])
    res = _cli("analysis.plot", str(cut), "-o", str(tmp_path / "p"))
    assert res.returncode == 0, res.stderr
    assert f"{cut}:{len(lines)}: truncated last line" in res.stderr
    assert (tmp_path / "p" / "sync_share_vs_ranks.png").exists()


def test_malformed_line_in_the_middle_is_refused(results, tmp_path):
    lines = _good_lines(results)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    _bad(_cli("analysis.plot", str(bad), "-o", str(tmp_path / "p")), f"{bad}:2:", "not a JSON")


def test_unknown_and_mixed_schema_versions_are_refused(results, tmp_path):
    lines = _good_lines(results)
    newer = [json.dumps({**json.loads(ln), "schema": 99}) for ln in lines]
    future = tmp_path / "future.jsonl"
    future.write_text("\n".join(newer) + "\n")
    _bad(_cli("analysis.plot", str(future), "-o", str(tmp_path / "p")), f"{future}:1",
         "schema version 99")
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join([lines[0], newer[1]]) + "\n")
    _bad(_cli("analysis.export", str(mixed)), "mixed schema versions", f"{mixed}:2")


def test_output_that_is_a_file_is_refused(results, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    _bad(_cli("analysis.plot", str(results), "-o", str(f)), "-o/--output")


# -- timeline --------------------------------------------------------------------

def test_only_timeline_runs_carry_trace_records(results):
    recs = load.load([results]).records
    traced = {r["_file"] for r in recs if r["kind"] == "trace"}
    assert traced == {str(results / "np2.jsonl")}


def test_chrome_trace_has_every_rank_phase_and_collective(results, tmp_path):
    out = tmp_path / "run.trace.json"
    res = _cli("analysis.timeline", str(results / "np2.jsonl"), "-o", str(out))
    assert res.returncode == 0, res.stderr
    events = json.loads(out.read_text())["traceEvents"]
    traces = load.load([results / "np2.jsonl"]).of_kind("trace")
    assert len(traces) == 3  # one per run: flat native, flat ring, bucketed
    procs = [e["args"]["name"] for e in events if e["name"] == "process_name"]
    assert len(procs) == 2 * len(traces) and all("rank" in p for p in procs)
    complete = [e for e in events if e["ph"] == "X"]
    names = {e["name"] for e in complete}
    assert {"forward", "backward", "allreduce", "barrier wait"} <= names
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in complete)
    steps = [e for e in complete if e["name"].startswith("step ")]
    assert len(steps) == 2 * len(traces) * 4  # 2 ranks x (1 warm-up + 3 steps) per run
    # a collective lies inside its step on the same rank
    by = {(e["pid"], e["args"]["step"]): e for e in steps}
    for e in complete:
        if e["name"] == "allreduce":
            s = by[(e["pid"], e["args"]["step"])]
            assert s["ts"] - 1 <= e["ts"] <= s["ts"] + s["dur"] + 1


def test_trace_events_lanes_never_overlap():
    lanes = timeline._lanes([[0, 2], [1, 3], [2.5, 4], [3.5, 5]])
    assert lanes == [0, 1, 0, 1]


# -- report -------------------------------------------------------------------------

def test_report_has_figures_model_and_every_claim(results, tmp_path):
    res = _cli("analysis.report", str(results), "-o", str(tmp_path / "rep"))
    assert res.returncode == 0, res.stderr
    page = (tmp_path / "rep" / "README.md").read_text()
    for c in range(1, 9):
        assert f"| C{c} |" in page
    for link in ("figures/sync_share_vs_ranks.png", "figures/model_fit.png",
                 "figures/model_extrapolation.png"):
        assert f"]({link})" in page and (tmp_path / "rep" / link).exists()
    # verdicts come from the data: one host cannot test the two-level claim
    c2 = next(ln for ln in page.splitlines() if ln.startswith("| C2 |"))
    assert "not reproducible here" in c2 and "one host" in c2


def test_analysis_imports_no_mpi_horovod_or_torch():
    code = ("import sys, analysis.plot, analysis.figures, analysis.costmodel, analysis.report, "
            "analysis.timeline, analysis.export, analysis.claims; "
            "bad = [m for m in ('mpi4py', 'horovod', 'torch', 'commbench.comm') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
