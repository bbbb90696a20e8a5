"""The compute profile file: what ``commbench.profile`` records and the synthetic workload
replays (``--compute-profile``), and the check that it fits the model it is used with.

A profile is one JSON object (``kind: compute_profile``, ``schema``): the
forward and optimizer times, and for every parameter (by name, with its
shape) the time from the start of backward until its gradient was ready.
``commbench.profilefile`` reads it (standard library only); this module adds the
check against a model, which needs torch.
"""

from __future__ import annotations

import json
from pathlib import Path

from commbench.models.registry import parameter_shapes
from commbench.profilefile import PROFILE_SCHEMA, ProfileError, read

__all__ = ["PROFILE_SCHEMA", "ProfileError", "load"]


def load(path: str | Path, model: str, num_classes: int, model_kwargs: dict | None = None
         ) -> dict:
    """Read a profile (``commbench.profilefile.read``) and check it describes ``model``
    built with ``model_kwargs`` (same parameters, same shapes, less those its backward
    never reached); the whole JSON object."""
    try:
        prof = read(path)
    except ProfileError as e:
        raise ProfileError(f"--compute-profile: {e}") from None
    shapes = parameter_shapes(model, num_classes, model_kwargs)
    unused = set(prof.unused)
    names = {n for n, _ in shapes}
    want = [(n, tuple(s)) for n, s in shapes if n not in unused]
    have = [(g.name, g.shape) for g in prof.grads]
    if have != want or not unused <= names:
        def what(name: object, kw: dict | None) -> str:
            return f"{name} {json.dumps(kw)}" if kw else str(name)

        raise ProfileError(f"--compute-profile: {path} was recorded for "
                           f"{what(prof.model, prof.raw.get('model_kwargs'))} with "
                           f"{prof.num_classes} classes, not {what(model, model_kwargs)} "
                           f"with {num_classes}: its parameters differ (give --model and "
                           "--model-kwargs as recorded)")
    return prof.raw
