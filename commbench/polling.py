"""How a waiter that tests a message between doubling sleeps sees it complete.

The engine's ring (``commbench.comm.ring.poll``) waits for each message by testing it,
sleeping ``POLL_FIRST_S``, testing, sleeping twice as long, and so on up to ``POLL_S``:
the core stays free for compute, at the price of seeing a message some time after it
landed. ``seen_s`` is that instant, so a model (``analysis.overlap``) can price the
engine's ring as it runs rather than as the library's blocking wait, which the
microbenchmark's fit is made of. The ring's segment size lives here for the same
reason. Torch-free: ``analysis/`` imports it.
"""

from __future__ import annotations

import os

# 1 MiB: large enough for the link, small enough to pipeline. Tunable like
# NCCL_BUFFSIZE, through COMMBENCH_RING_SEGMENT_BYTES (commbench.comm.ring).
SEGMENT_BYTES = int(os.environ.get("COMMBENCH_RING_SEGMENT_BYTES", 1 << 20))

#: the longest sleep between tests of a message when the ring polls: a 1 MiB segment takes
#: ~8 ms at 1 Gbit/s, and socket buffers keep the link busy meanwhile
POLL_S = 0.0005
#: the first sleep of a wait; each next one doubles, up to POLL_S. A message that lands soon
#: (a small bucket's: 64 KiB take 0.5 ms at 1 Gbit/s) is seen soon, a long one costs four
#: more tests. With a flat 0.5 ms every message waited up to 0.5 ms: a 64 KiB all-reduce
#: on the ring over 2 x 4 ranks (14 steps) took 5.3 ms against 0.34 ms for Open MPI's
#: (peer_fairness's probe at K = 4), and --bucket-mb auto could not afford small buckets.
POLL_FIRST_S = POLL_S / 16


def seen_s(done_s: float, first_s: float = POLL_FIRST_S, cap_s: float = POLL_S) -> float:
    """When a poll that began at 0 sees a message that completed at ``done_s``: the first
    test is at once, then one after each sleep of ``first_s``, ``2 first_s``, ... up to
    ``cap_s`` (sleeps and tests taken as exact)."""
    if done_s <= 0:
        return 0.0
    t, sleep = 0.0, min(first_s, cap_s)
    while t < done_s:
        t += sleep
        sleep = min(2 * sleep, cap_s)
    return t


def polled_ring_s(ring_s: float, nbytes: float, ranks: int,
                  segment_bytes: int = SEGMENT_BYTES) -> float:
    """The engine's polled ring, from the blocking ring's ``ring_s`` for ``nbytes`` on
    ``ranks``: each of its ``2 (ranks - 1)`` steps is seen when a poll sees it, where a
    step is one message (its chunk, ``nbytes / ranks``, fits one segment). Longer steps
    pipeline their segments and keep their receives posted ahead, so a poll's lateness
    is hidden behind the next segment on the wire: the quick study's 25 MB ring buckets
    moved at the fit's time (docs/analysis.md), and they are priced as blocking."""
    steps = 2 * (ranks - 1)
    if steps <= 0 or ring_s <= 0 or nbytes / ranks > segment_bytes:
        return ring_s
    return steps * seen_s(ring_s / steps)
