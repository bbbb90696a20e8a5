"""Read commbench result files (JSON Lines) into records, checking what can go wrong.

Every line a worker writes is one complete JSON object carrying ``schema``
and ``kind`` (``commbench/results.py``). A reader must still cope with what
happens to files in practice, and say which file and line is at fault:

- a missing path, a directory without ``*.jsonl`` files, an empty file;
- a truncated last line (a run killed, or still running, mid-write): skipped
  with a warning, so a partial file still plots;
- a malformed line elsewhere, a record of a schema version this reader does
  not know, or files of such a version mixed with others: refused, because a
  plot of records read with the wrong meaning would be silently wrong.
  Versions in ``READABLE_SCHEMAS`` may be mixed: version 2 only added fields
  to version 1 (wait vs transfer), which a version-1 record lacks and the
  figures then leave out; version 3 renamed the real workload (``resnet`` ->
  ``real``), which the matching reads under either name.

Each job's ``job_end`` record gives its runs' records ``loadavg_end``, and
every record gets ``started_busy`` (``mark_machine_load``): the analysis and
the report flag runs that started on a busy machine.

Only the standard library and ``commbench.cores`` are imported: the analysis never needs MPI.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commbench.cores import started_busy
from commbench.dilation import PROBE_DIR

#: the versions this reader reads, each named rather than taken from the writer's
#: ``SCHEMA_VERSION`` (a writer that moves to 3 must not make this reader drop 2, nor claim
#: to read 3 unseen): fields of 1 mean the same in 2, which only adds ``sync_wait_s``,
#: ``sync_wait_max_s``, ``sync_transfer_s``, ``collectives``, ``imbalance_s``,
#: ``straggler_rank``; 3 names the real workload ``real`` where 1 and 2 said ``resnet``
#: (``analysis.match.REAL_WORKLOADS`` reads both); 4 adds ``dilation`` and the host
#: verdict; 5 adds the measured latency between nodes, ``alpha_us`` and its spread
#: (``commbench.latency``: older records have none, and reports say "alpha not recorded")
READABLE_SCHEMAS = frozenset({1, 2, 3, 4, 5})


class LoadError(Exception):
    """Input that cannot be read as commbench results; the message names file and line."""


@dataclass
class Loaded:
    """Records of every file read, each with ``_file`` and ``_line``, plus the warnings."""

    records: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)

    def of_kind(self, *kinds: str) -> list[dict]:
        return [r for r in self.records if r.get("kind") in kinds]


def result_files(paths: Iterable[str | Path]) -> list[Path]:
    """The ``*.jsonl`` files named by ``paths`` (files as given, directories searched)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise LoadError(f"{p}: no such file or directory")
        if p.is_dir():
            # --dilation auto's probes are shortened copies of real runs: never results
            found = [f for f in sorted(p.rglob("*.jsonl"))
                     if PROBE_DIR not in f.relative_to(p).parts]
            if not found:
                raise LoadError(f"{p}: no *.jsonl result files in this directory")
            out += found
        else:
            out.append(p)
    return out


def read_file(path: Path, warnings: list[str]) -> list[dict]:
    """Records of one file; a truncated last line is skipped with a warning."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise LoadError(f"{path}: cannot read: {e}") from None
    lines = text.split("\n")
    complete_last = text.endswith("\n")
    numbered = [(i + 1, ln) for i, ln in enumerate(lines) if ln.strip()]
    if not numbered:
        warnings.append(f"{path}: empty file, skipped")
        return []
    records = []
    last_no = numbered[-1][0]
    for no, line in numbered:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if no == last_no and not complete_last:
                warnings.append(f"{path}:{no}: truncated last line (a run killed or still "
                                f"writing), skipped")
                continue
            raise LoadError(f"{path}:{no}: not a JSON record ({e.msg} at column {e.colno})"
                            ) from None
        if not isinstance(rec, dict) or "kind" not in rec or "schema" not in rec:
            raise LoadError(f"{path}:{no}: not a commbench record (no 'kind'/'schema' field)")
        rec["_file"], rec["_line"] = str(path), no
        records.append(rec)
    return records


def check_schemas(records: Sequence[dict]) -> None:
    """Refuse records of a schema version not in ``READABLE_SCHEMAS``, and mixes with
    such a version, naming file:line."""
    seen: dict[Any, dict] = {}
    for r in records:
        seen.setdefault(r["schema"], r)
    unknown = [v for v in seen if v not in READABLE_SCHEMAS]
    if unknown and len(seen) > 1:
        where = "; ".join(f"schema {v} at {r['_file']}:{r['_line']}" for v, r in seen.items())
        raise LoadError(f"mixed schema versions ({where}): analyse each version's files "
                        f"separately")
    for version in unknown:
        r = seen[version]
        readable = ", ".join(map(str, sorted(READABLE_SCHEMAS)))
        raise LoadError(f"{r['_file']}:{r['_line']}: schema version {version!r}, but this "
                        f"analysis reads versions {readable}: use the commbench "
                        f"version that wrote it")


def load(paths: Iterable[str | Path]) -> Loaded:
    """Read every result file under ``paths``; raise LoadError when nothing usable is there."""
    out = Loaded()
    out.files = result_files(paths)
    for f in out.files:
        out.records += read_file(f, out.warnings)
    if not out.records:
        names = ", ".join(str(f) for f in out.files)
        raise LoadError(f"no complete records in {names}")
    check_schemas(out.records)
    mark_machine_load(out.records)
    mark_setup_verdicts(out.records)
    return out


#: the experiment runner's dilation choices, one file per results folder
CHOICE_FILE = "dilations.json"


def _cluster_of(r: dict) -> str | None:
    """A record's cluster as the runner names it, ``mpirun:2x4@1gbit`` (``3+1``)."""
    sizes, rate = r.get("local_sizes"), r.get("link_shaping")
    if not sizes or not rate or not r.get("launcher"):
        return None
    layout = (f"{len(sizes)}x{sizes[0]}" if len(set(sizes)) == 1
              else "+".join(map(str, sizes)))
    return f"{r['launcher']}:{layout}@{rate}"


def mark_setup_verdicts(records: Sequence[dict]) -> None:
    """On every record of a job the experiment runner placed at ``auto``: ``setup_bound``,
    its compared set's verdict (``CHOICE_FILE`` in the record's folder or the one above:
    the outcome rule, figures at K against 2K), where the record ran on one of the set's
    clusters at the set's K. Other records keep their own counter reading alone."""
    choices: dict[Path, list[dict]] = {}
    for r in records:
        f = r.get("_file")
        key = _cluster_of(r)
        if not f or key is None:
            continue
        folder = Path(f).parent
        for where in (folder, folder.parent):
            if where not in choices:
                try:
                    got = json.loads((where / CHOICE_FILE).read_text())
                    choices[where] = [c for c in got.values() if isinstance(c, dict)]
                except (OSError, ValueError, AttributeError):
                    choices[where] = []
            hit = next((c for c in choices[where] if c.get("verdict")
                        and key in {k.replace("horovodrun-gloo:", "horovodrun:")
                                    for k in c.get("clusters", ())}
                        and float(c.get("dilation") or 0) == float(r.get("dilation") or 1.0)),
                       None)
            if hit is not None:
                r["setup_bound"], r["setup_rule"] = hit["verdict"], hit.get("rule", "counter")
                break


# -- the machine's load --------------------------------------------------------------

def mark_machine_load(records: Sequence[dict]) -> None:
    """On every record of a job: ``loadavg_end`` from the job's ``job_end`` record, and
    ``started_busy``, whether the job started with the tasks running or runnable
    (``runnable_start``, where the launcher read it), else the 1-minute load, above
    ``BUSY_LOAD_FRACTION`` x ``cores`` (others were running: its timings are not its
    own); None where the records carry no load (written before it was kept)."""
    ends = {r.get("job_id"): r.get("loadavg_end") for r in records
            if r.get("kind") == "job_end" and r.get("job_id")}
    for r in records:
        if r.get("kind") != "job_end" and r.get("job_id") in ends:
            r.setdefault("loadavg_end", ends[r["job_id"]])
        r["started_busy"] = started_busy(r.get("loadavg_start"), r.get("cores"),
                                         r.get("runnable_start"))


def busy_runs(records: Sequence[dict]) -> list[dict]:
    """One record per run (its first) that started on a busy machine (``started_busy``)."""
    seen: set = set()
    out = []
    for r in records:
        key = (r.get("_file"), r.get("run_id"))
        if r.get("kind") == "job_end" or key in seen:
            continue
        seen.add(key)
        if started_busy(r.get("loadavg_start"), r.get("cores"), r.get("runnable_start")):
            out.append(r)
    return out


# -- reading fields defensively ------------------------------------------------------

#: strategy knobs and the strategies that act on them. A job's ``config`` holds every
#: flag it was given, for every strategy it ran: ``--strategy flat,async --staleness 1``
#: configures staleness 1 for its flat run too, which that run never used. Such a knob
#: is read only where the strategy acts on it (``knob``).
KNOB_STRATEGIES: dict[str, tuple[str, ...]] = {
    "staleness": ("async", "ps"),  # the parameter server's is measured, not set
    "staleness_lr": ("async", "ps"),
    "staleness_warmup": ("async",),
    "bucket_mb": ("bucketed", "ddp", "zero1", "zero2", "hsdp"),
    "first_bucket_mb": ("bucketed", "zero1", "zero2", "hsdp"),
    "progress": ("bucketed",),
    "transfer": ("bucketed", "async"),
    # zero3's overlap settings (a unit is its bucket: --bucket-mb does not apply)
    "prefetch": ("zero3",),
    "reduce_scatter_group": ("zero3",),
    "reshard_root": ("zero3",),
}

#: (strategy, knob) -> the name that strategy's ``knobs`` use for it (its flag keeps the name)
KNOB_NAMES = {("ddp", "bucket_mb"): "bucket_cap_mb",
              # the path run: --transfer auto resolves per strategy and backend
              ("bucketed", "transfer"): "transfer_path", ("async", "transfer"): "transfer_path"}


def knob(rec: dict, name: str, default: Any = None) -> Any:
    """Strategy knob ``name`` of a run, or ``default`` where its strategy does not act on it.

    Read from the run's ``knobs`` (what the strategy reported), then its ``config``
    (records written before a knob was reported). The parameter server's staleness is
    what it measured (``staleness_mean`` of its summaries): its workers are never held
    to a bound, so no configured value describes them.
    """
    strategy = rec.get("strategy")
    if strategy not in KNOB_STRATEGIES.get(name, ()):
        return default
    if strategy == "ps" and name == "staleness":
        measured = rec.get("staleness_mean")
        return default if measured is None else measured
    reported = (rec.get("knobs") or {}).get(KNOB_NAMES.get((strategy, name), name))
    if reported is not None:
        return reported
    configured = (rec.get("config") or {}).get(name)
    return default if configured is None else configured


def get(rec: dict, name: str, default: Any = None) -> Any:
    """Field ``name`` of a record, looked up at top level, then in ``knobs`` and ``config``;
    a strategy knob (``KNOB_STRATEGIES``) only where the run's strategy acts on it (``knob``).

    Other issues add fields (``accum_steps``, ``compression``); where a writer puts
    them is not fixed, so readers find them by name.
    """
    if name in KNOB_STRATEGIES:
        return knob(rec, name, default)
    for src in (rec, rec.get("knobs") or {}, rec.get("config") or {}):
        if isinstance(src, dict) and src.get(name) is not None:
            return src[name]
    return default


def num(x: Any) -> float:
    """``x`` as a float; NaN for missing or non-numeric values (JSON null included)."""
    if isinstance(x, bool) or x is None:
        return math.nan
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def stat(rec: dict, name: str, which: str = "median") -> float:
    """``stats.<name>.<which>`` of a summary, falling back to the plain field for the median."""
    st = (rec.get("stats") or {}).get(name) or {}
    if which in st:
        return num(st[which])
    return num(rec.get(name)) if which == "median" else math.nan


# -- tidy rows ---------------------------------------------------------------------

#: per-rank arrays and bulky provenance stay out of the tidy rows (they are in the files)
SKIP_FIELDS = ("ranks", "argv", "versions", "hostnames", "local_sizes")
LEAD_COLUMNS = ("file", "line", "kind", "run_id", "strategy", "algo", "backend", "world_size",
                "nodes", "local_size", "model", "workload", "batch_size", "step", "warmup")


def _flatten(prefix: str, value: Any, out: dict) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else k, v, out)
    elif isinstance(value, list):
        if all(isinstance(v, (int, float, str, bool)) or v is None for v in value) \
                and len(value) <= 16:
            out[prefix] = " ".join("" if v is None else str(v) for v in value)
    else:
        out[prefix] = value


def tidy_row(rec: dict) -> dict:
    """One flat row per record: nested fields as dotted names (``stats.step_s.p95``)."""
    row: dict = {"file": rec.get("_file"), "line": rec.get("_line")}
    for k, v in rec.items():
        if k.startswith("_") or k in SKIP_FIELDS:
            continue
        _flatten(k, v, row)
    return row


def tidy(records: Iterable[dict]) -> tuple[list[str], list[dict]]:
    """Columns (leading ones first, then sorted) and rows of ``records``."""
    rows = [tidy_row(r) for r in records]
    names = {k for row in rows for k in row}
    cols = [c for c in LEAD_COLUMNS if c in names]
    cols += sorted(names - set(cols))
    return cols, rows
