"""Real workload: forward and backward passes of a ResNet on each rank's own batch.

Every rank builds the model from the same seed (identical weights), draws its
own synthetic batch (``--batch-size`` images of ``--image-size`` pixels,
``--num-classes`` labels), and each step runs forward, cross-entropy,
backward and an SGD update. With ``--dataset digits`` the batches are real
labelled images instead (``commbench.workloads.data``): each rank walks its
own shard of the training split, and ``evaluate`` gives held-out accuracy.
Gradients are announced as ``workloads.base`` describes; time spent inside
the announcing hooks is taken out of the backward phase.

A model that takes token ids (``models.input_kind``: ``gpt-tiny``,
``gpt2-small``) is fed sequences of its full context instead: each row
counts up from a random token (modulo the vocabulary), the target is the next
token, and the loss is the model's own (``loss(output, target)``), so it has
something to learn.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from commbench.models import build_model, input_kind
from commbench.workloads.base import Workload

MIN_IMAGE_SIZE = 32  # five stride-2 stages: 32 px leaves a 1x1 map for the last stage


class ResNetWorkload(Workload):
    name = "resnet"
    real = True

    def __init__(self, model: str, rank: int, seed: int = 0, batch_size: int = 32,
                 num_classes: int = 1000, image_size: int = 64, lr: float = 0.01,
                 device: str = "cpu", dataset: str = "synthetic", world_size: int = 1) -> None:
        self.device = torch.device(device)
        torch.manual_seed(seed)  # the same initial weights on every rank
        net = build_model(model, num_classes, device=self.device)
        self.tokens = input_kind(net) == "tokens"
        if self.tokens and dataset != "synthetic":
            raise ValueError(f"--dataset {dataset} holds images; {model} takes token ids")
        if not self.tokens and image_size < MIN_IMAGE_SIZE:
            raise ValueError(f"--image-size must be >= {MIN_IMAGE_SIZE} for a ResNet, "
                             f"got {image_size}")
        self.image_size = None if self.tokens else image_size
        self.criterion = net.loss if self.tokens else F.cross_entropy
        super().__init__(model, net, torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9),
                         batch_size)
        self.dataset = dataset
        self.test = None
        if self.tokens:
            gen = torch.Generator().manual_seed(seed * 1_000_003 + rank + 1)
            start = torch.randint(0, net.vocab, (batch_size, 1), generator=gen)
            ids = (start + torch.arange(net.context + 1)) % net.vocab
            self.inputs, self.labels = ids[:, :-1].to(self.device), ids[:, 1:].to(self.device)
        elif dataset == "synthetic":
            gen = torch.Generator().manual_seed(seed * 1_000_003 + rank + 1)
            self.inputs = torch.randn(batch_size, 3, image_size, image_size,
                                      generator=gen).to(self.device)
            self.labels = torch.randint(0, num_classes, (batch_size,),
                                        generator=gen).to(self.device)
        else:
            from commbench.workloads.data import digits

            tx, ty, vx, vy = digits(image_size, seed)
            self._train = (tx[rank::world_size], ty[rank::world_size])  # this rank's shard
            self.test = (vx.to(self.device), vy.to(self.device))
            self._cursor = 0
            self._next_batch()
        self._learn_backward_order()

    def _learn_backward_order(self) -> None:
        """One untimed backward pass, so ``backward_order`` is the real one from the start.

        Strategies build their buckets from it before the first step; reverse
        registration order differs from autograd's real order (ResNet-50: 122
        of 161 positions). Eval mode leaves BatchNorm's running statistics alone;
        the gradients are zeroed again and no optimizer step is taken.
        """
        self.net.eval()
        loss = self.criterion(self.net(self.inputs), self.labels)
        self._order = []
        loss.backward()
        self._seen_order = list(self._order)
        for g in self.grads:
            g.zero_()
        self.net.train()

    def _next_batch(self) -> None:
        x, y = self._train
        idx = torch.arange(self._cursor, self._cursor + self.batch_size) % len(y)
        self._cursor = int(idx[-1]) + 1
        self.inputs, self.labels = x[idx].to(self.device), y[idx].to(self.device)

    def evaluate(self) -> float | None:
        """Accuracy on the held-out split (None without a labelled data set)."""
        if self.test is None:
            return None
        self.net.eval()
        with torch.no_grad():
            x, y = self.test
            correct = sum(int((self.net(x[i:i + 256]).argmax(1) == y[i:i + 256]).sum())
                          for i in range(0, len(y), 256))
        self.net.train()
        return correct / len(y)

    def forward(self, timer, progress: Callable[[], None] | None = None,
                accumulate: bool = False) -> None:
        """Forward pass; ``accumulate`` keeps the gradients of earlier micro-batches."""
        if self.test is not None and self.loss is not None:
            self._next_batch()  # outside the timed phase: data loading is not measured
        with timer.compute("forward"):
            if not accumulate:
                for g in self.grads:
                    g.zero_()
            out = self.net(self.inputs)
            self.loss = self.criterion(out, self.labels)
            self._sync_device()

    def backward(self, timer, on_ready: Callable[[int], None],
                 progress: Callable[[], None] | None = None, accumulate: bool = False) -> None:
        t, end = self._run_backward(on_ready, progress)
        timer.add_compute(end - t - self._hook_s, "backward")

    def optimizer_step(self, timer) -> None:
        with timer.compute("optimizer"):
            self.opt.step()
            self._sync_device()
