"""Model factories for ``tests/test_byom.py``: ``--model tests.models_for_tests:NAME``.

The launched ranks run from the repository root (``tests.conftest.launch``),
where ``python -m`` puts the current directory on ``sys.path``, so this module
imports there as ``tests.models_for_tests``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Quirky(nn.Module):
    """A token model with what real models have: a tied embedding and output layer, a
    frozen layer that is used, and a layer that forward never calls."""

    def __init__(self, vocab: int = 32, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.frozen = nn.Linear(dim, dim)
        self.frozen.requires_grad_(False)
        self.mix = nn.Linear(dim, dim)
        self.unused = nn.Linear(dim, dim)  # never called: backward never reaches it
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied: one parameter, one gradient

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.mix(self.frozen(self.embed(tokens))))
        return self.head(h)  # (N, T, vocab)


def quirky(vocab: int = 32, dim: int = 16) -> Quirky:
    return Quirky(vocab, dim)


def mlp(depth: int = 2, width: int = 32, classes: int = 10, inputs: int = 3 * 8 * 8
        ) -> nn.Sequential:
    """A plain classifier of flattened inputs: (N, classes) logits."""
    layers: list[nn.Module] = [nn.Flatten()]
    n = inputs
    for _ in range(depth):
        layers += [nn.Linear(n, width), nn.ReLU()]
        n = width
    return nn.Sequential(*layers, nn.Linear(n, classes))


class WithLoss(nn.Module):
    """A module with its own ``loss(output, target)``: half the mean absolute output."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return 0.5 * F.l1_loss(output, torch.zeros_like(output)) + 0 * target.sum()


def with_loss() -> WithLoss:
    return WithLoss()


def needs_depth(depth: int) -> nn.Sequential:
    """Needs an argument that has no default."""
    return mlp(depth=depth)


def not_a_module() -> int:
    return 42


NOT_CALLABLE = 3


class Reused(nn.Module):
    """Two blocks in a list, the first called again after the second (weights shared
    across depth): a unit that runs twice in one forward."""

    def __init__(self, width: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.ReLU())
                                    for _ in range(2))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in (self.blocks[0], self.blocks[1], self.blocks[0]):
            x = block(x)
        return self.head(x)


def reused(width: int = 8, classes: int = 10) -> Reused:
    return Reused(width, classes)


def split_tie(width: int = 8, classes: int = 10) -> Reused:
    """``Reused``'s blocks called once each, the second block's weight a Parameter of its
    own on the first's memory: a tie split across two units (``--strategy zero3`` refuses
    it: each unit would step its own copy)."""
    net = Reused(width, classes)
    net.blocks[1][0].weight = nn.Parameter(net.blocks[0][0].weight.data)
    net.forward = lambda x: net.head(net.blocks[1](net.blocks[0](x)))  # type: ignore[method-assign]
    return net
