"""The per-message latency (alpha) between nodes, measured through the job's own library.

A figure made of many small messages is priced by the network's alpha, not its rate.
On the emulated cluster there is no link delay to dilate: tbf's ``latency`` is a queue
bound, not a delay, and this kernel has no netem, so the per-message latency is the
host stack's, and dilation divides it by about K (docs/fidelity.md: an 8-byte all-reduce
between 2 emulated nodes, Open MPI, 12.4 us at K = 1 and 2.26 us at K = 8). A real
1 GbE TCP network has tens of microseconds. Nothing can add the missing delay here, so
every job measures what it ran on and its records say so (``alpha_us`` beside
``dilation`` and ``backend``); a reader then knows whether a small-message figure came
from a network with a realistic alpha.

How (as OSU's ``osu_latency`` and nccl-tests' smallest size do it, through the library
the job uses, on an idle link): the job's first rank on every node forms a group; the
group runs ``WARMUP`` then ``CALLS`` 8-byte all-reduces back to back, each timed on the
emulated clock (``commbench.timing.now``), while every other rank waits without spinning
(a non-blocking all-reduce tested every millisecond, so on 2 cores no polling rank takes
the cores from the two that measure). The record holds rank 0's median, p5 and p95 per
call. It is the time of a whole small all-reduce among one rank per node: one round trip
on 2 nodes, about log2(N) on N (an upper bound on one message's alpha).

A job on one node has no link between nodes: ``alpha_us`` is None and ``alpha_note``
says why.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch

from commbench.comm.base import Communicator
from commbench.metrics import percentile
from commbench.timing import now

#: 8-byte all-reduces before the timed ones (connections, first-call set-up)
WARMUP = 5
#: timed 8-byte all-reduces
CALLS = 50
#: how often a rank outside the group checks whether the group is done (wall seconds)
IDLE_POLL_S = 0.001


def _wait_idle(comm: Communicator, device: torch.device) -> None:
    """Every rank: return once all have arrived, testing every millisecond instead of
    spinning in a blocking barrier (Open MPI's polls a core)."""
    handle = comm.iallreduce(torch.zeros(1, dtype=torch.float64, device=device))
    while not handle.test():
        time.sleep(IDLE_POLL_S)
    handle.wait()


def measure(comm: Communicator) -> dict:
    """The emulated alpha between nodes, as the fields every record of the job carries.

    Collective: every rank calls it, once, before the job's own work."""
    nodes = comm.topo.nodes
    fields: dict = {"alpha_us": None, "alpha_p5_us": None, "alpha_p95_us": None,
                    "alpha_calls": 0, "alpha_ranks": nodes, "alpha_note": None}
    if nodes < 2:
        fields["alpha_note"] = "one node: no link between nodes to measure"
        return fields
    # where the backend's collectives take their tensors (NCCL: this rank's GPU)
    device = comm.placement().comm_device
    hosts = comm.topo.hostnames
    leaders = sorted({h: r for r, h in reversed(list(enumerate(hosts)))}.values())
    group = comm.subgroup(leaders)
    per_call: list[float] = []
    if group is not None:
        buf = torch.ones(1, dtype=torch.float64, device=device)
        for i in range(WARMUP + CALLS):
            t0 = now()
            group.allreduce(buf)  # blocking: on a device, returns once the device is done
            if i >= WARMUP:
                per_call.append(now() - t0)
    _wait_idle(comm, device)
    if comm.rank == 0:  # rank 0 is its node's first rank, so it is in the group
        # what carried the calls: under Horovod's MPI controller its groups are MPI
        # communicators (the process sets' twins), under its Gloo controller process sets
        carrier = group.name if group.name == comm.name else f"{group.name} within {comm.name}"
        fields.update(
            alpha_us=round(percentile(per_call, 50) * 1e6, 3),
            alpha_p5_us=round(percentile(per_call, 5) * 1e6, 3),
            alpha_p95_us=round(percentile(per_call, 95) * 1e6, 3),
            alpha_calls=len(per_call),
            alpha_note=(f"8-byte all-reduce among one rank per node ({nodes}) on "
                        f"{carrier}, median of {len(per_call)} calls after {WARMUP}, "
                        "emulated time"))
    return fields


#: a figure at least this share of which is ``calls x alpha`` is ``latency-bound``: its time is
#: mostly per-message latency, which dilation shrinks by about K on the emulated cluster, so a
#: figure that stops moving with K is not thereby a network's
LATENCY_BOUND_SHARE = 0.5
LATENCY_BOUND = "latency-bound"


def latency_fields(alpha_us: float | None, calls: float | None, seconds: float | None) -> dict:
    """``latency_share`` = calls x alpha / seconds (the least the calls would take at zero
    bytes, as a share of what they took) and ``latency_bound`` (that share >= one half), for
    a run's median step (its collectives and their comm time) or a microbenchmark row (one
    call and its time). Both None where alpha was not measured (one node) or nothing ran."""
    if not all(x and math.isfinite(x) for x in (alpha_us, calls, seconds)):
        return {"latency_share": None, "latency_bound": None}
    share = calls * alpha_us * 1e-6 / seconds
    return {"latency_share": round(share, 4), "latency_bound": share >= LATENCY_BOUND_SHARE}


def footer_lines(fields: dict, k: float, labelled: Sequence[tuple[str, dict]]) -> list[str]:
    """The table's lines on the measured alpha (``measure``'s fields) at dilation ``k``, and
    on the rows (``(label, record)``) whose figure is latency-bound."""
    a = fields.get("alpha_us")
    if a is None:
        return [f"alpha between nodes: {fields.get('alpha_note') or 'not measured'}"]
    line = (f"alpha between nodes: {a:.1f} us (p5-p95 {fields['alpha_p5_us']:.1f}-"
            f"{fields['alpha_p95_us']:.1f}; {fields['alpha_note']})")
    if k > 1:
        line += (f"; at dilation K = {k:g} the emulated network's alpha is this host's "
                 "divided by about K (no qdisc here adds a delay)")
    lines = [line]
    bound = [f"{label} ({r['latency_share']:.0%})" for label, r in labelled
             if r.get("latency_bound")]
    if bound:
        lines.append(f"{LATENCY_BOUND}: {', '.join(bound)}: calls x alpha is at least half of "
                     "their comm time, so dilation, which shrinks alpha with K, cannot show "
                     "them converged; a real network's alpha is the user's to give")
    return lines
