"""Tool: a compute profile from a model's FLOPs and a stated step time, with no device.

    python -m commbench.models.flops --model resnet50 --batch-size 256 --compute-ms 120 -o r50.json

Where no device is at hand to record a profile (``commbench.profile``), the step's
compute time is spread over the model's layers by their forward FLOPs, counted on the
meta device (``torch.utils.flop_counter.FlopCounterMode``: shapes only, no weights, no
device). Not by parameter size: VGG-16's fully connected layers hold 89 % of its
parameters but under 1 % of its multiply-adds, so a spread by size would put most of
backward on them.

Assumptions, stated in the profile (``spread``):

1. backward takes twice forward, layer by layer (one product for the input's gradient, one
   for the weight's: Kaplan et al. 2020, "Scaling Laws for Neural Language Models", 6N
   FLOPs per token against forward's 2N), so forward is a third of the compute and
   backward two thirds;
2. backward runs forward's layers in reverse, so a parameter's gradient is ready once
   backward has passed the first forward use of its parameter (a tied parameter: its
   earliest use), at ``(F - F_before) / F`` of backward, ``F_before`` the forward FLOPs
   counted before that use began and ``F`` the whole forward's;
3. the optimizer's time is not counted (0 s): give it inside ``--compute-ms`` if it matters.

The file is a ``commbench.profile`` file (``commbench.profilefile`` reads it), so
everything that takes a profile takes it (``analysis.advise --model`` runs this tool:
``analysis/`` itself never imports torch).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from commbench import flags
from commbench.flags import ConfigError, flag
from commbench.models.factory import ModelError
from commbench.models.registry import build_model, input_kind
from commbench.profilefile import KIND, PROFILE_SCHEMA
from commbench.results import write_atomic
from commbench.workloads.objective import first_tensor, make_inputs
from commbench.workloads.spec import WorkloadSpec

#: backward / forward, per layer (assumption 1 above)
BACKWARD_OVER_FORWARD = 2.0
SPREAD = ("forward FLOPs on the meta device; backward = 2 x forward per layer; optimizer "
          "not counted")


def sample_shape(net: torch.nn.Module, image_size: int) -> tuple[tuple[int, ...], int | None]:
    """One input sample's shape and vocabulary: a token model's context (its declared
    ``context`` and ``vocab``), else a 3-channel image of ``image_size`` pixels a side."""
    if input_kind(net) == "tokens":
        return (net.context,), net.vocab
    return (3, image_size, image_size), None


def first_use_flops(net: torch.nn.Module, batch_size: int, image_size: int
                    ) -> tuple[dict[str, float], float]:
    """({parameter name: forward FLOPs counted before its first use}, the forward's FLOPs)
    of one forward pass of ``net`` (on the meta device) at ``batch_size``; the parameters
    forward never uses are absent."""
    names = {id(p): n for n, p in net.named_parameters() if p.requires_grad}
    before: dict[str, float] = {}
    counter = FlopCounterMode(display=False)

    def on_call(module: torch.nn.Module, _inputs: object) -> None:
        for p in module.parameters(recurse=False):
            if id(p) in names:
                before.setdefault(names[id(p)], float(counter.get_total_flops()))

    hooks = [m.register_forward_pre_hook(on_call) for m in net.modules()]
    shape, vocab = sample_shape(net, image_size)
    x = make_inputs(batch_size, shape, vocab, device="meta")
    net.eval()
    try:
        with torch.no_grad(), counter:
            first_tensor(net(x))
    finally:
        for h in hooks:
            h.remove()
    return before, float(counter.get_total_flops())


def flop_profile(model: str, batch_size: int, compute_s: float, image_size: int = 224,
                 num_classes: int = 1000, model_kwargs: dict | None = None) -> dict:
    """A compute profile (``commbench.profile``'s format) of ``model`` at ``batch_size``
    whose forward and backward take ``compute_s``, spread by FLOPs (the module docstring's
    assumptions); ModelError where the model cannot be built or counts no FLOPs."""
    net = build_model(model, num_classes, device="meta", kwargs=model_kwargs)
    before, total = first_use_flops(net, batch_size, image_size)
    if not total > 0:
        raise ModelError(f"--model {model}: its forward counts no FLOPs on the meta device")
    forward_s = compute_s / (1 + BACKWARD_OVER_FORWARD)
    backward_s = compute_s - forward_s
    params = [(n, p) for n, p in net.named_parameters() if p.requires_grad]
    ready = {n: (total - before[n]) / total * backward_s for n, _ in params if n in before}
    # ties (a layer's weight and bias) in reverse registration order, as autograd goes
    index = {n: i for i, (n, _) in enumerate(params)}
    order = sorted(ready, key=lambda n: (ready[n], -index[n]))
    shape, vocab = sample_shape(net, image_size)
    return {
        "schema": PROFILE_SCHEMA, "kind": KIND, "model": model,
        "model_kwargs": dict(model_kwargs or {}), "num_classes": num_classes,
        "batch_size": batch_size, "image_size": None if vocab else image_size,
        "input_shape": list(shape), "vocab": vocab, "device": "FLOPs on the meta device",
        "spread": SPREAD, "forward_flops": total,
        "forward_s": forward_s, "backward_s": backward_s, "optimizer_s": 0.0,
        "backward_order": order,
        "forward_units_missing": "spread by FLOPs, no unit's forward is timed",
        "unused": [n for n, _ in params if n not in before],
        "grads": [{"name": n, "shape": list(p.shape), "ready_s": ready[n]}
                  for n, p in params if n in ready],
    }


@dataclass
class FlopsConfig:
    """What to count: the workload's model flags (with a device's defaults: ResNet-50 at
    224 px, batch 32), the step's compute time, and the file."""

    model: str = flags.same_flag(WorkloadSpec, "model", "resnet50")
    model_kwargs: dict = flags.same_flag(WorkloadSpec, "model_kwargs")
    batch_size: int = flags.same_flag(WorkloadSpec, "batch_size", 32)
    image_size: int = flags.same_flag(WorkloadSpec, "image_size", 224)
    num_classes: int = flags.same_flag(WorkloadSpec, "num_classes")
    #: the synthetic workload's --compute-ms, spread the same way (1/3 forward, 2/3 backward)
    compute_ms: float = flags.same_flag(WorkloadSpec, "compute_ms")
    output: str | None = flag("-o", "--output", default=None, help="profile file (JSON)")


def build_parser() -> flags.Parser:
    p = flags.tool_parser("python -m commbench.models.flops", __doc__.splitlines()[0], [
        "python -m commbench.models.flops --model resnet50 --batch-size 256 --compute-ms 120 "
        "-o r50.json"])
    flags.add_fields(p, FlopsConfig)
    return p


def parse_config(argv: list[str] | None = None) -> FlopsConfig:
    """Parse and check ``argv``; ConfigError naming the flag on bad input."""
    cfg = FlopsConfig(**flags.values_for(FlopsConfig, build_parser().parse_args(argv)))
    if not cfg.output:
        raise ConfigError("-o/--output: give the profile file to write")
    if not cfg.compute_ms > 0:
        raise ConfigError(f"--compute-ms {cfg.compute_ms:g}: must be above 0 (the step's "
                          "compute on your device)")
    return cfg


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = parse_config(argv)
        prof = flop_profile(cfg.model, cfg.batch_size, cfg.compute_ms / 1e3, cfg.image_size,
                            cfg.num_classes, cfg.model_kwargs)
    except (ConfigError, ValueError, RuntimeError, NotImplementedError) as e:
        # ModelError is a ValueError; a model without meta kernels raises the others
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"commbench.models.flops: error: {why}", file=sys.stderr)
        return 2
    write_atomic(cfg.output, json.dumps(prof, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
