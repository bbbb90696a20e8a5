"""VGG-16 (configuration D, no batch norm) with torchvision's exact parameter layout.

Simonyan and Zisserman 2014, "Very Deep Convolutional Networks for Large-Scale
Image Recognition" (https://arxiv.org/abs/1409.1556), table 1, column D:
thirteen 3x3 convolutions with biases in five stages of 64, 128, 256, 512 and
512 channels, each stage ended by 2x2 max-pooling, then three fully connected
layers (4096, 4096, classes). Module names, parameter order and shapes follow
``torchvision.models.vgg16`` (``features.0.weight`` ... ``classifier.6.bias``,
32 tensors, 138,357,544 parameters at 1000 classes), so the gradients have the
shapes a real run of torchvision's model produces.

Why it is here: it is the model whose gradient is almost all in its fully
connected layers (123.6 M of its 138.4 M parameters; 102.8 M in
``classifier.0`` alone) while almost all of its compute is in the
convolutions, so spreading compute over the layers by parameter size puts
most of backward in the wrong place; Horovod's published 512-GPU scaling
result (68 % against 90 % for ResNet-101 and Inception V3) is for this model
(``analysis/published/horovod_512.toml``).

Like torchvision's, the classifier sits behind an adaptive 7x7 average
pool, so any input of at least 32 px runs (five 2x2 pools leave 1x1 at 32 px,
which the pool repeats to 7x7); at 224 px the pool is the identity.

Example::

    >>> sum(p.numel() for p in vgg16().parameters())
    138357544
"""

from __future__ import annotations

import torch
from torch import nn

#: configuration D: output channels of each 3x3 convolution, "M" a 2x2 max-pool
VGG16_LAYERS: tuple[int | str, ...] = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M",
                                       512, 512, 512, "M", 512, 512, 512, "M")


def make_features(layers: tuple[int | str, ...]) -> nn.Sequential:
    """torchvision's ``make_layers`` without batch norm: conv, ReLU, ..., max-pool.

    The ReLUs and pools hold no parameters but keep their indices, so the
    convolutions are ``features.0, 2, 5, 7, 10, ...`` as in torchvision.
    """
    modules: list[nn.Module] = []
    channels = 3
    for v in layers:
        if v == "M":
            modules.append(nn.MaxPool2d(kernel_size=2, stride=2))
        else:
            modules += [nn.Conv2d(channels, int(v), kernel_size=3, padding=1),
                        nn.ReLU(inplace=True)]
            channels = int(v)
    return nn.Sequential(*modules)


class VGG(nn.Module):
    def __init__(self, features: nn.Sequential, num_classes: int = 1000,
                 dropout: float = 0.5) -> None:
        super().__init__()
        self.features = features
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(inplace=True), nn.Dropout(p=dropout),
            nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(p=dropout),
            nn.Linear(4096, num_classes),
        )
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.constant_(m.bias, 0)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.constant_(m.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def vgg16(num_classes: int = 1000) -> VGG:
    return VGG(make_features(VGG16_LAYERS), num_classes)
