"""ZeRO-1 and ZeRO-2: the shard arithmetic, the step on one rank against torch's SGD, what
they refuse, and the same parameters as flat under every launcher (uneven nodes
included)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from commbench.allreduce import parse_config
from commbench.comm.placement import TensorPlacement
from commbench.flags import ConfigError
from commbench.strategies import STRATEGIES, make_strategy
from commbench.strategies.zero import (
    SGDHyper,
    Zero1Settings,
    Zero2Settings,
    _BufferPool,
    library_bytes,
    shard_counts,
)
from commbench.timing import StepTimer
from tests.conftest import of_kind, run_check, run_tool, same_parameters_as_flat, summaries

# --- the shard arithmetic ------------------------------------------------------------------


def test_shards_tile_a_bucket_and_fewer_elements_than_ranks_leave_some_empty():
    assert shard_counts(10, 4) == [3, 3, 2, 2]
    assert shard_counts(3, 4) == [1, 1, 1, 0]  # a zero-length shard
    assert shard_counts(1, 3) == [1, 0, 0]
    assert shard_counts(8, 1) == [8]
    for numel in range(40):
        for ranks in range(1, 9):
            counts = shard_counts(numel, ranks)
            assert len(counts) == ranks and sum(counts) == numel
            assert max(counts) - min(counts) <= 1 and counts == sorted(counts, reverse=True)


def test_each_rank_hands_over_the_other_ranks_parts_twice():
    # even shards: 2Ψ(n−1)/n a rank, what a ring all-reduce hands over (ZeRO §7)
    assert [library_bytes([1000], 4, r, 4) for r in range(4)] == [6000] * 4
    # one element on 4 ranks: rank 0 owns it and sends nothing, the others receive it
    assert [library_bytes([1], 4, r, 4) for r in range(4)] == [0, 8, 8, 8]
    numels = [1, 3, 1009, 4096, 7]
    for ranks in (1, 2, 3, 5):
        total = sum(library_bytes(numels, ranks, r, 2) for r in range(ranks))
        assert total == 2 * (ranks - 1) * sum(numels) * 2


# --- one rank: the step is torch's SGD on the shard -------------------------------------


class _OneRank:
    """A job of one rank: its engine's communicator and world group are itself."""

    name = "one rank"
    rank, size = 0, 1
    supports_p2p = False
    progresses_itself = False

    def __init__(self, device: str = "cpu") -> None:
        self._placement = TensorPlacement("mpi", torch.device(device))

    def placement(self) -> TensorPlacement:
        return self._placement

    def dup(self) -> _OneRank:
        return self

    def world_group(self) -> _OneRank:
        return self

    def allreduce(self, tensor: torch.Tensor) -> None:
        pass

    def reduce_scatter_v(self, tensor: torch.Tensor, counts: list[int]) -> torch.Tensor:
        return tensor.clone()

    def allgather_v(self, part: torch.Tensor, counts: list[int], out: torch.Tensor) -> None:
        out.copy_(part)

    def close(self) -> None:
        pass


SHAPES = [(3,), (4, 5), (1,), (7,), (2, 3, 2)]


def _model(sgd: dict, seed: int = 0) -> SimpleNamespace:
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]
    return SimpleNamespace(params=params, opt=torch.optim.SGD(params, **sgd))


def _step(zero, wl, grads, values, step):
    for g, v in zip(grads, values):
        g.copy_(v)
    timer = StepTimer()
    timer.begin_step(step, False)
    zero.begin_step(timer)
    for i in zero.backward_order:
        zero.on_ready(i)
    zero.finish()
    wl.opt.step()  # as the workload steps: nothing left to do
    return timer.end_step()


@pytest.mark.parametrize("name", ["zero1", "zero2"])
@pytest.mark.parametrize("sgd", [{"lr": 0.1},
                                 {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3},
                                 {"lr": 0.05, "momentum": 0.8, "nesterov": True},
                                 {"lr": 0.05, "momentum": 0.5, "dampening": 0.3}],
                         ids=["sgd", "momentum-wd", "nesterov", "dampening"])
def test_one_rank_steps_the_parameters_as_torchs_sgd(name, sgd):
    ref, wl = _model(sgd), _model(sgd)
    grads = [torch.empty(s) for s in SHAPES]
    # 40 bytes a bucket: several buckets, a tensor larger than that alone
    zero = make_strategy(name, _OneRank(), grads, bucket_mb=40 / 2**20, first_bucket_mb=0,
                         workload=wl)
    buckets = zero.knobs()["buckets"]
    assert 1 < buckets < len(SHAPES)
    gen = torch.Generator().manual_seed(1)
    for step in range(4):
        values = [torch.randn(s, generator=gen) for s in SHAPES]
        sample = _step(zero, wl, grads, values, step)
        for p, v in zip(ref.params, values):
            p.grad = v.clone()
        ref.opt.step()
        for p, q in zip(wl.params, ref.params):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)
        # one reduce-scatter and one all-gather a bucket, each kind's time apart
        assert sample.comm_calls == len(sample.collective_s) == 2 * buckets
        assert set(sample.comm_phases) == {"reduce_scatter", "allgather"}
        assert sample.comm_bytes == sum(g.numel() * 4 for g in grads)  # once: busbw as DDP's
    # the parameters are views of the buckets' flat buffers: the all-gather writes them
    flats = [b.params.flat for b in zero.buckets]
    for p in wl.params:
        assert any(f.data_ptr() <= p.data_ptr() < f.data_ptr() + f.numel() * 4 for f in flats)
    knobs = zero.knobs()
    assert knobs["stage"] == int(name[-1]) and knobs["library_bytes_per_step_ranks"] == [0]
    assert knobs["optimizer"]["momentum"] == sgd.get("momentum", 0)
    zero.close()


class _Finished:
    """A reduce-scatter in flight whose ``wait`` returns once ``gives`` (if any) is back."""

    def __init__(self, pool: _BufferPool, gives: torch.Tensor | None) -> None:
        self.pool, self.gives = pool, gives

    def wait(self) -> None:
        if self.gives is not None:
            self.pool.give(self.gives)


def test_zero2_pool_waits_on_until_a_buffer_is_free_before_making_one():
    # The oldest reduce-scatter in flight may have given its buffer back (and that buffer been
    # lent again) in the moment before it counts as done: waiting on it frees nothing. The
    # pool waits for the next one in flight rather than making a third buffer (the CI race).
    pool = _BufferPool(4, torch.float32, 2)
    a, b = pool.take(lambda: None), pool.take(lambda: None)
    in_flight = [_Finished(pool, None), _Finished(pool, b)]
    assert pool.take(lambda: in_flight.pop(0)) is b
    assert (pool.made, pool.waits) == (2, 1) and not in_flight
    # where none is in flight, every buffer is in a bucket still filling: a new one
    c = pool.take(lambda: None)
    assert all(c is not x for x in (a, b)) and pool.made == 3


def test_each_step_records_what_the_strategy_holds_of_the_model_state():
    """model_state_bytes_peak on one rank (every shard is the whole bucket): the whole
    parameters, the parameter, gradient and momentum shards, and the gradient buffers."""
    grad_bytes = sum(4 * math.prod(s) for s in SHAPES)
    held = {}
    for name in ("zero1", "zero2"):
        grads = [torch.empty(s) for s in SHAPES]
        wl = _model({"lr": 0.1, "momentum": 0.9})
        zero = make_strategy(name, _OneRank(), grads, bucket_mb=0, workload=wl)
        assert zero.record_fields("step") == {"model_state_bytes_peak": 0}  # no step yet
        steps = []
        for step in range(2):
            _step(zero, wl, grads, [torch.ones(s) for s in SHAPES], step)
            steps.append(zero.record_fields("step"))
        held[name] = steps[-1]["model_state_bytes_peak"]
        assert held[name] == 4 * grad_bytes + zero.knobs()["grad_buffer_bytes"]
        assert zero.record_fields("summary", steps) == {"model_state_bytes_peak": held[name]}
        zero.close()
    assert held == {"zero1": 5 * grad_bytes, "zero2": 4 * grad_bytes + 2 * 20 * 4}


def test_zero1_holds_the_whole_gradient_and_zero2_two_buffers_of_the_largest_bucket():
    held = {}
    for name in ("zero1", "zero2"):
        grads = [torch.empty(s) for s in SHAPES]
        wl = _model({"lr": 0.1})
        zero = make_strategy(name, _OneRank(), grads, bucket_mb=0, workload=wl)  # a tensor each
        for step in range(3):  # gradients in backward order: two buffers take turns
            _step(zero, wl, grads, [torch.ones(s) for s in SHAPES], step)
        held[name] = zero.knobs()["grad_buffer_bytes"]
        zero.close()
    # zero2: two buffers of the largest tensor's 20 elements
    assert held == {"zero1": sum(4 * g.numel() for g in grads), "zero2": 2 * 20 * 4}
    # where two of the largest bucket hold the whole gradient or more, a buffer per bucket
    wl = _model({"lr": 0.1})
    zero = make_strategy("zero2", _OneRank(), [torch.empty(s) for s in SHAPES],
                         bucket_mb=100 / 2**20, first_bucket_mb=0, workload=wl)
    assert zero.knobs()["grad_buffer_bytes"] == held["zero1"]
    zero.close()


def test_the_workloads_optimizer_must_be_sgd_and_the_model_on_the_host():
    wl = SimpleNamespace(params=[torch.nn.Parameter(torch.zeros(3))])
    wl.opt = torch.optim.Adam(wl.params)
    with pytest.raises(ValueError, match="--strategy zero1 steps SGD on its shard; the "
                                         "workload's optimizer is Adam"):
        make_strategy("zero1", _OneRank(), [torch.zeros(3)], workload=wl)
    with pytest.raises(ValueError, match="--strategy zero2 wraps the workload's model"):
        make_strategy("zero2", _OneRank(), [torch.zeros(3)])
    with pytest.raises(ValueError, match="--strategy zero2 keeps its buckets and shards in "
                                         "host memory.*cuda"):
        STRATEGIES["zero2"].check(_OneRank("cuda"), "native")
    opt = torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(1))]},
                           {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 1.0}], lr=0.1)
    with pytest.raises(ValueError, match="2 parameter groups"):
        SGDHyper.of(opt, "zero1")


# --- what a stage cannot honour: refused, naming the pair -------------------------------


@pytest.mark.parametrize("cls,fields,names", [
    (Zero1Settings, {"compression": "fp16"}, ("--strategy zero1", "--compression fp16")),
    (Zero2Settings, {"compression": "bf16"}, ("--strategy zero2", "--compression bf16")),
    (Zero2Settings, {"accum_steps": 2}, ("--strategy zero2", "--accum-steps 2", "zero1")),
    (Zero1Settings, {"bucket_mb": "auto"}, ("--strategy zero1", "--bucket-mb auto")),
    (Zero2Settings, {"first_bucket_mb": float("inf")}, ("--first-bucket-mb",)),
])
def test_what_a_stage_cannot_honour_is_refused_naming_the_pair(cls, fields, names):
    with pytest.raises(ValueError) as e:
        cls(**fields)
    assert all(n in str(e.value) for n in names), str(e.value)


def test_zero1_honours_accum_steps_and_a_job_is_refused_before_it_runs():
    assert Zero1Settings(accum_steps=4).accum_steps == 4
    assert parse_config(["--strategy", "flat,zero1", "--accum-steps", "4"]).sync.accum_steps == 4
    with pytest.raises(ConfigError, match="--strategy zero2 with --accum-steps 4"):
        parse_config(["--strategy", "flat,zero2", "--accum-steps", "4"])
    with pytest.raises(ConfigError, match="--strategy zero1 with --bucket-mb auto"):
        parse_config(["--strategy", "bucketed,zero1", "--bucket-mb", "auto"])


# --- under the launchers: the same parameters as flat + SGD ------------------------------

OK = "OK zero1, zero2 == flat + SGD on {} ranks"


@pytest.mark.mpi
@pytest.mark.parametrize("np_,nodes", [(2, None), (3, "a,a,b"), (4, "a,b,b,b")])
def test_zero_equals_flat_mpi(np_, nodes):
    run_check("mpirun", np_, "zero_vs_flat.py", "mpi", OK.format(np_), nodes=nodes,
              timeout=300)


@pytest.mark.torchrun
def test_zero_equals_flat_torch():
    run_check("torchrun", 3, "zero_vs_flat.py", "torch", OK.format(3), nodes="a,a,b",
              timeout=300)


@pytest.mark.horovod
# the world group: MPI_COMM_WORLD's twin under Horovod's MPI controller; under Gloo its
# global process set (reduce-scatter by hvd.alltoall, all-gather by hvd.allgather)
@pytest.mark.parametrize("launcher", ["horovodrun", "horovodrun-gloo"])
def test_zero_equals_flat_horovod(launcher):
    run_check(launcher, 2, "zero_vs_flat.py", "horovod", OK.format(2), timeout=300)


SMALL = ["--model", "resnet18", "--steps", "2", "--warmup", "1", "--compute-ms", "20",
         "--bucket-mb", "5", "--algo", "native"]


@pytest.mark.parametrize("launcher,np_,nodes", [
    pytest.param("mpirun", 4, "a,a,b,b", marks=pytest.mark.mpi),
    pytest.param("torchrun", 3, "a,a,b", marks=pytest.mark.torchrun)])
def test_ring_forms_step_as_flat(tmp_path, launcher, np_, nodes):
    # --algo ring: the project's ring reduce-scatter and all-gather (comm.p2pcoll) in place
    # of the backend's; flat runs its ring all-reduce beside them
    args = [a if a != "native" else "ring" for a in SMALL]
    recs = run_tool(launcher, np_, "commbench.allreduce",
                    [*args, "--strategy", "flat,zero1,zero2"], tmp_path / "r.jsonl",
                    nodes=nodes, timeout=300).records
    summ = summaries(recs)
    same_parameters_as_flat(summ, "zero1", "zero2")
    for name in ("zero1", "zero2"):
        assert summ[name]["algo"] == "ring" and summ[name]["knobs"]["algo"] == "ring"
        assert "ring" in summ[name]["knobs"]["collective"]


@pytest.mark.horovod
def test_ring_forms_under_horovodrun_step_as_flat(tmp_path):
    # Horovod's MPI controller: the ring's messages on MPI_COMM_WORLD's twin
    recs = run_tool("horovodrun", 2, "commbench.allreduce",
                    [*SMALL[:-1], "ring", "--strategy", "flat,zero1"], tmp_path / "r.jsonl",
                    timeout=300).records
    summ = summaries(recs)
    same_parameters_as_flat(summ, "zero1")
    assert summ["zero1"]["algo"] == "ring"


@pytest.mark.parametrize("launcher,np_,nodes", [
    pytest.param("mpirun", 3, "a,a,b", marks=pytest.mark.mpi),
    pytest.param("torchrun", 3, "a,a,b", marks=pytest.mark.torchrun)])
def test_jobs_step_as_flat_and_record_both_collectives(tmp_path, launcher, np_, nodes):
    recs = run_tool(launcher, np_, "commbench.allreduce",
                    [*SMALL, "--strategy", "flat,zero1,zero2"], tmp_path / "r.jsonl",
                    nodes=nodes, timeout=300).records
    summ = summaries(recs)
    same_parameters_as_flat(summ, "zero1", "zero2")
    grad_bytes = summ["flat"]["grad_bytes"]
    for name in ("zero1", "zero2"):
        k = summ[name]["knobs"]
        assert k["stage"] == int(name[-1]) and sum(k["bucket_bytes"]) == grad_bytes
        # 2Ψ(n−1)/n a rank, the ranks together 2(n−1)Ψ
        assert sum(k["library_bytes_per_step_ranks"]) == 2 * (np_ - 1) * grad_bytes
        assert set(summ[name]["comm_phases_s"]) == {"reduce_scatter", "allgather"}
        steps = [r for r in of_kind(recs, "step") if r["strategy"] == name]
        assert steps and all(r["comm_calls"] == 2 * k["buckets"] for r in steps)
        assert all(r["comm_bytes"] == grad_bytes for r in steps)


@pytest.mark.mpi
def test_real_model_with_momentum_and_zero1_with_accumulation_step_as_flat(tmp_path):
    real = ["--workload", "real", "--model", "resnet18", "--image-size", "32",
            "--batch-size", "4", "--num-classes", "10", "--steps", "2", "--warmup", "1",
            "--algo", "native", "--bucket-mb", "1"]
    summ = summaries(run_tool("mpirun", 2, "commbench.allreduce",
                              [*real, "--strategy", "flat,zero1,zero2"], tmp_path / "r.jsonl",
                              timeout=300).records)
    same_parameters_as_flat(summ, "zero1", "zero2")
    assert summ["zero1"]["knobs"]["optimizer"]["momentum"] == 0.9
    summ = summaries(run_tool("mpirun", 2, "commbench.allreduce",
                              [*SMALL, "--strategy", "flat,zero1", "--accum-steps", "2"],
                              tmp_path / "accum.jsonl", timeout=300).records)
    same_parameters_as_flat(summ, "zero1")
