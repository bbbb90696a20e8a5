"""The life of a commbench job on one rank, the same for every tool.

1. Parse and check the flags; bad input ends every rank with exit status 2
   and one line naming the flag, before any library starts.
2. Start the backend the launcher implies (or ``--backend``).
3. Check the requested combination on every rank (same verdict everywhere,
   so no collective is needed); an impossible one exits 2.
   Before that, every rank's configuration is compared (a hash of every flag
   that must match, gathered): ranks that disagree end every rank with exit
   status 2 and a message naming the differing ranks and flags.
4. Run the tool's body, which returns the number of wrong elements its
   validation found, under the per-step watchdog (``commbench.watchdog``,
   ``--step-timeout``). An exception on any rank aborts the whole job (MPI
   abort or, under Gloo, the process exit horovodrun watches) with the rank
   and the error printed, exit status 1; wrong elements give exit status 1.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import torch

from commbench import __version__, watchdog
from commbench.comm import (
    TORCHRUN_VARS,
    Communicator,
    detect_backend,
    launcher_name,
    launcher_rank,
    make_communicator,
)
from commbench.comm.placement import TensorPlacement, decide, launcher_local_size
from commbench.cores import ThreadPlan, thread_plan
from commbench.flags import RANK0_ONLY_FIELDS, ConfigError, ToolConfig, check_dilation
from commbench.tables import rank0_print


def set_torch_threads(local_size: int, environ: Mapping[str, str] | None = None
                      ) -> ThreadPlan:
    """Set torch's threads by ``commbench.cores.thread_plan`` (the cores of the machine
    shared among its ranks); return the plan, rule included."""
    plan = thread_plan(local_size, environ)
    torch.set_num_threads(plan.threads)
    return plan


def config_fingerprint(cfg: Any) -> dict:
    """Everything in ``cfg`` that every rank must share, plus the code version and the
    contents of an input file named by path (one path may hold different files on
    different hosts)."""
    d = {k: v for k, v in cfg.as_dict().items() if k not in RANK0_ONLY_FIELDS}
    d["commbench_version"] = __version__
    if d.get("compute_profile"):
        try:
            with open(d["compute_profile"], "rb") as f:
                d["compute_profile_sha256"] = hashlib.sha256(f.read()).hexdigest()
        except OSError as e:
            d["compute_profile_sha256"] = f"unreadable: {e.strerror}"
    return d


def fingerprint_hash(fp: dict) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True, default=str).encode()).hexdigest()


def describe_disagreement(fps: list[dict]) -> str:
    """Which ranks differ from the majority configuration, and in which flags."""
    groups: dict[str, list[int]] = {}
    for r, fp in enumerate(fps):
        groups.setdefault(fingerprint_hash(fp), []).append(r)
    # the reference: the largest group; on a tie, the one rank 0 is in
    ref = max(groups.values(), key=lambda ranks: (len(ranks), -ranks[0]))
    ref_fp = fps[ref[0]]
    parts = []
    for ranks in groups.values():
        if ranks is ref:
            continue
        fp = fps[ranks[0]]
        keys = sorted(set(fp) | set(ref_fp), key=lambda k: (k not in fp, k))
        diff = [f"{k}={fp.get(k)!r} (rank {ref[0]}: {ref_fp.get(k)!r})"
                for k in keys if fp.get(k) != ref_fp.get(k)]
        who = _ranks_text(ranks)
        parts.append(f"{who} differ{'s' if len(ranks) == 1 else ''} from {_ranks_text(ref)} "
                     f"in {', '.join(diff)}")
    return "; ".join(parts)


def _ranks_text(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    shown = ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")
    return f"ranks {shown}"


def check_agreement(comm: Communicator, cfg: Any) -> None:
    """Raise ConfigError on every rank unless all ranks run the same configuration.

    One small hash per rank is gathered; only when they differ are the full
    fingerprints gathered to name the ranks and flags.
    """
    fp = config_fingerprint(cfg)
    hashes = comm.allgather_object(fingerprint_hash(fp))
    if len(set(hashes)) == 1:
        return
    fps = comm.allgather_object(fp)  # every rank saw the same hashes: all come here
    raise ConfigError("the ranks were started with different configurations: "
                      f"{describe_disagreement(fps)}; give every rank the same flags")


#: how long a rank other than 0 waits, after finding the command line bad, for rank 0
#: to say so and the launcher to end the job, before it says so itself
BAD_INPUT_GRACE_S = 10.0


def report_bad_input(prog: str, message: str) -> None:
    """One line on stderr for bad flags found before any library starts (no barrier yet).

    Rank 0 prints at once. The other ranks (the same flags give them the same
    error) wait first: the launcher ends the job when the first rank exits, so
    a rank that exits at once could have it killed before rank 0 has printed.
    A rank still alive after ``BAD_INPUT_GRACE_S`` found an error rank 0 did
    not (flags given to it alone) and prints it, with its rank.
    """
    rank = launcher_rank()
    if rank == 0:
        rank0_print(0, f"{prog}: error: {message}", file=sys.stderr)
        return
    time.sleep(BAD_INPUT_GRACE_S)
    sys.stderr.write(f"{prog}: error on rank {rank}: {message}\n")
    sys.stderr.flush()


def job_placement(cfg: ToolConfig, environ: Mapping[str, str] | None = None
                  ) -> tuple[str, TensorPlacement]:
    """The backend ``cfg`` runs on (``--backend``, or what the launcher implies) and where its
    tensors live and which library reduces them (``commbench.comm.placement.decide``, on
    what the tool's flags ask: ``cfg.device_request()``), checked before any library
    starts: the torch backend needs torchrun's rendezvous, its library
    (``--dist-backend``) must run here, and NCCL needs a GPU for each of the node's ranks;
    ``--dist-backend`` gloo or nccl needs the torch backend. A ConfigError names the flag,
    the same on every rank."""
    env = os.environ if environ is None else environ
    backend = detect_backend(dict(env)) if cfg.backend == "auto" else cfg.backend
    dist_backend = cfg.dist_backend
    # a library flag given to another backend: first what it could not do here either
    deciding = "torch" if dist_backend != "auto" else backend
    local_size = launcher_local_size(env) if backend == "torch" else None  # NCCL's GPUs
    try:
        placement = decide(deciding, dist_backend, cfg.device_request(), local_size=local_size)
        if backend != "torch" and dist_backend != "auto":
            launcher = launcher_name(dict(env))
            how = f"under {launcher}" if launcher != "none" else "started without a launcher"
            raise ConfigError(f"--dist-backend {dist_backend} chooses the torch backend's "
                              f"library, and this job runs on the {backend} backend ({how}): "
                              "start it with torchrun, or give --backend torch")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    # every tool: a GPU under time dilation is refused (no emulated cluster has one)
    check_dilation(placement.device.type)
    if backend != "torch":
        return backend, placement
    missing = [k for k in TORCHRUN_VARS if k not in env]
    if missing:
        raise ConfigError(f"--backend torch needs torchrun's rendezvous, and "
                          f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                          "set: start the job with torchrun (torchrun --nproc-per-node N -m "
                          "commbench.<tool>), or set them as torchrun does")
    return backend, placement


def job_backend(cfg: ToolConfig, environ: Mapping[str, str] | None = None) -> str:
    """The backend of ``job_placement``, checked as it checks it."""
    return job_placement(cfg, environ)[0]


def run_job(prog: str, argv: list[str] | None,
            parse: Callable[[list[str] | None], ToolConfig],
            check: Callable[[Communicator, Any], None],
            body: Callable[[Communicator, Any], int],
            before_init: Callable[[Any], None] | None = None) -> int:
    """Steps 1-4 above; return the exit status. ``before_init(cfg)`` runs between parsing
    and making the communicator: the place for settings the MPI library reads as it starts."""
    try:
        cfg = parse(argv)
        backend, placement = job_placement(cfg)
    except ConfigError as e:
        report_bad_input(prog, str(e))
        return 2
    if before_init is not None:
        before_init(cfg)
    step_timeout = cfg.step_timeout
    watchdog.horovod_stall_env(step_timeout)  # read by hvd.init, so before the backend
    comm = make_communicator(backend, placement=placement)
    try:
        check_agreement(comm, cfg)
        check(comm, cfg)
    except (ValueError, ConfigError) as e:  # the same verdict on every rank
        rank0_print(comm.rank, f"{prog}: error: {e}", file=sys.stderr)
        comm.barrier()  # no rank exits (and has the launcher end the job) before it is said
        comm.close()
        return 2
    try:
        wd = watchdog.Watchdog(prog, comm, step_timeout)
        watchdog.install(wd)
        wrong = body(comm, cfg)
        wd.stop()
        watchdog.install(watchdog.NullWatchdog())
        comm.close()
    except Exception:
        sys.stderr.write(f"{prog}: rank {comm.rank} failed:\n{traceback.format_exc()}")
        sys.stderr.flush()
        comm.abort(1)
        return 1
    if wrong:
        rank0_print(comm.rank, f"{prog}: {wrong} wrong elements in validation", file=sys.stderr)
        return 1
    return 0
