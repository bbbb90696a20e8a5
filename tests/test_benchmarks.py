"""The toolkit's own benchmarks (each a ``experiments.bench.Benchmark`` on the one runner):
their jobs (tools' configurations run as sweep points), the commands their --dry-run
prints, and how they read records (not their figures)."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import shlex
import shutil
import warnings
from pathlib import Path

import pytest

from analysis import alphabeta, costmodel
from benchmarks import (
    async_speedup,
    hier_bound,
    horovod_presence,
    hostload_calibration,
    peer_fairness,
    replay_fidelity,
)
from commbench import allreduce, microbench, profile
from commbench.metrics import ring_bytes
from commbench.microbench import MicroConfig
from experiments import bench
from experiments import runner as rn
from experiments.bench import outdir_of, output_of
from experiments.job import Job
from experiments.runner import Runner, RunnerError, compared_sets
from launch import sweep as sweeps
from tests.conftest import ROOT

#: each tool's parser, by the module its configuration names
PARSE = {"commbench.allreduce": allreduce.parse_config,
         "commbench.microbench": microbench.parse_config,
         "commbench.profile": profile.parse_config}


def planned(module, argv: list[str], tmp_path) -> list[Job]:
    """The jobs a benchmark plans for ``argv`` with ``--outdir tmp_path``, as its ``main``
    plans them (the command line's ``--dilation`` applied)."""
    args = module.build_parser().parse_args(["--outdir", str(tmp_path), *argv])
    args.outdir = outdir_of(args, module.BENCHMARK.stem)  # as main: jobs may name files there
    return module.BENCHMARK.jobs(args)


def dry_run(module, argv: list[str], tmp_path, capsys) -> list[tuple[str, list[str]]]:
    """(the job's comment line, its command) of each job ``--dry-run`` prints."""
    assert module.main(["--dry-run", "--outdir", str(tmp_path), *argv]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) % 2 == 0 and all(c.startswith("# ") for c in lines[::2]), lines
    return [(c, shlex.split(cmd)) for c, cmd in zip(lines[::2], lines[1::2])]


def tool_args(argv: list[str], module: str) -> list[str]:
    """The tool's arguments in a printed command (after ``-m module``)."""
    i = argv.index("-m")
    assert argv[i + 1] == module, argv
    return argv[i + 2:]


ALL = [(peer_fairness, []), (async_speedup, ["--layouts", "2x1,4x2"]),
       (hier_bound, []), (horovod_presence, []),
       (replay_fidelity, ["--models", "resnet18", "--repeats", "2"]),
       (hostload_calibration, ["--bases", "1", "--launchers", "mpirun,horovodrun"])]


@pytest.mark.parametrize("module,argv", ALL, ids=lambda x: getattr(x, "__name__", ""))
def test_every_job_is_a_tools_configuration_that_parses_back(module, argv, tmp_path):
    """A job's command line is ``to_argv`` of its configuration: the tool reads it back as
    that configuration (no flag retyped by hand, no default written twice)."""
    jobs = planned(module, argv, tmp_path)
    assert jobs
    for job in jobs:
        if job.program == "commbench.profile":  # what the job will write, for the replay's
            shutil.copy(ROOT / "profiles/h200-resnet18-b64.json", output_of(job, tmp_path))
        out = str(tmp_path / "r.jsonl")
        parsed = PARSE[job.program]([*job.point()["args"], "--output", out])
        want = dataclasses.replace(job.config, output=out)
        if job.program == "commbench.allreduce":
            allreduce.resolve_defaults(want)
        assert parsed == want, job.name
        assert job.config.output is None  # the sweep names every job's file


@pytest.mark.parametrize("module,argv", ALL, ids=lambda x: getattr(x, "__name__", ""))
def test_dry_run_prints_each_jobs_command(module, argv, tmp_path, capsys):
    jobs = planned(module, argv, tmp_path)
    printed = dry_run(module, argv, tmp_path, capsys)
    # the jobs in the order of their sweeps (one per launcher, in the order jobs name it)
    order = list(dict.fromkeys(j.placement.launcher for j in jobs))
    jobs = sorted(jobs, key=lambda j: order.index(j.placement.launcher))
    assert [c for c, _ in printed] == [f"# {j.describe()}" for j in jobs]
    assert all(c.split(": ")[0].endswith(j.name) for j, (c, _) in zip(jobs, printed))
    files = set()
    for job, (_, cmd) in zip(jobs, printed):
        args = tool_args(cmd, job.program)
        assert args[:-2] == job.point()["args"]
        assert args[-2] == "--output" and args[-1].startswith(str(tmp_path))
        files.add(args[-1])
        launcher = "horovodrun" if job.placement.launcher == "horovodrun" else "mpirun"
        assert any(w.endswith(launcher) for w in cmd), cmd
        assert cmd[cmd.index("-np") + 1] == str(job.nranks)
    assert len(files) == len(jobs)  # a file each
    assert not any(tmp_path.iterdir())  # nothing made, nothing run


def test_dry_run_with_dilation_auto_prints_each_jobs_command_before_any_probe(tmp_path,
                                                                               capsys):
    """``--dilation auto``'s K is chosen by probes when the jobs run; a dry run prints each
    job's command as its sweep would run it (at K = 1), probes nothing, makes nothing."""
    argv = ["--dilation", "auto"]
    jobs = planned(hier_bound, argv, tmp_path)
    assert {j.placement.dilation for j in jobs} == {"auto"}
    printed = dry_run(hier_bound, argv, tmp_path, capsys)
    assert len(printed) == len(jobs)
    for job, (comment, cmd) in zip(jobs, printed):
        assert f" {job.name}: " in comment and "dilation auto" in comment
        assert cmd[cmd.index("-np") + 1] == str(job.nranks)
        assert tool_args(cmd, job.program)[:-2] == job.point()["args"]
    assert not any(tmp_path.iterdir())


def test_horovod_presence_runs_each_mode_on_each_layout(tmp_path, capsys):
    printed = dry_run(horovod_presence, ["--layouts", "2x1,2x4", "--cycle-ms", "1,50"],
                      tmp_path, capsys)
    assert len(printed) == 2 * 3
    modes = []
    for _, cmd in printed:
        args = tool_args(cmd, "commbench.microbench")
        assert args[args.index("--backend") + 1] == "mpi" and "--sync-each" in args
        assert args[args.index("--algo") + 1] == "native,ring,hier"
        modes.append(args[args.index("--horovod-cycle-ms") + 1]
                     if "--horovod-cycle-ms" in args else None)
    assert modes == [None, "1", "50"] * 2
    assert [cmd[cmd.index("-np") + 1] for _, cmd in printed] == ["2"] * 3 + ["8"] * 3


def test_peer_fairness_runs_each_launcher_as_its_own_sweep(tmp_path):
    jobs = planned(peer_fairness, [], tmp_path)
    models, layouts = list(peer_fairness.PROFILES), [(2, 1), (2, 2), (2, 4)]
    assert len(jobs) == len(models) * len(layouts) * 2
    assert [j.placement.launcher for j in jobs] == ["mpirun", "horovodrun"] * (len(jobs) // 2)
    assert [j.config.strategies for j in jobs[:2]] == [["bucketed", "ddp"],
                                                       ["bucketed", "horovod"]]
    runner = Runner(jobs, tmp_path)
    assert [s.launcher for s, _ in runner.sweeps()] == ["mpirun", "horovodrun"]
    assert {runner.outputs(j)[0].parent for j in jobs} == {tmp_path / "horovodrun",
                                                            tmp_path / "mpirun"}
    assert {(j.placement.nodes, j.placement.slots) for j in jobs} == set(layouts)
    # a cell's jobs, both launchers', are one compared set: they run at one K
    groups = compared_sets(jobs)
    assert len(groups) == len(models) * len(layouts)
    for g in groups:
        assert [j.placement.launcher for j in g] == ["mpirun", "horovodrun"]
        assert len({j.sets for j in g}) == 1


def test_peer_fairness_balances_backward_against_the_rings_link_bound(tmp_path):
    args = peer_fairness.build_parser().parse_args(["--models", "resnet50,gpt-tiny",
                                                    "--layouts", "2x1,2x4"])
    cells = {c.name: c for c in peer_fairness.cells(args)}
    for c in cells.values():
        bound_s = ring_bytes(c.profile.grad_bytes, c.ranks) * 8 / 1e9  # 1 Gbit/s
        assert c.bound_bytes == pytest.approx(ring_bytes(c.profile.grad_bytes, c.ranks))
        assert c.profile.backward_s * c.scale == pytest.approx(bound_s, rel=1e-3)
    assert cells["resnet50 2x1"].steps == 4  # seconds-long steps: --steps
    assert cells["gpt-tiny 2x1"].steps > 100  # millisecond steps: enough for 3 s measured
    half = peer_fairness.cells(peer_fairness.build_parser().parse_args(
        ["--models", "resnet50", "--layouts", "2x1", "--balance", "0.5"]))[0]
    assert half.scale == pytest.approx(cells["resnet50 2x1"].scale / 2, rel=1e-3)


def test_peer_fairness_variants_and_auto_reach_bucketed_only(tmp_path):
    jobs = planned(peer_fairness, ["--models", "resnet18", "--layouts", "2x2", "--bucket-mb",
                                   "auto", "--variants", "25/ring,auto/thread"], tmp_path)
    assert [j.name for j in jobs] == [
        "resnet18 2x2 mpirun", "resnet18 2x2 mpirun 25.0/ring", "resnet18 2x2 mpirun auto/thread",
        "resnet18 2x2 horovodrun", "resnet18 2x2 horovodrun 25.0/ring",
        "resnet18 2x2 horovodrun auto/thread"]
    assert [(j.config.sync.bucket_mb, j.config.sync.transfer) for j in jobs[:3]] == [
        ("auto", "auto"), (25.0, "ring"), ("auto", "thread")]
    assert all(j.config.strategies == ["bucketed"] for j in jobs if "/" in j.name)
    with pytest.raises(SystemExit):
        peer_fairness.build_parser().parse_args(["--variants", "25/nbc"])
    with pytest.raises(SystemExit):
        peer_fairness.build_parser().parse_args(["--models", "resnet9"])


def _summary(strategy: str, step: float, exposed: float, comm: float, **knobs) -> dict:
    return {"strategy": strategy, "step_s": step, "exposed_sync_s": exposed, "comm_s": comm,
            "link_gbps": 1.0, "knobs": knobs,
            "stats": {"step_s": {"median": step, "p5": step, "p95": step}}}


def _cell(model="resnet50", layout="2x1"):
    args = peer_fairness.build_parser().parse_args(["--models", model, "--layouts", layout])
    return peer_fairness.cells(args)[0]


def test_peer_fairness_judges_bucketed_against_the_best_peer_of_the_cell():
    cell = _cell()
    bound_s = cell.bound_bytes * 8 / 1e9
    runs = {"mpirun": [_summary("bucketed", 2.0, 0.20, bound_s / 0.9, bucket_mb=25.0),
                       _summary("ddp", 2.1, 0.21, bound_s / 0.95, bucket_cap_mb=25.0)],
            "mpirun auto/ring": [_summary("bucketed", 1.9, 0.10, bound_s,
                                          bucket_mb=4.0, bucket_mb_auto={"chosen": 4.0})],
            "horovodrun": [_summary("bucketed", 2.2, 0.3, bound_s),
                           _summary("horovod", 2.05, 0.25, bound_s)]}
    v = peer_fairness.judge(cell, runs)
    # judged on the launchers' own jobs: mpirun's bucketed (2.0) against Horovod (2.05)
    assert v.step.value == pytest.approx(2.0 / 2.05) and v.step.kind == "single"
    assert v.exposed.value == pytest.approx(0.2 / 0.25)
    assert v.link.value == pytest.approx(0.9)
    # one run a side is never judged on its value
    assert v.met == {"step": "undecided", "exposed": "undecided", "link": "undecided"}
    assert "horovod, horovodrun" in v.lines[0] and "repeats" not in v.lines[0]
    assert f"step undecided (1 run: {2.0 / 2.05:.3f}) [undecided]" in v.lines[0], v.lines[0]
    variant = next(x for x in v.lines if "auto/ring" in x)
    assert "cap 4* MB" in variant and f"step {1.9 / 2.1:.3f}" in variant
    failed = peer_fairness.judge(cell, {"mpirun": runs["mpirun"][:1]})
    assert failed.step is None and "no verdict" in failed.lines[0]
    assert failed.met == {"step": None, "exposed": None, "link": None}


def _repeats(strategy: str, steps: list[float], exposed: list[float], comm_s: float) -> list:
    return [_summary(strategy, st, ex, comm_s) | {"repeat": r}
            for r, (st, ex) in enumerate(zip(steps, exposed))]


def test_peer_fairness_decides_each_goal_on_the_paired_repeats():
    cell = _cell()
    bound_s = cell.bound_bytes * 8 / 1e9
    # two repeats a side: a range, never a verdict
    runs = {"mpirun": _repeats("bucketed", [0.93, 0.95], [0.10, 0.12], bound_s)
            + _repeats("ddp", [1.00, 1.02], [0.20, 0.22], bound_s),
            "horovodrun": _repeats("bucketed", [1.2, 1.3], [0.4, 0.5], bound_s)
            + _repeats("horovod", [0.94, 1.10], [0.11, 0.30], bound_s)}
    v = peer_fairness.judge(cell, runs)
    assert v.step.kind == "range" and v.step.n == 2
    # the best peer is the lower median: DDP's 1.01 against Horovod's 1.02
    assert v.step.value == pytest.approx(0.94 / 1.01)
    assert v.met == {"step": "undecided", "exposed": "undecided", "link": "undecided"}
    assert "ddp, mpirun" in v.lines[0] and "2 repeats" in v.lines[0]
    assert "step undecided (2 runs: range 0.930-0.931)" in v.lines[0], v.lines[0]
    # four repeats a side, bucketed ~7 % faster than DDP, steady; Horovod noisy around it:
    # against Horovod the interval straddles 1, so the step goal is undecided
    ddp = _repeats("ddp", [1.00, 1.02, 1.01, 1.01], [0.20, 0.22, 0.21, 0.21], bound_s)
    runs = {"mpirun": _repeats("bucketed", [0.93, 0.95, 0.94, 0.94],
                               [0.10, 0.12, 0.11, 0.11], bound_s) + ddp,
            "horovodrun": _repeats("bucketed", [1.2, 1.3, 1.2, 1.3], [0.4, 0.5, 0.4, 0.5],
                                   bound_s)
            + _repeats("horovod", [0.95, 1.10, 0.92, 1.08], [0.3, 0.3, 0.3, 0.3], bound_s)}
    v = peer_fairness.judge(cell, runs)
    assert v.met["step"] == "undecided" and v.met["exposed"] == "met", v.lines[0]
    assert "95% CI" in v.lines[0] and "n=4 a side, best of 4" in v.lines[0], v.lines[0]
    # bucketed decisively slower than one peer: NOT met, whatever the other
    runs["horovodrun"][4:] = _repeats("horovod", [0.80, 0.82, 0.81, 0.80], [0.3] * 4, bound_s)
    assert peer_fairness.judge(cell, runs).met["step"] == "NOT met"
    # decisively faster than both: met
    runs["horovodrun"][4:] = _repeats("horovod", [1.03, 1.05, 1.04, 1.04], [0.3] * 4, bound_s)
    assert peer_fairness.judge(cell, runs).met["step"] == "met"
    # a side with a host-bound run holds this machine: neither met nor NOT met, said so;
    # its set-up's verdict (the outcome rule, setup_bound) is read before its counter's
    runs["horovodrun"][5]["bound"] = "host-bound (rank 1 spent 9% of the window)"
    v = peer_fairness.judge(cell, runs)
    assert v.met == {"step": "undecided", "exposed": "undecided", "link": "undecided"}
    assert "1 compared runs host-bound (horovod): the goals are not judged" in v.lines[0]
    assert peer_fairness.bound_of(runs["horovodrun"][5]) == "host-bound"
    runs["horovodrun"][5]["setup_bound"] = "link-bound"
    assert peer_fairness.judge(cell, runs).met["step"] == "met"
    assert peer_fairness.bound_of(runs["horovodrun"][5]) == "link-bound*"
    # an exposed sync that swings across 1.10 of the best peer's: undecided
    runs["mpirun"][:4] = _repeats("bucketed", [0.93, 0.95, 0.94, 0.94],
                                  [0.15, 0.30, 0.15, 0.30], bound_s)
    assert peer_fairness.judge(cell, runs).met["exposed"] == "undecided"


def test_peer_fairness_tallies_each_goals_verdicts():
    v = [peer_fairness.Verdict("c", None, None, None, met, [])
         for met in ({"step": "met", "exposed": "met", "link": "met"},
                     {"step": "undecided", "exposed": "met", "link": "NOT met"},
                     {"step": None, "exposed": None, "link": None})]
    line = peer_fairness.tally(v)
    assert line.startswith("goals met in 3 cells: step <= 1.00 in 1 (1 undecided), ")
    assert "exposed sync <= 1.10 in 2, link efficiency >= 0.95 in 1 (1 NOT met)" in line


def test_peer_fairness_repeats_each_job_and_reads_every_repeats_file(tmp_path):
    jobs = planned(peer_fairness, ["--models", "resnet18", "--layouts", "2x2", "--repeats",
                                   "3"], tmp_path)
    assert [j.repeats for j in jobs] == [3, 3] and all(j.point()["repeats"] == 3 for j in jobs)
    runner = Runner(jobs, tmp_path)
    sweeps_of = runner.sweeps()
    assert sorted(j.name for _, mine in sweeps_of for j in mine) == sorted(j.name for j in jobs)
    for sweep, mine in sweeps_of:
        for job in mine:
            # the files the sweep writes, repeat by repeat, are the ones read back
            written = sorted(f"{i}.jsonl" for i, p, _ in sweep.jobs() if p["name"] == job.name)
            assert len(written) == 3
            assert sorted(p.name for p in runner.outputs(job)) == written
            assert runner.outputs(job)[0] == output_of(job, runner.outputs(job)[0].parent)
    # repeats are not part of a job's identity: one run's files stay repeat 0's
    one = Runner(planned(peer_fairness, ["--models", "resnet18", "--layouts", "2x2"],
                         tmp_path), tmp_path)
    assert [one.outputs(j)[0] for j in one.jobs] == [runner.outputs(j)[0] for j in jobs]
    for bad in ("0", "two", "-1"):
        with pytest.raises(SystemExit):
            peer_fairness.build_parser().parse_args(["--repeats", bad])


def test_peer_fairness_prints_every_repeats_rows_and_the_verdict_over_them(tmp_path,
                                                                          monkeypatch, capsys):
    """main() on records where the sweep leaves them: each repeat's file read, each repeat
    a row, the verdict on the spread over the repeats."""
    argv = ["--models", "resnet18", "--layouts", "2x1", "--repeats", "2", "--launchers",
            "mpirun", "--outdir", str(tmp_path)]
    runner = Runner(planned(peer_fairness, argv, tmp_path), tmp_path.resolve())
    [job] = runner.jobs
    steps = {"bucketed": [0.90, 0.92], "ddp": [1.00, 1.01]}
    for r, path in enumerate(runner.outputs(job)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(_summary(k, v[r], v[r] / 10, 0.5) | {
            "kind": "summary", "repeat": r, "compute_s": 0.5}) + "\n" for k, v in steps.items()))
    swept = []  # the runner's sweeps, as run: every job already there, nothing to run
    monkeypatch.setattr(rn, "check_machine", lambda: None)
    monkeypatch.setattr(sweeps, "run_sweep", lambda sw, log=None: swept.append(sw) or {
        "done": 0, "failed": 0, "skipped": len(sw.jobs())})
    assert peer_fairness.main(argv) == 0
    assert [Path(sw.output) for sw in swept] == [tmp_path.resolve()]
    out = capsys.readouterr().out
    for r in (0, 1):
        assert f"resnet18 2x1 mpirun r{r}" in out
    assert "2 repeats" in out and "undecided (2 runs: range 0.900-0.911) [undecided]" in out
    assert "step <= 1.00 in 0 (1 undecided)," in out


def test_replay_fidelity_replays_the_file_its_profile_job_writes(tmp_path):
    """The replay's configuration names the profile job's results file before either runs:
    the runner's file for that job (planned before any job ran, as a run plans them)."""
    jobs = planned(replay_fidelity, ["--models", "resnet18", "--repeats", "1"], tmp_path)
    prof, real, replay = jobs
    assert prof.program == "commbench.profile" and real.config.workload == "real"
    runner = Runner(jobs, tmp_path)
    assert replay.config.compute_profile == str(runner.outputs(prof)[0]) \
        == str(output_of(prof, tmp_path))
    assert {(j.placement.nodes, j.placement.slots, j.placement.rate) for j in jobs} == {
        (1, 1, "none")}
    assert len(compared_sets(jobs)) == 1  # the model's three jobs: one compared set


def test_jobs_on_uneven_layouts_and_repeated_names(tmp_path):
    job = Job.place("uneven", MicroConfig(), 2, (3, 1), "1gbit")
    assert job.nranks == 4 and job.point()["slots"] == [3, 1]
    [(sweep, _)] = Runner([job], tmp_path).sweeps()
    assert sweep.points()[0]["slots"] == [3, 1]
    with pytest.raises(RunnerError, match="repeat"):
        Runner([job, job], tmp_path)


@pytest.mark.parametrize("nodes,slots", [(2, 1), (2, 4), (4, 2)])
def test_hier_bound_takes_the_cost_models_link_bytes(nodes, slots):
    case = hier_bound.Case(nodes, slots, "1gbit", 64 << 20)
    p, size = nodes * slots, case.size
    for algo in hier_bound.ALGOS:
        assert hier_bound.case_link_bytes(algo, case) == costmodel.link_bytes(
            algo, size, p, nodes, slots)
    assert hier_bound.case_link_bytes("ring", case) == ring_bytes(size, p)
    assert hier_bound.case_link_bytes("hier", case) == ring_bytes(size, nodes)
    assert hier_bound.case_link_bytes("native", case) == min(
        costmodel.link_bytes(a, size, p, nodes, slots) for a in alphabeta.FLAT_ALGOS)


def test_hier_bound_cases_take_the_tools_sizes():
    assert hier_bound.parse_case("2x4@200mbit@16M") == hier_bound.Case(2, 4, "200mbit",
                                                                      16 << 20)
    for bad in ("2x4@16M", "2x4@1gbit@16X"):
        with pytest.raises(Exception, match="16"):
            hier_bound.parse_case(bad)


def test_records_read_through_the_results_reader(tmp_path):
    path = tmp_path / "r.jsonl"
    assert bench.records(path, "summary") == []  # a failed job wrote nothing
    good = [{"kind": "summary", "x": 1}, {"kind": "step", "x": 2}]
    path.write_text("".join(json.dumps(r) + "\n" for r in good) + '{"kind": "summ')
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        # truncated last line; each record says its file (the set-up's verdict is beside it)
        assert bench.records(path, "summary") == [{**good[0], "_file": str(path)}]
    assert any("truncated last line" in str(w.message) for w in seen)
    path.write_text('{"kind": "summary"}\nnot json\n{"kind": "summary"}\n')
    with pytest.raises(ValueError, match=r"r\.jsonl:2: not a JSON record"):
        bench.records(path, "summary")


def test_the_runner_runs_one_sweep_per_launcher_between_load_readings(tmp_path,
                                                                      monkeypatch):
    ran = []
    monkeypatch.setattr(rn, "check_machine", lambda: None)
    monkeypatch.setattr(sweeps, "run_sweep",
                        lambda s, log=None: ran.append(s) or {"done": 1, "failed": len(ran) - 1,
                                                              "skipped": 0})
    jobs = planned(peer_fairness, [], tmp_path)
    log = io.StringIO()
    runner = Runner(jobs, tmp_path, log=log)
    counts = runner.run()
    assert [s.launcher for s in ran] == ["mpirun", "horovodrun"] and runner.failed == 1
    assert counts == {"done": 2, "failed": 1, "skipped": 0}
    out = log.getvalue()
    assert "# load average" in out and "before the first job" in out
    assert "after the jobs" in out
    assert out.index("before the first job") < out.index("failed") < out.index("after the jobs")
    assert f"{tmp_path / 'horovodrun'}/*.failed.json" in out
    # a benchmark's results folder: --outdir as given (absolute), else results/<stem>-<time>
    rel = outdir_of(argparse.Namespace(outdir=Path("x")), "pf")
    assert rel.is_absolute() and rel.name == "x"
    assert outdir_of(argparse.Namespace(outdir=tmp_path), "pf") == tmp_path.resolve()
    default = outdir_of(argparse.Namespace(outdir=None), "pf")
    assert default.parent == bench.ROOT / "results" and default.name.startswith("pf-")


def _calib_rows(launcher: str, algo: str, times: dict[float, list[float]],
                bound: str = "link-bound") -> list[dict]:
    return [{"_launcher": launcher, "algo": algo, "size": 1 << 20, "dilation": k,
             "time_us": {"avg": t}, "bound": bound, "latency_bound": False}
            for k, ts in times.items() for t in ts]


def test_hostload_calibration_scores_each_rule_against_k_and_4k():
    """The reference is K against 4K (converged inside +-5 %, moved wholly outside, else
    unresolved); the counter rule is each run's recorded verdict, the outcome rule K
    against 2K."""
    flat = {1.0: [100, 101, 102], 2.0: [100, 101, 99], 4.0: [101, 100, 102]}
    host = {1.0: [150, 152, 151], 2.0: [120, 121, 119], 4.0: [100, 101, 99]}
    noisy = {1.0: [100, 130, 90], 2.0: [100, 101, 99], 4.0: [100, 101, 99]}
    rows = (_calib_rows("mpirun", "native", flat)            # converged, counted link: agree
            + _calib_rows("mpirun", "ring", host)            # moved, counted link: disagree
            + _calib_rows("torchrun", "native", flat, "host-bound (x)")  # converged, host
            + _calib_rows("horovodrun", "native", noisy))    # unresolved
    cs = {(c["library"], c["algo"]): c for c in hostload_calibration.cells(rows, [1.0])}
    assert cs["Open MPI", "native"]["reference"] == "converged"
    assert cs["Open MPI", "native"]["counter_agrees"] is True
    assert cs["Open MPI", "native"]["outcome_agrees"] is True
    assert cs["Open MPI", "ring"]["reference"] == "moved"
    assert cs["Open MPI", "ring"]["counter_agrees"] is False
    assert cs["Open MPI", "ring"]["outcome"] == "host" and cs["Open MPI", "ring"]["outcome_agrees"]
    assert cs["Gloo", "native"]["counter_agrees"] is False
    assert cs["Horovod", "native"]["reference"] == "unresolved"
    assert cs["Horovod", "native"]["counter_agrees"] is None
    lines = hostload_calibration.score(list(cs.values()))
    assert next(x for x in lines if x.startswith("Open MPI")) == (
        "Open MPI: 2 of 2 cells resolved; counter rule 1 agree, 1 disagree, 0 no verdict; "
        "outcome rule 2 agree, 0 disagree, 0 no verdict")
    assert hostload_calibration.factors([1.0, 4.0]) == [1.0, 2.0, 4.0, 8.0, 16.0]


def test_hostload_calibration_training_cells(tmp_path):
    """--cells training plans DDP on Gloo and bucketed on each transfer path per launcher
    (and Horovod's optimizer), one job each per K; a run's summary becomes a cell row named
    by its strategy and transfer path, its figure the median step."""
    jobs = planned(hostload_calibration, ["--cells", "training", "--bases", "1"], tmp_path)
    got = {(j.placement.launcher, tuple(j.config.strategies),
            getattr(j.config.sync, "transfer", None), j.placement.k) for j in jobs}
    assert len(got) == len(jobs) == 3 * len(hostload_calibration.TRAINING)
    assert ("torchrun", ("ddp", "bucketed"), "thread", 1.0) in got
    assert ("mpirun", ("bucketed",), "hier", 4.0) in got
    assert all(j.program == "commbench.allreduce" for j in jobs)
    summary = {"strategy": "bucketed", "knobs": {"transfer_path": "ring"}, "grad_bytes": 8,
               "dilation": 2.0, "stats": {"step_s": {"median": 0.25}}, "bound": "link-bound",
               "latency_bound": False}
    r = hostload_calibration.training_row(summary, "torchrun")
    assert (r["algo"], r["size"], r["time_us"]["avg"]) == ("bkt/ring", 8, 250000.0)
    ddp = hostload_calibration.training_row({**summary, "strategy": "ddp"}, "torchrun")
    c = hostload_calibration.cells(
        [{**ddp, "dilation": k, "time_us": {"avg": t}} for k in (1.0, 2.0, 4.0)
         for t in (100, 101, 102)], [1.0])
    assert [(x["library"], x["algo"], x["reference"]) for x in c] == [("Gloo", "ddp",
                                                                         "converged")]


def _async_repeats(flat: list[float], async1: list[float], compute_s: float = 0.3,
                   comm_s: float = 0.5) -> list:
    """Repeats of one layout: flat's and async S=1's wall throughput (samples/s) a repeat,
    flat's step compute + comm (bound (0.3 + 0.5) / 0.5 = 1.6x)."""
    def summary(strategy: str, rate: float) -> dict:
        step = compute_s + comm_s
        return {"strategy": strategy, "wall_throughput": rate, "compute_s": compute_s,
                "comm_s": comm_s, "stats": {"step_s": {"median": step}},
                "bound": "link-bound", "knobs": {}}
    return [async_speedup.Repeat(r, {"flat": summary("flat", f), "async1": summary("async", a)})
            for r, (f, a) in enumerate(zip(flat, async1))]


def test_async_speedup_decides_its_goals_on_the_paired_repeats():
    assert async_speedup.speedup_bound(_async_repeats([10.0], [14.0])[0].by["flat"]) \
        == pytest.approx(1.6)
    # two repeats: a range, never a verdict
    lines = async_speedup.judge(_async_repeats([10.0, 10.2], [14.0, 14.5]))
    assert lines[0].startswith("goal async S=1 / flat >= 1.30: undecided (2 runs: range")
    assert lines[0].endswith("[undecided]") and lines[1].endswith("[undecided]")
    # four steady repeats at 1.40x: the speed-up goal met; 1.40 / 1.6 = 0.875 of the bound,
    # decisively below 0.90: NOT met
    reps = _async_repeats([10.0, 10.1, 9.9, 10.0], [14.0, 14.15, 13.85, 14.0])
    lines = async_speedup.judge(reps)
    assert "n=3 a side" in lines[0] and lines[0].endswith("[met]"), lines
    assert lines[1].startswith("goal async S=1 / (flat x its bound) >= 0.90: 0.875")
    assert lines[1].endswith("[NOT met]"), lines
    # a host-bound run (its set-up's verdict read first): neither met nor NOT met, said so
    reps[2].by["async1"]["bound"] = "host-bound (rank 3 spent 12% of the window)"
    lines = async_speedup.judge(reps)
    assert lines[0].endswith("[undecided]") and "1 compared runs host-bound (async)" in lines[2]
    reps[2].by["async1"]["setup_bound"] = "link-bound"
    assert async_speedup.judge(reps)[0].endswith("[met]")
    assert async_speedup.verdict_of(list(reps[2].by.values())) == "link"
