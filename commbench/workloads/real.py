"""Real workload: forward and backward passes of a model on each rank's own batch.

Every rank builds the model (a registered one, ``--num-classes`` wide, or
``--model package.module:factory``) from the same seed (identical weights),
draws its own synthetic batch (``--batch-size`` images of ``--image-size``
pixels, or samples of ``--input-shape``, token ids with ``--vocab``), and
each step runs forward, the loss of ``workloads.objective`` (cross-entropy
for a classifier's ``(N, C)`` output), backward and an SGD update. With
``--dataset digits`` the batches are real labelled images instead
(``commbench.workloads.data``): each rank walks its own shard of the
training split, and ``evaluate`` gives held-out accuracy. Gradients are
announced as ``workloads.base`` describes; time spent inside the announcing
hooks is taken out of the backward phase.

A model that takes token ids (``models.input_kind``: ``gpt-tiny``,
``gpt2-small``) and is given no ``--input-shape`` is fed sequences of its full
context: each row counts up from a random token (modulo the vocabulary), the
target is the next token, and the loss is the model's own
(``loss(output, target)``), so it has something to learn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from commbench.models import build_model, input_kind
from commbench.models.factory import is_factory
from commbench.timing import now
from commbench.workloads.base import Workload
from commbench.workloads.data import digits
from commbench.workloads.objective import (
    first_tensor,
    loss_of,
    loss_rule,
    make_inputs,
    make_target,
    probe_backward,
)

MIN_IMAGE_SIZE = 32  # five stride-2 stages: 32 px leaves a 1x1 map for the last stage


class RealWorkload(Workload):
    name = "real"
    real = True

    def __init__(self, model: str, rank: int, seed: int = 0, batch_size: int = 32,
                 num_classes: int = 1000, image_size: int = 64, lr: float = 0.01,
                 momentum: float = 0.9, device: str = "cpu", dataset: str = "synthetic",
                 world_size: int = 1,
                 model_kwargs: dict | None = None, input_shape: Sequence[int] | None = None,
                 vocab: int | None = None) -> None:
        self.device = torch.device(device)
        torch.manual_seed(seed)  # the same initial weights on every rank
        net = build_model(model, num_classes, device=self.device, kwargs=model_kwargs)
        #: a registered language model fed its own sequences (no --input-shape given)
        self.tokens = input_shape is None and input_kind(net) == "tokens"
        if self.tokens and dataset != "synthetic":
            raise ValueError(f"--dataset {dataset} holds images; {model} takes token ids")
        if not self.tokens and input_shape is None and not is_factory(model) \
                and (image_size is None or image_size < MIN_IMAGE_SIZE):
            raise ValueError(f"--image-size must be >= {MIN_IMAGE_SIZE} for a ResNet, "
                             f"got {image_size}")
        self.image_size = None if self.tokens else image_size
        if self.tokens:
            self.input_shape: tuple[int, ...] = (net.context,)
        else:
            self.input_shape = tuple(input_shape) if input_shape else \
                (3, image_size, image_size)
        self.dataset = dataset
        self.test = None
        self.batch_size = batch_size  # the digits shard's first batch below reads it
        gen = torch.Generator().manual_seed(seed * 1_000_003 + rank + 1)
        if self.tokens:
            start = torch.randint(0, net.vocab, (batch_size, 1), generator=gen)
            ids = (start + torch.arange(net.context + 1)) % net.vocab
            self.inputs, self.labels = ids[:, :-1].to(self.device), ids[:, 1:].to(self.device)
        elif dataset == "synthetic":
            self.inputs = make_inputs(batch_size, self.input_shape, vocab, gen, self.device)
        else:
            tx, ty, vx, vy = digits(image_size, seed)
            self._train = (tx[rank::world_size], ty[rank::world_size])  # this rank's shard
            self.test = (vx.to(self.device), vy.to(self.device))
            self._cursor = 0
            self._next_batch()
        self._module = net  # whose own loss() applies, also once a peer has wrapped ``net``
        probe = self._learn_backward_order(net, gen)
        super().__init__(model, net, torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum),
                         batch_size, unused=probe.unused)
        index = {n: i for i, n in enumerate(self.param_names)}
        self._seen_order = [index[n] for n in probe.order]

    def _learn_backward_order(self, net: torch.nn.Module, gen: torch.Generator):
        """One untimed backward pass, so ``backward_order`` is the real one from the start.

        Strategies build their buckets from it before the first step; reverse
        registration order differs from autograd's real order (ResNet-50: 122
        of 161 positions). It also finds the parameters backward never reaches
        (``workloads.objective``), and the output's shape, which fixes the labels
        (``objective.make_target``). Eval mode leaves BatchNorm's running
        statistics alone; the gradients are dropped again and no optimizer step is
        taken.
        """
        net.eval()
        out = first_tensor(net(self.inputs))
        self.loss_rule = loss_rule(net, out)
        if self.test is None and not self.tokens:  # sequences bring their targets
            self.labels = make_target(out, gen)
        probe = probe_backward(net, self._loss(out), tuple(out.shape))
        for p in net.parameters():
            p.grad = None
        net.train()
        return probe

    def _loss(self, out: torch.Tensor) -> torch.Tensor:
        return loss_of(self._module, self.loss_rule, out, self.labels)

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

    def forward(self, timer, poll: Callable[[], None] | None = None,
                accumulate: bool = False) -> None:
        """Forward pass; ``accumulate`` keeps the gradients of earlier micro-batches."""
        if self.test is not None and self.loss is not None:
            self._next_batch()  # outside the timed phase: data loading is not measured
        if self.events is not None:  # on a device: events on the compute stream
            start = self.events.mark()
            self._forward(accumulate)
            timer.device_compute("forward", start, self.events.mark())
            return
        self.stalled_s = 0.0
        t = now()
        self._forward(accumulate)
        timer.add_compute(now() - t - self.stalled_s, "forward")  # a gather's wait is sync

    def _forward(self, accumulate: bool) -> None:
        if not accumulate:
            for g in self.grads:
                if g.untyped_storage().nbytes():  # zero3 frees them: it makes them zeroed
                    g.zero_()
        self.loss = self._loss(first_tensor(self.net(self.inputs)))

    def backward(self, timer, on_ready: Callable[[int], None],
                 poll: Callable[[], None] | None = None, accumulate: bool = False) -> None:
        """Backward pass; in host memory the announcing hooks' time is taken out (the
        strategy's), on a device backward is its span on the compute stream."""
        self.stalled_s = 0.0
        t, end = self._run_backward(on_ready, poll)
        if self.events is not None:
            timer.device_compute("backward", t, end)
        else:
            timer.add_compute(end - t - self._hook_s - self.stalled_s, "backward")

    def optimizer_step(self, timer) -> None:
        if self.events is not None:
            start = self.events.mark()
            self.opt.step()
            timer.device_compute("optimizer", start, self.events.mark())
            return
        with timer.compute("optimizer"):
            self.opt.step()
