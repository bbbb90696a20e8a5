"""The experiment layer: the same planned jobs as before it, the runner's compared sets and
its Ctrl-C, bad input, and the time estimate against recorded job seconds."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from experiments import EXPERIMENTS
from experiments import claims as cl
from experiments import study as st
from experiments.job import CLUSTER_S, Job, Placement
from experiments.runner import Runner, RunnerError, compared_sets
from launch.execute import INTERRUPTED
from tests.conftest import PY, ROOT, ctrl_c_reaches_it, read_jsonl

DATA = Path(__file__).parent / "data"
#: (program, sorted argv, placement) of every job the study and the benchmarks planned before
#: the experiment layer (launch.study.plan, benchmarks.cluster_jobs at 382f575), at K = 4
BEFORE = json.loads((DATA / "planned_jobs.json").read_text())
#: the quick study's scale as it was then (the quick study is smaller now)
QUICK_BEFORE = replace(st.QUICK, model="resnet18", profile="h200-resnet18-b64.json", batch=64,
                       compute_scale=50.0, steps=6, warmup=1, every_rank=False,
                       rates=("1gbit", "200mbit"),
                       fast_algos=("native", "ring", "hier", "hier-leader"),
                       slow_algos=("ring", "hier"), bucket_mb=(0, 25), staleness=(0, 1, 4),
                       accum=(1, 4), real_batches=(16, 64, 128), real_steps=40,
                       conv_steps=100, conv_staleness=(0, 1, 2, 4), conv_mitigations="none,lr",
                       conv_seeds=(0, 1, 2), conv_lrs=(0.02,), conv_momenta=(0.9,),
                       conv_ps=False, profile_batches=(),
                       micro_iters=5, micro_max=64 << 20, repeats=2)
BENCHMARKS = ("async_speedup", "dilation", "hier_bound", "horovod_presence", "peer_fairness",
              "replay_fidelity")


def planned(jobs: list[Job]) -> list[dict]:
    def one(j: Job) -> dict:
        p = j.placement
        # the repository's own path stands as <ROOT>, so a clone anywhere plans the same jobs
        argv = sorted(a.replace(str(ROOT), "<ROOT>") for a in j.args)
        return {"program": j.program, "argv": argv,
                "placement": {"nodes": p.nodes, "slots": p.slots if isinstance(p.slots, int)
                              else list(p.slots), "rate": p.rate, "launcher": p.launcher,
                              "ranks": j.nranks, "dilation": float(p.k)}}
    return sorted((one(j) for j in jobs), key=json.dumps)


#: the full study as it was then: one training setting for the convergence study
FULL_BEFORE = replace(st.FULL, conv_lrs=(0.02,), conv_momenta=(0.9,))


@pytest.mark.parametrize("label,scale", [("quick", QUICK_BEFORE), ("full", FULL_BEFORE)])
def test_the_study_plans_the_same_jobs_as_before(label, scale):
    cluster = cl.StudyCluster(Placement(2, 4, launcher="mpirun", dilation=4.0))
    assert planned(cl.plan(scale, cluster)) == BEFORE[f"study-{label}"]


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_plans_the_same_jobs_as_before(name):
    mod = importlib.import_module(f"benchmarks.{name}")
    args = mod.build_parser().parse_args([] if name == "dilation" else ["--dilation", "4"])
    args.outdir = Path("/OUT")  # replay_fidelity's replays name the profiles' files there
    assert planned(mod.BENCHMARK.jobs(args)) == BEFORE[name]


def test_every_benchmark_is_an_experiment():
    assert {f"benchmarks.{b}" for b in BENCHMARKS} <= set(EXPERIMENTS.values())
    for module in EXPERIMENTS.values():
        assert callable(importlib.import_module(module).main)


def test_a_shared_job_joins_its_claims_sets():
    """The 8-rank flat run is C1's, C2's, C3's, C4's and C7's, so their jobs (both of C2's
    rates, C4's convergence study) are one compared set, at one K; in the quick study C5, C6
    and C8 share only the real runs, a set of their own."""
    cluster = cl.StudyCluster(Placement(2, 4, dilation="auto"))
    jobs = cl.plan(st.QUICK, cluster)
    ref = next(j for j in jobs if j.name == "flat-np8")
    assert {"C1", "C2", "C3", "C4", "C7"} <= ref.sets
    groups = compared_sets(jobs)
    names = [{j.name for j in g} for g in groups]
    assert any({"flat-np8", "async-s1", "bucketed-25mb", "convergence-digits-lr0.02-m0.9"} <= n
               for n in names)
    assert any({"real-digits-b16", "real-digits-b64"} <= n for n in names)
    assert sum(len(g) for g in groups) == len(jobs)


def test_compared_sets_are_transitive_and_a_job_without_sets_stands_alone():
    def job(name, *sets):
        return Job(name, object(), Placement(1, 1), sets=frozenset(sets))

    jobs = [job("a", "x"), job("b", "y"), job("c", "x", "y"), job("d"), job("e", "z")]
    assert [[j.name for j in g] for g in compared_sets(jobs)] == [["a", "b", "c"], ["d"], ["e"]]


def test_a_job_is_priced_with_its_dilation_and_start_up():
    cluster = cl.StudyCluster(Placement(2, 4, dilation=4.0))
    ref = next(j for j in cl.plan(st.QUICK, cluster) if j.name == "flat-np8")
    at1, at4 = ref.estimate_s(1.0), ref.estimate_s(4.0)
    sec = ref.seconds()
    assert at4 - at1 == pytest.approx(3 * sec.dilated)  # only the emulated part stretches
    assert at1 > sec.wall_s(1.0)  # start-up on top
    assert ref.timeout() >= 600


def test_an_unknown_experiment_exits_2_listing_those_that_do():
    res = subprocess.run([PY, "-m", "experiments", "no_such_thing"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "no experiment 'no_such_thing'" in res.stderr
    assert all(name in res.stderr for name in EXPERIMENTS)


def study(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "experiments.study", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_a_budget_below_one_round_of_a_claim_exits_2_before_anything_runs(tmp_path):
    out = tmp_path / "s"
    res = study("--quick", "--claims", "C2", "--repeat-until", "5", "--budget", "1m",
                "-o", str(out))
    assert res.returncode == 2, res.stderr
    assert "C2's jobs need" in res.stderr and "for one round" in res.stderr
    assert not out.exists()


def test_a_folder_of_the_previous_layout_exits_2_saying_why(tmp_path):
    out = tmp_path / "old"
    out.mkdir()
    (out / "dilation.json").write_text("{}")  # what launch.study's dilation auto wrote
    res = study("--quick", "-o", str(out))
    assert res.returncode == 2
    assert "previous layout" in res.stderr and "new folder" in res.stderr


def _gone(pattern: str, grace_s: float = 10.0) -> bool:
    """Whether no process whose command line holds ``pattern`` (this test's own output
    folder: not another job on the machine) is left, within ``grace_s``: the sweep's exit
    ends its process group, and the ranks' exits reach the process table a moment later."""
    deadline = time.time() + grace_s
    while subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0:
        if time.time() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.mark.mpi
def test_ctrl_c_stops_a_sweep_with_one_line_and_the_same_command_resumes(tmp_path):
    """SIGINT of a real sweep: one line, exit 130, no traceback; run again, the point cut in
    the middle runs anew and every point's file holds its runs once."""
    out = tmp_path / "sw"
    args = [PY, "-m", "launch.sweep", "--set", "ranks=1,2", "--set", "algo=native,ring",
            "-o", str(out), "--", "--model", "smallcnn", "--steps", "4", "--warmup", "1",
            "--compute-ms", "200"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=ctrl_c_reaches_it)
    try:
        deadline = time.time() + 300
        while not list(out.glob("*.done.json")) and time.time() < deadline:
            time.sleep(0.2)
        assert list(out.glob("*.done.json")), "no point finished"
        time.sleep(2)  # into the next point
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == (
        f"launch.sweep: {INTERRUPTED}")
    assert _gone(str(out)), "a rank of the cut sweep outlived it"
    first = {p.name: p.stat().st_mtime for p in out.glob("*.done.json")}
    res = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"{len(first)} of 4 points already done" in res.stderr
    assert len(list(out.glob("*.done.json"))) == 4
    assert all((out / n).stat().st_mtime == t for n, t in first.items())
    for f in out.glob("*.jsonl"):
        runs = [r for r in read_jsonl(f) if r.get("kind") == "summary"]
        assert len(runs) == 1, f  # one run a point: nothing of the cut run kept twice


def test_runner_names_each_repeats_file_and_a_dry_run_prints_every_command(tmp_path, capsys):
    cluster = cl.StudyCluster(Placement(2, 4, dilation=2.0))
    jobs = cl.plan(st.QUICK, cluster, [cl.BY_ID["C7"]])
    runner = Runner(jobs, tmp_path, repeats=2)
    files = runner.outputs(jobs[0])
    assert len(files) == 2 and files[1].name == files[0].name.replace(".jsonl", "-r1.jsonl")
    runner.dry_run()
    printed = capsys.readouterr().out
    assert printed.count("mpirun -np") == len(jobs)
    assert "COMMBENCH_DILATION=2" in printed


def test_the_experiment_package_is_installed_and_in_the_image():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"experiments*"' in pyproject
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert "COPY experiments experiments" in dockerfile
    assert "experiments/__init__.py" in dockerfile  # the editable install finds it
    assert "!experiments" in (ROOT / ".dockerignore").read_text().splitlines()


def test_a_chosen_k_serves_every_set_that_shares_a_name_and_its_clusters(tmp_path):
    """A study run for C2 alone, then for every claim, keeps C2's K; two earlier choices
    that disagree for one set are refused; files are not named before a K is chosen."""
    cluster = cl.StudyCluster(Placement(2, 4, dilation="auto"))
    c2 = Runner(cl.plan(st.QUICK, cluster, [cl.BY_ID["C2"]]), tmp_path)
    with pytest.raises(RunnerError, match="no K chosen yet"):
        c2.outputs("flat-np8")
    assert "COMMBENCH_DILATION" not in " ".join(a for _, argv in c2.commands() for a in argv)
    c2.chosen = {"C2": {"dilation": 16.0, "sets": ["C2"], "clusters": ["mpirun:2x4@4gbit"]}}
    everything = Runner(cl.plan(st.QUICK, cluster), tmp_path)
    everything.chosen = c2.chosen
    ks = {j.name: j.placement.dilation for j in everything.resolved()}
    assert ks["flat-np8"] == ks["accum-k4"] == 16.0  # C7 shares flat-np8 with C2
    assert ks["real-digits-b16"] == 1.0  # the host's compute: K = 1 under auto
    assert everything.outputs("flat-np8")[0].parent == tmp_path
    everything.chosen = {**c2.chosen, "C7": {"dilation": 8.0, "sets": ["C7"],
                                             "clusters": ["mpirun:2x4@4gbit"]}}
    with pytest.raises(RunnerError, match="K = 8, 16"):
        everything.resolved()


@pytest.mark.parametrize("text,seconds", [("90m", 5400), ("1h30m", 5400), ("3600", 3600),
                                          ("45s", 45)])
def test_durations(text, seconds):
    assert st.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["1h30", "soon", "0m", ""])
def test_bad_durations(text):
    with pytest.raises(st.StudyError, match="--budget"):
        st.parse_duration(text)


def test_dilation_auto_given_is_the_default():
    a = st.build_parser().parse_args(["--dilation", "auto"])
    assert st.make_cluster(a).placement.dilation == "auto"


def test_the_estimate_is_within_30_percent_of_recorded_job_seconds():
    """Every job of a recorded quick study (``job_seconds.json``: each job's wall seconds from
    its ``.done.json``, its K, and whether it brought its cluster up) against its estimate at
    that K, planned from the scale it ran with."""
    data = json.loads((DATA / "job_seconds.json").read_text())
    scale = cl.Scale(**{k: tuple(v) if isinstance(v, list) else v
                        for k, v in data["scale"].items()})
    jobs = {j.name: j for j in cl.plan(scale, cl.StudyCluster(Placement(2, 4, dilation="auto")))}
    assert len(data["jobs"]) == 31
    off = []
    for rec in data["jobs"]:
        job = jobs[rec["name"]]
        if job.placement.dilation == "auto":
            job = job.at(rec["dilation"])
        assert job.placement.k == rec["dilation"], rec  # host jobs ran at K = 1 under auto
        est = job.estimate_s() + (CLUSTER_S if rec["first_on_cluster"] else 0.0)
        if not 0.7 <= est / rec["seconds"] <= 1.3:
            off.append(f"{rec['name']} r{rec['repeat']}: {est:.0f} s for {rec['seconds']:.0f}")
    assert off == []


def test_the_expected_time_names_the_k_it_assumes(tmp_path):
    """Without a remembered K the study prices its compared set at the probes' first rung and
    two rungs up (the quick study's probes climbed from 4 to 16 on 2 cores); with one, at it."""
    env = {**os.environ, "COMMBENCH_CACHE": str(tmp_path)}
    args = [PY, "-m", "experiments.study", "--quick", "--dry-run", "-o", str(tmp_path / "s")]
    fresh = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert fresh.returncode == 0, fresh.stderr
    head = fresh.stdout.splitlines()[0]
    assert "the probes' first rung, to ~" in head, head
    hint = {"commbench.allreduce:mpirun:2x4@4gbit:8:resnet18": 16.0}
    (tmp_path / "dilation-hints.json").write_text(json.dumps(hint))
    known = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert "at K = 16, the last K chosen here" in known.stdout.splitlines()[0]
