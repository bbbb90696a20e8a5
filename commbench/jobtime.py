"""What a tool's configuration needs to say how long its job runs: where it runs, in numbers.

Each tool's configuration answers its own time estimate (``emulated_s(where)``:
seconds of the job's own work, in emulated time, without start-up) and its own
shortened form for a probe (``probe()``); the experiment runner adds start-up
and link tests, and multiplies the emulated part by the job's dilation K
(``experiments.job.Job.estimate_s``). Stdlib only: planning starts no MPI.

The rates below are this kind of machine's (2 cores), measured as the comments
say; the estimate is checked against recorded job seconds
(``tests/test_experiments.py``), within +-30 %.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple

from commbench import metrics

LINK_EFFICIENCY = 0.95  # tbf-shaped links carry 0.944-0.956 of their rate (docs/fidelity.md)
SHM_BYTES_S = 1.1e9  # one node's shared memory, busbw, 2 ranks per core
HOST_S_PER_PARAM = 2.6e-9  # writing gradients + SGD per parameter and rank per core
# (README: 270 ms for 25.6 M parameters with 8 ranks on 2 cores)
REAL_S_PER_SAMPLE = 6e-4  # small CNN on digits at 32 px, per sample on one core
ASSUMED_GBPS = 1.0  # a real cluster's link, for the estimate only (its rate is not known)


@dataclass(frozen=True)
class Where:
    """A job's placement as the estimate sees it.

    Args:
        ranks: the job's ranks.
        local: ranks on the first node (ranks fill it first): within it, shared memory.
        link_gbps: the node link's configured rate in emulated time (None: unshaped or a
            real cluster, priced at ``ASSUMED_GBPS``).
        cores: this machine's cores, which every emulated node shares.
    """

    ranks: int
    local: int
    link_gbps: float | None = None
    cores: int = os.cpu_count() or 1

    @property
    def share(self) -> float:
        """Ranks sharing each core (at least 1)."""
        return max(1.0, self.ranks / self.cores)

    def allreduce(self, nbytes: float) -> Seconds:
        """How long a ring all-reduce of ``nbytes`` takes on these ranks: the bytes each
        rank sends through the node link (emulated: dilation stretches it) or, all ranks on
        the first node, through shared memory (the host's own copies: it does not)."""
        if self.ranks < 2:
            return Seconds(0.0)
        moved = metrics.ring_bytes(nbytes, self.ranks)
        if self.ranks <= self.local:
            return Seconds(0.0, moved / SHM_BYTES_S)
        gbps = (self.link_gbps or ASSUMED_GBPS) * LINK_EFFICIENCY
        return Seconds(moved * 8 / (gbps * 1e9))


class Seconds(NamedTuple):
    """A job's own time in two parts: ``dilated``, emulated seconds that time dilation K
    stretches K-fold on the wall (replayed compute, transfers on the link); ``host``, wall
    seconds of real work that it does not (real passes, writing gradients, updates)."""

    dilated: float
    host: float = 0.0

    def wall_s(self, k: float = 1.0) -> float:
        """Wall seconds at dilation ``k``."""
        return k * self.dilated + self.host


#: a real forward + backward pass on this machine's CPU, per parameter and sample at 224 px
#: (ResNet-50 at batch 32, 224 px: ~8 s in one process on 2 cores, 25.6 M parameters)
CPU_S_PER_PARAM_SAMPLE = 1e-8


def real_pass_s(params: int, batch: int | None, image_size: int | None) -> float:
    """Seconds of one real forward + backward of a model of ``params`` on ``batch`` samples
    (32 where not yet resolved) at ``image_size`` px (activations scale with the pixels); a
    small model costs at least ``REAL_S_PER_SAMPLE`` a sample (its overheads)."""
    pixels = ((image_size or 64) / 224) ** 2  # 64 px: the CPU default
    return (batch or 32) * max(REAL_S_PER_SAMPLE, params * pixels * CPU_S_PER_PARAM_SAMPLE)
