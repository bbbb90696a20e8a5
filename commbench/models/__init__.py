"""Model definitions matched to torchvision's (and GPT-2's), so gradients have real shapes."""

from commbench.models.resnet import (
    MODELS,
    ResNet,
    build_model,
    input_kind,
    parameter_shapes,
    resnet18,
    resnet34,
    resnet50,
    resnet101,
    resnet152,
)

__all__ = [
    "MODELS",
    "ResNet",
    "build_model",
    "input_kind",
    "parameter_shapes",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
]
