"""The bucketed strategy: bucket layout, issue order, equality with flat, measured overlap."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from commbench.buckets import AUTO_CAPS_MB, MB, ProbeCost, choose_cap, parse_bucket_mb, schedule
from commbench.comm.engine import TransferEngine
from commbench.strategies import BucketedSettings, make_strategy
from commbench.strategies.bucketed import BucketedStrategy, assign_buckets
from commbench.strategies.tuner import BY_SIZE, PROBE_BYTES, PROBE_REPS, BucketTuner
from commbench.timing import StepTimer
from tests.conftest import of_kind, run_check, run_tool, summaries

# --- bucket layout (no MPI) -------------------------------------------------


def test_buckets_follow_the_order_and_stay_within_the_cap():
    nbytes = [10, 20, 30, 40, 50]
    order = [4, 3, 2, 1, 0]
    assert assign_buckets(nbytes, order, 100) == [[4, 3], [2, 1, 0]]
    assert assign_buckets(nbytes, order, 90) == [[4, 3], [2, 1, 0]]
    assert assign_buckets(nbytes, order, 89) == [[4], [3, 2], [1, 0]]
    assert assign_buckets(nbytes, [0, 2, 4, 1, 3], 45) == [[0, 2], [4], [1], [3]]


def test_the_first_bucket_has_a_cap_of_its_own():
    nbytes = [10, 20, 30, 40, 50]
    order = [4, 3, 2, 1, 0]
    # DDP's rule: a small first bucket, so the link starts early in backward
    assert assign_buckets(nbytes, [0, 1, 2, 3, 4], 100, first_cap_bytes=15) == \
        [[0], [1, 2, 3], [4]]
    assert assign_buckets(nbytes, order, 100, first_cap_bytes=45) == [[4], [3, 2, 1, 0]]
    assert assign_buckets(nbytes, order, 100, first_cap_bytes=90) == [[4, 3], [2, 1, 0]]
    # never larger than the other buckets' cap
    assert assign_buckets(nbytes, order, 60, first_cap_bytes=1000) == [[4], [3], [2, 1, 0]]


def test_a_tensor_over_the_cap_gets_its_own_bucket_and_zero_means_per_tensor():
    assert assign_buckets([5, 500, 5, 5], [0, 1, 2, 3], 100) == [[0], [1], [2, 3]]
    assert assign_buckets([5, 5, 5], [2, 1, 0], 0) == [[2], [1], [0]]
    assert assign_buckets([5, 5, 5], [2, 1, 0], 1e12) == [[2, 1, 0]]


def test_buckets_do_not_mix_dtypes():
    dt = [torch.float32, torch.float16, torch.float16]
    assert assign_buckets([4, 2, 2], [0, 1, 2], 100, dt) == [[0], [1, 2]]


def test_order_must_name_every_gradient_once():
    with pytest.raises(ValueError, match="every gradient exactly once"):
        assign_buckets([1, 2, 3], [0, 1, 1], 10)


# --- --bucket-mb auto: the rule (no MPI) --------------------------------------


@pytest.mark.parametrize("text,want", [("auto", "auto"), (" AUTO ", "auto"), ("0", 0.0),
                                       ("2.5", 2.5), (25, 25.0)])
def test_bucket_mb_is_a_number_or_auto(text, want):
    assert parse_bucket_mb(text) == want


@pytest.mark.parametrize("text", ["-1", "inf", "nan", "automatic", ""])
def test_a_bad_bucket_mb_names_the_flag(text):
    with pytest.raises(ValueError, match="--bucket-mb"):
        parse_bucket_mb(text)


def _line(alpha, per_byte):
    return lambda nbytes: alpha + per_byte * nbytes


def test_probe_cost_goes_through_the_fastest_time_at_each_size():
    # the ring on 2 x 2 as probed: 64 KiB cost 0.86 ms, far above a line through 1 and 8 MiB
    cost = ProbeCost([2**16, 2**16, 2**20, 2**20, 2**23, 2**23],
                     [0.00086, 0.0009, 0.0133, 0.02, 0.1056, 0.1086])
    assert cost.record() == [[2**16, 0.00086], [2**20, 0.0133], [2**23, 0.1056]]
    assert cost(2**16) == pytest.approx(0.00086) and cost(100) == pytest.approx(0.00086)
    mid = (2**16 + 2**20) / 2
    assert cost(mid) == pytest.approx((0.00086 + 0.0133) / 2)  # a straight line between
    slope = (0.1056 - 0.0133) / (2**23 - 2**20)
    assert cost(2**24) == pytest.approx(0.1056 + slope * 2**23)  # the last slope beyond
    assert cost.scaled(0.5)(2**20) == pytest.approx(cost(2**19))  # fp16 on the wire
    # a size probed slower than a smaller one costs what the smaller did: never decreasing
    flat = ProbeCost([1, 2, 3], [0.5, 0.4, 0.9])
    assert flat.record() == [[1, 0.5], [2, 0.5], [3, 0.9]] and flat(4) == pytest.approx(1.3)
    with pytest.raises(ValueError, match="two sizes"):
        ProbeCost([5, 5], [1.0, 2.0])
    with pytest.raises(ValueError, match="do not grow"):
        ProbeCost([1, 2], [0.2, 0.1])


def test_choose_cap_trades_an_early_start_against_the_latency_each_bucket_pays():
    mib4 = 4 * MB
    nbytes, order = [mib4] * 8, list(range(8))
    ready = [0.01 * i for i in order]  # one 4 MiB gradient every 10 ms
    per_byte = 0.01 / mib4  # a 4 MiB bucket holds the link 10 ms
    # free buckets: a bucket per gradient ends 10 ms after the last one is ready; larger caps
    # leave more behind it. 1, 2 and 4 MB give the same buckets: the largest of them wins.
    cap, exposed = choose_cap(nbytes, order, ready, _line(0.0, per_byte))
    assert cap == 4.0 and exposed[4.0] == pytest.approx(0.01)
    assert exposed[1.0] == exposed[4.0] and exposed[8.0] == pytest.approx(0.02)
    # 50 ms a bucket: eight queue up (0.48 s); one bucket of 32 MiB ends 0.13 s after backward
    cap, exposed = choose_cap(nbytes, order, ready, _line(0.05, per_byte))
    assert exposed[4.0] == pytest.approx(0.48 - 0.07)
    assert exposed[32.0] == pytest.approx(0.13) and cap == max(AUTO_CAPS_MB)
    # the first bucket's own cap is kept: the 4 MiB gradient 0 stays alone
    cap, exposed = choose_cap(nbytes, order, ready, _line(0.0, per_byte),
                              first_cap_bytes=1 * MB)
    assert exposed[8.0] == pytest.approx(0.02)
    with pytest.raises(ValueError, match="ready times"):
        choose_cap(nbytes, order, ready[:3], _line(0.0, per_byte))


def test_choose_cap_splits_a_gradient_smaller_than_a_megabyte():
    # GPT-tiny's shape: 0.5 MB in eight 64 KiB gradients, one every 0.5 ms; a 64 KiB bucket
    # holds the link 0.05 + 0.4 ms. At 1 MB and up it is one bucket sent after backward.
    kib64 = 64 * 1024
    nbytes, order = [kib64] * 8, list(range(8))
    ready = [0.0005 * i for i in order]
    cap, exposed = choose_cap(nbytes, order, ready, _line(0.00005, 0.0004 / kib64),
                              first_cap_bytes=MB)
    assert exposed[1.0] == pytest.approx(0.00325)  # the whole gradient after backward
    assert cap == 1 / 16 and exposed[cap] == pytest.approx(0.00045)  # one gradient a bucket
    assert exposed[1 / 8] == pytest.approx(0.00085)  # two a bucket: the last waits for a pair


def test_the_cost_model_schedules_buckets_by_the_rule_auto_chooses_by():
    from analysis import overlap  # the cost model's schedule is this very rule
    assert overlap.schedule([0.0, 0.1], [0.2, 0.05], 0.1) == schedule([0.0, 0.1], [0.2, 0.05],
                                                                       0.1)
    assert schedule([0.0, 0.1], [0.2, 0.05], 0.1) == (pytest.approx([0.2, 0.25]),
                                                      pytest.approx(0.15))


# --- issue order and timing, with a stand-in communicator ---------------------


class _Handle:
    def __init__(self, tests_needed: int) -> None:
        self.left = tests_needed
        self.waited = False

    def test(self) -> bool:
        self.left -= 1
        return self.left < 0

    def wait(self) -> None:
        self.waited = True
        self.left = -1


class _Comm:
    """Records iallreduce calls; each completes after ``tests_needed`` tests."""

    size = 1
    rank = 0
    device_collectives = False  # host buffers, as MPI's
    supports_p2p = False

    def __init__(self, tests_needed: int = 2) -> None:
        self.issued: list[int] = []  # numel of each buffer, in issue order
        self.tests_needed = tests_needed

    def iallreduce(self, tensor: torch.Tensor) -> _Handle:
        self.issued.append(tensor.numel())
        return _Handle(self.tests_needed)

    @staticmethod
    def bcast_object(obj):
        return obj


def _strategy(comm, numels, mb, order=None):
    grads = [torch.full((n,), float(i)) for i, n in enumerate(numels)]
    return BucketedStrategy(comm, grads, BucketedSettings(bucket_mb=mb, progress="poll"),
                            backward_order=order), grads


def test_a_bucket_starts_when_its_last_gradient_is_ready_and_never_before_earlier_ones():
    comm = _Comm()
    # 4-byte floats: 0.5 MiB buckets hold 2**17 elements; backward order 3, 2, 1, 0
    q = 2**17 // 4
    s, grads = _strategy(comm, [q, q, 2 * q, 2 * q], 0.5)
    assert [b.indices for b in s.buckets] == [[3, 2], [1, 0]]
    s.begin_step(StepTimer())
    s.on_ready(3)
    assert comm.issued == []
    s.on_ready(1)
    s.on_ready(0)  # bucket 1 is full, but bucket 0 has not started: it must wait
    assert comm.issued == []
    s.on_ready(2)  # both go, in bucket order
    assert comm.issued == [4 * q, 2 * q]
    s.finish()
    for i, g in enumerate(grads):
        assert torch.equal(g, torch.full_like(g, float(i)))  # the mean over one rank


class _ScriptedTimer(StepTimer):
    """A step timer whose clock reads what the test sets."""

    t = 0.0

    def clock(self) -> float:
        return self.t


def test_auto_rebuilds_its_buckets_at_the_cap_its_probe_and_first_step_predict(monkeypatch):
    per_byte = 0.1 / (4 * MB)  # the probe: no latency, 100 ms per 4 MiB
    monkeypatch.setattr(BucketedStrategy, "_time_transfers",
                        lambda self, t, path, n: [per_byte * t.numel() * t.element_size()] * n)
    comm = _Comm(tests_needed=0)
    s, grads = _strategy(comm, [MB] * 4, "auto", order=[3, 2, 1, 0])  # 4 MiB each
    assert s.bucket_mb == 25.0 and [b.indices for b in s.buckets] == [[3], [2, 1, 0]]
    auto = s.knobs()["bucket_mb_auto"]
    assert auto == s.tuner.record  # the strategy's tuner holds its record
    assert list(auto) == ["requested", "chosen", "probe"]  # no why: every path gave a cost
    assert auto["requested"] == "auto" and auto["chosen"] is None
    assert list(auto["probe"]) == ["iallreduce"]  # --progress poll: the one path it runs
    cost = auto["probe"]["iallreduce"]["cost"]
    assert [n for n, _ in cost] == list(PROBE_BYTES)
    assert [t for _, t in cost] == pytest.approx([per_byte * n for n in PROBE_BYTES], abs=1e-6)
    for step in range(2):
        timer = _ScriptedTimer()
        timer.begin_step(step, step == 0)
        s.begin_step(timer)  # before step 1: chosen from step 0's gradient times
        for k, i in enumerate([3, 2, 1, 0]):  # one every 100 ms: a bucket each ends soonest
            timer.t = 0.1 * k
            s.on_ready(i)
        s.finish()
        for i, g in enumerate(grads):
            assert torch.equal(g, torch.full_like(g, float(i)))  # the mean over one rank
    knobs = s.knobs()
    # the record's shape, as result files and analysis/ read it
    assert list(knobs["bucket_mb_auto"]) == ["requested", "chosen", "probe", "chosen_path",
                                             "backward_s", "predicted_exposed_s",
                                             "chosen_after_steps"]
    assert list(knobs["bucket_mb_auto"]["probe"]["iallreduce"]) == ["bytes", "seconds", "cost"]
    assert knobs["bucket_mb_auto"]["backward_s"] == pytest.approx(0.3)
    assert not s.tuner.choosing and s.tuner.timed_steps == 1
    assert knobs["bucket_mb"] == 4.0 and knobs["buckets"] == 4  # 1, 2 and 4 tie: the largest
    assert knobs["bucket_mb_auto"]["chosen"] == 4.0
    assert knobs["bucket_mb_auto"]["chosen_after_steps"] == 1
    assert knobs["bucket_mb_auto"]["predicted_exposed_s"]["iallreduce"]["8"] == \
        pytest.approx(0.2)
    assert knobs["bucket_mb_auto"]["chosen_path"] == "iallreduce"
    assert comm.issued[-4:] == [MB] * 4  # step 1 ran the new buckets


def test_auto_keeps_its_cap_where_the_probe_gives_no_cost(monkeypatch):
    monkeypatch.setattr(BucketedStrategy, "_time_transfers",
                        lambda self, t, path, n: [0.01] * n)
    s, _ = _strategy(_Comm(tests_needed=0), [10, 10], "auto")
    timer = _ScriptedTimer()
    for step in range(2):
        timer.begin_step(step, False)
        s.begin_step(timer)
        s.on_ready(1)
        s.on_ready(0)
        s.finish()
    auto = s.knobs()["bucket_mb_auto"]
    assert list(auto) == ["requested", "chosen", "probe", "why", "chosen_after_steps"]
    assert auto["chosen"] is None and "give no cost" in auto["why"]["iallreduce"]
    kept = auto["probe"]["iallreduce"]  # its times stay in the record, without a cost
    assert "cost" not in kept and kept["seconds"] and len(kept["bytes"]) == len(kept["seconds"])
    assert s.bucket_mb == 25.0


def test_poll_records_the_real_in_flight_interval():
    comm = _Comm(tests_needed=3)
    s, _ = _strategy(comm, [10, 10, 10], 0)
    timer = StepTimer()
    timer.begin_step(0, False)
    s.begin_step(timer)
    for i in [2, 1, 0]:
        s.on_ready(i)
    for _ in range(5):
        s.poll()
    handles = [b.handle for b in s.buckets]
    s.finish()
    sample = timer.end_step()
    assert sample.comm_calls == 3 and sample.comm_bytes == 120
    assert not any(h.waited for h in handles)  # seen complete by poll, no wait needed
    assert s.knobs() == {"bucket_mb": 0.0, "bucket_mb_auto": None, "first_bucket_mb": 1.0,
                         "buckets": 3,
                         "bucket_bytes": [40, 40, 40],
                         "collective": "iallreduce", "progress": "poll",
                         "transfer_path": None, "bucket_paths": None, "compression": "none",
                         "cast_dtype": "float32", "staging": None, "comm_device": "cpu"}


def test_finish_waits_for_what_progress_did_not_see_complete_and_takes_unannounced_grads():
    comm = _Comm(tests_needed=10**6)
    s, grads = _strategy(comm, [10, 10, 10], 0)
    s.begin_step(StepTimer())
    s.on_ready(2)
    s.finish()  # gradients 1 and 0 were never announced
    assert comm.issued == [10, 10, 10]
    assert all(b.handle.waited for b in s.buckets)
    assert torch.equal(grads[0], torch.zeros(10))


def test_a_gradient_announced_twice_is_an_error():
    s, _ = _strategy(_Comm(), [10, 10], 0)
    s.begin_step(StepTimer())
    s.on_ready(1)
    with pytest.raises(RuntimeError, match="announced twice"):
        s.on_ready(1)


@pytest.mark.parametrize("mb", [-1, float("nan"), float("inf")])
def test_bad_bucket_size_is_refused(mb):
    with pytest.raises(ValueError, match="--bucket-mb"):
        _strategy(_Comm(), [10], mb)


def test_make_strategy_passes_bucket_knobs_only_to_strategies_that_take_them():
    grads = [torch.zeros(MB // 4) for _ in range(3)]
    s = make_strategy("bucketed", _Comm(), grads, bucket_mb=1, backward_order=[0, 1, 2])
    assert [b.indices for b in s.buckets] == [[0], [1], [2]]
    assert s.tuner is None and s.knobs()["bucket_mb_auto"] is None  # a fixed cap: no tuner
    with pytest.raises(TypeError, match="bucket_mb"):  # flat's settings have no bucket cap
        make_strategy("flat", _Comm(), grads, bucket_mb=1)


def test_the_tuner_without_gradient_times_says_why_and_chooses_nothing():
    tuner = BucketTuner(["iallreduce"], "ring")
    assert list(tuner.paths) == ["iallreduce"] and tuner.probe_bytes == PROBE_BYTES
    tuner.measure(lambda t, path, n: [1e-3 + 1e-9 * t.numel()] * n, torch.zeros(1))
    assert [n for n, _ in tuner.record["probe"]["iallreduce"]["cost"]] == list(PROBE_BYTES)
    assert not tuner.due  # no timed step yet
    tuner.end_step(StepTimer())  # a timed step whose gradients were never stamped
    assert tuner.due
    assert tuner.choose(_Comm(), [4, 4], [1, 0], [torch.float32] * 2, MB) is None
    assert tuner.record["why"] == "no gradient times were recorded"
    assert list(tuner.record) == ["requested", "chosen", "probe", "why", "chosen_after_steps"]
    assert not tuner.due and not tuner.by_size



def test_the_tuner_prices_the_engines_hand_offs():
    # the engine path's probe: 1 ms + 1 ns per byte; its hand-offs 1 ms to pick up, 2 ms to
    # hand back (the first pair warms and is dropped). Two 4 MiB gradients ready at 0 and
    # 50 ms, the first bucket capped at 1 MiB: every cap gives a bucket each. b0: idle,
    # 0 + 1 -> 6.194 ms (1 + 4.194 ms); b1: idle again at 50: 51 -> 56.194; backward ends at
    # 50: exposed 56.194 + 2 - 50 = 8.194 ms, where the link alone gives 5.194.
    tuner = BucketTuner(["ring"], "ring")
    handoffs = [(9.0, 9.0), (0.0005, 0.003), (0.001, 0.002), (0.0015, 0.001),
                (0.001, 0.002), (0.001, 0.002)]
    tuner.measure(lambda t, path, n: [1e-3 + 1e-9 * t.numel() * t.element_size()] * n,
                  torch.zeros(1), time_handoffs=lambda path, n: handoffs[:n])
    probe = tuner.record["probe"]["ring"]
    assert (probe["pickup_s"], probe["handback_s"]) == (0.001, 0.002)  # medians of five
    assert tuner.handoffs("ring") == tuner.handoffs(BY_SIZE) == (0.001, 0.002)
    assert tuner.handoffs("thread") == (0.0, 0.0)  # not probed
    tuner.ready = {0: 0.0, 1: 0.05}
    tuner.end_step(StepTimer())
    choice = tuner.choose(_Comm(), [4 * MB, 4 * MB], [0, 1], [torch.float32] * 2, MB)
    link = 1e-3 + 1e-9 * 4 * MB
    assert choice["predicted_exposed_s"]["ring"]["25"] == pytest.approx(link + 0.003,
                                                                         abs=1e-6)
    # the iallreduce path (no engine) is probed without hand-offs
    bare = BucketTuner(["iallreduce"], "ring")
    bare.measure(lambda t, path, n: [1e-3 + 1e-9 * t.numel()] * n, torch.zeros(1),
                 time_handoffs=lambda path, n: pytest.fail("no engine to hand off to"))
    assert list(bare.record["probe"]["iallreduce"]) == ["bytes", "seconds", "cost"]


class _OneRank:
    """A one-rank stand-in for the engine: each all-reduce takes 20 ms."""

    name = "stand-in"
    supports_p2p = False
    progresses_itself = False
    size, rank = 1, 0

    def dup(self):
        return self

    def allreduce(self, tensor):
        time.sleep(0.02)

    def close(self):
        pass


def test_hand_offs_leave_the_transfers_own_time_out():
    engine = TransferEngine(_OneRank(), "thread")
    fake = SimpleNamespace(_open_engine=lambda path: engine,
                           buckets=[SimpleNamespace(buffer=torch.zeros(4))])
    try:
        pairs = BucketedStrategy._time_handoffs(fake, "thread", 3)
    finally:
        engine.close()
    assert len(pairs) == 3
    for pickup, handback in pairs:  # wake-ups on an idle machine: far below the 20 ms
        assert 0 <= pickup < 0.015 and 0 <= handback < 0.015


# --- real jobs ------------------------------------------------------------------

SMALL = ["--model", "resnet18", "--steps", "2", "--warmup", "1", "--compute-ms", "20"]


@pytest.mark.mpi
# one rank: test_job_validates_every_bucket_size; a,a,b,b: the hier path too
@pytest.mark.parametrize("np_,nodes", [(2, None), (3, None), (4, "a,a,b,b")])
def test_bucketed_equals_flat_mpi(np_, nodes):
    run_check("mpirun", np_, "bucketed_vs_flat.py", "mpi", f"OK bucketed == flat on {np_} ranks",
              nodes=nodes)


@pytest.mark.torchrun
def test_bucketed_equals_flat_torch():
    run_check("torchrun", 3, "bucketed_vs_flat.py", "torch", "OK bucketed == flat on 3 ranks",
              nodes="a,a,b")


@pytest.mark.horovod
def test_bucketed_equals_flat_horovod():
    run_check("horovodrun", 2, "bucketed_vs_flat.py", "horovod", "OK bucketed == flat on 2 ranks")


def _job(launcher, np_, tmp_path, extra, **fakes):
    """(summaries by strategy, step records) of one ``commbench.allreduce`` job."""
    recs = run_tool(launcher, np_, "commbench.allreduce", extra, tmp_path / "r.jsonl",
                    **fakes).records
    return summaries(recs), of_kind(recs, "step")


def _tuner(probe: dict) -> BucketTuner:
    tuner = BucketTuner(list(probe), "ring")
    tuner.probe = probe
    return tuner


@pytest.mark.mpi
def test_by_size_prices_each_bucket_on_the_cheaper_path():
    # the ring: 0.9 ms at 64 KiB, 10 ms a MiB; Open MPI's: 0.1 ms at 64 KiB, 20 ms a MiB
    probe = {"ring": {"cost": [[2**16, 0.0009], [2**20, 0.010]]},
             "thread": {"cost": [[2**16, 0.0001], [2**20, 0.020]]}}
    costs = _tuner(probe).costs()
    assert list(costs) == ["ring", "thread", BY_SIZE]
    for n in (2**10, 2**16, 2**18, 2**20, 2**24):
        assert costs[BY_SIZE](n) == min(costs["ring"](n), costs["thread"](n))
    assert _tuner(probe).paths_by_size([2**16, 2**20]) == ["thread", "ring"]
    tie = _tuner({"thread": probe["ring"], "ring": probe["ring"]})
    assert tie.paths_by_size([2**16]) == ["ring"]  # the preferred path on a tie
    assert BY_SIZE not in _tuner({"ring": probe["ring"], "thread": None}).costs()
    no_cost = {"bytes": [2**16, 2**20], "seconds": [0.002, 0.001]}  # a probe that gave none
    assert list(_tuner({"ring": probe["ring"], "thread": no_cost}).costs()) == ["ring"]
    half = _tuner(probe)
    half.wire_ratio = 0.5  # fp16 on the wire: a bucket of 2 MiB of gradient sends 1 MiB
    assert half.costs()["ring"](2**21) == pytest.approx(costs["ring"](2**20))


# ResNet-18's gradients; the first bucket is capped at DDP's 1 MiB (fc.bias alone)
@pytest.mark.parametrize("np_,mb,buckets", [(1, 0, 62), (2, 25, 3), (3, 1000, 2), (2, 5, 11)])
def test_job_validates_every_bucket_size(tmp_path, np_, mb, buckets):
    summ, steps = _job("mpirun", np_, tmp_path, [*SMALL, "--strategy", "bucketed",
                                                 "--bucket-mb", str(mb)])
    s = summ["bucketed"]
    assert s["wrong"] == 0  # the closed-form mean, as flat must give it
    assert s["elements_checked"] == 11_689_512 * np_
    assert s["algo"] is None and s["config"]["bucket_mb"] == mb
    assert s["knobs"]["bucket_mb"] == mb and s["knobs"]["buckets"] == buckets
    assert sum(s["knobs"]["bucket_bytes"]) == s["grad_bytes"] == 11_689_512 * 4
    for r in steps:
        if r["strategy"] == "bucketed":
            assert r["comm_calls"] == buckets and r["comm_bytes"] == s["grad_bytes"]


@pytest.mark.mpi
# --transfer auto on MPI: every engine path probed (hier where nodes differ and one has two
# ranks), the one chosen runs the buckets
@pytest.mark.parametrize("transfer,np_,nodes,paths", [
    ("ring", 2, None, ["ring"]), ("auto", 2, None, ["ring", "thread"]),
    ("auto", 4, "a,a,b,b", ["ring", "thread", "hier"])])
def test_auto_job_records_its_choice_and_ddp_keeps_its_default(tmp_path, transfer, np_,
                                                               nodes, paths):
    summ, steps = _job("mpirun", np_, tmp_path, [
        "--model", "resnet18", "--steps", "2", "--warmup", "1", "--compute-ms", "60",
        "--strategy", "bucketed,ddp", "--bucket-mb", "auto", "--transfer", transfer],
        nodes=nodes)
    s, ddp = summ["bucketed"], summ["ddp"]
    assert s["wrong"] == 0 and ddp["wrong"] == 0
    assert s["config"]["bucket_mb"] == "auto"
    auto = s["knobs"]["bucket_mb_auto"]
    assert auto["chosen"] in AUTO_CAPS_MB and auto["chosen_after_steps"] == 1, auto
    assert s["knobs"]["bucket_mb"] == auto["chosen"]
    assert list(auto["probe"]) == paths
    priced = [*paths, BY_SIZE] if transfer == "auto" else paths  # by size: all at once
    assert list(auto["predicted_exposed_s"]) == priced
    assert auto["chosen_path"] in priced and auto["chosen_path"] == s["knobs"]["transfer_path"]
    by_size = s["knobs"]["bucket_paths"]
    assert (by_size is None) == (auto["chosen_path"] != BY_SIZE)
    assert by_size is None or len(by_size) == s["knobs"]["buckets"]
    for path in priced:
        assert set(auto["predicted_exposed_s"][path]) == {f"{c:g}" for c in AUTO_CAPS_MB}
    for path in paths:
        probe = auto["probe"][path]
        assert len(probe["bytes"]) == len(probe["seconds"]) == len(PROBE_BYTES) * PROBE_REPS
        assert [n for n, _ in probe["cost"]] == sorted(set(probe["bytes"]))
    # the buckets were rebuilt at the chosen cap, and the measured steps ran them
    sizes = s["knobs"]["bucket_bytes"]
    assert sum(sizes) == s["grad_bytes"] and s["knobs"]["buckets"] == len(sizes)
    assert max(sizes) <= max(auto["chosen"] * MB, 2_359_296 * 4)  # a tensor over it: alone
    measured = [r for r in steps if r["strategy"] == "bucketed" and not r["warmup"]]
    assert measured and all(r["comm_calls"] == len(sizes) for r in measured)
    assert ddp["knobs"]["bucket_cap_mb"] == 25.0  # DDP has no auto


@pytest.mark.horovod
def test_job_under_horovodrun(tmp_path):
    summ, _ = _job("horovodrun", 2, tmp_path, [*SMALL, "--strategy", "flat,bucketed",
                                               "--algo", "native", "--bucket-mb", "5"])
    s = summ["bucketed"]
    assert s["backend"] == "horovod" and s["wrong"] == 0 and s["knobs"]["buckets"] == 11
    assert s["comm_s"] > 0


@pytest.mark.mpi
def test_real_workload_trains_like_flat(tmp_path):
    summ, _ = _job("mpirun", 2, tmp_path, [
        "--workload", "real", "--model", "resnet18", "--image-size", "32", "--batch-size",
        "4", "--num-classes", "10", "--steps", "2", "--warmup", "1", "--strategy",
        "flat,bucketed", "--algo", "native", "--bucket-mb", "1"])
    flat, bucketed = summ["flat"], summ["bucketed"]
    assert bucketed["wrong"] == 0 and bucketed["knobs"]["buckets"] > 5
    a, b = bucketed["param_checksum_ranks"]
    assert a == b  # every rank stepped with the same mean gradient
    # the same seed, data and steps as flat: the same parameters, to float tolerance
    assert a == pytest.approx(flat["param_checksum_ranks"][0], rel=1e-6)


@pytest.mark.mpi
def test_overlap_is_measured_and_hides_sync(tmp_path):
    summ, steps = _job("mpirun", 2, tmp_path, [
        "--model", "resnet18", "--steps", "5", "--warmup", "1", "--compute-ms", "200",
        "--strategy", "flat,bucketed", "--algo", "native", "--bucket-mb", "5"])
    flat, bucketed = summ["flat"], summ["bucketed"]
    for r in steps:
        if r["strategy"] == "bucketed" and not r["warmup"]:
            assert r["comm_s"] > 0
            assert r["step_s"] == pytest.approx(r["compute_s"] + r["exposed_sync_s"])
    assert 0 < bucketed["overlap"] < 1
    assert bucketed["exposed_sync_s"] < flat["exposed_sync_s"]


