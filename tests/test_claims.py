"""The seed claims judged from matched runs only (analysis/match.py, analysis/claims.py).

The record sets are made by hand, with the fields a real ``commbench.allreduce``
summary carries (header, run fields, knobs, the job's whole config; schema 2), so
that a pooled comparison and a matched one disagree on purpose. Pure Python: no
MPI job is launched.
"""

from __future__ import annotations

import copy
import itertools
import json
import subprocess
from pathlib import Path

import pytest

from analysis import claims, figures, load, match
from commbench import SCHEMA_VERSION
from tests.conftest import PY, ROOT

_ids = itertools.count()

#: the configuration a ``commbench.allreduce`` job records (every flag, for every strategy)
CONFIG = {"workload": "synthetic", "model": "resnet50", "batch_size": 32, "num_classes": 1000,
          "image_size": 64, "device": "cpu", "dataset": "synthetic", "lr": 0.01,
          "compute_ms": 300.0, "compute_profile": None, "compute_scale": 1.0,
          "slow_rank": None, "compute_jitter": 0.0, "seed": 0,
          "strategies": ["flat", "async", "bucketed"], "algos": ["native"], "bucket_mb": 25.0,
          "first_bucket_mb": 1.0, "accum_steps": 1, "progress": "thread", "transfer": "thread",
          "compression": "none", "staleness": 1, "staleness_lr": False, "staleness_warmup": 0,
          "backend": "auto", "steps": 20, "warmup": 3}

#: the knobs each strategy reports (``Strategy.knobs``)
KNOBS = {
    "flat": lambda c: {"compression": c["compression"], "cast_dtype": "float32",
                       "fused_bytes": 102228128, "wire_dtype": "float32", "staging": None},
    "hierarchical": lambda c: {"compression": c["compression"], "cast_dtype": "float32",
                               "fused_bytes": 102228128, "inter_node_algo": "ring"},
    "bucketed": lambda c: {"compression": c["compression"], "cast_dtype": "float32",
                           "bucket_mb": c["bucket_mb"], "first_bucket_mb": 1.0, "buckets": 6,
                           "bucket_bytes": [1 << 20] * 6, "progress": "thread",
                           "transfer_path": "thread"},
    "async": lambda c: {"compression": c["compression"], "cast_dtype": "float32",
                        "staleness": c["staleness"], "staleness_lr": False,
                        "staleness_warmup": 0, "buffers": 2, "transfer_path": "thread"},
    "ddp": lambda c: {"compression": c["compression"], "cast_dtype": "float32",
                      "bucket_cap_mb": c["bucket_mb"], "broadcast_buffers": True},
    "zero2": lambda c: {"stage": 2, "bucket_mb": c["bucket_mb"], "first_bucket_mb": 1.0,
                        "buckets": 6, "algo": "native"},
    "zero3": lambda c: {"stage": 3, "prefetch": "on", "reduce_scatter_group": "shared",
                        "algo": "native"},
    "ps": lambda c: {"servers": 1, "workers": 7, "staleness_lr": False,
                     "compression": c["compression"], "transport": "mpi4py Send/Recv",
                     "accum_steps": 1},
}


def run(strategy: str = "flat", algo: str | None = "native", *, nodes: int = 2, local: int = 4,
        link: str | None = "1gbit", gbps: float | None = 0.95, throughput: float = 100.0,
        exposed_s: float = 0.5, sync_share: float = 0.3, config: dict | None = None,
        **top) -> dict:
    """One run's summary record as ``commbench.allreduce`` writes it (schema 2)."""
    cfg = {**CONFIG, **(config or {})}
    rec = {
        "schema": 2, "kind": "summary", "job_id": "job", "run_id": f"run{next(_ids):04d}",
        "backend": "mpi", "world_size": nodes * local, "nodes": nodes, "local_size": local,
        "local_sizes": [local] * nodes, "hostnames": [f"n{i}" for i in range(nodes * local)],
        "torch_threads": 1, "thread_rule": "machine ranks from the launcher",
        "machine_ranks": nodes * local, "rank_cores": 2, "cores": 2, "loadavg_start": 0.2,
        "versions": {"commbench": "0.1.0", "mpi_library": "Open MPI v4.1.4"},
        "argv": ["commbench/allreduce.py"], "config": cfg,
        "strategy": strategy, "algo": algo, "workload": cfg["workload"], "model": cfg["model"],
        "batch_size": cfg["batch_size"], "image_size": None, "device": "cpu",
        "dtype": "float32", "grad_bytes": 102228128, "grad_tensors": 161,
        "link_gbps": gbps, "link_wire_gbps": gbps, "link_shaping": link,
        "knobs": KNOBS[strategy](cfg),
        "step_s": 1.0, "compute_s": 1.0 - exposed_s, "comm_s": exposed_s,
        "exposed_sync_s": exposed_s, "sync_share": sync_share, "overlap": 0.0,
        "throughput": throughput, "wall_throughput": throughput,
        "peak_rss_mb": 900.0, "wrong": 0, "validated": True,
    }
    rec.update(top)
    return rec


def repeats(*args, n: int = 3, **kw) -> list[dict]:
    """``n`` repeats of one run (``launch.sweep --repeats``), each with its ``repeat``: a
    verdict needs at least 3 runs a side (``analysis.sequential``); repeats that agree
    exactly decide at the first look."""
    return [run(*args, repeat=r, **kw) for r in range(n)]


def claim(cid: str, records: list[dict]) -> claims.Claim:
    check = {c.__name__: c for c in claims.CHECKS}[cid.lower()]
    return check(records, None)


def ids_of(c: claims.Claim) -> set[str]:
    return {i for v in c.runs.values() for i in v}


# -- the same-set-up test --------------------------------------------------------------

def _cfg(**kw):
    def change(r: dict) -> None:
        r["config"].update(kw)
    return change


def _top(**kw):
    def change(r: dict) -> None:
        r.update(kw)
    return change


def _knobs(**kw):
    def change(r: dict) -> None:
        r["knobs"].update(kw)
        r["config"].update(kw)
    return change


#: one change per set-up field, touching nothing else
ONE_FIELD = {
    "ranks": _top(world_size=6),
    "nodes": _top(nodes=1),
    "local_sizes": _top(local_sizes=[5, 3]),
    "link_shaping": _top(link_shaping="200mbit"),
    "link_rate": _top(link_gbps=0.19),
    "dilation": _top(dilation=4.0),
    "model": _top(model="resnet18"),
    "workload": _cfg(dataset="digits"),
    "device": _top(device="cuda:0"),
    "compute": _cfg(compute_ms=100.0),
    "batch": _top(batch_size=64),
    "accumulation": _cfg(accum_steps=4),
    "compression": _knobs(compression="fp16"),
    "backend": _top(backend="horovod"),
    "launcher": lambda r: r["versions"].update(horovod_controller="gloo"),
    "threads": _top(thread_rule="one thread per rank", torch_threads=2),
    "straggler": _cfg(slow_rank=[3, 2.0]),
    "sync": _top(algo="ring"),
    "revision": _top(revision="0123456789ab-dirty"),
}


def test_every_set_up_field_has_a_one_field_change():
    assert set(ONE_FIELD) == set(match.FIELDS)


@pytest.mark.parametrize("name", list(ONE_FIELD))
def test_runs_differing_in_one_field_are_matched_only_when_it_is_the_variable(name):
    a = run()
    b = copy.deepcopy(a)
    ONE_FIELD[name](b)
    assert match.differences(a, b) == [name]
    assert not match.same_setup(a, b)
    assert match.same_setup(a, b, vary=(name,))
    # varying another field does not excuse this one
    other = next(f for f in match.FIELDS if f != name)
    assert not match.same_setup(a, b, vary=(other,))
    assert len(match.matched_sets([a, b])) == 2
    assert len(match.matched_sets([a, b], vary=(name,))) == 1


def test_torch_threads_follow_the_ranks_under_one_thread_rule():
    one, two = run(nodes=1, local=1, torch_threads=2), run(nodes=1, local=2, torch_threads=1)
    assert match.differences(one, two) == ["ranks", "local_sizes", "threads"]
    assert match.same_setup(one, two, vary=figures.RANKS)
    other_rule = {**two, "thread_rule": "one thread per rank"}
    assert match.differences(one, other_rule, figures.RANKS) == ["threads"]
    no_rule = [{**r, "thread_rule": None} for r in (one, two)]  # older records: the count
    assert match.differences(*no_rule, figures.RANKS) == ["threads"]


def test_same_run_twice_is_matched_and_unknown_fields_are_refused():
    a = run()
    assert match.same_setup(a, copy.deepcopy(a))
    with pytest.raises(ValueError, match="not a set-up field: staleness"):
        match.same_setup(a, a, vary=("staleness",))


def test_link_rate_matches_within_measurement_noise_only():
    # two measurements of one 1 Gbit/s shaping (docs/cluster.md) are one set-up
    assert match.same_setup(run(gbps=0.944), run(gbps=0.956))
    assert match.differences(run(gbps=0.95), run(gbps=0.80)) == ["link_rate"]
    assert match.differences(run(gbps=0.95), run(gbps=None)) == ["link_rate"]


def test_set_up_words_name_the_link_only_where_ranks_cross_it():
    assert "link 1gbit (0.95 Gbit/s measured)" in match.describe(run())
    one = match.describe(run(nodes=1))  # a node of the shaped cluster: its link is unused
    assert one.startswith("4 ranks on 1 node(s) (4)") and "link" not in one


def test_settings_a_run_does_not_act_on_do_not_separate_set_ups():
    # a multi-strategy job's --staleness and --bucket-mb leave its flat run flat
    assert match.same_setup(run("flat", config={"staleness": 1, "bucket_mb": 25.0}),
                            run("flat", config={"staleness": 0, "bucket_mb": 5.0}))
    # replayed compute_ms does nothing under a profile, nor for the real workload
    prof = {"compute_profile": "h200-resnet50-b256", "compute_scale": 20.0}
    assert match.same_setup(run(config={**prof, "compute_ms": 100.0}),
                            run(config={**prof, "compute_ms": 300.0}))
    real = {"workload": "resnet", "model": "resnet18"}
    assert match.same_setup(run(config={**real, "compute_ms": 100.0}),
                            run(config={**real, "compute_ms": 300.0}))
    # where the strategy acts on it, the knob separates schemes
    assert match.differences(run("async", None, config={"staleness": 1}),
                             run("async", None, config={"staleness": 2})) == ["sync"]
    assert match.differences(run("bucketed", None, config={"bucket_mb": 25.0}),
                             run("bucketed", None, config={"bucket_mb": 5.0})) == ["sync"]


def test_hierarchical_whichever_flag_chose_it():
    by_flat = run("flat", "hier")
    by_strategy = run("hierarchical", "hier")
    assert match.sync_family(by_flat) == match.sync_family(by_strategy) == "hierarchical"
    assert match.same_setup(by_flat, by_strategy)
    assert match.sync_family(run("flat", "hier-leader")) == "hierarchical"
    assert match.sync_family(run("flat", "ring")) == "flat"


# -- knobs read only where the strategy acts on them ------------------------------------

def test_staleness_is_absent_from_flat_and_bucketed_runs_of_a_stale_job():
    job = [run(s, None if s == "bucketed" else "native", config={"staleness": 1})
           for s in ("flat", "async", "bucketed")]
    flat, asyn, buck = job
    assert load.get(flat, "staleness") is None and load.knob(flat, "staleness") is None
    assert load.get(buck, "staleness") is None
    assert load.get(asyn, "staleness") == 1
    # bucket size: bucketed's own and DDP's cap, no one else's
    assert load.get(buck, "bucket_mb") == 25.0
    assert load.get(run("ddp", None, config={"bucket_mb": 5.0}), "bucket_mb") == 5.0
    assert load.get(flat, "bucket_mb") is None and load.get(asyn, "bucket_mb") is None
    # the whole configuration stays in the record as provenance
    assert flat["config"]["staleness"] == 1


def test_parameter_server_staleness_is_the_measured_one():
    ps = run("ps", None, config={"staleness": 4}, staleness_mean=1.4)
    assert load.get(ps, "staleness") == pytest.approx(1.4)
    assert load.get(run("ps", None, config={"staleness": 4}), "staleness") is None


def test_staleness_figure_leaves_out_flat_runs_of_a_stale_job():
    recs = [run("flat", "native", config={"staleness": 1}, throughput=100),
            run("async", "native", config={"staleness": 0}, throughput=90),
            run("async", "native", config={"staleness": 1}, throughput=95),
            run("async", "native", config={"staleness": 2}, throughput=97)]
    fig, why, series = figures.staleness(recs)
    assert why is None
    assert [s.label for s in series] == ["async"]  # one line: s = 0, 1, 2
    assert sorted(load.get(r, "staleness") for r in series[0].runs) == [0, 1, 2]
    # the flat run is drawn as the set-up's synchronous reference, not as a staleness
    assert [ln.get_label() for ln in fig.axes[0].get_lines()
            if ln.get_label().startswith("flat")] == ["flat (native) (synchronous reference)"]


# -- figures from a mixed folder: a series per matched set, a panel per set-up ----------

def _mixed() -> list[dict]:
    """Runs of three set-ups, as a folder gathered from several studies holds them: flat
    and bucketed on 2 emulated nodes at 2, 4 and 8 ranks (1 Gbit/s), the same with a
    straggler, and flat on one host (no link) at 1 and 2 ranks."""
    recs = []
    for local in (1, 2, 4):
        for straggler in (None, [1, 2.0]):
            cfg = {"slow_rank": straggler}
            recs += [run("flat", "native", local=local, sync_share=0.1 * local, config=cfg),
                     run("bucketed", None, local=local, sync_share=0.05 * local, config=cfg)]
    recs += [run("flat", "native", nodes=1, local=n, link=None, gbps=None, sync_share=0.05 * n)
             for n in (1, 2)]
    return recs


def _legend_labels(ax) -> list[str]:
    leg = ax.get_legend()
    return [t.get_text() for t in leg.get_texts()] if leg else []


@pytest.mark.parametrize("name", ["sync_share_vs_ranks", "scaling"])
def test_rank_figures_draw_one_series_per_matched_set_in_a_panel_per_set_up(name):
    recs = _mixed()
    fig, why, series = figures.FIGURES[name][1](recs)
    assert why is None
    sets = match.matched_sets(recs, figures.RANKS)
    assert len(series) == len(sets) == 5
    assert sorted(sorted(r["run_id"] for r in s.runs) for s in series) == sorted(
        sorted(r["run_id"] for r in g) for g in sets)
    # a panel (row) per set-up, titled in words, its series' labels in its legend
    setups = list(dict.fromkeys(s.setup for s in series))
    assert len(setups) == 3 and any("straggler rank 1 x 2" in t for t in setups)
    rows = fig.axes if name == "sync_share_vs_ranks" else fig.axes[1::2]
    for ax, setup in zip(rows, setups):
        assert ax.get_legend() is not None  # beside the axes: anchored right of them
        assert ax.get_legend().get_bbox_to_anchor().x0 >= ax.get_window_extent().x1
        assert sorted(_legend_labels(ax)) == sorted(s.label for s in series if s.setup == setup)
        assert ax.get_ylim()[0] == 0
    first = fig.axes[0]
    assert first.get_title(loc="left").replace("\n", " ") == setups[0]


def test_rank_figure_draws_the_spread_over_repeats_and_says_so(tmp_path):
    """Three repeats at each rank count: a thick bar from the lowest to the highest run's
    median at each point, and the footnote says what it is; one run a point: no bar."""
    recs = [run(sync_share=x, nodes=1, local=n, link=None, gbps=None)
            for n in (2, 4) for x in (0.2, 0.25, 0.3)]
    fig, why, _ = figures.sync_share_vs_ranks(recs)
    assert why is None
    bars = [c for c in fig.axes[0].collections if max(c.get_linewidths()) == 4]
    assert len(bars) == 1
    segs = sorted(tuple(map(tuple, seg)) for seg in bars[0].get_segments())
    assert [(round(a[1], 3), round(b[1], 3)) for a, b in segs] == [(0.2, 0.3)] * 2
    assert "spread over repeats" in fig._supxlabel.get_text()
    figures.save(fig, tmp_path / "sync")  # a PNG a person can open
    assert (tmp_path / "sync.png").stat().st_size > 0
    fig, _, _ = figures.sync_share_vs_ranks([recs[0], recs[3]])
    assert not [c for c in fig.axes[0].collections if max(c.get_linewidths()) == 4]


def test_sweep_figures_keep_set_ups_apart_and_the_batch_profile_follows_the_batch():
    b256, b1024 = _profiled(256, throughput=100.0), _profiled(1024, throughput=150.0)
    other = [run(batch_size=b, config={"batch_size": b}, nodes=1, local=2, link=None, gbps=None)
             for b in (32, 64)]
    fig, why, series = figures.batch_size([b256, b1024, *other])
    assert why is None and len(series) == 2
    assert {tuple(sorted(r["batch_size"] for r in s.runs)) for s in series} == {(256, 1024),
                                                                                 (32, 64)}
    ks = [run(config={"accum_steps": k}) for k in (1, 4)]
    fig, why, series = figures.accumulation([*ks, run(config={"accum_steps": 2}, nodes=1,
                                                      link=None, gbps=None)])
    assert why is None and len(series) == 1 and series[0].runs == ks
    assert all(ax.get_ylim()[0] == 0 for ax in fig.axes)


def _microbench(algo: str, nodes: int, busbw: float, size: int = 1 << 26) -> dict:
    return {"schema": 2, "kind": "microbench", "run_id": f"mb{next(_ids):04d}", "algo": algo,
            "size": size, "busbw": busbw, "world_size": 4 * nodes, "nodes": nodes,
            "local_size": 4, "local_sizes": [4] * nodes, "backend": "mpi",
            "link_shaping": "1gbit" if nodes > 1 else None,
            "link_gbps": 0.95 if nodes > 1 else None, "torch_threads": 1}


def test_the_link_is_drawn_as_a_ceiling_of_the_ring_only():
    two = [_microbench(a, 2, bw) for a, bw in (("ring", 0.11), ("hier", 0.16), ("native", 0.1))]
    one = [_microbench(a, 1, 1.1) for a in ("ring", "hier")]
    fig, why, series = figures.busbw_vs_size([*two, *one])
    assert why is None and len(series) == 5
    cluster, host = fig.axes  # the cluster first: more ranks
    link = [lab for lab in _legend_labels(cluster) if lab.startswith("link")]
    assert len(link) == 1 and "ceiling of ring" in link[0].replace("\n", " ")
    assert "hier, native can pass it" in link[0].replace("\n", " ")
    assert not any(lab.startswith("link") for lab in _legend_labels(host))  # one host: no link
    fig, _, _ = figures.busbw_vs_size([two[1]])
    (lab,) = [x for x in _legend_labels(fig.axes[0]) if x.startswith("link")]
    assert "not a ceiling for hier" in lab.replace("\n", " ")


# -- C4: async vs synchronous ----------------------------------------------------------

def _pooled_c4(records: list[dict]) -> float:
    """What the report used to say: median flat of every set-up vs the best async of any."""
    import statistics

    flat = [r["throughput"] for r in records if r["strategy"] == "flat"]
    best = max(r["throughput"] for r in records if r["strategy"] == "async")
    return best / statistics.median(flat)


def _cluster_job(throughputs: dict[str, float], n: int = 3, **kw) -> list[dict]:
    """``--strategy flat,async --staleness 1`` on 2 emulated nodes x 4, 1 Gbit/s, ``n``
    repeats (each repeat a round of every strategy)."""
    return [run(s, "native", config={"staleness": 1}, throughput=t, repeat=r, **kw)
            for r in range(n) for s, t in throughputs.items()]


def _one_host_flats(*throughputs: float) -> list[dict]:
    """Flat runs of the real workload on one host, 2 ranks (no async among them)."""
    real = {"workload": "resnet", "model": "resnet18"}
    return [run("flat", "native", nodes=1, local=2, link=None, gbps=None, throughput=t,
                config=real) for t in throughputs]


def test_c4_takes_the_matched_pair_not_the_pooled_runs():
    cluster = _cluster_job({"flat": 40.0, "async": 20.0})
    host = _one_host_flats(5.0, 6.0, 7.0, 5.0, 6.0, 7.0, 6.0)
    records = [*cluster, *host]
    assert _pooled_c4(records) >= 2.5  # pooled, the claim would be "reproduced"
    c = claim("C4", records)
    assert c.verdict == claims.REFUTED
    assert "0.50x" in c.measured
    assert ids_of(c) == {r["run_id"] for r in cluster}
    assert not ids_of(c) & {r["run_id"] for r in host}
    assert "8 ranks on 2 node(s)" in c.setup and c.others == []


def test_c4_verdict_from_the_largest_matched_set_and_the_others_listed():
    big = _cluster_job({"flat": 40.0, "async": 20.0})
    small = _cluster_job({"flat": 10.0, "async": 30.0}, nodes=1, local=2, link=None, gbps=None)
    c = claim("C4", [*small, *big])
    assert c.verdict == claims.REFUTED and "0.50x" in c.measured
    assert ids_of(c) == {r["run_id"] for r in big}
    assert len(c.others) == 1 and "3.00x" in c.others[0] and "2 ranks on 1 node(s)" in c.others[0]
    assert all(r["run_id"] in c.others[0] for r in small)


def test_c4_without_a_matched_set_is_not_reproducible_here():
    asyn = run("async", "native", config={"staleness": 1}, throughput=90.0)
    flat = run("flat", "native", config={"compute_ms": 100.0}, throughput=30.0)  # other compute
    c = claim("C4", [asyn, flat])
    assert c.verdict == claims.NOT_HERE
    assert "matched set-up" in c.reason and c.runs == {}
    assert "the closest pair here differs in compute; accuracy: no convergence runs" in c.reason


def test_c4_compares_the_parameter_server_by_its_measured_staleness():
    ps = repeats("ps", None, throughput=70.0, staleness_mean=1.6)
    flat = repeats("flat", "native", throughput=35.0)
    c = claim("C4", [*flat, *ps])
    assert c.verdict == claims.REFUTED and "2.00x" in c.measured
    assert "measured staleness 1.6" in c.measured


def conv(s: int | None, tta: float | None, mitigation: str = "none", *, seed: int = 0,
         ranks: int = 4, steps: int = 200, target: float = 0.9) -> dict:
    """One run of the convergence study (``commbench.staleness``'s ``staleness_summary``):
    async at staleness ``s``, or the parameter server (``s`` None), of seed ``seed``, that
    reached ``target`` after ``tta`` seconds (None: never)."""
    strategy = "async" if s is not None else "ps"
    cfg = {"staleness": [0, 1, 2, 4], "mitigations": ["none", "lr"], "ps": True,
           "staleness_warmup": 20, "steps": steps, "eval_every": 10, "target_accuracy": target,
           "lr": 0.02, "batch_size": 32, "model": "smallcnn", "image_size": 32,
           "seeds": [0, 1, 2], "seed": None}
    knobs = ({"compression": "none", "staleness": s, "staleness_lr": mitigation == "lr",
              "staleness_warmup": 0, "buffers": 1} if s is not None else
             {"servers": 1, "workers": ranks - 1, "staleness_lr": mitigation == "lr"})
    return {"schema": 4, "kind": "staleness_summary", "job_id": "conv",
            "run_id": f"conv{next(_ids):04d}", "backend": "mpi", "world_size": ranks,
            "nodes": 1, "local_size": ranks, "local_sizes": [ranks], "torch_threads": 1,
            "thread_rule": "ranks on this node", "config": cfg, "strategy": strategy,
            "algo": None, "workload": "real", "model": "smallcnn", "batch_size": 32,
            "image_size": 32, "device": "cpu", "dtype": "float32", "knobs": knobs,
            "seed": seed, "staleness_config": s, "mitigation": mitigation,
            "target_accuracy": target, "time_to_accuracy_s": tta,
            "final_accuracy": 0.95 if tta is not None else 0.5, "best_accuracy": 0.95,
            "wall_s": 10.0, "throughput": 1000.0, "staleness_mean": float(s or 0)}


def _study(times: dict[tuple[int, str], list[float | None]], **kw) -> list[dict]:
    """Convergence runs: (s, mitigation) -> time to accuracy of seeds 0, 1, 2, ..."""
    return [conv(s, t, m, seed=i, **kw) for (s, m), ts in times.items()
            for i, t in enumerate(ts)]


def test_c4_gives_time_to_accuracy_per_staleness_over_seeds_with_its_runs():
    speed = _cluster_job({"flat": 40.0, "async": 20.0})
    study = _study({(0, "none"): [10.0, 12.0, 11.0], (1, "none"): [13.0, 14.0, 12.0],
                    (4, "none"): [30.0, None, 25.0], (4, "lr"): [16.0, 15.0, 18.0]})
    ps = conv(None, 9.0)
    c = claim("C4", [*speed, *study, ps])
    assert "time to 0.9 held-out accuracy / s=0's, per seed over 3 seeds (200 steps)" in c.measured
    assert "s=4 3.00 (range 2.27-never over 3 repeats)" in c.measured
    assert "seeds that reached it: s=0 3/3, s=1 3/3, s=4 2/3, s=4 with lr 3/3" in c.measured
    assert c.runs["convergence s=1"] == [r["run_id"] for r in study[3:6]]
    assert ids_of(c) == {r["run_id"] for r in [*speed, *study, ps]}
    # the better mitigation at s=4 (lr: 1.45, 1.25, 1.64) is slower than s=0 on every seed
    assert "s=4 with lr, the better mitigated at s=4" in c.reason
    assert c.verdict == claims.REFUTED  # the speed-up half: 0.50x


@pytest.mark.parametrize("lr_times, verdict", [
    ([16.0, 15.0, 18.0] * 2, claims.REPRODUCED),  # mitigated, still slower to the target
    ([7.0, 9.0, 8.0] * 2, claims.REFUTED),  # mitigated, faster: staleness won the race
    ([8.0, 15.0, 10.0] * 2, claims.UNDECIDED),  # seeds disagree: the interval straddles 1
    ([16.0, 15.0, 18.0], claims.UNDECIDED),  # 3 seeds: 1.48, its interval 0.10-22.68
])
def test_c4_is_reproduced_only_when_both_halves_are(lr_times, verdict):
    """Each half on its runs: the accuracy half on the paired per-seed ratios, the better of
    two mitigations (alpha / 2); 6 seeds decide these, 3 seeds of the same do not."""
    speed = _cluster_job({"flat": 10.0, "async": 30.0})  # 3x
    ref = [10.0, 12.0, 11.0] * (len(lr_times) // 3)
    times = {(0, "none"): ref, (4, "none"): [30.0] * len(ref), (4, "lr"): lr_times}
    c = claim("C4", [*speed, *_study(times)])
    assert c.verdict == verdict, c.reason
    assert "best of 2" in c.reason
    assert claim("C4", speed).verdict == claims.NOT_HERE  # the accuracy half unmeasured


def test_c4_accuracy_compares_convergence_runs_of_one_set_up_and_target_only():
    speed = _cluster_job({"flat": 10.0, "async": 30.0})
    two = _study({(0, "none"): [10.0]}, ranks=2)
    four = _study({(4, "none"): [30.0]}, ranks=4)
    other_target = _study({(4, "none"): [5.0]}, ranks=2, target=0.5)
    c = claim("C4", [*speed, *two, *four, *other_target])
    assert c.verdict == claims.NOT_HERE and "convergence" not in " ".join(c.runs)
    assert "no convergence runs at s = 0 and s > 0" in c.reason
    both = _study({(0, "none"): [10.0] * 3, (4, "none"): [30.0] * 3}, ranks=2)
    c = claim("C4", [*speed, *both, *four, *other_target])
    assert c.verdict == claims.REPRODUCED and "ranks 2" in c.measured
    assert c.runs["convergence s=4"] == [r["run_id"] for r in both[3:]]
    # synchronous training never reached the target: nothing to compare with
    never = _study({(0, "none"): [None, None], (4, "none"): [None, 30.0]}, ranks=8)
    c = claim("C4", [*speed, *never])
    assert c.verdict == claims.NOT_HERE and "reached 0.9 in none of 2 seeds" in c.reason


def _grid(times: dict[tuple[float, float, int, str], list[float | None]]) -> list[dict]:
    """Convergence runs of a grid: (lr, momentum, s, mitigation) -> times of seeds 0, 1, ...,
    one job per setting (as experiments.claims plans them)."""
    out = []
    for (lr, m, s, mit), ts in times.items():
        for i, t in enumerate(ts):
            r = conv(s, t, mit, seed=i)
            r["config"] = {**r["config"], "lr": lr, "momentum": m}
            r["job_id"] = f"conv-lr{lr:g}-m{m:g}"
            out.append(r)
    return out


def test_c4_accuracy_compares_each_staleness_at_its_best_setting_of_the_grid():
    """Over lr x momentum, synchronous training is read at its fastest setting and s = 4 at
    its own, paired by seed across the two jobs; the interval pays for both picks (alpha /
    mitigations x settings^2), and the words name each side's setting."""
    speed = _cluster_job({"flat": 10.0, "async": 30.0})
    grid = _grid({(0.02, 0.9, 0, "none"): [10.0, 11.0, 10.5] * 2,
                  (0.02, 0.9, 4, "none"): [None] * 6,  # stale at the high rate: collapses
                  (0.01, 0.0, 0, "none"): [20.0, 21.0, 22.0] * 2,
                  (0.01, 0.0, 4, "none"): [15.0, 16.5, 15.5] * 2})
    c = claim("C4", [*speed, *grid])
    assert "each at its best of 2 settings: s=0 lr 0.02, momentum 0.9, s=4 lr 0.01, " \
        "momentum 0" in c.measured, c.measured
    assert "x 2 settings a side" in c.reason and "best of 4" in c.reason, c.reason
    # s = 4 at its best (15-16.5 s) against s = 0 at its best (10-11 s): slower on every seed
    assert c.verdict == claims.REPRODUCED, c.reason
    assert "convergence s=4 (lr 0.01, momentum 0)" in c.runs
    # one setting only: the reference's job pairs with its own stale runs, as before
    one = [r for r in grid if r["job_id"] == "conv-lr0.02-m0.9"]
    c = claim("C4", [*speed, *one])
    assert "settings" not in c.measured and "never" in c.reason


# -- C2: hierarchical vs flat ring -----------------------------------------------------

def test_c2_recognises_flat_algo_hier_on_three_nodes():
    three = dict(nodes=3, local=2)
    ring = repeats("flat", "ring", exposed_s=1.0, **three)
    hier = repeats("flat", "hier", exposed_s=0.5, **three)
    leader = repeats("flat", "hier-leader", exposed_s=0.8, **three)
    c = claim("C2", [*ring, *hier, *leader])
    assert c.verdict == claims.REPRODUCED and "best of 2" in c.reason
    assert "hier 0.50" in c.measured and "hier-leader 0.80" in c.measured
    assert c.runs == {"flat (ring)": match.run_ids(ring), "hierarchical (hier)":
                      match.run_ids(hier), "hierarchical (hier-leader)": match.run_ids(leader)}


def test_c2_over_repeats_is_undecided_below_three_runs_a_side_and_stops_when_decided():
    """Repeats of one set-up are one sample: two runs a side are no verdict (the range of
    the paired ratios, 0.60 and 0.73, is shown; at this spread no number of runs up to 12
    would decide 0.66 against 0.70); six a side well below 0.70 decide at the first look,
    3 runs a side, with a 95 % interval; one run a side is no verdict either."""
    rings = [run("flat", "ring", exposed_s=x, repeat=r) for r, x in enumerate((1.0, 1.1))]
    hiers = [run("flat", "hier", exposed_s=x, repeat=r) for r, x in enumerate((0.6, 0.8))]
    c = claim("C2", [*rings, *hiers])
    assert c.verdict == claims.UNDECIDED
    assert c.spread.kind == "range" and c.spread.lo < 0.70 < c.spread.hi
    assert "ratio undecided (2 runs: range 0.60-0.73)" in c.reason
    assert "a verdict needs a 95% interval, from 3 runs a side" in c.reason
    assert "no number of runs up to 12 a side would decide it at this spread" in c.reason
    assert c.decision.wants == 1 and c.decision.coverage is None
    assert "range 0.55-0.80 over 2 repeats" in c.measured
    assert set(c.runs["flat (ring)"]) == {r["run_id"] for r in rings}
    # six repeats a side, all well below 0.70: an interval, reproduced at the first look
    rings = [run("flat", "ring", exposed_s=1.0 + 0.01 * i, repeat=i) for i in range(6)]
    hiers = [run("flat", "hier", exposed_s=0.55 + 0.01 * i, repeat=i) for i in range(6)]
    c = claim("C2", [*rings, *hiers])
    assert c.verdict == claims.REPRODUCED and c.spread.kind == "95% CI"
    assert c.spread.hi < 0.70 and "95% CI" in c.reason and "n=3 a side" in c.reason
    assert (c.decision.n, c.decision.runs, c.decision.wants) == (3, 6, 0)
    assert c.decision.hi <= 0.70
    # one run a side: no longer judged on its value (it was reproduced): undecided
    c = claim("C2", [run("flat", "ring", exposed_s=1.0), run("flat", "hier", exposed_s=0.6)])
    assert c.verdict == claims.UNDECIDED and "undecided (1 run: 0.60)" in c.reason
    assert c.decision.wants == 2 and "no spread seen yet" in c.reason


def test_c2_pairs_each_sides_runs_by_their_repeat():
    """Paired by repeat, not by the order read: the ring's repeats, read backwards, still
    pair with the hierarchy's of the same round, so the drift of the rounds cancels."""
    drift = (1.0, 1.3, 0.8, 1.1)
    rings = [run("flat", "ring", exposed_s=x, repeat=r) for r, x in enumerate(drift)]
    hiers = [run("flat", "hier", exposed_s=0.5 * x, repeat=r) for r, x in enumerate(drift)]
    for r, x in zip(rings + hiers, (0.97, 0.99, 0.98, 0.96, 0.9, 0.95, 0.92, 0.93)):
        r["link_efficiency"] = x
    c = claim("C2", [*rings[::-1], *hiers])
    assert c.verdict == claims.REPRODUCED and c.decision.n == 3
    # each scheme's link efficiency once: the median over its repeats, with their range
    assert ("link efficiency flat (ring): 0.97 (0.96-0.99 over 4); hierarchical (hier): "
            "0.93 (0.90-0.95 over 4)") in c.measured, c.measured
    assert c.decision.value == pytest.approx(0.5) and c.decision.hi == pytest.approx(0.5)


def test_c7_and_c4_speed_judge_the_ratio_of_medians_over_repeats():
    ones = [run(sync_share=x, config={"accum_steps": 1}) for x in (0.30, 0.32)]
    fours = [run(sync_share=x, config={"accum_steps": 4}) for x in (0.29, 0.33)]
    c = claim("C7", [*ones, *fours])
    assert c.verdict == claims.UNDECIDED and c.spread.lo < 1 < c.spread.hi
    # two runs a side, wholly below 1: the range once decided it; now no verdict yet
    fours = [run(sync_share=x, config={"accum_steps": 4}) for x in (0.10, 0.12)]
    c = claim("C7", [*ones, *fours])
    assert c.verdict == claims.UNDECIDED and "(2 runs: range 0.33-0.38)" in c.reason
    # three a side: the 95 % interval at the first look (0.57-0.76) is below 1
    ones.append(run(sync_share=0.31, config={"accum_steps": 1}))
    fours.append(run(sync_share=0.11, config={"accum_steps": 4}))
    c = claim("C7", [*ones, *fours])
    assert c.verdict == claims.REPRODUCED and "n=3 a side" in c.reason


def test_c2_does_not_pair_a_ring_with_a_hierarchy_of_another_set_up():
    ring_1g = repeats("flat", "ring", exposed_s=1.0)
    hier_200m = repeats("hierarchical", "hier", exposed_s=0.4, link="200mbit", gbps=0.19)
    c = claim("C2", [*ring_1g, *hier_200m])
    assert c.verdict == claims.NOT_HERE and "one set-up" in c.measured
    # the same hierarchy beside a ring of its own set-up is compared, and says so
    ring_200m = repeats("flat", "ring", exposed_s=0.5, link="200mbit", gbps=0.19)
    c = claim("C2", [*ring_1g, *hier_200m, *ring_200m])
    assert c.verdict == claims.REFUTED and "hier 0.80" in c.measured
    assert ids_of(c) == {r["run_id"] for r in [*hier_200m, *ring_200m]}
    assert "link 200mbit" in c.setup


# -- C5: batch size --------------------------------------------------------------------

def test_c5_does_not_pool_a_straggler_run_into_the_batch_sweep():
    slow = repeats(throughput=50.0, config={"slow_rank": [3, 2.0]})
    b32 = repeats(throughput=100.0)
    b64 = repeats(throughput=102.0, batch_size=64, config={"batch_size": 64})
    records = [*slow, *b32, *b64]
    pooled = b64[0]["throughput"] / ((slow[0]["throughput"] + b32[0]["throughput"]) / 2)
    assert pooled > 1.1  # pooled by batch size alone, the claim would be "reproduced"
    c = claim("C5", records)
    assert c.verdict == claims.REFUTED and "x1.02" in c.measured
    assert c.runs == {"batch 32": match.run_ids(b32), "batch 64": match.run_ids(b64)}


def _profiled(batch: int, profile: str | None = None, **kw) -> dict:
    """A run replaying a committed H200 profile (the study's C5 runs: each batch its own)."""
    name = profile or f"h200-resnet50-b{batch}.json"
    return run(batch_size=batch, config={"batch_size": batch, "compute_profile":
                                         f"profiles/{name}", "compute_scale": 20.0}, **kw)


def test_c5_pairs_runs_whose_profile_follows_their_batch():
    b256 = [_profiled(256, throughput=100.0, repeat=r) for r in range(3)]
    b1024 = [_profiled(1024, throughput=150.0, repeat=r) for r in range(3)]
    # the profile is part of the batch: any other difference still separates the runs
    assert match.differences(b256[0], b1024[0]) == ["compute", "batch"]
    assert match.same_setup(b256[0], b1024[0], vary=("batch",))
    assert not match.same_setup(b256[0], b1024[0], vary=("sync",))
    c = claim("C5", [*b256, *b1024])
    assert c.verdict == claims.REPRODUCED and "x1.50" in c.measured
    assert c.runs == {"batch 256": match.run_ids(b256), "batch 1024": match.run_ids(b1024)}
    assert "profiles of each batch, resnet50 on NVIDIA H200" in c.setup


def test_c5_still_separates_profiles_of_another_model_scale_or_batch():
    b256 = _profiled(256)
    other_model = _profiled(64, "h200-resnet18-b64.json")
    other_scale = _profiled(1024)
    other_scale["config"]["compute_scale"] = 50.0
    wrong_batch = _profiled(1024, "h200-resnet50-b256.json")  # a profile of another batch
    missing = _profiled(1024, "h200-resnet50-b999.json")  # not found: known by name only
    for b in (other_model, other_scale, wrong_batch, missing):
        assert match.differences(b256, b, ("batch",)) == ["compute"], b["config"]
    c = claim("C5", [b256, other_model, other_scale, wrong_batch, missing])
    assert c.verdict == claims.NOT_HERE and c.reason.endswith("differs in compute")


# -- the report page ---------------------------------------------------------------------

def _cli(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", module, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_report_gives_the_matched_verdict_and_names_its_runs(tmp_path):
    cluster = _cluster_job({"flat": 40.0, "async": 20.0})
    host = _one_host_flats(5.0, 6.0, 7.0)
    _write(tmp_path / "cluster.jsonl", cluster)
    _write(tmp_path / "host.jsonl", host)
    res = _cli("analysis.report", str(tmp_path), "-o", str(tmp_path / "rep"))
    assert res.returncode == 0, res.stderr
    page = (tmp_path / "rep" / "README.md").read_text()
    row = next(ln for ln in page.splitlines() if ln.startswith("| C4 |"))
    assert "**refuted**" in row and "0.50x" in row
    details = page[page.index("### Runs behind each claim"):]
    c4 = details[details.index("**C4**"):details.index("**C5**")]
    for r in cluster:
        assert f"`{r['run_id']}`" in c4
    for r in host:
        assert r["run_id"] not in c4
    c2 = next(ln for ln in page.splitlines() if ln.startswith("| C2 |"))
    assert "not reproducible here" in c2


# -- schema versions -------------------------------------------------------------------

def test_every_schema_version_written_is_readable():
    assert set(range(1, SCHEMA_VERSION + 1)) <= load.READABLE_SCHEMAS


@pytest.mark.parametrize("module,out", [("analysis.report", "rep"), ("analysis.plot", "plots"),
                                        ("analysis.export", "rows.csv"),
                                        ("analysis.costmodel", "model"),
                                        ("analysis.timeline", "trace.json")])
def test_a_newer_schema_exits_2_naming_file_and_line_and_writes_nothing(module, out, tmp_path):
    newer = max(load.READABLE_SCHEMAS) + 1
    alone = _write(tmp_path / "newer.jsonl", [{**run(), "schema": newer}])
    mixed = _write(tmp_path / "mixed.jsonl", [run(), {**run(), "schema": newer}])
    for path, where in ((alone, f"{alone}:1"), (mixed, f"{mixed}:2")):
        res = _cli(module, str(path), "-o", str(tmp_path / out))
        assert res.returncode == 2, res.stdout + res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
        assert where in lines[0] and f"schema {newer}" in lines[0].replace("version ", "")
        assert not (tmp_path / out).exists()


def auto_run(chosen_mb: float, path: str, transfer: str = "auto") -> dict:
    r = run("bucketed", None, config={"bucket_mb": "auto", "transfer": transfer})
    r["knobs"] = {**r["knobs"], "bucket_mb": chosen_mb, "transfer_path": path,
                  "bucket_mb_auto": {"requested": "auto", "chosen": chosen_mb,
                                     "chosen_path": path}}
    return r


def test_bucket_mb_auto_repeats_pool_whatever_each_chose():
    # peer_fairness, ResNet-50 2x4: six repeats of one request chose 8, 16 and 25 MB, and
    # the thread or by-size path: one set-up, the choices outcomes of the runs
    runs = [auto_run(8.0, "thread"), auto_run(25.0, "by-size"), auto_run(16.0, "thread")]
    assert len(match.matched_sets(runs)) == 1
    assert match.sync_scheme(runs[0])[2:] == match.sync_scheme(runs[1])[2:]
    # a path the user named is a setting: runs on different ones stay apart
    ring, thread = auto_run(8.0, "ring", "ring"), auto_run(8.0, "thread", "thread")
    assert match.differences(ring, thread) == ["sync"]
    # auto against a fixed cap of the same value: different requests
    fixed = run("bucketed", None, config={"bucket_mb": 8.0, "transfer": "auto"})
    fixed["knobs"] = {**fixed["knobs"], "bucket_mb": 8.0, "transfer_path": "thread"}
    assert match.differences(runs[0], fixed) == ["sync"]


def test_sharded_runs_pool_by_the_settings_their_strategy_acts_on():
    """zero3's prefetch and reduce-scatter group, and zero2's bucket cap, are set-ups of
    their own: the runs judged against each other are never pooled."""
    def zero3(prefetch: str = "on", group: str = "shared") -> dict:
        r = run("zero3")
        r["knobs"] = {**r["knobs"], "prefetch": prefetch, "reduce_scatter_group": group}
        return r

    on, off, separate = zero3(), zero3("off"), zero3(group="separate")
    assert len(match.matched_sets([on, zero3(), off, separate])) == 3
    assert match.differences(on, off) == ["sync"]
    assert [match.scheme_words(r) for r in (on, off, separate)] == [
        "zero3 (native)", "zero3 (native), prefetch off",
        "zero3 (native), separate reduce-scatter group"]
    small, large = run("zero2", config={"bucket_mb": 1.0}), run("zero2")
    assert match.differences(small, large) == ["sync"]
    assert match.scheme_words(small) == "zero2 (native) 1 MB"
    # a flat run of the same job is no less flat for zero3's settings (not its knobs)
    assert match.sync_scheme(run("flat")) == ("flat", "native")
