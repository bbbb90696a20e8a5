"""benchmarks.shard_timing: the jobs its dry run plans, what it refuses, and how a cell is
judged from its runs' summaries (not its figures: the benchmark prints those)."""

from __future__ import annotations

import itertools
import json

import pytest

from benchmarks import shard_timing as st
from experiments.runner import Runner

_ids = itertools.count()


def summary(strategy: str, step_s: float, exposed_s: float, repeat: int, **knobs) -> dict:
    return {"kind": "summary", "strategy": strategy, "algo": "native", "run_id": f"r{next(_ids)}",
            "repeat": repeat, "step_s": step_s, "exposed_sync_s": exposed_s, "wrong": 0,
            "knobs": knobs, "config": {}, "setup_bound": "link-bound"}


def cell_runs(zero3: list[float], fsdp: list[float], off: list[float],
              separate: list[float],
              resharded: list[float] | None = None) -> dict[str, list[dict]]:
    """A cell's jobs, a run per repeat: each value a step (its exposed sync a third); the
    root-resharded job where ``resharded`` is given."""
    on = {"prefetch": "on", "reduce_scatter_group": "shared", "reshard_root": "off"}

    def runs(strategy, values, **knobs):
        return [summary(strategy, v, v / 3, r + 1, **knobs) for r, v in enumerate(values)]

    out = {"zero3+fsdp": runs("zero3", zero3, **on) + runs("fsdp", fsdp),
           "prefetch off": runs("zero3", off, **{**on, "prefetch": "off"}),
           "separate": runs("zero3", separate, **{**on, "reduce_scatter_group": "separate"})}
    if resharded is not None:
        out["reshard root"] = runs("zero3", resharded, **{**on, "reshard_root": "on"})
    return out


def cell() -> st.Cell:
    return st.Cell("resnet50", 2, 4, None, 1.0, 4)


def test_a_cell_is_judged_on_its_paired_repeats():
    # zero3 10 % faster than the peer in 6 paired runs, prefetch saving 30 %, the separate
    # group the same as shared within noise
    a = [1.00, 1.01, 0.99, 1.02, 0.98, 1.00]
    b = [1.01, 0.99, 1.00, 1.01, 0.99, 1.00]
    runs = cell_runs([0.9 * n for n in a], [1.0 * n for n in b], [1.3 * n for n in b],
                     [0.9 * n for n in b])
    lines, met = st.judge(cell(), runs)
    assert met == {"step": st.MET, "exposed": st.MET}
    assert lines[0].startswith("resnet50 2x4") and "zero3 / fsdp: step 0.9" in lines[0]
    assert "prefetch on / off: step 0.69" in lines[1] and "[met]" in lines[1]
    # the same within noise: neither below 1 nor above it
    assert "separate / shared" in lines[2] and "[undecided]" in lines[2]
    assert len(lines) == 3  # no root-resharded job: no line for it


def test_the_root_kept_is_judged_against_the_root_resharded():
    a = [1.00, 1.01, 0.99, 1.02, 0.98, 1.00]
    runs = cell_runs(a, a, a, a, resharded=[1.1 * n for n in reversed(a)])
    lines, _ = st.judge(cell(), runs)
    assert "root kept / resharded after forward: step 0.9" in lines[3]
    assert "[met]" in lines[3]


def test_fewer_than_three_runs_a_side_decide_nothing():
    runs = cell_runs([0.9, 0.9], [1.0, 1.0], [1.3, 1.3], [0.9, 0.9])
    _, met = st.judge(cell(), runs)
    assert met == {"step": st.UNDECIDED, "exposed": st.UNDECIDED}


def test_a_host_bound_run_leaves_the_cell_unjudged():
    runs = cell_runs([0.9] * 6, [1.0] * 6, [1.3] * 6, [0.9] * 6)
    runs["zero3+fsdp"][0]["setup_bound"] = "host-bound (probes moved)"
    lines, met = st.judge(cell(), runs)
    assert met == {"step": st.UNDECIDED, "exposed": st.UNDECIDED}
    assert any("host-bound" in line and "not judged" in line for line in lines)


def test_a_failed_job_gives_no_verdict():
    runs = cell_runs([0.9] * 3, [], [1.3] * 3, [0.9] * 3)
    lines, met = st.judge(cell(), runs)
    assert met == {"step": None, "exposed": None} and "failed" in lines[0]


def with_units_profile(tmp_path, monkeypatch, units: bool) -> None:
    """Point the benchmark's profiles at copies in ``tmp_path``, with units or without."""
    src = json.loads((st.ROOT / "profiles" / "cpu-gpt-tiny-b32.json").read_text())
    if units:
        f = src["forward_s"]
        src["forward_units"] = [{"name": "", "start_s": 0.0, "end_s": f},
                                {"name": "transformer.h.0", "start_s": 0.2 * f,
                                 "end_s": 0.5 * f},
                                {"name": "transformer.h.1", "start_s": 0.5 * f,
                                 "end_s": 0.8 * f}]
    path = tmp_path / "gpt.json"
    path.write_text(json.dumps(src))
    monkeypatch.setattr(st, "PROFILES", {"gpt-tiny": (str(path), 32, "python -m ...")})
    monkeypatch.setattr(st, "ROOT", tmp_path)


def test_a_profile_without_forward_units_is_refused_with_the_command(tmp_path, monkeypatch,
                                                                     capsys):
    with_units_profile(tmp_path, monkeypatch, units=False)
    assert st.main(["--models", "gpt-tiny", "--dry-run", "--outdir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "times no forward unit" in err and "python -m ..." in err


def test_the_dry_run_plans_four_torchrun_jobs_a_cell_in_one_set(tmp_path, monkeypatch,
                                                                capsys):
    with_units_profile(tmp_path, monkeypatch, units=True)
    args = st.build_parser().parse_args(["--models", "gpt-tiny", "--layouts", "2x2,2x4",
                                         "--outdir", str(tmp_path / "o")])
    jobs = st.plan(args)
    assert [j.name for j in jobs] == [f"gpt-tiny {lay} {name}" for lay in ("2x2", "2x4")
                                      for name in ("zero3+fsdp", "prefetch off", "separate",
                                                   "reshard root")]
    assert {j.placement.launcher for j in jobs} == {"torchrun"}
    assert [j.sets for j in jobs[:4]] == [{"gpt-tiny 2x2"}] * 4
    assert jobs[0].config.strategies == ["zero3", "fsdp"]
    assert jobs[1].config.sync.values["prefetch"] == "off"
    assert jobs[2].config.sync.values["reduce_scatter_group"] == "separate"
    # like FSDP2's root module, but in the job that times ZeRO-3's own 3x
    assert [j.config.sync.values["reshard_root"] for j in jobs[:4]] == ["off"] * 3 + ["on"]
    Runner(jobs, tmp_path / "o").dry_run()
    out = capsys.readouterr().out
    assert "--strategy zero3,fsdp" in out and "--prefetch off" in out
    assert "--reduce-scatter-group separate" in out and "--reshard-root off" in out


@pytest.mark.parametrize("argv", [["--models", "vgg16"], ["--layouts", "2y4"],
                                  ["--repeats", "0"]])
def test_bad_flags_exit_2(argv):
    with pytest.raises(SystemExit) as e:
        st.main([*argv, "--dry-run"])
    assert e.value.code == 2
