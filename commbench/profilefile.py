"""The compute profile file, read: the one reader of the format ``commbench.profile``
writes (``profiles/*.json``), for the synthetic workload's replay
(``commbench.workloads.compute_profile``, which also checks the profile against the
model it is used with), for ``analysis/`` and for the launchers.

A profile is one JSON object, ``kind: compute_profile``, ``schema`` 1: what it was
recorded on (``model``, ``num_classes``, ``batch_size``, ``image_size``, ``device``),
the phase times of one training step (``forward_s``, ``backward_s``, ``optimizer_s``),
and for every parameter that backward reaches, in parameter order, its name, its shape
and the time from the start of backward until its gradient was ready (``grads``);
``backward_order`` names those parameters in the order backward produced them and
``unused`` (optional) the parameters backward never reaches. Other fields (``tokens``,
``peak_cuda_mb``, ``versions``, ...) are kept in ``raw``.

Standard library only: ``analysis/`` and ``launch/`` read profiles where torch is absent.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

PROFILE_SCHEMA = 1
KIND = "compute_profile"


class ProfileError(ValueError):
    """A profile that cannot be read, is not a compute profile, or has another schema
    (or, from ``commbench.workloads.compute_profile.load``, does not match its model);
    the message names the file."""


@dataclass(frozen=True)
class Grad:
    """One parameter's gradient: its name, its shape and when it was ready (seconds after
    backward started)."""

    name: str
    shape: tuple[int, ...]
    ready_s: float

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ComputeProfile:
    """One compute profile file, read and checked for form (not against a model)."""

    path: str
    model: str
    num_classes: int | None
    batch_size: int | None
    image_size: int | None
    device: str | None
    forward_s: float
    backward_s: float
    optimizer_s: float
    grads: tuple[Grad, ...]  #: in parameter order
    backward_order: tuple[str, ...]
    unused: tuple[str, ...]
    raw: dict  #: the whole JSON object, for fields not named here

    @property
    def params(self) -> int:
        """Elements over all gradients (the parameters backward reaches)."""
        return sum(g.numel for g in self.grads)

    @property
    def step_s(self) -> float:
        """Forward, backward and optimizer: one step's compute."""
        return self.forward_s + self.backward_s + self.optimizer_s


def read(path: str | Path) -> ComputeProfile:
    """Read the compute profile at ``path``; ProfileError naming the file where it cannot
    be read, is not a compute profile (of this form) or has a schema other than
    ``PROFILE_SCHEMA``."""
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ProfileError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ProfileError(f"cannot read {path}: not JSON ({e})") from None
    if not isinstance(d, dict) or d.get("kind") != KIND:
        raise ProfileError(f"{path} is not a compute profile (no kind: {KIND})")
    if d.get("schema") != PROFILE_SCHEMA:
        raise ProfileError(f"{path} has schema {d.get('schema')}, "
                           f"this commbench reads {PROFILE_SCHEMA}")

    def bad(what: str) -> ProfileError:
        return ProfileError(f"{path} is not a compute profile: {what}")

    def seconds(value: object, what: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value < 0:
            raise bad(f"{what} is {value!r}, not a time in seconds")
        return float(value)

    def optional(key: str, kind: type) -> object:
        value = d.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
            raise bad(f"{key} is {value!r}")
        return value

    def names(key: str, default: list | None = None) -> tuple[str, ...]:
        value = d.get(key, default)
        if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
            raise bad(f"{key} is not a list of parameter names")
        return tuple(value)

    model = d.get("model")
    if not isinstance(model, str) or not model:
        raise bad("no model")
    times = {}
    for key in ("forward_s", "backward_s", "optimizer_s"):
        if key not in d:
            raise bad(f"no {key}")
        times[key] = seconds(d[key], key)
    if not isinstance(d.get("grads"), list):
        raise bad("no grads")
    grads = []
    for i, g in enumerate(d["grads"]):
        if not isinstance(g, dict) or not isinstance(g.get("name"), str):
            raise bad(f"grads[{i}] has no name")
        shape = g.get("shape")
        if not isinstance(shape, list) or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
            raise bad(f"{g['name']}: shape {shape!r}")
        if "ready_s" not in g:
            raise bad(f"{g['name']}: no ready_s")
        grads.append(Grad(g["name"], tuple(shape), seconds(g["ready_s"], f"{g['name']}: ready_s")))
    order = names("backward_order")
    if sorted(order) != sorted(g.name for g in grads) or len(set(order)) != len(order):
        raise ProfileError(f"{path} has a broken backward_order (not its grads' names, "
                           "each once)")
    return ComputeProfile(
        path=str(path), model=model, num_classes=optional("num_classes", int),
        batch_size=optional("batch_size", int), image_size=optional("image_size", int),
        device=optional("device", str), forward_s=times["forward_s"],
        backward_s=times["backward_s"], optimizer_s=times["optimizer_s"], grads=tuple(grads),
        backward_order=order, unused=names("unused", []), raw=d)
