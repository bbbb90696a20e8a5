"""A small Vision Transformer: the advisor's held-out model, used only as a factory.

It is deliberately **not** in ``MODELS`` (``commbench.models.registry``):
the validation grid of ``python -m analysis.advise``
(``experiments/advise_grid.toml``) holds out every cell of this model, so
nothing in the advisor is tuned on it, and it reaches the tools the way a
user's own model does, as ``--model package.module:factory``
(``commbench.models.factory``)::

    python -m commbench.profile --model commbench.models.heldout_vit:vit \\
        --input-shape 3,32,32 --batch-size 32 --threads 1 -o vit.json
    mpirun -np 4 python -m commbench.allreduce --workload real \\
        --model commbench.models.heldout_vit:vit --model-kwargs depth=4 \\
        --input-shape 3,32,32 --batch-size 8

The architecture is Dosovitskiy et al. 2020, "An Image is Worth 16x16
Words" (https://arxiv.org/abs/2010.11929), section 3.1, at CIFAR scale: the
image cut into ``patch_size`` squares, each projected to ``dim`` (a strided
convolution), a learnt class token prepended and learnt position embeddings
added, ``depth`` pre-norm transformer blocks (multi-head self-attention,
then an MLP of ``mlp_ratio * dim`` with GELU, each in a residual branch),
a final LayerNorm and a linear head on the class token. The defaults
(32 px, 4 px patches, so 64 patches + 1 token; d = 192, 6 blocks, 3 heads,
10 classes) give 2,693,578 parameters in 80 tensors (10.8 MB of float32
gradient, between GPT-tiny's 0.5 MB and ResNet-18's 47 MB), and its
gradients differ in kind from the grid's other models: few large matrices
of equal size per block; the position, class and patch parameters are
ready last.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    """Multi-head self-attention over all tokens (no mask): one qkv matrix, one output
    projection."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not a multiple of heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(x).view(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(n, t, d))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, mlp_ratio * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Images (N, 3, image_size, image_size) to logits (N, num_classes)."""

    def __init__(self, image_size: int = 32, patch_size: int = 4, dim: int = 192,
                 depth: int = 6, heads: int = 3, mlp_ratio: int = 4,
                 num_classes: int = 10) -> None:
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"image_size {image_size} is not a multiple of patch_size "
                             f"{patch_size}")
        self.image_size = image_size
        patches = (image_size // patch_size) ** 2
        self.patch_embed = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, patches + 1, dim))
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-2:]) != (self.image_size, self.image_size):
            raise ValueError(f"expected {self.image_size}x{self.image_size} images (the "
                             f"position embeddings' size), got {tuple(x.shape[-2:])}; pass "
                             "image_size in --model-kwargs")
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # (N, patches, dim)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def vit(image_size: int = 32, patch_size: int = 4, dim: int = 192, depth: int = 6,
        heads: int = 3, mlp_ratio: int = 4, num_classes: int = 10) -> ViT:
    """The held-out model's factory: ``--model commbench.models.heldout_vit:vit``."""
    return ViT(image_size, patch_size, dim, depth, heads, mlp_ratio, num_classes)
