"""Launch commands as argument lists: one small function per way users start jobs.

Each returns the argv to execute (never a shell string), so tests compare
lists and ``launch.execute.run`` runs them in one place.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def python_module(module: str, args: Sequence[str] = (), python: str | None = None) -> list[str]:
    return [python or sys.executable, "-m", module, *args]


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
    exe = horovodrun_bin or os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return [exe, "-np", str(np), "-H", hosts or f"localhost:{np}", f"--{controller}",
            *extra, *program]


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


def emulated_mca(spec) -> dict[str, str]:
    """Open MPI settings that route a job through an emulated cluster's nodes and links."""
    mca = {
        "plm_rsh_agent": str(spec.agent),
        "plm_rsh_no_tree_spawn": "1",
        "oob_tcp_if_include": spec.subnet,
        "btl_tcp_if_include": spec.subnet,
        "btl": "self,vader,tcp",
        "pml": "ob1",
        # Each node's daemon sees the whole machine and binds its ranks from core 0 up
        # (Open MPI's default for 2 ranks or fewer per node), not knowing the other
        # nodes did the same: 2 nodes x 1 rank on 2 cores ran both ranks on core 0.
        # Leave placement to the kernel, as on a shared machine (horovodrun does too).
        "hwloc_base_binding_policy": "none",
    }
    if spec.ranks > (os.cpu_count() or 1):
        # All emulated nodes share this machine's cores, but each node's slots look
        # free to Open MPI, so its ranks would busy-poll; with 8 ranks on 2 cores the
        # spinning ranks starve the ones moving data (a 2x4 ring fell from 0.95 to
        # 0.83 of the link). Yield instead, as Open MPI does when it knows it is
        # oversubscribed.
        mca["mpi_yield_when_idle"] = "1"
    return mca


def _check_fits(spec, np: int) -> None:
    if np > spec.ranks:
        raise ValueError(f"{np} ranks do not fit {spec.layout}")


def mpirun_emulated(spec, np: int, program: Sequence[str]) -> list[str]:
    """mpirun across an emulated cluster (``launch.cluster``): host file + rsh agent.

    The host file gives each node its own slots (``3,1``: 3 ranks on the first node, 1 on
    the second); ranks fill the nodes in order."""
    _check_fits(spec, np)
    env = [k for k in ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "OMP_NUM_THREADS") if k in os.environ]
    return mpirun(np, program, hostfile=str(spec.hostfile), oversubscribe=True,
                  mca=emulated_mca(spec), env=env)


def horovodrun_emulated(spec, np: int, program: Sequence[str], *, controller: str = "mpi",
                        horovodrun_bin: str | None = None) -> list[str]:
    """horovodrun across an emulated cluster: the cluster's ``ssh`` first on PATH,
    its interface named, and (MPI) the rsh agent passed to mpirun."""
    _check_fits(spec, np)
    extra = ["--network-interfaces", "eth0"]
    if controller == "mpi":
        mca = emulated_mca(spec)
        for k in ("btl_tcp_if_include", "btl", "pml"):  # horovodrun sets these itself
            del mca[k]
        extra += ["--mpi-args", " ".join(f"--mca {k} {v}" for k, v in mca.items())]
    path = f"{spec.ssh_dir}:{os.environ.get('PATH', '')}"
    return ["env", f"PATH={path}",
            *horovodrun(np, program, hosts=spec.hosts_arg(), controller=controller,
                        horovodrun_bin=horovodrun_bin, extra=extra)]
