"""Verdicts fair on every backend: the runner's outcome rule (a set-up's verdict from its
figures at K and 2K), ``experiments.study --decide``, and the user's ``--latency-us``.

The ladder's own logic is exercised here on the figures a probe returns (the probe program
is the runner's ``_probe``, replaced by a table of step times per K); the real ladder on a
real emulated cluster is ``tests/test_sweep.py``'s
``test_runner_dilation_auto_probes_the_largest_job_once_and_runs_every_job_at_its_k``."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import report
from analysis.alphabeta import emulated_alpha_us, latency_us
from experiments import runner as rn
from experiments import study as st
from experiments.job import Job, Placement
from experiments.runner import Runner, outcome, probe_figures
from tests.dilation_probe import ProbeConfig

ROOT = Path(__file__).resolve().parents[1]


def _summary(step_s: float, bound: str = "link-bound", **kw) -> dict:
    return {"kind": "summary", "strategy": "flat", "algo": "native", "step_s": step_s,
            "bound": bound, **kw}


def _steps(*step_s: float, algo: str = "native", warm: float | None = None) -> list[dict]:
    """A probe run's step records (one warm-up first when ``warm``) of one row."""
    lead = [] if warm is None else [{"kind": "step", "strategy": "flat", "algo": algo,
                                     "warmup": True, "step_s": warm}]
    return lead + [{"kind": "step", "strategy": "flat", "algo": algo, "warmup": False,
                    "step_s": s} for s in step_s]


def test_probe_samples_are_the_measured_steps_else_the_summary_else_the_call_time():
    recs = [_summary(0.5), {"kind": "microbench", "algo": "ring", "size": 1024,
                            "time_us": {"avg": 12.0}}, {"kind": "summary", "algo": "hier"}]
    assert rn.probe_samples(recs) == {"step:flat:native": [0.5], "call:ring:1024": [12.0]}
    assert probe_figures(recs) == {"step:flat:native": 0.5, "call:ring:1024": 12.0}
    # the steps replace their row's summary; the warm-up is left out
    recs = _steps(0.4, 0.6, warm=9.0) + [_summary(0.5)]
    assert rn.probe_samples(recs) == {"step:flat:native": [0.4, 0.6]}


def test_outcome_judges_each_figure_by_its_interval_and_pools_the_runs():
    ok, readings = outcome([_steps(1.0, 1.02)], [_steps(0.99, 1.01)])
    assert ok == "converged" and readings["step:flat:native"]["samples"] == [2, 2]
    assert outcome([_steps(1.0, 1.02)], [_steps(0.8, 0.82)])[0] == "moved"
    # one sample a side has no interval: unresolved, until the final reading's medians
    assert outcome([[_summary(1.0)]], [[_summary(1.04)]])[0] == "unresolved"
    final, readings = outcome([[_summary(1.0)]], [[_summary(1.04)]], final=True)
    assert final == "converged" and readings["step:flat:native"]["by"] == "medians"
    assert outcome([[_summary(1.0)]], [[_summary(0.94)]], final=True)[0] == "moved"
    assert outcome([[_summary(1.0)]], [[{"kind": "step"}]])[0] is None
    # Open MPI native's spread (the C2 probes at K = 16 and 32): neither inside nor outside
    assert outcome([_steps(0.379, 0.357)], [_steps(0.395, 0.394)])[0] == "unresolved"
    # pooled over runs: the second run's steps join the first's
    two = outcome([_steps(0.379, 0.357), _steps(0.396, 0.393)],
                  [_steps(0.395, 0.394), _steps(0.392, 0.397)])
    assert two[1]["step:flat:native"]["samples"] == [4, 4]
    # every figure must agree: one row that moved makes the probe move
    a = [_steps(1.0, 1.0) + _steps(10.0, 10.0, algo="ring")]
    b = [_steps(1.0, 1.0) + _steps(5.0, 5.0, algo="ring")]
    assert outcome(a, b)[0] == "moved"


def _ladder(tmp_path, monkeypatch, step_at, counter_at=None, start=None):
    """The runner's choice for one job whose probe's steps at K are ``step_at(K)`` (a
    number: two measured steps of it; or a list per run), its counter verdict
    ``counter_at(K)``, and the (K, run) it probed."""
    monkeypatch.setattr(rn, "HINTS", tmp_path / "hints.json")
    if start is not None:
        (tmp_path / "hints.json").write_text(json.dumps(
            {rn._hint_key(_job()): float(start)}))
    probed = []

    def probe(self, job, k, run=1):
        probed.append(k)
        bound = counter_at(k) if counter_at else "link-bound"
        step = step_at(k)
        if step is None:
            return [{"kind": "summary", "bound": bound}]
        steps = step[run - 1] if isinstance(step, list) else (step, step)
        return _steps(*steps, warm=2 * steps[0]) + [_summary(steps[0], bound)]

    monkeypatch.setattr(Runner, "_probe", probe)
    r = Runner([_job()], tmp_path / "out")
    return r._ladder("set", [_job()]), probed


def _job() -> Job:
    return Job("np2", ProbeConfig(), Placement(2, 1, dilation="auto"), ranks=2,
               sets=frozenset({"set"}))


def test_the_ladder_climbs_until_k_agrees_with_2k(tmp_path, monkeypatch):
    # the figure stops moving at K = 4 (1 s from there on); the counters say host-bound
    # everywhere (Horovod's spinning thread): the outcome rule is not fooled by them
    pick, probed = _ladder(tmp_path, monkeypatch, lambda k: max(1.0, 4.0 / k),
                           lambda k: "host-bound (60% of the window)")
    assert pick["dilation"] == 4.0 and pick["verdict"] == "link-bound", pick
    assert pick["rule"] == "outcome" and "agree with 2K's within 5%" in pick["why"]
    assert sorted(set(probed)) == [1, 2, 4, 8] and len(probed) == 4  # each K once
    assert [t["agrees_with_2k"] for t in pick["tried"]] == [False, False, True, None]
    assert pick["tried"][2]["verdicts"] == {"np2": ["host-bound (60% of the window)"]}


def test_the_ladder_steps_down_from_a_hint_while_k_still_agrees(tmp_path, monkeypatch):
    pick, probed = _ladder(tmp_path, monkeypatch, lambda k: max(1.0, 2.0 / k), start=8)
    assert pick["dilation"] == 2.0, pick
    assert sorted(set(probed)) == [1, 2, 4, 8, 16]


def test_a_figure_still_moving_at_the_top_did_not_converge(tmp_path, monkeypatch):
    pick, _ = _ladder(tmp_path, monkeypatch, lambda k: 64.0 / k)  # latency-bound: 1/K
    assert pick["dilation"] == 32.0 and pick["verdict"] == "did not converge by K = 32", pick
    assert "still moved between K = 16 and 32" in pick["why"]


def test_probes_without_figures_fall_back_to_their_counter_verdicts(tmp_path, monkeypatch):
    pick, _ = _ladder(tmp_path, monkeypatch, lambda k: None,
                      lambda k: "link-bound" if k >= 2 else "host-bound")
    assert pick["dilation"] == 2.0 and pick["rule"] == "counter", pick


def test_an_unresolved_pair_gets_more_probe_runs_then_its_medians(tmp_path, monkeypatch):
    # K = 1 moved; at K = 2 against 4 the steps spread across the tolerance (Open MPI
    # native's, run to run): each side is probed again, up to 3 runs, then the pooled
    # medians read it (0.383 against 0.394: within 5 %)
    noisy = {2: [(0.379, 0.357), (0.396, 0.393), (0.38, 0.39)],
             4: [(0.395, 0.394), (0.392, 0.397), (0.40, 0.37)]}
    pick, probed = _ladder(tmp_path, monkeypatch, lambda k: noisy.get(k, 1.0 if k < 2 else 0.4))
    assert pick["dilation"] == 2.0 and pick["verdict"] == "link-bound", pick
    assert probed.count(2) == 3 and probed.count(4) == 3 and probed.count(1) == 1
    at2 = next(t for t in pick["tried"] if t["dilation"] == 2)
    assert at2["runs"] == 3 and at2["agrees_with_2k"] is True
    reading = at2["readings"]["np2"]["step:flat:native"]
    assert reading["by"] == "medians" and reading["samples"] == [6, 6], reading


def test_the_report_states_each_sets_verdict_beside_the_counter_reading(tmp_path):
    (tmp_path / rn.CHOICE_FILE).write_text(json.dumps({"C2": {
        "dilation": 4.0, "verdict": "link-bound", "rule": "outcome", "why": "smallest K",
        "tried": [{"dilation": 4, "verdicts": {"a": ["host-bound (x)", "link-bound"]}}]}}))
    lines = report.setup_verdict_lines([str(tmp_path)])
    assert "| C2 | 4 | link-bound | outcome | smallest K | 1 of 2 link-bound |" in lines


# -- --latency-us ------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["-5", "0", "nan", "ten", "inf"])
def test_latency_us_refuses_what_is_not_a_latency_naming_the_flag(bad):
    with pytest.raises(ValueError, match="--latency-us"):
        latency_us(bad)
    assert latency_us("12.5") == 12.5


@pytest.mark.parametrize("argv", [["--latency-us", "-3"], ["--latency-us", "x"],
                                  ["--latency-us", "10", "--hosts", "a:2,b:2"]])
def test_the_study_exits_2_on_a_bad_or_misplaced_latency(argv, tmp_path, capsys):
    assert st.main([*argv, "--dry-run", "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--latency-us" in err and not (tmp_path / "o").exists()


def test_the_study_exits_2_with_a_latency_inside_slurm(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert st.main(["--latency-us", "10", "--dry-run", "-o", str(tmp_path / "o")]) == 2
    assert "Slurm" in capsys.readouterr().err


def test_the_report_and_costmodel_exit_2_on_a_bad_latency(tmp_path, capsys):
    from analysis import costmodel
    for main in (report.main, costmodel.main):
        assert main([str(tmp_path), "--latency-us", "-1", "-o", str(tmp_path / "r")]) == 2
        assert "--latency-us" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_latency_below_the_emulated_alpha_is_clamped_with_a_note():
    recs = [{"alpha_us": 18.0, "dilation": 1.0, "link_shaping": "1gbit"},
            {"alpha_us": 20.0, "dilation": 1.0, "link_shaping": "1gbit"},
            {"alpha_us": None, "dilation": 1.0}]
    assert emulated_alpha_us(recs) == (19.0, 1.0)
    priced, note = report.user_latency(recs, 5.0)
    assert priced == 19.0 and "clamped" in note and "--latency-us 5" in note
    priced, note = report.user_latency(recs, 50.0)
    assert priced == 50.0 and "clamped" not in note and "model input" in note
    assert report.user_latency(recs, None) == (None, "")
    priced, note = report.user_latency([{"dilation": 1.0}], 5.0)  # schema 4: no alpha
    assert priced == 5.0 and "carries a measured alpha" in note


# -- --decide ----------------------------------------------------------------------------

def test_decide_needs_a_budget_and_excludes_repeat_until(tmp_path, capsys):
    assert st.main(["--decide", "--dry-run", "-o", str(tmp_path / "a")]) == 2
    assert "--decide needs --budget" in capsys.readouterr().err
    assert st.main(["--decide", "--repeat-until", "5", "--budget", "1h", "--dry-run", "-o",
                    str(tmp_path / "b")]) == 2
    assert "give one" in capsys.readouterr().err


def test_a_budget_runs_the_claims_that_fit_and_names_those_it_leaves_out():
    """Claims are taken in the order asked while their first rounds fit together (a shared
    job counted once); one that does not fit is left out with its own round's seconds."""
    from experiments import claims as cl

    class Jobs:  # the runner's jobs and its estimate, by job name
        secs = {"shared": 600.0, "c1-only": 40000.0, "c2-only": 300.0, "c7-only": 900.0}

        def __init__(self) -> None:
            sets = {"shared": {"C1", "C2", "C7"}, "c1-only": {"C1"}, "c2-only": {"C2"},
                    "c7-only": {"C7"}}
            self.jobs = [type("J", (), {"name": n, "sets": frozenset(s)})()
                         for n, s in sets.items()]

        def estimate_s(self, names):
            return sum(self.secs[n] for n in names)

    claims = [cl.BY_ID[i] for i in ("C1", "C2", "C7")]
    kept, left = st.fit_budget(Jobs(), claims, 1800.0)
    assert [c.id for c in kept] == ["C2", "C7"]  # 600 + 300 + 900 = 1800 fits
    assert [(c.id, s) for c, s in left] == [("C1", 40600.0)]
    kept, left = st.fit_budget(Jobs(), claims, 1000.0)
    assert [c.id for c in kept] == ["C2"] and [c.id for c, _ in left] == ["C1", "C7"]
    line = st.left_out_lines(left[:1], "3h")[0]
    assert line.startswith("# C1: undecided, not run: one round of its jobs needs ~")
    assert "--claims C1" in line


def test_the_full_study_under_a_3h_budget_plans_what_fits_and_names_c1(tmp_path):
    """The full study's C1 needs about 12 h for one round: under --decide --budget 3h it is
    named as not run, and the claims that fit are planned (a dry run: nothing runs)."""
    res = subprocess.run([sys.executable, "-m", "experiments.study", "--decide", "--budget",
                          "3h", "--dry-run", "-o", str(tmp_path / "s")],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert "# C1: undecided, not run: one round of its jobs needs ~" in res.stdout
    header = next(x for x in res.stdout.splitlines() if x.startswith("# experiments.study"))
    assert "C1" not in header.split(" points for ")[1].split(";")[0]


def test_decide_wants_the_next_look_for_an_undecided_ratio_claim(tmp_path, monkeypatch):
    """The judge of ``--decide`` on C7's records with 2 runs a side: the claim is undecided
    and wants its first look, 3 runs a side, on the jobs behind its figure; a decided claim
    wants nothing and keeps the time it was first seen decided."""
    from analysis import sequential
    from experiments import claims as cl

    decision = sequential.decide([1.0, 1.1], [2.0, 2.1], 0.9, True)
    assert decision.wants == 1 and decision.runs == 2

    class Fake:
        def __init__(self, verdict, d):
            self.id, self.verdict, self.decision, self.spread = "C7", verdict, d, None
            self.reason, self.runs = "", {}

    seq = iter([Fake("undecided", decision), Fake("reproduced",
                                                  sequential.decide([1.0] * 3, [2.0] * 3,
                                                                    0.9, True))])
    claim = cl.SeedClaim("C7", "t", cl.plan_c7, lambda records, model: next(seq))
    monkeypatch.setattr(st, "claim_jobs", lambda runner, c, records: {"accum-k4", "flat-np8"})
    judged: list = []
    decided_at: dict = {}
    import time
    started = time.time()
    want = st.judge_decisions(None, [claim], tmp_path, judged, {"flat-np8"}, started,
                              decided_at)
    assert want == {"accum-k4": 3}  # the fixed job gets none
    assert judged[0]["verdict"] == "undecided" and judged[0]["runs"] == 2
    assert "C7" not in decided_at
    want = st.judge_decisions(None, [claim], tmp_path, judged, set(), started, decided_at)
    assert want == {} and judged[0]["decided_after_s"] == decided_at["C7"] >= 0
    assert not math.isnan(judged[0]["decided_after_s"])


def test_the_report_gives_each_claims_runs_and_time_to_its_verdict(tmp_path):
    (tmp_path / st.DECIDE_FILE).write_text(json.dumps({
        "budget_s": 10800, "spent_s": 5400, "stopped": "every judged figure is decided",
        "rounds": [{"added": {"accum-k4": 1}, "expected_s": 120}],
        "claims": [{"claim": "C7", "verdict": "reproduced", "figure": "0.50 (95% CI ...)",
                    "runs": 3, "decided_after_s": 1800},
                   {"claim": "C2", "verdict": "undecided", "figure": None, "runs": None,
                    "decided_after_s": None}]}))
    lines = report.decide_lines([str(tmp_path)])
    assert "| C7 | reproduced | 0.50 (95% CI ...) | 3 | 30 min |" in lines
    assert "| C2 | undecided | — | — | not decided |" in lines
    assert not any("not run" in x for x in lines)
    d = json.loads((tmp_path / st.DECIDE_FILE).read_text())
    (tmp_path / st.DECIDE_FILE).write_text(json.dumps(
        {**d, "left_out": [{"claim": "C1", "one_round_s": 43200.0}]}))
    assert ("| C1 | undecided: not run | one round of its jobs needs ~12.0 h, beyond the "
            "budget | 0 | not decided |") in report.decide_lines([str(tmp_path)])
    assert any("round 1: accum-k4 +1" in x for x in lines)


def test_a_latency_bound_cell_says_so_with_its_alpha():
    from benchmarks import peer_fairness
    runs = [{"latency_bound": True, "alpha_us": 2.5, "dilation": 16.0},
            {"latency_bound": False, "alpha_us": 2.4, "dilation": 16.0}]
    note = peer_fairness.latency_note(runs)
    assert "latency-bound (1 of 2 runs, emulated alpha 2.5 us at K = 16" in note
    assert peer_fairness.latency_note(runs[1:]) == ""


def _micro(algo: str, size: int, us: float, k: float, nodes: int = 2) -> dict:
    return {"kind": "microbench", "algo": algo, "size": size, "time_us": {"avg": us},
            "world_size": 4, "nodes": nodes, "local_size": 4 // nodes, "dilation": k,
            "alpha_us": 3.0,
            "backend": "mpi", "_file": "f", "_line": 1, "link_gbps": 1.0}


def test_a_fit_across_two_k_is_refused_and_other_k_are_not_predicted():
    from analysis import costmodel
    from analysis.alphabeta import ModelError
    sizes = (1 << 16, 1 << 17, 1 << 18, 1 << 19)
    rows = [_micro("ring", s, 10 + s / (100 * n), k, n) for s in sizes for k in (1.0, 4.0)
            for n in (1, 2)]
    with pytest.raises(ModelError, match="K = 1, 4"):
        costmodel.analyse(rows, fit_algos=["ring"])
    # fitted at K = 4 only: hier at K = 1 is left out of the check, with the reason
    rows = [_micro("ring", s, 10 + s / (100 * n), 4.0, n) for s in sizes for n in (1, 2)]
    rows += [_micro("hier", 1 << 18, 900.0, 1.0)]
    res = costmodel.analyse(rows, fit_algos=["ring"])
    assert res.dilation == 4.0 and all(pt.dilation == 4.0 for pt in res.held_points)
    assert res.refused and "not predicted: the fit is at K = 4" in res.refused[0]
    lines = costmodel.report_lines(res)
    assert any("inter alpha fitted at K = 4 (measured emulated alpha 3.0 us" in x
               for x in lines), lines


def test_records_take_their_sets_verdict_from_the_runners_choice(tmp_path):
    """``analysis.load`` gives each record of a set placed at ``auto`` its set-up's
    verdict (the outcome rule's, in dilations.json); a run at another K, or on another
    cluster, keeps its own counter reading."""
    from analysis import match
    from analysis.load import load
    from commbench.hostload import is_link_bound
    (tmp_path / rn.CHOICE_FILE).write_text(json.dumps({"C2": {
        "dilation": 4.0, "verdict": "link-bound", "rule": "outcome",
        "clusters": ["horovodrun-gloo:2x2@1gbit"], "tried": []}}))
    head = {"schema": 5, "launcher": "horovodrun", "local_sizes": [2, 2],
            "link_shaping": "1gbit", "kind": "summary", "run_id": "a", "step_s": 1.0}
    rows = [head | {"dilation": 4.0, "bound": "host-bound (Horovod's thread)"},
            head | {"dilation": 1.0, "bound": "host-bound (x)", "run_id": "b"},
            head | {"dilation": 4.0, "bound": "host-bound (x)", "local_sizes": [4, 4],
                    "run_id": "c"}]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recs = load([tmp_path]).records
    assert [r.get("setup_bound") for r in recs] == ["link-bound", None, None]
    assert [is_link_bound(r) for r in recs] == [True, False, False]
    words = match.host_words(recs[:1])
    assert "link-bound" in words and "counters read 0 of 1 link-bound" in words, words
