"""GPT-2-shaped decoder-only transformers, built from ``torch.nn`` layers.

``gpt2-small`` has GPT-2 small's shape (Radford et al. 2019, "Language Models
are Unsupervised Multitask Learners"): 12 layers, d = 768, 12 heads, a
50257-token vocabulary, a 1024-token context and the output projection tied
to the token embedding: 124,439,808 parameters in 148 tensors, the count
Hugging Face's ``gpt2`` reports. Module names follow nanoGPT's ``model.py``
(``transformer.h.0.attn.c_attn.weight``); its linear layers are ``nn.Linear``,
so a weight is the transpose of GPT-2's ``Conv1D`` one (same size).

The tied output layer (``lm_head.weight`` is ``transformer.wte.weight``) is one
parameter: ``named_parameters()`` lists it once, as ``transformer.wte.weight``,
and autograd sums both uses into one gradient before its accumulator's hook
runs, so every strategy synchronises it once, in the real workload and in the
replay (``parameter_shapes``) alike.

``gpt-tiny`` (2 layers, d = 64, 4 heads, 256 tokens, context 64; 120,576
parameters) trains for real on a CPU in seconds.

What a workload needs to feed one is declared on the model: ``input_kind =
"tokens"`` (inputs are token ids of shape (N, T), T <= ``context``), ``vocab``,
``context``, and ``loss(output, target)``, cross-entropy over the flattened
(N * T, vocab) logits.

Example::

    >>> sum(p.numel() for p in gpt2_small().parameters())
    124439808
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        if d % heads:
            raise ValueError(f"model width {d} is not a multiple of {heads} heads")
        self.heads = heads
        self.c_attn = nn.Linear(d, 3 * d)  # query, key and value in one matrix, as GPT-2
        self.c_proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        q, k, v = (y.view(n, t, self.heads, d // self.heads).transpose(1, 2)
                   for y in self.c_attn(x).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(n, t, d))


class MLP(nn.Sequential):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's GELU
        self.c_proj = nn.Linear(4 * d, d)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final LayerNorm and the tied
    output projection; ``forward`` maps token ids (N, T) to logits (N, T, vocab)."""

    input_kind = "tokens"

    def __init__(self, layers: int, d: int, heads: int, vocab: int, context: int) -> None:
        super().__init__()
        self.vocab, self.context = vocab, context
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(vocab, d),
            "wpe": nn.Embedding(context, d),
            "h": nn.ModuleList(Block(d, heads) for _ in range(layers)),
            "ln_f": nn.LayerNorm(d),
        })
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied: one parameter, one gradient
        for name, p in self.named_parameters():  # GPT-2's initialisation
            if name.endswith("c_proj.weight"):  # residual projections scaled by depth
                nn.init.normal_(p, 0.0, 0.02 / (2 * layers) ** 0.5)
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.context:
            raise ValueError(f"sequence of {t} tokens is longer than the context {self.context}")
        tr = self.transformer
        x = tr.wte(idx) + tr.wpe(torch.arange(t, device=idx.device))
        for block in tr.h:
            x = block(x)
        return self.lm_head(tr.ln_f(x))

    @staticmethod
    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of logits (N, T, vocab) against token ids (N, T)."""
        return F.cross_entropy(output.flatten(0, 1), target.flatten())


# A language model's output width is its vocabulary: ``num_classes`` (the registry's one
# argument, ``build_model``) does not apply and is ignored.

def gpt2_small(num_classes: int | None = None) -> GPT:
    return GPT(layers=12, d=768, heads=12, vocab=50257, context=1024)


def gpt_tiny(num_classes: int | None = None) -> GPT:
    return GPT(layers=2, d=64, heads=4, vocab=256, context=64)
