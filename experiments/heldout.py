"""The advisor's validation grid and its held-out cells, read from ``advise_grid.toml``.

Issue 48 part 3: the grid is 4 models x 2 layouts x 3 link rates, and the
cells nothing is tuned on are committed before any constant is. This module
reads that file (standard library only), builds the cells, and checks that
the committed held-out list is exactly what the file's rule gives (every cell
of ``held_out.models`` and every cell at ``held_out.rates``), that it names
at least ``MIN_HELD_OUT`` cells and every cell of the held-out model. It plans
and runs nothing: the grid experiment reads :func:`load_grid`::

    >>> from experiments.heldout import GRID, load_grid
    >>> grid = load_grid(GRID)
    >>> len(grid.cells), len(grid.held_out), len(grid.tuning)
    (24, 12, 12)
    >>> grid.cell("heldout-vit/2x4/1gbit").held_out
    True
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.9 and 3.10: the same parser, published as tomli
    import tomli as tomllib

GRID = Path(__file__).resolve().parent / "advise_grid.toml"
SCHEMA = 1
MIN_HELD_OUT = 8  # issue 48: "name how many; at least 8"


class GridError(ValueError):
    """A grid file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class GridModel:
    id: str  # the cell ids' first part
    model: str  # --model: a registered name or package.module:factory
    profile: str  # the compute profile replayed, relative to the repository root
    batch: int
    input_shape: tuple[int, ...] | None = None
    record: str = ""  # the command that records the profile, where it is not committed


@dataclass(frozen=True)
class Cell:
    model: GridModel
    layout: str  # "2x4": nodes x ranks per node
    rate: str  # tc syntax, "1gbit"
    held_out: bool

    @property
    def id(self) -> str:
        return f"{self.model.id}/{self.layout}/{self.rate}"

    @property
    def nodes(self) -> int:
        return int(self.layout.split("x")[0])

    @property
    def slots(self) -> int:
        return int(self.layout.split("x")[1])


@dataclass(frozen=True)
class Grid:
    path: Path
    models: tuple[GridModel, ...]
    layouts: tuple[str, ...]
    rates: tuple[str, ...]
    cells: tuple[Cell, ...]
    rule: str
    schemes: tuple[dict, ...]  # the reference set, then the caps: each a run's settings
    advisor_top: int
    settings: dict = field(default_factory=dict)  # [compute] and [measure]

    @property
    def held_out(self) -> tuple[Cell, ...]:
        return tuple(c for c in self.cells if c.held_out)

    @property
    def tuning(self) -> tuple[Cell, ...]:
        return tuple(c for c in self.cells if not c.held_out)

    def cell(self, cell_id: str) -> Cell:
        for c in self.cells:
            if c.id == cell_id:
                return c
        raise KeyError(f"{self.path.name} has no cell {cell_id!r}")


def load_grid(path: str | Path = GRID) -> Grid:
    """Read the grid file and check its held-out list against its rule; GridError naming
    the file and the key."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise GridError(f"{path}: cannot read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise GridError(f"{path}: not TOML: {e}") from None
    name = path.name
    if doc.get("schema") != SCHEMA:
        raise GridError(f"{name}: schema must be {SCHEMA}, got {doc.get('schema')!r}")
    models = tuple(_model(name, i, m) for i, m in enumerate(_list(name, doc, "model")))
    ids = [m.id for m in models]
    if len(set(ids)) != len(ids):
        raise GridError(f"{name}: model ids repeat: {ids}")
    layouts = tuple(_strings(name, doc, "layouts"))
    for layout in layouts:
        parts = layout.split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise GridError(f"{name}: layouts: {layout!r} is not NODESxRANKS (e.g. 2x4)")
    rates = tuple(_strings(name, doc, "rates"))

    held = doc.get("held_out")
    if not isinstance(held, Mapping):
        raise GridError(f"{name}: no [held_out] table: the held-out cells must be committed")
    rule_models = set(_strings(name, held, "models", "held_out."))
    rule_rates = set(_strings(name, held, "rates", "held_out."))
    unknown = (rule_models - set(ids)) | (rule_rates - set(rates))
    if unknown:
        raise GridError(f"{name}: held_out names what the grid has not: "
                        f"{', '.join(sorted(unknown))}")
    cells = tuple(Cell(m, layout, rate, m.id in rule_models or rate in rule_rates)
                  for m in models for layout in layouts for rate in rates)
    listed = _strings(name, held, "cells", "held_out.")
    by_rule = [c.id for c in cells if c.held_out]
    if sorted(listed) != sorted(by_rule) or len(set(listed)) != len(listed):
        missing = sorted(set(by_rule) - set(listed))
        extra = sorted(set(listed) - set(by_rule))
        raise GridError(f"{name}: held_out.cells is not what its rule gives: missing "
                        f"{missing or 'none'}, not by the rule {extra or 'none'}")
    if len(by_rule) < MIN_HELD_OUT:
        raise GridError(f"{name}: {len(by_rule)} held-out cells; at least {MIN_HELD_OUT}")
    if not rule_models:
        raise GridError(f"{name}: held_out.models names no held-out model")

    measured = doc.get("measured", {})
    schemes = tuple(_list(name, measured, "reference", "measured.")) + \
        tuple(_list(name, measured, "cap", "measured."))
    for i, s in enumerate(schemes):
        if not isinstance(s.get("id"), str) or not isinstance(s.get("strategy"), str):
            raise GridError(f"{name}: measured scheme {i} needs an id and a strategy")
    top = measured.get("advisor_top")
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise GridError(f"{name}: measured.advisor_top must be a positive integer, got {top!r}")
    settings = {k: dict(doc.get(k, {})) for k in ("compute", "measure")}
    return Grid(path, models, layouts, rates, cells, str(held.get("rule", "")), schemes, top,
                settings)


def _list(name: str, table: Mapping, key: str, where: str = "") -> list[dict]:
    v = table.get(key)
    if not isinstance(v, list) or not v or not all(isinstance(x, dict) for x in v):
        raise GridError(f"{name}: {where}{key} must be one or more [[{where}{key}]] tables")
    return v


def _strings(name: str, table: Mapping, key: str, where: str = "") -> list[str]:
    v = table.get(key)
    if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
        raise GridError(f"{name}: {where}{key} must be a list of text, got {v!r}")
    return v


def _model(name: str, i: int, m: Mapping) -> GridModel:
    for key in ("id", "model", "profile"):
        if not isinstance(m.get(key), str) or not m[key]:
            raise GridError(f"{name}: model[{i}].{key} must be text")
    batch = m.get("batch")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise GridError(f"{name}: model[{i}].batch must be a positive integer, got {batch!r}")
    if "/" in m["id"]:
        raise GridError(f"{name}: model[{i}].id {m['id']!r} may not hold '/' (cell ids use it)")
    shape = m.get("input_shape")
    return GridModel(m["id"], m["model"], m["profile"], batch,
                     tuple(shape) if shape is not None else None, str(m.get("record", "")))
