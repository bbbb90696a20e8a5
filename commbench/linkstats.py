"""Bytes through this node's network link, read from /proc/net/dev.

When a launcher names the node's link interface in COMMBENCH_LINK_IFACE (the
emulated cluster does: ``eth0`` inside every node), local rank 0 of each node
reads the interface's byte counters around every step. The records then say
how many bytes the algorithm really pushed through the busiest node link, and
with the measured link bandwidth, how close the step's communication came to
the link's limit (``link_efficiency``). /proc/net/dev is per network
namespace, so each node sees its own link.
"""

from __future__ import annotations

import os

IFACE_ENV = "COMMBENCH_LINK_IFACE"
# The link reference a launcher gives the ranks (``launch.links.link_env`` writes them,
# ``commbench.results.link_info`` reads them into the records).
GBPS_ENV = "COMMBENCH_LINK_GBPS"            # achieved Gbit/s of one inter-node link
WIRE_GBPS_ENV = "COMMBENCH_LINK_WIRE_GBPS"  # the same stream in interface bytes
SHAPING_ENV = "COMMBENCH_LINK_SHAPING"      # the tc rate, or "none"


def link_iface(environ: dict[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    return env.get(IFACE_ENV) or None


def read_iface_bytes(iface: str, path: str = "/proc/net/dev") -> tuple[int, int]:
    """(rx_bytes, tx_bytes) of ``iface``."""
    with open(path) as f:
        for line in f:
            name, sep, rest = line.partition(":")
            if sep and name.strip() == iface:
                fields = rest.split()
                return int(fields[0]), int(fields[8])
    raise ValueError(f"{IFACE_ENV}={iface}: no such interface in {path}")


def link_efficiency(link_bytes: int | None, link_gbps: float | None,
                    comm_s: float) -> float | None:
    """Ideal time of ``link_bytes`` on the link over the measured comm time (1 = at the limit)."""
    if not link_bytes or not link_gbps or comm_s <= 0:
        return None
    return (link_bytes * 8 / (link_gbps * 1e9)) / comm_s
