"""``python -m experiments NAME [ARGS]``: run the experiment ``NAME`` (``EXPERIMENTS``)."""

from __future__ import annotations

import importlib
import sys

from experiments import EXPERIMENTS


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m experiments NAME [ARGS]\nexperiments: "
              + ", ".join(EXPERIMENTS))
        return 0 if argv else 2
    name = argv[0].replace("-", "_")
    if name not in EXPERIMENTS:
        print(f"python -m experiments: error: no experiment {argv[0]!r}; the experiments are "
              f"{', '.join(EXPERIMENTS)}", file=sys.stderr)
        return 2
    return importlib.import_module(EXPERIMENTS[name]).main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
