"""The convergence study over seeds (``commbench.staleness --seeds``): the flag and its
refusals, the order of the runs, and one tiny real job whose records carry their seed and
pool into ``analysis.convergence``'s points.

The study's other tests (its configurations, time to accuracy, a 3-rank job with the
parameter server) are in tests/test_async.py; its bad input beside every tool's in
tests/test_bad_input.py.
"""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from analysis import claims, convergence
from commbench import staleness
from commbench.flags import ConfigError, to_argv
from commbench.staleness import StudyConfig, parse_study, seeded_runs
from tests.conftest import of_kind, run_tool

# --- without processes -------------------------------------------------------------


def _parse(line: str, tmp_path) -> StudyConfig:
    return parse_study([*shlex.split(line), "--output", str(tmp_path / "r.jsonl")])


@pytest.mark.parametrize("line,seeds", [
    ("", [0]), ("--seeds 0,1,2", [0, 1, 2]), ("--seeds 5", [5]), ("--seeds '2, 0'", [2, 0]),
    ("--seed 3", [3]), ("--seed 0", [0])])
def test_seeds_parse_and_seed_is_one_seed(line, seeds, tmp_path):
    cfg = _parse(line, tmp_path)
    assert cfg.seeds == seeds and cfg.seed is None
    assert cfg == _parse(f"--seeds {','.join(map(str, seeds))}", tmp_path)


def test_seeds_render_back_to_the_command_line(tmp_path):
    cfg = StudyConfig(seeds=[2, 0, 7], staleness=[0, 1], mitigations=["none", "lr"], steps=10)
    argv = to_argv(cfg)
    assert argv[argv.index("--seeds") + 1] == "2,0,7" and "--seed" not in argv
    out = str(tmp_path / "r.jsonl")
    assert parse_study([*argv, "--output", out]) == dataclasses.replace(cfg, output=out)
    assert "--seeds" not in to_argv(StudyConfig())  # the default [0] is left out


@pytest.mark.parametrize("line,names", [
    ("--seeds 0,0", ["--seeds", "seed 0 given twice"]),
    ("--seeds 1,2,1", ["--seeds", "seed 1 given twice"]),
    ("--seeds -1", ["--seeds", ">= 0"]),
    ("--seeds 0,-2", ["--seeds", ">= 0"]),
    ("--seeds x", ["--seeds", "integer"]),
    ("--seeds 1.5", ["--seeds", "integer"]),
    ("--seeds ''", ["--seeds"]),
    ("--seed -1", ["--seed", ">= 0"]),
    ("--seed 0,1", ["--seed", "integer"]),
    ("--seed 3 --seeds 0,1", ["--seed 3", "--seeds 0,1"]),
    ("--seeds 0 --seed 0", ["--seed 0", "--seeds 0"]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_seeds_are_refused_naming_the_flag(line, names, tmp_path, capsys):
    with pytest.raises(ConfigError) as e:
        _parse(line, tmp_path)
    assert all(n in str(e.value) for n in names), str(e.value)
    # the tool: exit status 2 and one line naming it, before any library starts
    out = tmp_path / "out" / "r.jsonl"
    assert staleness.main([*shlex.split(line), "--output", str(out)]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("commbench.staleness: error:"), err
    assert all(n in err[0] for n in names), err
    assert not out.parent.exists()


def test_seed_in_code_is_one_seed_and_refused_beside_other_seeds():
    assert StudyConfig(seed=4).seeds == [4] and StudyConfig(seed=4).seed is None
    assert StudyConfig(seed=4, seeds=[4]).seeds == [4]
    with pytest.raises(ValueError, match="--seed 4 and --seeds 1,2"):
        StudyConfig(seed=4, seeds=[1, 2])
    cfg = StudyConfig(seeds=[3, 9])
    assert cfg.workload_spec(9).seed == 9 and cfg.workload_spec().seed == 3


def test_runs_go_seed_by_seed_each_synchronous_first():
    cfg = StudyConfig(seeds=[1, 0], staleness=[0, 2], mitigations=["none", "lr"], ps=True,
                      steps=10)
    one = [("async", 0, "none"), ("async", 2, "none"), ("async", 2, "lr"), ("ps", None, "none"),
           ("ps", None, "lr")]
    assert seeded_runs(cfg) == [(1, *r) for r in one] + [(0, *r) for r in one]


# --- one tiny real job ------------------------------------------------------------------


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_every_configuration_runs_once_per_seed(tmp_path):
    """2 ranks, 6 steps, 2 seeds x (s=0, s=1, s=1 with lr): ~15 s on 2 cores."""
    run = run_tool("mpirun", 2, "commbench.staleness", [
        "--seeds", "0,1", "--staleness", "0,1", "--mitigations", "none,lr", "--no-ps",
        "--steps", "6", "--eval-every", "3", "--target-accuracy", "0.1"],
        tmp_path / "s.jsonl", timeout=150)
    summ = of_kind(run.records, "staleness_summary")
    keys = [(r["seed"], r["staleness_config"], r["mitigation"]) for r in summ]
    # seed by seed (a job cut short holds whole seeds), each synchronous first
    assert keys == [(seed, s, m) for seed in (0, 1) for s, m in ((0, "none"), (1, "none"),
                                                                 (1, "lr"))]
    for r in summ:
        assert r["config"]["seeds"] == [0, 1] and r["target_accuracy"] == 0.1
        if (r["staleness_config"], r["mitigation"]) == (0, "none"):
            assert r["throughput_vs_sync"] == 1.0  # its own seed's synchronous run
    steps = of_kind(run.records, "train_step")
    assert len(steps) == 6 * 6 and all(r["seed"] in (0, 1) for r in steps)

    def losses(seed: int) -> list[float]:
        return [r["loss"] for r in steps
                if (r["seed"], r["staleness_config"], r["mitigation"]) == (seed, 0, "none")]

    assert len(losses(0)) == len(losses(1)) == 6
    assert losses(0) != losses(1)  # other weights, other data split
    head = run.stdout.splitlines()
    assert any("seeds 0,1" in line for line in head) and any("#seed" in line for line in head)

    points = convergence.points(run.records)
    assert [(p.label, p.n, p.seeds) for p in points] == [
        ("s=0", 2, [0, 1]), ("s=1", 2, [0, 1]), ("s=1 with lr", 2, [0, 1])]
    ref = convergence.reference(points, points[1])
    assert ref is points[0]
    assert convergence.time_ratio(ref, ref) == [1.0] * ref.reached
    for p in points:
        assert p.target_accuracy == 0.1 and dict(p.setup)["ranks"] == 2
        assert len(convergence.time_ratio(p, ref)) <= min(p.reached, ref.reached)
    # C4's accuracy half reads the same records: time to accuracy per seed against s=0
    verdict, measured, reason, runs, _ = claims._c4_accuracy_half(run.records)
    if ref.reached:
        assert verdict in (claims.REPRODUCED, claims.REFUTED, claims.UNDECIDED), reason
        assert "per seed over 2 seeds (6 steps)" in measured and "s=1 with lr" in measured
        assert "the better mitigated at s=1" in reason
    else:  # synchronous training never reached 0.1 in 6 steps on either seed
        assert verdict == claims.NOT_HERE and "none of 2 seeds" in reason
    assert set(runs) == {"convergence s=0", "convergence s=1", "convergence s=1 with lr"}
