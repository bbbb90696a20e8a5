"""Fixed-width tables in the nccl-tests manner, and rank-0 printing.

Header lines start with ``#`` and are followed by a units row, so the output
can be read by eye and parsed by ``grep -v '^#'``. One place formats tables
for every commbench tool.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO


@dataclass(frozen=True)
class Column:
    name: str
    unit: str
    width: int
    fmt: str = ""  # format spec for numbers, e.g. ".2f"; text is left as is


def _cell(value: Any, col: Column) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        text = "n/a"
    elif isinstance(value, (int, float)) and col.fmt:
        text = format(value, col.fmt)
    else:
        text = str(value)
    return text.rjust(col.width)


def format_header(columns: Sequence[Column], title: str | None = None) -> str:
    """The ``#`` lines above the rows: optional title, column names, units."""
    lines = [f"# {title}"] if title else []
    head = " ".join(c.name.rjust(c.width) for c in columns)
    units = " ".join((f"({c.unit})" if c.unit else "").rjust(c.width) for c in columns)
    lines += ["#" + head[1:], "#" + units[1:]]
    return "\n".join(lines)


def format_row(columns: Sequence[Column], row: Sequence[Any]) -> str:
    """One data line; tools that print rows as they are measured use this directly."""
    return " ".join(_cell(v, c) for v, c in zip(row, columns))


def format_footer(footer: Sequence[str]) -> str:
    return "\n".join(f"# {f}" for f in footer)


def format_table(columns: Sequence[Column], rows: Sequence[Sequence[Any]],
                 title: str | None = None, footer: Sequence[str] = ()) -> str:
    lines = [format_header(columns, title)]
    lines += [format_row(columns, row) for row in rows]
    if footer:
        lines.append(format_footer(footer))
    return "\n".join(lines)


def rank0_print(rank: int, text: str, file: TextIO | None = None) -> None:
    """Print ``text`` on rank 0 only (the one place rank-0 output goes through).

    Text and newline go in one write: ``print`` writes them apart, and unbuffered
    (``PYTHONUNBUFFERED``, which horovodrun sets) each is its own write(2), so a launcher
    that tags output by the line (``mpirun --tag-output`` under ``horovodrun``) could read
    the last line without its newline and print ``...jsonl[1,0]<stdout>:`` on one line."""
    if rank == 0:
        stream = file or sys.stdout
        stream.write(text + "\n")
        stream.flush()
