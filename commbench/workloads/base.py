"""The interface both workloads implement, and the step machinery they share.

A workload is a model (``net``, an ``nn.Module``), its optimizer (``opt``) and
the gradient tensors (``grads``, one per synchronised parameter, in parameter
order: those that take a gradient, a tied one once, less ``unused``),
allocated once and reused so strategies can keep views of them across steps
(the real workload zeroes them; the replay has autograd adopt a view of the
same memory, ``workloads.synthetic``). The runner drives a step in three calls:
``forward``, ``backward`` (which announces gradient ``i`` through
``on_ready(i)`` the moment autograd has accumulated it, in the order backward
really produces them, and calls ``poll()`` so non-blocking collectives
can advance) and ``optimizer_step``.

Gradients are announced by ``register_post_accumulate_grad_hook`` on every
parameter, in both workloads: Horovod's ``DistributedOptimizer`` and DDP hook
the same parameters' gradient accumulators, so the peers (``strategies.peers``)
wrap ``net`` and ``opt`` unchanged whichever workload built them. Time spent
inside the announcing hooks is the strategy's, not compute's.

On a CUDA device the host queues kernels ahead of the device, so host times say
when work was queued. There each phase is timed by two events on the compute
stream (``commbench.timing.DeviceEvents``, the workload's ``events``), read
when the step ends; nothing waits for the whole device, whose other streams
carry the collectives the strategies started during backward. Backward ends at
an event recorded after ``loss.backward()`` returns, or, where a peer (DDP)
makes the compute stream wait for its all-reduces inside ``loss.backward()``,
at the event the last gradient's hook recorded on the compute stream, before
that wait. The strategies' kernels queued from the hooks (copies into buckets)
count in backward there, as DDP's own copies do.

A sharded strategy (``zero3``, the ``fsdp`` peer) waits inside forward and backward for
a unit's parameters to be gathered before the unit can compute. That wait is sync, not
compute: the strategy makes it inside ``stall()``, and the workload takes it out of the
phase's compute (the replay also moves the rest of the phase's schedule later by it:
a device cannot start a unit before its parameters are whole). Host memory only: on a
device the phases are the compute stream's events already.
"""

from __future__ import annotations

import abc
import contextlib
import weakref
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, ClassVar

import torch

from commbench.models.units import unit_names
from commbench.timing import device_events, now


class Workload(abc.ABC):
    """A model trained one step at a time (``commbench.steploop.run_steps``)."""

    #: the ``--workload`` name
    name: ClassVar[str]
    #: whether the model computes for real (its loss and held-out accuracy mean something)
    real: ClassVar[bool]
    image_size: int | None = None
    #: one sample's shape as the model takes it (None: the replay feeds no inputs)
    input_shape: tuple[int, ...] | None = None
    #: which rule of ``workloads.objective.LOSS_RULES`` the loss follows (None: replayed)
    loss_rule: str | None = None
    device = torch.device("cpu")

    def __init__(self, model: str, net: torch.nn.Module, opt: torch.optim.Optimizer,
                 batch_size: int, unused: Sequence[str] = ()) -> None:
        self.model = model
        self.batch_size = batch_size
        self.net = net
        self.opt = opt
        named = list(net.named_parameters())  # a tied parameter once
        #: parameters that take no gradient (``requires_grad`` False): not synchronised
        self.frozen = [n for n, p in named if not p.requires_grad]
        #: parameters backward never reaches (``workloads.objective``): not synchronised
        self.unused = list(unused)
        skip = set(self.unused)
        synced = [(n, p) for n, p in named if p.requires_grad and n not in skip]
        self.params = [p for _, p in synced]
        self.param_names = [n for n, _ in synced]
        for p in self.params:
            p.grad = torch.zeros_like(p)
        self.grads = [p.grad for p in self.params]
        #: model buffers (BatchNorm statistics): reduced by no gradient sync
        #: (``commbench.buffers`` decides whether rank 0's are broadcast)
        self.buffers = list(net.buffers())
        self.numel = sum(p.numel() for p in self.params)
        self.nbytes = sum(p.numel() * p.element_size() for p in self.params)
        self.loss: torch.Tensor | None = None
        #: set by a peer (DDP) that waits for its all-reduces inside ``loss.backward()``:
        #: backward compute then ends at the last gradient's hook, the rest is sync
        self.sync_in_backward = False
        self._order: list[int] = []
        self._seen_order: list[int] | None = None
        self._on_ready: Callable[[int], None] | None = None
        self._poll: Callable[[], None] | None = None
        self._hook_s = 0.0
        #: when the latest gradient's announcing hook ended (this rank's clock)
        self.last_ready = 0.0
        #: the device clock where the model computes on a GPU (None in host memory)
        self.events = device_events(self.device)
        #: on a device: the event each gradient's hook records again on the compute stream
        #: as it starts (after backward: the last gradient's)
        self._ready_mark = None
        self._ready_marked = False
        #: seconds the current phase waited in ``stall`` (reset as forward or backward begins)
        self.stalled_s = 0.0
        self._stall_depth = 0
        # The hooks reach the workload through a weak reference: autograd holds them in C++,
        # out of the garbage collector's sight, so a hook that held the workload would keep
        # it, its model and gradients alive for good (each run of a job leaked its
        # workload: ~2x the gradient's bytes a run, and a nine-run ResNet-50 job on 8 ranks
        # met the OOM killer at 24 GiB)
        me = weakref.ref(self)
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(partial(_announce_weakly, me, i))

    @contextlib.contextmanager
    def stall(self) -> Iterator[None]:
        """Wait for what the phase's compute needs from sync (a unit's parameters, gathered):
        the time inside is added to ``stalled_s`` and ``_stalled`` is told of it. Nested
        stalls count once, as the outermost."""
        self._stall_depth += 1
        t = now()
        try:
            yield
        finally:
            self._stall_depth -= 1
            if not self._stall_depth:
                waited = now() - t
                self.stalled_s += waited
                self._stalled(waited)

    @contextlib.contextmanager
    def blocked(self, indices: Sequence[int] = ()) -> Iterator[None]:
        """The host blocked inside a phase in a collective (a peer's blocking all-gather or
        reduce-scatter, FSDP2's on the CPU). Where the model computes on this thread (the
        real workload) nothing computes meanwhile: a ``stall``, sync and not compute. The
        replay's device computes on instead (``SyntheticWorkload.blocked``) and only
        gradients ``indices``, which need what the collective brings (a unit's parameters),
        wait for its end."""
        with self.stall():
            yield

    def _stalled(self, seconds: float) -> None:  # noqa: B027 - the real workload has none
        """The phase waited ``seconds`` on sync (``stall``): the replay moves its schedule."""

    def _announce(self, i: int) -> None:
        """Gradient ``i`` has accumulated (its hook): tell the strategy."""
        if self._ready_mark is not None:  # a device: before any kernel of the hook's
            self._ready_mark.record(self.events.stream())
            self._ready_marked = True
        t = now()
        self._order.append(i)
        if self._on_ready is not None:
            self._on_ready(i)
        if self._poll is not None:
            self._poll()
        self.last_ready = now()
        self._hook_s += self.last_ready - t

    @property
    def unit_paths(self) -> list[str]:
        """The module paths of the model's units (``commbench.models.units``), whose modules
        its forward calls one by one, in registration order: where a sharded strategy
        (``zero3``) hooks each unit's forward."""
        return unit_names(self.net)

    @property
    def backward_order(self) -> list[int]:
        """Order in which backward produces the gradients (reverse registration before
        the first backward has run)."""
        return list(self._seen_order or reversed(range(len(self.params))))

    def _run_backward(self, on_ready: Callable[[int], None],
                      poll: Callable[[], None] | None) -> tuple[Any, Any]:
        """``loss.backward()`` with the gradients announced; return (start, end): this
        rank's clock in host memory, events on the compute stream on a device.

        The end is the last gradient's hook where a peer waits for its all-reduces
        inside backward (``sync_in_backward``), else when backward returned.
        """
        self._on_ready, self._poll = on_ready, poll
        self._order, self._hook_s = [], 0.0
        if self.events is not None:
            self._ready_mark, self._ready_marked = self.events.event(), False
            t = self.events.mark()
        else:
            t = now()
        try:
            self.loss.backward()
        finally:
            self._on_ready = self._poll = None
        if self.events is not None:
            end = self._ready_mark if self.sync_in_backward and self._ready_marked \
                else self.events.mark()
            self._ready_mark = None
        else:
            end = self.last_ready if self.sync_in_backward else now()
        if self._seen_order is None and len(self._order) == len(self.params):
            self._seen_order = list(self._order)
        return t, end

    @abc.abstractmethod
    def forward(self, timer, poll: Callable[[], None] | None = None,
                accumulate: bool = False) -> None:
        """Forward pass and loss; ``accumulate`` keeps earlier micro-batches' gradients."""

    @abc.abstractmethod
    def backward(self, timer, on_ready: Callable[[int], None],
                 poll: Callable[[], None] | None = None, accumulate: bool = False) -> None:
        """Backward pass, announcing each gradient through ``on_ready``."""

    @abc.abstractmethod
    def optimizer_step(self, timer) -> None:
        """The optimizer's update of the parameters (gradients hold the mean by then)."""

    def evaluate(self) -> float | None:
        """Held-out accuracy, where the workload has a labelled data set."""
        return None

    def parameter_checksum(self) -> float:
        """Sum of all parameters, to compare ranks after training."""
        with torch.no_grad():
            return float(sum(p.double().sum() for p in self.params))

    def buffer_checksum(self) -> float:
        """Sum of all buffers (BatchNorm statistics), to compare ranks after training."""
        with torch.no_grad():
            return float(sum(b.double().sum() for b in self.buffers))


def _announce_weakly(workload: weakref.ref, i: int, _param: torch.Tensor) -> None:
    """Gradient ``i``'s hook: its workload's ``_announce``, while the workload lives."""
    wl = workload()
    if wl is not None:
        wl._announce(i)
