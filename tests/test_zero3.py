"""ZeRO-3: the byte arithmetic, one rank's steps against torch's SGD with the parameters
sharded at rest and gathered per unit, what it refuses, and the same parameters as flat
under every launcher (uneven nodes included) and in whole jobs."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from commbench.allreduce import parse_config
from commbench.flags import ConfigError
from commbench.models.units import ROOT, unit_names
from commbench.strategies import make_strategy
from commbench.strategies.zero3 import Zero3Settings, library_bytes
from commbench.timing import StepTimer
from commbench.workloads import RealWorkload, SyntheticWorkload
from commbench.workloads.compute_profile import load
from tests.conftest import (
    of_kind,
    run_check,
    run_tool,
    same_parameters_as_flat,
    summaries,
)
from tests.test_forward_units import R50, with_units
from tests.test_zero import _OneRank

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# --- the byte arithmetic -------------------------------------------------------------------


def test_each_rank_hands_over_the_other_ranks_parts_three_times():
    # even shards: 3Ψ(n−1)/n a rank, 1.5x a ring all-reduce's (ZeRO §7.2)
    assert [library_bytes([1000], 4, r, 4) for r in range(4)] == [9000] * 4
    # one element on 4 ranks: rank 0 owns it, the others count it three times (received
    # in two gathers, and its part of the reduce-scatter's input sent to rank 0)
    assert [library_bytes([1], 4, r, 4) for r in range(4)] == [0, 12, 12, 12]
    numels = [1, 3, 1009, 4096, 7]
    for ranks in (1, 2, 3, 5):
        total = sum(library_bytes(numels, ranks, r, 2) for r in range(ranks))
        assert total == 3 * (ranks - 1) * sum(numels) * 2
        # the first unit (a root kept gathered from forward to backward) counted twice
        kept = sum(library_bytes(numels, ranks, r, 2, [2, 3, 3, 3, 3]) for r in range(ranks))
        assert kept == total - (ranks - 1) * numels[0] * 2


# --- one rank: gathered per unit, freed at rest, stepped as torch's SGD ------------------


def _step(wl, strategy, k: int):
    timer = StepTimer()
    timer.begin_step(k, False)
    strategy.begin_step(timer)
    wl.forward(timer)
    wl.backward(timer, strategy.on_ready)
    strategy.finish()
    wl.optimizer_step(timer)
    return timer.end_step()


class _Plain:
    """No sync: the workload's own SGD on one rank (the reference)."""

    def begin_step(self, timer) -> None:
        pass

    def on_ready(self, i: int) -> None:
        pass

    def finish(self) -> None:
        pass


@pytest.mark.parametrize("prefetch,group,reshard_root", [
    ("on", "shared", "on"), ("off", "shared", "on"), ("on", "separate", "on"),
    ("off", "separate", "on"), ("on", "shared", "off"), ("off", "separate", "off")])
def test_one_rank_gathers_each_unit_for_its_passes_and_steps_as_sgd(prefetch, group,
                                                                     reshard_root):
    """gpt-tiny (two blocks, the embedding tied to the head: the root's): each unit is
    whole while its forward runs and freed between steps; the root gathered once a step
    where it is kept from forward to backward; the parameters follow torch's SGD with
    momentum step for step."""
    ref = RealWorkload("gpt-tiny", rank=0, batch_size=2)
    wl = RealWorkload("gpt-tiny", rank=0, batch_size=2)
    zero = make_strategy("zero3", _OneRank(), wl.grads, backward_order=wl.backward_order,
                         workload=wl, prefetch=prefetch, reduce_scatter_group=group,
                         reshard_root=reshard_root)
    units = {u.path: u for u in zero.units}
    assert list(units) == [ROOT, "transformer.h.0", "transformer.h.1"]
    assert wl.param_names.index("transformer.wte.weight") in units[ROOT].indices
    whole = []  # (unit, bytes of its parameters' storage) as its forward runs
    for path in units:
        if path:  # registered after the strategy's hook: runs after it
            wl.net.get_submodule(path).register_forward_pre_hook(
                lambda _m, _a, path=path: whole.append(
                    (path, units[path].storage().nbytes())))
    for k in range(3):
        _step(ref, _Plain(), k)
        sample = _step(wl, zero, k)
        assert all(u.storage().nbytes() == 0 for u in zero.units)  # sharded at rest
        assert all(u.grad_storage().nbytes() == 0 for u in zero.units)  # gradients too
        # two gathers and one reduce-scatter a unit (a kept root: one gather), each kind's
        # time apart
        assert sample.comm_calls == 3 * len(units) - (reshard_root == "off")
        assert set(sample.comm_phases) == {"allgather", "reduce_scatter"}
    assert whole == [(u.path, u.nbytes) for _ in range(3) for u in zero.units if u.path]
    zero.finish_run()
    for name, p, q in zip(wl.param_names, wl.params, ref.params):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6, msg=name)
    knobs = zero.knobs()
    assert knobs["library_bytes_per_step_ranks"] == [0]
    assert knobs["prefetch"] == prefetch and knobs["reduce_scatter_group"] == group
    assert knobs["reshard_root"] == reshard_root
    assert knobs["optimizer"]["momentum"] == 0.9
    assert zero.record_fields("step")["model_state_bytes_peak"] > 0
    zero.close()


def test_a_closed_run_leaves_nothing_alive():
    """A job runs its runs one after another in one process: once a run's strategy is
    closed and let go, its workload (the model, its gradients) and the strategy are freed.
    Autograd holds the workload's gradient hooks and zero3's output hooks in C++, out of
    the garbage collector's sight, so a hook that held either kept both for good (a
    ResNet-50 job of nine runs on 8 ranks met the OOM killer at 24 GiB)."""
    import gc
    import weakref

    wl = RealWorkload("gpt-tiny", rank=0, batch_size=2)
    zero = make_strategy("zero3", _OneRank(), wl.grads, backward_order=wl.backward_order,
                         workload=wl)
    for k in range(2):
        _step(wl, zero, k)
    zero.finish_run()
    zero.close()
    gone = [weakref.ref(wl), weakref.ref(zero)]
    del wl, zero
    gc.collect()
    assert [r() for r in gone] == [None, None]


def test_a_units_gradient_buffer_is_whole_from_its_backward_to_its_reduce_scatter(tmp_path):
    """Gradients sharded at rest (FSDP frees the unsharded gradient after its
    reduce-scatter): a unit's flat gradient buffer is made as its backward begins and
    freed once reduce-scattered, so the step's peak holds far less than every unit's
    parameters and gradients whole; the replay fills the buffers it is handed."""
    prof = load(with_units(R50, tmp_path / "r50.json"), "resnet50", 1000)
    wl = SyntheticWorkload("resnet50", 0, rank=0, profile=prof, compute_scale=0.02)
    zero = make_strategy("zero3", _OneRank(), wl.grads, backward_order=wl.backward_order,
                         workload=wl)
    made = []  # (unit, its gradient buffer's bytes) as its first gradient is announced
    on_ready = zero.on_ready

    def watch(i: int) -> None:
        u = zero._unit_of[i]
        if u.pending == set(u.indices):
            made.append((u.path, u.grad_storage().nbytes()))
        on_ready(i)

    zero.on_ready = watch
    for k in range(2):
        _step(wl, zero, k)
        assert all(u.grad_storage().nbytes() == 0 for u in zero.units)
    assert sorted(made) == sorted((u.path, u.grads.nbytes) for _ in range(2)
                                  for u in zero.units)
    knobs = zero.knobs()["model_state_bytes"]
    held = zero.record_fields("step")["model_state_bytes_peak"] - knobs["shard_bytes"]
    whole = sum(u.nbytes for u in zero.units)
    largest, root = knobs["largest_unit_bytes"], knobs["root_unit_bytes"]
    # less than the parameters alone (flat holds them and the gradients whole); at most
    # 2 x the largest unit's parameters + its gradients, the root's parameters and
    # gradients (whole through backward) and one reduce-scatter's buffer in flight
    # (ResNet-50: the root, layer4.1 and layer4.0 prefetched; the root's, layer4.1's and
    # layer4.2's gradients)
    assert largest < held < whole
    assert held <= 2 * root + 4 * largest
    zero.finish_run()  # whole again for the validation pass, which writes them
    assert all(u.grad_storage().nbytes() == u.grads.nbytes for u in zero.units)
    zero.close()


def test_the_replay_runs_unit_by_unit_under_zero3(tmp_path):
    """The replay with per-unit forward times (ResNet-50's bottlenecks): each unit's
    module is a unit of zero3; without them the model is one root unit."""
    prof = load(with_units(R50, tmp_path / "r50.json"), "resnet50", 1000)
    wl = SyntheticWorkload("resnet50", 0, rank=0, profile=prof, compute_scale=0.05)
    zero = make_strategy("zero3", _OneRank(), wl.grads, backward_order=wl.backward_order,
                         workload=wl)
    assert [u.path for u in zero.units] == [ROOT] + [u.name for u in wl.forward_units[1:]]
    sample = _step(wl, zero, 0)
    assert sample.comm_calls == 3 * 17
    zero.close()
    plain = SyntheticWorkload("resnet18", 30, rank=0)
    zero = make_strategy("zero3", _OneRank(), plain.grads,
                         backward_order=plain.backward_order, workload=plain)
    assert [u.path for u in zero.units] == [ROOT]
    zero.close()


class _SlowRank(_OneRank):
    """One rank whose all-gathers take ``GATHER_S`` (a slow link), so that a unit waits."""

    def allgather_v(self, part: torch.Tensor, counts: list[int], out: torch.Tensor) -> None:
        time.sleep(GATHER_S)
        super().allgather_v(part, counts, out)


GATHER_S = 0.01


def test_a_units_wait_for_its_gather_is_exposed_sync_not_compute(tmp_path):
    """Prefetch off on a slow link: every unit waits for its gather before its forward and
    again before its backward. Those waits are sync: forward and backward compute stay
    the profile's, and the exposed sync holds both passes' waits."""
    prof = load(with_units(R50, tmp_path / "r50.json"), "resnet50", 1000)
    wl = SyntheticWorkload("resnet50", 0, rank=0, profile=prof, compute_scale=0.5)
    zero = make_strategy("zero3", _SlowRank(), wl.grads, backward_order=wl.backward_order,
                         workload=wl, prefetch="off")
    waits = 2 * len(zero.units)  # each unit's, the root's too, in forward and in backward
    _step(wl, zero, 0)  # warm-up
    sample = _step(wl, zero, 1)
    assert sample.forward_s == pytest.approx(wl.forward_s * wl.factor, abs=0.02)
    assert sample.backward_s == pytest.approx(wl._backward_s * wl.factor, abs=0.02)
    assert sample.exposed_sync_s >= 0.9 * waits * GATHER_S
    zero.close()


# --- what it refuses, naming the pair -----------------------------------------------------


def test_a_tie_split_across_units_is_refused_naming_the_pair():
    net = nn.Module()
    net.blocks = nn.ModuleList(nn.Sequential(nn.Linear(2, 2)) for _ in range(2))
    # two Parameters on one storage, one in each unit: each unit would step its own copy
    net.blocks[1][0].weight = nn.Parameter(net.blocks[0][0].weight.data)
    named = list(net.named_parameters())
    params = [p for _, p in named]
    for p in params:
        p.grad = torch.zeros_like(p)
    wl = SimpleNamespace(net=net, params=params, param_names=[n for n, _ in named],
                         opt=torch.optim.SGD(params, lr=0.1), unit_paths=unit_names(net))
    with pytest.raises(ValueError, match=r"blocks\.0\.0\.weight \(unit blocks\.0\) and "
                                         r"blocks\.1\.0\.weight \(unit blocks\.1\) share "
                                         "memory"):
        make_strategy("zero3", _OneRank(), [p.grad for p in params], workload=wl)


@pytest.mark.mpi
def test_a_job_with_a_tie_split_across_units_exits_2_before_writing(tmp_path):
    """The same refusal in a job: on every rank, before the job writes anything."""
    out = tmp_path / "r.jsonl"
    res = run_tool("mpirun", 2, "commbench.allreduce",
                   ["--workload", "real", "--model", "tests.models_for_tests:split_tie",
                    "--input-shape", "8", "--steps", "1", "--warmup", "0",
                    "--strategy", "zero3"], out, expect_rc=2, timeout=120)
    assert "blocks.0.0.weight (unit blocks.0) and blocks.1.0.weight (unit blocks.1) " \
           "share memory" in res.stderr
    assert not out.exists()


def test_what_it_cannot_honour_is_refused_and_its_options_are_flags():
    with pytest.raises(ValueError, match="--strategy zero3 with --compression fp16"):
        Zero3Settings(compression="fp16").check_steps(10)
    with pytest.raises(ValueError, match="--strategy zero3 with --compression fp16"):
        make_strategy("zero3", _OneRank(), [torch.zeros(1)], compression="fp16",
                      workload=SimpleNamespace())
    # it declares --prefetch, so every job makes its settings: a job without zero3 compresses
    assert parse_config(["--strategy", "flat", "--compression", "fp16"]).sync.compression \
        == "fp16"
    with pytest.raises(ConfigError, match="--strategy zero3 with --compression bf16"):
        parse_config(["--strategy", "flat,zero3", "--compression", "bf16"])
    cfg = parse_config(["--strategy", "zero3", "--prefetch", "off",
                        "--reduce-scatter-group", "separate", "--accum-steps", "2",
                        "--reshard-root", "off"])
    s = cfg.sync.settings("zero3")
    assert (s.prefetch, s.reduce_scatter_group, s.accum_steps, s.reshard_root) == \
        ("off", "separate", 2, "off")
    assert parse_config(["--strategy", "zero3"]).sync.settings("zero3").reshard_root == "on"
    with pytest.raises(ConfigError, match="--reshard-root: invalid choice: 'maybe'"):
        parse_config(["--strategy", "zero3", "--reshard-root", "maybe"])
    with pytest.raises(ConfigError, match="--prefetch: invalid choice: 'sometimes'"):
        parse_config(["--strategy", "zero3", "--prefetch", "sometimes"])


# --- under the launchers: the same parameters as flat + SGD ------------------------------

OK = "OK zero3 == flat + SGD on {} ranks"


@pytest.mark.mpi
@pytest.mark.parametrize("np_,nodes", [(2, None), (4, "a,a,a,b")])
def test_zero3_equals_flat_mpi(np_, nodes):
    run_check("mpirun", np_, "check_zero3.py", "mpi", OK.format(np_), nodes=nodes,
              timeout=300)


@pytest.mark.torchrun
def test_zero3_equals_flat_torch():
    run_check("torchrun", 3, "check_zero3.py", "torch", OK.format(3), nodes="a,a,b",
              timeout=300)


@pytest.mark.horovod
@pytest.mark.parametrize("launcher", ["horovodrun", "horovodrun-gloo"])
def test_zero3_equals_flat_horovod(launcher):
    run_check(launcher, 2, "check_zero3.py", "horovod", OK.format(2), timeout=300)


@pytest.mark.mpi
def test_jobs_step_as_flat_and_record_the_gathers(tmp_path):
    """Whole jobs on 3 ranks (nodes of 2 + 1): the real gpt-tiny (tied weights) with
    momentum and accumulation, its root kept from forward to backward, and the replay unit
    by unit; the records carry both collectives' times, 1.5x the gradient's bytes (less a
    kept root's second gather), and the model state's peak."""
    real = ["--workload", "real", "--model", "gpt-tiny", "--batch-size", "2", "--steps", "2",
            "--warmup", "1", "--algo", "native", "--accum-steps", "2"]
    recs = run_tool("mpirun", 3, "commbench.allreduce",
                    [*real, "--strategy", "flat,zero3", "--reduce-scatter-group", "separate",
                     "--reshard-root", "off"],
                    tmp_path / "real.jsonl", nodes="a,a,b", timeout=300).records
    summ = summaries(recs)
    same_parameters_as_flat(summ, "zero3")
    k = summ["zero3"]["knobs"]
    assert k["units"][0] == "" and k["reshard_root"] == "off"
    assert sum(k["library_bytes_per_step_ranks"]) == \
        2 * (3 * summ["flat"]["grad_bytes"] - k["unit_bytes"][0])
    prof = with_units(R50, tmp_path / "r50.json")
    recs = run_tool("mpirun", 3, "commbench.allreduce",
                    ["--model", "resnet50", "--compute-profile", str(prof),
                     "--compute-scale", "0.05", "--steps", "2", "--warmup", "1",
                     "--strategy", "flat,zero3", "--algo", "native", "--prefetch", "off"],
                    tmp_path / "replay.jsonl", nodes="a,a,b", timeout=300).records
    summ = summaries(recs)
    same_parameters_as_flat(summ, "zero3")
    grad_bytes = summ["flat"]["grad_bytes"]
    k = summ["zero3"]["knobs"]
    assert sum(k["unit_bytes"]) == grad_bytes and len(k["units"]) == 17
    assert sum(k["library_bytes_per_step_ranks"]) == 3 * 2 * grad_bytes
    assert set(summ["zero3"]["comm_phases_s"]) == {"reduce_scatter", "allgather"}
    steps = [r for r in of_kind(recs, "step") if r["strategy"] == "zero3"]
    assert steps and all(r["comm_calls"] == 3 * 17 for r in steps)
    assert all(r["comm_bytes"] == sum(3 * (b // 2) for b in k["unit_bytes"]) for r in steps)
    assert all(r["model_state_bytes_peak"] > 0 for r in steps)


@pytest.mark.parametrize("launcher,np_,nodes", [
    pytest.param("mpirun", 4, "a,a,b,b", marks=pytest.mark.mpi),
    pytest.param("torchrun", 3, "a,a,b", marks=pytest.mark.torchrun)])
def test_ring_forms_step_as_flat(tmp_path, launcher, np_, nodes):
    """--algo ring: the project's ring all-gather and reduce-scatter (comm.p2pcoll), on the
    real gpt-tiny with momentum (tied weights in the root unit), a separate engine for the
    reduce-scatters."""
    real = ["--workload", "real", "--model", "gpt-tiny", "--batch-size", "2", "--steps", "2",
            "--warmup", "1", "--algo", "ring"]
    recs = run_tool(launcher, np_, "commbench.allreduce",
                    [*real, "--strategy", "flat,zero3", "--reduce-scatter-group", "separate"],
                    tmp_path / "ring.jsonl", nodes=nodes, timeout=300).records
    summ = summaries(recs)
    same_parameters_as_flat(summ, "zero3")
    assert summ["zero3"]["algo"] == "ring" and "ring" in summ["zero3"]["knobs"]["collective"]
