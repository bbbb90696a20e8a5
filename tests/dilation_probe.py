"""A stand-in program for ``--dilation auto``'s probe in tests: rank 0 writes two measured
steps and a summary whose verdict is host-bound below the dilation ``--needs`` (read from
COMMBENCH_DILATION, as every commbench rank reads it), and link-bound from there on; its
step time moves with K below ``--needs`` (``needs / K`` seconds) and is 1 s from there on,
so the outcome rule (K against 2K) agrees from ``--needs`` on too.

    python -m tests.dilation_probe --needs 4 --output FILE

``ProbeConfig`` is its configuration as a tool's (flags declared with ``commbench.flags``),
so an ``experiments.job.Job`` can carry it: the runner runs ``python -m
tests.dilation_probe`` with ``to_argv`` of it, and its probe is itself.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass

from commbench import dilation
from commbench.flags import add_fields, flag, values_for
from commbench.hostload import HOST_BOUND, LINK_BOUND
from commbench.jobtime import Seconds, Where


@dataclass(frozen=True)
class ProbeConfig:
    """The stand-in's configuration: the K from which it is link-bound."""

    needs: float = flag("--needs", default=1.0, type=float,
                        help="the smallest dilation K at which the run is link-bound")
    output: str | None = flag("--output", default=None, help="JSON Lines results file")

    def emulated_s(self, where: Where) -> Seconds:
        return Seconds(1.0)

    def probe(self) -> ProbeConfig:
        return self


def main() -> None:
    p = argparse.ArgumentParser()
    add_fields(p, ProbeConfig)
    a, _ = p.parse_known_args()
    cfg = ProbeConfig(**values_for(ProbeConfig, a))
    if cfg.output is None:
        p.error("--output is required")
    if int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")) != 0:
        return
    k = dilation.from_env()
    bound = LINK_BOUND if k >= cfg.needs else f"{HOST_BOUND} (needs {cfg.needs:g})"
    step_s = max(1.0, cfg.needs / k)
    with open(cfg.output, "a") as f:  # two measured steps (the outcome rule's samples)
        for step in range(2):
            f.write(json.dumps({"kind": "step", "step": step, "warmup": False,
                                "dilation": k, "step_s": step_s}) + "\n")
        f.write(json.dumps({"kind": "summary", "dilation": k, "bound": bound,
                            "step_s": step_s}) + "\n")


if __name__ == "__main__":
    main()
