"""Plot commbench results: one figure per question, PNG and SVG.

    python -m analysis.plot results/ -o plots/
    python -m analysis.plot results/run1.jsonl results/sweep/ -o plots/ --only sync_share_vs_ranks

Draws every figure the results hold data for (see ``analysis/figures.py``)
and lists the ones it skipped and why. Exit status 2 (one line on stderr)
on bad flags or input, or when no figure can be drawn; nothing is written
then.
"""

from __future__ import annotations

import sys

from analysis.cli import UsageError, entry, output_dir, parser, warn, writing
from analysis.costmodel import add_native_is, mark_native, parse_native_is
from analysis.figures import FIGURES, save
from analysis.load import load

PROG = "analysis.plot"


def build(records: list[dict], only: list[str] | None = None) -> tuple[dict, dict]:
    """(drawn: name -> Figure, skipped: name -> reason) for the requested figures."""
    drawn, skipped = {}, {}
    for name, (_question, fn) in FIGURES.items():
        if only and name not in only:
            continue
        fig, why, _ = fn(records)
        if fig is None:
            skipped[name] = why
        else:
            drawn[name] = fig
    return drawn, skipped


def body(argv: list[str]) -> int:
    p = parser(PROG, "Plot commbench results: one figure per question (PNG and SVG).")
    p.add_argument("paths", nargs="+", help="result files or directories (searched for *.jsonl)")
    p.add_argument("-o", "--output", default="plots", help="directory for the figures")
    add_native_is(p)
    p.add_argument("--only", action="append", metavar="NAME", choices=list(FIGURES),
                   help=f"only this figure; repeatable ({', '.join(FIGURES)})")
    args = p.parse_args(argv)
    out = output_dir(args.output, create=False)
    native_is = parse_native_is(args.native_is)
    loaded = load(args.paths)
    warn(PROG, loaded.warnings)
    mark_native(loaded.records, native_is)
    drawn, skipped = build(loaded.records, args.only)
    if not drawn:
        raise UsageError("nothing to plot: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    output_dir(out)
    for name, fig in drawn.items():
        with writing(out / name):
            paths = save(fig, out / name)
        print(f"wrote {paths[0]} (+ .svg)")
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    return 0


main = entry(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
