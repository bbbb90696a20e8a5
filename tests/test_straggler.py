"""What a straggler costs: the difference in exposed sync between matched runs with and
without it, beside the straggler run's wait and transfer (analysis/straggler.py)."""

from __future__ import annotations

from analysis import straggler
from tests.test_claims import run


def _runs(slow: bool, exposed: list[float], wait: float, transfer: float, **kw) -> list[dict]:
    cfg = {"slow_rank": [7, 2.0]} if slow else {}
    return [run(exposed_s=x, sync_wait_s=wait, sync_transfer_s=transfer, config=cfg, **kw)
            for x in exposed]


def test_cost_is_the_difference_in_exposed_sync_of_matched_runs():
    # the figures: wait 98 -> 1207 ms, transfer 1511 -> 1258, exposed sync + 866 ms
    none = _runs(False, [1.61, 1.62, 1.60], 0.098, 1.511)
    slow = _runs(True, [2.47, 2.49, 2.48], 1.207, 1.258)
    other = _runs(True, [9.0, 9.1], 5.0, 1.0, batch_size=64)  # another set-up: no partner
    (c,) = straggler.costs([*none, *slow, *other])
    assert c.straggler == "rank 7 x 2" and c.scheme == "flat (native)"
    assert abs(c.cost.value - (2.48 - 1.61)) < 1e-9 and c.cost.kind == "range"
    assert c.cost.lo == 2.47 - 1.62 and c.cost.hi == 2.49 - 1.60
    assert c.wait.value == 1.207 and c.transfer.value == 1.258
    assert set(c.runs["none"]) == {r["run_id"] for r in none}
    lines = straggler.report_lines([*none, *slow])
    assert lines[0] == "## What a straggler costs"
    assert "| rank 7 x 2 | 1207 (range 1207-1207 over 3 repeats) |" in "\n".join(lines)
    assert "870 (range 850-890 over 3 repeats)" in "\n".join(lines)


def test_nothing_without_a_matched_run_without_the_straggler():
    assert straggler.costs(_runs(True, [2.0], 1.0, 1.0)) == []
    assert straggler.report_lines(_runs(False, [2.0], 1.0, 1.0)) == []
