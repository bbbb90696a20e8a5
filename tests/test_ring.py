import pytest

from commbench.comm.ring import chunk_bounds
from tests.conftest import run_check


@pytest.mark.parametrize("n,p", [(1, 1), (1, 4), (7, 3), (10, 5), (1_000_003, 6), (3, 8)])
def test_chunk_bounds_cover_exactly_and_balance(n, p):
    bounds = chunk_bounds(n, p)
    assert len(bounds) == p
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the larger chunks come first


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [1, 2, 3, 5])
def test_ring_equals_native_mpi(np_):
    run_check("mpirun", np_, "ring_vs_native.py", "mpi", f"OK ring == native on {np_} ranks")


@pytest.mark.torchrun
@pytest.mark.parametrize("np_", [1, 3])
def test_ring_equals_native_torch(np_):
    run_check("torchrun", np_, "ring_vs_native.py", "torch", f"OK ring == native on {np_} ranks")


@pytest.mark.horovod
@pytest.mark.parametrize("np_", [3])
def test_ring_equals_native_horovod(np_):
    run_check("horovodrun", np_, "ring_vs_native.py", "horovod",
              f"OK ring == native on {np_} ranks")
