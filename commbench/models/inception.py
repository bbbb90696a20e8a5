"""Inception V3 with torchvision's exact parameter layout, auxiliary classifier included.

Szegedy et al. 2015, "Rethinking the Inception Architecture for Computer
Vision" (https://arxiv.org/abs/1512.00567), figures 5-7 and table 1, as
``torchvision.models.inception_v3`` builds it: a five-convolution stem,
three 35x35 modules (``Mixed_5b``-``5d``), a grid reduction (``Mixed_6a``),
four 17x17 modules with factorised 7x7 convolutions (``Mixed_6b``-``6e``),
the auxiliary classifier on ``Mixed_6e``'s output, a second reduction
(``Mixed_7a``), two 8x8 modules (``Mixed_7b``, ``7c``) and the classifier.
Every convolution is torchvision's ``BasicConv2d``: convolution without
bias, BatchNorm (eps 0.001), ReLU. Module names, registration order (the
auxiliary head between ``Mixed_6e`` and ``Mixed_7a``) and shapes follow
torchvision's, so the gradients have the shapes a real run produces.

**Does the auxiliary head count?** By default yes, as torchvision's default
``aux_logits=True``: 27,161,264 parameters in 292 tensors at 1000 classes,
of which the head (``AuxLogits.*``, 8 tensors) holds 3,326,696. With
``aux_logits=False`` (``--model-kwargs aux_logits=false``) it is 23,834,568
in 284 tensors, what a run that trains without the auxiliary loss
synchronises. Which one applies:

- the replayed workload without a compute profile synchronises what
  ``parameter_shapes`` lists, every parameter that takes a gradient: all
  27,161,264 with the default;
- the real workload learns which parameters backward reaches from one pass in
  eval mode (``commbench.workloads.real``), where Inception V3 runs no
  auxiliary head (torchvision's behaviour, kept here), and a loss is taken of
  the main logits only (the first tensor of the output), so backward never
  reaches the head: it names the head's 8 tensors unused and synchronises
  23,834,568, as does a replay of a profile that recorded them unused. Build
  it with ``aux_logits=False`` wherever two runs are compared.

``forward`` returns the logits; in training mode with the auxiliary head it
returns ``InceptionOutputs(logits, aux_logits)`` as torchvision does (a
loss over both is the user's, e.g. torchvision's recipe ``loss + 0.4 *
aux_loss``). The input is 3 x 299 x 299 (torchvision's size; no
``transform_input``, which only rescales pretrained inputs). The main path
runs from 75 px (the 8x8 stage is then 1x1); the auxiliary head needs the
17x17 map, so a training-mode pass with it needs 299 px.

Example::

    >>> sum(p.numel() for p in inception_v3().parameters())
    27161264
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


class InceptionOutputs(NamedTuple):
    logits: torch.Tensor
    aux_logits: torch.Tensor | None


class BasicConv2d(nn.Module):
    """Convolution (no bias), BatchNorm with eps 0.001, ReLU."""

    def __init__(self, in_channels: int, out_channels: int, **kwargs) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, bias=False, **kwargs)
        self.bn = nn.BatchNorm2d(out_channels, eps=0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)), inplace=True)


def _pool_3x3(x: torch.Tensor) -> torch.Tensor:
    """The pooling branch's 3x3 average pool, stride 1, padding 1 (size kept)."""
    return F.avg_pool2d(x, kernel_size=3, stride=1, padding=1)


class InceptionA(nn.Module):
    """35x35 module (figure 5): 1x1, 5x5, double 3x3 and pool branches; 224 + pool_features
    channels out."""

    def __init__(self, in_channels: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(in_channels, 64, kernel_size=1)
        self.branch5x5_1 = BasicConv2d(in_channels, 48, kernel_size=1)
        self.branch5x5_2 = BasicConv2d(48, 64, kernel_size=5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(in_channels, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, padding=1)
        self.branch_pool = BasicConv2d(in_channels, pool_features, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b5 = self.branch5x5_2(self.branch5x5_1(x))
        b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        bp = self.branch_pool(_pool_3x3(x))
        return torch.cat([b1, b5, b3, bp], 1)


class InceptionB(nn.Module):
    """Grid reduction 35 -> 17: strided 3x3, strided double 3x3 and max-pool branches."""

    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.branch3x3 = BasicConv2d(in_channels, 384, kernel_size=3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(in_channels, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3(x)
        bd = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        bp = F.max_pool2d(x, kernel_size=3, stride=2)
        return torch.cat([b3, bd, bp], 1)


class InceptionC(nn.Module):
    """17x17 module (figure 6): 7x7 convolutions factorised into 1x7 and 7x1, 768 out."""

    def __init__(self, in_channels: int, channels_7x7: int) -> None:
        super().__init__()
        c7 = channels_7x7
        self.branch1x1 = BasicConv2d(in_channels, 192, kernel_size=1)
        self.branch7x7_1 = BasicConv2d(in_channels, c7, kernel_size=1)
        self.branch7x7_2 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv2d(c7, 192, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv2d(in_channels, c7, kernel_size=1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = BasicConv2d(c7, 192, kernel_size=(1, 7), padding=(0, 3))
        self.branch_pool = BasicConv2d(in_channels, 192, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        bd = x
        for conv in (self.branch7x7dbl_1, self.branch7x7dbl_2, self.branch7x7dbl_3,
                     self.branch7x7dbl_4, self.branch7x7dbl_5):
            bd = conv(bd)
        bp = self.branch_pool(_pool_3x3(x))
        return torch.cat([b1, b7, bd, bp], 1)


class InceptionD(nn.Module):
    """Grid reduction 17 -> 8: strided 3x3, 1x7-7x1-strided 3x3 and max-pool branches."""

    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.branch3x3_1 = BasicConv2d(in_channels, 192, kernel_size=1)
        self.branch3x3_2 = BasicConv2d(192, 320, kernel_size=3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(in_channels, 192, kernel_size=1)
        self.branch7x7x3_2 = BasicConv2d(192, 192, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(192, 192, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(192, 192, kernel_size=3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3_2(self.branch3x3_1(x))
        b7 = x
        for conv in (self.branch7x7x3_1, self.branch7x7x3_2, self.branch7x7x3_3,
                     self.branch7x7x3_4):
            b7 = conv(b7)
        bp = F.max_pool2d(x, kernel_size=3, stride=2)
        return torch.cat([b3, b7, bp], 1)


class InceptionE(nn.Module):
    """8x8 module (figure 7): 3x3 convolutions split into parallel 1x3 and 3x1; 2048 out."""

    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(in_channels, 320, kernel_size=1)
        self.branch3x3_1 = BasicConv2d(in_channels, 384, kernel_size=1)
        self.branch3x3_2a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(in_channels, 448, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, kernel_size=3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(in_channels, 192, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b3 = self.branch3x3_1(x)
        b3 = torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], 1)
        bd = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        bd = torch.cat([self.branch3x3dbl_3a(bd), self.branch3x3dbl_3b(bd)], 1)
        bp = self.branch_pool(_pool_3x3(x))
        return torch.cat([b1, b3, bd, bp], 1)


class InceptionAux(nn.Module):
    """The auxiliary classifier on the 17x17 map: 5x5 average pool (stride 3), 1x1 to 128,
    5x5 to 768, global pool, linear."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.conv0 = BasicConv2d(in_channels, 128, kernel_size=1)
        self.conv1 = BasicConv2d(128, 768, kernel_size=5)
        self.conv1.stddev = 0.01  # torchvision's initialisation reads these
        self.fc = nn.Linear(768, num_classes)
        self.fc.stddev = 0.001

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(self.conv0(F.avg_pool2d(x, kernel_size=5, stride=3)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1))


class Inception3(nn.Module):
    def __init__(self, num_classes: int = 1000, aux_logits: bool = True,
                 dropout: float = 0.5) -> None:
        super().__init__()
        self.aux_logits = aux_logits
        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, kernel_size=3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, kernel_size=3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, kernel_size=3, padding=1)
        self.maxpool1 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, kernel_size=1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, kernel_size=3)
        self.maxpool2 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.Mixed_5b = InceptionA(192, pool_features=32)
        self.Mixed_5c = InceptionA(256, pool_features=64)
        self.Mixed_5d = InceptionA(288, pool_features=64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b = InceptionC(768, channels_7x7=128)
        self.Mixed_6c = InceptionC(768, channels_7x7=160)
        self.Mixed_6d = InceptionC(768, channels_7x7=160)
        self.Mixed_6e = InceptionC(768, channels_7x7=192)
        # registered here, between 6e and 7a, as torchvision does: parameter order follows
        self.AuxLogits = InceptionAux(768, num_classes) if aux_logits else None
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b = InceptionE(1280)
        self.Mixed_7c = InceptionE(2048)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(p=dropout)
        self.fc = nn.Linear(2048, num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                std = float(getattr(m, "stddev", 0.1))
                nn.init.trunc_normal_(m.weight, mean=0.0, std=std, a=-2, b=2)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor | InceptionOutputs:
        for layer in (self.Conv2d_1a_3x3, self.Conv2d_2a_3x3, self.Conv2d_2b_3x3,
                      self.maxpool1, self.Conv2d_3b_1x1, self.Conv2d_4a_3x3, self.maxpool2,
                      self.Mixed_5b, self.Mixed_5c, self.Mixed_5d, self.Mixed_6a,
                      self.Mixed_6b, self.Mixed_6c, self.Mixed_6d, self.Mixed_6e):
            x = layer(x)
        aux = self.AuxLogits(x) if self.AuxLogits is not None and self.training else None
        x = self.Mixed_7c(self.Mixed_7b(self.Mixed_7a(x)))
        x = self.dropout(torch.flatten(self.avgpool(x), 1))
        logits = self.fc(x)
        return InceptionOutputs(logits, aux) if aux is not None else logits


def inception_v3(num_classes: int = 1000, aux_logits: bool = True) -> Inception3:
    return Inception3(num_classes, aux_logits)
