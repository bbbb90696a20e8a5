"""Slurm batch scripts for commbench, made from the same launch commands as every launcher.

``python -m launch.slurm --nodes 4 --tasks-per-node 8 -- python -m commbench.allreduce``
prints a batch script (``-o FILE`` writes it, ``--submit`` hands it to
``sbatch``). Ranks start with ``srun --mpi=pmix`` (default), with Open
MPI's ``mpirun``, which takes its hosts from the allocation, or with
``--launcher torchrun``: ``srun`` starts one torchrun per node, each with the
node's ``--tasks-per-node`` workers, meeting at a c10d rendezvous on the first
node of the allocation (the tools then take the torch backend)::

    MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)
    srun --nodes=4 --ntasks=4 --ntasks-per-node=1 --cpus-per-task=8 --kill-on-bad-exit=1 \
        python -m torch.distributed.run --nnodes 4 --nproc-per-node 8 --rdzv-backend c10d \
        --rdzv-endpoint "$MASTER_ADDR:29500" --rdzv-id "$SLURM_JOB_ID" -m commbench.allreduce
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from launch import commands

TEMPLATE = Path(__file__).with_name("commbench.sbatch.in")
SLURM_LAUNCHERS = ("srun", "mpirun", "torchrun")  # how a batch script starts its ranks
#: shell words of the torchrun line that the batch script expands when it runs
_EXPANDED = {f'"$MASTER_ADDR:{commands.TORCHRUN_PORT}"', '"$SLURM_JOB_ID"'}


def torchrun_lines(program: Sequence[str], *, nodes: int, tasks_per_node: int) -> str:
    """The batch script's lines for ``--launcher torchrun``: the first node's name, then
    one torchrun per node through srun. ``--ntasks``: srun would otherwise take the
    allocation's task count from SLURM_NTASKS and ignore ``--ntasks-per-node=1``;
    ``--cpus-per-task``: the step's one task per node gets the CPUs of the node's
    ``tasks_per_node`` tasks (else Slurm gives it one CPU, and where it confines tasks,
    every worker of the node shares that one); ``--kill-on-bad-exit``: a node that fails
    ends the others, as torchrun ends its own workers."""
    argv = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
            f"--cpus-per-task={tasks_per_node}", "--kill-on-bad-exit=1",
            *commands.torchrun(tasks_per_node, program, nnodes=nodes, rendezvous=[
                "--rdzv-backend", "c10d", "--rdzv-endpoint",
                f'"$MASTER_ADDR:{commands.TORCHRUN_PORT}"', "--rdzv-id", '"$SLURM_JOB_ID"'])]
    # sed, not head -n1: under pipefail, head exiting first can fail scontrol with SIGPIPE
    # on a long node list, and set -e would then end the script
    return ('MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)\n'
            + " ".join(w if w in _EXPANDED else shlex.quote(w) for w in argv))


def batch_script(program: Sequence[str], *, nodes: int, tasks_per_node: int,
                 launcher: str = "srun", job_name: str = "commbench",
                 time_limit: str = "01:00:00", log: str = "commbench-%j.out",
                 workdir: str | None = None, partition: str | None = None,
                 account: str | None = None, mpi: str = "pmix") -> str:
    """The text of a batch script running ``program`` on nodes x tasks_per_node ranks."""
    if nodes < 1 or tasks_per_node < 1:
        raise ValueError("nodes and tasks per node must be >= 1")
    if launcher not in SLURM_LAUNCHERS:
        raise ValueError(f"launcher must be one of {', '.join(SLURM_LAUNCHERS)}, got {launcher!r}")
    ntasks = nodes * tasks_per_node
    if launcher == "torchrun":
        try:
            command = torchrun_lines(program, nodes=nodes, tasks_per_node=tasks_per_node)
        except ValueError as e:
            raise ValueError(f"--launcher torchrun: {e}") from None
    elif launcher == "srun":
        command = shlex.join(commands.srun(ntasks, program, nodes=nodes,
                                           ntasks_per_node=tasks_per_node, mpi=mpi))
    else:  # Open MPI reads the allocation; no host file, no oversubscription
        command = shlex.join(commands.mpirun(ntasks, program, oversubscribe=False))
    extra = [f"#SBATCH --partition={partition}"] if partition else []
    extra += [f"#SBATCH --account={account}"] if account else []
    return TEMPLATE.read_text().format(
        nodes=nodes, tasks_per_node=tasks_per_node, launcher=launcher, job_name=job_name,
        time_limit=time_limit, log=log, extra_sbatch="\n".join(extra),
        workdir=shlex.quote(workdir or str(Path.cwd())), command=command)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    program = argv[argv.index("--") + 1:] if "--" in argv else []
    p = argparse.ArgumentParser(prog="python -m launch.slurm",
                                description="Make (and submit) a Slurm batch script.",
                                epilog="Give the program after --.")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--tasks-per-node", type=int, required=True)
    p.add_argument("--launcher", choices=SLURM_LAUNCHERS, default="srun",
                   help="how ranks start: srun --mpi=pmix (default), mpirun, or torchrun (one "
                        "per node through srun, c10d rendezvous on the first node)")
    p.add_argument("--time", dest="time_limit", default="01:00:00")
    p.add_argument("--job-name", default="commbench")
    p.add_argument("--partition")
    p.add_argument("--account")
    p.add_argument("--log", default="commbench-%j.out")
    p.add_argument("-o", "--output", help="write the script here (default: stdout)")
    p.add_argument("--submit", action="store_true", help="sbatch the script")
    a = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if not program:
        p.error("give the program after --")
    if program[0] in ("python", "python3"):
        program = [sys.executable, *program[1:]]
    try:
        text = batch_script(program, nodes=a.nodes, tasks_per_node=a.tasks_per_node,
                            launcher=a.launcher, job_name=a.job_name, time_limit=a.time_limit,
                            log=a.log, partition=a.partition, account=a.account)
    except ValueError as e:
        print(f"launch.slurm: error: {e}", file=sys.stderr)
        return 2
    if a.output:
        Path(a.output).write_text(text)
    else:
        sys.stdout.write(text)
    if a.submit:
        target = a.output or "-"
        res = subprocess.run(["sbatch", target], input=None if a.output else text, text=True)
        return res.returncode
    return 0
