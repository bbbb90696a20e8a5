"""Launch commands as argument lists: one small function per way users start jobs.

Each returns the argv to execute (never a shell string), so tests compare
lists and ``launch.execute.run`` runs them in one place.

The recipe for jobs across nodes is written here once: a ``NodeSet`` says which
hosts (names or addresses, slots per node) a job runs on and how the launcher
reaches them (interface, rsh agent, SSH port, whether the nodes share this
machine's cores), and ``on_nodes`` turns it into the ``mpirun`` or ``horovodrun``
command with its Open MPI settings, or into one ``torchrun`` per node started by
``launch.nodes`` (torchrun cannot start itself on other machines). ``launch.cluster``
(network namespaces) and the containers' entry point (``docker/entrypoint.py``) both
use it.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from commbench.cores import MACHINE_RANKS_ENV

#: how users start jobs: Open MPI's mpirun, horovodrun with Horovod's MPI or Gloo controller,
#: or PyTorch's torchrun (the tools then take the torch backend: commbench.launchenv)
LAUNCHERS = ("mpirun", "horovodrun", "horovodrun-gloo", "torchrun")
#: variables every mpirun job forwards to its ranks, when set (besides COMMBENCH_*)
FORWARDED_ENV = ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "OMP_NUM_THREADS", "PYTHONUNBUFFERED")
#: torchrun as a module of the program's own Python (the ``torchrun`` script is the same)
TORCHRUN = ("-m", "torch.distributed.run")
#: torchrun's rendezvous port under Slurm (its default); on other node sets one is picked
TORCHRUN_PORT = 29500
#: ``python``, ``python3``, ``python3.11``, as a name or a path
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")


def controller(launcher: str) -> str | None:
    """Horovod's controller under ``launcher``: ``gloo`` for horovodrun-gloo, ``mpi`` for
    horovodrun and plain mpirun (on which Horovod runs on MPI), None for torchrun (no
    Horovod there: the tools refuse its peer under torchrun)."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    if launcher == "torchrun":
        return None
    return "gloo" if launcher == "horovodrun-gloo" else "mpi"


def horovodrun_path() -> str:
    """The ``horovodrun`` of this Python's environment (the venv need not be on PATH)."""
    return os.path.join(os.path.dirname(sys.executable), "horovodrun")


def layout_text(slots: Sequence[int]) -> str:
    """``2 nodes x 4 slots``, or ``2 nodes (3+1 slots)`` when the nodes differ."""
    if len(set(slots)) == 1:
        return f"{len(slots)} node{'s' if len(slots) > 1 else ''} x {slots[0]} slots"
    return f"{len(slots)} nodes ({'+'.join(map(str, slots))} slots)"


class NodeSlots:
    """Ranks and layout of anything that has ``node_slots``: the slots of each node, in the
    order ranks fill them."""

    node_slots: list[int]

    @property
    def ranks(self) -> int:
        """Slots of all nodes together: the most ranks a job may have."""
        return sum(self.node_slots)

    @property
    def layout(self) -> str:
        return layout_text(self.node_slots)


@dataclass(frozen=True)
class Host:
    name: str   # host name or address the launcher reaches the node by
    slots: int


@dataclass(frozen=True)
class NodeSet(NodeSlots):
    """The nodes of a job and how the launcher reaches them.

    ``network``: what Open MPI's TCP traffic is kept to (a subnet or an interface name;
    ``oob_tcp_if_include`` and ``btl_tcp_if_include``); ``iface``: the nodes' own link
    interface (horovodrun's ``--network-interfaces``, and COMMBENCH_LINK_IFACE, which
    the ranks count per step); ``rsh_agent``: a program that stands in for ssh (Open
    MPI's ``plm_rsh_agent``) and ``ssh_dir`` a folder holding it as ``ssh``, put first
    on horovodrun's PATH; ``shared_machine``: every node runs on this machine (emulated
    nodes, containers), so all ranks share its cores.
    """

    hosts: tuple[Host, ...]
    network: str | None = None
    iface: str | None = None
    rsh_agent: str | None = None
    ssh_dir: str | None = None
    ssh_port: int = 22
    shared_machine: bool = False

    def __post_init__(self) -> None:
        if not self.hosts:
            raise ValueError("a node set needs at least one host")
        bad = [h for h in self.hosts if h.slots < 1]
        if bad:
            raise ValueError(f"host {bad[0].name}: needs at least 1 slot, got {bad[0].slots}")

    @classmethod
    def parse(cls, text: str, flag: str = "--hosts", **how) -> NodeSet:
        """``hostA:8,hostB:8``; ValueError naming ``flag`` otherwise. ``how``: the other
        fields (network, rsh agent, ...)."""
        hosts = []
        for item in text.split(","):
            name, _, slots = item.strip().partition(":")
            if not name or not slots.isdigit() or int(slots) < 1:
                raise ValueError(f"{flag}: {item.strip()!r} is not HOST:SLOTS (e.g. node1:8)")
            hosts.append(Host(name, int(slots)))
        return cls(tuple(hosts), **how)

    @property
    def node_slots(self) -> list[int]:
        return [h.slots for h in self.hosts]

    def hosts_arg(self) -> str:
        """``node1:S1,node2:S2`` as horovodrun's -H and mpirun's --host take it."""
        return ",".join(f"{h.name}:{h.slots}" for h in self.hosts)

    def hostfile_text(self) -> str:
        """The Open MPI host file: ``HOST slots=S`` per node, in node order."""
        return "".join(f"{h.name} slots={h.slots}\n" for h in self.hosts)


def python_module(module: str, args: Sequence[str] = (), python: str | None = None) -> list[str]:
    return [python or sys.executable, "-m", module, *args]


def fill_nodes(node_slots: Sequence[int], np: int) -> list[int]:
    """Ranks on each node when ``np`` ranks fill the nodes' slots in order, as mpirun
    places them (``-np 5`` on 4 + 4 slots: [4, 1]); nodes left empty are left out."""
    if np > sum(node_slots):
        raise ValueError(f"{np} ranks do not fit {layout_text(node_slots)}")
    out = []
    for slots in node_slots:
        if np <= 0:
            break
        out.append(min(slots, np))
        np -= slots
    return out


def torchrun_target(program: Sequence[str]) -> tuple[str, list[str]]:
    """The Python that runs ``program`` and what torchrun starts in each worker, from the
    project's way of writing programs: ``[python, "-m", module, *args]`` gives
    ``(python, ["-m", module, *args])`` and ``[python, script.py, *args]`` gives
    ``(python, [script.py, *args])``.

    torchrun starts every worker as ``<its own python> -u [-m] target args``, so it takes
    a module or a script, never the interpreter; running torchrun with the program's own
    Python keeps the interpreter the program asked for. ValueError (saying what torchrun
    takes) for anything else: a program that is not Python, or options to the interpreter
    (``python -u``), which torchrun would drop."""
    prog = list(program)
    if not prog or not _PYTHON.fullmatch(os.path.basename(prog[0])):
        raise ValueError(f"torchrun starts Python programs only, written as python -m MODULE "
                         f"... or python SCRIPT ...; got {shlex.join(prog) or 'nothing'}")
    if prog[1:2] == ["-m"] and len(prog) > 2:
        return prog[0], ["-m", *prog[2:]]
    if len(prog) > 1 and not prog[1].startswith("-"):
        return prog[0], prog[1:]
    raise ValueError(f"torchrun starts python -m MODULE ... or python SCRIPT ..., not "
                     f"{shlex.join(prog)}: it runs each worker as 'python -u [-m] TARGET "
                     "ARGS', so it takes a module or a script, not options to the "
                     "interpreter or -c")


def torchrun(nproc_per_node: int, program: Sequence[str], *, nnodes: int = 1,
             rendezvous: Sequence[str] = ("--standalone",)) -> list[str]:
    """``python -m torch.distributed.run --nnodes N --nproc-per-node P RENDEZVOUS program``.

    ``rendezvous``: how the nodes' torchruns find each other: ``--standalone`` (one
    machine: torchrun starts its own store on a free port), ``static_rendezvous`` (node
    ranks given, as ``on_nodes`` does), or c10d flags (``--rdzv-backend c10d ...``, as under
    Slurm). ``program``: as ``torchrun_target`` takes it."""
    if nproc_per_node <= 0 or nnodes <= 0:
        raise ValueError(f"torchrun needs at least 1 node and 1 process per node, got "
                         f"{nnodes} x {nproc_per_node}")
    python, target = torchrun_target(program)
    return [python, *TORCHRUN, "--nnodes", str(nnodes), "--nproc-per-node",
            str(nproc_per_node), *rendezvous, *target]


def static_rendezvous(node_rank: int, master_addr: str, master_port: int) -> list[str]:
    """torchrun's static rendezvous: this node's rank, and node 0's address and port, where
    node 0's torchrun keeps the job's store. Ranks come out contiguous per node in node
    order, also for uneven nodes (torch's elastic agent sums the nodes'
    ``--nproc-per-node`` in node-rank order: 3 + 1 gives ranks 0-2 and 3)."""
    return ["--node-rank", str(node_rank), "--master-addr", master_addr,
            "--master-port", str(master_port)]


def free_port() -> int:
    """A TCP port free on this machine now: the rendezvous port of a job across nodes. On
    the emulated cluster node 0 is a fresh network namespace of this machine, where every
    port is free; on real hosts it is as good a guess as a fixed one, and two jobs started
    from here do not share it."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def mpirun(np: int, program: Sequence[str], *, hosts: str | None = None,
           hostfile: str | None = None, oversubscribe: bool = True,
           mca: dict[str, str] | None = None, env: Sequence[str] = ()) -> list[str]:
    """``mpirun -np N [--host H | --hostfile F] ... program`` (Open MPI)."""
    if np <= 0:
        raise ValueError(f"np must be > 0, got {np}")
    cmd = ["mpirun", "-np", str(np)]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if oversubscribe:
        cmd.append("--oversubscribe")
    if hosts:
        cmd += ["--host", hosts]
    if hostfile:
        cmd += ["--hostfile", hostfile]
    for k, v in (mca or {}).items():
        cmd += ["--mca", k, v]
    for name in env:
        cmd += ["-x", name]
    return [*cmd, *program]


def horovodrun(np: int, program: Sequence[str], *, hosts: str | None = None,
               controller: str = "mpi", horovodrun_bin: str | None = None,
               extra: Sequence[str] = ()) -> list[str]:
    """``horovodrun -np N -H hosts --mpi|--gloo program``.

    ``hosts`` defaults to ``localhost:N``.
    """
    if np <= 0:
        raise ValueError(f"np must be > 0, got {np}")
    if controller not in ("mpi", "gloo"):
        raise ValueError(f"controller must be mpi or gloo, got {controller!r}")
    exe = horovodrun_bin or horovodrun_path()
    return [exe, "-np", str(np), "-H", hosts or f"localhost:{np}", f"--{controller}",
            *extra, *program]


def launcher_argv(launcher: str, np: int, program: Sequence[str], *,
                  hosts: str | None = None, env: Mapping[str, str] | None = None) -> list[str]:
    """``program`` on ``np`` ranks with ``launcher`` (one of LAUNCHERS), on this machine or
    on ``hosts`` (``a:8,b:8``) that need nothing but the launcher's defaults; ``env`` goes
    to every rank (set in front of the launcher; mpirun forwards it with ``-x``, horovodrun
    forwards its whole environment, and so does torchrun). torchrun on ``hosts`` runs as
    ``on_nodes`` runs it, one torchrun per host (started with ssh; one named localhost
    or this machine's name starts here)."""
    if launcher == "torchrun" and hosts:
        return on_nodes(NodeSet.parse(hosts), launcher, np, program, env)
    if launcher == "mpirun":
        argv = mpirun(np, program, hosts=hosts, env=list(env or ()))
    elif launcher == "torchrun":
        argv = torchrun(np, program)
    else:
        argv = horovodrun(np, program, hosts=hosts, controller=controller(launcher))
    return ["env", *(f"{k}={v}" for k, v in env.items()), *argv] if env else argv


def srun(ntasks: int, program: Sequence[str], *, nodes: int | None = None,
         ntasks_per_node: int | None = None, mpi: str = "pmix") -> list[str]:
    """``srun`` for a Slurm allocation (``--mpi=pmix`` lets Open MPI ranks wire up)."""
    if ntasks <= 0:
        raise ValueError(f"ntasks must be > 0, got {ntasks}")
    cmd = ["srun", f"--ntasks={ntasks}", f"--mpi={mpi}"]
    if nodes:
        cmd.append(f"--nodes={nodes}")
    if ntasks_per_node:
        cmd.append(f"--ntasks-per-node={ntasks_per_node}")
    return [*cmd, *program]


def node_set_mca(nodes: NodeSet, launcher: str) -> dict[str, str]:
    """Open MPI settings that route a job through ``nodes`` (for mpirun, or horovodrun's
    ``--mpi-args``; horovodrun sets the BTL, its interface and the SSH port itself, from
    ``--network-interfaces`` and ``-p``)."""
    mca = {}
    if nodes.rsh_agent:
        # The agent starts every node's daemon from this machine; no daemon needs it.
        mca.update(plm_rsh_agent=nodes.rsh_agent, plm_rsh_no_tree_spawn="1")
    if nodes.network:
        mca["oob_tcp_if_include"] = nodes.network
    if launcher == "mpirun":
        if nodes.ssh_port != 22:
            mca["plm_rsh_args"] = f"-p {nodes.ssh_port}"
        if nodes.network:
            mca.update(btl_tcp_if_include=nodes.network, btl="self,vader,tcp", pml="ob1")
    if nodes.shared_machine:
        # Each node's daemon sees the whole machine and binds its ranks from core 0 up
        # (Open MPI's default for 2 ranks or fewer per node), not knowing the other
        # nodes did the same: 2 nodes x 1 rank on 2 cores ran both ranks on core 0.
        # Leave placement to the kernel, as on a shared machine (horovodrun does too).
        mca["hwloc_base_binding_policy"] = "none"
        if nodes.ranks > (os.cpu_count() or 1):
            # All nodes share this machine's cores, but each node's slots look free to
            # Open MPI, so its ranks would busy-poll; with 8 ranks on 2 cores the
            # spinning ranks starve the ones moving data (a 2x4 ring fell from 0.95 to
            # 0.83 of the link). Yield instead, as Open MPI does when it knows it is
            # oversubscribed.
            mca["mpi_yield_when_idle"] = "1"
    return mca


def on_nodes(nodes: NodeSet, launcher: str, np: int, program: Sequence[str],
             env: Mapping[str, str] | None = None) -> list[str]:
    """The command that runs ``program`` on ``np`` ranks of ``nodes`` with ``launcher``.

    ``env`` goes to every rank (set in front of the launcher; mpirun forwards it with
    ``-x``, horovodrun forwards its whole environment; torchrun: ``torchrun_on_nodes``).
    When the nodes share this machine, COMMBENCH_MACHINE_RANKS says all ``np`` ranks
    share its cores, so each takes cores // np torch threads (``commbench.cores``), not
    cores // its node's ranks. With fewer ranks than slots, ranks fill the nodes in order.
    """
    if np > nodes.ranks:
        raise ValueError(f"{np} ranks do not fit {nodes.layout}")
    env = dict(env or {})
    if nodes.shared_machine:
        env.setdefault(MACHINE_RANKS_ENV, str(np))
    if launcher == "torchrun":
        return torchrun_on_nodes(nodes, np, program, env)
    assignments = [f"{k}={v}" for k, v in env.items()]
    mca = node_set_mca(nodes, launcher)
    if launcher == "mpirun":
        forward = [k for k in os.environ if k in FORWARDED_ENV or k.startswith("COMMBENCH_")]
        forward += [k for k in env if k not in forward]
        argv = mpirun(np, program, hosts=nodes.hosts_arg(), oversubscribe=nodes.shared_machine,
                      mca=mca, env=forward)
    else:
        extra = ["--start-timeout", "120"]
        if nodes.iface:
            extra += ["--network-interfaces", nodes.iface]
        if nodes.ssh_port != 22:
            extra += ["-p", str(nodes.ssh_port)]
        if mca and controller(launcher) == "mpi":
            extra += ["--mpi-args", " ".join(f"--mca {k} {v}" for k, v in mca.items())]
        argv = horovodrun(np, program, hosts=nodes.hosts_arg(), controller=controller(launcher),
                          extra=extra)
        if nodes.ssh_dir:  # horovodrun reaches the nodes with the ssh it finds on PATH
            assignments.append(f"PATH={nodes.ssh_dir}:{os.environ.get('PATH', '')}")
    return ["env", *assignments, *argv] if assignments else argv


def torchrun_on_nodes(nodes: NodeSet, np: int, program: Sequence[str],
                      env: Mapping[str, str] | None = None,
                      master_port: int | None = None) -> list[str]:
    """One torchrun per node, all started and ended together by ``launch.nodes``.

    Ranks fill the nodes in order (``fill_nodes``, as mpirun's); node i of the N used runs
    ``torchrun --nnodes N --nproc-per-node <its ranks>`` with the static rendezvous on the
    first node (``static_rendezvous``; ``master_port`` default: ``free_port``). Its
    environment is set in the node's command, as ssh carries none: ``env``, what mpirun
    would forward (``FORWARDED_ENV``, COMMBENCH_*), and GLOO_SOCKET_IFNAME and
    NCCL_SOCKET_IFNAME on the node set's link interface, so that the libraries' traffic
    takes the link (else Gloo takes the interface of the host name's address). Open MPI's
    settings (``node_set_mca``) do not apply. ``launch.nodes`` reaches the nodes with the
    node set's rsh agent, else ssh (``-p`` for another port), and starts them in its own
    working directory, as mpirun does."""
    per_node = fill_nodes(nodes.node_slots, np)
    master = nodes.hosts[0].name
    port = master_port or free_port()
    assignments: dict[str, str] = {}
    if nodes.iface:
        assignments.update(GLOO_SOCKET_IFNAME=nodes.iface, NCCL_SOCKET_IFNAME=nodes.iface)
    assignments.update({k: v for k, v in os.environ.items()
                        if k in FORWARDED_ENV or k.startswith("COMMBENCH_")})
    assignments.update(env or {})
    prefix = ["env", *(f"{k}={v}" for k, v in assignments.items())] if assignments else []
    rsh = nodes.rsh_agent or ("ssh" if nodes.ssh_port == 22 else f"ssh -p {nodes.ssh_port}")
    argv = [sys.executable, "-m", "launch.nodes", "--rsh", rsh]
    for i, (host, ranks) in enumerate(zip(nodes.hosts, per_node)):
        node = torchrun(ranks, program, nnodes=len(per_node),
                        rendezvous=static_rendezvous(i, master, port))
        argv += ["--node", host.name, shlex.join([*prefix, *node])]
    return argv
