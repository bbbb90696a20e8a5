"""Where a job's tensors live and which library reduces them (``commbench.comm.placement``):
one answer per backend and device, decided before any library starts, on this CPU machine
(CUDA's presence is a parameter of ``decide``, or torch's answers stood in for).

Then the microbenchmark's device timing (``commbench.microbench.time_on_device``) with a
stand-in for torch's CUDA events and stream: nccl-tests' back-to-back calls between two
events, the per-call mode, and host buffers timed as before.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from commbench import allreduce, dilation, lifecycle, microbench
from commbench.comm.base import DONE, Communicator, Handle
from commbench.comm.placement import (
    TensorPlacement,
    decide,
    host,
    launcher_local_rank,
    launcher_local_size,
)
from commbench.flags import ConfigError, DeviceRequest, ToolConfig

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
HERE = {"cuda": True, "nccl": True, "gloo": True, "gpus": 2}  # a GPU node, as decide sees it
TORCHRUN_ENV = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
                "TORCHELASTIC_RUN_ID": "x"}


# --- one answer per backend and device ---------------------------------------------------

@pytest.mark.parametrize("backend,dist_backend,device,library,where,comm_where", [
    ("mpi", "auto", "cpu", "mpi", CPU, CPU),
    ("mpi", "auto", "cuda", "mpi", CUDA, CPU),  # gradients staged through host memory
    ("horovod", "auto", "cpu", "horovod", CPU, CPU),
    ("horovod", "auto", "cuda", "horovod", CUDA, CPU),
    ("torch", "auto", "cpu", "gloo", CPU, CPU),
    ("torch", "gloo", "cuda", "gloo", CUDA, CPU),
    ("torch", "auto", "cuda", "nccl", CUDA, CUDA),  # tensors stay on the GPU
    ("torch", "nccl", "cuda", "nccl", CUDA, CUDA),
])
def test_the_placement_per_backend_and_device(backend, dist_backend, device, library, where,
                                              comm_where):
    p = decide(backend, dist_backend, DeviceRequest(device), **HERE)
    assert (p.library, p.device, p.comm_device) == (library, where, comm_where)
    assert p.on_device == (comm_where.type == "cuda")
    assert p.staged == (where.type == "cuda" and comm_where.type == "cpu")


def test_buffers_that_are_the_collectives_own_go_where_the_library_reduces():
    """The microbenchmark's ``--device auto``: a GPU only where NCCL takes it; ``cuda``
    elsewhere is refused (no staging of the buffers a row times)."""
    micro = microbench.MicroConfig()
    assert decide("torch", "auto", micro.device_request(), **HERE).comm_device == CUDA
    assert decide("torch", "gloo", micro.device_request(), **HERE).comm_device == CPU
    assert decide("mpi", "auto", micro.device_request(), **HERE).device == CPU
    assert decide("torch", "auto", micro.device_request(), **{**HERE, "cuda": False}) == \
        host("gloo")
    with pytest.raises(ValueError, match="--device cuda: the torch backend on gloo reduces "
                                         "host memory here"):
        decide("torch", "gloo", DeviceRequest("cuda", staging=False), **HERE)
    with pytest.raises(ValueError, match="--device cuda: the horovod backend reduces host"):
        decide("horovod", "auto", DeviceRequest("cuda", staging=False), **HERE)


def test_what_the_flags_ask_for_names_why_tensors_stay_on_the_host():
    assert ToolConfig().device_request() == DeviceRequest(
        "cpu", why_host="this tool keeps its tensors there")
    synthetic = allreduce.parse_config(["--device", "cpu"])
    assert synthetic.device_request().why_host.startswith("--workload synthetic")
    assert microbench.MicroConfig(device="cuda").device_request() == \
        DeviceRequest("cuda", staging=False)
    with pytest.raises(ValueError, match=r"nccl reduces CUDA tensors only, and this job's are "
                                         r"in host memory \(--workload synthetic .*use "
                                         r"--dist-backend gloo$"):
        decide("torch", "nccl", synthetic.device_request(), **HERE)


@pytest.mark.parametrize("request_,kw,message", [
    (DeviceRequest("cuda"), {"cuda": False}, "--device cuda: no CUDA device here"),
    (DeviceRequest("cuda"), {"nccl": False}, "--dist-backend nccl needs CUDA and NCCL.*no NCCL"),
    (DeviceRequest("cpu"), {}, "--dist-backend nccl reduces CUDA tensors only.*--device cuda"),
    (DeviceRequest("gpu"), {}, "--device 'gpu': choose from auto, cpu, cuda"),
])
def test_what_cannot_run_here_is_refused_naming_the_flag(request_, kw, message):
    with pytest.raises(ValueError, match=message):
        decide("torch", "nccl", request_, **{**HERE, **kw})


def test_nccl_needs_a_gpu_for_every_rank_of_the_node():
    """More ranks on a node than GPUs: NCCL is refused (the same words on every rank, since
    every rank reads the node's size, not its own index); Gloo shares the GPUs."""
    with pytest.raises(ValueError, match="--dist-backend auto: NCCL needs a GPU of its own for "
                                         "every rank, and this node runs 3 ranks on 2 GPUs: "
                                         "start at most 2 per node .*--dist-backend gloo"):
        decide("torch", "auto", DeviceRequest("cuda"), local_size=3, **HERE)
    assert decide("torch", "auto", DeviceRequest("cuda"), local_size=2, **HERE).on_device
    assert decide("torch", "gloo", DeviceRequest("cuda"), local_size=3, **HERE).staged
    assert launcher_local_size({"LOCAL_WORLD_SIZE": "3", "LOCAL_RANK": "0"}) == 3
    assert launcher_local_size({"LOCAL_RANK": "4"}) == 5  # at least this many
    assert launcher_local_size({}) is None
    assert launcher_local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "2"}) == 2
    assert launcher_local_rank({"LOCAL_RANK": "1", "SLURM_LOCALID": "0"}) == 1
    assert launcher_local_rank({}) is None


@pytest.fixture
def gpu_node(monkeypatch):
    """torch answering as on a node of 2 GPUs; what ``set_device`` was given, recorded."""
    chosen: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    return chosen


def test_bind_puts_each_rank_on_the_gpu_of_its_local_rank(gpu_node):
    assert host("mpi").bind(3) == host("mpi") and gpu_node == []  # host memory: nothing set
    nccl = decide("torch", "nccl", DeviceRequest("cuda")).bind(1)
    gpu1 = torch.device("cuda", 1)
    assert (nccl.device, nccl.comm_device, gpu_node) == (gpu1, gpu1, [gpu1])
    staged = TensorPlacement("mpi", device=CUDA).bind(2)  # 2 GPUs: ranks share them round-robin
    assert (staged.device, staged.comm_device) == (torch.device("cuda", 0), CPU)
    assert gpu_node[-1] == torch.device("cuda", 0)


def test_nccl_with_more_ranks_than_gpus_exits_2_before_the_library_starts(gpu_node, monkeypatch,
                                                                          capsys):
    """Every rank stops with status 2 before ``init_process_group`` (no communicator is
    made); rank 0 says it at once, the others only if the launcher has not ended them."""
    monkeypatch.setattr(lifecycle, "make_communicator", pytest.fail)
    monkeypatch.setattr(lifecycle, "BAD_INPUT_GRACE_S", 0.0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    argv = ["--workload", "real", "--device", "cuda", "--steps", "1"]
    for rank in (0, 1):
        env = {**TORCHRUN_ENV, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        monkeypatch.setattr(lifecycle.os, "environ", env)
        code = lifecycle.run_job("commbench.allreduce", argv, allreduce.parse_config,
                                 pytest.fail, pytest.fail)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, err
        said = "commbench.allreduce: error" + ("" if rank == 0 else " on rank 1")
        assert err[0].startswith(said) and "NCCL needs a GPU of its own" in err[0] \
            and "2 ranks on 1 GPU" in err[0], err
    # sharing the GPU on Gloo is allowed: the placement stages through host memory
    backend, p = lifecycle.job_placement(allreduce.parse_config([*argv, "--dist-backend",
                                                                 "gloo"]), TORCHRUN_ENV)
    assert (backend, p.library, p.staged) == ("torch", "gloo", True)


def test_job_placement_is_the_one_answer_before_any_library(monkeypatch):
    assert lifecycle.job_placement(ToolConfig(), {"OMPI_COMM_WORLD_RANK": "0"}) == \
        ("mpi", host("mpi"))
    assert lifecycle.job_placement(ToolConfig(), TORCHRUN_ENV) == ("torch", host("gloo"))
    with pytest.raises(ConfigError, match="in host memory \\(this tool keeps its tensors"):
        lifecycle.job_placement(ToolConfig(dist_backend="nccl"), TORCHRUN_ENV)


def test_every_tool_refuses_a_gpu_under_time_dilation(monkeypatch):
    # on this CPU machine decide refuses --device cuda itself: torch's answers stood in for
    # a GPU node, the one decision then says cuda, and the dilation refuses it
    monkeypatch.setattr(lifecycle, "decide",
                        lambda *a, **kw: TensorPlacement("mpi", CUDA, CPU))
    env = {"OMPI_COMM_WORLD_RANK": "0"}
    assert dilation.factor() == 1.0
    assert lifecycle.job_placement(ToolConfig(), env)[1].device == CUDA
    monkeypatch.setattr(dilation, "_K", 4.0)  # what a rank reads from COMMBENCH_DILATION
    with pytest.raises(ConfigError, match="--device cuda under --dilation 4"):
        lifecycle.job_placement(microbench.parse_config([]), env)


class _Bare(Communicator):
    name = "bare"


_Bare.__abstractmethods__ = frozenset()  # only what the interface itself answers


def test_a_communicator_answers_host_memory_unless_its_backend_says_otherwise():
    comm = _Bare()
    assert comm.placement() == host("bare") == TensorPlacement("bare", CPU, CPU)
    assert comm.device_collectives is False  # the placement's, for callers before it


# --- the microbenchmark on a device, with a stand-in for CUDA -----------------------------

class _Events:
    """Stand-ins for ``torch.cuda.Event`` and the current stream: a log of what the host
    did, in order; every pair of events measures 2 ms."""

    def __init__(self) -> None:
        self.log: list[str] = []
        outer = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing

            def record(self, stream: object) -> None:
                outer.log.append("record")

            def synchronize(self) -> None:
                outer.log.append("host waits")

            def elapsed_time(self, end: object) -> float:
                return 2.0

        class Stream:
            def synchronize(self) -> None:
                outer.log.append("drain")

        self.Event, self.stream = Event, Stream()


class _DeviceComm:
    """A communicator on a GPU as ``time_on_device`` uses it: barriers and queued
    all-reduces, logged."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def barrier(self) -> None:
        self.log.append("barrier")

    def iallreduce(self, buf: torch.Tensor) -> Handle:
        outer = self

        class Queued(Handle):
            def test(self) -> bool:
                return True

            def wait(self) -> None:
                outer.log.append("host wait")

            def wait_on_device(self) -> None:
                outer.log.append("call")

        return Queued()


@pytest.fixture
def events(monkeypatch):
    ev = _Events()
    monkeypatch.setattr(torch.cuda, "Event", ev.Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: ev.stream)
    return ev


def test_back_to_back_calls_between_two_events_with_no_host_wait_between(events):
    comm = _DeviceComm(events.log)
    seconds = microbench.time_on_device(comm, microbench.queued_native, torch.zeros(4),
                                        iters=3, warmup=2)
    assert events.log == ["call", "call", "drain", "barrier",
                          "record", "call", "call", "call", "record", "host waits"]
    assert seconds == pytest.approx(2e-3 / 3)


@pytest.mark.parametrize("sync_each", [False, True])
def test_per_call_mode_times_each_call_between_its_own_events(events, sync_each):
    comm = _DeviceComm(events.log)
    seconds = microbench.time_on_device(comm, microbench.queued_native, torch.zeros(4),
                                        iters=2, warmup=0, per_call=not sync_each,
                                        sync_each=sync_each)
    each = ["barrier"] * sync_each + ["record", "call", "record", "host waits"]
    assert events.log == ["drain", "barrier", *each, *each]
    assert seconds == pytest.approx(2e-3)


def test_the_native_algorithm_is_queued_on_a_device_and_others_run_as_they_are():
    def ring(comm, buf, on_phase=None):
        pass

    assert microbench.on_device_form("native", microbench.ALGOS["native"]) is \
        microbench.queued_native
    assert microbench.on_device_form("ring", ring) is ring
    assert DONE.wait_on_device() is None  # a host handle: its wait


def test_host_buffers_are_timed_on_the_host_as_before(monkeypatch):
    """A row on host memory goes to ``time_per_call`` with the flags as given."""
    seen = []
    monkeypatch.setattr(microbench, "time_per_call",
                        lambda *a: seen.append(a[3:6]) or (1.0, {}))
    monkeypatch.setattr(microbench, "time_on_device", pytest.fail)
    cfg = microbench.MicroConfig(iters=4, warmup_iters=1, sync_each=True, blocking=True)
    assert microbench.time_row(_Bare(), cfg, "native", None, torch.zeros(2), None) == (1.0, {})
    assert seen == [(4, 1, True)]
