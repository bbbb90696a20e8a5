"""Entry point of commbench's container cluster (docker/Dockerfile, docker/docker-compose.yml).

Roles (the container's command):

``worker``    a node (``node1``..``nodeN``): shape its link with ``tc`` (RATE), make
              its own SSH host key, serve SSH with the cluster's key from /keys. A node
              numbered above WORKERS is not part of the cluster and only idles.
``launcher``  check the settings, make the cluster's SSH key in /keys (shared with the
              nodes), wait until every node answers, measure one link, run the study
              across the nodes with LAUNCHER and exit with its status.
``keygen``    only make the key in /keys (for hosts that share no volume: copy it).

Every role ends when the launcher has finished (a ``done`` mark in /keys newer than
the container), so a plain ``docker-compose up`` returns after the study.

Settings (environment variables, read by the launcher; WORKERS, RATE, SSH_PORT and
IFACE also by the nodes):

=============  ======================  ==============================================
WORKERS        2                       nodes in the cluster (node1..nodeN, N <= 8)
SLOTS          2                       ranks per node
RANKS          WORKERS x SLOTS         ranks of the job (at most WORKERS x SLOTS)
LAUNCHER       horovodrun              horovodrun | horovodrun-gloo | mpirun
RATE           none                    each node's link rate (tc tbf): 200mbit, 1gbit ..
PROGRAM        commbench.allreduce     the Python module every rank runs
ARGS           (empty)                 its arguments, shell-quoted: "--steps 5 --algo ring"
OUTPUT         docker-<launcher>-...   results file in /results (unless ARGS has --output)
LINK_TEST      1                       measure one link before the job (0: skip)
HOSTS          node1:SLOTS,...         real hosts instead: "hostA:8,hostB:8"
SSH_PORT       22                      port of the nodes' SSH servers
IFACE          eth0                    the nodes' network interface
KEYGEN         1                       0: use the key already in /keys
JOB_TIMEOUT    3600                    seconds before the job is stopped
=============  ======================  ==============================================

Bad settings: one line naming the setting, exit status 2, nothing started.

The launch recipe (mpirun's or horovodrun's command and Open MPI settings, link
shaping, the COMMBENCH_* variables for the ranks) is ``launch.commands.on_nodes`` and
``launch.links``, as for the emulated cluster (``launch.cluster``); the job runs under
``launch.execute.run``.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from launch import commands, links, linktest
from launch.cluster import ClusterError, parse_rate
from launch.commands import LAUNCHERS, NodeSet
from launch.execute import run

MAX_NODES = 8  # services node1..node8 in docker-compose.yml
KEYS = Path(os.environ.get("COMMBENCH_KEYS_DIR", "/keys"))
RESULTS = Path(os.environ.get("COMMBENCH_RESULTS_DIR", "/results"))
DONE = KEYS / "done"
LINK_PORT = 5299
STARTED = time.time()


class SettingError(Exception):
    """A bad setting; the message names it."""


def log(msg: str) -> None:
    print(f"[{socket.gethostname()}] {msg}", flush=True)


def _int(env: dict[str, str], key: str, default: int, low: int) -> int:
    raw = env.get(key, "").strip() or str(default)
    try:
        value = int(raw)
    except ValueError:
        raise SettingError(f"{key}={raw!r} is not a whole number") from None
    if value < low:
        raise SettingError(f"{key}={value}: must be at least {low}")
    return value


def read_rate(env: dict[str, str]) -> float | None:
    """RATE in Gbit/s (None: unshaped), read as launch.cluster reads --rate."""
    try:
        return parse_rate(env.get("RATE", "").strip() or "none")
    except ClusterError as e:
        raise SettingError(str(e).replace("--rate", "RATE")) from None


@dataclass
class Settings:
    nodes: NodeSet  # containers on this machine (shared_machine), or HOSTS' real hosts
    ranks: int
    launcher: str
    rate_gbps: float | None
    program: list[str]
    output: str | None
    link_test: bool
    keygen: bool
    timeout: float

    @property
    def where(self) -> str:
        return self.nodes.hosts_arg().replace(",", ", ")


def read_settings(env: dict[str, str]) -> Settings:
    """The launcher's settings from the environment; SettingError names a bad one."""
    launcher = env.get("LAUNCHER", "").strip() or "horovodrun"
    if launcher not in LAUNCHERS:
        raise SettingError(f"LAUNCHER={launcher!r}: use one of {', '.join(LAUNCHERS)}")
    iface = env.get("IFACE", "").strip() or "eth0"
    how = dict(network=iface, iface=iface, ssh_port=_int(env, "SSH_PORT", 22, 1))
    if env.get("HOSTS", "").strip():
        try:
            nodes = NodeSet.parse(env["HOSTS"], "HOSTS", **how)
        except ValueError as e:
            raise SettingError(str(e)) from None
    else:
        workers = _int(env, "WORKERS", 2, 0)
        if workers == 0:
            raise SettingError("WORKERS=0: the cluster needs at least one worker node")
        if workers > MAX_NODES:
            raise SettingError(f"WORKERS={workers}: docker-compose.yml defines node1..node"
                               f"{MAX_NODES}; add services there or use fewer workers")
        slots = _int(env, "SLOTS", 2, 1)
        nodes = NodeSet(tuple(commands.Host(f"node{i}", slots) for i in range(1, workers + 1)),
                        shared_machine=True, **how)
    ranks = _int(env, "RANKS", nodes.ranks, 1)
    if ranks > nodes.ranks:
        raise SettingError(f"RANKS={ranks} is more ranks than the {nodes.ranks} slots of "
                           f"{len(nodes.hosts)} nodes ({nodes.hosts_arg().replace(',', ', ')}); "
                           "raise WORKERS or SLOTS, or lower RANKS")
    rate = read_rate(env)
    module = env.get("PROGRAM", "").strip() or "commbench.allreduce"
    if not re.fullmatch(r"[A-Za-z_][\w.]*", module):
        raise SettingError(f"PROGRAM={module!r}: give a Python module, e.g. commbench.microbench")
    try:
        args = shlex.split(env.get("ARGS", ""))
    except ValueError as e:
        raise SettingError(f"ARGS: {e}") from None
    output = None
    if not any(a == "--output" or a.startswith("--output=") for a in args):
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        name = env.get("OUTPUT", "").strip() or f"docker-{launcher}-{stamp}-np{ranks}.jsonl"
        if "/" in name:
            raise SettingError(f"OUTPUT={name!r}: a file name; it is written in the results "
                               "volume (RESULTS_DIR on the host)")
        output = str(RESULTS / name)
        args = [*args, "--output", output]
    return Settings(
        nodes=nodes, ranks=ranks, launcher=launcher, rate_gbps=rate,
        program=commands.python_module(module, args),
        output=output,
        link_test=env.get("LINK_TEST", "1").strip() != "0",
        keygen=env.get("KEYGEN", "1").strip() != "0",
        timeout=float(_int(env, "JOB_TIMEOUT", 3600, 1)),
    )


# --- the nodes ----------------------------------------------------------------------------

def shape_link(iface: str, rate_gbps: float | None) -> None:
    """Limit what this node sends (``launch.links``, as launch.cluster shapes its links)."""
    if rate_gbps is None:
        return
    argv = links.shape_argv(iface, rate_gbps)
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        raise SettingError(f"RATE: {' '.join(argv)} failed ({res.stderr.strip()}); the "
                           "container needs the NET_ADMIN capability (cap_add: [NET_ADMIN])")
    log(f"{iface} shaped to {rate_gbps:g} Gbit/s (tc tbf, egress)")


def _wait_for_done(children: list[subprocess.Popen]) -> int:
    """Idle until the launcher marks the run done, a child dies, or SIGTERM comes."""
    def stop(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while True:
            if DONE.exists() and DONE.stat().st_mtime >= STARTED - 1:
                return 0
            for c in children:
                if c.poll() is not None:
                    log(f"{c.args[0]} exited with status {c.returncode}")
                    return 1
            time.sleep(0.5)
    finally:
        for c in children:
            if c.poll() is None:
                c.terminate()
                c.wait(timeout=10)


def worker(env: dict[str, str]) -> int:
    host = socket.gethostname()
    m = re.fullmatch(r"node(\d+)", host)
    workers = _int(env, "WORKERS", 2, 0)
    if m and int(m.group(1)) > workers and not env.get("HOSTS", "").strip():
        log(f"not part of this cluster (WORKERS={workers}); idle")
        return _wait_for_done([])
    shape_link(env.get("IFACE", "").strip() or "eth0", read_rate(env))
    key = Path("/etc/ssh/ssh_host_ed25519_key")
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                       check=True)
    Path("/run/sshd").mkdir(exist_ok=True)
    port = str(_int(env, "SSH_PORT", 22, 1))
    sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-p", port, "-h", str(key)])
    log(f"sshd on port {port}")
    return _wait_for_done([sshd])


# --- the launcher -------------------------------------------------------------------------

def make_key() -> None:
    """A fresh cluster key in the shared volume; the nodes accept it as authorized."""
    KEYS.mkdir(parents=True, exist_ok=True)
    for name in ("id_ed25519", "id_ed25519.pub", "authorized_keys.tmp"):
        (KEYS / name).unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "commbench-cluster",
                    "-f", str(KEYS / "id_ed25519")], check=True)
    tmp = KEYS / "authorized_keys.tmp"
    shutil.copyfile(KEYS / "id_ed25519.pub", tmp)
    tmp.chmod(0o600)
    tmp.replace(KEYS / "authorized_keys")


def ssh(host: str, port: int, argv: list[str]) -> list[str]:
    return ["ssh", "-p", str(port), host, shlex.join(argv)]


def wait_for_nodes(s: Settings, deadline_s: float = 120.0) -> None:
    """Every node's SSH server takes the cluster key, or SettingError after the deadline."""
    deadline = time.monotonic() + deadline_s
    port = s.nodes.ssh_port
    for host in s.nodes.hosts:
        while True:
            res = subprocess.run(ssh(host.name, port, ["true"]), capture_output=True,
                                 text=True)
            if res.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {host.name} did not accept SSH on port {port} "
                                   f"within {deadline_s:g}s: {res.stderr.strip()}")
            time.sleep(0.5)
    log(f"nodes ready: {', '.join(h.name for h in s.nodes.hosts)}")


def measure_link(s: Settings, seconds: float = 2.0) -> dict:
    """Achieved Gbit/s from the second node to the first (launch.linktest over SSH)."""
    a, b, port = s.nodes.hosts[0].name, s.nodes.hosts[1].name, s.nodes.ssh_port
    return linktest.between(lambda argv: ssh(a, port, argv),
                            lambda argv: ssh(b, port, argv), a, LINK_PORT, seconds)


def job_argv(s: Settings, env: dict[str, str]) -> list[str]:
    """The launch command for the study across the nodes, ``env`` going to every rank
    (``launch.commands.on_nodes``; containers on this machine also say that all ranks
    share its cores, COMMBENCH_MACHINE_RANKS)."""
    return commands.on_nodes(s.nodes, s.launcher, s.ranks, s.program, env)


def launcher(env: dict[str, str]) -> int:
    s = read_settings(env)
    if s.keygen:
        make_key()
    elif not (KEYS / "id_ed25519").exists():
        raise SettingError(f"KEYGEN=0 but there is no key in {KEYS}: run the keygen role "
                           "first and give every node the same folder")
    wait_for_nodes(s)
    link = None
    if s.link_test and len(s.nodes.hosts) > 1:
        link = measure_link(s)
        log(f"link {s.nodes.hosts[1].name} -> {s.nodes.hosts[0].name}: {link['gbps']:.3f} "
            f"Gbit/s (shaped {links.shaping_text(s.rate_gbps)})")
    argv = job_argv(s, {**links.link_env(s.rate_gbps, s.nodes.iface, link),
                        "PYTHONUNBUFFERED": "1"})
    log(f"{s.ranks} ranks on {s.where}: {shlex.join(argv)}")

    def stop(signum, frame):
        raise SystemExit(128 + signum)  # run() then ends the job's whole process group

    signal.signal(signal.SIGTERM, stop)
    res = run(argv, timeout=s.timeout, capture=False)
    status = 124 if res.timed_out else res.returncode
    if res.timed_out:
        log(f"job timed out after {s.timeout:g}s (JOB_TIMEOUT); stopped it")
    log(f"job exited with status {status}" + (f"; records in {s.output}" if s.output else ""))
    return status


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="entrypoint.py", description=__doc__.split("\n")[0],
                                epilog="Settings come from environment variables; "
                                       "see the module docstring.")
    p.add_argument("role", choices=("worker", "launcher", "keygen"))
    a = p.parse_args(argv)
    env = dict(os.environ)
    try:
        if a.role == "worker":
            return worker(env)
        if a.role == "keygen":
            make_key()
            print(f"key made in {KEYS}: give every node this folder as /keys")
            return 0
        try:
            return launcher(env)
        finally:
            KEYS.mkdir(parents=True, exist_ok=True)
            DONE.touch()  # the nodes end too, so a plain `compose up` returns
    except SettingError as e:
        print(f"{a.role}: error: {e}", file=sys.stderr, flush=True)
        return 2
    except (RuntimeError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        detail = getattr(e, "stderr", None)
        print(f"{a.role}: error: {e}" + (f": {detail.strip()}" if detail else ""),
              file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
