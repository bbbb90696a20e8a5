"""HSDP: its mesh (shard groups, replica groups) and byte arithmetic, what it refuses, and the
same parameters as flat under every launcher on emulated nodes (2 x 2, 2 x 1)."""

from __future__ import annotations

import pytest

from commbench.allreduce import parse_config
from commbench.comm.base import topology_from_hostnames
from commbench.flags import ConfigError
from commbench.strategies import SETTINGS, STRATEGIES
from commbench.strategies.hsdp import (
    HsdpSettings,
    check_layout,
    check_shard_group,
    library_bytes,
    node_link_bytes,
    node_ranks,
    replica_groups,
    shard_groups_of,
)
from commbench.strategies.zero import library_bytes as zero_library_bytes
from tests.conftest import (
    PY,
    launch,
    of_kind,
    run_check,
    run_tool,
    same_parameters_as_flat,
    summaries,
)

# --- the mesh ----------------------------------------------------------------------------


def _topo(hosts: str, rank: int = 0):
    return topology_from_hostnames(rank, hosts.split(","))


def test_nodes_are_shard_groups_and_local_rank_peers_replica_groups():
    assert node_ranks(_topo("a,a,b,b")) == [[0, 1], [2, 3]]
    assert replica_groups([[0, 1], [2, 3]]) == [[0, 2], [1, 3]]
    # ranks placed round-robin over the nodes, and nodes listed out of rank order
    assert node_ranks(_topo("a,b,a,b")) == [[0, 2], [1, 3]]
    assert replica_groups(node_ranks(_topo("a,b,b,a"))) == [[0, 1], [2, 3]]
    assert replica_groups([[0], [1]]) == [[0, 1]]  # a rank a node: the job is one replica group
    assert shard_groups_of("hsdp", 2, 8) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert replica_groups(shard_groups_of("hsdp", 4, 8)) == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.parametrize("group,ranks", [(3, 8), (0, 4), (5, 4)])
def test_a_shard_group_that_does_not_divide_the_ranks_is_refused(group, ranks):
    with pytest.raises(ValueError, match=f"--strategy zero3: a shard group of {group} ranks "
                                         f"does not divide the job's {ranks} ranks"):
        check_shard_group("zero3", group, ranks)
    check_shard_group("zero3", 2, 8)
    check_shard_group("zero3", 8, 8)


def test_hsdp_needs_several_nodes_of_equal_size():
    check_layout(_topo("a,a,b,b"))
    check_layout(_topo("a,b"))
    with pytest.raises(ValueError, match="--strategy hsdp on one node: .* no replicas.* zero2"):
        check_layout(_topo("a,a,a,a"))
    with pytest.raises(ValueError, match=r"--strategy hsdp on nodes of unequal size "
                                         r"\(2 \+ 1 ranks\): .*no rank for some parts"):
        check_layout(_topo("a,a,b"))
    with pytest.raises(ValueError, match=r"\(1 \+ 3 ranks\)"):
        check_layout(_topo("a,b,b,b"))


# --- the bytes -----------------------------------------------------------------------------


def test_each_node_link_carries_two_psi_n_minus_one_over_n():
    assert node_link_bytes(1000, 2) == 1000.0  # 1.0Ψ on 2 x 4 (and on 2 x anything)
    assert node_link_bytes(900, 3) == 1200.0
    assert node_link_bytes(1000, 4) == 1500.0


def test_the_ranks_hand_over_what_ddp_does():
    # 2 x 4, even parts: 2Ψ(n−1)/n a rank, as a ring all-reduce (and zero) hands over
    psi = 800  # elements; 4 bytes each
    assert {library_bytes([psi], 4, 2, i, j, 4) for i in range(4) for j in range(2)} == \
        {zero_library_bytes([psi], 8, 0, 4)} == {2 * psi * 4 * 7 // 8}
    # uneven parts, empty parts, one rank a node: 2(n−1)Ψ over the job's ranks
    numels = [1, 3, 1009, 4096, 7]
    for L, N in ((2, 2), (1, 2), (4, 2), (3, 3), (2, 5)):
        total = sum(library_bytes(numels, L, N, i, j, 2) for i in range(L) for j in range(N))
        assert total == 2 * (L * N - 1) * sum(numels) * 2, (L, N)


# --- what it cannot honour: refused, naming the pair ----------------------------------


def test_hsdp_is_registered_with_its_settings():
    assert SETTINGS["hsdp"] is HsdpSettings and STRATEGIES["hsdp"].stage == 2
    assert set(HsdpSettings.flag_fields()) == {"compression", "accum_steps", "bucket_mb",
                                               "first_bucket_mb"}


@pytest.mark.parametrize("fields,names", [
    ({"compression": "fp16"}, ("--strategy hsdp", "--compression fp16")),
    ({"bucket_mb": "auto"}, ("--strategy hsdp", "--bucket-mb auto")),
    ({"accum_steps": 2}, ("--strategy hsdp", "--accum-steps 2", "zero1")),
])
def test_what_hsdp_cannot_honour_is_refused_naming_the_pair(fields, names):
    with pytest.raises(ValueError) as e:
        HsdpSettings(**fields)
    assert all(n in str(e.value) for n in names), str(e.value)
    assert HsdpSettings(bucket_mb=5).bucket_mb == 5


def test_a_job_is_refused_before_it_runs():
    with pytest.raises(ConfigError, match="--strategy hsdp with --bucket-mb auto"):
        parse_config(["--strategy", "bucketed,hsdp", "--bucket-mb", "auto"])
    with pytest.raises(ConfigError, match="--strategy hsdp with --compression bf16"):
        parse_config(["--strategy", "hsdp", "--compression", "bf16"])


SMALL = ["--model", "resnet18", "--steps", "2", "--warmup", "1", "--compute-ms", "20",
         "--bucket-mb", "5", "--algo", "native"]


@pytest.mark.mpi
@pytest.mark.parametrize("np_,nodes,names", [
    (2, None, ("--strategy hsdp on one node", "zero2")),
    (3, "a,a,b", ("--strategy hsdp on nodes of unequal size (2 + 1 ranks)",))])
def test_one_node_or_unequal_nodes_exit_2_naming_the_cause(tmp_path, np_, nodes, names):
    out = tmp_path / "r.jsonl"
    res = launch("mpirun", np_, [PY, "-m", "commbench.allreduce", *SMALL, "--strategy",
                                 "flat,hsdp", "--output", str(out)], timeout=120, nodes=nodes)
    errors = [line for line in res.stderr.splitlines() if "commbench.allreduce: error" in line]
    assert res.returncode == 2, res.stdout + res.stderr
    assert len(errors) == 1 and all(n in errors[0] for n in names), res.stderr
    assert not out.exists()


# --- under the launchers: the same parameters as flat + SGD ------------------------------

OK = "OK hsdp == flat + SGD on {} nodes x {} ranks"


@pytest.mark.mpi
@pytest.mark.parametrize("nodes", ["a,a,b,b", "a,b", "a,b,a,b"])
def test_hsdp_equals_flat_mpi(nodes):
    hosts = nodes.split(",")
    n_nodes = len(set(hosts))
    run_check("mpirun", len(hosts), "check_hsdp_vs_flat.py", "mpi",
              OK.format(n_nodes, len(hosts) // n_nodes), nodes=nodes, timeout=300)


@pytest.mark.torchrun
def test_hsdp_equals_flat_torch():
    run_check("torchrun", 4, "check_hsdp_vs_flat.py", "torch", OK.format(2, 2),
              nodes="a,a,b,b", timeout=300)


@pytest.mark.horovod
# node and replica groups: MPI twins of Horovod's process sets under its MPI controller;
# under Gloo the process sets themselves (reduce-scatter by hvd.alltoall)
@pytest.mark.parametrize("launcher", ["horovodrun", "horovodrun-gloo"])
def test_hsdp_equals_flat_horovod(launcher):
    run_check(launcher, 4, "check_hsdp_vs_flat.py", "horovod", OK.format(2, 2),
              nodes="a,a,b,b", timeout=300)


@pytest.mark.mpi
def test_a_job_steps_as_flat_and_records_the_three_collectives_apart(tmp_path):
    recs = run_tool("mpirun", 4, "commbench.allreduce", [*SMALL, "--strategy", "flat,hsdp"],
                    tmp_path / "r.jsonl", nodes="a,a,b,b", timeout=300).records
    summ = summaries(recs)
    same_parameters_as_flat(summ, "hsdp")
    s = summ["hsdp"]
    grad_bytes = summ["flat"]["grad_bytes"]
    k = s["knobs"]
    assert (k["stage"], k["nodes"], k["shard_group_size"]) == (2, 2, 2)
    assert sum(k["library_bytes_per_step_ranks"]) == 2 * 3 * grad_bytes
    assert k["node_link_bytes_per_step"] == grad_bytes  # 2Ψ(N−1)/N on 2 nodes
    assert set(s["comm_phases_s"]) == {"reduce_scatter", "allreduce", "allgather"}
    steps = [r for r in of_kind(recs, "step") if r["strategy"] == "hsdp"]
    assert steps and all(r["comm_calls"] == 3 * k["buckets"] for r in steps)
    assert all(r["comm_bytes"] == grad_bytes for r in steps)
