"""Predict and advise: which gradient-sync scheme, for your model on your cluster.

    python -m analysis.advise --profile profiles/h200-resnet50-b256.json \\
        --nodes 16 --local-size 8 --link-gbps 100 --latency-us 10
    python -m analysis.advise --trace step.pt.trace.json --nodes 4 --link-gbps 25 \\
        --latency-us 5 --fit-results results/
    python -m analysis.advise --model resnet101 --batch-size 64 --compute-ms 70 \\
        --link-gbps 25 --ranks 8,64,512 -o advice/

One table per scale: every scheme the toolkit has, ranked by its predicted step —

- ``flat ALGO``: one all-reduce of the whole gradient after backward, for each flat
  algorithm the cost model prices (``ring``, ``rd``, ``rabenseifner``; ``--algo native``,
  the library's own choice, is predicted as the cheapest of them);
- ``hierarchical ALGO``: ``hier`` (reduce-scatter in the node, all-reduce across,
  all-gather in the node) and ``hier-leader``, after backward;
- ``bucketed CAP MB on PATH``: DDP-style buckets of at most CAP MiB (the first 1 MiB;
  ``auto``: the cap ``--bucket-mb auto`` would choose, priced by this model; 0: one per tensor),
  each all-reduced as soon as its last gradient is ready, one at a time, on each transfer
  path of the bucketed strategy (``thread``: the library's all-reduce, priced as
  ``native``; ``ring``; ``hier``);
- the sharded family (``sharded``): ``zero2 CAP MB`` (ZeRO-1 takes the same time: they
  differ in memory), buckets reduce-scattered during backward and the parameters
  all-gathered after the step; ``hsdp CAP MB`` (nodes > 1), each bucket reduce-scattered
  in the node and its part all-reduced across nodes, the parameters all-gathered in the
  node after the step; ``zero3`` with prefetch on a shared or a separate reduce-scatter
  group (on the shared one also with the root kept gathered from forward to backward,
  FSDP2's rule), and without prefetch, where the profile times forward unit by unit
  (``analysis.sharded``). A reduce-scatter or an all-gather costs half a ring all-reduce
  of the same bytes on the same ranks (``--algo ring``, the form the runs take); on several
  nodes ``zero2 CAP MB topology-aware`` and ``zero3 prefetch, shared, topology-aware``
  (``--algo hier``: in the node, then across nodes, ``commbench.comm.shardcoll``) cost half
  the two-level all-reduce's (``hier``) —

with its predicted step, exposed sync, sync share and scaling efficiency (compute / step,
docs/metrics.md), and ends with the recommendation and its predicted margin over the
runner-up. Each all-reduce is priced by the alpha-beta-gamma model
(``analysis.alphabeta``), the buckets' overlap with backward by the overlap model
(``analysis.overlap``).

Schemes that change the maths are ranked in a block of their own and are never the
recommendation unless ``--approximate`` is given: ``fp16`` (half the wire bytes),
``accumulate K`` (one sync per K micro-batches), ``async S`` (bounded staleness).

The model comes from one of: a compute profile (``--profile``, ``commbench.profile``);
a torch.profiler (Kineto) trace of one training step (``--trace``: phases and the time
each gradient was accumulated); or a registered model and a stated step time
(``--model`` and ``--compute-ms``: the time spread over the layers by their FLOPs on the
meta device, ``commbench.models.flops``, run as its own process since ``analysis/``
never imports torch). The cluster's alpha and beta come from flags or from a fit of a
results folder's microbenchmarks (``--fit-results``, ``analysis.costmodel``); an
inter-node alpha fitted on the emulated cluster is that network's, never a real one's,
and is refused without your own ``--latency-us``.

Bad input exits 2 with one line naming the flag, before any output file is written.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from analysis.alphabeta import (
    DEFAULT_ALPHA_INTER,
    FLAT_ALGOS,
    H200_NODE,
    LATENCY_FLAG,
    ModelError,
    Params,
    latency_arg,
    predict,
)
from analysis.cli import UsageError, entry, output_dir, parser, warn, writing
from analysis.costmodel import analyse
from analysis.figures import save
from analysis.load import LoadError, load, num
from analysis.overlap import Profile, Step, bucketed_step, flat_step, load_profile
from analysis.sharded import times_units, zero3_step
from commbench.buckets import (
    AUTO,
    DEFAULT_BUCKET_MB,
    FIRST_BUCKET_MB,
    MB,
    choose_cap,
    parse_bucket_mb,
)
from commbench.flags import csv_list, positive_float, positive_int
from commbench.polling import polled_ring_s
from commbench.profilefile import ProfileError
from commbench.profilefile import read as read_profile

PROG = "analysis.advise"

HIER_ALGOS = ("hier", "hier-leader")
#: the bucketed strategy's transfer paths (``--transfer``) and the algorithm each runs
PATHS = {"thread": "native", "ring": "ring", "hier": "hier"}
#: the async strategy's transfer paths (it has no two-level one)
ASYNC_PATHS = {"thread": "native", "ring": "ring"}
CAPS_MB = (1.0, 5.0, DEFAULT_BUCKET_MB, 64.0, 128.0, AUTO)
ACCUM_STEPS = (2, 4, 8)
STALENESS = (1, 2, 4)
#: margins of predicted step below this share (%) are a tie: the overlap model's median
#: step error on link-bound emulated runs was 6.0 % (GPT-tiny 2 x 4, 12 runs) and 14.7 %
#: (the quick study's ResNet-18, 12 runs; docs/analysis.md). A stated margin, not a fit:
#: the validation grid (experiments/advise_grid.toml) is what will measure it per cell
TIE_PCT = 10.0
EXACT = ("flat", "hierarchical", "bucketed", "sharded")
#: the families whose best scheme the approximate block builds on (the sharded strategies
#: refuse --compression)
APPROXIMATE_ON = ("flat", "hierarchical", "bucketed")
APPROXIMATE = ("fp16", "accumulate", "async")
SCHEMES = EXACT + APPROXIMATE
FP16_WIRE = 0.5  # fp16/bf16 on the wire: half of float32's bytes
#: the intra-node level where neither a fit nor a flag gives it: an H200 node (NVLink 4)
DEFAULT_NODE = H200_NODE
#: one training step's compute with --model when --batch-size is not given
DEFAULT_BATCH = 32


# --- the cluster ---------------------------------------------------------------------

@dataclass(frozen=True)
class Cluster:
    """GPUs per node and the model's parameters; ``sources`` says where each came from."""

    local_size: int
    params: Params
    sources: tuple[str, ...] = ()

    def layout(self, ranks: int) -> tuple[int, int]:
        """(nodes, ranks per node) of ``ranks`` placed node by node."""
        return max(1, ranks // self.local_size), min(ranks, self.local_size)

    def allreduce(self, algo: str, ranks: int, wire: float = 1.0) -> Callable[[float], float]:
        """Seconds of an all-reduce of ``algo`` on ``ranks``, as a function of the gradient
        bytes (``wire`` of them cross the links)."""
        nodes, local = self.layout(ranks)

        def seconds(nbytes: float) -> float:
            return predict(algo, nbytes * wire, ranks, self.params, nodes, local)

        return seconds


# --- the schemes ---------------------------------------------------------------------

def polled(blocking: Callable[[float], float], ranks: int, wire: float = 1.0
           ) -> Callable[[float], float]:
    """The engine's ring path from the blocking ring's cost: each single-message step seen
    when the engine's poll sees it (``commbench.polling.polled_ring_s``)."""
    return lambda nbytes: polled_ring_s(blocking(nbytes), nbytes * wire, ranks)


@dataclass(frozen=True)
class Scheme:
    """One exact scheme: an all-reduce algorithm, after backward or per bucket."""

    name: str
    family: str
    algo: str
    #: None: one all-reduce of the whole gradient; MB (0: one per tensor); or ``auto``
    bucket_mb: float | str | None = None
    #: the bucketed strategy's transfer path (``PATHS``); None after backward
    path: str | None = None

    def step(self, prof: Profile, cluster: Cluster, ranks: int, wire: float = 1.0) -> Step:
        allreduce = cluster.allreduce(self.algo, ranks, wire)
        if self.bucket_mb is None:
            return flat_step(prof, allreduce)
        if self.path == "ring":  # the engine waits for the ring's messages by polling
            allreduce = polled(allreduce, ranks, wire)

        cap = self.bucket_mb
        if cap == AUTO:  # the cap --bucket-mb auto chooses, priced by this model, not a probe
            allreduce = functools.lru_cache(maxsize=None)(allreduce)  # sizes recur over caps
            cap, _ = choose_cap(prof.nbytes, prof.order, prof.ready_s, allreduce,
                                FIRST_BUCKET_MB * MB)
        return bucketed_step(prof, allreduce, cap, FIRST_BUCKET_MB)


def cap_words(cap: float | str) -> str:
    """A bucket cap in a scheme's name: ``25 MB``, ``per-tensor`` (0), ``auto``."""
    if cap == AUTO:
        return AUTO
    return "per-tensor" if cap == 0 else f"{cap:g} MB"


def half_ring(cluster: Cluster, ranks: int, nodes: int, local: int, wire: float = 1.0,
              algo: str = "ring") -> Callable[[float], float]:
    """Seconds of a reduce-scatter or an all-gather of n bytes on ``ranks`` laid out as
    ``nodes`` x ``local``: half an all-reduce of n by ``algo`` (a ring all-reduce is one of
    each; ``hier``'s is the node's reduce-scatter, the cross-node all-reduce of its parts and
    the node's all-gather, of which the topology-aware reduce-scatter is the first half)."""
    return lambda n: predict(algo, n * wire, ranks, cluster.params, nodes, local) / 2


@dataclass(frozen=True)
class ShardedScheme:
    """One scheme of the sharded family (module docstring): ``zero2`` and ``hsdp`` at a
    bucket cap, ``zero3`` with its prefetch and reduce-scatter group."""

    name: str
    strategy: str
    bucket_mb: float | str | None = None
    prefetch: bool = True
    separate: bool = False
    #: zero3: the root freed after forward (ZeRO's 3 gathers' worth); False: kept, FSDP2's rule
    reshard_root: bool = True
    #: zero2, zero3: the collectives' ``--algo``: ``ring``, or ``hier`` (topology-aware)
    algo: str = "ring"
    family: str = "sharded"

    def step(self, prof: Profile, cluster: Cluster, ranks: int, wire: float = 1.0) -> Step:
        nodes, local = cluster.layout(ranks)
        world = half_ring(cluster, ranks, nodes, local, wire, self.algo)
        if self.strategy == "zero3":
            return zero3_step(prof, world, world, prefetch=self.prefetch,
                              separate=self.separate, reshard_root=self.reshard_root)
        if self.strategy == "zero2":
            scatter, gather = world, world
        else:  # hsdp: in the node, then the node's parts across nodes at once
            inner = half_ring(cluster, local, 1, local, wire)

            def scatter(n: float) -> float:
                # the two-level all-reduce but its last phase, the node's all-gather: the
                # node's L parts cross together, sharing its link (1.0 psi on 2 x 4, as the
                # links measured, docs/strategies.md)
                return predict("hier", n * wire, ranks, cluster.params, nodes, local) \
                    - inner(n)

            gather = inner
        st = bucketed_step(prof, scatter, self.bucket_mb, FIRST_BUCKET_MB)
        after = gather(prof.grad_bytes)  # the parameters all-gathered after the step
        return Step(st.compute_s, st.exposed_s + after, st.comm_s + after, st.buckets)


#: the word a sharded row's name ends with where its collectives are topology-aware
TOPOLOGY = "topology-aware"


def sharded_schemes(caps_mb: Sequence[float | str], units: bool, multi_node: bool
                    ) -> list[ShardedScheme]:
    """The sharded family's rows: zero2 (and hsdp on several nodes) at each numeric cap
    (``auto`` is the bucketed strategy's), zero3 where the profile times units (with the
    root kept gathered from forward to backward too: FSDP2's rule, the schedule the FSDP2
    peer runs, one gather of the root fewer for the root whole through backward)."""
    caps = [c for c in caps_mb if c != AUTO]
    out = [ShardedScheme(f"zero2 {cap_words(c)}", "zero2", c) for c in caps]
    if multi_node:
        out += [ShardedScheme(f"zero2 {cap_words(c)} {TOPOLOGY}", "zero2", c, algo="hier")
                for c in caps]
        out += [ShardedScheme(f"hsdp {cap_words(c)}", "hsdp", c) for c in caps]
    if units:
        out += [ShardedScheme("zero3 prefetch, shared", "zero3"),
                ShardedScheme("zero3 prefetch, shared, root kept", "zero3", reshard_root=False),
                ShardedScheme("zero3 prefetch, separate RS group", "zero3", separate=True),
                ShardedScheme("zero3 no prefetch", "zero3", prefetch=False)]
        if multi_node:
            out.append(ShardedScheme(f"zero3 prefetch, shared, {TOPOLOGY}", "zero3",
                                     algo="hier"))
    return out


def exact_schemes(families: Sequence[str], caps_mb: Sequence[float | str],
                  units: bool = False, multi_node: bool = False) -> list:
    """The exact schemes of ``families``, in the table's order of listing (ties keep it);
    ``units``: the profile times forward unit by unit (zero3 can be priced), ``multi_node``:
    hsdp has nodes to replicate across."""
    out: list = []
    if "flat" in families:
        out += [Scheme(f"flat {a}", "flat", a) for a in FLAT_ALGOS]
    if "hierarchical" in families:
        out += [Scheme(f"hierarchical {a}", "hierarchical", a) for a in HIER_ALGOS]
    if "bucketed" in families:
        out += [Scheme(f"bucketed {cap_words(cap)} on {path}", "bucketed", algo, cap, path)
                for cap in caps_mb for path, algo in PATHS.items()]
    if "sharded" in families:
        out += sharded_schemes(caps_mb, units, multi_node)
    return out


@dataclass(frozen=True)
class Prediction:
    """One row: a scheme's predicted compute and exposed sync per step (seconds)."""

    scheme: str
    family: str
    compute_s: float
    exposed_s: float

    @property
    def exact(self) -> bool:
        return self.family in EXACT

    @property
    def step_s(self) -> float:
        return self.compute_s + self.exposed_s

    @property
    def sync_share(self) -> float:
        return self.exposed_s / self.step_s if self.step_s > 0 else math.nan

    @property
    def efficiency(self) -> float:
        """Scaling efficiency: compute / step (one rank has no sync; docs/metrics.md)."""
        return self.compute_s / self.step_s if self.step_s > 0 else math.nan


def predicted(scheme: Scheme, st: Step, family: str | None = None, name: str | None = None
              ) -> Prediction:
    return Prediction(name or scheme.name, family or scheme.family, st.compute_s, st.exposed_s)


def async_exposed(compute_s: float, allreduce_s: float, staleness: int) -> float:
    """Exposed sync per step of async at ``staleness`` S in steady state: the all-reduce of
    step t (``allreduce_s`` on the link, one at a time) is waited for at step t + S, so
    S steps of compute hide it, but the link carries one gradient per step, so a step is
    never shorter than the all-reduce: step = max(C + max(0, T - S C), T)."""
    step = max(compute_s + max(0.0, allreduce_s - staleness * compute_s), allreduce_s)
    return step - compute_s


def approximate_predictions(prof: Profile, cluster: Cluster, ranks: int,
                            best: dict[str, tuple[Scheme, Step]], families: Sequence[str],
                            accum: Sequence[int], staleness: Sequence[int]) -> list[Prediction]:
    """The schemes that change the maths, each on the best exact scheme of each family
    (``best``: family -> its best scheme and step); async on its own paths."""
    out = []
    for scheme, st in best.values():
        if "fp16" in families:
            out.append(predicted(scheme, scheme.step(prof, cluster, ranks, FP16_WIRE), "fp16",
                                 f"fp16 wire, {scheme.name}"))
        if "accumulate" in families:
            out += [Prediction(f"accumulate {k}, {scheme.name}", "accumulate", st.compute_s,
                               st.exposed_s / k) for k in accum]
    if "async" in families:
        for path, algo in ASYNC_PATHS.items():
            t = cluster.allreduce(algo, ranks)(prof.grad_bytes)
            out += [Prediction(f"async S={s} on {path}", "async", prof.compute_s,
                               async_exposed(prof.compute_s, t, s)) for s in staleness]
    return out


def ranked(preds: Sequence[Prediction]) -> list[Prediction]:
    """Fastest predicted step first; ties keep the order of listing."""
    return sorted(preds, key=lambda p: p.step_s)


@dataclass(frozen=True)
class Advice:
    """One scale's tables, ranked, and the pick among the schemes it may recommend."""

    ranks: int
    exact: list[Prediction]
    approximate: list[Prediction]
    allow_approximate: bool = False
    tie_pct: float = TIE_PCT

    @property
    def candidates(self) -> list[Prediction]:
        return ranked(self.exact + self.approximate) if self.allow_approximate else self.exact

    @property
    def pick(self) -> Prediction | None:
        return self.candidates[0] if self.candidates else None

    @property
    def runner_up(self) -> Prediction | None:
        return self.candidates[1] if len(self.candidates) > 1 else None

    @property
    def tied(self) -> list[Prediction]:
        """The other candidates whose predicted step is within ``tie_pct`` % of the pick's:
        the model cannot rank them apart (its step error on measured runs: ``TIE_PCT``)."""
        best = self.pick
        if best is None:
            return []
        return [p for p in self.candidates[1:]
                if p.step_s - best.step_s < self.tie_pct / 100 * p.step_s]


def advise(prof: Profile, cluster: Cluster, ranks: int, families: Sequence[str] = SCHEMES,
           caps_mb: Sequence[float | str] = CAPS_MB, accum: Sequence[int] = ACCUM_STEPS,
           staleness: Sequence[int] = STALENESS, allow_approximate: bool = False,
           tie_pct: float = TIE_PCT) -> Advice:
    """Every scheme of ``families`` predicted on ``ranks`` GPUs, ranked."""
    schemes = exact_schemes(families, caps_mb, times_units(prof), cluster.layout(ranks)[0] > 1)
    steps = [(s, s.step(prof, cluster, ranks)) for s in schemes]
    best: dict[str, tuple[Scheme, Step]] = {}
    for s, st in steps:
        if s.family not in APPROXIMATE_ON:
            continue
        if s.family not in best or st.step_s < best[s.family][1].step_s:
            best[s.family] = (s, st)
    exact = ranked([predicted(s, st) for s, st in steps])
    approx = ranked(approximate_predictions(prof, cluster, ranks, best, families, accum,
                                            staleness))
    return Advice(ranks, exact, approx, allow_approximate, tie_pct)


# --- the model: a profile, a trace, or a registered model and a step time ------------------

def profile_input(path: str, model: str | None, batch_size: int | None) -> Profile:
    """``--profile FILE``, checked against ``--model`` and ``--batch-size`` where given."""
    try:
        raw = read_profile(path)
    except ProfileError as e:
        raise UsageError(f"--profile: {e}") from None
    if model is not None and raw.model != model:
        raise UsageError(f"--model {model}: the profile {path} was recorded for {raw.model} "
                         "(give the profile of your model, or drop --model)")
    if batch_size is not None and raw.batch_size != batch_size:
        raise UsageError(f"--batch-size {batch_size}: the profile {path} was recorded at batch "
                         f"{raw.batch_size} (compute and ready times change with the batch)")
    try:
        return load_profile(path)
    except ModelError as e:
        raise UsageError(f"--profile: {e}") from None


#: what the trace reader looks for (names torch.profiler and commbench.torchtrace give)
ACCUMULATE = "torch::autograd::AccumulateGrad"
ENGINE = "autograd::engine::evaluate_function: "
STEP_PREFIX = "ProfilerStep#"
OPTIMIZER_PREFIX = "Optimizer.step#"
#: bytes per element of the gradient types a trace names (``Input type``)
DTYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "half": 2,
               "bfloat16": 2, "float16": 2}


def trace_events(path: str) -> list[dict]:
    """The complete (``ph: X``) events of a Kineto trace file, by start time."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise UsageError(f"--trace {path}: cannot read: {e.strerror or e}") from None
    except ValueError as e:
        raise UsageError(f"--trace {path}: not JSON ({e})") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise UsageError(f"--trace {path}: not a torch.profiler trace (no traceEvents)")
    done = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"
            and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))]
    return sorted(done, key=lambda e: e["ts"])


def _end(e: dict) -> float:
    return e["ts"] + e["dur"]


def gradient_events(events: Sequence[dict]) -> list[dict]:
    """The events that mark a gradient ready: autograd's AccumulateGrad calls (the node
    itself where traced, which carries its input's shape, else the engine's wrapper)."""
    inner = [e for e in events if e.get("name") == ACCUMULATE]
    return inner or [e for e in events if e.get("name") == ENGINE + ACCUMULATE]


def _is_optimizer_step(e: dict) -> bool:
    name = str(e.get("name", ""))
    return name == "optimizer" or name.startswith(OPTIMIZER_PREFIX)


def step_events(events: Sequence[dict]) -> tuple[list[dict], str]:
    """The events of the first traced step that accumulated gradients
    (``ProfilerStep#k``), and its name; where no step is marked (torch names steps only
    under a profiler schedule), the trace up to the end of its first optimizer step; else
    the whole trace."""
    for s in (e for e in events if str(e.get("name", "")).startswith(STEP_PREFIX)):
        inside = [e for e in events if s["ts"] <= e["ts"] and _end(e) <= _end(s) and e is not s]
        if gradient_events(inside):
            return [s, *inside], s["name"]
    opt = next((e for e in events if _is_optimizer_step(e)), None)
    if opt is not None and gradient_events([e for e in events if e["ts"] < opt["ts"]]):
        return ([e for e in events if e["ts"] < _end(opt)],
                "the trace up to its first optimizer step")
    return list(events), "the whole trace"


def _first(events: Sequence[dict], name: str) -> dict | None:
    return next((e for e in events if e.get("name") == name), None)


def gradient_bytes(e: dict, path: str) -> float:
    """The bytes of the gradient an AccumulateGrad event accumulated: its input's shape
    and type (recorded with ``record_shapes=True``)."""
    args = e.get("args") or {}
    dims = args.get("Input Dims")
    if not (isinstance(dims, list) and dims and isinstance(dims[0], list)):
        raise UsageError(f"--trace {path}: its gradient-ready events ({e.get('name')}) carry "
                         "no shapes: record the step with torch.profiler.profile("
                         "record_shapes=True)")
    types = args.get("Input type") or ["float"]
    return float(math.prod(dims[0])) * DTYPE_BYTES.get(str(types[0]), 4)


def trace_profile(path: str) -> Profile:
    """``--trace FILE``: a Profile from one step of a torch.profiler trace.

    Backward starts at commbench's ``backward`` range (``commbench.torchtrace``) or else
    at autograd's first ``evaluate_function`` event; each gradient is ready when its
    AccumulateGrad call ends; forward is commbench's ``forward`` range, or else the step's
    start to backward's; the optimizer is commbench's ``optimizer`` range, or else
    torch's ``Optimizer.step#...`` calls (0 where neither is traced)."""
    events, where = step_events(trace_events(path))
    grads = gradient_events(events)
    if not grads:
        raise UsageError(f"--trace {path}: no gradient-ready events ({ACCUMULATE}) in "
                         f"{where}: trace one training step's backward with torch.profiler "
                         "(ProfilerActivity.CPU, record_shapes=True)")
    annotated = _first(events, "backward")
    engine = [e for e in events if str(e.get("name", "")).startswith(ENGINE)]
    start = annotated["ts"] if annotated else min(e["ts"] for e in engine or grads)
    step_start = events[0]["ts"]
    fwd = _first(events, "forward")
    forward_us = fwd["dur"] if fwd else max(0.0, start - step_start)
    opt = _first(events, "optimizer")
    optimizer_us = opt["dur"] if opt else sum(
        e["dur"] for e in events if str(e.get("name", "")).startswith(OPTIMIZER_PREFIX))
    grads = sorted(grads, key=_end)
    ready = [max(0.0, _end(e) - start) * 1e-6 for e in grads]
    return Profile(Path(path).name, forward_us * 1e-6, max(ready), optimizer_us * 1e-6,
                   [gradient_bytes(e, path) for e in grads], ready, list(range(len(grads))))


def model_profile(model: str, compute_ms: float, batch_size: int, image_size: int,
                  model_kwargs: str) -> Profile:
    """``--model NAME --compute-ms MS``: the step time spread over the layers by FLOPs, by
    ``python -m commbench.models.flops`` (its own process: torch is its, not ``analysis/``'s)."""
    with tempfile.TemporaryDirectory(prefix="advise-") as tmp:
        out = Path(tmp) / "flops.json"
        cmd = [sys.executable, "-m", "commbench.models.flops", "--model", model,
               "--batch-size", str(batch_size), "--image-size", str(image_size),
               "--compute-ms", repr(compute_ms), "-o", str(out)]
        if model_kwargs:
            cmd += ["--model-kwargs", model_kwargs]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        except subprocess.TimeoutExpired:
            raise UsageError(f"--model {model}: counting its FLOPs took over 300 s") from None
        if res.returncode != 0:
            lines = res.stderr.strip().splitlines() or ["no message"]
            why = lines[-1].removeprefix("commbench.models.flops: error: ")
            raise UsageError(f"--model {model}: {why}")
        try:
            prof = load_profile(out)
        except ModelError as e:
            raise UsageError(f"--model {model}: {e}") from None
    prof.name = f"{model} batch {batch_size}, {compute_ms:g} ms spread by FLOPs"
    return prof


# --- the cluster's parameters: flags, or a fit ------------------------------------------

def fitted_params(paths: Sequence[str]) -> tuple[Params, bool, list[str]]:
    """(the fit of the results' microbenchmarks, whether its inter-node level was fitted on
    the emulated cluster, the loader's warnings); UsageError naming ``--fit-results`` and the
    runs that make a fit where the results hold none."""
    try:
        loaded = load(paths)
    except LoadError as e:
        raise UsageError(f"--fit-results: {e}") from None
    try:
        res = analyse(loaded.records)
    except ModelError as e:
        raise UsageError(
            f"--fit-results {' '.join(paths)}: no fit: {e}. A fit is made from ring "
            "microbenchmarks (python -m commbench.microbench --algo ring) on one host "
            "(intra-node alpha, beta) and across nodes (inter-node)") from None
    inter = [pt for pt in res.fit_points if pt.nodes > 1]
    # the emulated cluster shapes its links (tbf) and may dilate time; a real one does neither
    shaped = any(r.get("link_shaping") for r in loaded.records
                 if r.get("kind") == "microbench" and num(r.get("nodes")) > 1)
    emulated = bool(inter) and (shaped or any(pt.dilation != 1 for pt in inter))
    return res.params, emulated, loaded.warnings


@dataclass(frozen=True)
class ClusterFlags:
    """The cluster flags as given (None: not given)."""

    local_size: int
    link_gbps: float | None = None
    latency_us: float | None = None
    intra_gbps: float | None = None
    intra_latency_us: float | None = None


def cluster_params(flags: ClusterFlags, fit: tuple[Params, bool] | None, multi_node: bool
                   ) -> Cluster:
    """The model's parameters: each flag given, else the fit's, else an H200 node's
    (intra-node) and ``DEFAULT_ALPHA_INTER`` (inter-node alpha); the link rate has no
    default. An inter-node alpha fitted on the emulated cluster is refused unless
    ``--latency-us`` replaces it."""
    fp, emulated = fit if fit is not None else (Params(), False)
    src: list[str] = []

    def pick(flag_value: float | None, flag: str, fitted: float, default: float | None,
             default_words: str, what: str) -> float:
        if flag_value is not None:
            src.append(f"{what} from {flag}")
            return flag_value
        if not math.isnan(fitted):
            src.append(f"{what} fitted")
            return fitted
        if default is None:
            return math.nan
        src.append(f"{what} {default_words}")
        return default

    us = None if flags.intra_latency_us is None else flags.intra_latency_us * 1e-6
    alpha_intra = pick(us, "--intra-latency-us", fp.alpha_intra, DEFAULT_NODE["alpha_intra"],
                       "of an H200 node", "intra alpha")
    beta = None if flags.intra_gbps is None else 8 / (flags.intra_gbps * 1e9)
    beta_intra = pick(beta, "--intra-gbps", fp.beta_intra, DEFAULT_NODE["beta_intra"],
                      "of an H200 node (NVLink 4)", "intra beta")
    if fit is None:
        gamma = DEFAULT_NODE["gamma"]
        src.append("gamma of an H200 node (HBM3e)")
    else:  # a fit that could not tell gamma from beta holds it inside its beta
        gamma = fp.gamma
        src.append("gamma folded into the fitted beta" if fp.gamma_folded else "gamma fitted")
    if multi_node and flags.latency_us is None and emulated:
        raise UsageError(f"--fit-results: its inter-node alpha ({fp.alpha_inter * 1e6:.1f} us) "
                         "was fitted on the emulated cluster, whose per-message latency is "
                         "the host's (divided by the dilation K), never a real network's: "
                         f"give your network's {LATENCY_FLAG}")
    us = None if flags.latency_us is None else flags.latency_us * 1e-6
    alpha_inter = pick(us, LATENCY_FLAG, fp.alpha_inter, DEFAULT_ALPHA_INTER,
                       "of an RDMA-class fabric", "inter alpha")
    beta = None if flags.link_gbps is None else 8 / (flags.link_gbps * 1e9)
    beta_inter = pick(beta, "--link-gbps", fp.beta_inter, None, "", "inter beta")
    if multi_node and math.isnan(beta_inter):
        raise UsageError("--link-gbps: give the inter-node link rate (Gbit/s), or "
                         "--fit-results with microbenchmark runs across nodes")
    return Cluster(flags.local_size, Params(alpha_intra, beta_intra, alpha_inter, beta_inter,
                                            gamma, gamma_folded=False), tuple(src))


# --- output ------------------------------------------------------------------------------

def row_line(i: int | str, p: Prediction) -> str:
    return (f"{i!s:>5s}  {p.scheme:42s} {p.step_s * 1e3:9.2f} {p.exposed_s * 1e3:11.2f} "
            f"{p.sync_share:10.1%} {p.efficiency:10.1%}")


HEADER = (f"#{'rank':>4s}  {'scheme':42s} {'step ms':>9s} {'exposed ms':>11s} "
          f"{'sync share':>10s} {'efficiency':>10s}")


def pick_lines(a: Advice) -> list[str]:
    """The recommendation at one scale and its margin over the runner-up."""
    best, second = a.pick, a.runner_up
    if best is None:
        return [f"# no scheme to recommend at {a.ranks} ranks"]
    what = "" if best.exact else " (an approximate scheme: it changes the maths)"
    line = (f"# recommended at {a.ranks} ranks: {best.scheme}{what}, {best.step_s * 1e3:.2f} ms "
            f"per step, efficiency {best.efficiency:.1%}")
    if second is None:
        return [line]
    margin = second.step_s - best.step_s
    out = [line, f"#   {margin * 1e3:.2f} ms ({margin / second.step_s:.1%}) faster than the "
                 f"runner-up, {second.scheme} ({second.step_s * 1e3:.2f} ms)"]
    tied = a.tied
    if tied:
        names = ", ".join(p.scheme for p in tied[:3]) + (
            f" and {len(tied) - 3} more" if len(tied) > 3 else "")
        out.append(f"#   a tie: {len(tied)} other scheme{'s' if len(tied) > 1 else ''} within "
                   f"--tie-pct {a.tie_pct:g} % of its step, inside the model's error: "
                   f"{names}; measure them on your cluster before choosing")
    return out


APPROX_NOTE = ("# schemes that change the maths, each on the best exact scheme of its family "
               "(never the recommendation without --approximate): fp16 = half the wire bytes "
               "(the casts' compute not counted); accumulate K = one sync per K micro-batches, "
               "the row is their mean step; async S = the all-reduce of step t waited for at "
               "step t+S, one at a time on the link: step = max(compute + max(0, T - S x "
               "compute), T). Convergence is not modelled: the staleness study (docs/async.md) "
               "saw S >= 1 collapse on smallcnn")


def table_lines(a: Advice, cluster: Cluster) -> list[str]:
    nodes, local = cluster.layout(a.ranks)
    out = [f"# {a.ranks} ranks = {nodes} node{'s' if nodes > 1 else ''} x {local} GPUs", HEADER]
    out += [row_line(i, p) for i, p in enumerate(a.exact, 1)]
    if a.approximate:
        out += [APPROX_NOTE, HEADER]
        out += [row_line(f"a{i}", p) for i, p in enumerate(a.approximate, 1)]
    return out + pick_lines(a) + [""]


def gbit_s(beta: float) -> float:
    """A link's rate in Gbit/s from its beta (seconds per byte)."""
    return 8 / beta / 1e9 if beta > 0 else math.inf


def describe(prof: Profile, cluster: Cluster) -> list[str]:
    p = cluster.params
    inter = "" if math.isnan(p.beta_inter) else \
        f", inter {p.alpha_inter * 1e6:g} us + {gbit_s(p.beta_inter):g} Gbit/s"
    return [f"# model: {prof.name}: forward {prof.forward_s * 1e3:.1f} ms, backward "
            f"{prof.backward_s * 1e3:.1f} ms, optimizer {prof.optimizer_s * 1e3:.1f} ms, "
            f"{prof.grad_bytes / 1e6:.1f} MB gradient in {len(prof.nbytes)} tensors",
            f"# cluster: {cluster.local_size} GPUs per node; intra {p.alpha_intra * 1e6:g} us + "
            f"{gbit_s(p.beta_intra):g} Gbit/s{inter}, gamma {p.gamma * 1e12:g} ps/B "
            f"({'; '.join(cluster.sources)})",
            "# flat native (the library's own all-reduce) is predicted as the cheapest flat "
            "algorithm, the thread path's buckets likewise; exposed sync = step - compute",
            "# sharded: a reduce-scatter or all-gather costs half a ring all-reduce of its "
            "bytes (topology-aware: half the two-level all-reduce's; hsdp's crosses the "
            "node's link with its parts together); zero2 (= zero1's time) and hsdp gather "
            "the parameters after the step; "
            "zero3 " + ("gathers per unit (analysis/sharded.py)" if times_units(prof) else
                        "not ranked: the model input times no forward unit (record a "
                        "profile with commbench.profile)"),
            *(f"# note: the profile has {note}" for note in prof.lacks)]


#: line styles per family in the figure
STYLES = {"flat": ":", "hierarchical": "--", "bucketed": "-", "sharded": (0, (5, 1, 1, 1)),
          "fp16": "-.",
          "accumulate": "-.", "async": "-."}


def figure(advices: Sequence[Advice], title: str):
    """Predicted step (ms, log scale) and scaling efficiency vs ranks, one line per scheme:
    a colour each (20 before they repeat), a line style per family, one legend beside both."""
    import matplotlib.pyplot as plt  # analysis.figures chose the Agg backend at import

    fig, (step_ax, eff_ax) = plt.subplots(2, 1, figsize=(10, 8), sharex=True,
                                          layout="constrained")
    ranks = [a.ranks for a in advices]
    rows = [*advices[0].exact, *(advices[0].approximate if advices[0].allow_approximate
                                 else ())]
    by_scale = [{q.scheme: q for q in (*a.exact, *a.approximate)} for a in advices]
    # an approximate row is on the best scheme of its family, which may change with scale
    every = [p for p in rows if all(p.scheme in scale for scale in by_scale)]
    colors = plt.get_cmap("tab20").colors
    for i, p in enumerate(sorted(every, key=lambda p: (SCHEMES.index(p.family), p.scheme))):
        per = [scale[p.scheme] for scale in by_scale]
        kw = {"ls": STYLES[p.family], "marker": "o", "ms": 3, "lw": 1.2,
              "color": colors[i % len(colors)], "label": p.scheme}
        step_ax.plot(ranks, [q.step_s * 1e3 for q in per], **kw)
        eff_ax.plot(ranks, [q.efficiency for q in per], **kw)
    step_ax.set_ylabel("predicted step (ms)")
    step_ax.set_yscale("log")
    eff_ax.set_ylabel("scaling efficiency (compute / step)")
    eff_ax.set_ylim(0, 1.02)
    eff_ax.set_xlabel("ranks (GPUs)")
    eff_ax.set_xscale("log", base=2)
    for ax in (step_ax, eff_ax):
        ax.grid(True, which="both", alpha=0.3)
    fig.legend(*step_ax.get_legend_handles_labels(), loc="outside right upper", fontsize=7,
               frameon=False)
    fig.suptitle(title, fontsize=9)
    return fig


# --- command line ------------------------------------------------------------------------

def _list(one: Callable[[str], object], what: str) -> Callable[[str], list]:
    """A comma list of values, each read by ``one`` (``commbench.flags``' checked types)."""
    def parse(text: str) -> list:
        vals = [one(x.strip()) for x in text.split(",") if x.strip()]
        if not vals:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a comma list of {what}")
        return vals
    return parse


def _bucket_mb(text: str) -> float | str:
    """One ``--bucket-mb`` cap as the bucketed strategy reads it (``parse_bucket_mb``)."""
    try:
        return parse_bucket_mb(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--bucket-mb").lstrip(": ")) from None


def _tie_pct(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < 100:
        raise argparse.ArgumentTypeError(f"{text!r}: a percentage in [0, 100)")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = parser(PROG, "Rank the toolkit's gradient-sync schemes for your model on your cluster, "
                     "predicted by the alpha-beta-gamma and overlap models.")
    m = p.add_argument_group("the model (one of --profile, --trace, --model)")
    m.add_argument("--profile", help="a compute profile (python -m commbench.profile)")
    m.add_argument("--trace", help="a torch.profiler (Kineto) JSON trace of one training step, "
                                   "recorded with record_shapes=True")
    m.add_argument("--model", help="a registered model or package.module:factory: alone (with "
                                   "--compute-ms) its step spread over its layers by FLOPs; "
                                   "with --profile, checked against the profile")
    m.add_argument("--model-kwargs", default="", help="--model's keyword arguments")
    m.add_argument("--batch-size", type=positive_int, default=None,
                   help=f"per-rank batch (with --model alone: default {DEFAULT_BATCH}; with "
                        "--profile: checked against the profile's)")
    m.add_argument("--image-size", type=positive_int, default=224,
                   help="with --model: image side in pixels")
    m.add_argument("--compute-ms", type=positive_float, default=None,
                   help="one step's compute (forward + backward + optimizer) on your device; "
                        "with --profile or --trace, scales theirs to it")
    c = p.add_argument_group("the cluster")
    c.add_argument("--nodes", type=positive_int, default=1)
    c.add_argument("--local-size", "--gpus-per-node", dest="local_size",
                   type=positive_int,
                   default=DEFAULT_NODE["local_size"], help="ranks (GPUs) per node")
    c.add_argument("--ranks", type=_list(positive_int, "ranks"), default=None,
                   help="the scales to predict, comma list (multiples of --local-size); "
                        "default --nodes x --local-size")
    c.add_argument("--link-gbps", type=positive_float, default=None,
                   help="inter-node link rate, Gbit/s (default: the fit's)")
    c.add_argument(LATENCY_FLAG, dest="latency_us", type=latency_arg, default=None,
                   help="your network's inter-node latency per message, us (default: the "
                        f"fit's, else {DEFAULT_ALPHA_INTER * 1e6:g}: an RDMA-class fabric)")
    c.add_argument("--intra-gbps", type=positive_float, default=None,
                   help="intra-node rate per GPU and direction, Gbit/s (default: the fit's, "
                        "else an H200 node's NVLink 4, 3600)")
    c.add_argument("--intra-latency-us", type=positive_float, default=None,
                   help="intra-node latency per message, us (default: the fit's, else 2)")
    c.add_argument("--fit-results", nargs="+", metavar="RESULTS", default=None,
                   help="fit alpha and beta to these results' microbenchmarks "
                        "(analysis.costmodel); flags given replace fitted values")
    s = p.add_argument_group("the schemes")
    s.add_argument("--schemes", type=csv_list(SCHEMES, "--schemes"), default=list(SCHEMES),
                   help=f"families to rank, comma list of {', '.join(SCHEMES)}")
    s.add_argument("--bucket-mb", type=_list(_bucket_mb, "MB"), default=list(CAPS_MB),
                   help="bucket caps, MB (2**20 bytes), comma list; 0: one bucket per "
                        "tensor; auto: the cap --bucket-mb auto chooses, by this model")
    s.add_argument("--accum", type=_list(positive_int, "micro-batches"),
                   default=list(ACCUM_STEPS), help="gradient accumulation steps K")
    s.add_argument("--staleness", type=_list(positive_int, "steps"),
                   default=list(STALENESS), help="async staleness S")
    s.add_argument("--approximate", action="store_true",
                   help="let a scheme that changes the maths be the recommendation")
    s.add_argument("--tie-pct", type=_tie_pct, default=TIE_PCT, metavar="PCT",
                   help="schemes whose predicted step is within PCT %% of the pick's are "
                        "called a tie with it (default: %(default)g, between the model's "
                        "median step errors measured: docs/analysis.md)")
    p.add_argument("-o", "--output", default=None,
                   help="directory for advise.txt and, with several --ranks, advise.png/.svg")
    return p


def model_input(args: argparse.Namespace) -> Profile:
    """The Profile the flags name, scaled to ``--compute-ms`` where that is given."""
    given = [f for f, v in (("--profile", args.profile), ("--trace", args.trace)) if v]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)}: give one model input")
    if args.trace and args.model:
        raise UsageError("--model: a trace names no model; drop --model with --trace")
    if args.profile:
        prof = profile_input(args.profile, args.model, args.batch_size)
    elif args.trace:
        prof = trace_profile(args.trace)
    elif args.model:
        if args.compute_ms is None:
            raise UsageError(f"--compute-ms: --model {args.model} needs its step's compute time "
                             "on your device")
        return model_profile(args.model, args.compute_ms, args.batch_size or DEFAULT_BATCH,
                             args.image_size, args.model_kwargs)
    else:
        raise UsageError("give the model: --profile FILE, --trace FILE, or --model NAME "
                         "--compute-ms MS")
    if args.compute_ms is not None and prof.compute_s > 0:
        prof = prof.scaled(args.compute_ms / 1e3 / prof.compute_s)
    return prof


def scales(args: argparse.Namespace) -> list[int]:
    """The rank counts to predict: ``--ranks``, each a multiple of the GPUs per node."""
    ranks = args.ranks or [args.nodes * args.local_size]
    bad = [r for r in ranks if r % args.local_size]
    if bad:
        raise UsageError(f"--ranks {bad[0]}: not a multiple of --local-size {args.local_size} "
                         "(GPUs per node): nodes are whole")
    return sorted(set(ranks))


def body(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    started = time.perf_counter()
    ranks = scales(args)
    out = output_dir(args.output, create=False) if args.output else None
    fit = None
    if args.fit_results:
        params, emulated, warnings = fitted_params(args.fit_results)
        warn(PROG, warnings)
        fit = (params, emulated)
    flags = ClusterFlags(args.local_size, args.link_gbps, args.latency_us, args.intra_gbps,
                         args.intra_latency_us)
    cluster = cluster_params(flags, fit, any(r > args.local_size for r in ranks))
    prof = model_input(args)
    try:
        advices = [advise(prof, cluster, r, args.schemes, args.bucket_mb, args.accum,
                          args.staleness, args.approximate, args.tie_pct) for r in ranks]
    except ModelError as e:
        raise UsageError(str(e)) from None
    lines = describe(prof, cluster) + [""]
    for a in advices:
        lines += table_lines(a, cluster)
    rows = sum(len(a.exact) + len(a.approximate) for a in advices)
    lines.append(f"# {rows} predictions at {len(ranks)} scale{'s' if len(ranks) > 1 else ''} "
                 f"in {time.perf_counter() - started:.2f} s")
    text = "\n".join(lines)
    title = (f"{prof.name}: {prof.compute_s * 1e3:.1f} ms compute;\n{cluster.local_size} GPUs "
             f"per node, inter-node {gbit_s(cluster.params.beta_inter):g} Gbit/s and "
             f"{cluster.params.alpha_inter * 1e6:g} us per message (predicted)")
    fig = figure(advices, title) if out is not None and len(advices) > 1 else None
    if out is not None:
        output_dir(out)
        with writing(out):
            (out / "advise.txt").write_text(text + "\n", encoding="utf-8")
            if fig is not None:
                save(fig, out / "advise")
    print(text)
    return 0


main = entry(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
