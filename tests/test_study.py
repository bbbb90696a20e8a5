"""The whole study in one command (``experiments.study``, its claims' plans in
``experiments.claims``): its plan gives each claim a matched set, bad input exits 2
before any job, a second run resumes, repeats are added until a precision or the budget,
and a tiny study runs end to end."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from analysis import match
from analysis.load import get, knob, num
from commbench import allreduce
from commbench.jobtime import LINK_EFFICIENCY
from experiments import claims as cl
from experiments import study
from experiments.claims import Scale, StudyCluster
from experiments.job import STARTUP_S, Job, Placement
from experiments.runner import Runner
from experiments.study import FULL, QUICK
from launch import commands, links
from launch.cluster import parse_rate
from tests.conftest import PY, ROOT, read_jsonl

#: the study's default cluster at K = 1 (``make_cluster`` gives it K = auto: the runner's)
EMULATED = StudyCluster(Placement(2, 4))
TORCHRUN = StudyCluster(Placement(2, 4, launcher="torchrun"))
#: the backend records name under each launcher on CPUs (commbench.launchenv picks it)
RECORDED_BACKEND = {"mpirun": "mpi", "horovodrun": "horovod", "horovodrun-gloo": "horovod",
                    "torchrun": "torch-gloo"}


def plan(scale: Scale, cluster: StudyCluster, claims: list[str] | None = None,
         ranks: tuple[int, ...] = ()) -> list[Job]:
    """``experiments.claims.plan`` for the claims named by id (default: all)."""
    chosen = cl.SEED_CLAIMS if claims is None else [cl.BY_ID[c] for c in claims]
    return cl.plan(scale, cluster, chosen, ranks)


def planned_records(job: Job) -> list[dict]:
    """Summary-like records of the runs ``job`` makes, from its typed configuration, with the
    header its placement will give them: what ``analysis.match`` sees of each run. The
    convergence study and the microbenchmarks write no training summaries."""
    cfg, where = job.config, job.placement
    if not isinstance(cfg, allreduce.Config):
        return []
    local, left = [], job.nranks  # ranks fill the nodes in order
    for s in where.node_slots:
        if left > 0:
            local.append(min(s, left))
            left -= s
    backend = RECORDED_BACKEND[where.launcher]
    controller = None if where.launcher == "mpirun" else commands.controller(where.launcher)
    rate = parse_rate(where.rate)
    return [{
        "kind": "summary", "run_id": f"{job.name}/{strategy}/{algo}",
        "world_size": job.nranks, "nodes": len(local), "local_size": max(local),
        "local_sizes": local, "link_shaping": None if rate is None else links.shaping_text(rate),
        "link_gbps": None if rate is None else rate * LINK_EFFICIENCY, "model": cfg.model,
        "workload": cfg.workload, "device": "cpu", "batch_size": cfg.batch_size,
        "image_size": cfg.image_size, "backend": backend, "launcher": where.launcher,
        "versions": {"horovod_controller": controller},
        "thread_rule": "machine ranks from the launcher" if where.emulated else None,
        "torch_threads": max(1, (os.cpu_count() or 1) // job.nranks),
        "strategy": strategy, "algo": algo, "knobs": {}, "config": cfg.as_dict()}
        for strategy, algo, _ in allreduce.runs_of(cfg)]


def study_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "experiments.study", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def runs_of(scale: Scale, claim: str, cluster: StudyCluster = EMULATED) -> list[dict]:
    """The planned runs of the jobs ``plan`` makes for ``claim`` alone."""
    return [r for j in plan(scale, cluster, [claim]) for r in planned_records(j)]


def the_set(runs: list[dict], vary: tuple[str, ...], has: Callable[[list[dict]], bool]
            ) -> list[dict]:
    """The one matched set of ``runs`` (by ``analysis.match``) that ``has`` what the claim
    compares; fails if none or several do."""
    found = [g for g in match.matched_sets(runs, vary) if has(g)]
    assert len(found) == 1, [[r["run_id"] for r in g] for g in match.matched_sets(runs, vary)]
    return found[0]


def schemes(g: list[dict]) -> set[tuple]:
    return {(match.sync_family(r), r.get("algo")) for r in g}


@pytest.mark.parametrize("scale", [FULL, QUICK], ids=["full", "quick"])
def test_each_claim_gets_a_matched_set_on_its_own_variable(scale):
    # C1: flat native at every rank count asked for
    c1 = [r for r in runs_of(scale, "C1") if (r["strategy"], r["algo"]) == ("flat", "native")]
    assert sorted({r["world_size"] for r in c1}) == EMULATED.default_ranks(scale)
    assert {1, 8} <= set(EMULATED.default_ranks(scale))

    # C2: at each link rate, flat ring and hierarchical in one set differing only in the scheme
    c2 = [r for r in runs_of(scale, "C2") if r["nodes"] > 1]
    for rate in scale.rates:
        at = [r for r in c2 if r["link_shaping"] == f"{parse_rate(rate):g}gbit"]
        g = the_set(at, ("sync",), lambda g: ("flat", "ring") in schemes(g))
        assert {("flat", "ring"), ("hierarchical", "hier")} <= schemes(g)
    assert len({r["link_shaping"] for r in c2}) == len(scale.rates)
    assert len(FULL.rates) == 2  # the full study compares at two link rates

    # C3: bucketed at every size (per tensor included) beside flat, one set
    g = the_set(runs_of(scale, "C3"), ("sync",),
                lambda g: any(r["strategy"] == "bucketed" for r in g))
    assert sorted(knob(r, "bucket_mb") for r in g if r["strategy"] == "bucketed") == sorted(
        scale.bucket_mb)
    assert 0 in scale.bucket_mb and ("flat", "native") in schemes(g)

    # C4: without and with the straggler, async at every s beside flat, one set each
    c4 = runs_of(scale, "C4")
    sets = [g for g in match.matched_sets(c4, ("sync",)) if any(r["strategy"] == "async"
                                                                for r in g)]
    assert len(sets) == 2
    assert {bool(get(g[0], "slow_rank")) for g in sets} == {False, True}
    for g in sets:
        assert sorted(knob(r, "staleness") for r in g if r["strategy"] == "async") == sorted(
            scale.staleness)
        assert ("flat", "native") in schemes(g)
    # C4's convergence study: one job per training setting of its grid (lr x momentum)
    conv = [j for j in plan(scale, EMULATED, ["C4"]) if j.program == "commbench.staleness"]
    assert len(conv) == len(scale.conv_lrs) * len(scale.conv_momenta) >= 4
    assert all("--staleness" in j.args for j in conv)
    assert {(j.config.lr, j.config.momentum) for j in conv} == {
        (lr, m) for lr in scale.conv_lrs for m in scale.conv_momenta}

    # C5, C6: the real workload on digits at three batch sizes, one set on the batch
    g = the_set(runs_of(scale, "C6"), ("batch",), lambda g: g[0]["workload"] == "real")
    assert sorted(r["batch_size"] for r in g) == sorted(scale.real_batches)
    assert len(scale.real_batches) >= 3  # claims.c6 fits a line through three or more
    assert {get(r, "dataset") for r in g} == {"digits"}
    assert the_set(runs_of(scale, "C5"), ("batch",), lambda g: g[0]["workload"] == "real")

    # C7: k at every value, one set on the accumulation
    g = the_set(runs_of(scale, "C7"), ("accumulation",),
                lambda g: len({get(r, "accum_steps") for r in g}) > 1)
    assert sorted(get(r, "accum_steps") for r in g) == sorted(scale.accum)


def test_the_full_study_adds_the_claims_own_batches_with_their_h200_profiles():
    prof = [r for r in runs_of(FULL, "C5") if r["workload"] == "synthetic"]
    assert sorted({r["batch_size"] for r in prof}) == list(FULL.profile_batches)
    for r in prof:
        path = ROOT / get(r, "compute_profile")
        assert json.loads(path.read_text())["batch_size"] == r["batch_size"]
    # each batch with its own profile, still one matched set on the batch (analysis.match)
    g = the_set(prof, ("batch",), lambda g: len({r["batch_size"] for r in g}) > 1)
    assert sorted(r["batch_size"] for r in g) == list(FULL.profile_batches)
    assert len({get(r, "compute_profile") for r in g}) == len(FULL.profile_batches)


def test_runs_shared_by_claims_run_once_and_claims_restrict_the_jobs():
    everything = plan(QUICK, EMULATED)
    names = [j.name for j in everything]
    assert len(names) == len(set(names))
    base = next(j for j in everything if j.name == "flat-np8")
    assert {"C1", "C2", "C3", "C4", "C7"} <= base.sets  # one compared set: one K
    some = plan(QUICK, EMULATED, ["C2", "C4"])
    assert all(j.sets & {"C2", "C4"} for j in some)
    assert not any(j.name.startswith(("bucketed", "accum", "real")) for j in some)
    # one cluster per rate: jobs of a rate together
    rates = [j.placement.rate for j in everything]
    assert rates == sorted(rates, key=QUICK.rates.index)


def test_quick_study_is_estimated_within_its_budget():
    """One run of every job at K = 1, start-up included (repeats and dilation multiply it)."""
    quick = sum(j.estimate_s(1.0) for j in plan(QUICK, EMULATED))
    full = sum(j.estimate_s(1.0) for j in plan(FULL, EMULATED))
    assert 0 < quick <= 20 * 60 < full


def _own_s(job: Job) -> float:
    """A job's estimate without its start-up: its configuration's own time."""
    return job.estimate_s() - STARTUP_S - job.where().startup_s(
        "microbench" if job.program == "commbench.microbench" else "train")


def test_microbench_estimate_reads_its_own_sizes_and_where_it_runs():
    jobs = {j.name: j for j in plan(QUICK, EMULATED) if j.program == "commbench.microbench"}
    local, both = jobs["microbench-np4"], jobs["microbench-np8"]
    assert _own_s(local) < _own_s(both)  # shm vs link
    assert local.estimate_s() < both.estimate_s()
    bigger = dataclasses.replace(both, config=dataclasses.replace(both.config,
                                                                   maxbytes=256 << 20))
    more = dataclasses.replace(both, config=dataclasses.replace(
        both.config, warmup_iters=both.config.warmup_iters + 1))
    base = _own_s(both)
    assert base > 0
    assert _own_s(bigger) > 3 * base  # a 4x larger top size
    assert _own_s(more) > base  # one more warm-up call


def test_dry_run_lists_every_job_and_runs_nothing(tmp_path):
    out = tmp_path / "s"
    res = study_cli("--quick", "--dry-run", "-o", str(out))
    assert res.returncode == 0, res.stderr
    jobs = plan(QUICK, EMULATED)
    commands = [ln for ln in res.stdout.splitlines() if not ln.startswith("#")]
    assert len(commands) == len(jobs)
    assert "expected ~" in res.stdout
    for job, cmd in zip(jobs, commands):
        assert f" -np {job.nranks} " in cmd and f"-m {job.program}" in cmd
    assert not out.exists()


def test_torchrun_runs_every_claims_jobs_one_torchrun_per_node(tmp_path):
    """The torch backend on Gloo has point-to-point messages and receives from any rank, so
    torchrun takes every claim (Horovod on Gloo does not: C2, C4); its plan is mpirun's,
    and each job is one torchrun per node its ranks fill."""
    study.check(TORCHRUN, cl.SEED_CLAIMS, (), QUICK)
    gloo = StudyCluster(dataclasses.replace(EMULATED.placement, launcher="horovodrun-gloo"))
    with pytest.raises(study.StudyError, match="use mpirun, horovodrun or torchrun"):
        study.check(gloo, [cl.BY_ID["C2"]], (), QUICK)
    jobs = plan(QUICK, TORCHRUN)
    assert [(j.name, j.args) for j in jobs] == [(j.name, j.args) for j in plan(QUICK, EMULATED)]
    for claim in ("C2", "C3", "C4"):  # their matched sets, as under mpirun
        runs = runs_of(QUICK, claim, TORCHRUN)
        assert {r["backend"] for r in runs} == {"torch-gloo"}
        assert len(match.matched_sets(runs, ("sync",))) == len(
            match.matched_sets(runs_of(QUICK, claim), ("sync",)))
    res = study_cli("--quick", "--dry-run", "--launcher", "torchrun", "-o", str(tmp_path / "s"))
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if not ln.startswith("#")]
    assert len(lines) == len(jobs)
    for job, line in zip(jobs, lines):
        argv = shlex.split(line)
        assert argv[1:3] == ["-m", "launch.nodes"] and "mpirun" not in line
        per_node = [int(shlex.split(argv[i + 2])[shlex.split(argv[i + 2]).index(
            "--nproc-per-node") + 1]) for i, a in enumerate(argv) if a == "--node"]
        assert sum(per_node) == job.nranks and per_node[0] == min(job.nranks, 4), line
        assert f"-m {job.program}" in line


def _summaries(out) -> list[dict]:
    return [r for p in out.glob("*.jsonl") for r in read_jsonl(p) if r["kind"] == "summary"]


def _c7_row(report) -> str:
    return next(ln for ln in (report / "README.md").read_text().splitlines()
                if ln.startswith("| C7 |"))


#: the end-to-end studies at a smoke scale: what they check (jobs, report, resume, one matched
#: set) does not need the quick scale's steps or compute
SMOKE = ("--steps", "2", "--compute-scale", "5", "--repeats", "1")


def test_repeats_reach_the_sweep_and_the_convergence_study_runs_once(tmp_path):
    res = study_cli("--quick", "--dry-run", "--repeats", "3", "-o", str(tmp_path / "s"))
    assert res.returncode == 0, res.stderr
    jobs = plan(QUICK, EMULATED)
    conv = [j for j in jobs if j.name.startswith("convergence-digits")]
    assert len(conv) == 4  # the quick grid: 2 rates x 2 momenta, each job once
    assert f"{len(jobs)} points" in res.stdout
    assert f"{3 * (len(jobs) - len(conv)) + len(conv)} jobs" in res.stdout
    assert plan(QUICK, EMULATED)[0].point().get("repeats") is None
    assert all(j.point()["repeats"] == 1 for j in conv)
    for bad in ("0", "-1"):
        res = study_cli("--quick", "--dry-run", "--repeats", bad, "-o", str(tmp_path / "s"))
        assert res.returncode == 2 and f"--repeats {bad}: must be at least 1" in res.stderr


def test_smoke_scale_shrinks_the_replayed_jobs_only():
    smoke = study.scaled(QUICK, study.build_parser().parse_args(
        ["--steps", "2", "--compute-scale", "5"]))
    assert smoke.repeats == QUICK.repeats
    jobs = {j.name: j for j in plan(smoke, EMULATED)}
    quick = {j.name: j for j in plan(QUICK, EMULATED)}
    assert jobs.keys() == quick.keys()
    synthetic = [n for n, j in jobs.items() if "--compute-scale" in j.args]
    assert synthetic and all(jobs[n].estimate_s() < quick[n].estimate_s() for n in synthetic)
    for n in synthetic:
        args = jobs[n].args
        assert args[args.index("--steps") + 1] == "2"
        assert args[args.index("--compute-scale") + 1] == "5"


@pytest.mark.mpi
def test_tiny_study_on_one_host_runs_reports_and_resumes(tmp_path, monkeypatch, capsys):
    """C7 on 2 ranks of this host (the real-cluster path: --hosts): two jobs, the report,
    then a second run that skips both and writes the report again; then --repeat-until
    with no room in the budget for another job."""
    out = tmp_path / "s"
    args = ("--quick", *SMOKE, "--claims", "C7", "--hosts", "localhost:2", "--ranks", "2",
            "-o", str(out))
    res = study_cli(*args, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "expected ~" in res.stdout and "point 2/2" in res.stderr and "eta" in res.stderr
    assert "# C7: " in res.stdout and "(2 runs of 2 jobs)" in res.stdout
    recs = _summaries(out)
    assert sorted({get(r, "accum_steps") for r in recs}) == list(QUICK.accum)
    assert all(r["wrong"] == 0 for r in recs)
    row = _c7_row(out / "report")
    assert "not reproducible here" not in row and "k=4" in row
    done = {p.name: p.stat().st_mtime for p in out.glob("*.done.json")}
    assert len(done) == 2
    again = study_cli(*args, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "2 of 2 points already done" in again.stderr and "point 1/2" not in again.stderr
    assert {p.name: p.stat().st_mtime for p in out.glob("*.done.json")} == done
    # a budget shorter than one round of C7's jobs is refused before anything runs
    short = study_cli(*args, "--repeat-until", "50", "--budget", "1s", timeout=300)
    assert short.returncode == 2 and "--budget 1s: C7's jobs need ~" in short.stderr, \
        short.stderr
    # --repeat-until with no budget left for another job (each took, say, a day): C7 (one
    # run a side) wants more, none fits; the report says so and nothing runs
    monkeypatch.setattr(Runner, "job_seconds", lambda self, job: 86400.0)
    assert study.main([*args, "--repeat-until", "50", "--budget", "8h"]) == 0
    info = json.loads((out / study.UNTIL_FILE).read_text())
    assert info["stopped"].startswith("the budget is spent") and info["rounds"] == []
    assert info["pct"] == 50 and any(c["claim"] == "C7" and not c["within"]
                                     for c in info["claims"])
    assert "# C7: " in capsys.readouterr().out
    page = (out / "report" / "README.md").read_text()
    assert "## Repeats until a precision" in page and "| C7 |" in page
    assert {p.name: p.stat().st_mtime for p in out.glob("*.done.json")} == done


@pytest.mark.mpi
@pytest.mark.skipif(os.geteuid() != 0, reason="emulated cluster needs root")
def test_tiny_study_on_the_emulated_cluster(tmp_path):
    """C7 on 2 emulated nodes x 1 rank at the quick study's link rate: the runs share one
    measured link and the report finds them one matched set."""
    out = tmp_path / "s"
    res = study_cli("--quick", *SMOKE, "--claims", "C7", "--nodes", "2", "--slots", "1",
                    "--ranks", "2", "--dilation", "1", "-o", str(out), timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    recs = _summaries(out)
    shaped = links.shaping_text(parse_rate(QUICK.rates[0]))  # the quick study's one rate
    assert {r["nodes"] for r in recs} == {2} and {r["link_shaping"] for r in recs} == {shaped}
    assert all(not math.isnan(num(r.get("link_gbps"))) for r in recs)
    assert len(match.matched_sets(recs, ("accumulation", "sync"))) == 1
    assert "not reproducible here" not in _c7_row(out / "report")


def test_a_jobs_id_does_not_depend_on_its_estimate_or_deadline():
    """Resuming finds finished jobs by id: a better estimate must not make them new."""
    from launch.sweep import make_sweep, point_id

    pts = [j.point() for j in plan(QUICK, EMULATED)]
    sweep = make_sweep({}, {}, pts)
    moved = [{**p, "estimate_s": p["estimate_s"] * 2, "timeout": p["timeout"] + 1} for p in pts]
    assert [point_id(p, sweep) for p in pts] == [point_id(p, sweep) for p in moved]
    assert len({point_id(p, sweep) for p in pts}) == len(pts)


# -- --repeat-until: repeats added to the points behind an imprecise claim ---------------

def test_repeat_until_and_budget_bad_input_exits_2(tmp_path):
    for args, msg in [
        (("--repeat-until", "10"), "--repeat-until needs --budget"),
        (("--repeat-until", "0", "--budget", "1h"), "--repeat-until 0: a percentage"),
        (("--repeat-until", "100", "--budget", "1h"), "--repeat-until 100: a percentage"),
        (("--repeat-until", "10", "--budget", "soon"), "--budget 'soon': expected a duration"),
        (("--budget", "2h"), "--budget: it bounds --repeat-until"),
        # one round of at least one claim's jobs must fit the budget
        (("--repeat-until", "10", "--budget", "1s"), "for one round, the least of any claim"),
    ]:
        res = study_cli("--quick", "--dry-run", *args, "-o", str(tmp_path / "s"))
        assert res.returncode == 2 and msg in res.stderr, (args, res.stderr)
    assert study.parse_duration("1h30m") == 5400 and study.parse_duration("90") == 90
    assert study.parse_duration("45s") == 45 and study.parse_duration("2.5m") == 150


class _Clock:
    """The runner's clock, moved on by the fake sweep: each job takes ``JOB_S``."""

    JOB_S = 10.0

    def __init__(self) -> None:
        self.t = 1000.0

    def time(self) -> float:
        return self.t


def _c2_jobs(tmp_path, monkeypatch, budget_s: float):
    """C2's two jobs (flat ring, hier) and an unrelated one, 2 repeats each, whose first
    repeats straddle 0.70; then ``Runner.repeat_until`` judged by the study's
    ``judge_claims`` at +-10 %, with a sweep that writes each new job's record (ring 1.0,
    hier 0.56, nearly constant) and moves the clock on by a job's time."""
    from experiments import runner as rn
    from launch import sweep as sweeps
    from tests.test_claims import run

    out = tmp_path / "s"
    out.mkdir()
    here = Placement(1, 2, hosts="localhost:2")  # a real cluster: no machine check
    algo = {"ring": "ring", "hier": "hier", "other": "native"}
    sets = {"ring": {"C2"}, "hier": {"C2"}, "other": set()}
    jobs = [Job(n, allreduce.Config(strategies=["flat"], algos=[a], model="resnet18"), here,
                sets=frozenset(sets[n])) for n, a in algo.items()]
    runner = Runner(jobs, out, repeats=2)
    clock = _Clock()

    def write(name: str, path, value: float) -> None:
        path.write_text(json.dumps(run("flat", algo[name], exposed_s=value)) + "\n")
        path.with_suffix(".done.json").write_text(json.dumps({"seconds": _Clock.JOB_S}))

    first = {"ring": (1.0, 1.1), "hier": (0.6, 0.8), "other": (0.9, 0.9)}
    for job in jobs:
        for r, path in enumerate(runner.outputs(job)):
            write(job.name, path, first[job.name][r])
    ran: list[str] = []

    def fake_run_sweep(sw, log=None):
        n = 0
        for jid, p, r in sw.jobs():
            path = Path(sw.output) / f"{jid}.jsonl"
            if not path.with_suffix(".done.json").exists():
                write(p["name"], path, (1.0 if p["name"] == "ring" else 0.56) + 0.001 * r)
                clock.t += _Clock.JOB_S
                ran.append(jid)
                n += 1
        return {"done": n, "failed": 0, "skipped": len(sw.jobs()) - n}

    monkeypatch.setattr(sweeps, "run_sweep", fake_run_sweep)
    monkeypatch.setattr(rn, "time", clock)
    judged: list = []
    info = runner.repeat_until(
        lambda: study.judge_claims(runner, cl.SEED_CLAIMS, out, 10.0, judged, set()), budget_s,
        clock.t)
    return runner, ran, info, judged


def test_repeat_until_repeats_only_the_claims_jobs_until_precise(tmp_path, monkeypatch):
    runner, ran, info, judged = _c2_jobs(tmp_path, monkeypatch, 3600.0)
    # C2's range (0.55-0.80 around 0.67) straddled: +-19 %, so 2 x (19 / 10)^2 -> 8 runs a
    # side (stats.repeats_for_precision), on its two jobs only
    assert len(ran) == 12 and runner.failed == 0
    assert info["repeats"] == {"ring": 8, "hier": 8, "other": 2}
    assert info["stopped"] == "every judged figure is decided"
    c2 = next(c for c in judged if c["claim"] == "C2")
    assert c2["within"] and "95% CI" in c2["spread"] and c2["verdict"] == "reproduced"
    assert info["rounds"][0]["added"] == {"ring": 6, "hier": 6}
    # every repeat's file is one the runner names for the job
    assert sorted(p.name for p in tmp_path.joinpath("s").glob("*.done.json")) == sorted(
        p.with_suffix(".done.json").name for j in runner.jobs for p in runner.outputs(j))


def test_repeat_until_stops_when_the_budget_is_spent(tmp_path, monkeypatch):
    runner, ran, info, judged = _c2_jobs(tmp_path, monkeypatch, 35.0)
    # 10 s a job (the done markers): three jobs fit 35 s, one job then the other in turn
    assert len(ran) == 3 and sorted(info["rounds"][0]["added"].values()) == [1, 2]
    assert info["stopped"].startswith("the budget is spent")
    assert info["repeats"]["other"] == 2
