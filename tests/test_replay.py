"""The replayed workload as a real autograd model: every strategy and both peers on it."""

from __future__ import annotations

import statistics

import pytest
import torch

from commbench.allreduce import parse_config
from commbench.flags import ConfigError
from commbench.models import parameter_shapes
from commbench.timing import StepTimer, now
from commbench.workloads import SyntheticWorkload, Workload
from commbench.workloads.synthetic import compute_factor
from tests.conftest import run_tool

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _step(wl: SyntheticWorkload, accumulate: bool = False):
    seen: list[tuple[int, float]] = []
    timer = StepTimer()
    timer.begin_step(0, False)
    wl.forward(timer, accumulate=accumulate)
    t0 = now()
    wl.backward(timer, lambda i: seen.append((i, now() - t0)), accumulate=accumulate)
    return seen, timer.end_step()


def test_replay_model_has_the_models_parameters():
    wl = SyntheticWorkload("resnet50", 30, rank=0)
    assert isinstance(wl, Workload) and type(wl.opt) is torch.optim.SGD
    names = [(n, tuple(p.shape)) for n, p in wl.net.named_parameters()]
    assert names == [(n, tuple(s)) for n, s in parameter_shapes("resnet50", 1000)]
    assert wl.numel == 25_557_032 and wl.buffers == []


def test_backward_accumulates_each_gradient_at_its_time():
    wl = SyntheticWorkload("resnet18", 90, rank=1, seed=4)
    _step(wl)  # warm-up
    seen, sample = _step(wl)
    assert [i for i, _ in seen] == wl.backward_order  # one announcement each, in order
    for i, t in seen:  # never before its replayed time
        assert t >= wl.clock.ready_s[i] - 1e-3
    assert sample.backward_s == pytest.approx(0.060, rel=0.10)
    assert sample.forward_s == pytest.approx(0.030, rel=0.25)
    for g, v in zip(wl.grads, wl.grad_values):
        assert float(g.min()) == float(g.max()) == pytest.approx(v)
    _step(wl, accumulate=True)  # a second micro-batch adds its gradient
    assert float(wl.grads[0].view(-1)[0]) == pytest.approx(2 * wl.grad_values[0])
    before = [float(p.detach().view(-1)[0]) for p in wl.params[:3]]
    wl.optimizer_step(StepTimer())  # plain SGD on the real parameters
    after = [float(p.detach().view(-1)[0]) for p in wl.params[:3]]
    assert after == pytest.approx([b - 0.01 * 2 * v for b, v in zip(before, wl.grad_values)])


def test_slow_rank_and_jitter_scale_the_replay():
    wl = SyntheticWorkload("resnet18", 60, rank=0, slow=2.0)
    _step(wl)  # warm-up
    _, sample = _step(wl)
    assert sample.backward_s == pytest.approx(2 * 0.040, rel=0.10)
    import random

    rng = random.Random(1)
    draws = [compute_factor(1.0, 0.2, rng) for _ in range(4000)]
    assert statistics.mean(draws) == pytest.approx(1.0, abs=0.02)
    assert statistics.stdev(draws) == pytest.approx(0.2, rel=0.08)
    assert min(draws) > 0
    assert compute_factor(3.0, 0.0, rng) == 3.0


@pytest.mark.parametrize("args,flag", [
    (["--slow-rank", "1"], "--slow-rank"),
    (["--slow-rank", "1:0"], "--slow-rank"),
    (["--slow-rank", "a:2"], "--slow-rank"),
    (["--compute-jitter", "-0.1"], "--compute-jitter"),
    (["--workload", "real", "--slow-rank", "1:2"], "--slow-rank"),
    (["--workload", "real", "--compute-jitter", "0.1"], "--compute-jitter"),
])
def test_straggler_flags_bad_input(args, flag):
    with pytest.raises(ConfigError, match=flag):
        parse_config(args)


PROFILE_MS = 240  # replayed compute per step: long enough to measure, short enough to test


@pytest.mark.parametrize("launcher,strategies", [
    ("horovodrun", "flat,bucketed,hierarchical,async,horovod,ddp"),
    ("mpirun", "flat,bucketed,hierarchical,async,ddp"),
])
def test_every_strategy_and_peer_on_the_replay(tmp_path, launcher, strategies):
    """Peers run unchanged on replayed compute: right sums, ranks in lock-step, their
    hooks fire during backward, and backward takes its replayed time."""
    run = run_tool(launcher, 2, "commbench.allreduce", [
        "--model", "resnet18", "--strategy", strategies, "--algo", "native", "--staleness",
        "1", "--bucket-mb", "4", "--compute-ms", str(PROFILE_MS), "--steps", "3",
        "--warmup", "1"], tmp_path / "r.jsonl", timeout=400)
    summaries = {r["strategy"]: r for r in run.records if r["kind"] == "summary"}
    assert set(summaries) == set(strategies.split(","))
    sync = set(summaries) - {"async"}
    for name, s in summaries.items():
        assert s["workload"] == "synthetic" and s["wrong"] == 0 and s["elements_checked"] > 0
        a, b = s["param_checksum_ranks"]
        assert a == b and a != 0, name  # updated, and the same on both ranks
        assert s["backward_s"] == pytest.approx(PROFILE_MS / 1e3 * 2 / 3, rel=0.10), name
    # synchronous strategies apply the same mean gradients: the same parameters
    assert len({summaries[n]["param_checksum_ranks"][0] for n in sync}) == 1
    if "horovod" in summaries:  # every gradient's all-reduce started by Horovod's hooks
        k = summaries["horovod"]["knobs"]
        assert k["grads_hooked_in_backward"] == summaries["horovod"]["grad_tensors"]
    k = summaries["ddp"]["knobs"]  # DDP's buckets started before backward ended
    assert k["buckets_per_step"] > 2 and k["buckets_before_last_grad"] >= k["buckets_per_step"] - 1


def test_a_held_gradient_is_computed_no_earlier_than_its_hold():
    """``hold`` (the FSDP2 peer's, as a unit's parameters arrive while the host is behind
    the replay's device): the held gradient's computation begins at the hold, so it is due
    that much later, and the rest of backward's schedule moves with it; the step's
    backward compute stays the replayed one (the wait is sync)."""
    wl = SyntheticWorkload("resnet18", 90, rank=1, seed=4)
    _step(wl)  # warm-up
    order, ready = wl.backward_order, wl.clock.ready_s
    held = order[10]
    hold: list[float] = []
    seen: list[tuple[int, float]] = []

    def on_ready(i: int) -> None:
        if i == order[0]:
            hold.append(now() + 0.05)
            wl.hold([held], hold[0])
        seen.append((i, now()))

    timer = StepTimer()
    timer.begin_step(0, False)
    wl.forward(timer)
    wl.backward(timer, on_ready)
    at = dict(seen)
    reached = max(ready[j] for j in order[:10])  # where the held one's computation begins
    assert at[held] >= hold[0] + (ready[held] - reached) * wl.factor - 1e-3
    last = order[-1]
    assert at[last] >= hold[0] + (ready[last] - reached) * wl.factor - 1e-3
    assert timer.end_step().backward_s == pytest.approx(0.060, rel=0.10)
