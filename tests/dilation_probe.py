"""A stand-in program for ``--dilation auto``'s probe in tests: rank 0 writes one summary
whose verdict is host-bound below the dilation ``--needs`` (read from COMMBENCH_DILATION,
as every commbench rank reads it), and link-bound from there on.

    python -m tests.dilation_probe --needs 4 --output FILE
"""

from __future__ import annotations

import argparse
import json
import os

from commbench import dilation
from commbench.hostload import HOST_BOUND, LINK_BOUND


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--needs", type=float, required=True)
    p.add_argument("--output", required=True)
    a, _ = p.parse_known_args()
    if int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")) != 0:
        return
    k = dilation.from_env()
    bound = LINK_BOUND if k >= a.needs else f"{HOST_BOUND} (needs {a.needs:g})"
    with open(a.output, "a") as f:
        f.write(json.dumps({"kind": "summary", "dilation": k, "bound": bound}) + "\n")


if __name__ == "__main__":
    main()
