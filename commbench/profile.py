"""Tool: record a compute profile, when each gradient of a real backward pass becomes ready.

Record once from the real model, then let the synthetic workload replay it
at a target device's speed::

    python -m commbench.profile --model resnet50 --batch-size 32 --image-size 224 -o r50.json
    mpirun -np 8 python -m commbench.allreduce --compute-profile r50.json --compute-scale 0.02

Your own model the same way (``--model package.module:factory``, its
``--model-kwargs``, ``--input-shape`` and ``--vocab`` as ``commbench.allreduce``
takes them; the replay must be given the same ``--model`` and
``--model-kwargs``)::

    python -m commbench.profile --model mypkg.nets:gpt --model-kwargs layers=4 \
        --input-shape 512 --vocab 32000 --batch-size 8 --device cuda -o gpt.json
    mpirun -np 8 python -m commbench.allreduce --model mypkg.nets:gpt \
        --model-kwargs layers=4 --compute-profile gpt.json

The profile holds the forward time, the optimizer time and, for every
parameter (by name, with its shape), the time from the start of backward
until autograd had accumulated its gradient, as the median over ``--iters``
iterations after ``--warmup``. A profile recorded on a GPU (``--device
cuda``) has the same format: there each gradient's ready time comes from a
CUDA event recorded on the stream when its hook runs (the time the device
finished accumulating it, without stalling the pipeline), and the profile
also holds the peak device memory of a step (``peak_cuda_mb``).

It also holds when each unit's forward began and ended (``forward_units``, from
forward hooks on the root and on each unit, ``commbench.models.units``: a ResNet
bottleneck, a transformer block), so the replay runs forward unit by unit and
whatever hooks a unit's forward (a sharded strategy's parameter gather) fires there.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import statistics
import sys
from dataclasses import dataclass

import torch

from commbench import __version__, flags
from commbench.flags import ConfigError, flag, nonneg_int, positive_int
from commbench.jobtime import Seconds, Where, real_pass_s
from commbench.models.registry import parameter_shapes
from commbench.models.units import ROOT, unit_names
from commbench.profilefile import lacks
from commbench.results import write_atomic
from commbench.timing import NullTimer, now
from commbench.workloads.compute_profile import PROFILE_SCHEMA
from commbench.workloads.real import RealWorkload
from commbench.workloads.spec import WorkloadSpec, check_model


class UnitTimes:
    """When each unit's forward began and ended (``commbench.models.units``), from a forward
    pre-hook and a forward hook on the root and on each unit.

    Times are seconds after the step's forward began (``begin``): this host's clock in
    host memory; on a GPU, CUDA events the hooks record on the stream, read against one
    recorded at ``begin`` once the device has settled (as the gradients' ready times). The
    profile holds the medians over the recorded forwards; medians keep the order of times
    that every forward kept, so the units still lie one after another inside the root.
    Units are profiled as the replay runs them, each once per forward in one order: where
    a forward ran a unit twice (a block called again) or the order changed, ``result`` is
    None and ``why`` says what happened.
    """

    def __init__(self, net: torch.nn.Module, cuda: bool) -> None:
        self.cuda = cuda
        self.why: str | None = None
        self._marks: list[tuple[str, object]] = []  # (unit, clock or event): start, then end
        self._start: object = 0.0
        self._forwards: list[dict[str, list[float]]] = []
        self._handles = []
        for name in [ROOT, *unit_names(net)]:
            module = net.get_submodule(name)
            self._handles += [module.register_forward_pre_hook(self._mark(name)),
                              module.register_forward_hook(self._mark(name))]

    def _mark(self, name: str):
        def hook(*_) -> None:
            if self.cuda:
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                self._marks.append((name, ev))
            else:
                self._marks.append((name, now()))
        return hook

    def begin(self, t: float) -> None:
        """A forward begins at ``t`` (this host's clock)."""
        self._marks = []
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = t

    def end(self, keep: bool) -> None:
        """The forward ended and the device settled; ``keep`` it for the profile."""
        if not keep or self.why is not None:
            return
        seen: dict[str, list[float]] = {}  # in the order the units began
        for name, mark in self._marks:
            s = self._start.elapsed_time(mark) / 1e3 if self.cuda else mark - self._start
            seen.setdefault(name, []).append(s)
        twice = [n for n, v in seen.items() if len(v) != 2]
        if twice:
            self.why = (f"unit {twice[0] or 'root'!r} ran {len(seen[twice[0]]) // 2} times in "
                        "one forward; the replay runs each unit once")
        elif self._forwards and list(seen) != list(self._forwards[0]):
            self.why = "the units ran in another order in another forward"
        else:
            self._forwards.append(seen)

    def result(self) -> list[dict] | None:
        """``forward_units`` of the profile: the root unit first, then the units in the
        order they ran; None where they cannot be replayed (``why``). Removes the hooks."""
        for h in self._handles:
            h.remove()
        if self.why is not None or not self._forwards:
            return None
        return [{"name": name,
                 "start_s": statistics.median(f[name][0] for f in self._forwards),
                 "end_s": statistics.median(f[name][1] for f in self._forwards)}
                for name in self._forwards[0]]


def record(model: str, batch_size: int, image_size: int, num_classes: int = 1000,
           iters: int = 5, warmup: int = 2, device: str = "cpu", seed: int = 0,
           model_kwargs: dict | None = None, input_shape: tuple[int, ...] | None = None,
           vocab: int | None = None) -> dict:
    """Profile forward, backward (per-gradient ready times) and optimizer of ``model``."""
    wl = RealWorkload(model, rank=0, seed=seed, batch_size=batch_size,
                        num_classes=num_classes, image_size=image_size, device=device,
                        model_kwargs=model_kwargs, input_shape=input_shape, vocab=vocab)
    cuda = wl.device.type == "cuda"
    forward, optimizer, ready = [], [], {i: [] for i in range(len(wl.params))}
    order: list[int] = []
    timer = NullTimer()
    if cuda:
        torch.cuda.reset_peak_memory_stats(wl.device)
    # One process, no collective: the device is synchronised around each phase so that
    # the host's clock times it (the workload's own phases are events on the stream).
    settle = (lambda: torch.cuda.synchronize(wl.device)) if cuda else (lambda: None)
    units = UnitTimes(wl.net, cuda)
    for it in range(warmup + iters):
        keep = it >= warmup
        t = now()
        units.begin(t)
        wl.forward(timer)
        settle()
        f = now() - t
        units.end(keep)
        t0 = now()
        events: dict[int, torch.cuda.Event] = {}
        if cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()

        def on_ready(i: int, t0: float = t0, keep: bool = keep, events=events) -> None:
            if cuda:  # marks the stream: done once the device has accumulated gradient i
                events[i] = torch.cuda.Event(enable_timing=True)
                events[i].record()
            elif keep:
                ready[i].append(now() - t0)

        wl.backward(timer, on_ready)
        settle()
        if cuda and keep:
            for i, ev in events.items():
                ready[i].append(start.elapsed_time(ev) / 1e3)
        t = now()
        wl.optimizer_step(timer)
        settle()
        o = now() - t
        if keep:
            forward.append(f)
            optimizer.append(o)
            order = wl.backward_order
    names = wl.param_names
    forward_units = units.result()
    return {
        "schema": PROFILE_SCHEMA,
        "kind": "compute_profile",
        "model": model,
        "model_kwargs": dict(model_kwargs or {}),
        "num_classes": num_classes,
        "batch_size": batch_size,
        "image_size": wl.image_size,  # None for a model of token ids
        "input_shape": list(wl.input_shape),
        "vocab": vocab,
        "loss_rule": wl.loss_rule,
        # left out of the gradients (workloads.base): the replay leaves them out too
        "unused": wl.unused,
        "frozen": wl.frozen,
        "device": str(wl.device) if wl.device.type != "cuda"
        else torch.cuda.get_device_name(wl.device),
        "torch_threads": torch.get_num_threads(),
        "iters": iters,
        "forward_s": statistics.median(forward),
        "optimizer_s": statistics.median(optimizer),
        "backward_s": max(statistics.median(v) for v in ready.values()),
        "backward_order": [names[i] for i in order],
        **({"forward_units": forward_units} if forward_units is not None
           else {"forward_units_missing": units.why}),
        **({"peak_cuda_mb": torch.cuda.max_memory_allocated(wl.device) / 2**20} if cuda else {}),
        "grads": [{"name": names[i], "shape": list(wl.params[i].shape),
                   "ready_s": statistics.median(ready[i])} for i in range(len(names))],
        "versions": {"commbench": __version__, "torch": torch.__version__,
                     "python": platform.python_version()},
    }


@dataclass
class ProfileConfig(WorkloadSpec):
    """What to profile: the workload's model and inputs (its flags, with a profile's
    defaults: ResNet-18 at 64 px on the CPU), how long, and the file."""

    workload: str = "real"  # a profile times real passes
    model: str = flags.same_flag(WorkloadSpec, "model", "resnet18")
    batch_size: int = flags.same_flag(WorkloadSpec, "batch_size", 32)
    image_size: int = flags.same_flag(WorkloadSpec, "image_size", 64)
    device: str = flags.same_flag(WorkloadSpec, "device", "cpu")
    iters: int = flag("--iters", default=5, type=positive_int,
                      help="profiled iterations (the profile holds their medians)")
    warmup: int = flag("--warmup", default=2, type=nonneg_int,
                       help="iterations before them, not profiled")
    threads: int = flag("--threads", default=0, type=nonneg_int,
                        help="torch threads (0 = torch's default); match the ranks you replay "
                             "for")
    output: str | None = flag("-o", "--output", default=None, help="profile file (JSON)")

    def emulated_s(self, where: Where) -> Seconds:
        """How long the profile takes (``commbench.jobtime``): real passes, host work."""
        params = sum(math.prod(s) for _, s in parameter_shapes(
            self.model, self.num_classes or 1000, self.model_kwargs))
        return Seconds(0.0, where.startup_s() + (self.iters + self.warmup)
                       * real_pass_s(params, self.batch_size, self.image_size) * where.share)

    def probe(self) -> ProfileConfig:
        """The profile shortened for a dilation probe: one iteration after one."""
        return dataclasses.replace(self, iters=1, warmup=1)


def build_parser() -> flags.Parser:
    p = flags.Parser(prog="python -m commbench.profile", description=__doc__.splitlines()[0],
               formatter_class=flags.help_formatter)
    flags.add_fields(p, ProfileConfig, ["model", "model_kwargs", "input_shape", "vocab",
                                  "batch_size", "image_size", "num_classes"])
    flags.add_fields(p, ProfileConfig, ["device"], device={
        "choices": None, "help": "where to profile: cpu, cuda or cuda:N"})
    flags.add_fields(p, ProfileConfig, ["iters", "warmup", "threads", "output"])
    return p


def parse_config(argv: list[str] | None = None) -> ProfileConfig:
    """Parse and check ``argv``; raise ConfigError naming the flag on bad input."""
    cfg = ProfileConfig(**flags.values_for(ProfileConfig, build_parser().parse_args(argv)))
    if not cfg.output:
        raise ConfigError("-o/--output: give the profile file to write")
    check_model(cfg)
    return cfg


def main(argv: list[str] | None = None) -> int:
    try:
        a = parse_config(argv)
    except ConfigError as e:
        print(f"commbench.profile: error: {e}", file=sys.stderr)
        return 2
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    try:
        prof = record(a.model, a.batch_size, a.image_size, a.num_classes, a.iters, a.warmup,
                      a.device, model_kwargs=a.model_kwargs, input_shape=a.input_shape,
                      vocab=a.vocab)
    except ValueError as e:
        print(f"commbench.profile: error: {e}", file=sys.stderr)
        return 2
    write_atomic(a.output, json.dumps(prof, indent=1))
    shape = "x".join(map(str, prof["input_shape"]))
    print(f"{a.model} batch {a.batch_size} x {shape} on {prof['device']}: forward "
          f"{prof['forward_s'] * 1e3:.1f} ms, backward {prof['backward_s'] * 1e3:.1f} ms, "
          f"optimizer {prof['optimizer_s'] * 1e3:.1f} ms"
          + (f", peak {prof['peak_cuda_mb']:.0f} MiB" if "peak_cuda_mb" in prof else "")
          + (f", forward in {len(prof['forward_units']) - 1} units and the root"
             if "forward_units" in prof else "")
          + f" -> {a.output}")
    for note in lacks(prof):
        print(f"commbench.profile: note: {note}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
