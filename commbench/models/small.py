"""A small CNN for the convergence studies on CPU (scikit-learn's digits).

ResNet-18 takes seconds per step on two shared cores; the staleness study
(``commbench.staleness``) needs hundreds of steps for every staleness, so it
trains this instead: two 3x3 convolutions (16 and 32 channels, ReLU, 2x2
max-pooling after each), the map pooled to 8x8 (the identity at 32 px, the
digits' study size) and one linear layer; 25.6k parameters in 6 tensors. It
takes the same 3-channel inputs as the ResNets, of any size. Without global
pooling it learns digits in tens of steps (~80% held-out after 25 steps of
32 images, lr 0.05), where the global-pooling variant sat at chance for 150.

Example::

    >>> sum(p.numel() for p in smallcnn(10).parameters())
    25578
"""

from __future__ import annotations

from torch import nn


class SmallCNN(nn.Sequential):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(8), nn.Flatten(), nn.Linear(32 * 8 * 8, num_classes))


def smallcnn(num_classes: int = 10) -> SmallCNN:
    return SmallCNN(num_classes)
