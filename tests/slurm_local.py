"""A single-node Slurm for tests: this host as controller and only node, as root.

Writes a minimal slurm.conf into a scratch folder, starts munged (if none
runs), slurmctld and slurmd, waits for the node to be idle, and stops all of
them again on exit, also after a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

CONF = """ClusterName=commbench
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
SlurmctldPort=6917
SlurmdPort=6918
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def available() -> str | None:
    """None when a local Slurm can run here, else why not."""
    if os.geteuid() != 0:
        return "a local Slurm needs root"
    missing = [b for b in ("slurmctld", "slurmd", "sbatch", "munged") if not shutil.which(b)]
    return f"not installed: {', '.join(missing)} (apt install slurm-wlm munge)" if missing \
        else None


def _kill_pidfile(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
        pid = int(path.read_text().split()[0])
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def local_slurm(workdir: Path, cpus: int = 8) -> Iterator[dict[str, str]]:
    """Yield the environment (SLURM_CONF) under which sbatch/squeue reach the cluster."""
    d = Path(workdir)
    for sub in ("state", "spool"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()
    conf = d / "slurm.conf"
    conf.write_text(CONF.format(host=host, d=d, cpus=cpus))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    started_munge = None
    try:
        if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0:
            Path("/run/munge").mkdir(parents=True, exist_ok=True)
            subprocess.run(["munged", "--force", "--pid-file", str(d / "munged.pid")],
                           check=True, capture_output=True)
            started_munge = d / "munged.pid"
        subprocess.run(["slurmctld", "-f", str(conf)], check=True, env=env, capture_output=True)
        subprocess.run(["slurmd", "-f", str(conf)], check=True, env=env, capture_output=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True,
                                   text=True).stdout.strip()
            if state == "idle":
                break
            time.sleep(0.5)
        else:
            log = (d / "slurmctld.log").read_text()[-2000:] if (d / "slurmctld.log").exists() \
                else ""
            raise RuntimeError(f"local Slurm never became idle (state {state!r})\n{log}")
        yield {"SLURM_CONF": str(conf)}
    finally:
        subprocess.run(["scancel", "--full", "-u", "root"], env=env, capture_output=True)
        _kill_pidfile(d / "slurmd.pid")
        _kill_pidfile(d / "slurmctld.pid")
        if started_munge:
            _kill_pidfile(started_munge)
