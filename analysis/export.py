"""Export result records as one tidy CSV table: a row per record, a column per field.

    python -m analysis.export results/ -o results.csv
    python -m analysis.export results/a.jsonl results/b.jsonl --kind summary -o summary.csv

Nested fields become dotted columns (``stats.sync_share.p95``, ``knobs.bucket_mb``);
per-rank arrays stay in the JSON files. ``-o -`` writes to stdout.
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

from analysis.cli import UsageError, entry, parser, warn, writing
from analysis.load import load, tidy
from commbench.results import write_atomic

PROG = "analysis.export"


def to_csv(records: list[dict]) -> str:
    cols, rows = tidy(records)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def body(argv: list[str]) -> int:
    p = parser(PROG, "Export commbench result records (JSON Lines) as a CSV table.")
    p.add_argument("paths", nargs="+", help="result files or directories (searched for *.jsonl)")
    p.add_argument("-o", "--output", default="-", help="CSV file to write; - for stdout")
    p.add_argument("--kind", action="append", default=None,
                   help="only records of this kind (step, summary, microbench, ...); repeatable")
    args = p.parse_args(argv)
    loaded = load(args.paths)
    warn(PROG, loaded.warnings)
    records = loaded.of_kind(*args.kind) if args.kind else loaded.records
    if not records:
        raise UsageError(f"no records of kind {', '.join(args.kind)} in the input")
    text = to_csv(records)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        out = Path(args.output)
        if out.is_dir():
            raise UsageError(f"-o/--output: {out} is a directory")
        with writing(out):
            out.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(out, text)
        print(f"{len(records)} records -> {out}", file=sys.stderr)
    return 0


main = entry(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
