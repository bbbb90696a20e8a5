"""The end every check script under tests/mpi shares: gather each rank's list of
mismatches, print them (or the OK line) on rank 0, close the communicator, and
return the exit status (1 if any rank found a mismatch)."""

from __future__ import annotations

from commbench.comm.base import Communicator


def verdict(comm: Communicator, bad: list[str], ok_line: str, limit: int = 40) -> int:
    bad_all = comm.allgather_object(bad)
    rank = comm.rank
    comm.close()
    errors = [f"rank {i}: {m}" for i, b in enumerate(bad_all) for m in b]
    if rank == 0:
        print("\n".join(errors[:limit]) if errors else ok_line)
    return 1 if errors else 0
