"""torchrun as a launcher: its command on one machine and across nodes (one torchrun per
node, started together by ``launch.nodes``), the programs it can start, and the driver
that ends every node when one fails. The emulated-cluster job is in tests/test_cluster.py,
the Slurm script in tests/test_slurm.py."""

from __future__ import annotations

import itertools
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from commbench.cores import MACHINE_RANKS_ENV
from launch import commands, nodes
from launch.cluster import ClusterSpec
from launch.cluster import _cli as cluster_cli
from launch.commands import NodeSet, on_nodes
from launch.slurm import main as slurm_main
from tests.conftest import PY, ROOT

PROG = commands.python_module("commbench.allreduce", ["--steps", "2"], python=PY)
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def node_commands(argv: list[str]) -> list[tuple[str, dict[str, str], list[str]]]:
    """The driver's nodes in ``argv``: (host, environment set, torchrun's argv)."""
    assert argv[:3] == [sys.executable, "-m", nodes.__name__], argv
    out = []
    for i, a in enumerate(argv):
        if a == "--node":
            words = shlex.split(argv[i + 2])
            assert words[0] == "env", words
            sets = list(itertools.takewhile(ASSIGNMENT.match, words[1:]))
            out.append((argv[i + 1], dict(w.split("=", 1) for w in sets),
                        words[1 + len(sets):]))
    return out


def test_one_machine_is_torchrun_standalone_running_the_module():
    argv = commands.launcher_argv("torchrun", 4, PROG, env={"COMMBENCH_X": "1"})
    assert argv[:2] == ["env", "COMMBENCH_X=1"]  # torchrun passes its environment on
    assert argv[2:5] == [PY, "-m", "torch.distributed.run"]
    assert _flag(argv, "--nproc-per-node") == "4" and _flag(argv, "--nnodes") == "1"
    assert "--standalone" in argv  # its own store on a free port: no port to pick
    # torchrun takes the module, not the interpreter: it runs each worker as 'python -u -m'
    assert argv[-4:] == ["-m", "commbench.allreduce", "--steps", "2"]
    assert argv.count(PY) == 1
    script = commands.launcher_argv("torchrun", 2, [PY, "tests/mpi/x.py", "torch"])
    assert script[-2:] == ["tests/mpi/x.py", "torch"] and script[-3] == "--standalone"
    assert commands.controller("torchrun") is None  # no Horovod under torchrun
    assert "torchrun" in commands.LAUNCHERS


@pytest.mark.parametrize("program, why", [
    (["true"], "Python programs only"),
    ([], "Python programs only"),
    ([PY, "-c", "pass"], "not options to the interpreter or -c"),
    ([PY, "-u", "-m", "commbench.allreduce"], "not options to the interpreter"),
    ([PY, "-m"], "python -m MODULE"),
])
def test_a_program_torchrun_cannot_start_is_refused_saying_what_it_takes(program, why):
    with pytest.raises(ValueError, match=why):
        commands.launcher_argv("torchrun", 2, program)
    with pytest.raises(ValueError, match=why):
        on_nodes(NodeSet.parse("a:1,b:1"), "torchrun", 2, program)


@pytest.mark.parametrize("tool, args", [
    (cluster_cli, ["run", "--name", "cbt", "--slots", "1,1", "--launcher", "torchrun", "--",
                   "true"]),
    (slurm_main, ["--nodes", "2", "--tasks-per-node", "2", "--launcher", "torchrun", "--",
                  "true"]),
])
def test_tools_refuse_such_a_program_with_exit_2_naming_the_flag(tool, args, capsys):
    assert tool(args) == 2  # before any cluster is made or script written
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--launcher torchrun: torchrun starts Python" in err


def test_across_nodes_one_torchrun_per_node_with_the_rendezvous_on_the_first():
    spec = ClusterSpec(nodes=2, slots=2, name="cbt")
    argv = on_nodes(spec.node_set, "torchrun", 4, PROG, {"COMMBENCH_LINK_SHAPING": "1gbit"})
    assert _flag(argv, "--rsh") == str(spec.agent)  # the cluster's agent, as mpirun's
    got = node_commands(argv)
    assert [host for host, _, _ in got] == [n.addr for n in spec.node_list]
    ports = set()
    for i, (_, env, cmd) in enumerate(got):
        assert cmd[:3] == [PY, "-m", "torch.distributed.run"]
        assert (_flag(cmd, "--nnodes"), _flag(cmd, "--node-rank")) == ("2", str(i))
        assert _flag(cmd, "--nproc-per-node") == "2"
        assert _flag(cmd, "--master-addr") == spec.node_list[0].addr
        ports.add(_flag(cmd, "--master-port"))
        assert cmd[-4:] == ["-m", "commbench.allreduce", "--steps", "2"]
        # the libraries' traffic on the node link; the job's settings; all ranks share
        # this machine's cores
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth0"
        assert env["COMMBENCH_LINK_SHAPING"] == "1gbit" and env[MACHINE_RANKS_ENV] == "4"
        assert not any(w.startswith("--mca") or "mca" in w for w in cmd)  # mpirun's only
    assert len(ports) == 1 and 1 <= int(ports.pop()) < 65536


def test_uneven_nodes_and_fewer_ranks_fill_the_nodes_in_order():
    uneven = ClusterSpec(nodes=None, slots="3,1", name="cbt").node_set
    got = node_commands(on_nodes(uneven, "torchrun", 4, PROG))
    assert [_flag(cmd, "--nproc-per-node") for _, _, cmd in got] == ["3", "1"]
    # as mpirun places them: 5 ranks on 4 + 4 slots are 4 + 1, 3 ranks stay on one node
    four = NodeSet.parse("a:4,b:4")
    assert [_flag(c, "--nproc-per-node") for _, _, c in
            node_commands(on_nodes(four, "torchrun", 5, PROG))] == ["4", "1"]
    [(host, _, cmd)] = node_commands(on_nodes(four, "torchrun", 3, PROG))
    assert host == "a" and _flag(cmd, "--nnodes") == "1" and _flag(cmd, "--nproc-per-node") \
        == "3"
    assert commands.fill_nodes([3, 1], 4) == [3, 1] and commands.fill_nodes([2, 2], 1) == [1]
    with pytest.raises(ValueError, match="do not fit"):
        on_nodes(uneven, "torchrun", 5, PROG)


def test_real_hosts_are_reached_with_ssh_and_their_port():
    argv = on_nodes(NodeSet.parse("n1:2,n2:2", ssh_port=2222, iface="ib0"), "torchrun", 4,
                    PROG)
    assert _flag(argv, "--rsh") == "ssh -p 2222"
    got = node_commands(argv)
    assert all(env["GLOO_SOCKET_IFNAME"] == "ib0" for _, env, _ in got)
    assert MACHINE_RANKS_ENV not in got[0][1]  # real hosts: each its own cores
    assert _flag(commands.launcher_argv("torchrun", 2, PROG, hosts="a:1,b:1"), "--rsh") == "ssh"


def test_the_driver_runs_each_command_in_this_directory_through_the_agent():
    remote = nodes.node_argv(["agent"], "cbnode1", "env A=1 prog 'x y'", "/some dir")
    assert remote == ["agent", "cbnode1", "cd '/some dir' && exec env A=1 prog 'x y'"]
    assert nodes.node_argv(["ssh"], "localhost", "prog", "/d")[:2] == ["sh", "-c"]
    assert nodes.status_of(-9) == 137 and nodes.status_of(3) == 3


def start_driver(*node_cmds: str, **kw) -> subprocess.Popen:
    argv = [PY, "-m", "launch.nodes"]
    for c in node_cmds:
        argv += ["--node", "localhost", c]
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def test_driver_passes_output_through_and_ends_the_others_on_the_first_failure():
    ok = start_driver("echo one", "sh -c 'sleep 0.2; echo two'")
    out, err = ok.communicate(timeout=30)
    assert ok.returncode == 0 and sorted(out.split()) == ["one", "two"], err
    t = time.monotonic()
    bad = start_driver("sleep 60", "sh -c 'sleep 0.3; exit 3'", start_new_session=True)
    try:
        out, err = bad.communicate(timeout=30)
    finally:
        if bad.poll() is None:
            bad.kill()
    assert bad.returncode == 3 and time.monotonic() - t < 10, err  # not 60 s
    assert "node localhost exited with status 3; ending the other 1" in err


def test_driver_on_sigterm_ends_every_node():
    proc = start_driver("sleep 61", "sleep 62", start_new_session=True)
    try:
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and "SIGTERM" in err
    ps = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True).stdout
    assert not [p for p in ps.splitlines() if p in ("sleep 61", "sleep 62")]


def test_uneven_nodes_get_contiguous_ranks(tmp_path):
    """torch's elastic agent takes a different --nproc-per-node on each node: ranks come out
    in node order, contiguous per node (3 + 1 here: 0-2, then 3). Both "nodes" are this
    machine (localhost runs without ssh), each torchrun with its own node rank."""
    script = tmp_path / "ranks.py"
    # each worker writes a file of its own: lines of 4 processes on one pipe interleaved
    # once in a full-suite run (one rank's line lost)
    script.write_text("import os, sys\ne = os.environ\n"
                      "open(os.path.join(sys.argv[1], 'rank' + e['RANK']), 'w').write("
                      "' '.join((e['RANK'], e['GROUP_RANK'], e['WORLD_SIZE'])))\n")
    out = tmp_path / "ranks"
    out.mkdir()
    argv = commands.launcher_argv("torchrun", 4, [PY, str(script), str(out)],
                                  hosts="localhost:3,localhost:1")
    res = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    got = sorted(tuple(f.read_text().split()) for f in out.iterdir())
    assert got == [("0", "0", "4"), ("1", "0", "4"), ("2", "0", "4"), ("3", "1", "4")]
