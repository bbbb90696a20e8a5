"""Which runs are the same set-up: the one test every comparison of runs goes through.

Two figures are compared only when their runs differ in the one variable under
study (docs/metrics.md, "Honest measurement"). ``same_setup(a, b, vary=...)`` decides that for two
runs: every field of ``FIELDS`` must agree except those in ``vary``, the claim's
own variable (``sync`` when strategies are compared, ``batch`` for a batch
sweep, ``accumulation`` for k). ``matched_sets`` groups runs by it, so a
comparison never pools runs of different clusters, models or compute.

A set-up is read from what the records carry (``commbench/results.py``): the
header (ranks, nodes, local sizes, backend, thread rule), the run fields
(model, workload, batch, link shaping and the measured link rate) and the job's
``config`` for the workload's settings (compute, straggler). The emulated cluster's
time dilation K (docs/fidelity.md) is a field too: a host-bound run's figures
move with K, so runs at two K are never pooled (records before schema 4 ran at
K = 1); so is the code's revision (``revision``). Repeats of a point
(``launch.sweep --repeats``) differ in nothing here but their ``repeat``, so they
fall in one set and are one sample of its figure. A field may be read otherwise
when a variable is free (``FREE_WITH``):
with the batch free, two runs' compute profiles agree when they were recorded on
the same model and device, each at its run's batch (the file names differ:
``h200-resnet50-b256.json``, ``...-b1024.json``). Strategy knobs
count only where the strategy acts on them (``analysis.load.knob``): a flat run
of a ``--staleness 1`` job is no less synchronous than one of a job without it.
A hierarchical algorithm is hierarchical whichever flag chose it
(``--strategy hierarchical --algo hier`` and ``--strategy flat --algo hier``
run the same code).

Wherever a matched set is printed, ``host_words`` goes beside it: its K and the
host verdict of its runs (``commbench.hostload``: link-bound, or host-bound and
why), and ``host_rank`` lets a comparison across nodes prefer link-bound sets.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

from analysis.load import KNOB_STRATEGIES, get, knob, num
from commbench.hostload import HOST_BOUND, LINK_BOUND, is_link_bound
from commbench.profilefile import ProfileError
from commbench.profilefile import read as read_profile

#: the committed compute profiles (``commbench.profile`` files)
PROFILES = Path(__file__).resolve().parent.parent / "profiles"

#: algorithms that reduce in two levels from the node topology, under either flag
HIERARCHICAL_ALGOS = ("hier", "hier-leader")

#: two measurements of one link shaped alike agree within this fraction (1 Gbit/s tbf
#: measured 0.944-0.957 Gbit/s, docs/cluster.md); rates set apart (200 Mbit/s vs
#: 1 Gbit/s) differ by far more
LINK_RATE_TOLERANCE = 0.10
#: what a tuned setting reads in a run's config (``commbench.buckets.AUTO``; analysis/ does not
#: import torch)
AUTO = "auto"


def sync_family(rec: dict) -> str | None:
    """The synchronisation scheme a run used: its strategy, except that a hierarchical
    algorithm is ``hierarchical`` under ``--strategy flat`` too."""
    strategy = rec.get("strategy")
    if strategy in ("flat", "hierarchical") and rec.get("algo") in HIERARCHICAL_ALGOS:
        return "hierarchical"
    return strategy


def sync_scheme(rec: dict) -> tuple:
    """The scheme with its algorithm and the knobs its strategy acts on (bucket size,
    staleness, ...); the parameter server's measured staleness is an outcome, not a
    setting, so it is left out."""
    family = sync_family(rec)
    knobs = tuple((k, v) for k in KNOB_STRATEGIES
                  if not (family == "ps" and k == "staleness")
                  and (v := knob(rec, k)) is not None)
    if family == "bucketed" and (rec.get("knobs") or {}).get("bucket_mb_auto"):
        # --bucket-mb auto is a set-up of its own, and what its probe chose (the cap, and
        # the path where --transfer auto left that to it) is an outcome of the run, as the
        # parameter server's staleness is: repeats of one request pool whatever each chose
        # (each run's choice stays in its knobs; peer_fairness chose 8, 16 and 25 MB in
        # six repeats of one cell)
        tuned = (rec.get("config") or {}).get("transfer") == AUTO
        chosen = {"bucket_mb", "transfer"} if tuned else {"bucket_mb"}
        knobs = tuple((k, AUTO if k in chosen else v) for k, v in knobs)
        knobs += (("bucket_mb_auto", True),)
    if family == "horovod":  # its fusion threshold and cycle time, as in force
        knobs += tuple(sorted((k, v) for k, v in (rec.get("knobs") or {}).items()
                              if k.startswith("horovod_")))
    return (family, rec.get("algo"), *knobs)


def scheme_words(r: dict) -> str:
    """A run's sync scheme in words: ``flat (ring)``, ``hierarchical (hier)``, ``async s=1``,
    ``ps (measured staleness 2.4)``, ``bucketed 25 MB``; a microbenchmark's algorithm."""
    family, algo = sync_family(r), r.get("algo")
    if family == "async":
        return f"async s={knob(r, 'staleness')}"
    if family == "ps":
        s = num(knob(r, "staleness"))
        return "ps" + ("" if math.isnan(s) else f" (measured staleness {s:.2g})")
    if family in ("bucketed", "ddp"):
        mb = num(knob(r, "bucket_mb"))
        auto = " auto" if (r.get("knobs") or {}).get("bucket_mb_auto") else ""
        return f"{family}{auto}" + ("" if math.isnan(mb) else f" {mb:g} MB")
    if family in ("zero1", "zero2", "hsdp"):
        mb = num(knob(r, "bucket_mb"))
        return f"{family} ({algo})" + ("" if math.isnan(mb) else f" {mb:g} MB")
    if family == "zero3":
        settings = [words for name, off, words in (
            ("prefetch", "off", "prefetch off"),
            ("reduce_scatter_group", "separate", "separate reduce-scatter group"),
            ("reshard_root", "off", "root kept from forward to backward"))
            if knob(r, name) == off]
        return f"zero3 ({algo})" + "".join(f", {w}" for w in settings)
    if family is None:
        return str(algo)
    return f"{family} ({algo})" if algo else str(family)


def _local_sizes(r: dict) -> tuple:
    sizes = r.get("local_sizes")
    return tuple(sizes) if sizes else (r.get("local_size"),)


def _link_shaping(r: dict) -> str | None:
    shaping = r.get("link_shaping")
    return None if shaping in (None, "", "none") else str(shaping)


def _link_rate(r: dict) -> float | None:
    rate = num(r.get("link_gbps"))
    return None if math.isnan(rate) else rate


def dilation(r: dict) -> float:
    """A run's time dilation K: wall time / emulated time (its durations are emulated);
    records before schema 4 carry none and ran at K = 1."""
    return r.get("dilation") or 1.0


#: the real workload's name in records: ``real`` since schema 3, ``resnet`` before
REAL_WORKLOADS = ("real", "resnet")


def is_real(r: dict) -> bool:
    """Whether ``r`` ran the real workload (forward and backward passes), any schema."""
    return r.get("workload") in REAL_WORKLOADS


def _workload(r: dict) -> tuple:
    real = is_real(r)  # image size and classes shape its compute
    return ("real" if real else r.get("workload"), get(r, "dataset", "synthetic"),
            get(r, "image_size") if real else None, get(r, "num_classes") if real else None)


def _compute(r: dict) -> tuple | None:
    """The replayed compute (the real workload computes for itself): a recorded profile
    and its scale, or a flat time (``compute_ms`` does nothing under a profile)."""
    if is_real(r):
        return None
    profile = get(r, "compute_profile")
    if profile:  # by its file name: a path says where the job ran, not what it replayed
        return ("profile", Path(str(profile)).name, num(get(r, "compute_scale", 1.0)))
    return ("ms", num(get(r, "compute_ms")))


def profile_file(rec: dict, base: Path | None = None) -> Path | None:
    """A run's ``compute_profile`` file: as recorded, else beside ``base`` (default: the
    run's result file), else in the repository's ``profiles/``; None where not found."""
    name = get(rec, "compute_profile")
    if not name:
        return None
    if base is None and rec.get("_file"):
        base = Path(rec["_file"]).parent
    p = Path(str(name))
    for cand in (p, *([base / p] if base else []), PROFILES / p.name):
        if cand.is_file():
            return cand
    return None


@functools.lru_cache(maxsize=64)
def _profile_head(path: Path) -> tuple | None:
    """What a profile was recorded on (model, device, image size, classes, batch); None
    where the file is not a readable profile or names no device or batch."""
    try:
        p = read_profile(path)
    except ProfileError:
        return None
    if p.device is None or p.batch_size is None:
        return None
    return (p.model, p.device, p.image_size, p.num_classes, p.batch_size)


def _compute_any_batch(r: dict) -> tuple | None:
    """The replayed compute when the batch is the claim's variable (C5): a profile is
    recorded at one batch, so runs at two batches carry two files; what must agree is
    what the profile was recorded on (its model, device, image size and classes) and its
    scale, with each run's profile recorded at that run's own batch. A profile that
    cannot be read is known by its file name alone (and matches no other batch's)."""
    compute = _compute(r)
    if compute is None or compute[0] != "profile":
        return compute
    path = profile_file(r)
    head = _profile_head(path) if path is not None else None
    if head is None or num(head[4]) != num(r.get("batch_size")):
        return compute
    return ("profile recorded on", *head[:4], compute[2])


def _accumulation(r: dict) -> int:
    k = get(r, "accum_steps", get(r, "backward_passes_per_step", 1))
    return int(k) if k is not None else 1


def _compression(r: dict) -> str:
    return str(get(r, "compression") or "none")


def _launcher(r: dict) -> str | None:
    """How the ranks were started, as far as records tell: the launcher (``torchrun``,
    ``mpirun``, ...; records before it have none) and Horovod's controller where Horovod
    ran (``horovodrun --mpi`` / ``--gloo``)."""
    launcher = r.get("launcher")
    controller = (r.get("versions") or {}).get("horovod_controller")
    if launcher and controller:
        return f"{launcher} ({controller})"
    return launcher or controller


def straggler_settings(r: dict) -> tuple:
    """A run's straggler: (slow rank and factor, or None; compute jitter's cv, 0 for none)."""
    slow = get(r, "slow_rank")
    return (tuple(slow) if slow else None, num(get(r, "compute_jitter", 0.0)) or 0.0)



#: what makes two runs the same set-up: name -> reader (names in ``WORDS``)
FIELDS: dict[str, Callable[[dict], Any]] = {
    "ranks": lambda r: r.get("world_size"),
    "nodes": lambda r: r.get("nodes"),
    "local_sizes": _local_sizes,
    "link_shaping": _link_shaping,
    "link_rate": _link_rate,
    "dilation": dilation,
    "model": lambda r: r.get("model"),
    "workload": _workload,
    "device": lambda r: r.get("device"),
    "compute": _compute,
    "batch": lambda r: r.get("batch_size"),
    "accumulation": _accumulation,
    "compression": _compression,
    "backend": lambda r: r.get("backend"),
    "launcher": _launcher,
    "threads": lambda r: (r.get("thread_rule"), r.get("torch_threads")),
    "straggler": straggler_settings,
    "sync": sync_scheme,
    # the code that ran (``results.code_revision``): two revisions are two set-ups; records
    # before it (schema 4 without it) read None, one revision among themselves
    "revision": lambda r: r.get("revision"),
}


def _thread_rule(r: dict) -> Any:
    """The rule that set a rank's torch threads (cores shared among the machine's ranks):
    with the ranks free, the count follows them; records without a rule keep the count."""
    rule = r.get("thread_rule")
    return rule if rule else ("torch threads", r.get("torch_threads"))


#: readers that replace a field's own where a variable is free: the compute profile follows
#: the batch (h200-resnet50-b256.json at batch 256, ...-b1024.json at 1024), a rank's torch
#: threads follow the ranks sharing the machine's cores
FREE_WITH: dict[str, dict[str, Callable[[dict], Any]]] = {
    "batch": {"compute": _compute_any_batch},
    "ranks": {"threads": _thread_rule},
}


#: each field in words, for messages
WORDS = {"ranks": "ranks", "nodes": "nodes", "local_sizes": "ranks per node",
         "link_shaping": "link shaping", "link_rate": "measured link rate",
         "dilation": "time dilation", "model": "model", "workload": "workload",
         "device": "device", "compute": "compute",
         "batch": "batch size", "accumulation": "accumulation steps",
         "compression": "compression", "backend": "backend", "launcher": "launcher",
         "threads": "thread rule", "straggler": "straggler settings", "sync": "sync scheme",
         "revision": "code revision"}


def _same(name: str, a: Any, b: Any) -> bool:
    if name == "link_rate" and a is not None and b is not None:
        return abs(a - b) <= LINK_RATE_TOLERANCE * max(a, b)
    return a == b


def _check(vary: Collection[str]) -> None:
    unknown = sorted(set(vary) - set(FIELDS))
    if unknown:
        raise ValueError(f"not a set-up field: {', '.join(unknown)} (fields: "
                         f"{', '.join(FIELDS)})")


def differences(a: dict, b: dict, vary: Collection[str] = ()) -> list[str]:
    """The fields of ``FIELDS``, outside ``vary``, in which runs ``a`` and ``b`` differ."""
    _check(vary)
    readers = dict(FIELDS)
    for v in vary:
        readers.update(FREE_WITH.get(v, {}))
    return [name for name, read in readers.items()
            if name not in vary and not _same(name, read(a), read(b))]


def same_setup(a: dict, b: dict, vary: Collection[str] = ()) -> bool:
    """Whether runs ``a`` and ``b`` are the same set-up but for the fields in ``vary``."""
    return not differences(a, b, vary)


def matched_sets(runs: Iterable[dict], vary: Collection[str] = ()) -> list[list[dict]]:
    """``runs`` grouped so that every two runs of a group are ``same_setup`` but for
    ``vary``; groups in the order of their first run. (A run joins the first group it
    matches every member of: the link rate's tolerance is not transitive.)"""
    _check(vary)
    groups: list[list[dict]] = []
    for r in runs:
        home = next((g for g in groups if all(same_setup(r, m, vary) for m in g)), None)
        if home is None:
            groups.append([r])
        else:
            home.append(r)
    return groups


def scale(group: Sequence[dict]) -> tuple[float, float, int]:
    """How large a matched set is, for choosing the one a verdict comes from: ranks, then
    nodes, then how many runs it holds."""
    ranks = max((num(r.get("world_size")) for r in group), default=math.nan)
    nodes = max((num(r.get("nodes")) for r in group), default=math.nan)
    return (0.0 if math.isnan(ranks) else ranks, 0.0 if math.isnan(nodes) else nodes,
            len(group))


def describe(rec: dict, vary: Collection[str] = ()) -> str:
    """A set-up in words (the fields outside ``vary``, less the sync scheme, which the
    figure names)."""
    skip = {*vary, "sync"}
    parts = []
    if "ranks" not in skip and not {"nodes", "local_sizes"} <= skip:
        sizes = "+".join(str(s) for s in _local_sizes(rec))
        parts.append(f"{rec.get('world_size')} ranks on {rec.get('nodes')} node(s) ({sizes})")
    one_node = num(rec.get("nodes")) == 1  # its ranks never use a link: don't name one
    if ("link_shaping" not in skip or "link_rate" not in skip) and not one_node:
        rate = _link_rate(rec)
        link = _link_shaping(rec) or "unshaped"
        parts.append(f"link {link}" + (f" ({rate:.3g} Gbit/s measured)" if rate else ""))
    if "dilation" not in skip and dilation(rec) != 1:
        parts.append(f"dilation {dilation(rec):g}")
    if "model" not in skip and rec.get("model") is not None:
        name, dataset, image, classes = _workload(rec)
        parts.append(f"{name} {rec.get('model')}"
                     + (f" on {dataset}" if dataset not in (None, "synthetic") else "")
                     + (f" {image} px" if image else "") + f", {rec.get('device') or '?'}")
    compute = _compute(rec)
    recorded = _compute_any_batch(rec) if "batch" in skip else compute
    if "compute" not in skip and compute is not None:
        if recorded != compute:  # the batch's own profile: say what it was recorded on
            parts.append(f"compute: profiles of each batch, {recorded[1]} on {recorded[2]}, "
                         f"x {recorded[-1]:g}")
        elif compute[0] == "profile":
            parts.append(f"compute {compute[1]} x {compute[2]:g}")
        elif not math.isnan(compute[1]):
            parts.append(f"compute {compute[1]:g} ms")
    if "batch" not in skip and rec.get("batch_size") is not None:
        parts.append(f"batch {rec.get('batch_size')}")
    if "accumulation" not in skip and _accumulation(rec) != 1:
        parts.append(f"accumulation {_accumulation(rec)}")
    if "compression" not in skip and _compression(rec) != "none":
        parts.append(f"compression {_compression(rec)}")
    if "backend" not in skip:
        launcher = _launcher(rec)
        parts.append(f"{rec.get('backend')}" + (f" under {launcher}" if launcher else ""))
    slow, jitter = straggler_settings(rec)
    if "straggler" not in skip and (slow or jitter):
        parts.append("straggler" + (f" rank {slow[0]} x {slow[1]:g}" if slow else "")
                     + (f" jitter cv {jitter:g}" if jitter else ""))
    if "revision" not in skip and rec.get("revision"):
        parts.append(f"code {rec['revision']}")
    return ", ".join(parts)


#: a run's host verdict (``commbench.hostload.is_link_bound``) in words
VERDICT_WORDS = {True: LINK_BOUND, False: HOST_BOUND, None: "not judged"}


def host_rank(group: Sequence[dict]) -> int:
    """How far a matched set's figures are the links' and not this machine's, for choosing
    the set a verdict comes from (``commbench.hostload``): 2 when every run was link-bound,
    1 when none was judged host-bound (records before schema 4 carry no verdict), 0 when
    some run was host-bound."""
    judged = [is_link_bound(r) for r in group]
    if all(judged):
        return 2
    return 0 if False in judged else 1


def run_label(r: dict) -> str:
    """A run's strategy and algorithm, ``flat/ring``; a microbenchmark row's algorithm and
    message size."""
    if r.get("kind") == "microbench":
        return f"{r.get('algo')} {num(r.get('size')):.0f} B"
    return "/".join(str(x) for x in (r.get("strategy"), r.get("algo")) if x)


def host_why(rec: dict) -> str:
    """Why a host-bound run was judged so: its verdict's reason, without the word."""
    why = str(rec.get("setup_bound") or rec.get("bound") or "").removeprefix(HOST_BOUND).strip()
    return why[1:-1] if why.startswith("(") and why.endswith(")") else why


def host_verdict(group: Sequence[dict]) -> str:
    """A matched set's host verdict in words: ``link-bound``, ``host-bound: 2 of 3 runs
    (flat/ring, flat/native: ranks waited for a core ...)`` with the host-bound runs'
    reasons, or ``host load not judged``."""
    judged = [is_link_bound(r) for r in group]
    n, unjudged = len(group), judged.count(None)
    if unjudged == n:
        return "host load not judged"
    rest = f", host load of {unjudged} not judged" if unjudged else ""
    host = [r for r, j in zip(group, judged) if j is False]
    if not host:
        return LINK_BOUND + (f": {n - unjudged} of {n} runs{rest}" if unjudged else "")
    whys: dict[str, list[str]] = {}  # each reason once, with the runs it was given for
    for r in host:
        labels = whys.setdefault(host_why(r), [])
        if run_label(r) not in labels:
            labels.append(run_label(r))
    return (HOST_BOUND + ("" if len(host) == n else f": {len(host)} of {n} runs") + " ("
            + "; ".join(", ".join(labels) + (f": {why}" if why else "")
                        for why, labels in whys.items()) + f"){rest}")


def host_words(group: Sequence[dict]) -> str:
    """A matched set's time dilation and host verdict, shown beside it wherever it is
    printed: ``dilation 4, link-bound``."""
    ks = ", ".join(f"{k:g}" for k in sorted({dilation(r) for r in group}))
    words = f"dilation {ks}, {host_verdict(group)}"
    setup = [r for r in group if r.get("setup_bound")]
    if setup:  # the set-up's verdict (K against 2K); the counters' readings beside it
        read = [r.get("bound") for r in setup if r.get("bound")]
        words += (" (set-up verdict, figures at K against 2K; the runs' counters read "
                  f"{sum(b == LINK_BOUND for b in read)} of {len(read)} link-bound)")
    return words


def run_ids(runs: Iterable[dict]) -> list[str]:
    """The runs' ids, each once, in order."""
    return list(dict.fromkeys(str(r.get("run_id")) for r in runs))
