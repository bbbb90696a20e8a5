"""Uneven nodes from the command line: ``--slots 3,1`` (slots per node), without a host file.

Pure Python: parsing, the host file and host list the cluster writes, the launch commands,
sweep layouts and the study's cluster; bad input exits 2 before anything is created.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess

import pytest

from commbench.allreduce import Config
from experiments import study
from experiments.claims import StudyCluster
from experiments.job import Job, Placement
from launch import commands
from launch.cluster import ClusterError, ClusterSpec, node_slots, parse_slots
from launch.commands import layout_text
from launch.sweep import SweepError, launch_point, make_sweep, parse_set, point_id
from tests.conftest import PY, ROOT
from tests.test_study import planned_records

NAME = "cbs"


@pytest.mark.parametrize("nodes,slots,expected", [
    (None, "3,1", [3, 1]),
    (2, "3,1", [3, 1]),
    (2, "4", [4, 4]),
    (3, 2, [2, 2, 2]),
    (None, [2, 1], [2, 1]),
    (None, "1, 2 ,3", [1, 2, 3]),
    (1, [4], [4]),
])
def test_node_slots(nodes, slots, expected):
    assert node_slots(nodes, slots) == expected


@pytest.mark.parametrize("nodes,slots,message", [
    (None, "0,2", "--slots 0,2: every node needs at least 1 slot"),
    (None, "3,x", "--slots 3,x: 'x' is not a whole number"),
    (None, "3,,1", "is not a whole number"),
    (None, "-1", "is not a whole number"),
    (3, "3,1", "--nodes 3 does not match --slots 3,1 (2 nodes)"),
    (1, [2, 2], "--nodes 1 does not match --slots 2,2 (2 nodes)"),
    (None, "4", "--slots 4: give --nodes too"),
    (0, "2", "--nodes must be >= 1"),
])
def test_node_slots_bad_input(nodes, slots, message):
    with pytest.raises(ClusterError) as e:
        node_slots(nodes, slots)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_parse_slots_names_the_given_setting():
    with pytest.raises(ClusterError, match=r"^grid\.slots 0,2:"):
        parse_slots("0,2", "grid.slots")


def test_layout_text():
    assert layout_text([4, 4]) == "2 nodes x 4 slots"
    assert layout_text([3, 1]) == "2 nodes (3+1 slots)"


def test_spec_3_1_host_list_and_host_file():
    spec = ClusterSpec(nodes=None, slots="3,1", name=NAME)
    assert (spec.nodes, spec.slots, spec.ranks) == (2, [3, 1], 4)
    a, b = (n.addr for n in spec.node_list)
    assert spec.node_set.hosts_arg() == f"{a}:3,{b}:1"
    assert spec.node_set.hostfile_text() == f"{a} slots=3\n{b} slots=1\n"
    assert spec.layout == spec.node_set.layout == "2 nodes (3+1 slots)"
    # the same number on every node still means what it did
    even = ClusterSpec(nodes=2, slots=3, name=NAME)
    assert even.slots == [3, 3] and even.node_set.hosts_arg() == f"{a}:3,{b}:3"


def test_spec_round_trips_through_its_state_file(tmp_path, monkeypatch):
    import launch.cluster as lc

    monkeypatch.setattr(lc, "STATE_DIR", tmp_path)
    ClusterSpec(nodes=None, slots=[3, 1], name=NAME).save()
    loaded = ClusterSpec.load(NAME)
    assert loaded.slots == [3, 1] and loaded.nodes == 2


def test_launch_commands_for_3_1():
    spec = ClusterSpec(nodes=None, slots="3,1", name=NAME)
    argv = commands.on_nodes(spec.node_set, "mpirun", 4, ["true"])
    assert argv[argv.index("--host") + 1] == spec.node_set.hosts_arg()
    hvd = commands.on_nodes(spec.node_set, "horovodrun", 4, ["true"])
    assert hvd[hvd.index("-H") + 1] == spec.node_set.hosts_arg()
    for launcher in commands.LAUNCHERS:
        with pytest.raises(ValueError, match=r"5 ranks do not fit 2 nodes \(3\+1 slots\)"):
            commands.on_nodes(spec.node_set, launcher, 5, ["true"])


def test_sweep_layouts():
    sweep = make_sweep({}, parse_set(["slots=3+1,2+2", "rate=1gbit"]))
    assert [p["slots"] for p in sweep.points()] == [[3, 1], [2, 2]]
    assert point_id(sweep.points()[0], sweep).startswith("slots3+1-rate1gbit-")
    assert make_sweep({}, {"slots": ["3,1"], "nodes": [2]}).points()[0]["slots"] == [3, 1]
    assert make_sweep({}, {"slots": [[3, 1]]}).points()[0]["slots"] == [3, 1]
    # one number per value keeps its meaning (and its point ids)
    even = make_sweep({}, {"slots": [2], "nodes": [2]})
    assert even.points() == [{"slots": 2, "nodes": 2}]
    assert make_sweep({}, parse_set(["slots=4,2", "nodes=2"])).grid["slots"] == [4, 2]


@pytest.mark.parametrize("grid,message", [
    ({"slots": ["3+1"], "nodes": [3]}, "grid.nodes 3 does not match grid.slots 3,1 (2 nodes)"),
    ({"slots": ["0+2"]}, "grid.slots 0,2: every node needs at least 1 slot"),
    ({"slots": ["3+x"]}, "grid.slots 3,x"),
    ({"slots": ["3+1"], "ranks": [5]}, "5 ranks is more than 2 nodes (3+1 slots)"),
    ({"slots": [4]}, "give grid.nodes too"),
])
def test_sweep_bad_layouts(grid, message):
    with pytest.raises(SweepError) as e:
        make_sweep({}, grid)
    assert message in str(e.value)


def test_sweep_point_on_uneven_cluster_goes_to_its_launcher(tmp_path):
    """launch_point asks for the cluster by its per-node slots and fills its ranks."""
    class FakeClusters:
        def dilation_of(self, point):
            return point.get("dilation", 1.0)

        def get(self, slots, rate, dilation=1.0):
            self.asked = (slots, rate, dilation)
            return ClusterSpec(nodes=None, slots=slots, name=NAME, dilation=dilation), None

    sweep = make_sweep({}, {"slots": ["2+1"], "rate": ["1gbit"]})
    fake = FakeClusters()
    argv = launch_point(sweep.points()[0], sweep, tmp_path / "p.jsonl", fake)
    assert fake.asked == ([2, 1], "1gbit", 1.0)
    assert argv[argv.index("-np") + 1] == "3"


def _study_args(**kw) -> argparse.Namespace:
    return study.build_parser().parse_args(
        [a for k, v in kw.items() for a in (f"--{k}", str(v))])


def test_study_cluster_uneven():
    c = study.make_cluster(_study_args(slots="3,1"))
    p = c.placement
    assert (p.nodes, p.node_slots, c.ranks, p.layout) == (2, [3, 1], 4, "2 nodes (3+1 slots)")
    # the emulated cluster runs time-dilated, K chosen by probing, unless told otherwise
    assert study.make_cluster(_study_args()) == StudyCluster(Placement(2, 4, dilation="auto"))
    assert study.make_cluster(_study_args(nodes=3)) == StudyCluster(
        Placement(3, 4, dilation="auto"))
    assert study.make_cluster(_study_args(slots=2, dilation=4)) == StudyCluster(
        Placement(2, 2, dilation=4.0))
    real = study.make_cluster(_study_args(hosts="a:3,b:1"))
    assert real.placement.node_slots == [3, 1] and not real.placement.emulated
    with pytest.raises(study.StudyError, match="--nodes 3 does not match --slots 3,1"):
        study.make_cluster(_study_args(nodes=3, slots="3,1"))
    at = dataclasses.replace(p, rate="1gbit")  # a job of the study on that cluster
    config = Config(model="resnet18")  # a model: the job's estimate counts its parameters
    job = Job("j", config, at, sets=frozenset({"C1"}))
    assert job.point()["slots"] == [3, 1] and job.nranks == 4
    recs = planned_records(job)
    assert recs and all(r["local_sizes"] == [3, 1] and r["nodes"] == 2 for r in recs)
    three = planned_records(Job("k", config, at, ranks=3, sets=frozenset({"C1"})))
    assert all(r["local_sizes"] == [3] and r["nodes"] == 1 for r in three)


@pytest.mark.parametrize("cmd,args,message", [
    ("run", ["--slots", "0,2"], "--slots 0,2: every node needs at least 1 slot"),
    ("run", ["--slots", "3,x"], "--slots 3,x"),
    ("run", ["--nodes", "3", "--slots", "3,1"], "--nodes 3 does not match --slots 3,1"),
    ("run", ["--slots", "2"], "give --nodes too"),
    ("run", ["--slots", "2,1", "--np", "4"], "--np 4 is more ranks than 2 nodes (2+1 slots)"),
    ("up", ["--slots", "3,1", "--nodes", "1"], "--nodes 1 does not match --slots 3,1"),
    ("up", ["--slots", "1,0"], "--slots 1,0"),
])
def test_cli_bad_slots_exit_2_before_creating_anything(cmd, args, message):
    tail = ["--", "python", "-c", "pass"] if cmd == "run" else []
    res = subprocess.run([PY, "-m", "launch.cluster", cmd, "--name", NAME, *args, *tail],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "down" in subprocess.run([PY, "-m", "launch.cluster", "status", "--name", NAME],
                                    cwd=ROOT, capture_output=True, text=True,
                                    timeout=60).stdout


@pytest.mark.parametrize("args,message", [
    (["--set", "slots=3+1", "--set", "nodes=3"], "grid.nodes 3 does not match grid.slots"),
    (["--set", "slots=0+1"], "grid.slots 0,1"),
])
def test_sweep_cli_bad_slots_exit_2(tmp_path, args, message):
    res = subprocess.run([PY, "-m", "launch.sweep", *args, "-o", str(tmp_path / "s")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert not (tmp_path / "s").exists()


def test_study_cli_bad_slots_exit_2(tmp_path):
    res = subprocess.run([PY, "-m", "experiments.study", "--slots", "3,x", "--dry-run", "-o",
                          str(tmp_path / "s")], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and "--slots 3,x" in res.stderr, res.stderr
    assert "experiments.study: error:" in res.stderr and not (tmp_path / "s").exists()


def test_cli_run_refuses_slots_that_differ_from_the_cluster_up(tmp_path, monkeypatch, capsys):
    """A cluster already up with 2 x 2 is not silently used for ``--slots 3,1``."""
    import launch.cluster as lc

    monkeypatch.setattr(lc, "STATE_DIR", tmp_path)
    ClusterSpec(nodes=2, slots=2, name=NAME).save()  # a state file only; nothing is made
    assert lc._cli(["run", "--name", NAME, "--slots", "3,1", "--", "true"]) == 2
    assert "--slots 3,1: cluster cbs is up with 2 nodes x 2 slots" in capsys.readouterr().err
