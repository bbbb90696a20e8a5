"""Synthetic workload: a real model's gradient shapes, compute replayed as a timed wait.

The gradients have exactly the parameter shapes of the chosen model (taken from
``commbench.models`` on the meta device, the same definitions the real
workload trains). Forward and backward compute is stood in by sleeping for
``compute_ms`` in total, so the CPU stays free as it does while a GPU
computes: one third forward, two thirds backward (the usual ratio for
convolutional nets), the backward share spread over tensors in proportion to
their size. Gradients become ready one tensor at a time in backward order
(last layer first), each filled with a per-rank deterministic value.

With a compute profile (``commbench.profile``: recorded from the real model,
on this CPU or on a GPU) the replay follows it instead: forward and optimizer
take their profiled times and gradient ``i`` becomes ready at its profiled
time after the start of backward, in the profiled order, all scaled by
``compute_scale`` (0.02 models a device 50x faster than where the profile was
recorded).

The replay models a device that computes independently of the host: layer
``i`` of backward is done at ``t0 + sum(d_0..d_i)`` whatever the host did in
between, so host-side work in ``on_ready`` hooks is hidden while there is
slack and shows as exposed sync once it runs past the device.
"""

from __future__ import annotations

import math
import time
from typing import Callable

import torch

from commbench.models import parameter_shapes
from commbench.timing import now

FORWARD_FRACTION = 1.0 / 3.0
POLL_S = 0.0005  # how often progress() runs during replayed compute


def _wait_until(deadline: float, progress: Callable[[], None] | None) -> None:
    if progress is None:
        left = deadline - now()
        if left > 0:
            time.sleep(left)
        return
    while True:
        progress()
        left = deadline - now()
        if left <= 0:
            return
        time.sleep(min(left, POLL_S))


class SyntheticWorkload:
    name = "synthetic"

    def __init__(self, model: str, compute_ms: float, rank: int, seed: int = 0,
                 batch_size: int = 32, num_classes: int = 1000, profile: dict | None = None,
                 compute_scale: float = 1.0) -> None:
        if compute_ms < 0:
            raise ValueError("compute_ms must be >= 0")
        shapes = parameter_shapes(model, num_classes)
        self.model = model
        self.batch_size = batch_size
        self.param_names = [n for n, _ in shapes]
        self.grads = [torch.empty(s, dtype=torch.float32) for _, s in shapes]
        self.buffers: list[torch.Tensor] = []  # replay has no BatchNorm statistics to sync
        sizes = [math.prod(s) for _, s in shapes]
        self.numel = sum(sizes)
        self.nbytes = self.numel * 4
        self.optimizer_s = 0.0
        if profile is None:
            total = compute_ms / 1000.0
            self.forward_s = total * FORWARD_FRACTION
            backward = total - self.forward_s
            self._order = list(reversed(range(len(shapes))))
            durations = {i: backward * sizes[i] / self.numel for i in self._order}
            acc, self._ready_s = 0.0, [0.0] * len(shapes)
            for i in self._order:
                acc += durations[i]
                self._ready_s[i] = acc
        else:
            index = {n: i for i, n in enumerate(self.param_names)}
            self.forward_s = profile["forward_s"] * compute_scale
            self.optimizer_s = profile["optimizer_s"] * compute_scale
            self._order = [index[n] for n in profile["backward_order"]]
            self._ready_s = [g["ready_s"] * compute_scale for g in profile["grads"]]
        # One value per (seed, rank, tensor): cheap to write, differs between ranks.
        gen = torch.Generator().manual_seed(seed * 1_000_003 + rank)
        self._values = (torch.rand(len(shapes), generator=gen) + 0.5).tolist()

    @property
    def backward_order(self) -> list[int]:
        return list(self._order)

    def forward(self, timer, progress: Callable[[], None] | None = None,
                accumulate: bool = False) -> None:
        t0 = now()
        _wait_until(t0 + self.forward_s, progress)
        timer.add_compute(now() - t0, "forward")

    def backward(self, timer, on_ready: Callable[[int], None],
                 progress: Callable[[], None] | None = None,
                 accumulate: bool = False) -> None:
        """Replay backward; ``accumulate`` adds to the gradients instead of setting them."""
        t0 = now()
        host_busy = 0.0
        deadline = t0
        for i in self._order:
            deadline = max(deadline, t0 + self._ready_s[i])
            t = now()
            if accumulate:
                self.grads[i].add_(self._values[i])
            else:
                self.grads[i].fill_(self._values[i])
            host_busy += now() - t
            _wait_until(deadline, progress)
            on_ready(i)
        # The device finishes at the last deadline unless producing the
        # gradients itself took longer; hook time beyond that is sync.
        timer.add_compute(max(deadline - t0, host_busy), "backward")

    def optimizer_step(self, timer) -> None:
        """No weights to update; a profile's optimizer time is replayed as a wait."""
        if self.optimizer_s > 0:
            t0 = now()
            _wait_until(t0 + self.optimizer_s, None)
            timer.add_compute(now() - t0, "optimizer")
