"""benchmarks.shard_bytes: the table's arithmetic against the issue's 2 x 4 row, how a run's
link bytes are read from its step records, and the job its dry run plans (not its figures:
the benchmark prints those)."""

from __future__ import annotations

import shlex

import pytest

from benchmarks import shard_bytes as sb


@pytest.mark.parametrize(("form", "ops", "want"), [
    ("ring", 2, 1.75), ("topology", 2, 1.0), ("pairwise", 2, 4.0),  # all-reduce
    ("ring", 1, 0.875), ("topology", 1, 0.5), ("pairwise", 1, 2.0),  # RS or AG
    ("ring", 3, 2.625),  # ZeRO-3: 1.5 x the ring all-reduce
])
def test_per_psi_is_the_issues_2x4_row(form, ops, want):
    assert sb.per_psi(form, ops, 2, 4) == pytest.approx(want)


def test_zero3_over_ddp_and_hsdp_over_zero3_by_the_table():
    ring_ar = sb.per_psi("ring", 2, 2, 4)
    assert sb.per_psi("ring", 3, 2, 4) / ring_ar == pytest.approx(1.5)
    # HSDP puts the topology-aware all-reduce's bytes on the link: 0.381 of ZeRO-3's ring
    assert sb.per_psi("topology", 2, 2, 4) / sb.per_psi("ring", 3, 2, 4) == \
        pytest.approx(0.381, abs=0.001)


def test_nearest_form_reads_the_librarys_choice():
    psi = 100e6
    assert sb.nearest_form(1.02 * psi, 2, psi, 2, 4) == "topology"
    assert sb.nearest_form(1.70 * psi, 2, psi, 2, 4) == "ring"
    assert sb.nearest_form(3.9 * psi, 2, psi, 2, 4) == "pairwise"


def rec(strategy, algo, run_id, **kw):
    return {"kind": "summary", "strategy": strategy, "algo": algo, "run_id": run_id,
            "grad_bytes": 100e6, "link_gbps": 0.95, "link_wire_gbps": 1.0, "wrong": 0, **kw}


def steps(run_id, values, warmup=(1e9,)):
    return ([{"kind": "step", "run_id": run_id, "warmup": True, "link_bytes": v}
             for v in warmup]
            + [{"kind": "step", "run_id": run_id, "warmup": False, "link_bytes": v}
               for v in values])


def test_rows_take_the_measured_steps_median_over_framing_and_compare_with_ddp():
    wire = 1.0 / 0.95
    summaries = [rec("flat", "ring", "a"), rec("ddp", "native", "b"),
                 rec("zero1", "native", "c"), rec("flat", "hier", "d")]
    st = (steps("a", [v * wire for v in (174e6, 175e6, 176e6)])
          + steps("b", [175e6 * wire] * 3)
          + steps("c", [v * wire for v in (99e6, 100e6, 101e6)])
          + steps("d", [100e6 * wire] * 3))
    rows, payload = sb.rows_of(summaries, st, 2, 4)
    assert payload["flat ring"] == pytest.approx(175e6)  # warm-up left out, median
    assert payload["ddp"] == pytest.approx(175e6)
    by = {(r[0], r[1]): r for r in rows}
    ring = by[("flat", "ring")]
    assert ring[9] == "ring" and ring[10] == pytest.approx(1.0)
    zero1 = by[("zero1", "native")]
    assert zero1[9] == "topology?"  # the library's own choice: a reading, marked
    assert zero1[11] == pytest.approx(100 / 175)  # ÷ DDP
    hier = by[("flat", "hier")]
    assert hier[9] == "topology" and hier[10] == pytest.approx(1.0)


def test_dry_run_plans_one_job_with_every_registered_strategy(tmp_path, capsys):
    assert sb.main(["--dry-run", "--outdir", str(tmp_path), "--model", "resnet18",
                    "--layout", "2x2"]) == 0
    out = capsys.readouterr().out
    cmd = next(line for line in out.splitlines() if "commbench.allreduce" in line)
    words = shlex.split(cmd)
    strat = words[words.index("--strategy") + 1].split(",")
    assert strat[:2] == ["flat", "ddp"]
    assert {"zero1", "zero2"} <= set(strat)
    assert "--dilation" not in words or words[words.index("--dilation") + 1] in ("1", "1.0")


def test_a_librarys_choice_in_no_column_reads_none():
    # Open MPI 4.1's Reduce_scatter + Allgatherv on 2 x 4: 3.5 psi, between ring and pairwise
    summaries = [rec("zero2", "native", "z")]
    rows, _ = sb.rows_of(summaries, steps("z", [350e6 / 0.95]), 2, 4)
    assert rows[0][9] == "none"
    assert rows[0][10] == pytest.approx(3.5 / 4.0)  # against the nearest, pairwise


def test_zero_on_the_ring_is_held_to_the_ring_column():
    summaries = [rec("zero2", "ring", "z"), rec("ddp", "native", "d")]
    st = steps("z", [175e6 / 0.95]) + steps("d", [175e6 / 0.95])
    rows, payload = sb.rows_of(summaries, st, 2, 4)
    z = next(r for r in rows if r[0] == "zero2")
    assert z[1] == "ring" and z[9] == "ring" and z[10] == pytest.approx(1.0)
    assert z[11] == pytest.approx(1.0)  # ÷ DDP
    assert set(payload) == {"zero2 ring", "ddp"}
