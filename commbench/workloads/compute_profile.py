"""The compute profile file: what ``commbench.profile`` records and the synthetic workload
replays (``--compute-profile``), and the check that it fits the model it is used with.

A profile is one JSON object (``kind: compute_profile``, ``schema``): the
forward and optimizer times, for every parameter (by name, with its shape) the
time from the start of backward until its gradient was ready, and (since
``forward_units``) when each unit's forward began and ended.
``commbench.profilefile`` reads it (standard library only); this module adds the
check against a model, which needs torch.
"""

from __future__ import annotations

import json
from pathlib import Path

from commbench.models.registry import parameter_shapes
from commbench.models.units import model_units
from commbench.profilefile import PROFILE_SCHEMA, ProfileError, read

__all__ = ["PROFILE_SCHEMA", "ProfileError", "load"]


def load(path: str | Path, model: str, num_classes: int, model_kwargs: dict | None = None
         ) -> dict:
    """Read a profile (``commbench.profilefile.read``) and check it describes ``model``
    built with ``model_kwargs`` (same parameters, same shapes, less those its backward
    never reached; its units among the model's, ``commbench.models.units``); the whole
    JSON object."""
    try:
        prof = read(path)
    except ProfileError as e:
        raise ProfileError(f"--compute-profile: {e}") from None
    shapes = parameter_shapes(model, num_classes, model_kwargs)
    unused = set(prof.unused)
    names = {n for n, _ in shapes}
    want = [(n, tuple(s)) for n, s in shapes if n not in unused]
    have = [(g.name, g.shape) for g in prof.grads]

    def what(name: object, kw: dict | None) -> str:
        return f"{name} {json.dumps(kw)}" if kw else str(name)

    if have != want or not unused <= names:
        raise ProfileError(f"--compute-profile: {path} was recorded for "
                           f"{what(prof.model, prof.raw.get('model_kwargs'))} with "
                           f"{prof.num_classes} classes, not {what(model, model_kwargs)} "
                           f"with {num_classes}: its parameters differ (give --model and "
                           "--model-kwargs as recorded)")
    if prof.units is not None:
        units, _ = model_units(model, num_classes, model_kwargs)
        strange = [u.name for u in prof.units[1:] if u.name not in units]
        if strange:
            raise ProfileError(f"--compute-profile: {path} times units that "
                               f"{what(model, model_kwargs)} does not have: "
                               f"{', '.join(strange[:3])}{' ...' if len(strange) > 3 else ''} "
                               f"(its units: {', '.join(units[:3]) or 'the root unit only'}"
                               f"{' ...' if len(units) > 3 else ''}; commbench.models.units)")
    return prof.raw
