import json
import math
import time

import pytest

from commbench.output import step_record, summarize_steps
from commbench.results import ResultWriter, read_records
from commbench.timing import NullTimer, StepSample, StepTimer


def sample(step, step_s, compute_s, comm_s=0.05, warmup=False, wait_s=0.0):
    return StepSample(step=step, warmup=warmup, wait_s=wait_s, step_s=step_s,
                      compute_s=compute_s, comm_s=comm_s,
                      exposed_sync_s=max(0.0, step_s - compute_s), comm_calls=1,
                      comm_bytes=1_000_000)


def test_writer_lines_are_complete_json_as_written(tmp_path):
    path = tmp_path / "sub" / "r.jsonl"
    w = ResultWriter(path)
    assert not path.exists()  # nothing is created before the first record
    w.write({"a": 1, "x": math.nan, "y": [math.inf, 2.0]})
    # flushed: a reader sees the line while the writer is still open
    assert json.loads(path.read_text()) == {"a": 1, "x": None, "y": [None, 2.0]}
    w.write({"b": 2})
    w.close()
    assert read_records(path) == [{"a": 1, "x": None, "y": [None, 2.0]}, {"b": 2}]


def test_step_record_takes_the_slowest_rank():
    per_rank = [sample(4, 0.30, 0.20, wait_s=0.01), sample(4, 0.35, 0.22, wait_s=0.02),
                sample(4, 0.31, 0.25)]
    r = step_record(per_rank, world_size=3)
    assert r["critical_rank"] == 1
    assert r["step_s"] == 0.35 and r["compute_s"] == 0.22
    assert r["exposed_sync_s"] == pytest.approx(0.13)
    assert r["sync_share"] == pytest.approx(0.13 / 0.35)
    assert r["wait_s"] == 0.02
    # busbw = 1 MB / 0.05 s * 2(3-1)/3
    assert r["busbw_gbps"] == pytest.approx(1e6 / 0.05 / 1e9 * 4 / 3)
    assert r["ranks"]["step_s"] == [0.30, 0.35, 0.31]


def test_summary_excludes_warmup_and_reports_percentiles():
    steps = [step_record([sample(0, 5.0, 0.1, warmup=True)], 1)]
    steps += [step_record([sample(k, 0.1 * k, 0.05 * k)], 1) for k in range(1, 6)]
    s = summarize_steps(steps, samples_per_step=32)
    assert s["measured_steps"] == 5 and s["warmup_steps"] == 1
    assert s["step_s"] == pytest.approx(0.3)  # median of 0.1..0.5; the 5 s warm-up is out
    assert s["stats"]["step_s"]["p95"] == pytest.approx(0.48)
    assert s["stats"]["step_s"]["count"] == 5
    assert s["sync_share"] == pytest.approx(0.5)
    assert s["throughput"] == pytest.approx(32 / 0.3)


def test_summary_keeps_traced_steps_out_of_the_medians_and_states_their_cost():
    steps = [step_record([sample(0, 5.0, 0.1, warmup=True)], 1)]
    steps += [step_record([sample(k, 0.2, 0.1)], 1) for k in (1, 2)]  # under torch.profiler
    steps += [step_record([sample(k, 0.1, 0.05)], 1) for k in range(3, 8)]
    for s in steps[1:3]:
        s["traced"] = True
    s = summarize_steps(steps, samples_per_step=32)
    assert s["measured_steps"] == 7 and s["traced_steps"] == 2
    assert s["stats"]["step_s"]["count"] == 5 and s["step_s"] == pytest.approx(0.1)
    assert s["traced_step_s"] == pytest.approx(0.2)
    assert s["trace_overhead"] == pytest.approx(1.0)
    for step in steps[3:]:  # every step traced: its medians are all there is
        step["traced"] = True
    s = summarize_steps(steps, samples_per_step=32)
    assert s["traced_steps"] == 7 and "trace_overhead" not in s
    assert s["stats"]["step_s"]["count"] == 7


def test_trace_overhead_compares_the_window_with_its_neighbours_not_the_whole_run():
    """Step times drift over a run: the window's cost is read against the untraced steps
    next to it (as many on each side as it holds), not against the run's median."""
    times = [0.5, 0.5, 0.1, 0.1, 0.11, 0.11, 0.1, 0.1, 0.5, 0.5]
    steps = [step_record([sample(k, t, 0.05)], 1) for k, t in enumerate(times)]
    for s in steps[4:6]:
        s["traced"] = True
    s = summarize_steps(steps, samples_per_step=32)
    assert s["step_s"] == pytest.approx(0.3)  # the untraced steps' median: drift included
    assert s["trace_overhead"] == pytest.approx(0.1)  # 0.11 against the 0.1 beside it


def test_timer_phases_and_union_of_comm():
    t = StepTimer()
    t.begin_step(3, warmup=False, wait_s=0.001)
    t.add_compute(0.004, "forward")
    t.add_compute(0.006, "backward")
    t.comm(1.0, 1.2, nbytes=10)
    t.comm(1.1, 1.3, nbytes=20)  # overlaps the first: counted once
    time.sleep(0.02)
    s = t.end_step()
    assert s.step == 3 and s.comm_s == pytest.approx(0.3) and s.comm_calls == 2
    assert s.comm_bytes == 30 and s.compute_s == pytest.approx(0.010)
    assert (s.forward_s, s.backward_s, s.optimizer_s) == (0.004, 0.006, 0.0)
    assert s.exposed_sync_s == pytest.approx(s.step_s - 0.010)


def test_null_timer_has_the_same_interface():
    n = NullTimer()
    n.begin_step(0, False)
    with n.compute("forward"), n.comm_span(10):
        pass
    n.add_compute(1.0, "backward")
    n.comm(0, 1)
    assert n.end_step() is None and n.clock() == 0.0


def timed(compute_s, durations, step_s=1.0):
    """A sample whose step timed collectives of ``durations`` (in issue order)."""
    s = sample(0, step_s, compute_s)
    s.collective_s = list(durations)
    return s


def test_step_record_splits_collectives_into_transfer_and_wait():
    # rank 1 computes longest: it arrives last at every collective, so waits for nobody
    per_rank = [timed(0.20, [0.50, 0.10], step_s=1.00), timed(0.55, [0.15, 0.12], step_s=0.99),
                timed(0.25, [0.45, 0.30], step_s=0.98)]
    r = step_record(per_rank, world_size=3)
    assert r["critical_rank"] == 0 and r["collectives"] == 2
    # transfer_k = min over ranks: 0.15 and 0.10
    assert r["sync_transfer_s"] == pytest.approx(0.25)
    # wait = own - transfer, summed: rank 0 0.35 + 0, rank 1 0 + 0.02, rank 2 0.30 + 0.20
    assert r["ranks"]["sync_wait_s"] == pytest.approx([0.35, 0.02, 0.50])
    assert r["sync_wait_s"] == pytest.approx(0.35)  # the critical-path rank's
    assert r["sync_wait_max_s"] == pytest.approx(0.50)
    assert r["ranks"]["collectives"] == [2, 2, 2]
    assert r["imbalance_s"] == pytest.approx(0.35) and r["straggler_rank"] == 1
    assert r["wait_s"] == 0.0  # the pre-step barrier's, a different thing


def test_no_straggler_below_the_imbalance_threshold_or_on_one_rank():
    r = step_record([timed(1.00, [0.1]), timed(1.08, [0.1])], world_size=2)
    assert r["imbalance_s"] == pytest.approx(0.08) and r["straggler_rank"] is None
    assert r["sync_wait_s"] == 0.0 and r["sync_transfer_s"] == pytest.approx(0.1)
    one = step_record([timed(1.0, [0.3])], world_size=1)
    assert one["imbalance_s"] == 0.0 and one["straggler_rank"] is None
    assert one["sync_transfer_s"] == 0.3 and one["sync_wait_s"] == 0.0


def test_unmatched_or_missing_collectives_give_no_split():
    mismatched = step_record([timed(0.2, [0.1, 0.2]), timed(0.5, [0.3])], world_size=2)
    assert mismatched["sync_transfer_s"] is None and mismatched["sync_wait_s"] is None
    assert mismatched["collectives"] is None and mismatched["ranks"]["sync_wait_s"] is None
    assert mismatched["sync_wait_max_s"] is None
    assert mismatched["ranks"]["collectives"] == [2, 1]
    assert mismatched["straggler_rank"] == 1  # compute is still known
    none = step_record([timed(0.2, []), timed(0.2, [])], world_size=2)  # e.g. Horovod's peer
    assert none["sync_transfer_s"] is None and none["collectives"] is None


def test_summary_carries_wait_transfer_and_straggler_medians():
    steps = [step_record([timed(0.2, [0.4]), timed(0.5, [0.1])], 2) for _ in range(3)]
    steps[0]["warmup"] = True
    steps.append(step_record([timed(0.2, [0.2]), timed(0.2, [0.2])], 2))
    s = summarize_steps(steps, samples_per_step=2)
    assert s["measured_steps"] == 3
    assert s["sync_transfer_s"] == pytest.approx(0.1)  # median of 0.1, 0.1, 0.2
    assert s["sync_wait_s"] == pytest.approx(0.3)  # critical rank 0 (step_s ties: first)
    assert s["imbalance_s"] == pytest.approx(0.3)
    assert s["straggler_rank"] == 1


def test_timer_keeps_whole_collectives_in_issue_order():
    t = StepTimer()
    t.begin_step(0, warmup=False)
    t.comm(2.0, 2.5, nbytes=10)  # completed first, issued second
    t.comm(1.0, 3.0, nbytes=10)
    t.comm(1.5, 1.6, nbytes=0, calls=0, whole=False)  # a part of a flight: comm time only
    t.collective(0.5, 0.9)  # a whole flight whose parts were recorded earlier
    s = t.end_step()
    assert s.collective_s == pytest.approx([0.4, 2.0, 0.5])
    assert s.comm_calls == 2 and s.comm_s == pytest.approx(2.0)
    t.begin_step(1, warmup=False)
    assert t.end_step().collective_s == []


def test_null_timer_takes_the_collective_calls():
    n = NullTimer()
    n.begin_step(0, False)
    n.comm(0, 1, 10, calls=0, whole=False)
    n.collective(0, 1)
    assert n.end_step() is None
