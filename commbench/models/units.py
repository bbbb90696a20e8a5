"""A model's units: the top-level blocks a sharded strategy gathers one at a time.

A unit is a top-level block (a ResNet bottleneck, a transformer block), found from
the module tree alone, with no list of block classes to keep: a module held in an
``nn.Sequential`` or ``nn.ModuleList`` (the lists a model keeps its repeated blocks
in) that has sub-modules of its own, and is inside no other unit. Everything else
(the stem, the embeddings, the head) is the **root unit**. Units are named by their
module path as ``named_modules`` names them (``layer1.0``, ``transformer.h.3``); the
root unit's path is ``""``.

What that gives for the registered models: ResNet-18 8 units and ResNet-50 16 (its
bottlenecks: ``layer1.0`` to ``layer4.2``), ``gpt-tiny`` 2 and ``gpt2-small`` 12
(``transformer.h.N``), the held-out ViT its ``blocks.N``; VGG-16 and ``smallcnn``,
whose lists hold single layers, and Inception v3, which keeps its modules as
attributes, have the root unit only. This is where PyTorch FSDP users wrap
(``fully_shard`` on each block, then on the root; ``ModuleWrapPolicy`` of the block
class).

A parameter belongs to the unit whose path prefixes its name; a parameter tied
across units (or between a unit and the rest) belongs to the root unit, whose forward
spans every unit's.
"""

from __future__ import annotations

from collections.abc import Collection

from torch import nn

from commbench.models.registry import build_model

#: the containers a model keeps its repeated blocks in
BLOCK_LISTS = (nn.Sequential, nn.ModuleList)
ROOT = ""  #: the root unit's module path


def unit_names(net: nn.Module) -> list[str]:
    """The module paths of ``net``'s units (the root unit not among them), in registration
    order; a module reachable by two paths under its first."""
    found: list[str] = []
    seen: set[int] = set()

    def visit(module: nn.Module, prefix: str) -> None:
        listed = isinstance(module, BLOCK_LISTS)
        for name, child in module.named_children():
            if id(child) in seen:
                continue
            seen.add(id(child))
            path = prefix + name
            if listed and next(child.children(), None) is not None:
                found.append(path)
            else:
                visit(child, path + ".")

    visit(net, "")
    return found


def unit_of(name: str, units: Collection[str]) -> str:
    """The unit whose path prefixes parameter ``name`` (units do not nest); ROOT if none."""
    head = name
    while "." in head:
        head = head.rsplit(".", 1)[0]
        if head in units:
            return head
    return ROOT


def parameter_units(net: nn.Module, units: list[str] | None = None) -> dict[str, str]:
    """Each parameter of ``net`` (by the name ``named_parameters`` gives it) -> its unit:
    the unit its path lies in, ROOT where it lies in none or is tied across units."""
    units_set = set(unit_names(net) if units is None else units)
    homes: dict[int, set[str]] = {}
    for name, p in net.named_parameters(remove_duplicate=False):
        homes.setdefault(id(p), set()).add(unit_of(name, units_set))
    out = {}
    for name, p in net.named_parameters():
        home = homes[id(p)]
        out[name] = next(iter(home)) if len(home) == 1 else ROOT
    return out


def model_units(model: str, num_classes: int = 1000, kwargs: dict | None = None
                ) -> tuple[list[str], dict[str, str]]:
    """``model``'s units and each parameter's unit, from the model built on the meta device
    (no weights allocated), as ``registry.parameter_shapes`` builds it."""
    net = build_model(model, num_classes, device="meta", kwargs=kwargs)
    units = unit_names(net)
    return units, parameter_units(net, units)
