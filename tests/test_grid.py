"""The advisor's validation grid (``experiments.grid``, issue 48 part 3): each cell's plan
(the reference set, the caps and the advisor's top 3, deduplicated), the scheme names the
advisor emits mapped to ``commbench.allreduce`` runs, the judge on records written in the
real schema, bad input, and ``--dry-run``.

Single-process: the advisor runs in-process, no job is started; the records are made by
hand with the fields a ``commbench.allreduce`` summary carries (``tests/test_claims.py``'s
way), their ``config`` the planned job's own."""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from analysis.advise import (
    EXACT,
    SCHEMES,
    Advice,
    ClusterFlags,
    Prediction,
    advise,
    cluster_params,
)
from analysis.overlap import Profile
from commbench import SCHEMA_VERSION
from commbench.allreduce import runs_of
from commbench.strategies import STRATEGIES
from experiments import grid as gr
from experiments import grid_judge as gj
from experiments import runner as rn
from experiments.heldout import GRID, Cell, GridModel, load_grid

REFERENCE_IDS = ["flat-native", "ddp-25", "bucketed-auto", "hier", "bucketed-1",
                 "bucketed-25", "bucketed-128"]
_ids = itertools.count()


def tiny_profile(folder: Path) -> Path:
    """A three-tensor compute profile of ``resnet18`` at batch 8 (5.0 MB of gradient)."""
    grads = [("layer.weight", [1024, 1024], 0.09), ("head.weight", [256, 1024], 0.05),
             ("head.bias", [1024], 0.02)]
    doc = {"schema": 1, "kind": "compute_profile", "model": "resnet18", "num_classes": 1000,
           "batch_size": 8, "image_size": 32, "device": "cpu", "forward_s": 0.05,
           "backward_s": 0.09, "optimizer_s": 0.01,
           "backward_order": ["head.bias", "head.weight", "layer.weight"],
           "grads": [{"name": n, "shape": s, "ready_s": t} for n, s, t in grads]}
    path = folder / "tiny.json"
    path.write_text(json.dumps(doc))
    return path


def tiny_grid(folder: Path, layout: str = "2x4", rate: str = "1gbit"):
    """The committed grid's reference set and caps, with one cell of the tiny profile."""
    tiny_profile(folder)
    model = GridModel("tiny", "resnet18", "tiny.json", 8)
    cell = Cell(model, layout, rate, False)
    return replace(load_grid(GRID), models=(model,), cells=(cell,)), cell


def fake_advice(*ranked: tuple[str, float]):
    """An advisor whose exact table is ``ranked`` (scheme, step s; 0.8 s of compute)."""
    def fake(prof, cluster, ranks, families=SCHEMES):
        return Advice(ranks, [Prediction(n, n.split()[0], 0.8, s - 0.8) for n, s in ranked], [])
    return fake


def planned(tmp_path, monkeypatch=None, advice=None, **kw):
    grid, cell = tiny_grid(tmp_path, **kw)
    if advice is not None:
        monkeypatch.setattr(gr, "advise", advice)
    ci = gr.cell_input(grid, cell, 4, root=tmp_path)
    return gr.plan_cell(grid, ci, 3.0, "a test's", warmup=1, dilation="auto")


# --- the scheme names -----------------------------------------------------------------------

def every_scheme_name() -> list[str]:
    """Every name the advisor's tables give on a small scenario: every family, every cap
    (per-tensor too), every path, the approximate block included."""
    prof = Profile("p", 0.01, 0.02, 0.001, [4e6, 1e6, 4e3], [0.02, 0.01, 0.004], [2, 1, 0])
    cluster = cluster_params(ClusterFlags(4, 10.0, 5.0), None, True)
    a = advise(prof, cluster, 8, SCHEMES, (0.0, 1.0, 5.0, 25.0, 64.0, 128.0, "auto"),
               allow_approximate=True)
    return [p.scheme for p in (*a.exact, *a.approximate)]


def test_every_scheme_the_advisor_emits_maps_to_one_run_of_commbench_allreduce(tmp_path):
    names = every_scheme_name()
    assert {n.split()[0] for n in names} >= {"flat", "hierarchical", "bucketed", "fp16",
                                             "accumulate", "async"}
    tiny = tiny_profile(tmp_path)
    for name in names:
        run = gr.run_as(name)
        assert run.strategy in STRATEGIES, name
        cfg = gr.replay_config("resnet18", tiny, 8, 1.0, 4, 1, [run.strategy], [run.algo],
                               run.sync())
        assert len(runs_of(cfg)) == 1, name  # one run per job
        cfg.run_settings()  # every strategy's settings accept the flags
        scheme = gr.advisor_scheme(run)
        if name.split()[0] in EXACT and "rd" not in name and "rabenseifner" not in name:
            assert scheme is not None and scheme.name == name, name  # priced as itself


@pytest.mark.parametrize("name, strategy, algo, cap, path, extra", [
    ("flat ring", "flat", "ring", None, None, {}),
    ("flat rabenseifner", "flat", "native", None, None, {}),
    ("flat rd", "flat", "native", None, None, {}),
    ("hierarchical hier", "hierarchical", "hier", None, None, {}),
    ("hierarchical hier-leader", "hierarchical", "hier-leader", None, None, {}),
    ("bucketed 25 MB on ring", "bucketed", "native", 25.0, "ring", {}),
    ("bucketed 1 MB on thread", "bucketed", "native", 1.0, "thread", {}),
    ("bucketed auto on hier", "bucketed", "native", "auto", "hier", {}),
    ("bucketed per-tensor on ring", "bucketed", "native", 0.0, "ring", {}),
    ("fp16 wire, bucketed 5 MB on ring", "bucketed", "native", 5.0, "ring",
     {"compression": "fp16"}),
    ("accumulate 4, flat ring", "flat", "ring", None, None, {"accum_steps": 4}),
    ("async S=2 on thread", "async", "native", None, "thread", {"staleness": 2}),
    # the sharded rows run the collectives the advisor prices: the ring, or topology-aware
    ("zero2 25 MB", "zero2", "ring", 25.0, None, {}),
    ("zero2 25 MB topology-aware", "zero2", "hier", 25.0, None, {}),
    ("hsdp per-tensor", "hsdp", "native", 0.0, None, {}),
    ("zero3 prefetch, shared", "zero3", "ring", None, None,
     {"prefetch": "on", "reduce_scatter_group": "shared"}),
    ("zero3 prefetch, separate RS group", "zero3", "ring", None, None,
     {"prefetch": "on", "reduce_scatter_group": "separate"}),
    ("zero3 no prefetch", "zero3", "ring", None, None,
     {"prefetch": "off", "reduce_scatter_group": "shared"}),
    ("zero3 prefetch, shared, root kept", "zero3", "ring", None, None,
     {"prefetch": "on", "reduce_scatter_group": "shared", "reshard_root": "off"}),
    ("zero3 prefetch, shared, topology-aware", "zero3", "hier", None, None,
     {"prefetch": "on", "reduce_scatter_group": "shared"}),
])
def test_scheme_names_map_to_the_flags_that_run_them(name, strategy, algo, cap, path, extra):
    run = gr.run_as(name)
    assert (run.strategy, run.algo, run.bucket_mb, run.transfer) == (strategy, algo, cap, path)
    sync = run.sync()
    for k, v in extra.items():
        assert getattr(sync, k) == v
    if cap is not None:
        assert sync.bucket_mb == cap
    if path is not None:
        assert sync.transfer == path
    # the toolkit has no rd or Rabenseifner of its own: run as native, and said so
    assert bool(run.note) == (name in ("flat rd", "flat rabenseifner"))
    assert (f"--algo {algo}" in run.words()) == (strategy in gr.ALGO_STRATEGIES)


def test_an_unknown_scheme_name_is_refused_by_name():
    for bad in ("flat nccl", "bucketed 25 MB on nbc", "hierarchical ring", "sharded zero3",
                "bucketed lots on ring", "zero3 prefetch", "hsdp lots"):
        with pytest.raises(ValueError, match="scheme"):
            gr.run_as(bad)


def test_the_reference_set_runs_bucketed_on_the_path_transfer_auto_takes_on_mpi():
    grid = load_grid(GRID)
    runs = {s["id"]: gr.reference_run(s) for s in grid.schemes}
    assert runs["flat-native"].key == gr.RunAs("flat", "native").key
    assert runs["ddp-25"].key == gr.RunAs("ddp", bucket_mb=25.0).key
    assert runs["hier"].key == gr.run_as("hierarchical hier").key
    assert runs["bucketed-auto"].key == gr.run_as("bucketed auto on ring").key
    for mb in (1, 25, 128):
        assert runs[f"bucketed-{mb}"].key == gr.run_as(f"bucketed {mb} MB on ring").key
    assert gr.advisor_scheme(runs["ddp-25"]) is None  # the advisor prices no DDP


# --- the plan ------------------------------------------------------------------------------

def test_a_cells_plan_holds_the_reference_set_and_the_advisors_top_3_once_each(tmp_path):
    cp = planned(tmp_path)
    ids = [j.id for j in cp.jobs]
    assert ids[:7] == REFERENCE_IDS
    assert len({j.run.key for j in cp.jobs}) == len(cp.jobs)  # no run twice
    assert len(cp.top) == 3 and cp.pick == cp.ranking[0].scheme
    for i, name in enumerate(cp.top, 1):
        holders = [j for j in cp.jobs if any(r.what == f"advisor #{i}" for r in j.roles)]
        assert len(holders) == 1 and holders[0].run.key == gr.run_as(name).key
        role = next(r for r in holders[0].roles if r.what == f"advisor #{i}")
        assert role.predicted == cp.ranking[i - 1]  # the advisor's own prediction
    new = [j for j in cp.jobs if j.id.startswith("advisor-")]
    assert len(cp.jobs) == 7 + len(new)
    # one compared set per cell, every job at its placement and dilation
    assert {j.job.sets for j in cp.jobs} == {frozenset({cp.cell.id})}
    assert {(j.job.placement.nodes, j.job.placement.slots, j.job.placement.rate,
             j.job.placement.dilation) for j in cp.jobs} == {(2, 4, "1gbit", "auto")}
    # backward balanced against the ring's bound at the grid's balance rate (1 Gbit/s)
    ci = gr.cell_input(*tiny_grid(tmp_path), 4, root=tmp_path)
    bound_s = gr.ring_bound_bytes(ci.profile, 2, 4) * 8 / 1e9
    assert ci.profile.backward_s * cp.compute_scale == pytest.approx(bound_s, rel=1e-3)


def test_a_top_3_scheme_the_reference_set_runs_is_one_job_with_both_roles(tmp_path,
                                                                          monkeypatch):
    cp = planned(tmp_path, monkeypatch, fake_advice(
        ("bucketed 25 MB on ring", 1.0), ("flat rabenseifner", 1.1),
        ("bucketed 5 MB on thread", 1.2), ("flat ring", 1.3)))
    jobs = {j.id: j for j in cp.jobs}
    assert list(jobs) == [*REFERENCE_IDS, "advisor-3"]
    assert [r.what for r in jobs["bucketed-25"].roles] == ["bucketed-25", "advisor #1"]
    assert [r.what for r in jobs["flat-native"].roles] == ["flat-native", "advisor #2"]
    # the job is the reference's; the advisor's role says it runs native for Rabenseifner
    assert jobs["flat-native"].run.note == ""
    assert "no rabenseifner" in jobs["flat-native"].roles[1].note
    cfg = {i: j.job.config for i, j in jobs.items()}
    assert (cfg["flat-native"].strategies, cfg["flat-native"].algos) == (["flat"], ["native"])
    assert (cfg["hier"].strategies, cfg["hier"].algos) == (["hierarchical"], ["hier"])
    assert (cfg["ddp-25"].strategies, cfg["ddp-25"].sync.bucket_mb) == (["ddp"], 25.0)
    assert (cfg["bucketed-auto"].sync.bucket_mb, cfg["bucketed-auto"].sync.transfer) == (
        "auto", "ring")
    assert (cfg["advisor-3"].strategies, cfg["advisor-3"].sync.bucket_mb,
            cfg["advisor-3"].sync.transfer) == (["bucketed"], 5.0, "thread")
    # the pick's prediction is the advisor's; the references' are priced by its schemes
    assert jobs["bucketed-25"].prediction.step_s == pytest.approx(1.0)
    assert jobs["hier"].prediction.scheme == "hierarchical hier"
    assert jobs["ddp-25"].prediction is None
    # the plan as the folder keeps it: each job's signature is its records'
    rec = gr.plan_record(cp)
    assert rec["pick"] == "bucketed 25 MB on ring" and rec["alpha_us"] == 3.0
    assert [j["id"] for j in rec["jobs"]] == list(jobs)


def test_a_folder_planned_otherwise_is_refused_and_the_alpha_it_planned_at_is_kept(
        tmp_path, monkeypatch):
    cp = planned(tmp_path, monkeypatch, fake_advice(
        ("bucketed 25 MB on ring", 1.0), ("flat ring", 1.1), ("hierarchical hier", 1.2)))
    doc = gr.merge_plans({"cells": {}}, [cp], GRID)
    assert gr.merge_plans(doc, [cp], GRID) == doc  # the same plan resumes
    other = planned(tmp_path, monkeypatch, fake_advice(
        ("flat ring", 1.0), ("bucketed 25 MB on ring", 1.1), ("hierarchical hier", 1.2)))
    with pytest.raises(gr.BadInput, match="-o/--output"):
        gr.merge_plans(doc, [other], GRID)


# --- the judge -----------------------------------------------------------------------------

def summary(job, step: float, exposed: float, repeat: int, bound: str = "link-bound",
            dilation: float = 4.0) -> dict:
    """One run's summary record as ``commbench.allreduce`` writes it (schema 5), its
    ``config`` the planned job's."""
    (strategy, algo, _), = runs_of(job.config)
    p = job.placement
    cfg = json.loads(json.dumps(job.config.as_dict()))
    n = p.ranks
    return {
        "schema": SCHEMA_VERSION, "kind": "summary", "job_id": f"job{next(_ids)}",
        "run_id": f"run{next(_ids):04d}", "backend": "mpi", "launcher": "mpirun",
        "world_size": n, "nodes": p.nodes, "local_size": p.slots,
        "local_sizes": p.node_slots, "hostnames": [f"n{i // p.slots}" for i in range(n)],
        "torch_threads": 1, "thread_rule": "machine ranks from the launcher",
        "machine_ranks": n, "rank_cores": 2, "cores": 2, "loadavg_start": 0.2,
        "dilation": dilation, "alpha_us": 3.1, "alpha_p5_us": 3.0, "alpha_p95_us": 3.3,
        "repeat": repeat, "revision": "abc123",
        "versions": {"commbench": "0.1.0", "mpi_library": "Open MPI v4.1.4"},
        "argv": ["commbench/allreduce.py", *job.args], "config": cfg,
        "strategy": strategy, "algo": algo, "workload": "synthetic", "model": cfg["model"],
        "batch_size": cfg["batch_size"], "image_size": None, "device": "cpu",
        "dtype": "float32", "grad_bytes": 5246976, "grad_tensors": 3,
        "link_gbps": 0.95, "link_wire_gbps": 0.97, "link_shaping": p.rate, "knobs": {},
        "step_s": step, "compute_s": step - exposed, "comm_s": exposed,
        "exposed_sync_s": exposed, "sync_share": exposed / step, "overlap": 0.0,
        "bound": bound, "wrong": 0, "validated": True,
    }


def write_runs(folder: Path, job, figures, **kw) -> None:
    """A results file per run of ``job`` (step, exposed sync), in repeat order."""
    for r, (step, exposed) in enumerate(figures):
        path = folder / "mpirun" / f"{job.name.replace('/', '_').replace(' ', '_')}-r{r}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary(job, step, exposed, r, **kw)) + "\n")


def judged_folder(tmp_path, monkeypatch, pick_runs, others=1.5, n=3, **kw):
    """A folder of the plan of one cell (pick: bucketed 25 MB on ring, predicted 1.0 s
    step and 0.2 s exposed) with ``pick_runs`` of the pick, the other jobs at ``others``
    x 1.0 s, ``n`` runs each."""
    cp = planned(tmp_path, monkeypatch, fake_advice(
        ("bucketed 25 MB on ring", 1.0), ("flat ring", 1.1), ("hierarchical hier", 1.2)))
    out = tmp_path / "grid"
    out.mkdir()
    (out / gj.PLAN_FILE).write_text(json.dumps(gr.merge_plans({"cells": {}}, [cp], GRID)))
    for j in cp.jobs:
        if j.id == "bucketed-25":
            write_runs(out, j.job, pick_runs, **kw)
        else:
            write_runs(out, j.job, [(others * (1 + 1e-4 * i), 0.5) for i in range(n)], **kw)
    return cp, out


def test_the_judge_reads_the_folder_and_decides_each_goal_on_the_paired_runs(tmp_path,
                                                                             monkeypatch):
    # the pick is the measured best; its step as predicted, its exposed sync 30 % above
    cp, out = judged_folder(tmp_path, monkeypatch,
                            [(1.000, 0.26), (1.001, 0.26), (0.999, 0.26)])
    # a dilation probe's records are never results
    probe = out / "dilation-probes" / "x"
    probe.mkdir(parents=True)
    (probe / "p.jsonl").write_text(json.dumps(summary(cp.jobs[0].job, 9.0, 9.0, 0)) + "\n")
    (v,) = gj.judge(out)
    assert v.cell == "tiny/2x4/1gbit" and v.pick == "bucketed 25 MB on ring"
    assert v.pick_job == "bucketed-25" and v.best_job == "bucketed-25"
    assert v.runs == {j.id: 3 for j in cp.jobs}
    assert v.figures["pick"].verdict == gj.MET and v.figures["pick"].value == 1.0
    assert "measured fastest" in v.figures["pick"].words
    assert v.figures["step"].verdict == gj.MET
    assert v.figures["step"].value == pytest.approx(1.0, abs=0.01)
    assert v.figures["exposed"].verdict == gj.NOT_MET  # 0.2 / 0.26 = 0.77: outside +-15 %
    assert "n=3 a side" in v.figures["exposed"].words
    assert v.dilation == [4.0] and v.alpha_measured_us == pytest.approx(3.1)
    assert v.wants == {}
    # the report: printed, and written to the folder
    assert gj.report(out) == 0
    text = (out / gj.TABLE_FILE).read_text()
    assert "the best of what was measured" in text and "tiny/2x4/1gbit" in text
    assert json.loads((out / gj.JSON_FILE).read_text())["cells"][0]["best_job"] == "bucketed-25"


def test_a_pick_slower_than_the_best_by_more_than_5_percent_is_not_met(tmp_path, monkeypatch):
    _, out = judged_folder(tmp_path, monkeypatch, [(1.300, 0.2), (1.301, 0.2), (1.299, 0.2)],
                           others=1.0)
    (v,) = gj.judge(out)
    assert v.best_job != "bucketed-25"
    assert v.figures["pick"].verdict == gj.NOT_MET
    assert v.figures["pick"].value == pytest.approx(1.3, rel=0.02)
    assert v.figures["step"].verdict == gj.NOT_MET  # predicted 1.0 against 1.3 measured


def test_below_three_runs_a_side_nothing_is_decided_and_more_runs_are_wanted(tmp_path,
                                                                           monkeypatch):
    _, out = judged_folder(tmp_path, monkeypatch, [(1.0, 0.2), (1.0, 0.2)], n=2)
    (v,) = gj.judge(out)
    assert {f.verdict for f in v.figures.values()} == {gj.UNDECIDED}
    assert "(2 runs: range" in v.figures["pick"].words
    assert v.wants["tiny/2x4/1gbit bucketed-25"] == 3
    assert gj.wanted(out, {"tiny/2x4/1gbit bucketed-25"}) == {"tiny/2x4/1gbit bucketed-25": 3}


def test_host_bound_runs_leave_the_cell_unjudged_and_want_no_more_runs(tmp_path, monkeypatch):
    _, out = judged_folder(tmp_path, monkeypatch, [(1.0, 0.2)] * 3,
                           bound="host-bound (CPU busy)")
    (v,) = gj.judge(out)
    assert {f.verdict for f in v.figures.values()} == {gj.UNDECIDED}
    assert "host-bound" in v.notes[0] and v.wants == {}


def test_a_small_exposed_sync_is_judged_on_its_share_and_an_unrun_cell_says_so(tmp_path,
                                                                             monkeypatch):
    _, out = judged_folder(tmp_path, monkeypatch, [(1.0, 0.01)] * 3)
    (v,) = gj.judge(out)
    assert "points of sync share" in v.figures["exposed"].words
    assert v.figures["exposed"].verdict == gj.UNDECIDED  # a 95 % interval needs 6 runs
    for f in (out / "mpirun").iterdir():
        f.unlink()
    (v,) = gj.judge(out)
    assert v.best_job is None and v.figures["pick"].verdict is None


# --- the command line ----------------------------------------------------------------------

@pytest.fixture
def no_hints(tmp_path, monkeypatch):
    """The dilation ladder starts from ranks / cores, not from this machine's last choice."""
    monkeypatch.setattr(rn, "HINTS", tmp_path / "hints.json")


def test_cells_are_ids_or_globs_and_held_out_cells_need_the_flag():
    grid = load_grid(GRID)
    cells, left = gr.select_cells(grid, None, False)
    assert [c.id for c in cells] == [c.id for c in grid.tuning]
    cells, left = gr.select_cells(grid, "resnet18/*", False)
    assert [c.id for c in cells] == ["resnet18/2x2/250mbit", "resnet18/2x2/4gbit",
                                     "resnet18/2x4/250mbit", "resnet18/2x4/4gbit"]
    assert left == ["resnet18/2x2/1gbit", "resnet18/2x4/1gbit"]
    assert [c.id for c in gr.select_cells(grid, None, True)[0]] == [c.id for c in grid.held_out]


@pytest.mark.parametrize("args, flag", [
    (["--cells", "resnet9/2x2/1gbit"], "--cells resnet9/2x2/1gbit: no such cell"),
    (["--cells", "resnet18/2x2/1gbit"], "add --held-out"),
    (["--cells", "*/*/1gbit"], "add --held-out"),
    (["--held-out", "--cells", "resnet18/2x2/1gbit", "--repeats", "2"], "--repeats 2"),
    (["--held-out", "--cells", "resnet18/2x2/1gbit", "--dilation", "4"], "--dilation 4"),
    (["--decide"], "--decide needs --budget"),
    (["--budget", "1h"], "--budget"),
    (["--decide", "--budget", "soon"], "--budget 'soon'"),
    (["--judge-only"], "-o/--output"),
    (["--judge-only", "--dry-run"], "--judge-only"),
])
def test_bad_input_exits_2_naming_the_flag_before_any_job(args, flag, tmp_path, capsys,
                                                         no_hints):
    out = tmp_path / "out"
    assert gr.main([*args, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("experiments.grid: error: ") and flag in err, err
    assert not out.exists()


def test_a_flag_of_the_wrong_form_exits_2_naming_it(tmp_path, capsys):
    for args, flag in ((["--dilation", "0.5"], "--dilation"), (["--repeats", "0"], "--repeats"),
                       ([gr.LATENCY_FLAG, "-1"], gr.LATENCY_FLAG)):
        with pytest.raises(SystemExit) as e:
            gr.main([*args, "-o", str(tmp_path / "o")])
        assert e.value.code == 2 and flag in capsys.readouterr().err


def test_a_file_as_the_output_folder_is_refused(tmp_path, capsys, no_hints):
    f = tmp_path / "f"
    f.write_text("")
    assert gr.main(["--cells", "gpt-tiny/2x2/4gbit", "-o", str(f)]) == 2
    assert "-o/--output" in capsys.readouterr().err


def test_dry_run_lists_each_cells_jobs_and_the_estimate_and_writes_nothing(tmp_path, capsys,
                                                                          no_hints):
    out = tmp_path / "grid"
    assert gr.main(["--dry-run", "--cells", "resnet18/2x2/250mbit,gpt-tiny/2x4/4gbit",
                    "-o", str(out)]) == 0
    text = capsys.readouterr().out
    head = text.splitlines()[0]
    assert head.startswith("# experiments.grid: 2 tuning cells, ") and "expected ~" in head
    # where the ladder starts: the smallest K with no more ranks than cores x K
    k4, k8 = (next(k for k in rn.AUTO_FACTORS if n <= (os.cpu_count() or 1) * k)
              for n in (4, 8))
    assert f"K = {', '.join(str(k) for k in sorted({k4, k8}))}" in head
    for cell in ("resnet18/2x2/250mbit", "gpt-tiny/2x4/4gbit"):
        assert f"# {cell}: compute x " in text and "advisor's top 3: " in text
        for ref in REFERENCE_IDS:
            assert f"{cell} {ref}: " in text  # the job, as the runner describes it
    assert (f"alpha {gr.HOST_ALPHA_US / k4:.3g} us (the host's 12.4 us / K = {k4}, the K its "
            "probes start at)") in text
    assert text.count("commbench.allreduce") >= 14
    assert not out.exists()
