"""What a tool's configuration needs to say how long its job runs: where it runs, in numbers.

Each tool's configuration answers its own time estimate (``emulated_s(where)``:
seconds of the job's own work, in emulated time, without start-up) and its own
shortened form for a probe (``probe()``); the experiment runner adds start-up
and link tests, and multiplies the emulated part by the job's dilation K
(``experiments.job.Job.estimate_s``). Stdlib only: planning starts no MPI.

The rates below are this kind of machine's (2 cores), fitted to the job seconds
of the quick study's 31 jobs (``tests/data/job_seconds.json``: 8 ranks on 2
cores, K = 16 and 1); the estimate is checked against them
(``tests/test_experiments.py``), within +-30 % per job.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple

from commbench import metrics

LINK_EFFICIENCY = 0.95  # tbf-shaped links carry 0.944-0.956 of their rate (docs/fidelity.md)
SHM_BYTES_S = 1.1e9  # one node's shared memory, busbw, 2 ranks per core
#: writing gradients + SGD per parameter and rank per core (the quick study's fit: twice the
#: README's 270 ms for 25.6 M parameters with 8 ranks on 2 cores, which timed them alone)
HOST_S_PER_PARAM = 5.2e-9
#: a real training step's own CPU seconds on one core: fixed (the step's Python, the
#: evaluation's share) and per sample (small CNN on digits at 32 px), fitted
REAL_STEP_S = 0.025
REAL_S_PER_SAMPLE = 4e-4
#: a real-workload run's own fixed seconds: the data set, the model, the held-out evaluation
REAL_FIXED_S = 10.0
#: CPU seconds each rank spends before its first step (torch 1.4 s, torch.optim's dynamo
#: 1.5 s, the model, MPI's start; docs/setup.md), by tool; the ranks share the cores
STARTUP_CPU_S = {"train": 4.5, "microbench": 3.0}
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

    def startup_s(self, tool: str = "train") -> float:
        """Wall seconds until every rank's first step: each rank's start-up CPU
        (``STARTUP_CPU_S``), the ranks sharing the cores."""
        return STARTUP_CPU_S[tool] * max(1.0, self.ranks / self.cores) * min(1.0, self.ranks)

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
CPU_S_PER_PARAM_SAMPLE = 2e-8


def real_pass_s(params: int, batch: int | None, image_size: int | None) -> float:
    """Seconds of one real training step (forward + backward + update) of a model of
    ``params`` on ``batch`` samples (32 where not yet resolved) at ``image_size`` px
    (activations scale with the pixels) on one core: ``REAL_STEP_S``, and a small model
    costs at least ``REAL_S_PER_SAMPLE`` a sample."""
    pixels = ((image_size or 64) / 224) ** 2  # (64 px: the CPU default)
    per_sample = max(REAL_S_PER_SAMPLE, params * pixels * CPU_S_PER_PARAM_SAMPLE)
    return REAL_STEP_S + (batch or 32) * per_sample
