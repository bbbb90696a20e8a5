"""What a real workload feeds a model, the loss it takes, and which parameters backward reaches.

Inputs: ``--input-shape`` per sample (default ``3,S,S`` images, S =
``--image-size``): standard-normal floats, or with ``--vocab N`` token ids
drawn uniformly from ``[0, N)`` (int64), ``--batch-size`` of them.

The loss fits any output (the first tensor of a tuple or list, the first
value of a dict):

1. the module's own ``loss(output, target)`` method, where it has one;
2. output ``(N, C)``: cross-entropy against labels drawn from ``[0, C)``;
3. output ``(N, T, C)`` (a token model): cross-entropy over the N·T
   flattened tokens against labels drawn from ``[0, C)``;
4. anything else: mean square of the output (to zero).

The target handed to a module's own ``loss`` is the labels of rule 2 or 3
where the output has that shape, else zeros shaped like the output.

Which parameters are synchronised (``probe_backward``): those that take a
gradient and that backward reaches. A parameter that backward never reaches
would hold a bucket back for ever (its gradient never comes); DDP needs
``find_unused_parameters=True`` for such a model and reports them. Here the
untimed first backward finds them, they are left out of synchronisation and
named in a warning and in the records (``unused_params``). A module whose
use of parameters changes from step to step is not supported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from commbench.models import build_model
from commbench.models.factory import ModelError

LOSS_RULES = ("module.loss", "cross-entropy", "token cross-entropy", "mean square")


def first_tensor(out: object) -> torch.Tensor:
    """The tensor a loss is taken of: ``out`` itself, or the first one inside it."""
    if isinstance(out, torch.Tensor):
        return out
    items = out.values() if isinstance(out, dict) else out if isinstance(out, (list, tuple)) \
        else ()
    for x in items:
        if isinstance(x, torch.Tensor):
            return x
    raise TypeError(f"the model returned a {type(out).__name__} holding no tensor")


def make_inputs(batch_size: int, input_shape: Sequence[int], vocab: int | None,
                generator: torch.Generator | None = None,
                device: str | torch.device = "cpu") -> torch.Tensor:
    """A batch of ``input_shape`` samples: normal floats, or token ids below ``vocab``."""
    shape = (batch_size, *input_shape)
    if torch.device(device).type == "meta":
        return torch.zeros(shape, dtype=torch.int64 if vocab else torch.float32, device="meta")
    x = torch.randint(0, vocab, shape, generator=generator) if vocab \
        else torch.randn(shape, generator=generator)
    return x.to(device)


def loss_rule(module: torch.nn.Module, out: torch.Tensor) -> str:
    """Which of ``LOSS_RULES`` applies to ``module``'s output ``out``."""
    if callable(getattr(module, "loss", None)):  # the documented contract: its own loss
        return "module.loss"
    if out.is_floating_point() and out.dim() == 2:
        return "cross-entropy"
    if out.is_floating_point() and out.dim() == 3:
        return "token cross-entropy"
    return "mean square"


def make_target(out: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Labels for an ``(N, C)`` or ``(N, T, C)`` output, drawn from ``[0, C)``; else zeros
    shaped like the output."""
    if out.is_floating_point() and out.dim() in (2, 3):
        shape = tuple(out.shape[:-1])
        if out.is_meta:
            return torch.zeros(shape, dtype=torch.int64, device="meta")
        return torch.randint(0, out.shape[-1], shape, generator=generator).to(out.device)
    return torch.zeros_like(out, device=out.device)


def loss_of(module: torch.nn.Module, rule: str, out: torch.Tensor,
            target: torch.Tensor) -> torch.Tensor:
    """The scalar loss of ``out`` by ``rule``."""
    if rule == "module.loss":
        return module.loss(out, target)
    if rule == "cross-entropy":
        return F.cross_entropy(out, target)
    if rule == "token cross-entropy":
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))
    return out.float().pow(2).mean()


@dataclass(frozen=True)
class BackwardProbe:
    """What one backward pass showed: the order gradients came in (names), the
    trainable parameters it never reached, and the output's shape."""

    order: list[str]
    unused: list[str]
    output_shape: tuple[int, ...]


def probe_backward(net: torch.nn.Module, loss: torch.Tensor,
                   output_shape: Sequence[int] = ()) -> BackwardProbe:
    """Run ``loss.backward()`` with a temporary hook on every parameter that takes a
    gradient; return the order they were accumulated in and those never reached."""
    named = [(n, p) for n, p in net.named_parameters() if p.requires_grad]
    order: list[str] = []
    handles = [p.register_post_accumulate_grad_hook(lambda _p, n=n: order.append(n))
               for n, p in named]
    try:
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    reached = set(order)
    return BackwardProbe(order, [n for n, _ in named if n not in reached], tuple(output_shape))


def probe_model(net: torch.nn.Module, batch_size: int, input_shape: Sequence[int],
                vocab: int | None) -> BackwardProbe:
    """Forward, loss and backward of ``net`` on a batch made here (on the device of its
    parameters: the meta device costs nothing); in eval mode, so BatchNorm's running
    statistics stay as they are."""
    device = next(net.parameters()).device
    x = make_inputs(batch_size, input_shape, vocab, device=device)
    was_training = net.training
    net.eval()
    try:
        out = first_tensor(net(x))
        loss = loss_of(net, loss_rule(net, out), out, make_target(out))
        if loss.dim() != 0:
            raise ValueError(f"the loss is not a scalar (shape {tuple(loss.shape)})")
        return probe_backward(net, loss, tuple(out.shape))
    finally:
        net.train(was_training)


def probe_spec(model: str, kwargs: dict, num_classes: int, batch_size: int,
               input_shape: Sequence[int], vocab: int | None,
               shape_given: bool = True) -> BackwardProbe:
    """Build ``model`` on the meta device and probe it (``probe_model``); where an
    operation has no meta kernel, probe a real copy on the CPU with a batch of 2.

    Raises ``ModelError`` naming ``--model`` (it cannot be built) or ``--input-shape``
    (the model rejects the inputs) and the cause; cheap, so every rank checks before
    any collective.
    """
    try:
        return probe_model(build_model(model, num_classes, "meta", kwargs), batch_size,
                           input_shape, vocab)
    except ModelError:
        raise
    except Exception:  # noqa: BLE001 - a missing meta kernel, or a real rejection: try the CPU
        pass
    torch.manual_seed(0)
    net = build_model(model, num_classes, "cpu", kwargs)
    batch = min(batch_size, 2)
    try:
        return probe_model(net, batch, input_shape, vocab)
    except Exception as e:  # noqa: BLE001 - whatever the user's module raised
        shape = ",".join(map(str, input_shape))
        what = f"token ids below --vocab {vocab}" if vocab else "float inputs"
        why = str(e).strip().splitlines()[0] if str(e).strip() else ""
        default = "" if shape_given else " (the default, 3 x --image-size; give --input-shape)"
        raise ModelError(f"--input-shape {shape}{default}: {model} rejects a batch of shape "
                         f"{(batch, *input_shape)} ({what}): {type(e).__name__}: {why}"
                         ) from None
