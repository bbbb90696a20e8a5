"""Emulated cluster: real namespaces, shaped links, jobs across nodes, nothing left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from commbench.cores import RULE_MACHINE
from launch import commands
from launch.cluster import (
    DEFAULT_SUBNET,
    STATE_DIR,
    ClusterError,
    ClusterSpec,
    cluster,
    down,
    launch_argv,
    measure_link,
    parse_rate,
)
from launch.execute import run
from tests.conftest import PY, ROOT, ctrl_c_reaches_it, read_jsonl

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")

NAME = "cbt"
PROG = [PY, "-m", "commbench.allreduce", "--model", "smallcnn", "--steps", "2", "--warmup",
        "1", "--compute-ms", "10"]
#: what a job of the cluster runs: mpirun's daemons, torchrun's driver through the cluster's
#: agent and its agents (rendezvous on a node), the ranks (torchrun's on this machine, as a
#: one-machine job runs them, are not the cluster's)
JOB_PROCESSES = ("orted", f"launch.nodes --rsh {STATE_DIR}",
                 f"--master-addr {DEFAULT_SUBNET.rsplit('.', 1)[0]}.", "commbench.allreduce")


def leftovers(name: str = NAME) -> list[str]:
    """Everything of cluster ``name`` still on the machine."""
    out = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    out += [f"netns {line.split()[0]}" for line in netns.splitlines()
            if line.startswith(f"{name}-")]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    out += [f"link {line.split(':')[1].strip()}" for line in links.splitlines()
            if line.split(":")[1].strip().startswith(f"{name}-")]
    rules = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True).stdout
    out += [f"rule {r}" for r in rules.splitlines() if f"{name}-br" in r]
    ps = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout
    out += [f"process {p}" for p in ps.splitlines()  # zombies hold nothing: parent reaps them
            if not p.startswith("Z") and any(name in p for name in JOB_PROCESSES)]
    return out


def settled_leftovers() -> list[str]:
    deadline = time.time() + 10
    while (left := leftovers()) and time.time() < deadline:
        time.sleep(0.5)
    return left


@pytest.fixture(autouse=True)
def clean_machine():
    assert settled_leftovers() == []
    yield
    assert settled_leftovers() == []


def run_job(cmd: list[str], timeout: float = 240) -> str:
    """Run a ``launch.cluster run`` job; on a timeout end it (the cluster takes itself down
    on SIGTERM) and fail; whatever a killed run left is taken down (a no-op after a clean
    one); the job must exit 0. Returns its standard output."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
        pytest.fail(f"job did not end within {timeout:g} s:\n{stdout[-3000:]}{stderr[-3000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        down(name=NAME)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return stdout


def test_parse_rate():
    assert parse_rate("1gbit") == 1.0
    assert parse_rate("200mbit") == pytest.approx(0.2)
    assert parse_rate("10Gbit") == 10.0
    assert parse_rate("none") is None
    for bad in ("1gb", "fast", "-1gbit", "0mbit", "1 gbit/s"):
        with pytest.raises(ClusterError, match="--rate"):
            parse_rate(bad)


def test_spec_checks():
    with pytest.raises(ClusterError, match="--nodes"):
        ClusterSpec(nodes=0, slots=2)
    with pytest.raises(ClusterError, match="too small"):
        ClusterSpec(nodes=8, slots=1, subnet="10.1.1.0/29")
    spec = ClusterSpec(nodes=2, slots=3, name=NAME)
    assert spec.node_set.hosts_arg() == "10.213.57.11:3,10.213.57.12:3"
    with pytest.raises(ValueError, match="do not fit"):
        commands.on_nodes(spec.node_set, "mpirun", 7, ["true"])


@pytest.mark.mpi
@pytest.mark.horovod
@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun", "horovodrun-gloo"])
def test_job_across_two_nodes(tmp_path, launcher):
    out = tmp_path / "r.jsonl"
    prog = [*PROG, "--output", str(out)]
    if launcher == "horovodrun-gloo":
        prog += ["--algo", "native"]  # no point-to-point under Gloo
    with cluster(2, 2, rate="1gbit", name=NAME) as spec:
        res = run(launch_argv(spec, launcher, 4, prog, link={"gbps": 0.95}), timeout=240,
                  cwd=str(ROOT))
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    recs = read_jsonl(out)
    assert recs and all(r["nodes"] == 2 and r["local_size"] == 2 for r in recs)
    assert {tuple(sorted(set(r["hostnames"]))) for r in recs} == {(f"{NAME}node1",
                                                                   f"{NAME}node2")}
    summaries = [r for r in recs if r["kind"] == "summary"]
    assert summaries and all(s["wrong"] == 0 for s in summaries)
    assert all(r["link_gbps"] == pytest.approx(0.95) and r["link_shaping"] == "1gbit"
               for r in recs)
    # local rank 0 of each node counted the bytes through its link: flat all-reduce of the
    # 46.8 MB gradient moves at least half of it across the node boundary
    steps = [r for r in recs if r["kind"] == "step"]
    assert all(r["link_bytes"] > 0.5 * r["grad_bytes"] for r in steps)
    assert all(0 < r["link_efficiency"] < 1.5 for r in steps)


@pytest.mark.mpi
def test_emulated_nodes_share_the_machines_cores(tmp_path):
    """2 nodes x 1 rank on one machine: each rank takes cores // 2 threads (1 on 2 cores),
    not cores // its node's 1 rank, and says by which rule; the job records the load."""
    out = tmp_path / "r.jsonl"
    res = subprocess.run([PY, "-m", "launch.cluster", "run", "--name", NAME, "--nodes", "2",
                          "--slots", "1", "--rate", "1gbit", "--no-link-test", "--timeout",
                          "200", "--", *PROG, "--algo", "native", "--output", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    recs = read_jsonl(out, job_end=True)
    runs, ends = recs[:-1], recs[-1:]
    assert runs and all(r["nodes"] == 2 and r["local_size"] == 1 for r in runs)
    cores = os.cpu_count()
    for r in recs:
        assert r["torch_threads"] == max(1, cores // 2), r
        assert r["thread_rule"] == RULE_MACHINE and r["machine_ranks"] == 2
        # unbound: each node's Open MPI would have bound its one rank to core 0
        assert r["rank_cores"] == cores == r["cores"] and r["loadavg_start"] >= 0
        # read by the launcher before the job, not by rank 0 after its start-up
        assert r["loadavg_source"] == "launcher, before the job"
    assert [e["kind"] for e in ends] == ["job_end"] and ends[0]["loadavg_end"] >= 0
    assert {r["job_id"] for r in recs} == {ends[0]["job_id"]}
    assert f"torch threads/rank {max(1, cores // 2)} ({RULE_MACHINE})" in res.stdout


@pytest.mark.mpi
def test_uneven_nodes_from_the_command_line(tmp_path):
    """``--slots 2,1`` and no --nodes, no host file: 3 ranks, 2 on the first node and 1 on
    the second, and both all-reduces (flat and two-level) give the right sums."""
    out = tmp_path / "r.jsonl"
    cmd = [PY, "-m", "launch.cluster", "run", "--name", NAME, "--slots", "2,1", "--rate",
           "1gbit", "--no-link-test", "--timeout", "200", "--",
           PY, "-m", "commbench.microbench", "-b", "1M", "-e", "1M", "--algo", "native,hier",
           "-n", "2", "-w", "1", "--output", str(out)]
    run_job(cmd)
    recs = [r for r in read_jsonl(out) if r["kind"] == "microbench"]
    assert {r["algo"] for r in recs} == {"native", "hier"}, recs
    for r in recs:
        assert r["world_size"] == 3 and r["nodes"] == 2 and r["local_sizes"] == [2, 1], r
        assert r["hostnames"] == [f"{NAME}node1", f"{NAME}node1", f"{NAME}node2"], r
        assert r["wrong"] == 0, r


def test_torchrun_job_across_two_nodes(tmp_path):
    """``launch.cluster run --launcher torchrun``: one torchrun per node (launch.nodes through
    the cluster's agent), rendezvous on the first node, Gloo on the node link; the tools take
    the torch backend from torchrun's environment. 2 nodes x 1 slot: the cheapest job that
    crosses the link."""
    out = tmp_path / "r.jsonl"
    cmd = [PY, "-m", "launch.cluster", "run", "--name", NAME, "--nodes", "2", "--slots", "1",
           "--rate", "1gbit", "--no-link-test", "--timeout", "200", "--launcher", "torchrun",
           "--", "python", "-m", "commbench.allreduce", "--strategy", "flat", "--algo",
           "native,ring", "--steps", "2", "--warmup", "1", "--compute-ms", "5", "--model",
           "resnet18", "--output", str(out)]
    stdout = run_job(cmd)
    recs = read_jsonl(out)
    summaries = [r for r in recs if r["kind"] == "summary"]
    assert {r["algo"] for r in summaries} == {"native", "ring"}, summaries
    for r in recs:
        assert (r["backend"], r["launcher"]) == ("torch-gloo", "torchrun"), r
        assert r["world_size"] == 2 and r["nodes"] == 2, r
        assert r["hostnames"] == [f"{NAME}node1", f"{NAME}node2"], r
    assert all(s["wrong"] == 0 for s in summaries)
    assert "torch-gloo" in stdout


def test_shaped_link_measures_within_ten_percent():
    with cluster(2, 1, rate="200mbit", name=NAME) as spec:
        link = measure_link(spec, seconds=3.0)
    assert link["gbps"] == pytest.approx(0.2, rel=0.10), link


def test_dilated_job_agrees_with_undilated_and_k_reaches_the_ranks(tmp_path):
    """A 2 x 1 job (ranks do not outnumber the cores) at K = 1 and K = 4: its de-dilated
    all-reduce times agree, the link test is multiplied back by K, the records carry K, and
    K reaches Horovod's cycle time in every rank."""
    size = 4 << 20
    got = {}
    for k in (1, 4):
        out = tmp_path / f"k{k}.jsonl"
        res = subprocess.run(
            [PY, "-m", "launch.cluster", "run", "--name", NAME, "--nodes", "2", "--slots", "1",
             "--rate", "200mbit", "--dilation", str(k), "--", PY, "-m", "commbench.microbench",
             "-b", str(size), "-e", str(size), "--algo", "ring", "--sync-each", "-n", "3",
             "-w", "1", "--horovod-cycle-ms", "2", "--output", str(out)],
            cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        [rec] = [r for r in read_jsonl(out) if r["kind"] == "microbench"]
        got[k] = rec
        assert rec["dilation"] == k
        assert rec["link_gbps"] == pytest.approx(0.19, rel=0.15), rec["link_gbps"]
        assert rec["horovod_cycle_ms"] == 2  # emulated; Horovod itself was given 2 x K
        assert rec["bound"] is not None and rec["host"]["ranks"] == 2
    t1, t4 = (got[k]["time_us"]["avg"] for k in (1, 4))
    assert t4 == pytest.approx(t1, rel=0.25), (t1, t4)
    assert "time dilation 4" in res.stdout


def test_alpha_is_recorded_and_shrinks_with_dilation(tmp_path):
    """No qdisc here adds a delay, so the emulated network's per-message latency is the
    host's divided by about K: a 2 x 1 job measures it (commbench.latency) through Open MPI
    at K = 1 and K = 8, every record carries it, and K = 8's is under half of K = 1's
    (measured 18-21 us against 2.3-2.9 us, docs/fidelity.md)."""
    alpha = {}
    for k in (1, 8):
        out = tmp_path / f"k{k}.jsonl"
        stdout = run_job([PY, "-m", "launch.cluster", "run", "--name", NAME, "--nodes", "2",
                          "--slots", "1", "--rate", "1gbit", "--dilation", str(k), "--", PY,
                          "-m", "commbench.microbench", "-b", "8", "-e", "8", "-n", "20",
                          "-w", "2", "--output", str(out)], timeout=300)
        recs = read_jsonl(out, job_end=True)
        assert {r["alpha_us"] for r in recs} == {recs[0]["alpha_us"]}, "one job, one alpha"
        assert recs[0]["alpha_calls"] == 50 and recs[0]["alpha_ranks"] == 2
        alpha[k] = recs[0]["alpha_us"]
        assert f"alpha between nodes: {alpha[k]:.1f} us" in stdout
        assert ("divided by about K" in stdout) == (k > 1)
    assert 0 < alpha[8] < alpha[1] / 2, alpha


def test_horovod_cycle_is_dilated_in_the_ranks():
    probe = ("import os, commbench.comm.horovod as h; c = h.HorovodCommunicator(); "
             "e = os.environ; print(f\"cycle {e['HOROVOD_CYCLE_TIME']} "
             "{e['COMMBENCH_HOROVOD_CYCLE_MS']}\", flush=True); c.close()")
    res = subprocess.run([PY, "-m", "launch.cluster", "run", "--name", NAME, "--nodes", "2",
                          "--slots", "1", "--dilation", "8", "--no-link-test", "--", PY, "-c",
                          probe], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.count("cycle 8 1") == 2, res.stdout  # 1 ms (Horovod's own) x 8, each rank


def test_run_at_another_dilation_than_the_cluster_is_refused():
    def cli(cmd, *a):
        return subprocess.run([PY, "-m", "launch.cluster", cmd, "--name", NAME, *a], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
    try:
        assert cli("up", "--slots", "1,1", "--rate", "1gbit", "--dilation", "4").returncode == 0
        assert "dilation 4" in cli("status").stdout
        r = cli("run", "--dilation", "2", "--", "python", "-c", "pass")
        assert r.returncode == 2 and "up at dilation 4" in r.stderr, r.stderr
    finally:
        cli("down")


def test_failed_job_leaves_nothing():
    with cluster(2, 1, rate="1gbit", name=NAME) as spec:
        res = run(launch_argv(spec, "mpirun", 2, [PY, "-c", "import sys; sys.exit(3)"]),
                  timeout=60)
        assert res.returncode != 0
    # the autouse fixture checks the machine is clean


def test_exception_inside_block_still_tears_down():
    with pytest.raises(RuntimeError, match="boom"), cluster(2, 2, name=NAME):
        raise RuntimeError("boom")


def test_sigint_during_run_leaves_nothing():
    cmd = [PY, "-m", "launch.cluster", "run", "--name", NAME, "--nodes", "2", "--slots", "1",
           "--rate", "1gbit", "--no-link-test", "--",
           PY, "-c", "import time; time.sleep(300)"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=ctrl_c_reaches_it)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:  # wait until the sleepers run on the nodes
            pids = subprocess.run(["ip", "netns", "pids", f"{NAME}-n2"], capture_output=True,
                                  text=True).stdout.split()
            if pids:
                break
            time.sleep(0.2)
        else:
            pytest.fail("job never started on the nodes")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        assert proc.returncode != 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_cli_up_status_down():
    def cli(*a):
        return subprocess.run([PY, "-m", "launch.cluster", *a, "--name", NAME], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
    try:
        t = time.perf_counter()
        r = cli("up", "--nodes", "4", "--slots", "2", "--rate", "10gbit")
        assert r.returncode == 0, r.stderr
        assert f"{NAME}node4" in cli("status").stdout
        again = cli("up", "--nodes", "1", "--slots", "1")
        assert again.returncode == 2 and "already up" in again.stderr
    finally:
        r = cli("down")
    assert r.returncode == 0 and "netns" in r.stdout
    print(f"4-node cluster up+down: {time.perf_counter() - t:.2f} s")
    assert "down" in cli("status").stdout


def test_not_root_is_refused_before_anything_is_made(monkeypatch):
    import launch.cluster as lc

    monkeypatch.setattr(lc.os, "geteuid", lambda: 1000)
    with pytest.raises(ClusterError, match="needs root"):
        lc.up(ClusterSpec(nodes=2, slots=1, name=NAME))
    assert leftovers() == []


def _runs_at(tmp_path, k: int, layout: tuple[int, int], rate: str, launcher: str,
             tool: list[str], repeat: int = 0) -> list[dict]:
    out = tmp_path / f"{launcher}-k{k}-r{repeat}.jsonl"
    run_job([PY, "-m", "launch.cluster", "run", "--name", NAME, "--nodes", str(layout[0]),
             "--slots", str(layout[1]), "--rate", rate, "--dilation", str(k), "--no-link-test",
             "--timeout", "240", "--launcher", launcher, "--", PY, "-m", *tool, "--output",
             str(out)], timeout=400)
    return read_jsonl(out)


def _ladder_reading(tmp_path, layout: tuple[int, int], rate: str, launcher: str,
                    tool: list[str]) -> tuple[str, dict, list[dict]]:
    """The outcome rule read as the runner's ladder reads one rung (K = 1 against 2): one
    more run at each K while the interval leaves the pair unresolved, the last of
    ``PROBE_RUNS`` read on the pooled medians. One run a side never decides by itself: a
    run-to-run swing of 5 % (seen here on the 2 x 1 Gloo job: 43.4 against 45.9 ms) would
    otherwise decide the rung alone. Returns the reading, its figures and every record."""
    from experiments.runner import PROBE_RUNS, outcome
    at: dict[int, list[list[dict]]] = {1: [], 2: []}
    for n in range(PROBE_RUNS):
        for k in at:
            at[k].append(_runs_at(tmp_path, k, layout, rate, launcher, tool, n))
        reading, figures = outcome(at[1], at[2], final=n == PROBE_RUNS - 1)
        if reading != "unresolved":
            break
    return reading, figures, [r for runs in at.values() for recs in runs for r in recs]


def test_outcome_rule_reads_a_gloo_job_at_200mbit_link_bound(tmp_path):
    """The outcome rule on real runs (experiments.runner.outcome, the ladder's): 2 x 1
    torch-gloo at 200 Mbit/s, a 1 MiB all-reduce (42 ms of link a call), runs at K = 1 and
    K = 2 until decided: the figures agree within 5 %, link-bound, whatever the run's own
    counters read about Gloo's worker threads."""
    tool = ["commbench.microbench", "-b", "1M", "-e", "1M", "-n", "8", "-w", "2", "--quiet",
            "--algo", "native"]
    reading, figures, records = _ladder_reading(tmp_path, (2, 1), "200mbit", "torchrun", tool)
    assert {r["backend"] for r in records} == {"torch-gloo"}
    assert reading == "converged", figures


def test_outcome_rule_reads_hier_on_2x4_at_k1_host_bound(tmp_path):
    """2 x 4 hier at 1 Gbit/s under Open MPI, 8 ranks on this machine's 2 cores: at K = 1
    the figure moves by more than 5 % against K = 2 (the host's share, not the link's)."""
    tool = ["commbench.microbench", "-b", "256K", "-e", "256K", "-n", "8", "-w", "2",
            "--quiet", "--algo", "hier"]
    reading, figures, _ = _ladder_reading(tmp_path, (2, 4), "1gbit", "mpirun", tool)
    assert reading == "moved", figures
