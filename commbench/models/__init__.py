"""Model definitions matched to torchvision's (and GPT-2's), so gradients have real shapes;
every model by name in ``commbench.models.registry``."""

from commbench.models.registry import MODELS, build_model, input_kind, parameter_shapes
from commbench.models.resnet import ResNet, resnet18, resnet34, resnet50, resnet101, resnet152

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
