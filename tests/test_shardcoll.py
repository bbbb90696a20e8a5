"""The sharded strategies' topology-aware reduce-scatter and all-gather (``--algo hier``,
``commbench.comm.shardcoll``): the permutation that leaves every rank its own part, worked
in one process against the sum it must give; the layouts it refuses; and under the
launchers, zero1, zero2 and zero3 on it step as flat + SGD (``tests/mpi``'s checks)."""

from __future__ import annotations

import pytest
import torch

from commbench.comm.base import topology_from_hostnames
from commbench.comm.ring import chunk_counts
from commbench.comm.shardcoll import TwoLevel, check_two_level, node_ranks, replica_groups
from tests.conftest import PY, launch, run_check


def _two_level(hosts: list[str], rank: int) -> TwoLevel:
    """``TwoLevel``'s layout for ``rank`` without its groups (no library)."""
    t = TwoLevel.__new__(TwoLevel)
    t.places = replica_groups(node_ranks(topology_from_hostnames(rank, hosts)))
    t.place = next(k for k, g in enumerate(t.places) if rank in g)
    return t


def _by_levels(hosts: list[str], flats: list[torch.Tensor], counts: list[int]
               ) -> list[torch.Tensor]:
    """Each rank's result of the two levels, done by hand: the node's reduce-scatter of the
    permuted buffers gives place ``l`` piece ``l`` of the node's sum, the cross-node one
    adds the other nodes' and gives each rank at place ``l`` its share of the piece (group
    rank order): together, this rank's share of piece ``l`` of every rank's permuted
    buffer, summed."""
    out = []
    for r in range(len(hosts)):
        t = _two_level(hosts, r)
        pieces, cross_counts, off = t._layout(counts)
        permuted = sum(torch.cat([flat[off[j]:off[j] + counts[j]]
                                  for ranks in t.places for j in ranks]) for flat in flats)
        start = sum(pieces[:t.place])
        piece = permuted[start:start + pieces[t.place]]
        at = t.places[t.place].index(r)
        lo = sum(cross_counts[:at])
        out.append(piece[lo:lo + cross_counts[at]])
    return out


@pytest.mark.parametrize("hosts", ["a,a,b,b", "a,b,a,b", "a,b,b,a", "a,a,a,b,b,b", "a,b",
                                   "a,a,a"])
@pytest.mark.parametrize("numel", [1, 3, 10, 1001])
def test_each_rank_ends_with_its_own_part_of_the_jobs_sum(hosts, numel):
    hosts_ = hosts.split(",")
    n = len(hosts_)
    flats = [torch.arange(numel, dtype=torch.float64) * (r + 1) + 1000 * r for r in range(n)]
    counts = chunk_counts(numel, n)
    total = sum(flats)
    off = [sum(counts[:r]) for r in range(n)]
    for r, part in enumerate(_by_levels(hosts_, flats, counts)):
        assert torch.equal(part, total[off[r]:off[r] + counts[r]]), (hosts, numel, r)


def test_nodes_of_unequal_size_are_refused_naming_the_cause():
    check_two_level(topology_from_hostnames(0, ["a", "a", "b", "b"]), "--strategy zero1")
    with pytest.raises(ValueError, match=r"--strategy zero3 --algo hier on nodes of unequal "
                                         r"size \(2 \+ 1 ranks\).*use --algo ring"):
        check_two_level(topology_from_hostnames(0, ["a", "a", "b"]), "--strategy zero3")


@pytest.mark.mpi
def test_a_job_on_unequal_nodes_exits_2_before_writing(tmp_path):
    out = tmp_path / "r.jsonl"
    res = launch("mpirun", 3, [PY, "-m", "commbench.allreduce", "--model", "resnet18",
                               "--steps", "2", "--warmup", "1", "--compute-ms", "20",
                               "--strategy", "flat,zero2", "--algo", "hier",
                               "--output", str(out)], timeout=120, nodes="a,a,b")
    errors = [line for line in res.stderr.splitlines() if "commbench.allreduce: error" in line]
    assert res.returncode == 2, res.stdout + res.stderr
    assert len(errors) == 1 and "--strategy zero2 --algo hier on nodes of unequal size " \
        "(2 + 1 ranks)" in errors[0], res.stderr
    assert not out.exists()


# --- under the launchers: the same parameters as flat + SGD ------------------------------

ZERO = "OK zero1, zero2 == flat + SGD on {} ranks"
ZERO3 = "OK zero3 == flat + SGD on {} ranks"


@pytest.mark.parametrize("launcher,backend,nodes", [
    pytest.param("mpirun", "mpi", "a,b,b,a", marks=pytest.mark.mpi),
    pytest.param("torchrun", "torch", "a,a,b,b", marks=pytest.mark.torchrun)])
def test_zero1_zero2_on_the_two_levels_equal_flat(launcher, backend, nodes):
    run_check(launcher, 4, "zero_vs_flat.py", backend, ZERO.format(4), nodes=nodes,
              args=("hier",), timeout=300)


@pytest.mark.parametrize("launcher,backend,nodes", [
    pytest.param("mpirun", "mpi", "a,a,b,b", marks=pytest.mark.mpi),
    pytest.param("torchrun", "torch", "a,b,a,b", marks=pytest.mark.torchrun),
    # Horovod's process sets under Gloo: no point-to-point messages, the backend's
    # collectives across nodes too
    pytest.param("horovodrun-gloo", "horovod", "a,a,b,b", marks=pytest.mark.horovod)])
def test_zero3_on_the_two_levels_equals_flat(launcher, backend, nodes):
    run_check(launcher, 4, "check_zero3.py", backend, ZERO3.format(4), nodes=nodes,
              args=("hier",), timeout=300)
