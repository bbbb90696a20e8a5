"""Achieved bandwidth of one link: a TCP stream between two nodes, timed at the receiver.

The link reference of a study (``link_gbps`` in its records), so busbw can be
read as a fraction of what the link really carries. Run by the launcher in
two nodes' namespaces::

    python -m launch.linktest serve --port 5299          # on node 1; prints JSON
    python -m launch.linktest send 10.213.57.11 --port 5299 --seconds 2   # on node 2

The receiver times from its first byte to the last and ignores the first
``--skip`` seconds (TCP slow start, tbf's burst bucket).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable

from commbench.linkstats import read_iface_bytes

CHUNK = 1 << 20


def _rx(iface: str | None) -> int | None:
    try:
        return read_iface_bytes(iface)[0] if iface else None
    except (OSError, ValueError):
        return None


def serve(port: int, skip: float, timeout: float, iface: str | None = "eth0") -> dict:
    with socket.create_server(("0.0.0.0", port), reuse_port=False) as srv:
        srv.settimeout(timeout)
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(timeout)
            buf = bytearray(CHUNK)
            first = None
            counted = 0
            rx_start = rx_end = None
            t_start = None
            while True:
                n = conn.recv_into(buf)
                if n == 0:
                    break
                now = time.perf_counter()
                if first is None:
                    first = now
                if now - first >= skip:
                    if t_start is None:
                        t_start = now
                        rx_start = _rx(iface)
                    else:
                        counted += n
                last = now
            rx_end = _rx(iface)
    if t_start is None or last <= t_start:
        raise RuntimeError("link test: too little data received to time the link")
    seconds = last - t_start
    out = {"gbps": counted * 8 / seconds / 1e9, "bytes": counted, "seconds": seconds}
    if rx_start is not None and rx_end is not None:
        # what the interface carried, headers included: the unit /proc/net/dev counts in
        out["wire_gbps"] = (rx_end - rx_start) * 8 / seconds / 1e9
    return out


def send(host: str, port: int, seconds: float, connect_timeout: float) -> None:
    deadline = time.monotonic() + connect_timeout
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=connect_timeout)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    data = b"\0" * CHUNK
    with sock:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            sock.sendall(data)


class LinkTestError(RuntimeError):
    """The receiver or the sender of a link test failed."""


def between(on_dst: Callable[[list[str]], list[str]], on_src: Callable[[list[str]], list[str]],
            dst_host: str, port: int = 5299, seconds: float = 2.0,
            env: dict[str, str] | None = None) -> dict:
    """Measure the link from one node to another; return the receiver's result.

    ``on_dst``/``on_src`` turn an argv into one that runs on that node (ssh, the
    emulated cluster's agent); ``dst_host`` is the receiver's address as the
    sender sees it. The receiver is always reaped, also when the sender fails.
    """
    py = [sys.executable, "-m", "launch.linktest"]
    server = subprocess.Popen(
        on_dst([*py, "serve", "--port", str(port), "--timeout", str(seconds + 30)]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        sender = on_src([*py, "send", dst_host, "--port", str(port), "--seconds", str(seconds)])
        res = subprocess.run(sender, capture_output=True, text=True, env=env,
                             timeout=seconds + 60)
        if res.returncode != 0:
            raise LinkTestError(f"{' '.join(sender)} failed: "
                                f"{res.stderr.strip() or res.stdout.strip()}")
        out, err = server.communicate(timeout=seconds + 60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    if server.returncode != 0:
        raise LinkTestError(f"link test failed: {err.strip()}")
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launch.linktest",
                                description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, default=5299)
    s.add_argument("--skip", type=float, default=0.3, help="seconds ignored at the start")
    s.add_argument("--timeout", type=float, default=30.0)
    c = sub.add_parser("send")
    c.add_argument("host")
    c.add_argument("--port", type=int, default=5299)
    c.add_argument("--seconds", type=float, default=2.0)
    c.add_argument("--connect-timeout", type=float, default=10.0)
    a = p.parse_args(argv)
    if a.cmd == "serve":
        print(json.dumps(serve(a.port, a.skip, a.timeout)), flush=True)
    else:
        send(a.host, a.port, a.seconds, a.connect_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
