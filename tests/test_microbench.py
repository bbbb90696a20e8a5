"""python -m commbench.microbench: flags, exact validation values, real mpirun/horovodrun jobs."""

from __future__ import annotations

import argparse

import pytest
import torch

from commbench.comm.algos import ALGOS
from commbench.flags import ConfigError
from commbench.metrics import busbw
from commbench.microbench import (
    DTYPES,
    MicroConfig,
    count_mismatches,
    exact_limit,
    fill_pattern,
    force_mpi_algorithm,
    message_sizes,
    parse_config,
    parse_size,
    time_per_call,
    validation_pattern,
)
from tests.conftest import PY, launch, read_jsonl, run_check

MB = [PY, "-m", "commbench.microbench"]
# one element (4 B float32, 2 B float16 x 2) up to 3.3 MB; counts are powers of 7 (x2 for
# the 2-byte types), so no rank count here divides them all
SWEEP = ["-b", "4", "-e", "4M", "-f", "7", "-d", "all", "-n", "2", "-w", "1"]
SWEEP_SIZES = [4 * 7**k for k in range(8)]

RECORD_FIELDS = {"schema", "kind", "size", "count", "dtype", "algo", "backend", "world_size",
                 "nodes", "local_size", "hostnames", "time_us", "algbw", "busbw", "wrong",
                 "iters", "warmup", "versions", "config", "link_gbps"}


# -- flags ---------------------------------------------------------------------

@pytest.mark.parametrize("text,value", [
    ("8", 8), ("1K", 1024), ("1k", 1024), ("64K", 65536), ("256M", 256 << 20),
    ("1G", 1 << 30), ("3g", 3 << 30), (" 2M ", 2 << 20),
])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "K", "-8", "0", "0K", "1.5K", "8B", "1T", "M1", "1 K"])
def test_parse_size_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def test_message_sizes():
    assert message_sizes(8, 64, 2) == [8, 16, 32, 64]
    assert message_sizes(8, 100, 2) == [8, 16, 32, 64]  # -e is a bound, not a size
    assert message_sizes(8, 8, 2) == [8]
    assert message_sizes(4, 4 << 20, 7) == SWEEP_SIZES


def test_defaults_and_lists():
    cfg = parse_config([])
    assert cfg.algos == list(ALGOS)  # every registered algorithm, later ones included
    assert (cfg.iters, cfg.warmup_iters, cfg.dtypes) == (20, 5, ["float32"])
    cfg = parse_config(["-b", "2", "-e", "1K", "-f", "4", "-d", "float16,bfloat16",
                        "--algo", "ring", "-n", "3", "-w", "0"])
    assert cfg.sizes() == [2, 8, 32, 128, 512]
    assert (cfg.dtypes, cfg.algos, cfg.iters, cfg.warmup_iters) == (
        ["float16", "bfloat16"], ["ring"], 3, 0)
    assert parse_config(["-d", "all"]).dtypes == list(DTYPES)


@pytest.mark.parametrize("argv,env,match", [
    (["--backend", "horovod"], {}, "this job runs on the horovod backend"),
    ([], {"HOROVOD_RANK": "0"}, "this job runs on the horovod backend"),  # under horovodrun
    (["--horovod-cycle-ms", "0"], {}, "--horovod-cycle-ms: must be a finite number > 0"),
])
def test_horovod_cycle_ms_is_refused_where_it_cannot_apply(argv, env, match, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError, match=match):
        parse_config(["--horovod-cycle-ms", "5", *argv])
    assert parse_config(["--horovod-cycle-ms", "2.5", "--backend", "mpi"]).horovod_cycle_ms \
        == 2.5
    assert parse_config([]).horovod_cycle_ms is None


# -- validation values -----------------------------------------------------------

@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 7, 64, 256, 300, 5000])
def test_validation_sum_is_exact_in_any_order(dtype, n):
    p = validation_pattern(n, dtype)
    assert p.period * p.total <= exact_limit(dtype)
    assert p.total == sum(p.weight(r) for r in range(n))
    assert p.total > 0 and (n == 1 or p.period > 1 or n >= exact_limit(dtype) // 2)
    per_rank = torch.stack([p.values(p.weight(r), dtype) for r in range(n)])
    expected = p.values(p.total, dtype)
    for order in (range(n), reversed(range(n))):  # sequential sums, both directions, in dtype
        acc = torch.zeros(p.period, dtype=dtype)
        for r in order:
            acc += per_rank[r]
        assert torch.equal(acc, expected)
    assert torch.equal(per_rank.sum(0, dtype=torch.float64).to(dtype), expected)


@pytest.mark.parametrize("numel", [0, 1, 12, 13, 14, 1000])
def test_fill_and_count(numel):
    values = torch.arange(1, 14, dtype=torch.bfloat16)
    buf = torch.empty(numel, dtype=torch.bfloat16)
    fill_pattern(buf, values)
    assert count_mismatches(buf, values) == 0
    assert torch.equal(buf, values.repeat(numel // 13 + 1)[:numel])
    if numel:
        buf[-1] += 1
        assert count_mismatches(buf, values) == 1


# -- real jobs -------------------------------------------------------------------

def check_records(path, world_size: int, backend: str, sizes: list[int]) -> list[dict]:
    recs = read_jsonl(path)
    assert len(recs) == len(DTYPES) * len(sizes) * len(ALGOS)
    assert {(r["dtype"], r["size"], r["algo"]) for r in recs} == {
        (d, s, a) for d in DTYPES for s in sizes for a in ALGOS}
    for r in recs:
        assert RECORD_FIELDS <= set(r), RECORD_FIELDS - set(r)
        assert r["kind"] == "microbench" and r["backend"] == backend
        assert r["world_size"] == world_size and len(r["hostnames"]) == world_size
        assert r["wrong"] == 0, r
        assert r["count"] * DTYPES[r["dtype"]].itemsize == r["size"]
        t = r["time_us"]
        assert 0 < t["min"] <= t["avg"] <= t["max"]
        assert len(r["ranks"]["time_us"]) == world_size
        assert r["busbw"] == pytest.approx(busbw(r["size"], t["avg"] / 1e6, world_size))
        assert r["link_gbps"] is None and r["iters"] == 2 and r["warmup"] == 1
        assert r["versions"]["torch"]
    return recs


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [1, 3, 4])
def test_every_algo_and_dtype_validates(tmp_path, np_):
    out = tmp_path / "r.jsonl"
    sync = np_ == 3  # one layout times its calls each after a barrier
    res = launch("mpirun", np_, [*MB, *SWEEP, *(["--sync-each"] * sync), "--output", str(out)])
    assert res.returncode == 0, res.stdout + res.stderr
    recs = check_records(out, np_, "mpi", SWEEP_SIZES)
    assert {r["sync_each"] for r in recs} == {sync}
    assert ("one before each call" in res.stdout) == sync
    if np_ > 1:
        assert any(r["count"] % np_ for r in recs)  # uneven ring chunks were exercised
    assert {r["wire_dtype"] for r in recs} == set(DTYPES)  # 2-byte types stay 2 bytes
    lines = res.stdout.strip().splitlines()
    assert lines[1].split()[1:] == ["size", "count", "type", "algo", "min", "avg", "max",
                                    "algbw", "busbw", "#wrong"]
    assert "(GB/s)" in lines[2] and "#wrong total : 0 OK" in res.stdout
    assert lines[-1].startswith("# Avg bus bandwidth : ")
    rows = [line for line in lines if not line.startswith("#")]
    assert len(rows) == len(recs)


@pytest.mark.mpi
def test_mpi_algorithm_forces_open_mpis_own_and_says_so(tmp_path):
    out = tmp_path / "r.jsonl"
    # Open MPI lists the settings it read from the environment as it starts
    res = launch("mpirun", 3, [*MB, "--algo", "native,ring", "--mpi-algorithm", "rd",
                               "-b", "64K", "-e", "64K", "-n", "2", "-w", "1",
                               "--output", str(out)],
                 env={"OMPI_MCA_mpi_show_mca_params": "enviro"})
    assert res.returncode == 0, res.stdout + res.stderr
    said = res.stdout + res.stderr
    assert "coll_tuned_use_dynamic_rules=true (environment)" in said
    assert "coll_tuned_allreduce_algorithm=recursive_doubling (environment)" in said
    recs = read_jsonl(out)
    assert all(r["wrong"] == 0 and r["world_size"] == 3 for r in recs)
    forced = {r["algo"]: r.get("native_algorithm") for r in recs}
    assert forced == {"native": "rd", "ring": None}  # the project's ring is its own
    assert force_mpi_algorithm(MicroConfig(), env := {}) is None and env == {}


@pytest.mark.mpi
def test_horovod_cycle_ms_times_mpi_with_horovod_initialised(tmp_path):
    """Plain mpirun, the mpi backend, Horovod initialised beside it (its thread coordinating
    over MPI every 5 ms, nothing queued to it): every algorithm validates, rows say so, and
    the job ends cleanly (Horovod shut down before the communicator closes)."""
    out = tmp_path / "r.jsonl"
    res = launch("mpirun", 2, [*MB, "-b", "64K", "-e", "256K", "-f", "4", "-d", "float32,float16",
                               "--algo", "native,ring,hier", "-n", "2", "-w", "1", "--sync-each",
                               "--horovod-cycle-ms", "5", "--output", str(out)], timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Horovod initialised beside (cycle 5 ms)" in res.stdout
    recs = read_jsonl(out)
    assert len(recs) == 2 * 2 * 3
    for r in recs:
        assert r["backend"] == "mpi" and r["world_size"] == 2 and r["wrong"] == 0
        assert r["horovod_cycle_ms"] == 5.0 and r["horovod_controller"] == "mpi"
        assert r["config"]["horovod_cycle_ms"] == 5.0 and r["sync_each"]


@pytest.mark.horovod
def test_horovodrun(tmp_path):
    out = tmp_path / "r.jsonl"
    sizes = [4, 1024, 262144]
    res = launch("horovodrun", 3, [*MB, "-b", "4", "-e", "256K", "-f", "256", "-d", "all",
                                   "-n", "2", "-w", "1", "--output", str(out)])
    assert res.returncode == 0, res.stdout + res.stderr
    recs = check_records(out, 3, "horovod", sizes)
    assert recs[0]["versions"]["horovod"] == "0.28.1"
    # Horovod 0.28.1 has no bfloat16 all-reduce: native widens to float32 and says so
    wire = {(r["dtype"], r["algo"]): r["wire_dtype"] for r in recs}
    assert wire[("bfloat16", "native")] == "float32"
    assert wire[("bfloat16", "ring")] == "bfloat16" and wire[("float16", "native")] == "float16"
    # the two-level algorithms run on the process sets' MPI twins here: bytes as they are
    assert wire[("bfloat16", "hier")] == wire[("bfloat16", "hier-leader")] == "bfloat16"
    assert "runs as float32 on the wire" in res.stdout


@pytest.mark.mpi
def test_a_corrupted_allreduce_is_caught(tmp_path):
    out = tmp_path / "r.jsonl"
    res = launch("mpirun", 3, [*MB, "-b", "4", "-e", "4K", "-f", "32", "-d", "all", "-n", "1",
                               "-w", "0", "--output", str(out)], corrupt_rank=1)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "wrong elements in validation" in res.stderr
    recs = read_jsonl(out)
    assert len(recs) == 3 * 3 * len(ALGOS)
    assert all(r["wrong"] >= 1 and r["ranks"]["wrong"][1] >= 1 for r in recs)
    assert "FAILED" in res.stdout


@pytest.mark.parametrize("launcher,np_,backend", [
    pytest.param("mpirun", 3, "mpi", marks=pytest.mark.mpi),
    pytest.param("horovodrun", 2, "horovod", marks=pytest.mark.horovod),
    pytest.param("torchrun", 2, "torch", marks=pytest.mark.torchrun),
])
def test_backend_allreduce_on_every_dtype(launcher, np_, backend):
    run_check(launcher, np_, "half_dtypes.py", backend, f"OK all dtypes on {np_} ranks")


class _CountingComm:
    """Just what ``time_per_call`` uses: a barrier, counted."""

    def __init__(self) -> None:
        self.barriers = 0

    def barrier(self) -> None:
        self.barriers += 1


@pytest.mark.parametrize("sync_each,barriers", [(False, 1), (True, 1 + 4)])
def test_sync_each_puts_an_untimed_barrier_before_every_timed_call(sync_each, barriers):
    comm, calls = _CountingComm(), []

    def allreduce(c, buf, on_phase=None):
        calls.append(c.barriers)  # barriers seen before this call
        if on_phase:
            on_phase("all", 0.0, 0.001)

    seconds, phases = time_per_call(comm, allreduce, torch.zeros(4), iters=4, warmup=2,
                                    sync_each=sync_each)
    assert comm.barriers == barriers and len(calls) == 6
    assert calls[2:] == ([2, 3, 4, 5] if sync_each else [1, 1, 1, 1])
    assert seconds >= 0 and phases == {"all": pytest.approx(0.001)}
