"""Every model by ``--model`` name, and what is built from a name (shapes, input kind).

A new model is one definition module plus one line in ``MODELS``; a user's
own model is ``package.module:factory`` (``commbench.models.factory``).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from commbench.models.factory import ModelError, call_factory, is_factory
from commbench.models.gpt import gpt2_small, gpt_tiny
from commbench.models.inception import inception_v3
from commbench.models.resnet import resnet18, resnet34, resnet50, resnet101, resnet152
from commbench.models.small import smallcnn
from commbench.models.vgg import vgg16

MODELS: dict[str, Callable[..., nn.Module]] = {
    "resnet18": resnet18,
    "resnet34": resnet34,
    "resnet50": resnet50,
    "resnet101": resnet101,
    "resnet152": resnet152,
    "vgg16": vgg16,  # 138 M parameters, 89 % of them in the fully connected layers
    "inception_v3": inception_v3,  # 27.2 M with the auxiliary head (torchvision's default)
    "smallcnn": smallcnn,  # digits convergence studies on CPU
    "gpt2-small": gpt2_small,  # 124 M parameters, tied embedding (replay)
    "gpt-tiny": gpt_tiny,  # trains for real on a CPU
}


def build_model(name: str, num_classes: int = 1000, device: str | torch.device = "cpu",
                kwargs: dict | None = None) -> nn.Module:
    """Build model ``name`` on ``device`` (``"meta"`` allocates no weights).

    ``name`` is a registered model (called with ``num_classes`` and ``kwargs``; a
    language model's output width is its vocabulary, whatever ``num_classes`` says) or
    a factory, ``package.module:callable`` (called with ``kwargs`` only:
    ``commbench.models.factory``).
    """
    if is_factory(name):
        return call_factory(name, dict(kwargs or {}), device)
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}, or give "
                         "package.module:factory")
    try:
        with torch.device(device):
            return MODELS[name](num_classes=num_classes, **(kwargs or {}))
    except TypeError as e:
        raise ModelError(f"--model-kwargs: {name} does not take {kwargs}: {e}") from None


def parameter_shapes(name: str, num_classes: int = 1000,
                     kwargs: dict | None = None) -> list[tuple[str, tuple[int, ...]]]:
    """Return ``(name, shape)`` of every parameter that takes a gradient, in registration
    order (a tied parameter once, under its first name; frozen ones left out).

    Built on the meta device, so no weights are allocated: this is how the
    synthetic workload gets a real model's gradient shapes from the same
    definitions the real workload trains.
    """
    model = build_model(name, num_classes, device="meta", kwargs=kwargs)
    return [(n, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad]


def input_kind(net: nn.Module) -> str:
    """What ``net`` takes: ``"tokens"`` (ids (N, T); it declares ``vocab``, ``context`` and
    ``loss(output, target)``, as ``models.gpt``) or ``"image"`` (N, 3, H, W), the default
    for a model that declares nothing."""
    return getattr(net, "input_kind", "image")
