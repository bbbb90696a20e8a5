"""All-reduce time and bus bandwidth per message size, in the manner of nccl-tests.

Launch it like ``all_reduce_perf``; the flags are nccl-tests' flags::

    mpirun -np 4 python -m commbench.microbench -b 8 -e 128M -f 2             # plain MPI
    horovodrun -np 4 -H localhost:4 python -m commbench.microbench -d float16
    mpirun -np 64 --hostfile hosts python -m commbench.microbench --algo ring -e 1G

For every size from ``-b`` to ``-e`` (multiplied by ``-f``), every ``-d``
dtype and every ``--algo``:

1. warm up with ``-w`` all-reduces, then a barrier (waiting for a late rank
   stays out of the timed loop), then each rank times its own loop of ``-n``
   in-place all-reduces; its time per call is the loop's time over ``-n``.
   With ``--sync-each`` a barrier (not timed) starts every call instead, so
   that ranks enter each call together, as compute between a step's calls
   makes them (Intel MPI Benchmarks' ``-sync 1``); on the emulated cluster
   Open MPI's own ring-family all-reduces of 2 ranks ran at half the link
   back to back and at the link so (its put protocol over TCP when ranks
   enter apart; docs/microbench.md);
   The buffer holds zeros while timed: repeated in-place sums of anything
   else overflow float16/bfloat16 within a few calls. On a GPU (NCCL) the
   calls are timed as nccl-tests times them (``time_on_device``): two CUDA
   events on the current stream around ``-n`` back-to-back calls, each queued
   behind the last with no host wait between them; with ``-z`` (nccl-tests'
   ``-z 1``) or ``--sync-each`` a pair of events around each call, the host
   waiting for it before the next. Host buffers are timed on the host clock,
   as before;
2. gather the per-rank times on rank 0: min / avg / max over ranks (clocks of
   two ranks are never subtracted). algbw and busbw come from the average,
   as nccl-tests reports them by default (its ``-a 1``);
3. validate outside the timed loop: fill the buffer with fresh values whose
   sum has a closed form that is exact in the dtype, all-reduce once with the
   same algorithm, and count the elements that differ (``#wrong``).

With ``--horovod-cycle-ms C`` (mpi backend) Horovod is initialised beside the
communicator before the first row and shut down after the last, nothing ever
queued to it: every row then times MPI traffic Horovod does not carry while
its background thread coordinates every C ms, which is what the horovod
backend's MPI traffic of its own (the ring, the two-level algorithms' twins)
runs beside (``benchmarks/horovod_presence.py`` compares the two).

Rank 0 prints a ``#``-headed table as rows are measured, ending with the
average bus bandwidth, and writes one JSON Lines record per row. Exit
status: 0 when no element was wrong, 1 when any was (or a rank failed), 2 on
bad input (one line naming the flag, before any collective runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any, Callable

import torch

from commbench import dilation, flags, hostload, latency, linkstats, watchdog
from commbench.comm import BACKENDS, detect_backend
from commbench.comm.algos import ALGOS, TWO_LEVEL_ALGOS, check_algo, get_algo, wire_dtype
from commbench.comm.base import Communicator
from commbench.comm.hierarchical import pipeline_segments, plan_inter_node_algo
from commbench.flags import (
    ConfigError,
    DeviceRequest,
    ToolConfig,
    csv_list,
    flag,
    nonneg_int,
    parse_size,
    positive_float,
    positive_int,
)
from commbench.jobtime import Seconds, Where
from commbench.lifecycle import run_job
from commbench.metrics import algbw, busbw
from commbench.output import Output
from commbench.results import link_info
from commbench.tables import Column, format_footer, format_header, format_row
from commbench.timing import now

PROG = "commbench.microbench"

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}

# -- flags ---------------------------------------------------------------------

def _stepfactor(text: str) -> int:
    v = positive_int(text)
    if v <= 1:
        raise argparse.ArgumentTypeError(f"must be > 1, got {v}")
    return v


def _dtypes(text: str) -> list[str]:
    if text.strip() == "all":  # nccl-tests' -d all
        return list(DTYPES)
    return csv_list(tuple(DTYPES), "-d/--datatype")(text)


def message_sizes(minbytes: int, maxbytes: int, stepfactor: int) -> list[int]:
    """``minbytes``, times ``stepfactor`` each step, while not above ``maxbytes``."""
    sizes, size = [], minbytes
    while size <= maxbytes:
        sizes.append(size)
        size *= stepfactor
    return sizes


#: Open MPI's tuned all-reduce algorithms by the cost model's names (``ompi_info --param coll
#: tuned --level 9``: 3 recursive_doubling, 4 ring, 6 rabenseifner)
OMPI_ALLREDUCE = {"ring": 4, "rd": 3, "rabenseifner": 6}


@dataclass
class MicroConfig(ToolConfig):
    """The microbenchmark's flags: nccl-tests' names and defaults."""

    minbytes: int = flag("-b", "--minbytes", default=8, type=parse_size,
                         help="smallest message in bytes")
    maxbytes: int = flag("-e", "--maxbytes", default=32 << 20, type=parse_size,  # nccl-tests'
                         help="largest message in bytes")
    stepfactor: int = flag("-f", "--stepfactor", default=2, type=_stepfactor,
                           help="multiplication factor between sizes (integer > 1)")
    dtypes: list[str] = flag(
        "-d", "--datatype", "--dtype", default_factory=lambda: ["float32"],
        metavar="TYPE[,TYPE]", type=_dtypes,
        help=f"element types, one sweep each: {', '.join(DTYPES)} or all")
    algos: list[str] = flag(
        "--algo", default_factory=lambda: list(ALGOS), metavar="NAME[,NAME]",
        type=csv_list(ALGOS, "--algo"),
        help=f"all-reduce algorithms: {', '.join(ALGOS)} (native = the backend's own, ring = "
             "the project's reduce-scatter + all-gather)")
    #: Open MPI's all-reduce forced to this one (native)
    mpi_algorithm: str | None = flag(
        "--mpi-algorithm", default=None, choices=tuple(OMPI_ALLREDUCE),
        help="native = Open MPI's all-reduce forced to this algorithm (its tuned component's "
             "rule, set before MPI starts), recorded as the row's native_algorithm for the "
             "cost model; mpi backend, Open MPI only; default: the library's own choice")
    iters: int = flag("-n", "--iters", default=20, type=positive_int,  # nccl-tests' defaults
                      help="timed all-reduces per size and algorithm")
    warmup_iters: int = flag("-w", "--warmup_iters", default=5, type=nonneg_int,
                             help="untimed all-reduces before them")
    #: a barrier before each timed call (else back to back)
    sync_each: bool = flag(
        "--sync-each", default=False, action="store_true",
        help="a barrier (not timed) before each timed all-reduce, so ranks enter every call "
             "together as after a step's compute (Intel MPI Benchmarks' -sync 1); default: "
             "each rank's calls back to back, as nccl-tests and OSU time them")
    #: on a GPU: each call between its own pair of CUDA events, the host waiting for it
    blocking: bool = flag(
        "-z", "--blocking", default=False, action="store_true",
        help="on a GPU: time each all-reduce between its own pair of CUDA events, the host "
             "waiting for it before queuing the next (nccl-tests' -z 1); default: -n calls "
             "back to back between two events on one stream. Host buffers: each call is "
             "waited for by the host either way")
    #: Horovod initialised beside the mpi backend, its background thread coordinating every
    #: this many ms (HOROVOD_CYCLE_TIME); None: Horovod is not imported
    horovod_cycle_ms: float | None = flag(
        "--horovod-cycle-ms", default=None, metavar="MS", type=positive_float,
        help="initialise Horovod (hvd.init with HOROVOD_CYCLE_TIME=MS) beside the mpi backend "
             "for the whole sweep and queue nothing to it: the all-reduces, which Horovod "
             "does not carry, are timed with its background thread coordinating every MS "
             "ms (what Horovod's presence alone costs MPI traffic); rows record it as "
             "horovod_cycle_ms; mpi backend only; default: Horovod not imported")

    #: where the buffers live: a CUDA device under NCCL (a real NCCL microbenchmark, as
    #: nccl-tests), else host memory
    device: str = flag("--device", default="auto", choices=("auto", "cpu", "cuda"),
                       help="where the buffers live: cuda needs a backend whose collectives "
                            "take device tensors (--backend torch on NCCL); auto = cuda under "
                            "torchrun where CUDA is here (--dist-backend auto or nccl), else "
                            "cpu")

    def device_request(self) -> DeviceRequest:
        """The buffers where ``--device`` asks, and they are the collectives' own: a GPU only
        where the library reduces device tensors (``commbench.comm.placement.decide``)."""
        return DeviceRequest(self.device, staging=False)

    def sizes(self) -> list[int]:
        return message_sizes(self.minbytes, self.maxbytes, self.stepfactor)

    def emulated_s(self, where: Where) -> Seconds:
        """How long the sweep takes on ``where`` (``commbench.jobtime``): every size of
        every type, each algorithm, warm-up and timed calls, at about a ring's link time."""
        calls = (self.iters + self.warmup_iters) * len(self.algos) * len(self.dtypes)
        per = [where.allreduce(n) for n in self.sizes()]
        return Seconds(calls * sum(t.dilated for t in per),
                       where.startup_s("microbench") + calls * sum(t.host for t in per))

    def probe(self) -> MicroConfig:
        """This sweep shortened for a dilation probe: 3 timed calls after 1, no table."""
        return dataclasses.replace(self, iters=3, warmup_iters=1, quiet=True)


def build_parser() -> argparse.ArgumentParser:
    p = flags.tool_parser(
        f"python -m {PROG}",
        "Time the all-reduce per message size and report algbw, busbw and #wrong as "
        "nccl-tests does. Run it under horovodrun or mpirun.",
        ["mpirun -np 4 python -m commbench.microbench -b 8 -e 128M -f 2",
         "horovodrun -np 4 -H localhost:4 python -m commbench.microbench -d all"],
        note="sizes take K, M, G suffixes (binary: 1K = 1024 bytes).\n")
    flags.add_fields(p.add_argument_group("sizes to scan"), MicroConfig,
               ["minbytes", "maxbytes", "stepfactor"])
    g = p.add_argument_group("operation")
    flags.add_fields(g, MicroConfig, ["dtypes", "algos", "mpi_algorithm"])
    flags.add_backend_flag(g, BACKENDS)
    flags.add_fields(g, MicroConfig, ["device"])
    g = p.add_argument_group("performance")
    flags.add_fields(g, MicroConfig, ["iters", "warmup_iters", "sync_each", "blocking",
                                      "horovod_cycle_ms"])
    flags.add_step_timeout_flag(g, what="row (size, type, algorithm)")
    flags.add_output_group(p, "microbench")
    return p


def parse_config(argv: list[str] | None = None) -> MicroConfig:
    """Parse and check ``argv``; raise ConfigError naming the flag on bad input."""
    ns = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    cfg = MicroConfig(**flags.values_for(MicroConfig, ns))
    if cfg.minbytes > cfg.maxbytes:
        raise ConfigError(f"-b/--minbytes {cfg.minbytes} is above -e/--maxbytes "
                          f"{cfg.maxbytes}")
    for name in cfg.dtypes:
        item = DTYPES[name].itemsize
        for name_of, size in (("-b/--minbytes", cfg.minbytes), ("-e/--maxbytes", cfg.maxbytes)):
            if size % item:
                raise ConfigError(f"{name_of} {size} is not a multiple of the {name} element "
                                  f"size ({item} bytes)")
    if cfg.mpi_algorithm and "native" not in cfg.algos:
        raise ConfigError("--mpi-algorithm forces the MPI library's own all-reduce: give "
                          "--algo native too")
    backend = detect_backend() if cfg.backend == "auto" else cfg.backend
    if cfg.mpi_algorithm and backend != "mpi":
        raise ConfigError(f"--mpi-algorithm forces Open MPI's all-reduce, and this job runs "
                          f"on the {backend} backend, whose native all-reduce is "
                          f"{'Horovod' if backend == 'horovod' else 'torch.distributed'}'s: "
                          "launch with mpirun, or give --backend mpi")
    if cfg.horovod_cycle_ms is not None:
        check_horovod_beside(backend)
    flags.check_output(cfg)
    return cfg


def check_horovod_beside(backend: str) -> None:
    """``--horovod-cycle-ms`` applies to the mpi backend (``backend``: the one the job will
    run on, ``auto`` resolved as the launcher implies, as ``commbench.lifecycle`` will) with
    Horovod installed."""
    if backend != "mpi":
        raise ConfigError(f"--horovod-cycle-ms initialises Horovod beside the mpi backend, to "
                          f"time MPI traffic Horovod does not carry; this job runs on the "
                          f"{backend} backend, where Horovod carries the native all-reduce "
                          "itself (set HOROVOD_CYCLE_TIME for its cycle there): launch with "
                          "mpirun, or give --backend mpi")
    if importlib.util.find_spec("horovod") is None:
        raise ConfigError("--horovod-cycle-ms needs Horovod installed (the [horovod] extra: "
                          "make setup)")


def force_mpi_algorithm(cfg: MicroConfig, environ: MutableMapping[str, str]) -> None:
    """``--mpi-algorithm``: Open MPI reads its tuned component's forced all-reduce from the
    environment when MPI starts, so this runs before the communicator is made."""
    if cfg.mpi_algorithm:
        environ["OMPI_MCA_coll_tuned_use_dynamic_rules"] = "1"
        environ["OMPI_MCA_coll_tuned_allreduce_algorithm"] = str(
            OMPI_ALLREDUCE[cfg.mpi_algorithm])


def start_horovod_beside(cfg: MicroConfig, environ: MutableMapping[str, str]
                         ) -> tuple[Any, dict]:
    """``--horovod-cycle-ms``: ``hvd.init()`` with ``HOROVOD_CYCLE_TIME`` set; return
    horovod.torch and what every row records of it, its cycle and the controller its thread
    coordinates over (``mpi`` under mpirun); (None, {}) without the flag. Called with the mpi
    communicator made: mpi4py has initialised MPI (``MPI_THREAD_MULTIPLE``), so Horovod
    shares it, as under the horovod backend (``HorovodCommunicator``), and does not
    finalise it at shutdown."""
    if cfg.horovod_cycle_ms is None:
        return None, {}
    environ["HOROVOD_CYCLE_TIME"] = f"{cfg.horovod_cycle_ms:g}"
    dilation.apply_horovod_cycle(environ)  # x K under time dilation
    import horovod.torch as hvd  # optional extra (checked in parse_config); only with the flag

    hvd.init()
    return hvd, {"horovod_cycle_ms": cfg.horovod_cycle_ms,
                 "horovod_controller": "mpi" if hvd.mpi_enabled() else "gloo"}


# -- validation values -----------------------------------------------------------

def exact_limit(dtype: torch.dtype) -> int:
    """Every integer in [0, limit] is exact in ``dtype``: 2**24, 2**11, 2**8."""
    return 2 * round(1 / torch.finfo(dtype).eps)


@dataclass(frozen=True)
class Pattern:
    """Validation values whose sum over ranks is exact in the dtype, in any order.

    Element ``j`` of rank ``r`` holds ``(j % period + 1) * weight(r)``, with
    ``weight(r) = r % modulus + 1`` for the first ``contributors`` ranks and 0
    after them; the sum is ``(j % period + 1) * total``. Every partial sum is an
    integer of at most ``period * total <= exact_limit``, so any reduction
    order gives the closed form bit for bit.
    """

    period: int
    modulus: int
    contributors: int
    total: int

    def weight(self, rank: int) -> int:
        return rank % self.modulus + 1 if rank < self.contributors else 0

    def values(self, scale: int, dtype: torch.dtype) -> torch.Tensor:
        return (torch.arange(1, self.period + 1, dtype=torch.float64) * scale).to(dtype)


def _weight_sum(ranks: int, modulus: int) -> int:
    q, t = divmod(ranks, modulus)
    return q * modulus * (modulus + 1) // 2 + t * (t + 1) // 2


def validation_pattern(world_size: int, dtype: torch.dtype, max_period: int = 13) -> Pattern:
    """The richest exact pattern for ``world_size`` ranks in ``dtype``.

    Prefers distinct weights per rank (modulus = ranks) and at least two
    distinct element values; shrinks the modulus when the sum would leave the
    exact range. On more than ``exact_limit`` ranks (256 in bfloat16) only the
    first ``exact_limit`` contribute non-zero values: every rank's result is
    still checked, but a lost contribution of a later rank goes unseen.
    """
    limit = exact_limit(dtype)
    contributors = min(world_size, limit)
    modulus = contributors
    while modulus > 1 and 2 * _weight_sum(contributors, modulus) > limit:
        modulus -= 1
    total = _weight_sum(contributors, modulus)
    return Pattern(period=max(1, min(max_period, limit // total)), modulus=modulus,
                   contributors=contributors, total=total)


def _tiled(buf: torch.Tensor, period: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``buf`` as a (rows, period) view plus the tail, so patterns tile without copies."""
    rows = buf.numel() // period
    return buf[: rows * period].view(rows, period), buf[rows * period:]


def fill_pattern(buf: torch.Tensor, values: torch.Tensor) -> None:
    body, tail = _tiled(buf, values.numel())
    body.copy_(values)  # broadcast over rows
    tail.copy_(values[: tail.numel()])


def count_mismatches(buf: torch.Tensor, values: torch.Tensor) -> int:
    body, tail = _tiled(buf, values.numel())
    return int((body != values).sum()) + int((tail != values[: tail.numel()]).sum())


# -- measuring -----------------------------------------------------------------

AllReduce = Callable[[Communicator, torch.Tensor], None]


def time_per_call(comm: Communicator, allreduce: AllReduce, buf: torch.Tensor, iters: int,
                  warmup: int, sync_each: bool = False,
                  monitor: hostload.HostMonitor | None = None) -> tuple[float, dict[str, float]]:
    """This rank's seconds per all-reduce (its own loop of ``iters``, after a barrier; with
    ``sync_each`` the mean of calls each started by an untimed barrier), and seconds per
    call of each phase the algorithm reports (``commbench.comm.phases``). ``monitor`` reads
    the host's counters around the timed calls (``commbench.hostload``)."""
    buf.zero_()
    for _ in range(warmup):
        allreduce(comm, buf)
    phases: dict[str, float] = {}

    def on_phase(name: str, t0: float, t1: float) -> None:
        phases[name] = phases.get(name, 0.0) + t1 - t0

    comm.barrier()  # a late rank's lateness is not transfer time
    if monitor is not None:
        monitor.start()
    if sync_each:
        total = 0.0
        for _ in range(iters):
            comm.barrier()
            t0 = now()
            allreduce(comm, buf, on_phase=on_phase)
            total += now() - t0
        seconds = total / iters
    else:
        start = now()
        for _ in range(iters):
            allreduce(comm, buf, on_phase=on_phase)
        seconds = (now() - start) / iters
    if monitor is not None:
        monitor.stop()
    return seconds, {k: v / iters for k, v in phases.items()}


def queued_native(comm: Communicator, buf: torch.Tensor, on_phase: Any = None) -> None:
    """The backend's own all-reduce of ``buf`` queued on its GPU: the current stream waits
    for it, the host does not (``Handle.wait_on_device``), so calls run back to back as
    nccl-tests runs them. Elsewhere the blocking call."""
    comm.iallreduce(buf).wait_on_device()


def on_device_form(name: str, allreduce: AllReduce) -> AllReduce:
    """Algorithm ``name`` as ``time_on_device`` times it: ``native`` queued
    (``queued_native``); the others as they run, each of their blocking calls returning
    once the device has finished it."""
    return queued_native if name == "native" else allreduce


def time_on_device(comm: Communicator, allreduce: AllReduce, buf: torch.Tensor, iters: int,
                   warmup: int, per_call: bool = False, sync_each: bool = False,
                   monitor: hostload.HostMonitor | None = None) -> float:
    """This rank's seconds per all-reduce of ``buf``, on its GPU, as nccl-tests times them.

    1. ``warmup`` calls, the stream drained, a barrier (a late rank's lateness is not
       transfer time);
    2. two CUDA events on the current stream around ``iters`` back-to-back calls, queued
       with no host wait between them (``queued_native``); or, with ``per_call``
       (nccl-tests' ``-z 1``), a pair around each call, the host waiting on its end event
       before queuing the next, and with ``sync_each`` an untimed barrier before each;
    3. the events' elapsed time over ``iters``, in emulated seconds (``commbench.dilation``).

    Only ``torch.cuda.Event``/``current_stream`` (torch 2.11 has them). The correctness
    pass runs apart, after (``validate``).
    """
    stream = torch.cuda.current_stream(buf.device)
    buf.zero_()
    for _ in range(warmup):
        allreduce(comm, buf)
    stream.synchronize()
    comm.barrier()
    if monitor is not None:
        monitor.start()
    elapsed_ms = 0.0
    for calls in ([1] * iters if per_call or sync_each else [iters]):
        if sync_each:
            comm.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(calls):
            allreduce(comm, buf)
        end.record(stream)
        end.synchronize()  # the host waits here, after the timed calls, never between them
        elapsed_ms += start.elapsed_time(end)
    if monitor is not None:
        monitor.stop()
    return elapsed_ms / 1e3 / iters / dilation.factor()


def validate(comm: Communicator, allreduce: AllReduce, buf: torch.Tensor) -> int:
    """Wrong elements on this rank after one all-reduce of fresh, exactly summable values."""
    pattern = validation_pattern(comm.size, buf.dtype)
    fill_pattern(buf, pattern.values(pattern.weight(comm.rank), buf.dtype).to(buf.device))
    allreduce(comm, buf)
    return count_mismatches(buf, pattern.values(pattern.total, buf.dtype).to(buf.device))


TIME_W = 10


def table_columns() -> list[Column]:
    return [
        Column("size", "B", 12), Column("count", "elements", 12), Column("type", "", 8),
        Column("algo", "", max(6, *(len(a) for a in ALGOS))),
        Column("min", "us", TIME_W, ".2f"), Column("avg", "us", TIME_W, ".2f"),
        Column("max", "us", TIME_W, ".2f"),
        Column("algbw", "GB/s", 7, ".2f"), Column("busbw", "GB/s", 7, ".2f"),
        Column("#wrong", "", 6),
    ]


def table_row(rec: dict) -> list:
    t = rec["time_us"]
    return [rec["size"], rec["count"], rec["dtype"], rec["algo"], t["min"], t["avg"], t["max"],
            rec["algbw"], rec["busbw"], rec["wrong"]]


def make_record(comm: Communicator, cfg: MicroConfig, size: int, dtype: str, algo: str,
                per_rank: list[tuple[float, int, dict[str, float], dict | None]],
                beside: dict | None = None, alpha_us: float | None = None) -> dict:
    """One row's fields on rank 0 from every rank's (seconds per call, wrong elements,
    seconds per call of each phase, its host window); ``beside``: the fields of what ran
    beside the sweep (``start_horovod_beside``); ``alpha_us``: the job's measured latency
    between nodes, for the row's ``latency_share`` (``commbench.latency``)."""
    seconds = [s for s, _, _, _ in per_rank]
    slowest = max(range(len(per_rank)), key=lambda r: seconds[r])
    avg_s = sum(seconds) / len(seconds)
    n = comm.size
    return {
        "size": size,
        "count": size // DTYPES[dtype].itemsize,
        "dtype": dtype,
        "device": str(comm.placement().comm_device),
        "wire_dtype": str(wire_dtype(comm, algo, DTYPES[dtype])).removeprefix("torch."),
        "algo": algo,
        # --mpi-algorithm: what Open MPI's own all-reduce was forced to (the cost model's name)
        **({"native_algorithm": cfg.mpi_algorithm} if algo == "native" and cfg.mpi_algorithm
           else {}),
        **(beside or {}),
        # which path the two-level algorithms took: the ring or the group's all-reduce
        # across nodes; 1 segment = unpipelined
        **({"inter_node_algo": plan_inter_node_algo(comm),
            "hier_segments": pipeline_segments(comm, size // DTYPES[dtype].itemsize,
                                               DTYPES[dtype].itemsize)}
           if algo in TWO_LEVEL_ALGOS and comm.size > 1 else {}),
        "time_us": {"min": min(seconds) * 1e6, "avg": avg_s * 1e6, "max": max(seconds) * 1e6},
        "algbw": algbw(size, avg_s),
        "busbw": busbw(size, avg_s, n),
        "wrong": sum(w for _, w, _, _ in per_rank),
        "iters": cfg.iters,
        "warmup": cfg.warmup_iters,
        "sync_each": cfg.sync_each,  # a barrier before each timed call (else back to back)
        # how the calls were timed: CUDA events around -n back-to-back calls, or around
        # each (-z, --sync-each); the host clock for host buffers
        "timer": ("host" if not comm.placement().on_device else
                  "cuda-events-per-call" if cfg.blocking or cfg.sync_each else
                  "cuda-events-back-to-back"),
        # per phase: the slowest rank's time per call, so phases add up to its time;
        # every rank's under ranks
        "phases_us": {k: v * 1e6 for k, v in per_rank[slowest][2].items()},
        "ranks": {"time_us": [s * 1e6 for s in seconds], "wrong": [w for _, w, _, _ in per_rank],
                  "phases_us": [{k: v * 1e6 for k, v in ph.items()} for _, _, ph, _ in per_rank]},
        **link_info(),  # the launcher's measured link, so busbw reads as a fraction of it
        **host_fields(per_rank, avg_s * cfg.iters),
        **latency.latency_fields(alpha_us, 1, avg_s),
    }


def host_fields(per_rank: list, timed_s: float) -> dict:
    """The row's host load and verdict (``commbench.hostload``), and the link's efficiency:
    the busiest link's bytes over the timed calls at its measured rate, against their time."""
    host = hostload.summarize([p[3] for p in per_rank], os.cpu_count())
    link = link_info()
    eff = linkstats.link_efficiency(host and host["link_bytes"],
                                    link["link_wire_gbps"] or link["link_gbps"], timed_s)
    return {"host": host, "link_efficiency": eff, "bound": hostload.verdict(host)}


def device_timing_note(cfg: MicroConfig) -> str:
    """How ``time_on_device`` timed the calls, for the footer."""
    if cfg.blocking or cfg.sync_each:
        return ", each call between CUDA events, the host waiting for it (-z)"
    return ", CUDA events around the back-to-back calls on one stream"


def footer_lines(comm: Communicator, cfg: MicroConfig, records: list[dict], path: Any,
                 alpha: dict | None = None) -> list:
    """The table's footer, ending with nccl-tests' "Avg bus bandwidth" lines; ``alpha``: the
    job's measured latency between nodes (``commbench.latency.measure``'s fields)."""
    n_wrong = sum(r["wrong"] for r in records)
    lines = [f"hosts: {', '.join(sorted(set(comm.topo.hostnames)))}",
             f"time: per all-reduce, each rank's own loop of {cfg.iters} after a barrier"
             f"{' (and one before each call, untimed)' if cfg.sync_each else ''}"
             f"{device_timing_note(cfg) if comm.placement().on_device else ''}; "
             "min/avg/max over ranks; algbw = size / avg; busbw = algbw * 2(n-1)/n"]
    widened = sorted({(r["algo"], r["dtype"], r["wire_dtype"]) for r in records
                      if r["wire_dtype"] != r["dtype"]})
    for algo, dtype, wire in widened:
        lines.append(f"note: {comm.name} {algo} has no {dtype} all-reduce here: it runs as "
                     f"{wire} on the wire (twice the bytes) and its time includes two casts")
    def label(r: dict) -> str:
        return f"{r['size']} B {r['dtype']} {r['algo']}"

    lines += hostload.footer_lines(records, label, dilation.factor())
    lines += latency.footer_lines(alpha or {}, dilation.factor(),
                                  [(label(r), r) for r in records])
    lines += [f"#wrong total : {n_wrong} {'OK' if n_wrong == 0 else 'FAILED'}",
              f"results: {path}"]
    combos = list(dict.fromkeys((r["dtype"], r["algo"]) for r in records))
    for dtype, algo in combos:
        bws = [r["busbw"] for r in records if (r["dtype"], r["algo"]) == (dtype, algo)]
        avg = sum(bws) / len(bws) if bws else math.nan
        which = f"  ({dtype} {algo})" if len(combos) > 1 else ""
        lines.append(f"Avg bus bandwidth : {avg:.3f}{which}")
    return lines


def time_row(comm: Communicator, cfg: MicroConfig, name: str, allreduce: AllReduce,
             buf: torch.Tensor, monitor: hostload.HostMonitor) -> tuple[float, dict[str, float]]:
    """One row's seconds per call and per phase: on the host clock (``time_per_call``), or on
    a GPU by CUDA events (``time_on_device``: whole calls, no phases)."""
    if comm.placement().on_device:
        return time_on_device(comm, on_device_form(name, allreduce), buf, cfg.iters,
                              cfg.warmup_iters, cfg.blocking, cfg.sync_each, monitor), {}
    return time_per_call(comm, allreduce, buf, cfg.iters, cfg.warmup_iters, cfg.sync_each,
                         monitor)


def run_sweep(out: Output, cfg: MicroConfig, columns: list[Column],
              beside: dict | None = None) -> list[dict]:
    """Measure every (dtype, size, algo); rank 0 writes and prints rows as they come, each
    with ``beside``'s fields."""
    comm = out.comm
    run = out.run({})  # one run: every row shares its id and header
    algos = {name: get_algo(name) for name in cfg.algos}
    wd = watchdog.current()  # a deadline per row
    monitor = hostload.HostMonitor(linkstats.link_iface() if comm.local_rank == 0 else None)
    records: list[dict] = []
    for dtype in cfg.dtypes:
        for size in cfg.sizes():
            buf = torch.empty(size // DTYPES[dtype].itemsize, dtype=DTYPES[dtype],
                              device=comm.placement().comm_device)
            for name, allreduce in algos.items():
                wd.begin_step(f"{size} B {dtype} {name}")
                seconds, phases = time_row(comm, cfg, name, allreduce, buf, monitor)
                wrong = validate(comm, allreduce, buf)
                per_rank = comm.gather_object((seconds, wrong, phases,
                                               monitor.result and monitor.result.as_dict()))
                wd.end_step()
                if comm.rank != 0:
                    continue
                rec = run.write("microbench",
                                make_record(comm, cfg, size, dtype, name, per_rank, beside,
                                            out.alpha.get("alpha_us")))
                records.append(rec)
                out.print(format_row(columns, table_row(rec)))
            del buf
    return records


def check(comm: Communicator, cfg: MicroConfig) -> None:
    for name in cfg.algos:
        check_algo(comm, name)
    if cfg.mpi_algorithm:
        library = comm.versions().get("mpi_library", "")
        if comm.name != "mpi" or "Open MPI" not in library:
            raise ConfigError(f"--mpi-algorithm needs the mpi backend on Open MPI, not "
                              f"{comm.name} on {library or 'no MPI library'}")


def bench(comm: Communicator, cfg: MicroConfig) -> int:
    """The whole size x dtype x algo sweep, its table and records; return wrong elements."""
    out = Output.open(comm, "microbench", cfg)
    columns = table_columns()
    horovod_note = (f"  Horovod initialised beside (cycle {cfg.horovod_cycle_ms:g} ms)"
                    if cfg.horovod_cycle_ms else "")
    out.print(format_header(columns, title=(
        f"{PROG}  backend {comm.name}  ranks {comm.size}  nodes {comm.topo.nodes}  "
        f"minBytes {cfg.minbytes}  maxBytes {cfg.maxbytes}  step: "
        f"{cfg.stepfactor}(factor)  warmup iters: {cfg.warmup_iters}  iters: "
        f"{cfg.iters}  torch threads/rank {out.threads}{horovod_note}")))
    hvd, beside = start_horovod_beside(cfg, os.environ)
    records = run_sweep(out, cfg, columns, beside)
    if hvd is not None:
        # Horovod's thread ends here, before the job frees anything of MPI's (comm.close: the
        # 2-byte types' datatype and ops): its thread is in MPI every cycle, and freeing a
        # communicator beside it crashed in MPI_Comm_free (HorovodCommunicator.close has the
        # same order). The timed communicator is MPI_COMM_WORLD itself, never freed.
        hvd.shutdown()
    wrong = comm.bcast_object(sum(r["wrong"] for r in records) if comm.rank == 0 else None)
    out.close()
    if comm.rank == 0:
        out.print(format_footer(footer_lines(comm, cfg, records, out.path, out.alpha)))
    return wrong


def main(argv: list[str] | None = None) -> int:
    return run_job(PROG, argv, parse_config, check, bench,
                   before_init=lambda cfg: force_mpi_algorithm(cfg, os.environ))


if __name__ == "__main__":
    sys.exit(main())
