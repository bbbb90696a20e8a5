"""The torch backend as users start it: ``torchrun`` selects it, every strategy and tool runs
on it, and what it cannot do is refused with the reason.

The communicator itself (every collective, groups, the side channel, abort) is
``tests/test_torchdist.py``'s; the strategies' equality scripts run under torchrun from
their own callers (``-m torchrun``); the emulated cluster's torchrun launcher from
``tests/test_cluster.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from analysis.costmodel import native_label
from commbench import allreduce
from commbench.comm.base import lacks_p2p
from commbench.comm.placement import decide
from commbench.flags import ConfigError, ToolConfig
from commbench.launchenv import detect_backend, launcher_name, launcher_rank
from commbench.lifecycle import job_backend
from commbench.microbench import MicroConfig
from tests.conftest import PY, launch, of_kind, run_tool

TORCHRUN_ENV = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500"}


# --- without processes ----------------------------------------------------------------

def test_torchruns_environment_selects_the_torch_backend():
    assert detect_backend(TORCHRUN_ENV) == "torch"
    assert launcher_name({**TORCHRUN_ENV, "TORCHELASTIC_RUN_ID": "x"}) == "torchrun"
    assert launcher_rank(TORCHRUN_ENV) == 1
    # a partial rendezvous is not torchrun's; mpirun's variables win (Open MPI sets none
    # of these, but a user's shell may)
    assert detect_backend({"RANK": "0", "WORLD_SIZE": "2"}) == "mpi"
    assert detect_backend({**TORCHRUN_ENV, "OMPI_COMM_WORLD_RANK": "1"}) == "mpi"
    assert launcher_name({"OMPI_COMM_WORLD_RANK": "0"}) == "mpirun"
    assert launcher_name({"HOROVOD_RANK": "0"}) == "horovodrun"
    # torchrun's own mark wins over what else the workers see: NCCL_SOCKET_IFNAME with an
    # exported btl setting (horovodrun's sign), Slurm's PMIx rank under srun
    elastic = {**TORCHRUN_ENV, "TORCHELASTIC_RUN_ID": "7", "NCCL_SOCKET_IFNAME": "eth0",
               "OMPI_MCA_btl_tcp_if_include": "eth0", "PMIX_RANK": "0"}
    assert (detect_backend(elastic), launcher_name(elastic), launcher_rank(elastic)) == \
        ("torch", "torchrun", 1)
    assert launcher_name({"SLURM_PROCID": "0"}) == "srun"
    assert launcher_name({}) == "none"


def test_backend_checks_before_any_library_starts():
    assert job_backend(ToolConfig(), TORCHRUN_ENV) == "torch"
    assert job_backend(ToolConfig(dist_backend="gloo"), TORCHRUN_ENV) == "torch"
    assert job_backend(ToolConfig(backend="mpi"), TORCHRUN_ENV) == "mpi"
    with pytest.raises(ConfigError, match="--backend torch needs torchrun's rendezvous, and "
                                          "MASTER_PORT is not set"):
        job_backend(ToolConfig(backend="torch"),
                    {k: v for k, v in TORCHRUN_ENV.items() if k != "MASTER_PORT"})
    with pytest.raises(ConfigError, match="--dist-backend gloo chooses the torch backend's "
                                          "library.*mpi backend \\(under mpirun\\)"):
        job_backend(ToolConfig(dist_backend="gloo"), {"OMPI_COMM_WORLD_RANK": "0"})
    # NCCL reduces device tensors: replayed compute's gradients, a tool's own host tensors
    synthetic = allreduce.parse_config(["--device", "cpu", "--dist-backend", "nccl"])
    with pytest.raises(ConfigError, match="--dist-backend nccl reduces CUDA tensors only, "
                                          "and this job's are in host memory \\(--workload "
                                          "synthetic"):
        job_backend(synthetic, TORCHRUN_ENV)
    with pytest.raises(ConfigError, match="in host memory \\(this tool keeps its tensors"):
        job_backend(ToolConfig(dist_backend="nccl"), TORCHRUN_ENV)


def test_device_buffers_need_nccl():
    def where(cfg: MicroConfig, backend: str, cuda: bool) -> str:
        return decide(backend, cfg.dist_backend, cfg.device_request(), cuda=cuda, nccl=True,
                      gloo=True, gpus=1).comm_device.type

    assert where(MicroConfig(), "torch", cuda=False) == "cpu"
    assert where(MicroConfig(), "torch", cuda=True) == "cuda"
    assert where(MicroConfig(), "mpi", cuda=True) == "cpu"
    assert where(MicroConfig(dist_backend="gloo"), "torch", cuda=True) == "cpu"
    with pytest.raises(ValueError, match="--device cuda: the mpi backend reduces host memory"):
        where(MicroConfig(device="cuda"), "mpi", cuda=True)
    with pytest.raises(ValueError, match="--device cuda: no CUDA device here"):
        where(MicroConfig(device="cuda"), "torch", cuda=False)


def test_a_missing_capability_names_the_backend_and_where_it_is():
    nccl = SimpleNamespace(name="torch-nccl")
    assert lacks_p2p(nccl, "--algo ring", "--algo native") == (
        "--algo ring needs point-to-point messages, which the torch-nccl backend does not "
        "offer: use --algo native, or use --dist-backend gloo (NCCL's are not offered here)")
    assert "horovodrun --mpi" in lacks_p2p(SimpleNamespace(name="horovod"), "--algo ring", "x")


def test_the_cost_model_names_native_by_its_library():
    assert native_label({"backend": "torch-gloo"}) == "gloo-native"
    assert native_label({"backend": "torch-nccl"}) == "nccl-native"
    assert native_label({"backend": "mpi"}) is None  # mpi-<its algorithm>
    assert native_label({"backend": "horovod"}) is None  # Horovod's MPI all-reduce


# --- under torchrun ----------------------------------------------------------------------

SMALL = ["--model", "resnet18", "--steps", "2", "--warmup", "1", "--compute-ms", "10"]


@pytest.mark.torchrun
def test_every_strategy_under_torchrun_on_uneven_nodes(tmp_path):
    """One job: every strategy (and flat's three algorithms) on 3 ranks laid out as nodes of
    2 and 1; #wrong 0, the same parameters on every rank, and records that say torch-gloo
    under torchrun."""
    recs = run_tool("torchrun", 3, "commbench.allreduce", [
        *SMALL, "--strategy", "flat,hierarchical,bucketed,async,ddp",
        "--algo", "native,ring,hier"], tmp_path / "r.jsonl", nodes="a,a,b").records
    runs = {(s["strategy"], s["algo"]) for s in of_kind(recs, "summary")}
    assert runs == {("flat", "native"), ("flat", "ring"), ("flat", "hier"),
                    ("hierarchical", "hier"), ("bucketed", None), ("async", "native"),
                    ("ddp", None)}, runs
    for s in of_kind(recs, "summary"):
        what = (s["strategy"], s["algo"])
        assert s["wrong"] == 0 and s["elements_checked"] > 0, what
        assert len(set(s["param_checksum_ranks"])) == 1, (what, s["param_checksum_ranks"])
        assert (s["backend"], s["launcher"], s["nodes"], s["local_sizes"]) == \
            ("torch-gloo", "torchrun", 2, [2, 1]), what
        assert s["versions"]["torch_distributed"] == "gloo", what
    flat = next(s for s in of_kind(recs, "summary") if s["strategy"] == "flat")
    assert flat["knobs"]["comm_device"] == "cpu" and flat["knobs"]["staging"] is None


@pytest.mark.torchrun
@pytest.mark.parametrize("module,args,names", [
    ("commbench.allreduce", [*SMALL, "--strategy", "horovod"],
     ("--strategy horovod", "torch-gloo", "--strategy ddp")),
    ("commbench.microbench", ["--mpi-algorithm", "ring", "--algo", "native"],
     ("--mpi-algorithm", "torch backend")),
    ("commbench.allreduce", [*SMALL, "--dist-backend", "nccl"], ("--dist-backend nccl", "CUDA")),
], ids=["horovod-peer", "mpi-algorithm", "nccl-without-cuda"])
def test_refused_under_torchrun_with_the_reason(tmp_path, module, args, names):
    """Every worker exits 2 with one line saying why; torchrun itself exits 1 (its own rule
    when a worker fails), naming the worker's exit code 2. No records are written."""
    out = tmp_path / "r.jsonl"
    res = launch("torchrun", 2, [PY, "-m", module, *args, "--output", str(out)], timeout=120)
    errors = [line for line in res.stderr.splitlines() if f"{module}: error" in line]
    assert res.returncode == 1, res.stdout + res.stderr
    assert len(errors) == 1 and all(n in errors[0] for n in names), res.stderr
    assert "exitcode  : 2" in res.stderr, res.stderr
    # torchrun prints a traceback of its own; none comes from the tools
    assert not any('File "' in line and "/commbench/" in line
                   for line in res.stderr.splitlines()), res.stderr
    assert not out.exists()
