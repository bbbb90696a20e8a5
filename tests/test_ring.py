import pytest

from commbench.comm import ring
from commbench.comm.ring import POLL_FIRST_S, POLL_S, chunk_bounds
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


class _LandsAfter:
    """A message that tests complete on its ``n``-th test."""

    def __init__(self, n: int) -> None:
        self.n, self.tests = n, 0

    def test(self) -> bool:
        self.tests += 1
        return self.tests >= self.n


def test_poll_backs_off_from_a_short_first_sleep_to_the_longest(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(ring.dilation, "sleep", slept.append)
    ring.poll(_LandsAfter(1))
    assert slept == []  # a message already in is never slept on
    h = _LandsAfter(9)
    ring.poll(h)
    assert h.tests == 9
    want = [min(POLL_FIRST_S * 2 ** i, POLL_S) for i in range(8)]
    assert slept == pytest.approx(want) and slept[0] < POLL_S / 8 and slept[-1] == POLL_S
    slept.clear()
    ring.poll(_LandsAfter(4), poll_s=POLL_FIRST_S / 2)  # a shorter longest sleep caps the first
    assert slept == [POLL_FIRST_S / 2] * 3


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
