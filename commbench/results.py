"""Result records: what every run writes, and how.

Rank 0 writes JSON Lines: one ``step`` record per step of every run (raw
per-rank samples kept), written as soon as the step ends, and one ``summary``
record per run. Each line is complete JSON, written in one call, flushed and
fsynced as it is produced, so a job killed at any moment leaves every
finished record readable and at most one partial last line, which
``read_records`` skips with a warning. Whole files (summaries, markers) go
through ``write_atomic``: temporary name, fsync, rename. NaN/inf become
``null`` (JSON has neither).

Every record carries what is needed to reproduce it (docs/metrics.md, "Honest
measurement"): schema
version, versions, backend, strategy and knobs, ranks, nodes, ranks per node,
host names, model, batch, dtype and the full configuration.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import subprocess
import sys
import time
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

from commbench import SCHEMA_VERSION, __version__, dilation
from commbench.cores import ThreadPlan
from commbench.launchenv import launcher_name
from commbench.linkstats import GBPS_ENV, SHAPING_ENV, WIRE_GBPS_ENV


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def versions(backend_versions: dict[str, str]) -> dict[str, str | None]:
    """The versions a record carries: the installed packages' (read from their metadata, so
    this module imports neither torch nor numpy) and the backend's own."""
    out: dict[str, str | None] = {
        "commbench": __version__,
        "python": platform.python_version(),
        "torch": _dist_version("torch"),
        "numpy": _dist_version("numpy"),
        "horovod": _dist_version("horovod"),
        "mpi4py": _dist_version("mpi4py"),
    }
    out.update(backend_versions)
    return out


def link_info(environ: dict[str, str] | None = None) -> dict:
    """The link reference a launcher measured and the shaping it applied, if any.

    ``launch.cluster`` (and any launcher that measures its links) exports
    COMMBENCH_LINK_GBPS (achieved Gbit/s of one inter-node link) and
    COMMBENCH_LINK_SHAPING (the tc rate, or "none"), and COMMBENCH_LINK_WIRE_GBPS,
    the same stream counted in interface bytes (headers included), the unit
    ``link_bytes`` is counted in.
    """
    env = os.environ if environ is None else environ

    def num(key: str) -> float | None:
        try:
            return float(env[key]) if key in env else None
        except ValueError:
            return None

    return {"link_gbps": num(GBPS_ENV), "link_wire_gbps": num(WIRE_GBPS_ENV),
            "link_shaping": env.get(SHAPING_ENV)}


def default_output(output_dir: str, backend: str, world_size: int,
                   tool: str = "allreduce") -> Path:
    """``<output_dir>/<tool>-<time>-<backend>-np<N>.jsonl``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(output_dir) / f"{tool}-{stamp}-{backend}-np{world_size}.jsonl"


class ResultWriter:
    """Append JSON Lines records to ``path``; the file is created at the first record."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._f = None
        self.count = 0

    def write(self, record: dict) -> None:
        if self._f is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a", encoding="utf-8")
        self._f.write(json.dumps(_clean(record), allow_nan=False, sort_keys=False) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())
        self.count += 1

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def read_records(path: str | Path) -> list[dict]:
    """Read a JSON Lines results file.

    A last line without its newline that is not complete JSON is what a
    writer killed mid-line leaves (or one still writing): it is skipped with a
    warning. Any other bad line is an error (ValueError naming file and line).
    """
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError as e:
            if i == len(lines):  # the unterminated last line
                warnings.warn(f"{path}:{i}: skipping a truncated last line (a writer was "
                              "killed or is still writing)", stacklevel=2)
                continue
            raise ValueError(f"{path}:{i}: not a JSON record: {e}") from None
    return out


def write_atomic(path: str | Path, text: str) -> None:
    """Write a whole file so a reader sees the old or the new contents, never a part.

    The text goes to a temporary name in the same directory, is flushed and
    fsynced, then renamed over ``path`` (atomic on POSIX); the directory is
    fsynced so the rename itself survives a crash.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


#: which repeat of its point a job is (0, 1, ...), set by ``launch.sweep --repeats``
REPEAT_ENV = "COMMBENCH_REPEAT"


def repeat_index(environ: dict | None = None) -> int:
    """The job's repeat of its point (``REPEAT_ENV``; 0 when not set). A bad value is a
    ValueError naming the variable."""
    raw = (os.environ if environ is None else environ).get(REPEAT_ENV, "").strip()
    if not raw:
        return 0
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{REPEAT_ENV}={raw!r}: expected an integer >= 0") from None
    if value < 0:
        raise ValueError(f"{REPEAT_ENV}={raw!r}: expected an integer >= 0")
    return value


@functools.lru_cache(maxsize=1)
def code_revision() -> str:
    """The code that ran: the git commit of the tree this package runs from, with
    ``-dirty`` when tracked files differ from it; where there is no git tree (an installed
    package, a container without git) the package version and ``unknown``."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode == 0 and head.stdout.strip():
            dirty = subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD"],
                                   capture_output=True, timeout=30).returncode != 0
            return head.stdout.strip()[:12] + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return f"{__version__} unknown"


def job_header(*, kind: str, run_id: str | None, backend: str, topo, vers: dict,
               torch_threads: int, config: dict, job_id: str | None = None,
               threads: ThreadPlan | None = None, cores: int | None = None,
               loadavg_start: float | None = None, loadavg_source: str | None = None,
               runnable_start: float | None = None, alpha: dict | None = None) -> dict:
    """Fields every record of every tool carries: what ran, where, on which versions, and
    the machine's share (``commbench.cores``): ``torch_threads`` per rank and by which
    ``thread_rule`` (the ``rank_cores`` rank 0 may run on shared among ``machine_ranks``
    ranks), and rank 0's machine's ``cores`` and 1-minute load average as the job
    started, ``loadavg_start``, read where ``loadavg_source`` says (its ``job_end``
    record adds the load at the end), and ``runnable_start``, the tasks running or
    runnable just before the job where a launcher read them (``cores.runnable_tasks``);
    and ``alpha``, the per-message latency between nodes the job measured through its own
    library (``commbench.latency.measure``'s fields: ``alpha_us`` and its spread)."""
    return {
        "schema": SCHEMA_VERSION,
        "kind": kind,
        "job_id": job_id,
        "run_id": run_id,
        "backend": backend,
        # how the ranks were started (``commbench.launchenv.launcher_name``): torchrun,
        # horovodrun, mpirun, srun, or none
        "launcher": launcher_name(),
        "world_size": topo.size,
        "nodes": topo.nodes,
        "local_size": max(topo.local_sizes),
        "local_sizes": list(topo.local_sizes),
        "hostnames": list(topo.hostnames),
        "torch_threads": torch_threads,
        "thread_rule": threads.rule if threads else None,
        "machine_ranks": threads.machine_ranks if threads else None,
        "rank_cores": threads.cores if threads else None,
        "cores": cores,
        "loadavg_start": loadavg_start,
        "loadavg_source": loadavg_source,
        "runnable_start": runnable_start,
        # wall time / emulated time (``commbench.dilation``): every duration here is emulated
        "dilation": dilation.factor(),
        # emulated per-message latency between nodes, in emulated time (commbench.latency);
        # on the emulated cluster the host's own, about 1/K of it at dilation K
        **(alpha or {"alpha_us": None, "alpha_note": "not measured"}),
        # which repeat of its point this job is (launch.sweep --repeats), and the code's
        # revision: repeats of one set-up are one sample, two revisions two set-ups
        "repeat": repeat_index(),
        "revision": code_revision(),
        "versions": vers,
        "argv": sys.argv,
        "config": config,
    }


def run_fields(*, strategy: str, algo: str | None, workload, knobs: dict) -> dict:
    """What one training run adds to ``job_header``: the strategy and its knobs, the
    workload (model, batch, gradient size), the link."""
    return {
        "strategy": strategy,
        "algo": algo,
        "workload": workload.name,
        "model": workload.model,
        "batch_size": workload.batch_size,
        "image_size": workload.image_size,
        "input_shape": workload.input_shape,
        "loss_rule": workload.loss_rule,
        # parameters not synchronised: no gradient (frozen), or backward never reaches them
        "frozen_params": workload.frozen,
        "unused_params": workload.unused,
        "device": str(workload.device),
        "dtype": "float32",
        "grad_bytes": workload.nbytes,
        "grad_tensors": len(workload.grads),
        **link_info(),
        # under time dilation K, forward and backward passes that really run (not replayed)
        # take 1/K of their wall time in emulated time: a node K times faster than this
        # machine's share of it (1 for replayed compute, which is dilated with the rest)
        "real_compute_speedup": 1.0 if workload.name == "synthetic" else dilation.factor(),
        "knobs": knobs,
    }
