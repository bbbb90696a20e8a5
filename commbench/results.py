"""Result records: what every run writes, and how.

Rank 0 writes JSON Lines: one ``step`` record per step of every run (raw
per-rank samples kept) and one ``summary`` record per run. Each line is
complete JSON, written, flushed and fsynced as it is produced, so a reader
never sees half a record. NaN/inf become ``null`` (JSON has neither).

Every record carries what is needed to reproduce it (DESIGN.md §6): schema
version, versions, backend, strategy and knobs, ranks, nodes, ranks per node,
host names, model, batch, dtype and the full configuration.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from commbench import SCHEMA_VERSION, __version__


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
    import numpy
    import torch

    out: dict[str, str | None] = {
        "commbench": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
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

    return {"link_gbps": num("COMMBENCH_LINK_GBPS"),
            "link_wire_gbps": num("COMMBENCH_LINK_WIRE_GBPS"),
            "link_shaping": env.get("COMMBENCH_LINK_SHAPING")}


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
    """Read a JSON Lines results file (every line must be complete JSON)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run_header(*, kind: str, run_id: str, strategy: str, algo: str | None, backend: str,
               topo, workload, knobs: dict, config: dict, vers: dict,
               torch_threads: int) -> dict:
    """Fields shared by every record of one run."""
    return {
        "schema": SCHEMA_VERSION,
        "kind": kind,
        "run_id": run_id,
        "strategy": strategy,
        "algo": algo,
        "backend": backend,
        "world_size": topo.size,
        "nodes": topo.nodes,
        "local_size": max(topo.local_sizes),
        "local_sizes": list(topo.local_sizes),
        "hostnames": list(topo.hostnames),
        "workload": workload.name,
        "model": workload.model,
        "batch_size": workload.batch_size,
        "image_size": getattr(workload, "image_size", None),
        "device": str(getattr(workload, "device", "cpu")),
        "dtype": "float32",
        "grad_bytes": workload.nbytes,
        "grad_tensors": len(workload.grads),
        **link_info(),
        "knobs": knobs,
        "torch_threads": torch_threads,
        "versions": vers,
        "argv": sys.argv,
        "config": config,
    }
