"""Where a job's tensors live and which library reduces them (``commbench.comm.placement``):
one answer per backend and device, decided before any library starts, on this CPU machine
(CUDA's presence is a parameter of ``decide``, or torch's answers stood in for).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from commbench import allreduce, lifecycle, microbench
from commbench.comm.base import Communicator
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


class _Bare(Communicator):
    name = "bare"


_Bare.__abstractmethods__ = frozenset()  # only what the interface itself answers


def test_a_communicator_answers_host_memory_unless_its_backend_says_otherwise():
    comm = _Bare()
    assert comm.placement() == host("bare") == TensorPlacement("bare", CPU, CPU)
    assert comm.device_collectives is False  # the placement's, for callers before it
