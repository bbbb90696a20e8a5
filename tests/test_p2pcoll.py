"""The node collectives on point-to-point messages (``comm.p2pcoll``): ``Steps``, and the
collectives under mpirun against the closed form."""

from __future__ import annotations

import pytest
import torch

from commbench.comm.base import Handle
from commbench.comm.p2pcoll import (
    Steps,
    allgather_steps,
    reduce_scatter_steps,
    ring_allgather_steps,
    ring_reduce_scatter_steps,
)
from commbench.comm.ring import offsets
from tests.conftest import run_check


class _After(Handle):
    """Complete after ``n`` tests (``wait`` completes it at once); counts its waits."""

    def __init__(self, n: int) -> None:
        self.left, self.waited = n, 0

    def test(self) -> bool:
        self.left = max(0, self.left - 1)
        return self.left == 0

    def wait(self) -> None:
        self.left, self.waited = 0, self.waited + 1


def test_steps_by_test_moves_past_every_complete_message_and_stops_at_the_first_pending():
    msgs = [_After(1), _After(1), _After(3)]
    seen = []

    def gen():
        for m in msgs:
            yield m
            seen.append(m)

    h = Steps(gen())
    assert not h.test()  # the first two complete on their first test, the third is pending
    assert seen == msgs[:2]
    assert not h.test()
    assert h.test() and seen == msgs
    assert h.test()  # done stays done


def test_steps_wait_waits_for_every_message_in_order():
    msgs = [_After(5), _After(5)]
    h = Steps(iter(msgs))
    h.wait()
    assert [m.waited for m in msgs] == [1, 1] and h.test()


def test_steps_of_nothing_is_complete():
    assert Steps(iter(())).test()


class _One:
    """A group of one rank: nothing to send, no messages to wait for."""

    rank, size = 0, 1


@pytest.mark.parametrize(("rs", "ag"), [(reduce_scatter_steps, allgather_steps),
                                        (ring_reduce_scatter_steps, ring_allgather_steps)])
def test_one_rank_copies_its_part_and_sends_nothing(rs, ag):
    flat = torch.arange(6.0)
    part = torch.empty(6)
    assert list(rs(_One(), flat, [6], part)) == []
    assert torch.equal(part, flat)
    out = torch.zeros(6)
    assert list(ag(_One(), part, [6], out)) == []
    assert torch.equal(out, flat)


def test_offsets():
    assert offsets([3, 0, 2]) == [0, 3, 3]
    assert offsets([]) == []


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [2, 3, 4])
def test_equal_the_closed_form_mpi(np_):
    run_check("mpirun", np_, "p2p_collectives.py", "mpi",
              f"OK point-to-point node collectives on {np_} ranks")
