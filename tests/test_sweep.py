"""Sweeps: real jobs per point, failures recorded, re-runs resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from launch import nodes
from launch.sweep import SweepError, _Clusters, launch_point, make_sweep, parse_set, point_id
from tests.conftest import PY, ROOT, read_jsonl

FIXED = ["--", "--model", "smallcnn", "--steps", "2", "--warmup", "1", "--compute-ms", "10"]


def sweep_cli(*args, timeout=600):
    return subprocess.run([PY, "-m", "launch.sweep", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def done_files(d):
    return sorted(p.name for p in d.glob("*.done.json"))


def test_grid_checks():
    s = make_sweep({"launcher": "mpirun"}, {"ranks": [1, 2], "algo": ["native", "ring"]})
    assert len(s.points()) == 4
    assert point_id(s.points()[0], s) == point_id(dict(s.points()[0]), s)
    assert make_sweep({}, {"compute_ms": [10]}).grid["compute_ms"] == [10.0]
    for sweep, grid, msg in [
        ({}, {"color": ["red"]}, "unknown key 'color'"),
        ({"speed": 1}, {}, "unknown key 'speed'"),
        ({}, {"ranks": ["two"]}, "grid.ranks: expected int"),
        ({"timeout": "soon"}, {}, "sweep.timeout: expected float"),
        ({"launcher": "pdsh"}, {}, "sweep.launcher"),
        ({}, {"nodes": [2], "slots": [2], "ranks": [5]}, "more than 2 nodes x 2 slots"),
        ({}, {"nodes": [2], "slots": [1], "rate": ["quick"]}, "grid.rate"),
        ({}, {"nodes": [2]}, "nodes and slots go together"),
        ({}, {"strategy": ["flat", "async,ps"]}, 'sweep.program = "commbench.ps"'),
    ]:
        with pytest.raises(SweepError, match=msg):
            make_sweep(sweep, grid)
    assert parse_set(["ranks=1,2", "algo=ring"]) == {"ranks": [1, 2], "algo": ["ring"]}
    with pytest.raises(SweepError, match="--set"):
        parse_set(["ranks=x"])


def test_torchrun_points_on_this_host_and_on_hosts(tmp_path):
    """A sweep takes ``launcher = "torchrun"``: a point on this host is one torchrun
    (``--standalone``) with the machine's load for the records; on hosts, one per host."""
    s = make_sweep({"launcher": "torchrun"}, {"ranks": [2], "algo": ["ring"]})
    [point] = s.points()
    argv = launch_point(point, s, tmp_path / "p.jsonl", _Clusters())
    at = argv.index("torch.distributed.run")
    assert argv[0] == "env" and any(a.startswith("COMMBENCH_RUNNABLE_BEFORE=") for a in argv)
    assert argv[at - 2:at] == [PY, "-m"] and "--standalone" in argv
    assert argv[argv.index("--nproc-per-node") + 1] == "2"
    assert argv[at + 1:].count("-m") == 1 and "commbench.allreduce" in argv
    assert "--algo" in argv and argv[-2:] == ["--output", str(tmp_path / "p.jsonl")]
    hosts = make_sweep({"launcher": "torchrun", "hosts": "a:1,b:1"}, {"ranks": [2]})
    remote = launch_point(hosts.points()[0], hosts, tmp_path / "q.jsonl", _Clusters())
    assert remote[1:3] == ["-m", nodes.__name__] and remote.count("--node") == 2
    assert point_id(point, s) != point_id(point, make_sweep({}, {"ranks": [2],
                                                                 "algo": ["ring"]}))


def test_repeats_are_jobs_shuffled_within_each_cluster_with_a_seed():
    grid = {"nodes": [2], "slots": [1, 2], "rate": ["1gbit"], "algo": ["native", "ring"]}
    s = make_sweep({"repeats": 3}, grid)
    jobs = s.jobs()
    assert len(jobs) == 4 * 3 and len({i for i, _, _ in jobs}) == 12
    # every point's repeats 0..2; repeat 0 keeps the point's id, the others add -r<r>
    for p in s.points():
        mine = sorted((r, i) for i, q, r in jobs if q == p)
        assert [r for r, _ in mine] == [0, 1, 2]
        assert [i for _, i in mine] == [point_id(p, s)] + [f"{point_id(p, s)}-r{r}"
                                                         for r in (1, 2)]
    # one cluster after the other: slots 1's six jobs, then slots 2's
    assert [q["slots"] for _, q, _ in jobs] == [1] * 6 + [2] * 6
    # shuffled within a cluster (not point by point, not repeat by repeat) ...
    first = [(q["algo"], r) for _, q, r in jobs[:6]]
    assert first != sorted(first) and first != sorted(first, key=lambda x: (x[1], x[0]))
    # ... the same order every time (a resumed sweep runs what is left in that order), and
    # another for another seed
    assert make_sweep({"repeats": 3}, grid).jobs() == jobs
    assert make_sweep({"repeats": 3, "shuffle_seed": 1}, grid).jobs() != jobs
    # one repeat: the points in order, as before
    one = make_sweep({}, grid)
    assert [(i, q) for i, q, _ in one.jobs()] == [(point_id(p, one), p) for p in one.points()]
    for bad in (0, -2):
        with pytest.raises(SweepError, match=f"repeats: must be >= 1, got {bad}"):
            make_sweep({"repeats": bad}, grid)


def test_repeats_flag_zero_exits_2_naming_it(tmp_path):
    res = sweep_cli("--set", "ranks=1", "--repeats", "0", "-o", str(tmp_path / "o"))
    assert res.returncode == 2 and "repeats: must be >= 1, got 0" in res.stderr
    assert not (tmp_path / "o").exists()


def test_bad_sweep_file_exits_2_before_running(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('[sweep]\noutput = "%s"\n[grid]\nranks = [1]\nbatch = [3]\n' % (tmp_path / "o"))
    res = sweep_cli(str(f))
    assert res.returncode == 2 and "unknown key 'batch'" in res.stderr
    assert not (tmp_path / "o").exists()
    f.write_text('[grid]\nranks = "2"\n')
    res = sweep_cli(str(f), "-o", str(tmp_path / "o"))
    assert res.returncode == 2 and "grid.ranks: expected int" in res.stderr


@pytest.mark.mpi
def test_four_points_complete_then_rerun_runs_nothing(tmp_path):
    out = tmp_path / "sw"
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"sweep": {"launcher": "mpirun", "output": str(out),
                                       "args": FIXED[1:], "timeout": 240},
                             "grid": {"ranks": [1, 2], "algo": ["native", "ring"]}}))
    res = sweep_cli(str(f))
    assert res.returncode == 0, res.stderr
    assert len(done_files(out)) == 4
    assert "point 4/4" in res.stderr and "eta" in res.stderr
    for p in out.glob("*.jsonl"):
        recs = read_jsonl(p)  # without the job_end record that closes the file
        assert recs[-1]["kind"] == "summary" and recs[-1]["wrong"] == 0
        # read by the sweep before the point, not by rank 0 after its own start-up
        assert recs[-1]["loadavg_source"] == "launcher, before the job"
        assert recs[-1]["runnable_start"] is not None and recs[-1]["runnable_start"] >= 0
    before = {p.name: p.stat().st_mtime for p in out.iterdir()}
    again = sweep_cli(str(f))
    assert again.returncode == 0
    assert "4 of 4 points already done" in again.stderr and "point 1/4" not in again.stderr
    assert {p.name: p.stat().st_mtime for p in out.iterdir() if p.name != "sweep.json"} == {
        k: v for k, v in before.items() if k != "sweep.json"}


@pytest.mark.mpi
def test_repeats_run_as_jobs_name_their_repeat_and_resume(tmp_path):
    """Two points x 2 repeats: four jobs whose records carry their repeat and the code's
    revision; raising --repeats to 3 runs only the two new repeats."""
    out = tmp_path / "sw"
    args = ["--set", "ranks=1", "--set", "algo=native,ring", "-o", str(out), *FIXED]
    res = sweep_cli("--repeats", "2", *args)
    assert res.returncode == 0, res.stderr
    assert "job 4/4" in res.stderr and "repeat 2/2" in res.stderr
    assert len(done_files(out)) == 4
    seen = set()
    for p in out.glob("*.jsonl"):
        rec = read_jsonl(p)[-1]
        seen.add((rec["algo"], rec["repeat"]))
        assert rec["revision"] and rec["revision"] == read_jsonl(p)[0]["revision"]
        assert p.stem.endswith("-r1") == (rec["repeat"] == 1)
    assert seen == {("native", 0), ("native", 1), ("ring", 0), ("ring", 1)}
    before = {n: (out / n).stat().st_mtime for n in done_files(out)}
    again = sweep_cli("--repeats", "3", *args)
    assert again.returncode == 0, again.stderr
    assert "4 of 6 jobs already done" in again.stderr
    assert len(done_files(out)) == 6
    assert all((out / n).stat().st_mtime == t for n, t in before.items())


@pytest.mark.mpi
def test_failed_point_is_recorded_and_the_sweep_goes_on(tmp_path):
    out = tmp_path / "sw"
    res = sweep_cli("--set", "ranks=2", "--set", "model=resnet18,resnet7", "-o", str(out),
                    "--", "--steps", "2", "--warmup", "0", "--compute-ms", "0")
    assert res.returncode == 1
    assert len(done_files(out)) == 1
    failed = list(out.glob("*.failed.json"))
    assert len(failed) == 1
    info = json.loads(failed[0].read_text())
    assert info["point"]["model"] == "resnet7" and info["returncode"] != 0
    assert "--model" in info["stderr_tail"]


@pytest.mark.mpi
def test_interrupted_sweep_resumes_only_missing_points(tmp_path):
    out = tmp_path / "sw"
    args = ["--set", "ranks=1,2", "--set", "algo=native,ring", "-o", str(out), *FIXED]
    proc = subprocess.Popen([PY, "-m", "launch.sweep", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while not done_files(out) and time.time() < deadline:
            time.sleep(0.2)
        assert done_files(out), "no point finished"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    first = {n: (out / n).stat().st_mtime for n in done_files(out)}
    assert 1 <= len(first) < 4
    time.sleep(1)
    assert subprocess.run(["pgrep", "-f", "commbench.allreduce"]).returncode == 1
    res = sweep_cli(*args)
    assert res.returncode == 0, res.stderr
    assert f"{len(first)} of 4 points already done" in res.stderr
    assert len(done_files(out)) == 4
    assert all((out / n).stat().st_mtime == t for n, t in first.items())


@pytest.mark.mpi
@pytest.mark.skipif(os.geteuid() != 0, reason="emulated cluster needs root")
def test_point_on_emulated_cluster(tmp_path):
    out = tmp_path / "sw"
    res = sweep_cli("--set", "nodes=2", "--set", "slots=1", "--set", "rate=1gbit", "-o",
                    str(out), "--", "--model", "smallcnn", "--steps", "2", "--warmup", "1",
                    "--algo", "native")
    assert res.returncode == 0, res.stderr
    recs = [r for p in out.glob("*.jsonl") for r in read_jsonl(p)]
    assert recs[-1]["nodes"] == 2 and recs[-1]["link_gbps"] > 0.5
    assert recs[-1]["link_shaping"] == "1gbit"
    assert recs[-1]["loadavg_source"] == "launcher, before the job"
    assert recs[-1]["runnable_start"] is not None


#: the runner's ``auto`` on two jobs of one compared set, run as its own process (so a
#: deadline's SIGTERM unwinds it through ``launch.execute.interruptible``, and the emulated
#: cluster is taken down on the way out); ``argv[1]``: the results folder
AUTO_DRIVER = """
import json, sys
from pathlib import Path
from experiments.job import Job, Placement
from experiments.runner import Runner
from launch.execute import interruptible
from tests.dilation_probe import ProbeConfig

at = Placement(2, 1, dilation="auto")  # 2 emulated nodes x 1 slot, links unshaped
jobs = [Job(f"np{n}", ProbeConfig(needs=4.0), at, ranks=n, sets=frozenset({"probe-set"}),
            timeout_s=60) for n in (1, 2)]

def body():
    counts = Runner(jobs, Path(sys.argv[1])).run()
    print(json.dumps(counts))
    return 1 if counts["failed"] else 0

sys.exit(interruptible(body, "dilation-auto-test"))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the emulated cluster needs root")
def test_runner_dilation_auto_probes_the_largest_job_once_and_runs_every_job_at_its_k(tmp_path):
    """The experiment runner's ``auto`` on a real emulated cluster: the compared set's probe
    (its largest job, a stand-in program whose step time stops moving at K = 4) climbs from
    the start K (ranks / cores), judging each K against 2K (the outcome rule), and stops at
    4, the first K that agrees with 8; every job then runs at 4; a resumed run reuses the
    choice without probing again. (``launch.sweep`` itself refuses ``auto``.)"""
    from commbench.dilation import PROBE_DIR
    from experiments.runner import AUTO_FACTORS, CHOICE_FILE
    from launch.execute import run

    out, cache = tmp_path / "s", tmp_path / "cache"
    env = {"COMMBENCH_CACHE": str(cache)}  # no hint from an earlier choice; none left behind

    def drive():
        res = run([PY, "-c", AUTO_DRIVER, str(out)], timeout=300, env=env, cwd=str(ROOT))
        assert not res.timed_out, res.stderr[-3000:]
        return res

    res = drive()
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout.splitlines()[-1]) == {"done": 2, "failed": 0, "skipped": 0}
    chosen = json.loads((out / CHOICE_FILE).read_text())
    [(key, pick)] = chosen.items()
    assert key == "probe-set" and pick["dilation"] == 4.0, chosen
    assert pick["rule"] == "outcome" and pick["verdict"] == "link-bound", pick
    # the ladder starts at the smallest K with no more ranks than cores x K, and climbs;
    # each K judged is probed with its 2K
    start = next(k for k in AUTO_FACTORS if 2 <= (os.cpu_count() or 1) * k)
    tried = [t["dilation"] for t in pick["tried"]]
    assert tried == [k for k in AUTO_FACTORS if start <= k <= 8], pick
    for t in pick["tried"]:  # only the largest job (2 ranks) is probed; rank 0's verdict
        assert list(t["verdicts"]) == ["np2"] and len(t["verdicts"]["np2"]) == 1, t
        assert t["verdicts"]["np2"][0].startswith("link" if t["dilation"] >= 4 else "host")
        assert t["agrees_with_2k"] is (None if t["dilation"] == 8 else t["dilation"] >= 4), t
        assert t["figures"]["np2"] == {"step::": pytest.approx(max(1.0, 4.0 / t["dilation"]))}
    assert "[runner] dilation auto, probe-set: K = 4 against 8: agree (link-bound)" \
        in res.stderr, res.stderr
    assert "K = 2 against 4: moved (host-bound)" in res.stderr, res.stderr
    assert "K = 4 (smallest K whose figures agree with 2K's within 5%)" in res.stderr
    probes = sorted((out / PROBE_DIR).iterdir())  # one probe sweep per K tried
    assert sorted(int(d.name.rsplit("-k", 1)[1]) for d in probes) == tried
    # every job ran at the chosen K: its records, and its sweep's done markers
    runs = [r for f in sorted(out.glob("*.jsonl")) for r in read_jsonl(f)
            if r["kind"] == "summary"]
    assert len(runs) == 2 and {r["dilation"] for r in runs} == {4.0}, runs
    done = sorted(out.glob("*.done.json"))
    assert [json.loads(f.read_text())["point"]["name"] for f in done] == ["np1", "np2"]
    for f in done:
        assert json.loads(f.read_text())["dilation"] == 4.0
    # the choice is left as the next choice's starting hint
    hints = json.loads((cache / "dilation-hints.json").read_text())
    assert list(hints.values()) == [4.0] and "tests.dilation_probe" in next(iter(hints))
    # resumed: both jobs again (their done markers gone), at the kept K, and no probe runs
    kept = {p: p.stat().st_mtime for p in [out / CHOICE_FILE, *probes]}
    for f in done:
        f.unlink()
    again = drive()
    assert again.returncode == 0, again.stderr[-3000:]
    assert "dilation auto" not in again.stderr, again.stderr[-2000:]
    assert {p: p.stat().st_mtime for p in kept} == kept
    assert sorted((out / PROBE_DIR).iterdir()) == probes
    runs = [r for f in sorted(out.glob("*.jsonl")) for r in read_jsonl(f)
            if r["kind"] == "summary"]
    assert len(runs) == 2 and {r["dilation"] for r in runs} == {4.0}, runs
    for f in out.glob("*.done.json"):
        assert json.loads(f.read_text())["dilation"] == 4.0
    # a new folder starts from the hint: 4 agrees with 8, 2 moved against 4; 4 again
    out = tmp_path / "t"
    res = drive()
    assert res.returncode == 0, res.stderr[-3000:]
    pick = json.loads((out / CHOICE_FILE).read_text())["probe-set"]
    assert pick["dilation"] == 4.0 and [t["dilation"] for t in pick["tried"]] == [2, 4, 8], pick
