"""Synthetic workload: a real model's parameters, its compute replayed as timed waits.

The model (``ReplayNet``) has exactly the chosen model's parameters, names
and shapes (from ``commbench.models`` on the meta device, the same
definitions the real workload trains), but no activations: its forward is a
chain of one autograd function per parameter, each taking that parameter as
an explicit input, and its backward waits for each parameter's replayed time
and hands autograd a gradient. So autograd accumulates every gradient into
``param.grad`` one at a time during ``loss.backward()``, and everything that
hooks a parameter's gradient accumulator fires then: the project's
strategies (``workloads.base``), Horovod's ``DistributedOptimizer`` and
DDP's reducer alike. The optimizer is plain SGD on the real parameters.

Compute is stood in by sleeping (the GIL and the CPU are released, as while
a GPU computes): ``--compute-ms`` in total, one third forward, two thirds
backward spread over tensors in proportion to their size, in reverse
registration order (a user's model, ``--model package.module:factory``: in
the order backward reaches them, learnt from one backward pass on the meta
device, which also finds the parameters it never reaches: those are left
out, as the real workload leaves them out, ``workloads.objective``). With a
compute profile (``commbench.profile``, recorded from the real model on this
CPU or on a GPU) the replay follows it instead: forward and optimizer take
their profiled times and gradient ``i`` becomes ready at its profiled time
after the start of backward, in the profiled order, all scaled by
``compute_scale`` (0.02 models a device 50x faster than where the profile
was recorded).

Forward runs unit by unit where the profile times its units (``forward_units``;
a unit is a top-level block, ``commbench.models.units``): the replayed model has
a module at each unit's path, and its forward calls each unit's module when the
unit's profiled forward began, and that call returns when it ended. So a forward
pre-hook on a unit's module (a sharded strategy's parameter gather, FSDP's) fires
once per unit, in the profiled order, at the unit's time, and the root's own work
(stem, head) fills the gaps. Each unit's module applies its own parameters' part of
the chain where backward keeps them together (``forward_plan``); the chain, and so
backward's order, is the same either way. A profile without units (recorded before
they were), and ``--compute-ms``, replay forward as one wait, as before.

The replay models a device that computes independently of the host: layer
``i`` of backward is done at ``t0 + ready_i`` whatever the host did in
between, so host-side work in gradient hooks is hidden while there is slack
and shows as exposed sync once it runs past the device.

Each rank's gradient for tensor ``i`` is a per-(seed, rank, tensor) constant.
Stragglers on purpose: ``slow`` multiplies this rank's replayed times
(F on rank R under ``--slow-rank R:F``), and ``jitter`` draws each step's factor from a gamma
distribution with mean 1 and that coefficient of variation (``--compute-jitter``,
seeded per rank).
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable, Collection, Iterator, Sequence

import torch

from commbench import dilation
from commbench.models import parameter_shapes
from commbench.models.factory import is_factory
from commbench.models.units import ROOT, model_units
from commbench.profilefile import Unit
from commbench.timing import now
from commbench.workloads.base import Workload
from commbench.workloads.objective import probe_spec

FORWARD_FRACTION = 1.0 / 3.0
POLL_S = 0.0005  # how often poll() runs during replayed compute


def _wait_until(deadline: float, poll: Callable[[], None] | None) -> None:
    """Sleep (driving ``poll`` every POLL_S) until ``deadline``."""
    while True:
        if poll is not None:
            poll()
        left = deadline - now()
        if left <= 0:
            return
        dilation.sleep(left if poll is None else min(left, POLL_S))


class ReplayClock:
    """One step's schedule: when each gradient is due in backward (and each unit's forward
    in forward, ``until``), and what the host slept."""

    def __init__(self, ready_s: list[float], values: list[float]) -> None:
        self.ready_s = ready_s
        self.values = values  # this rank's gradient of each tensor, a constant per tensor
        self.stores: list[torch.Tensor] = []  # the workload's gradient tensors
        self._expanded: list[torch.Tensor] = []
        #: the step's first micro-batch: gradients are set, not added to
        self.fresh = True
        self.factor = 1.0
        self.t0 = 0.0
        self.poll: Callable[[], None] | None = None
        #: backward: gradient -> the host time before which its computation cannot begin
        #: (``hold``), and the latest ready time reached (where the next one's begins)
        self.holds: dict[int, float] = {}
        self.reached_s = 0.0
        #: host seconds spent producing the gradients (the replay's own work: from each
        #: gradient's deadline to its announcing hook)
        self.host = 0.0
        self._returned = 0.0

    def deadline(self, i: int) -> float:
        return self.t0 + self.ready_s[i] * self.factor

    def until(self, s: float) -> None:
        """Wait until ``s`` replayed seconds after ``t0`` (forward: a unit's start or end),
        driving ``poll``."""
        _wait_until(self.t0 + s * self.factor, self.poll)

    def attach(self, stores: list[torch.Tensor]) -> None:
        self.stores = stores
        self._expanded = [torch.full((), v).expand_as(g) for v, g in zip(self.values, stores)]

    def hold(self, i: int, t: float) -> None:
        """Gradient ``i``'s computation begins no earlier than ``t`` (this rank's clock)."""
        self.holds[i] = max(t, self.holds.get(i, t))

    def wait_for(self, i: int) -> torch.Tensor:
        """Wait until gradient ``i`` is due; return what autograd accumulates.

        Where ``i`` is held (``hold``: it needs what arrives at ``t``) and its computation
        would begin before ``t`` (at the ready time reached before it), the rest of the
        schedule moves later so that it begins at ``t``.

        A step's first micro-batch writes the constant into the workload's own
        gradient tensor and hands autograd a fresh view of it: ``param.grad`` is
        None then (``SyntheticWorkload.forward``), so autograd adopts the view
        without a copy and ``param.grad`` shares the tensor the strategies hold
        (one pass, no zeroing). Later micro-batches hand a stride-0 view of the
        constant, which autograd adds (one pass).
        """
        held = self.holds.pop(i, None)
        if held is not None:
            begins = self.t0 + self.reached_s * self.factor
            self.t0 += max(0.0, held - begins)
        self.reached_s = max(self.reached_s, self.ready_s[i])
        _wait_until(self.deadline(i), self.poll)
        self._returned = now()
        if not self.fresh:
            return self._expanded[i]
        g = self.stores[i]
        g.fill_(self.values[i])
        return g.view_as(g)

    def accumulated(self) -> None:
        """Gradient accumulated (called by its announcing hook, before the strategy's)."""
        self.host += now() - self._returned


class _ReplayLayer(torch.autograd.Function):
    """One parameter's share of the replay: forward passes ``h`` on; backward waits
    until the parameter's gradient is due and returns it, so autograd accumulates it
    into ``param.grad`` (and fires every hook on its accumulator) at that moment."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, param: torch.Tensor, clock: ReplayClock, i: int):
        ctx.clock, ctx.i = clock, i
        return h.clone()

    @staticmethod
    def backward(ctx, grad_h: torch.Tensor):
        return grad_h, ctx.clock.wait_for(ctx.i), None, None


def _replay(h: torch.Tensor, chain: list[int], params: list[torch.nn.Parameter],
            clock: ReplayClock) -> torch.Tensor:
    for i in chain:
        h = _ReplayLayer.apply(h, params[i], clock, i)
    return h


class _ReplayUnit(torch.nn.Module):
    """One unit of the replayed model (``commbench.models.units``): called when the unit's
    profiled forward begins, it applies its share of the chain and waits until the unit's
    profiled end, so what hooks the unit's forward fires then."""

    def __init__(self, clock: ReplayClock) -> None:
        super().__init__()
        self.clock = clock
        self.start_s = self.end_s = 0.0
        self.chain: list[int] = []
        self.all_params: list[torch.nn.Parameter] = []  # the model's, indexed by ``chain``

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = _replay(h, self.chain, self.all_params, self.clock)
        self.clock.until(self.end_s)
        return h


def forward_plan(chain: list[int], unit_of: list[str], units: list[str]
                 ) -> list[tuple[str, list[int]]]:
    """Cut the replay's chain (parameter indices, forward first) into the root's and each
    unit's part: ``[(unit, indices)]`` in the order forward runs them, ROOT for the root's
    own work between units, every unit of ``units`` once and in its order.

    Backward walks the chain from its end, so its order is the chain's whatever the cut.
    Where backward does not leave each unit's parameters together, in the reverse of the
    units' order (a unit's gradient ready between two of another's), no cut keeps both
    orders: then the root applies the whole chain before the first unit, and the units
    only wait out their time.
    """
    position = {name: k for k, name in enumerate(units)}
    plan: list[tuple[str, list[int]]] = [(ROOT, [])]
    entered = -1  # the last unit entered
    for i in chain:
        k = position.get(unit_of[i])  # a unit the profile does not time: the root's part
        if k is None:
            if plan[-1][0] != ROOT:
                plan.append((ROOT, []))
        elif k > entered:
            plan += [(name, []) for name in units[entered + 1:k + 1]]
            entered = k
        elif k < entered or plan[-1][0] != units[k]:
            return [(ROOT, list(chain))] + [(name, []) for name in units]
        plan[-1][1].append(i)
    return plan + [(name, []) for name in units[entered + 1:]]


class ReplayNet(torch.nn.Module):
    """A model's parameters (names, shapes, registration order) without its layers.

    Parameters start at zero (the same on every rank without a broadcast; the
    replay's loss does not depend on their values). ``forward`` chains one
    ``_ReplayLayer`` per parameter so that backward reaches them in ``order``.

    Given the profile's ``units`` (the root unit first, then the units in the order
    their forward ran; times from the start of forward) and each parameter's unit
    (``unit_of``), each unit's module is a ``_ReplayUnit``: forward waits until a unit's
    start, calls it (its forward hooks fire, once, in order) and, after the last, waits
    until the root's end; the chain is cut between the root and the units
    (``forward_plan``). Without units the whole chain runs at once and the workload
    waits out forward.
    """

    def __init__(self, shapes: list[tuple[str, tuple[int, ...]]], order: list[int],
                 clock: ReplayClock, units: Sequence[Unit] = (),
                 unit_of: Sequence[str] = ()) -> None:
        super().__init__()
        self.clock = clock
        spans = {u.name: u for u in units}
        self._params: list[torch.nn.Parameter] = []
        for name, shape in shapes:
            *path, leaf = name.split(".")
            p = torch.nn.Parameter(torch.zeros(shape))
            self._module_at(path, spans).register_parameter(leaf, p)
            self._params.append(p)
        chain = list(reversed(order))  # applied last-first: backward walks ``order``
        self._units: dict[str, _ReplayUnit] = {}
        for u in units[1:]:  # units without a parameter are made here
            unit = self._module_at(u.name.split("."), spans)
            unit.start_s, unit.end_s, unit.all_params = u.start_s, u.end_s, self._params
            self._units[u.name] = unit
        self._root_end_s = units[0].end_s if units else 0.0
        self._plan = forward_plan(chain, list(unit_of), list(self._units)) if units \
            else [(ROOT, chain)]
        for name, part in self._plan:
            if name != ROOT:
                self._units[name].chain = part

    def _module_at(self, path: list[str], units: Collection[str]) -> torch.nn.Module:
        """The module at ``path`` (module names), made where missing: a ``_ReplayUnit`` at a
        unit's path, else an empty module."""
        owner: torch.nn.Module = self
        for k, part in enumerate(path):
            child = owner._modules.get(part)
            if child is None:
                child = _ReplayUnit(self.clock) if ".".join(path[:k + 1]) in units \
                    else torch.nn.Module()
                owner.add_module(part, child)
            owner = child
        return owner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for name, part in self._plan:
            if name == ROOT:
                h = _replay(h, part, self._params, self.clock)
            else:
                unit = self._units[name]
                self.clock.until(unit.start_s)
                h = unit(h)
        if self._units:
            self.clock.until(self._root_end_s)
        return h


def compute_factor(slow: float, jitter: float, rng: random.Random) -> float:
    """This rank's factor on its replayed times for one step (draws from ``rng``)."""
    f = slow
    if jitter > 0:  # gamma(k, theta) with mean k*theta = 1 and CV = 1/sqrt(k)
        k = 1.0 / jitter ** 2
        f *= rng.gammavariate(k, 1.0 / k)
    return f


class SyntheticWorkload(Workload):
    name = "synthetic"
    real = False

    def __init__(self, model: str, compute_ms: float, rank: int, seed: int = 0,
                 batch_size: int = 32, num_classes: int = 1000, profile: dict | None = None,
                 compute_scale: float = 1.0, lr: float = 0.01,
                 slow: float = 1.0, jitter: float = 0.0, model_kwargs: dict | None = None,
                 input_shape: Sequence[int] | None = None, vocab: int | None = None) -> None:
        if compute_ms < 0:
            raise ValueError("compute_ms must be >= 0")
        if slow <= 0:
            raise ValueError(f"--slow-rank: factor must be > 0, got {slow}")
        if jitter < 0:
            raise ValueError(f"--compute-jitter must be >= 0, got {jitter}")
        shapes = parameter_shapes(model, num_classes, model_kwargs)
        probe = None
        if profile is not None:
            unused = list(profile.get("unused", []))
        elif is_factory(model):  # a user's model: learn its backward on the meta device
            if input_shape is None:
                raise ValueError(f"--model {model}: the replay learns its backward from one "
                                 "pass on the meta device and needs its input shape")
            self.input_shape = tuple(input_shape)
            probe = probe_spec(model, dict(model_kwargs or {}), num_classes, batch_size,
                               self.input_shape, vocab)
            unused = probe.unused
        else:
            unused = []
        #: parameters the real model's backward never reaches: not replayed, not synchronised
        skip = set(unused)
        shapes = [(n, s) for n, s in shapes if n not in skip]
        index = {n: i for i, n in enumerate(n for n, _ in shapes)}
        sizes = [math.prod(s) for _, s in shapes]
        numel = sum(sizes)
        self.optimizer_s = 0.0
        #: each unit's forward, the root unit first (empty: forward is replayed as one wait)
        self.forward_units: list[Unit] = []
        unit_of: list[str] = []
        if profile is None:
            total = compute_ms / 1000.0
            self.forward_s = total * FORWARD_FRACTION
            backward = total - self.forward_s
            order = [index[n] for n in probe.order] if probe is not None \
                else list(reversed(range(len(shapes))))
            acc, ready_s = 0.0, [0.0] * len(shapes)
            for i in order:
                acc += backward * sizes[i] / numel
                ready_s[i] = acc
        else:
            self.forward_s = profile["forward_s"] * compute_scale
            self.optimizer_s = profile["optimizer_s"] * compute_scale
            order = [index[n] for n in profile["backward_order"]]
            ready = {g["name"]: g["ready_s"] for g in profile["grads"]}
            ready_s = [ready[n] * compute_scale for n, _ in shapes]
            if profile.get("forward_units") is not None:
                self.forward_units = [
                    Unit(u["name"], u["start_s"] * compute_scale, u["end_s"] * compute_scale)
                    for u in profile["forward_units"]]
                home = model_units(model, num_classes, model_kwargs)[1]
                unit_of = [home[n] for n, _ in shapes]
        # One value per (seed, rank, tensor): cheap to write, differs between ranks.
        gen = torch.Generator().manual_seed(seed * 1_000_003 + rank)
        values = (torch.rand(len(shapes), generator=gen) + 0.5).tolist()
        #: each tensor's gradient on this rank (every element of tensor ``i`` holds ``[i]``)
        self.grad_values = values
        self.clock = ReplayClock(ready_s, values)
        net = ReplayNet(shapes, order, self.clock, self.forward_units, unit_of)
        super().__init__(model, net, torch.optim.SGD(net.parameters(), lr=lr), batch_size)
        self.unused = list(unused)
        self.clock.attach(self.grads)
        self._seen_order = order  # known: no backward needs to run to learn it
        self._backward_s = max(ready_s, default=0.0)  # when the last gradient is due
        self._input = torch.zeros(1)
        self.slow, self.jitter = slow, jitter
        self._rng = random.Random(seed * 1_000_003 + rank)
        self.factor = 1.0

    @property
    def unit_paths(self) -> list[str]:
        """The units the replay calls one by one: its profile's, in the order they ran
        (none without per-unit times: the model is then one root unit)."""
        return [u.name for u in self.forward_units[1:]]

    def forward(self, timer, poll: Callable[[], None] | None = None,
                accumulate: bool = False) -> None:
        t0 = now()
        if not accumulate:  # a new step: draw its compute factor
            self.factor = compute_factor(self.slow, self.jitter, self._rng)
            for p in self.params:  # backward sets each gradient (ReplayClock.wait_for)
                p.grad = None
        c = self.clock
        c.fresh = not accumulate
        c.t0, c.factor, c.poll = t0, self.factor, poll  # units' times count from here
        self.stalled_s = 0.0
        self.loss = self.net(self._input).sum()
        c.poll = None
        _wait_until(c.t0 + self.forward_s * self.factor, poll)  # c.t0: moved by any stall
        timer.add_compute(now() - t0 - self.stalled_s, "forward")

    def backward(self, timer, on_ready: Callable[[int], None],
                 poll: Callable[[], None] | None = None, accumulate: bool = False) -> None:
        """Replay backward: gradient ``i`` is accumulated at ``t0 + ready_i`` (or later,
        if the host was busy past it)."""
        c = self.clock
        c.factor, c.host, c.poll = self.factor, 0.0, poll
        c.t0 = now()  # deadlines count from here, whatever the host does in between
        c.holds.clear()
        c.reached_s = 0.0
        self.stalled_s = 0.0
        self._run_backward(on_ready, poll)
        c.poll = None
        due = self._backward_s * self.factor
        # The device finishes at the last deadline unless the replay's own host work
        # (accumulating the gradients) took longer; time in the strategies' hooks (or a
        # peer's, inside backward) beyond that is sync.
        timer.add_compute(max(due, c.host), "backward")

    def _stalled(self, seconds: float) -> None:
        """The phase's remaining schedule (each unit's start and end in forward, each
        gradient's deadline in backward) moves ``seconds`` later: what was due after the
        wait is computed after it, as on a device that waits for the unit's parameters."""
        self.clock.t0 += seconds

    def hold(self, indices: Sequence[int], t: float) -> None:
        """In backward: the computation of gradients ``indices`` begins no earlier than
        ``t`` (``now()``): they need what arrives then (a unit's parameters, gathered
        while the host was behind the replay's device)."""
        for i in indices:
            self.clock.hold(i, t)

    @contextlib.contextmanager
    def blocked(self, indices: Sequence[int] = ()) -> Iterator[None]:
        """The host blocked in a collective (``Workload.blocked``): the replay's device
        computes on, as a GPU's beside a collective on its own stream, and gradients
        ``indices`` are held until the collective ends (``hold``)."""
        yield
        self.hold(indices, now())

    def _announce(self, i: int) -> None:
        self.clock.accumulated()
        super()._announce(i)

    def optimizer_step(self, timer) -> None:
        """SGD on the real parameters; a profile's optimizer time is replayed as a floor."""
        t0 = now()
        self.opt.step()
        _wait_until(t0 + self.optimizer_s * self.factor, None)
        timer.add_compute(now() - t0, "optimizer")
