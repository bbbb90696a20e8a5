"""ZeRO-3 in the overlap model (``analysis.sharded``): the schedule worked by hand on a
two-unit profile, prefetch and the reduce-scatter group, what it refuses, and the check
against a run's record."""

from __future__ import annotations

import pytest

from analysis.alphabeta import ModelError, Params
from analysis.overlap import Profile
from analysis.sharded import check_runs, unit_of_grads, zero3_step
from commbench.profilefile import Unit


def cost(nbytes: float) -> float:
    return nbytes / 1e7  # 10 MB/s: unit a (2 MB) 0.2 s, unit b and the root 0.1 s


def two_units() -> Profile:
    """A root (head and stem, 0.5 MB each) around units ``a`` (2 MB) and ``b`` (1 MB):
    forward 1 s (a from 0.1 to 0.4, b from 0.4 to 0.8), backward 0.7 s in the order head,
    b, a, stem."""
    return Profile("two units", 1.0, 0.7, 0.0, [5e5, 2e6, 1e6, 5e5], [0.7, 0.6, 0.3, 0.05],
                   [3, 2, 1, 0], (Unit("", 0.0, 1.0), Unit("a", 0.1, 0.4), Unit("b", 0.4, 0.8)),
                   (), ("stem.w", "a.w", "b.w", "head.w"))


def test_a_gradient_belongs_to_the_longest_unit_that_prefixes_its_name():
    units = ["", "layer1", "layer1.0"]
    assert unit_of_grads(["layer1.0.conv.weight", "layer1.1.w", "layer10.w", "fc.w"], units) \
        == ["layer1.0", "layer1", "", ""]


def test_without_prefetch_every_gather_is_a_stall_and_a_backward_gather_queues_behind_a_scatter():
    """Worked by hand (module docstring's rules): forward stalls 0.1 (root) + 0.2 (a) + 0.1
    (b); backward 0.1 (root) + 0.1 (b) + 0.3 (a: its gather waits for b's reduce-scatter on
    the one engine), and the stem's reduce-scatter ends 0.2 s past backward."""
    st = zero3_step(two_units(), cost, cost, prefetch=False)
    assert st.forward_stall_s == pytest.approx(0.4)
    assert st.backward_stall_s == pytest.approx(0.5)
    assert st.tail_s == pytest.approx(0.2)
    assert st.exposed_s == pytest.approx(1.1)
    assert st.step_s == pytest.approx(2.8)
    assert st.comm_s == pytest.approx(2 * 0.4 + 0.4)  # two gathers and a scatter a unit
    assert st.buckets == 3


def test_a_root_kept_from_forward_to_backward_is_not_gathered_again():
    """As the test above, less the root's backward gather: its 0.1 s stall, and 0.1 s of
    the engine's time (FSDP2 keeps its root module gathered)."""
    st = zero3_step(two_units(), cost, cost, prefetch=False, reshard_root=False)
    assert st.forward_stall_s == pytest.approx(0.4)
    assert st.backward_stall_s == pytest.approx(0.4)
    assert st.tail_s == pytest.approx(0.2)
    assert st.step_s == pytest.approx(2.7)
    assert st.comm_s == pytest.approx(2 * 0.4 + 0.4 - 0.1)


def test_a_separate_reduce_scatter_engine_takes_the_gather_out_of_the_queue():
    st = zero3_step(two_units(), cost, cost, prefetch=False, separate=True)
    assert st.backward_stall_s == pytest.approx(0.4)  # a's gather no longer waits for b's RS
    assert st.exposed_s == pytest.approx(1.0)


def test_prefetch_hides_what_the_previous_units_compute_covers():
    """Forward: a's gather, handed over after the root's, is 0.1 s late; b's is hidden.
    Backward: b's prefetch is 0.05 s late, a's hidden; the scatters end 0.2 s past."""
    st = zero3_step(two_units(), cost, cost, prefetch=True)
    assert st.forward_stall_s == pytest.approx(0.2)
    assert st.backward_stall_s == pytest.approx(0.15)
    assert st.tail_s == pytest.approx(0.2)
    assert st.exposed_s == pytest.approx(0.55)
    assert st.exposed_s < zero3_step(two_units(), cost, cost, prefetch=False).exposed_s


def test_what_the_model_cannot_schedule_is_a_model_error():
    p = two_units()
    with pytest.raises(ModelError, match="times no forward unit"):
        zero3_step(Profile(p.name, 1.0, 0.7, 0.0, p.nbytes, p.ready_s, p.order, (), (),
                           p.names), cost, cost)
    with pytest.raises(ModelError, match="names are not known"):
        zero3_step(Profile(p.name, 1.0, 0.7, 0.0, p.nbytes, p.ready_s, p.order, p.units),
                   cost, cost)
    interleaved = Profile(p.name, 1.0, 0.7, 0.0, [1e6] * 4, [0.7, 0.6, 0.3, 0.05],
                          [3, 2, 1, 0], p.units, (), ("a.w", "b.w", "a.v", "head.w"))
    with pytest.raises(ModelError, match="interleaves unit a"):
        zero3_step(interleaved, cost, cost)


def _run(**extra) -> dict:
    """A zero3 summary of ResNet-50's CPU profile on 2 x 4 at 1 Gbit/s."""
    rec = {"kind": "summary", "strategy": "zero3", "run_id": "z", "world_size": 8, "nodes": 2,
           "local_size": 4, "link_gbps": 1.0, "compute_profile": "cpu-resnet50-b8.json",
           "compute_scale": 0.5, "knobs": {"algo": "native", "prefetch": "on",
                                           "reduce_scatter_group": "shared"},
           "compute_s": 1.4, "exposed_sync_s": 0.5, "stats": {"step_s": {"median": 1.9}}}
    rec.update(extra)
    return rec


def test_a_zero3_run_is_priced_on_its_link_and_compared():
    """Without a fit, each collective costs at most its bytes through the node link at the
    run's rate: ResNet-50's 102 MB gathered twice and scattered once, (n-1)/n of it through
    the link each time, is at most 3 x 7/8 x 102.2 MB / 125 MB/s = 2.15 s of transfers,
    which bounds what compute can wait for."""
    checks, skipped = check_runs([_run(), _run(run_id="bare", compute_profile=None),
                                  _run(run_id="acc", accum_steps=2)], Params())
    assert [c.run_id for c in checks] == ["z"]
    assert skipped == ["bare: no compute profile", "acc: accumulation (sync every k-th "
                       "backward)"]
    c = checks[0]
    assert 0 < c.predicted_exposed_s < 3 * 7 / 8 * 102.3e6 / 125e6
    assert c.predicted_step_s == pytest.approx(1.4 + c.predicted_exposed_s)
    assert c.measured_exposed_s == 0.5 and c.measured_step_s == 1.9
    off, = check_runs([_run(knobs={"algo": "native", "prefetch": "off"})], Params())[0]
    assert off.predicted_exposed_s > c.predicted_exposed_s


def test_the_report_sets_the_family_beside_its_peers_on_one_setup():
    """Runs of one model, layout, link and K side by side, fastest first, medians over
    runs; another layout is a set of its own, and a set without a sharded run is left out."""
    from analysis.sharded import comparison_lines

    def run(strategy: str, step: float, ranks: int = 8, **extra) -> dict:
        return {"kind": "summary", "strategy": strategy, "model": "resnet50",
                "world_size": ranks, "nodes": 2, "link_gbps": 1.0, "dilation": 8.0,
                "launcher": "torchrun", "compute_profile": "/x/cpu-resnet50-b8.json",
                "compute_scale": 0.84, "stats": {"step_s": {"median": step},
                                                 "exposed_sync_s": {"median": step / 4}},
                **extra}

    lines = comparison_lines([run("zero3", 2.0, model_state_bytes_peak=90e6),
                              run("zero3", 2.2, model_state_bytes_peak=92e6),
                              run("fsdp", 1.8), run("ddp", 1.5, ranks=4),
                              run("flat", 1.0, ranks=4)])
    assert lines[0].startswith("# resnet50 (cpu-resnet50-b8.json x 0.84) on 8 ranks, "
                               "2 node(s), 1 Gbit/s, K = 8, torchrun")
    rows = [ln.rsplit(None, 6) for ln in lines[2:4]]  # name, runs, step, exposed, share, ...
    assert [r[:3] for r in rows] == [["fsdp", "1", "1800.0"],
                                     ["zero3 prefetch shared", "2", "2100.0"]]
    assert rows[1][4] == "25.0%" and rows[1][5] == "91.0"
    assert len([ln for ln in lines if ln.startswith("#")]) == 1  # ddp + flat: no sharded run


def test_memory_is_set_against_the_bound_term_by_term():
    from analysis.sharded import memory_lines

    def run(peak: float) -> dict:
        return {"kind": "summary", "strategy": "zero3", "run_id": f"r{peak:g}",
                "model_state_bytes_peak": peak, "peak_rss_mb": 900,
                "knobs": {"model_state_bytes": {"shard_bytes": 40e6,
                                                "largest_unit_bytes": 20e6,
                                                "root_unit_bytes": 8e6}}}

    lines = memory_lines([run(95e6), run(120e6), run(200e6),
                          {"kind": "summary", "strategy": "zero3", "run_id": "old"}])
    assert len(lines) == 4  # the head and three runs: one written before the terms is left out
    words = [" ".join(ln.split()) for ln in lines]
    assert "bound shards + 3 x largest = 100.0 MB: within;" in words[1]
    assert "20.0 MB over: 1.00 x the largest unit, within the root's" in words[2]
    assert "100.0 MB over: 5.00 x the largest unit, beyond the root's" in words[3]


def three_units() -> Profile:
    """A root (stem and head, 0.5 MB each) around units ``a``, ``b``, ``c`` (1 MB each):
    forward 1 s (a from 0.1, b from 0.4, c from 0.6 to 0.9), backward 1 s in the order
    head (ready at 0.05), c (0.3), b (0.55), a (0.8), stem (1.0)."""
    return Profile("three units", 1.0, 1.0, 0.0, [5e5, 1e6, 1e6, 1e6, 5e5],
                   [1.0, 0.8, 0.55, 0.3, 0.05], [4, 3, 2, 1, 0],
                   (Unit("", 0.0, 1.0), Unit("a", 0.1, 0.4), Unit("b", 0.4, 0.6),
                    Unit("c", 0.6, 0.9)), (), ("stem.w", "a.w", "b.w", "c.w", "head.w"))


def test_the_fsdp_peer_computes_a_unit_once_its_blocking_gather_ends_however_late_the_host():
    """Worked by hand (``fsdp_step``), reduce-scatters 5 x a gather's cost. Forward: the
    root's gather, 0.1 s. Backward from 1.1: c's gather (handed over by the root's
    pre-backward, blocking) ends at 1.2, 0.05 s after c's computation would begin; at c's
    backward b's gather runs 1.2-1.3; c's reduce-scatter holds the host 1.45-1.95 while the
    device computes b; at b's backward, a's gather runs 1.95-2.05, and a's computation,
    due to begin at 1.70, begins at 2.05 (0.35 s). The host's reduce-scatters of b
    (2.05-2.55), a (2.55-3.05) and the root (3.05-3.55) end 1.05 s past the device's end
    of backward (2.5)."""
    from analysis.sharded import fsdp_step

    st = fsdp_step(three_units(), cost, lambda n: 5 * cost(n))
    assert st.forward_stall_s == pytest.approx(0.1)
    assert st.backward_stall_s == pytest.approx(0.40)
    assert st.tail_s == pytest.approx(1.05)
    assert st.step_s == pytest.approx(3.55)  # the one thread's collectives, end to end
    assert st.comm_s == pytest.approx(0.3 + 0.3 + 0.1 + 5 * 0.4)  # root kept in backward


def test_the_fsdp_peer_and_zero3_with_its_root_kept_share_a_schedule_where_the_host_keeps_up():
    """Cheap reduce-scatters: the peer's host is never behind, its blocking gathers are
    each a prefetch one unit ahead, and its step is zero3's with prefetch on one engine
    and the root kept (the schedule both run, issued from one thread or from the engine)."""
    from analysis.sharded import fsdp_step

    def rs(n: float) -> float:
        return cost(n) / 10

    peer = fsdp_step(three_units(), cost, rs)
    zero3 = zero3_step(three_units(), cost, rs, reshard_root=False)
    assert peer.step_s == pytest.approx(zero3.step_s)
    assert peer.comm_s == pytest.approx(zero3.comm_s)


def test_an_fsdp_run_is_checked_by_the_peers_model():
    """A summary of the peer is priced by ``fsdp_step``; its all-gathers' time per byte
    counts the root once (kept gathered), as zero3's with --reshard-root off does."""
    fsdp, zero3 = check_runs([_run(run_id="f", strategy="fsdp", knobs={},
                                   comm_phases_s={"allgather": 1.0, "reduce_scatter": 1.0},
                                   grad_bytes=102_228_128),
                              _run(run_id="k", knobs={"prefetch": "on", "reshard_root": "off"},
                                   comm_phases_s={"allgather": 1.0, "reduce_scatter": 1.0},
                                   grad_bytes=102_228_128)], Params())[0]
    assert (fsdp.run_id, zero3.run_id) == ("f", "k")
    assert 0 < fsdp.predicted_exposed_s < 3.0 and 0 < zero3.predicted_exposed_s < 3.0
