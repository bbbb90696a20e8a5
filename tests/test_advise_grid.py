"""The advisor's validation grid (issue 48, part 3): the committed held-out cells are what
the file's rule gives, the models and profiles it names exist, and a drifted list is
refused."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from experiments.heldout import GRID, MIN_HELD_OUT, GridError, load_grid

ROOT = Path(__file__).resolve().parents[1]


def test_the_grid_is_4_models_by_2_layouts_by_3_rates_with_12_held_out():
    grid = load_grid(GRID)
    assert [m.id for m in grid.models] == ["resnet18", "resnet101", "gpt-tiny", "heldout-vit"]
    assert grid.layouts == ("2x2", "2x4") and grid.rates == ("250mbit", "1gbit", "4gbit")
    assert len(grid.cells) == 24 and len({c.id for c in grid.cells}) == 24
    assert len(grid.held_out) == 12 >= MIN_HELD_OUT
    assert all(c.held_out for c in grid.cells if c.model.id == "heldout-vit")
    assert all(c.held_out == (c.model.id == "heldout-vit" or c.rate == "1gbit")
               for c in grid.cells)
    # every model the advisor is tuned on is tuned in both layouts, at both outer rates
    assert sorted({(c.model.id, c.layout, c.rate) for c in grid.tuning}) == sorted(
        (m, layout, rate) for m in ("resnet18", "resnet101", "gpt-tiny")
        for layout in ("2x2", "2x4") for rate in ("250mbit", "4gbit"))
    cell = grid.cell("resnet101/2x4/250mbit")
    assert (cell.nodes, cell.slots, cell.held_out) == (2, 4, False)


def test_the_schemes_measured_per_cell_are_the_reference_set_and_three_caps():
    from commbench.strategies import STRATEGIES

    grid = load_grid(GRID)
    assert grid.advisor_top == 3
    assert [s["id"] for s in grid.schemes] == ["flat-native", "ddp-25", "bucketed-auto", "hier",
                                               "bucketed-1", "bucketed-25", "bucketed-128"]
    assert all(s["strategy"] in STRATEGIES for s in grid.schemes)
    assert grid.settings["measure"]["repeats"] >= 3
    assert grid.settings["compute"]["balance_rate"] in grid.rates


def test_tuned_models_are_registered_with_their_profiles_and_the_heldout_one_is_a_factory():
    from commbench.models import MODELS, parameter_shapes
    from commbench.profilefile import read

    grid = load_grid(GRID)
    for m in grid.models:
        if m.id == "heldout-vit":
            assert m.model not in MODELS
            shapes = parameter_shapes(m.model)
            assert sum(math.prod(s) for _, s in shapes) * 4 == 10_774_312  # 10.8 MB
            # its profile is recorded by the command given, before the grid runs
            assert m.model in m.record and m.profile in m.record and m.input_shape == (3, 32, 32)
            continue
        assert m.model in MODELS
        prof = read(ROOT / m.profile)
        assert (prof.model, prof.batch_size) == (m.model, m.batch)


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.replace('    "gpt-tiny/2x4/1gbit",\n', ""), "missing \\['gpt-tiny/2x4/1gbit'\\]"),
    (lambda t: t.replace('    "gpt-tiny/2x4/1gbit",\n',
                         '    "gpt-tiny/2x4/1gbit",\n    "gpt-tiny/2x4/4gbit",\n'),
     "not by the rule \\['gpt-tiny/2x4/4gbit'\\]"),
    (lambda t: t.replace('rates = ["1gbit"]', 'rates = ["10gbit"]'), "held_out names what"),
    (lambda t: t.replace('layouts = ["2x2", "2x4"]', 'layouts = ["2by2"]'), "NODESxRANKS"),
    (lambda t: t.replace("[held_out]", "[held_out_later]"), "no \\[held_out\\] table"),
    (lambda t: t.replace("schema = 1", "schema = 0"), "schema must be 1"),
])
def test_a_held_out_list_that_drifts_from_its_rule_is_refused(tmp_path, edit, message):
    text = GRID.read_text()
    changed = edit(text)
    assert changed != text
    path = tmp_path / "grid.toml"
    path.write_text(changed)
    with pytest.raises(GridError, match=message):
        load_grid(path)


def test_fewer_than_8_held_out_cells_are_refused(tmp_path):
    text = GRID.read_text()
    # one layout: the rule then holds out 3 + 3 cells
    one_layout = text.replace('layouts = ["2x2", "2x4"]', 'layouts = ["2x2"]')
    head = one_layout[:one_layout.index("cells = [")]
    cells = [c for c in load_grid(GRID).held_out if c.layout == "2x2"]
    path = tmp_path / "grid.toml"
    path.write_text(head + "cells = [" + ", ".join(f'"{c.id}"' for c in cells) + "]\n")
    with pytest.raises(GridError, match="6 held-out cells; at least 8"):
        load_grid(path)
