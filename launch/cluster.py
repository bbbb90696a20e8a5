"""An emulated cluster on one machine: N nodes x S slots (or S1,S2,... per node), links shaped.

Each node is a Linux network namespace joined to a bridge by a veth pair
(``eth0`` inside the node) on a private subnet; processes started on a node
also get their own UTS namespace so the node has its own host name (without
it Open MPI takes all nodes for one host and its shared-memory transport
crashes). Ranks on one node talk through shared memory; ranks on different
nodes only through their links, each shaped with ``tc tbf`` in both
directions (node egress inside the namespace, node ingress on the host side).

Processes reach the nodes through a generated rsh agent (for ``mpirun --mca
plm_rsh_agent``, and ``launch.nodes``, which starts one ``torchrun`` per node) and an
``ssh`` stand-in on PATH (for ``horovodrun``); both map a node's name or address to
``ip netns exec NS unshare --uts``.

What ``up`` makes is written to a state file before it is made, so ``down`` —
from the same process at exit, failure, SIGINT or SIGTERM, or from
``python -m launch.cluster down`` later — removes every namespace, link,
bridge, firewall rule and process of the cluster.

Usage::

    sudo python -m launch.cluster up --nodes 2 --slots 4 --rate 1gbit
    sudo python -m launch.cluster up --slots 3,1 --rate 1gbit     # uneven: 3 + 1 ranks
    python -m launch.cluster status
    python -m launch.cluster run -- python -m commbench.allreduce   # mpirun across the nodes
    python -m launch.cluster run --launcher torchrun -- python -m commbench.allreduce
    #   one torchrun per node: --nproc-per-node from --slots, rendezvous on node 1's address,
    #   GLOO_SOCKET_IFNAME=eth0 (the torch backend on Gloo)
    sudo python -m launch.cluster down

Time dilation (``--dilation K``, ``commbench.dilation``): the links run at rate / K
and every rank is told K, so that everything else on emulated time (replayed
compute, pollers, Horovod's cycle, deadlines) runs K times slower and records
hold emulated time; the link test is multiplied back by K. ``--rate`` stays the
emulated rate. This machine then looks K times faster to the job: the way to take
its cores out of a figure where ranks outnumber them.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from commbench import dilation as dil
from commbench.cores import LOADAVG_ENV, RUNNABLE_ENV, load_average, runnable_tasks
from launch import commands, links, linktest
from launch.commands import LAUNCHERS, NodeSet, NodeSlots
from launch.execute import run

STATE_DIR = Path(os.environ.get("COMMBENCH_CLUSTER_DIR", "/run/commbench-cluster"))
DEFAULT_SUBNET = "10.213.57.0/24"  # private; nothing else on this machine uses it
DEFAULT_NAME = "cb"
RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$", re.IGNORECASE)
RATE_UNITS = {"bit": 1e-9, "kbit": 1e-6, "mbit": 1e-3, "gbit": 1.0, "tbit": 1e3}


class ClusterError(Exception):
    """A problem with the request or the machine; the message names it."""


def parse_rate(rate: str | None) -> float | None:
    """``'1gbit'`` -> 1.0 (Gbit/s); ``None``/``'none'``/``'unshaped'`` -> None."""
    if rate is None or rate.lower() in ("none", "unshaped", "0"):
        return None
    m = RATE_RE.match(rate.strip())
    if not m or float(m.group(1)) <= 0:
        raise ClusterError(f"--rate: cannot read link rate {rate!r}; use e.g. 200mbit, 1gbit, "
                           "10gbit or none")
    return float(m.group(1)) * RATE_UNITS[m.group(2).lower()]


def parse_slots(text: str | int | Sequence[int], flag: str = "--slots") -> list[int]:
    """Slots as given: ``'3,1'`` or ``[3, 1]`` -> [3, 1] (one per node); ``'4'`` or 4 ->
    [4] (which ``node_slots`` spreads over every node). ``flag`` names the setting in errors."""
    if isinstance(text, int) and not isinstance(text, bool):
        values: list = [text]
    elif isinstance(text, str):
        values = [v.strip() for v in text.split(",")]
    elif isinstance(text, (list, tuple)):
        values = list(text)
    else:
        raise ClusterError(f"{flag}: cannot read slots {text!r}; write e.g. 4 (every node) "
                           "or 3,1 (per node)")
    shown = ",".join(str(v) for v in values) if not isinstance(text, str) else text
    out = []
    for v in values:
        if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, str)
                                                               and v.isdigit())):
            raise ClusterError(f"{flag} {shown}: {v!r} is not a whole number; write slots "
                               "per node as e.g. 4 (every node) or 3,1")
        out.append(int(v))
    if any(v < 1 for v in out):
        raise ClusterError(f"{flag} {shown}: every node needs at least 1 slot")
    return out


def node_slots(nodes: int | None, slots: str | int | Sequence[int], *,
               nodes_flag: str = "--nodes", slots_flag: str = "--slots") -> list[int]:
    """Slots of each node: one number for every node of ``nodes``, or a list with one
    entry per node (``nodes`` may then be None, and must match its length if given)."""
    if nodes is not None and nodes < 1:
        raise ClusterError(f"{nodes_flag} must be >= 1, got {nodes}")
    per_node = parse_slots(slots, slots_flag)
    listed = not isinstance(slots, int) and (len(per_node) > 1 or not isinstance(slots, str))
    if len(per_node) == 1 and not listed:  # one number: every node
        if nodes is None:
            raise ClusterError(f"{slots_flag} {per_node[0]}: give {nodes_flag} too, or list "
                               f"every node's slots (e.g. {slots_flag} "
                               f"{per_node[0]},{per_node[0]})")
        return per_node * nodes
    if nodes is not None and nodes != len(per_node):
        raise ClusterError(f"{nodes_flag} {nodes} does not match {slots_flag} "
                           f"{','.join(map(str, per_node))} ({len(per_node)} nodes): give one "
                           f"slot count per node, or one number for every node")
    return per_node


@dataclass
class Node:
    index: int
    name: str      # host name inside the node (UTS namespace)
    netns: str
    veth: str      # host-side end; the node side is eth0
    addr: str


# What ``up`` writes in the cluster's folder (``ClusterSpec.folder``):
AGENT = "rsh-agent"     # the rsh agent (mpirun's plm_rsh_agent)
SSH_DIR = "bin"         # bin/ssh, the same agent as horovodrun's ssh: put it first on PATH
HOSTS_FILE = "etc-hosts"  # /etc/hosts as the nodes see it: the machine's plus the nodes
HOSTFILE = "hostfile"   # the Open MPI host file, for users' own mpirun


@dataclass
class ClusterSpec(NodeSlots):
    """The cluster's shape and names. ``slots`` is one number for every node or a list,
    one per node (``nodes`` may then be None); after construction it is always the
    per-node list and ``nodes`` its length."""

    nodes: int | None
    slots: list[int] | int | str
    rate_gbps: float | None = None  # emulated: the links run at rate_gbps / dilation
    subnet: str = DEFAULT_SUBNET
    name: str = DEFAULT_NAME
    node_list: list[Node] = field(default_factory=list)
    bridge: str = ""
    bridge_addr: str = ""
    iptables_rule: list[str] | None = None
    created: float = 0.0
    #: wall time / emulated time (``commbench.dilation``)
    dilation: float = 1.0

    def __post_init__(self) -> None:
        self.slots = node_slots(self.nodes, self.slots)
        self.nodes = len(self.slots)
        if not re.fullmatch(r"[a-z][a-z0-9]{0,5}", self.name):
            raise ClusterError(f"--name must be 1-6 lowercase letters/digits, got {self.name!r}")
        try:
            net = ipaddress.ip_network(self.subnet)
        except ValueError as e:
            raise ClusterError(f"--subnet: {e}") from None
        hosts = list(net.hosts())
        if len(hosts) < self.nodes + 2:
            raise ClusterError(f"--subnet {self.subnet} is too small for {self.nodes} nodes")
        self.bridge = f"{self.name}-br"
        self.bridge_addr = str(hosts[0])
        if not self.node_list:
            self.node_list = [
                Node(index=i, name=f"{self.name}node{i}", netns=f"{self.name}-n{i}",
                     veth=f"{self.name}-v{i}", addr=str(hosts[9 + i]))
                for i in range(1, self.nodes + 1)]

    @property
    def node_slots(self) -> list[int]:
        return list(self.slots)

    @property
    def prefixlen(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen

    @property
    def state_file(self) -> Path:
        return STATE_DIR / f"{self.name}.json"

    @property
    def folder(self) -> Path:
        """Where the cluster's files are (AGENT, SSH_DIR, HOSTS_FILE, HOSTFILE)."""
        return STATE_DIR / self.name

    @property
    def agent(self) -> Path:
        return self.folder / AGENT

    @property
    def node_set(self) -> NodeSet:
        """The nodes by address with their slots, reached through the cluster's agent; every
        node is on this machine, and the nodes' link is ``eth0``."""
        return NodeSet(tuple(commands.Host(n.addr, s) for n, s in zip(self.node_list, self.slots)),
                       network=self.subnet, iface="eth0", rsh_agent=str(self.agent),
                       ssh_dir=str(self.folder / SSH_DIR), shared_machine=True)

    def save(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(self.state_file)

    @classmethod
    def load(cls, name: str = DEFAULT_NAME) -> ClusterSpec | None:
        path = STATE_DIR / f"{name}.json"
        if not path.exists():
            return None
        d = json.loads(path.read_text())
        d["node_list"] = [Node(**n) for n in d["node_list"]]
        return cls(**d)


def _run(argv: Sequence[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(list(argv), capture_output=True, text=True, **kw)
    if check and res.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed: {res.stderr.strip() or res.stdout.strip()}")
    return res


def _in_ns(ns: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def check_machine() -> None:
    """Fail before creating anything when the machine cannot host the cluster."""
    if os.geteuid() != 0:
        raise ClusterError("the emulated cluster needs root (network namespaces, veth, tc); "
                           "run as root or under sudo")
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            raise ClusterError(f"{tool} not found: install iproute2 and util-linux")


def _agent_script(spec: ClusterSpec) -> str:
    cases = "\n".join(
        f'  {n.addr}|{n.name}) ns={n.netns}; name={n.name} ;;' for n in spec.node_list)
    return f"""#!/bin/sh
# rsh agent / ssh stand-in of emulated cluster '{spec.name}' (made by launch.cluster).
# Usage as ssh: AGENT [ssh options] HOST COMMAND...
# Like OpenSSH, accept options before and after the host (horovodrun puts -p/-o after it).
host=
while [ $# -gt 0 ]; do
  case "$1" in
    -p|-o|-i|-l|-F|-E|-c|-m|-b|-J) shift 2 ;;
    --) shift; break ;;
    -*) shift ;;
    *) if [ -z "$host" ]; then host=$1; shift; else break; fi ;;
  esac
done
case "$host" in
{cases}
  *) echo "emulated cluster {spec.name}: unknown node $host" >&2; exit 255 ;;
esac
# Own host name (UTS namespace) and an /etc/hosts that resolves every node
# (mount namespace; Gloo looks its own host name up).
exec ip netns exec "$ns" unshare --uts --mount sh -c \
  'hostname "$0" && mount --bind "$1" /etc/hosts && exec sh -c "$2"' \
  "$name" "{spec.folder / HOSTS_FILE}" "$*"
"""


def _write_exec(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _existing_links() -> set[str]:
    out = _run(["ip", "-o", "link", "show"]).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def up(spec: ClusterSpec) -> ClusterSpec:
    """Create the cluster; on any failure remove what was made and raise."""
    check_machine()
    if ClusterSpec.load(spec.name) is not None:
        raise ClusterError(f"cluster {spec.name!r} is already up; run "
                           f"'python -m launch.cluster down --name {spec.name}' first")
    clash = {spec.bridge, *(n.veth for n in spec.node_list)} & _existing_links()
    if clash:
        raise ClusterError(f"links {sorted(clash)} already exist; pick another --name")
    spec.created = time.time()
    spec.save()  # record first, so down() finds whatever exists after a crash
    try:
        _run(["ip", "link", "add", spec.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{spec.bridge_addr}/{spec.prefixlen}", "dev", spec.bridge])
        _run(["ip", "link", "set", spec.bridge, "up"])
        if shutil.which("iptables"):
            # Docker sets FORWARD's policy to DROP, which also drops bridged traffic
            # when br_netfilter is loaded; accept our bridge explicitly.
            rule = ["FORWARD", "-i", spec.bridge, "-o", spec.bridge, "-j", "ACCEPT"]
            spec.iptables_rule = rule
            spec.save()
            _run(["iptables", "-I", *rule])
        for n in spec.node_list:
            _run(["ip", "netns", "add", n.netns])
            _run(["ip", "link", "add", n.veth, "type", "veth", "peer", "name", "eth0",
                  "netns", n.netns])
            _run(["ip", "link", "set", n.veth, "master", spec.bridge])
            _run(["ip", "link", "set", n.veth, "up"])
            _run(_in_ns(n.netns, "ip", "addr", "add", f"{n.addr}/{spec.prefixlen}",
                        "dev", "eth0"))
            _run(_in_ns(n.netns, "ip", "link", "set", "eth0", "up"))
            _run(_in_ns(n.netns, "ip", "link", "set", "lo", "up"))
            _run(_in_ns(n.netns, "ip", "route", "add", "default", "via", spec.bridge_addr))
            if spec.rate_gbps is not None:  # node egress, and node ingress on the host side
                _run(links.shape_argv("eth0", spec.rate_gbps, prefix=_in_ns(n.netns),
                                      dilation=spec.dilation))
                _run(links.shape_argv(n.veth, spec.rate_gbps, dilation=spec.dilation))
        _write_exec(spec.agent, _agent_script(spec))
        (spec.folder / SSH_DIR).mkdir(parents=True, exist_ok=True)
        ssh = spec.folder / SSH_DIR / "ssh"
        if ssh.exists() or ssh.is_symlink():
            ssh.unlink()
        ssh.symlink_to(spec.agent)
        base = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else ""
        # Each node also by its IPv4-mapped IPv6 address: torch's store (torchrun's
        # rendezvous) listens on a dual-stack socket and looks every client up by that
        # address; glibc then finds no line in the hosts file and asks DNS, which the
        # nodes cannot reach: 10.0 s per connection, measured in a node
        (spec.folder / HOSTS_FILE).write_text(base.rstrip("\n") + "\n# emulated cluster\n"
                                               + "".join(f"{n.addr} {n.name}\n"
                                                         f"::ffff:{n.addr} {n.name}\n"
                                                         for n in spec.node_list))
        (spec.folder / HOSTFILE).write_text(spec.node_set.hostfile_text())
        spec.save()
        return spec
    except BaseException:
        down(spec)
        raise


def on_node(spec: ClusterSpec, node: Node, argv: Sequence[str]) -> list[str]:
    """argv that runs ``argv`` on ``node`` (through the cluster's agent, like ssh would)."""
    return [str(spec.agent), node.name, *argv]


def measure_link(spec: ClusterSpec, seconds: float = 2.0, port: int = 5299) -> dict:
    """Achieved Gbit/s from node 2 to node 1 (launch.linktest), as the link reference; under
    dilation K the test runs K times longer and its rates are multiplied back by K
    (emulated Gbit/s, the unit of ``--rate`` and of the records)."""
    if spec.nodes < 2:
        raise ClusterError("measuring a link needs at least 2 nodes")
    a, b = spec.node_list[0], spec.node_list[1]
    env = {**os.environ, "PYTHONPATH": _project_root() + os.pathsep + os.environ.get(
        "PYTHONPATH", "")}
    try:
        result = linktest.between(lambda argv: on_node(spec, a, argv),
                                  lambda argv: on_node(spec, b, argv), a.addr, port,
                                  seconds * spec.dilation, env=env)
    except linktest.LinkTestError as e:
        raise ClusterError(str(e)) from None
    for key in ("gbps", "wire_gbps"):
        if result.get(key):
            result[key] *= spec.dilation
    result.update(method="launch.linktest tcp stream", src=b.name, dst=a.name,
                  shaped_gbps=spec.rate_gbps, dilation=spec.dilation)
    return result


def _project_root() -> str:
    return str(Path(__file__).resolve().parents[1])


def node_pids(spec: ClusterSpec) -> dict[str, list[int]]:
    out = {}
    for n in spec.node_list:
        res = _run(["ip", "netns", "pids", n.netns], check=False)
        out[n.netns] = [int(p) for p in res.stdout.split()] if res.returncode == 0 else []
    return out


def down(spec: ClusterSpec | None = None, name: str = DEFAULT_NAME) -> list[str]:
    """Remove everything the cluster made (idempotent); return what was removed."""
    spec = spec or ClusterSpec.load(name)
    if spec is None:
        return []
    removed = []
    for _ in range(3):  # processes may spawn children while we kill
        pids = [p for ps in node_pids(spec).values() for p in ps]
        if not pids:
            break
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        removed.append(f"{len(pids)} processes")
        time.sleep(0.2)
    links = _existing_links()
    for n in spec.node_list:
        if _run(["ip", "netns", "delete", n.netns], check=False).returncode == 0:
            removed.append(f"netns {n.netns}")
        if n.veth in links and _run(["ip", "link", "delete", n.veth],
                                    check=False).returncode == 0:
            removed.append(f"link {n.veth}")
    if spec.bridge in links and _run(["ip", "link", "delete", spec.bridge],
                                     check=False).returncode == 0:
        removed.append(f"bridge {spec.bridge}")
    if spec.iptables_rule and shutil.which("iptables"):
        while _run(["iptables", "-D", *spec.iptables_rule], check=False).returncode == 0:
            removed.append("iptables rule")
    shutil.rmtree(spec.folder, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        spec.state_file.unlink()
    return removed


def status(name: str = DEFAULT_NAME) -> str:
    spec = ClusterSpec.load(name)
    if spec is None:
        return f"cluster {name}: down"
    rate = f"{spec.rate_gbps:g} Gbit/s" if spec.rate_gbps else "unshaped"
    if spec.dilation != 1:
        rate += (f" emulated, dilation {dil.text(spec.dilation)} (on the wire "
                 f"{spec.rate_gbps / spec.dilation:g} Gbit/s)" if spec.rate_gbps
                 else f", dilation {dil.text(spec.dilation)}")
    lines = [f"cluster {spec.name}: {spec.layout}, links {rate}, "
             f"subnet {spec.subnet}, bridge {spec.bridge} ({spec.bridge_addr})"]
    pids = node_pids(spec)
    for n, s in zip(spec.node_list, spec.slots):
        lines.append(f"  {n.name:<10} {n.addr:<15} netns {n.netns:<8} {s} slots  "
                     f"{len(pids[n.netns])} processes")
    lines.append(f"  hostfile {spec.folder / HOSTFILE}; rsh agent {spec.agent}")
    return "\n".join(lines)


@contextlib.contextmanager
def cluster(nodes: int | None, slots: int | str | Sequence[int], rate: str | None = None,
            subnet: str = DEFAULT_SUBNET, name: str = DEFAULT_NAME,
            dilation: float = 1.0) -> Iterator[ClusterSpec]:
    """Bring a cluster up for the ``with`` block; take it down on exit, failure or signal.
    ``slots``: one number for every node, or one per node (``nodes`` may then be None);
    ``dilation``: time dilation K (the module's docstring)."""
    spec = up(ClusterSpec(nodes=nodes, slots=slots, rate_gbps=parse_rate(rate),
                          subnet=subnet, name=name, dilation=dilation))
    previous = {}

    def on_signal(signum, frame):
        down(spec)
        handler = previous.get(signum)
        if callable(handler):
            handler(signum, frame)
        raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, on_signal)
        except ValueError:  # not the main thread
            pass
    try:
        yield spec
    finally:
        down(spec)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def launch_argv(spec: ClusterSpec, launcher: str, np: int, program: Sequence[str],
                link: dict | None = None, load_before: float | None = None,
                runnable_before: float | None = None,
                extra_env: dict[str, str] | None = None) -> list[str]:
    """The command that runs ``program`` on ``np`` ranks of the cluster with ``launcher``
    (``commands.on_nodes`` on the cluster's ``node_set``).

    The link reference goes to every rank as COMMBENCH_LINK_* variables
    (``launch.links.link_env``), which commbench writes into its records; so does
    COMMBENCH_MACHINE_RANKS, as every node is on this machine. ``load_before``, the
    machine's load average read before the cluster's link test, goes as
    COMMBENCH_LOADAVG_BEFORE: the job's records then say how busy the machine was before
    the job itself loaded it; ``runnable_before``, the tasks running or runnable then
    (``commbench.cores.runnable_tasks``), goes as COMMBENCH_RUNNABLE_BEFORE and decides
    whether the job started beside other work. The cluster's dilation goes as
    COMMBENCH_DILATION (``commbench.dilation``); ``extra_env`` as it is (a sweep's repeat).
    """
    env = {**links.link_env(spec.rate_gbps, "eth0", link), **dil.env(spec.dilation),
           **(extra_env or {})}
    if load_before is not None:
        env[LOADAVG_ENV] = f"{load_before:.2f}"
    if runnable_before is not None:
        env[RUNNABLE_ENV] = f"{runnable_before:g}"
    return commands.on_nodes(spec.node_set, launcher, np, program, env)


def parse_dilation(text: str | None) -> float | None:
    """``--dilation`` as given (None: not given); a bad value is a ClusterError naming it."""
    if text is None:
        return None
    if text.strip().lower() == "auto":
        raise ClusterError("--dilation auto: launch.cluster runs one program it cannot probe; "
                           "give K (1, 2, 4, 8, ...), or use python -m experiments.study or a "
                           "benchmark, whose --dilation auto probes each compared set first")
    try:
        return float(dil.parse(text))
    except dil.DilationError as e:
        raise ClusterError(str(e)) from None


def _cli(argv: list[str] | None = None) -> int:

    p = argparse.ArgumentParser(prog="python -m launch.cluster",
                                description="Emulated multi-node cluster on one machine.")
    sub = p.add_subparsers(dest="cmd", required=True)

    def shape_args(sp, required: bool) -> None:
        sp.add_argument("--nodes", type=int, help="number of nodes (default: as many as "
                        "--slots lists)")
        sp.add_argument("--slots", required=required, metavar="S|S1,S2,...",
                        help="ranks per node: one number for every node, or one per node "
                             "(3,1: 3 ranks on the first node, 1 on the second)")
        sp.add_argument("--rate", default="none",
                        help="link rate per node, tc syntax: 200mbit, 1gbit, 10gbit, none")
        sp.add_argument("--subnet", default=DEFAULT_SUBNET, help="private subnet for the nodes")
        sp.add_argument("--dilation", metavar="K",
                        help="time dilation: links at rate / K, and everything else on "
                             "emulated time (replayed compute, Horovod's cycle, deadlines) "
                             "K times slower; records hold emulated time. Takes this "
                             "machine's cores out of a figure where ranks outnumber them "
                             "(default 1: none; run: the cluster's own)")

    for name in ("up", "down", "status", "run", "link"):
        sp = sub.add_parser(name)
        sp.add_argument("--name", default=DEFAULT_NAME, help="cluster name (prefix of its links)")
        if name == "up":
            shape_args(sp, required=True)
        if name == "run":
            shape_args(sp, required=False)
            sp.add_argument("--np", type=int, help="ranks (default: nodes x slots)")
            sp.add_argument("--launcher", choices=LAUNCHERS, default="mpirun",
                            help="how ranks start (default mpirun); torchrun: one per node, "
                                 "the tools then take the torch backend on Gloo")
            sp.add_argument("--no-link-test", action="store_true",
                            help="skip measuring the link before the job")
            sp.add_argument("--timeout", type=float, default=3600.0,
                            help="job deadline (s, emulated: x K on the wall)")
            sp.add_argument("program", nargs=argparse.REMAINDER,
                            help="-- then the program, e.g. python -m commbench.allreduce")
    a = p.parse_args(argv)
    try:
        if hasattr(a, "dilation"):
            a.dilation = parse_dilation(a.dilation)
        if a.cmd == "up":
            spec = ClusterSpec(nodes=a.nodes, slots=a.slots, rate_gbps=parse_rate(a.rate),
                               subnet=a.subnet, name=a.name,
                               dilation=a.dilation or 1.0)  # checks before making anything
            spec = up(spec)
            print(status(spec.name))
        elif a.cmd == "down":
            check_machine()
            removed = down(name=a.name)
            print(f"removed: {', '.join(removed)}" if removed else f"cluster {a.name}: not up")
        elif a.cmd == "status":
            print(status(a.name))
        elif a.cmd == "link":
            spec = ClusterSpec.load(a.name)
            if spec is None:
                raise ClusterError(f"cluster {a.name} is not up")
            print(json.dumps(measure_link(spec)))
        else:
            return _cli_run(a)
    except ClusterError as e:
        print(f"launch.cluster: error: {e}", file=sys.stderr)
        return 2
    return 0


def _cli_run(a) -> int:
    program = a.program[1:] if a.program[:1] == ["--"] else a.program
    if not program:
        raise ClusterError("run: give the program after --")
    if program[0] in ("python", "python3"):
        program = [sys.executable, *program[1:]]
    if a.launcher == "torchrun":  # before any cluster is made
        try:
            commands.torchrun_target(program)
        except ValueError as e:
            raise ClusterError(f"--launcher torchrun: {e}") from None
    asked = node_slots(a.nodes, a.slots) if a.slots else None  # bad --slots: exit 2 first
    existing = ClusterSpec.load(a.name)
    ephemeral = existing is None
    if existing and asked and asked != existing.slots:
        raise ClusterError(f"--slots {a.slots}: cluster {a.name} is up with {existing.layout}; "
                           f"leave --nodes/--slots out to use it, or take it down first")
    if existing and a.dilation is not None and a.dilation != existing.dilation:
        raise ClusterError(f"--dilation {dil.text(a.dilation)}: cluster {a.name} is up at "
                           f"dilation {dil.text(existing.dilation)} (its links are shaped for "
                           "it); leave --dilation out to use it, or take it down and bring it "
                           "up at the dilation you want")
    if ephemeral and not a.slots:
        raise ClusterError(f"cluster {a.name} is not up: bring it up first or give "
                           "--nodes and --slots (or --slots per node, e.g. 3,1) for a cluster "
                           "that lives for this run")
    spec = existing or ClusterSpec(nodes=a.nodes, slots=a.slots, rate_gbps=parse_rate(a.rate),
                                   subnet=a.subnet, name=a.name, dilation=a.dilation or 1.0)
    np = a.np or spec.ranks
    if np > spec.ranks:
        raise ClusterError(f"--np {np} is more ranks than {spec.layout}")
    if ephemeral:
        check_machine()
    load_before = load_average()  # before the link test and the job's start-up load it
    runnable_before = runnable_tasks()
    ctx = (cluster(spec.nodes, spec.slots, a.rate, spec.subnet, spec.name, spec.dilation)
           if ephemeral
           else contextlib.nullcontext(spec))
    with ctx as spec:
        link = None
        if spec.nodes > 1 and not a.no_link_test:
            link = measure_link(spec)
            print(f"# link {link['src']} -> {link['dst']}: {link['gbps']:.3f} Gbit/s "
                  f"(shaped {a.rate if ephemeral else spec.rate_gbps})", flush=True)
        deadline = a.timeout * spec.dilation  # the job runs K times longer on the wall
        res = run(launch_argv(spec, a.launcher, np, program, link, load_before, runnable_before),
                  timeout=deadline)
        sys.stdout.write(res.stdout)
        sys.stderr.write(res.stderr)
        if res.timed_out:
            print(f"launch.cluster: job timed out after {deadline:g} s", file=sys.stderr)
            return 124
        return res.returncode


if __name__ == "__main__":
    sys.exit(_cli())
