"""One launch recipe: the node set, its launch commands and link settings (pure Python).

The emulated cluster (``launch.cluster``) and the containers (``docker/entrypoint.py``)
build their commands with the same ``launch.commands.on_nodes``; these tests pin what
that function gives each kind of node set, without starting anything.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from commbench.cores import MACHINE_RANKS_ENV
from commbench.linkstats import GBPS_ENV, IFACE_ENV, SHAPING_ENV, WIRE_GBPS_ENV
from commbench.results import link_info
from experiments import study
from launch import cluster, commands, links, sweep
from launch.cluster import ClusterSpec
from launch.commands import Host, NodeSet, on_nodes
from tests.conftest import ROOT

PROG = ["python", "-m", "commbench.allreduce"]


def _entrypoint():
    name = "commbench_docker_entrypoint"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "docker" / "entrypoint.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _mca(argv: list[str]) -> dict[str, str]:
    """The ``--mca K V`` of an mpirun command, or of horovodrun's ``--mpi-args``."""
    if "--mpi-args" in argv:
        argv = argv[argv.index("--mpi-args") + 1].split()
    return {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--mca"}


def _assignments(argv: list[str]) -> dict[str, str]:
    """The ``env K=V ...`` in front of a command."""
    if argv[0] != "env":
        return {}
    out = {}
    for a in argv[1:]:
        if "=" not in a:
            break
        k, _, v = a.partition("=")
        out[k] = v
    return out


def test_launchers_are_defined_once():
    assert commands.LAUNCHERS == ("mpirun", "horovodrun", "horovodrun-gloo", "torchrun")
    for module in (cluster, sweep, _entrypoint()):
        assert module.LAUNCHERS is commands.LAUNCHERS
    assert study.build_parser().parse_args(["--launcher", "horovodrun-gloo"]).launcher
    assert [commands.controller(x) for x in commands.LAUNCHERS] == ["mpi", "mpi", "gloo", None]
    with pytest.raises(ValueError, match="launcher must be one of"):
        commands.controller("srun")


def test_node_set_parse_and_layout():
    nodes = NodeSet.parse("a:3,b:1")
    assert nodes.hosts == (Host("a", 3), Host("b", 1))
    assert (nodes.ranks, nodes.layout) == (4, "2 nodes (3+1 slots)")
    assert nodes.hosts_arg() == "a:3,b:1"
    assert nodes.hostfile_text() == "a slots=3\nb slots=1\n"
    for bad in ("a:3,b", "a:0", ":2", "a:x"):
        with pytest.raises(ValueError, match=r"^HOSTS: .* is not HOST:SLOTS"):
            NodeSet.parse(bad, "HOSTS")


def test_emulated_and_container_nodes_get_the_same_recipe():
    """The same settings for what both kinds of nodes share: every node on this machine."""
    emulated = ClusterSpec(nodes=2, slots=2, name="cbr").node_set
    containers = _entrypoint().read_settings({"WORKERS": "2", "SLOTS": "2",
                                              "LAUNCHER": "mpirun"}).nodes
    for nodes in (emulated, containers):
        argv = on_nodes(nodes, "mpirun", 4, PROG, {SHAPING_ENV: "1gbit"})
        mca = _mca(argv)
        assert mca["hwloc_base_binding_policy"] == "none"
        assert mca["oob_tcp_if_include"] == mca["btl_tcp_if_include"] == nodes.network
        assert (mca["btl"], mca["pml"]) == ("self,vader,tcp", "ob1")
        assert argv[argv.index("--host") + 1] == nodes.hosts_arg()
        assert "--oversubscribe" in argv
        assert _assignments(argv)[MACHINE_RANKS_ENV] == "4"
        for name in (MACHINE_RANKS_ENV, SHAPING_ENV):
            assert argv[argv.index(name) - 1] == "-x"
        assert argv[-len(PROG):] == PROG
    # what differs is how the nodes are reached
    assert _mca(on_nodes(emulated, "mpirun", 4, PROG))["plm_rsh_agent"] == emulated.rsh_agent
    assert "plm_rsh_agent" not in _mca(on_nodes(containers, "mpirun", 4, PROG))


def test_yield_only_when_the_machine_is_oversubscribed(monkeypatch):
    nodes = NodeSet.parse("a:2,b:2", shared_machine=True)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    for launcher in ("mpirun", "horovodrun"):
        assert _mca(on_nodes(nodes, launcher, 4, PROG))["mpi_yield_when_idle"] == "1"
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert "mpi_yield_when_idle" not in _mca(on_nodes(nodes, "mpirun", 4, PROG))
    # real hosts have their own cores: no yield, no unbinding, no machine ranks
    real = NodeSet.parse("a:8,b:8")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    argv = on_nodes(real, "mpirun", 16, PROG)
    assert _mca(argv) == {} and "--oversubscribe" not in argv and argv[0] == "mpirun"


def test_horovodrun_on_nodes():
    spec = ClusterSpec(nodes=2, slots=2, name="cbr")
    argv = on_nodes(spec.node_set, "horovodrun", 4, PROG)
    assert argv[argv.index("--network-interfaces") + 1] == "eth0"
    assert _assignments(argv)["PATH"].startswith(f"{spec.folder / 'bin'}:")
    mca = _mca(argv)
    assert mca["plm_rsh_agent"] == str(spec.agent)
    assert not {"btl", "pml", "btl_tcp_if_include"} & set(mca)  # horovodrun sets those
    gloo = on_nodes(spec.node_set, "horovodrun-gloo", 4, PROG)
    assert "--gloo" in gloo and "--mpi-args" not in gloo
    port = NodeSet.parse("n1:1,n2:1", ssh_port=2222)
    argv = on_nodes(port, "horovodrun", 2, PROG)
    assert argv[argv.index("-p") + 1] == "2222"  # horovodrun passes it on to mpirun itself
    assert "plm_rsh_args" not in _mca(argv)
    argv = on_nodes(port, "mpirun", 2, PROG)
    assert argv[argv.index("plm_rsh_args") + 1] == "-p 2222"


def test_launcher_argv_on_this_machine():
    assert commands.launcher_argv("mpirun", 2, PROG)[:3] == ["mpirun", "-np", "2"]
    hvd = commands.launcher_argv("horovodrun-gloo", 2, PROG, hosts="a:1,b:1")
    assert hvd[0] == commands.horovodrun_path() and "--gloo" in hvd
    assert hvd[hvd.index("-H") + 1] == "a:1,b:1"


def test_link_env_is_what_records_read():
    env = links.link_env(1.0, "eth0", {"gbps": 0.95, "wire_gbps": 0.99})
    assert env == {SHAPING_ENV: "1gbit", IFACE_ENV: "eth0", GBPS_ENV: "0.9500",
                   WIRE_GBPS_ENV: "0.9900"}
    assert link_info(env) == {"link_gbps": 0.95, "link_wire_gbps": 0.99,
                              "link_shaping": "1gbit"}
    assert links.link_env(None, None) == {SHAPING_ENV: "none"}


def test_shape_argv():
    assert links.shape_argv("eth0", 0.2, prefix=["ip", "netns", "exec", "n1"]) == [
        "ip", "netns", "exec", "n1", "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
        "rate", "200000kbit", "burst", "256kb", "latency", "50ms"]
    with pytest.raises(ValueError, match="must be > 0"):
        links.shape_argv("eth0", 0)
