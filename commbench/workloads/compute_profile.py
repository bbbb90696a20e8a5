"""The compute profile file: what ``commbench.profile`` records and the synthetic workload
replays (``--compute-profile``), and the check that it fits the model it is used with.

A profile is one JSON object (``kind: compute_profile``, ``schema``): the
forward and optimizer times, and for every parameter (by name, with its
shape) the time from the start of backward until its gradient was ready.
"""

from __future__ import annotations

import json
from pathlib import Path

from commbench.models.registry import parameter_shapes

PROFILE_SCHEMA = 1


class ProfileError(ValueError):
    """An unreadable profile, or one that does not match the model it is used with."""


def load(path: str | Path, model: str, num_classes: int, model_kwargs: dict | None = None
         ) -> dict:
    """Read a profile and check it describes ``model`` built with ``model_kwargs`` (same
    parameters, same shapes, less those its backward never reached)."""
    try:
        prof = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ProfileError(f"--compute-profile: cannot read {path}: {e}") from None
    if not isinstance(prof, dict) or prof.get("kind") != "compute_profile":
        raise ProfileError(f"--compute-profile: {path} is not a compute profile")
    if prof.get("schema") != PROFILE_SCHEMA:
        raise ProfileError(f"--compute-profile: {path} has schema {prof.get('schema')}, "
                           f"this commbench reads {PROFILE_SCHEMA}")
    shapes = parameter_shapes(model, num_classes, model_kwargs)
    unused = prof.get("unused", [])
    names = {n for n, _ in shapes}
    want = [(n, list(s)) for n, s in shapes if n not in set(unused)]
    have = [(g.get("name"), g.get("shape")) for g in prof.get("grads", [])]
    if have != want or not set(unused) <= names:
        def what(name: object, kw: dict | None) -> str:
            return f"{name} {json.dumps(kw)}" if kw else str(name)

        raise ProfileError(f"--compute-profile: {path} was recorded for "
                           f"{what(prof.get('model'), prof.get('model_kwargs'))} with "
                           f"{prof.get('num_classes')} classes, not {what(model, model_kwargs)} "
                           f"with {num_classes}: its parameters differ (give --model and "
                           "--model-kwargs as recorded)")
    names = [n for n, _ in want]
    if sorted(prof.get("backward_order", [])) != sorted(names):
        raise ProfileError(f"--compute-profile: {path} has a broken backward_order")
    return prof
