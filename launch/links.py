"""Node links: how a link is shaped (``tc tbf``) and how its reference reaches the ranks.

Written once for every launcher whose nodes have their own links: the emulated
cluster (``launch.cluster``) and the containers (``docker/entrypoint.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from commbench.linkstats import GBPS_ENV, IFACE_ENV, SHAPING_ENV, WIRE_GBPS_ENV

# tbf as probed here (docs/cluster.md): at 1gbit iperf3 saw 962 Mbit/s; netem
# (delay) is not in this kernel.
TBF_BURST = "256kb"
TBF_LATENCY_MS = 50.0


def tc_rate(gbps: float) -> str:
    """Gbit/s as tc writes a rate: ``1.0`` -> ``1000000kbit``."""
    return f"{int(round(gbps * 1e6))}kbit"


def shape_argv(dev: str, gbps: float, prefix: Sequence[str] = (), dilation: float = 1.0
               ) -> list[str]:
    """``tc`` command that limits what leaves ``dev`` to ``gbps`` (tbf as the root qdisc;
    ``replace`` also works when none is set). ``prefix`` runs it elsewhere, e.g. in a
    network namespace (``ip netns exec NS``).

    Under time dilation K (``commbench.dilation``) ``gbps`` is the emulated rate: the link
    runs at gbps / K, tbf's burst stays the same in bytes (a burst at line rate lasts the
    same in emulated time) and its latency (the longest a packet may queue) is K times
    longer on the wall, the same queue in bytes and in emulated time."""
    if gbps <= 0:
        raise ValueError(f"link rate must be > 0 Gbit/s, got {gbps}")
    return [*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
            tc_rate(gbps / dilation), "burst", TBF_BURST, "latency",
            f"{TBF_LATENCY_MS * dilation:g}ms"]


def shaping_text(gbps: float | None) -> str:
    """The shaping as records carry it: ``1gbit`` or ``none``."""
    return f"{gbps:g}gbit" if gbps else "none"


def link_env(gbps: float | None, iface: str | None, measured: dict | None = None) -> dict[str, str]:
    """COMMBENCH_LINK_* for the ranks: the shaping, the nodes' link interface (counted
    per step, ``commbench.linkstats``) and, when the launcher measured a link
    (``launch.linktest``), its achieved rate; ``commbench.results`` records them."""
    env = {SHAPING_ENV: shaping_text(gbps)}
    if iface:
        env[IFACE_ENV] = iface
    if measured:
        env[GBPS_ENV] = f"{measured['gbps']:.4f}"
        if measured.get("wire_gbps"):
            env[WIRE_GBPS_ENV] = f"{measured['wire_gbps']:.4f}"
    return env
