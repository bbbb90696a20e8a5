"""Run under mpirun/horovodrun: both hierarchical all-reduces equal the native one.

Small-integer values make every sum exact, so results must match bit for
bit, on sizes from 1 element to above 1M, including sizes below the shard
count and primes; each unpipelined (default segments, above these sizes) and
pipelined in small segments of odd byte counts (more segments than ranks,
segments that split shards unevenly) where the layout pipelines (else that
pass would repeat the unpipelined one, and is skipped). The union of the phase intervals
each variant reports, pipelined or not, must cover at least 95 % of its
call's time in the best of three calls.
Exits 1 on a mismatch. Prints the topology it saw.

    mpirun -np 4 python tests/mpi/hier_vs_native.py mpi [float32,bfloat16]
"""

from __future__ import annotations

import sys
import time

import torch
from verdict import verdict  # beside this script (scripts run as files)

from commbench.comm import make_communicator
from commbench.comm.hierarchical import (
    hierarchical_allreduce,
    leader_allreduce,
    pipeline_segments,
)
from commbench.metrics import union_length
from commbench.microbench import DTYPES  # the element types by name, as -d takes them

SIZES = [1, 2, 3, 7, 97, 65537, 1_000_003]
#: pipeline segments for the pipelined pass: odd byte counts, many segments
SMALL_SEGMENTS = {1_000_003: 262_147, 65537: 9_998}
COVERAGE = 0.95
COVERAGE_TRIES = 3
COVERAGE_NUMEL = 1 << 22  # 16 MiB of float32 ...
COVERAGE_SEGMENT = 1 << 20  # ... in 16 segments where it pipelines


def timed(comm, fn, t: torch.Tensor, **kw) -> tuple[float, list[tuple[float, float]]]:
    """Seconds ``fn`` took on ``t`` and the phase intervals it reported."""
    spans: list[tuple[float, float]] = []
    start = time.perf_counter()
    fn(comm, t, on_phase=lambda _n, a, b: spans.append((a, b)), **kw)
    return time.perf_counter() - start, spans


def main() -> int:
    comm = make_communicator(sys.argv[1] if len(sys.argv) > 1 else "mpi")
    # a second argument: the dtypes to check (comma-separated), all by default
    dtypes = [DTYPES[d] for d in sys.argv[2].split(",")] if len(sys.argv) > 2 else DTYPES.values()
    n, r = comm.size, comm.rank
    bad = []
    pipelined = 0
    for dtype in dtypes:
        for numel in SIZES:
            base = (torch.arange(numel) % 3 + 1).to(dtype)
            expected = base * (n * (n + 1) // 2)
            for name, fn in (("hier", hierarchical_allreduce), ("leader", leader_allreduce)):
                for seg in (None, SMALL_SEGMENTS.get(numel)):
                    if seg is None and numel in SMALL_SEGMENTS and name == "leader":
                        continue  # unpipelined leader at large sizes: slow, covered above
                    if (seg and name == "hier"
                            and pipeline_segments(comm, numel, base.element_size(), seg) == 1):
                        continue  # it would not pipeline here: the pass above, again
                    t = base * (r + 1)
                    fn(comm, t, **({} if seg is None else {"segment_bytes": seg}))
                    if seg and pipeline_segments(comm, numel, t.element_size(), seg) > 1:
                        pipelined += 1
                    if not torch.equal(t, expected):
                        bad.append(f"{name} {dtype} numel={numel} segment_bytes={seg}: "
                                   f"{int((t != expected).sum())} wrong")
    # phase coverage, on a call long enough that the launcher's scheduling is noise:
    # the union of the reported intervals against the call's own time
    big = torch.ones(COVERAGE_NUMEL)
    variants = (("hier", hierarchical_allreduce), ("leader", leader_allreduce))
    for name, fn in variants if n > 1 else ():  # one rank: nothing runs, no phases
        for seg in (None, COVERAGE_SEGMENT):
            if seg and pipeline_segments(comm, COVERAGE_NUMEL, big.element_size(), seg) == 1:
                continue  # no pipeline on this layout (Gloo, one rank a node): as above
            kw = {} if seg is None else {"segment_bytes": seg}
            fn(comm, big, **kw)  # warm-up
            # best of a few calls: with more ranks than cores, a rank preempted
            # between two phases leaves a gap no phase could have reported
            best = []
            for _ in range(COVERAGE_TRIES):
                took, spans = timed(comm, fn, big, **kw)
                best = max(best, [union_length(spans) / took, took])
                if best[0] >= COVERAGE:
                    break
            covered, took = best
            if covered < COVERAGE:
                bad.append(f"{name} segment_bytes={seg}: its phases cover {covered:.3f} of "
                           f"its {took * 1e3:.1f} ms")
    layout = comm.topo.local_sizes
    return verdict(comm, bad, f"OK hierarchical == native on {n} ranks, nodes {list(layout)}, "
                              f"{pipelined} pipelined calls")


if __name__ == "__main__":
    sys.exit(main())
