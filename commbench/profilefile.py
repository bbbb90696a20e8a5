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

``forward_units`` (optional: profiles recorded before it have none) times forward unit
by unit (``commbench.models.units``): one object per unit whose forward ran, in the
order they began, the root unit (``name`` ``""``, the model itself) first, each with
``start_s`` and ``end_s``, seconds after the step's forward began (its forward pre- and
post-hook); the units lie one after another inside the root's span, and the root's own
work (stem, head) is what lies between them. A profile whose writer could not time its
units says why in ``forward_units_missing``. What a readable profile lacks, each in a
sentence for its readers to show: ``lacks``.

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
class Unit:
    """One unit's forward (``commbench.models.units``): its module path (``""``: the root
    unit) and when its forward began and ended, seconds after the step's forward began."""

    name: str
    start_s: float
    end_s: float

    @property
    def forward_s(self) -> float:
        return self.end_s - self.start_s


def lacks(raw: dict) -> list[str]:
    """What the profile ``raw`` (a read profile's JSON object) lacks, one sentence each;
    empty where it has everything this commbench reads."""
    if raw.get("forward_units") is not None:
        return []
    why = raw.get("forward_units_missing") or \
        "recorded before commbench.profile timed units; record the profile again to have them"
    return [f"no per-unit forward times (forward_units: {why}): forward is one span, so its "
            "replay fires no unit's forward hooks"]


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
    #: each unit's forward, the root unit first; None where the profile has none
    units: tuple[Unit, ...] | None = None

    @property
    def params(self) -> int:
        """Elements over all gradients (the parameters backward reaches)."""
        return sum(g.numel for g in self.grads)

    @property
    def step_s(self) -> float:
        """Forward, backward and optimizer: one step's compute."""
        return self.forward_s + self.backward_s + self.optimizer_s

    @property
    def lacks(self) -> list[str]:
        """What this profile lacks (``lacks``), one sentence each."""
        return lacks(self.raw)


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
    optional("forward_units_missing", str)
    order = names("backward_order")
    if sorted(order) != sorted(g.name for g in grads) or len(set(order)) != len(order):
        raise ProfileError(f"{path} has a broken backward_order (not its grads' names, "
                           "each once)")
    return ComputeProfile(
        path=str(path), model=model, num_classes=optional("num_classes", int),
        batch_size=optional("batch_size", int), image_size=optional("image_size", int),
        device=optional("device", str), forward_s=times["forward_s"],
        backward_s=times["backward_s"], optimizer_s=times["optimizer_s"], grads=tuple(grads),
        backward_order=order, unused=names("unused", []), raw=d,
        units=None if d.get("forward_units") is None
        else _units(d["forward_units"], bad, seconds))


def _units(value: object, bad, seconds) -> tuple[Unit, ...]:
    """``forward_units``, checked: the root unit first, each unit once, the others one
    after another inside the root's span."""
    if not isinstance(value, list) or not value:
        raise bad("forward_units is not a list of units")
    units = []
    for i, u in enumerate(value):
        if not isinstance(u, dict) or not isinstance(u.get("name"), str):
            raise bad(f"forward_units[{i}] has no name")
        what = f"unit {u['name']!r}"
        for key in ("start_s", "end_s"):
            if key not in u:
                raise bad(f"{what}: no {key}")
        unit = Unit(u["name"], seconds(u["start_s"], f"{what}: start_s"),
                    seconds(u["end_s"], f"{what}: end_s"))
        if unit.end_s < unit.start_s:
            raise bad(f"{what} ends before it starts")
        units.append(unit)
    root, *rest = units
    if root.name != "":
        raise bad("forward_units does not start with the root unit (name \"\")")
    names = [u.name for u in rest]
    if "" in names or len(set(names)) != len(names):
        raise bad("forward_units names a unit twice")
    before, ended = "the root unit", root.start_s
    for u in rest:
        if u.start_s < ended:
            raise bad(f"unit {u.name!r} starts before {before} (units run one after another "
                      "inside the root unit's span)")
        before, ended = f"unit {u.name!r} ends", u.end_s
    if ended > root.end_s:
        raise bad(f"{before} after the root unit (units run inside its span)")
    return tuple(units)
