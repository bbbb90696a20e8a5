"""The convergence study pooled over seeds (analysis/convergence.py) on constructed
``staleness_summary`` records: one point per configuration, the share of seeds that reach
the target, no pooling across targets or set-ups, and ratios paired seed by seed.

No job is launched (tests/test_staleness.py runs the study itself).
"""

from __future__ import annotations

import pytest

from analysis import convergence
from analysis.convergence import ConvergencePoint, points, reference, time_ratio


def rec(s: int | None, seed: int, tta: float | None, mitigation: str = "none", *,
        job: str = "j1", target: float = 0.9, ranks: int = 4, model: str = "smallcnn",
        final: float = 0.9, vs_sync: float = 1.0, **config) -> dict:
    """One run's ``staleness_summary`` as ``commbench.staleness`` writes it (fields that
    matter here): async at staleness ``s``, or the parameter server (``s`` None)."""
    cfg = {"staleness": [0, 2], "mitigations": ["none", "lr"], "ps": True,
           "staleness_warmup": 20, "steps": 200, "eval_every": 10, "target_accuracy": target,
           "lr": 0.02, "batch_size": 32, "model": model, "image_size": 32, "seeds": [0, 1, 2],
           "seed": None, **config}
    return {"schema": 4, "kind": "staleness_summary", "job_id": job,
            "run_id": f"{job}-{seed}-{s}-{mitigation}", "world_size": ranks, "nodes": 1,
            "dilation": 1.0, "config": cfg, "strategy": "async" if s is not None else "ps",
            "algo": None, "workload": "real", "model": model, "batch_size": 32,
            "image_size": 32, "seed": seed, "staleness_config": s, "mitigation": mitigation,
            "target_accuracy": target, "time_to_accuracy_s": tta, "final_accuracy": final,
            "throughput_vs_sync": vs_sync}


def by_label(pts: list[ConvergencePoint]) -> dict[str, ConvergencePoint]:
    labels = [p.label for p in pts]
    assert len(labels) == len(set(labels)), labels
    return dict(zip(labels, pts))


def test_runs_pool_by_configuration_over_seeds_in_the_order_read():
    recs = [r for seed in (0, 1, 2) for r in (
        rec(0, seed, 10.0 + seed), rec(2, seed, 8.0 + seed, vs_sync=1.5),
        rec(2, seed, 9.0, "lr"), rec(None, seed, 12.0))]
    recs.insert(1, {"kind": "train_step", "seed": 0, "staleness_config": 0})  # passed over
    pts = points(recs)
    assert [p.label for p in pts] == ["s=0", "s=2", "s=2 with lr", "ps"]
    assert all(p.n == 3 and p.seeds == [0, 1, 2] for p in pts)
    s2 = pts[1]
    assert (s2.strategy, s2.staleness, s2.mitigation) == ("async", 2, "none")
    assert s2.times_to_accuracy == [8.0, 9.0, 10.0] and s2.throughput_vs_sync == [1.5] * 3
    assert pts[3].strategy == "ps" and pts[3].staleness is None
    assert pts[0].is_reference and not any(p.is_reference for p in pts[1:])
    assert pts[0].run_ids == ["j1-0-0-none", "j1-1-0-none", "j1-2-0-none"]


def test_reached_share_counts_the_seeds_that_never_reach_the_target():
    recs = [rec(4, 0, 30.0, final=0.91), rec(4, 1, None, final=0.62),
            rec(4, 2, 35.0, final=0.93), rec(4, 3, None, final=0.40)]
    [p] = points(recs)
    assert (p.n, p.reached, p.reached_share) == (4, 2, 0.5)
    assert p.times_to_accuracy == [30.0, 35.0]
    assert p.time_to_accuracy_s == [30.0, None, 35.0, None]
    assert p.final_accuracies == [0.91, 0.62, 0.93, 0.40]  # every seed's, reached or not
    assert p.target_accuracy == 0.9


def test_two_targets_are_never_pooled():
    recs = [rec(2, 0, 5.0, target=0.8, job="a"), rec(2, 1, 6.0, target=0.8, job="a"),
            rec(2, 0, 9.0, target=0.9, job="b"), rec(2, 1, None, target=0.9, job="b")]
    pts = points(recs)
    assert [(p.target_accuracy, p.n, p.times_to_accuracy) for p in pts] == [
        (0.8, 2, [5.0, 6.0]), (0.9, 2, [9.0])]


@pytest.mark.parametrize("other", [
    {"model": "resnet18"}, {"ranks": 8}, {"steps": 300}, {"lr": 0.01}, {"eval_every": 5},
    {"batch_size": 64}], ids=lambda d: next(iter(d)))
def test_runs_of_two_set_ups_are_never_pooled(other):
    a = rec(2, 0, 5.0, job="a")
    b = rec(2, 1, 6.0, job="b", **other)  # the run fields' and the config's
    b.update({k: v for k, v in other.items() if k == "batch_size"})
    pts = points([a, b])
    assert [p.n for p in pts] == [1, 1]
    with pytest.raises(ValueError, match="not the same set-up"):
        time_ratio(pts[1], pts[0])


def test_jobs_of_other_seeds_pool():
    """Which seeds a job was asked for is no set-up: seeds 0,1 in one job and 2 in another
    are three runs of each configuration."""
    recs = [rec(0, 0, 10.0, job="a", seeds=[0, 1]), rec(0, 1, 11.0, job="a", seeds=[0, 1]),
            rec(0, 2, 12.0, job="b", seeds=[2])]
    [p] = points(recs)
    assert p.seeds == [0, 1, 2] and p.job_ids == ["a", "a", "b"]


def test_a_record_from_before_seeds_reads_its_jobs_seed():
    old = rec(0, 0, 10.0)
    del old["seed"], old["config"]["seeds"]
    old["config"]["seed"] = 7  # --seed 7
    assert points([old])[0].seeds == [7]


def test_time_ratios_pair_each_seed_with_its_own_synchronous_run():
    recs = [rec(0, 0, 10.0), rec(0, 1, 20.0), rec(0, 2, None), rec(0, 3, 40.0),
            rec(4, 0, 15.0), rec(4, 1, None), rec(4, 2, 30.0), rec(4, 3, 20.0)]
    pts = by_label(points(recs))
    ref = reference(list(pts.values()), pts["s=4"])
    assert ref is pts["s=0"]
    # seed 1: s=4 never reached; seed 2: synchronous never did; both left out
    assert time_ratio(pts["s=4"], ref) == [1.5, 0.5]
    assert time_ratio(ref, ref) == [1.0, 1.0, 1.0]


def test_time_ratios_pair_within_the_job_that_ran_both():
    """The same seed in two jobs (a repeat): each run against its own job's s=0."""
    recs = [rec(0, 0, 10.0, job="a"), rec(2, 0, 20.0, job="a"),
            rec(0, 0, 40.0, job="b"), rec(2, 0, 20.0, job="b")]
    pts = by_label(points(recs))
    assert pts["s=2"].n == 2 and pts["s=2"].seeds == [0, 0]
    assert time_ratio(pts["s=2"], pts["s=0"]) == [2.0, 0.5]


def test_time_ratio_refuses_another_target_and_a_run_read_twice():
    a, b = points([rec(0, 0, 10.0, target=0.9), rec(2, 0, 12.0, target=0.8)])
    with pytest.raises(ValueError, match="not the same target accuracy"):
        time_ratio(b, a)
    assert reference([a, b], b) is None  # no synchronous run at target 0.8
    twice = points([rec(0, 0, 10.0), rec(0, 0, 10.0), rec(2, 0, 12.0)])
    with pytest.raises(ValueError, match="two runs of seed 0 in job j1"):
        time_ratio(twice[1], twice[0])


def test_setup_fields_name_what_the_issue_requires():
    for name in ("model", "ranks", "steps", "lr"):
        assert name in convergence.SETUP_FIELDS
