"""Model definitions matched to torchvision's, so gradients have real shapes."""

from commbench.models.resnet import (
    MODELS,
    ResNet,
    build_model,
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
    "parameter_shapes",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
]
