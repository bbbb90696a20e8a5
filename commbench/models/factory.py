"""Bring your own model: ``--model package.module:factory`` beside the registry's names.

A factory is any callable that returns a ``torch.nn.Module``; it is called
with the keyword arguments of ``--model-kwargs`` (a JSON object,
``'{"depth": 4}'``, or ``depth=4,width=256`` whose values are read as JSON
where they parse, else kept as text). It is called inside a
``torch.device`` context, so the replayed workload builds it on the meta
device (no weights allocated) and the real one on its device. The module
must be importable on every rank: run from the directory that holds the
package, or put it on ``PYTHONPATH``.

Which parameters are synchronised: those that take a gradient
(``requires_grad``; frozen ones are not), each once however often it is
used (tied weights are one parameter, as ``named_parameters`` lists them),
and only those backward reaches (``commbench.workloads.objective``).

Example::

    mpirun -np 4 python -m commbench.allreduce --workload real \\
        --model mypkg.nets:transformer --model-kwargs '{"layers": 4}' \\
        --input-shape 512 --vocab 32000
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable

import torch

#: ``package.module:callable`` (dotted names on both sides)
_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class ModelError(ValueError):
    """A model that cannot be built as asked; the message names the flag and the cause."""


def is_factory(name: str) -> bool:
    """Whether ``--model name`` names a factory (``package.module:callable``)."""
    return ":" in name


def check_ref(name: str) -> str:
    """``name`` if it looks like ``package.module:callable``, else ModelError."""
    if not _REF.match(name):
        raise ModelError(f"--model {name}: expected a registered name or "
                         "package.module:factory (e.g. mypkg.nets:build)")
    return name


def load_factory(name: str) -> Callable[..., object]:
    """Import ``package.module`` and return its ``callable`` (ModelError naming why not)."""
    module_name, _, attr = check_ref(name).partition(":")
    try:
        obj: object = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's module's
        raise ModelError(f"--model {name}: cannot import {module_name}: "
                         f"{type(e).__name__}: {e} (is it on PYTHONPATH on every rank?)"
                         ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ModelError(f"--model {name}: {module_name} has no {attr}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ModelError(f"--model {name}: {attr} is a {type(obj).__name__}, not a callable "
                         "that returns a torch.nn.Module")
    return obj


def call_factory(name: str, kwargs: dict, device: str | torch.device) -> torch.nn.Module:
    """Build ``name``'s module on ``device`` with ``kwargs``; ModelError naming the cause."""
    factory = load_factory(name)
    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    try:
        with torch.device(device):
            net = factory(**kwargs)
    except TypeError as e:  # most often: an argument it needs was not given, or an extra one
        raise ModelError(f"--model {name}: calling it with ({shown}) failed: {e}; pass its "
                         "arguments with --model-kwargs") from None
    except Exception as e:  # noqa: BLE001 - whatever the user's factory raised
        raise ModelError(f"--model {name}: the factory raised {type(e).__name__}: {e}"
                         ) from None
    if not isinstance(net, torch.nn.Module):
        raise ModelError(f"--model {name}: the factory returned a {type(net).__name__}, not "
                         "a torch.nn.Module")
    if not any(p.requires_grad for p in net.parameters()):
        raise ModelError(f"--model {name}: the module has no parameter that takes a gradient "
                         "(all frozen, or none): nothing to synchronise")
    return net


def parse_kwargs(text: str) -> dict:
    """``--model-kwargs``: a JSON object, or ``k=v,k=v`` (each value JSON where it parses,
    else the text itself); ValueError naming the problem."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            out = json.loads(text)
        except ValueError as e:
            raise ValueError(f"not a JSON object: {e}") from None
        if not isinstance(out, dict):
            raise ValueError("expected a JSON object")
        return out
    out = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ValueError(f"expected KEY=VALUE[,KEY=VALUE] or a JSON object, got {item!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value.strip()
    return out
