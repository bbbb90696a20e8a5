"""The alpha-beta-gamma cost of all-reduce: each algorithm's time from link and reduction
parameters, and a training step's sync share at scale (no overlap).

Per link level (``intra``: ranks on one host; ``inter``: between hosts) a
message of ``m`` bytes costs ``alpha + m * beta``; reducing ``m`` bytes costs
``m * gamma``. All-reduce of ``n`` bytes on ``p`` ranks (Thakur, Rabenseifner
& Gropp, "Optimization of Collective Communication Operations in MPICH",
IJHPCA 2005):

- ring: ``2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma``
- recursive doubling: ``log p (alpha + n beta + n gamma)``
- Rabenseifner (halving reduce-scatter + doubling all-gather):
  ``2 log p alpha + 2(p-1)/p n beta + (p-1)/p n gamma``
- hierarchical (``hier``): ring reduce-scatter inside the node, ring all-reduce of
  the node's shards across ``N`` nodes (its ``L`` local ranks in parallel, sharing
  the node's link), ring all-gather inside the node;
- hierarchical leader (``hier-leader``): reduce to the node's first rank, ring
  all-reduce among the ``N`` leaders, broadcast; reduce and broadcast take the
  cheaper of Thakur's short (binomial tree) and long (Rabenseifner reduce,
  scatter + all-gather broadcast) forms, as MPICH chooses.

Across nodes (ranks placed node by node) a flat algorithm's step that crosses
nodes costs the inter-node link's alpha and beta; for recursive doubling and
Rabenseifner all ``L`` ranks of a node cross at once, so the node's link
carries ``L`` times the message; a ring has one crossing per node per step.
Rabenseifner's halving doubles its distance (step ``i`` sends ``n/2^i`` to the
rank ``2^(i-1)`` away), so only its last steps cross nodes, with the smallest
pieces.

Fitted to measurements, checked and extrapolated by ``analysis.costmodel``; the
bucketed schedule on top of it is ``analysis.overlap``.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from commbench.metrics import ring_bytes

# unknowns of the model, in this order in every coefficient vector
PARAMS = ("alpha_intra", "beta_intra", "alpha_inter", "beta_inter", "gamma")
AI, BI, AE, BE, G = range(5)
FLAT_ALGOS = ("ring", "rd", "rabenseifner")

# --- extrapolation scenarios: ResNet-50 on A100 and H200 nodes -----------------------
#: ResNet-50's gradient: 25,557,032 float32 parameters (torchvision; commbench.models)
RESNET50_GRAD_BYTES = 25_557_032 * 4
#: one A100 80GB, mixed precision, batch 256: 2470 img/s (NVIDIA DeepLearningExamples,
#: PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "Training performance: NVIDIA
#: DGX A100 (8x A100 80GB)", 1 GPU) -> 256 / 2470 s of compute per step
A100_RESNET50_BATCH = 256
A100_RESNET50_IMG_S = 2470.0
A100_RESNET50_COMPUTE_S = A100_RESNET50_BATCH / A100_RESNET50_IMG_S
#: an A100-class node: 8 GPUs on NVLink 3 (300 GB/s per GPU and direction), ~2 us per
#: message; reduction at HBM speed (~1.9 TB/s, 3 bytes moved per byte reduced)
A100_NODE = {"local_size": 8, "alpha_intra": 2e-6, "beta_intra": 1 / 300e9,
             "gamma": 3 / 1.9e12}
#: an H200 node (the report's device scenario, ``analysis.overlap``): 8 GPUs on NVLink 4
#: (900 GB/s per GPU both directions: 450 GB/s each way), ~2 us per message; reduction at
#: HBM3e speed (4.8 TB/s, 3 bytes moved per byte reduced)
H200_NODE = {"local_size": 8, "alpha_intra": 2e-6, "beta_intra": 1 / 450e9,
             "gamma": 3 / 4.8e12}
#: inter-node latency per message in the extrapolation: an RDMA-class fabric (NCCL over
#: InfiniBand: a few microseconds per message); stated, not fitted, because the emulated
#: cluster's links are TCP through network namespaces, whose per-message cost is far larger
DEFAULT_ALPHA_INTER = 10e-6
#: the one name of the user's inter-node per-message latency, a model input, in every
#: command that takes it (experiments.study, analysis.report, analysis.costmodel)
LATENCY_FLAG = "--latency-us"


def latency_us(text: str | float) -> float:
    """The ``--latency-us`` value in microseconds: a finite number above 0; anything else
    is a ValueError whose message names the flag."""
    try:
        us = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{LATENCY_FLAG} {text!r}: expected a number of microseconds "
                         "per inter-node message, e.g. 10") from None
    if not math.isfinite(us) or us <= 0:
        raise ValueError(f"{LATENCY_FLAG} {text!r}: must be a number above 0 (microseconds "
                         "per inter-node message)")
    return us


def latency_arg(text: str) -> float:
    """``latency_us`` as an argparse type: its message without the flag's name, which
    argparse puts in front."""
    try:
        return latency_us(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"{LATENCY_FLAG} ")) from None


def emulated_alpha_us(records) -> tuple[float, float] | None:
    """The emulated cluster's measured per-message latency among the records (median of
    their ``alpha_us``, commbench.latency) and the largest dilation K it was measured at;
    None where no record carries one (one node, or records before schema 5)."""
    got = [(float(r["alpha_us"]), float(r.get("dilation") or 1.0)) for r in records
           if isinstance(r.get("alpha_us"), (int, float)) and r.get("link_shaping")]
    if not got:
        return None
    return float(np.median([a for a, _ in got])), max(k for _, k in got)


class ModelError(ValueError):
    """A request the model cannot answer; the message says why."""


@dataclass
class Params:
    alpha_intra: float = math.nan
    beta_intra: float = math.nan
    alpha_inter: float = math.nan
    beta_inter: float = math.nan
    gamma: float = 0.0
    gamma_folded: bool = True  # gamma not identifiable from the fit data: inside beta
    fitted: list[str] = field(default_factory=list)

    def vector(self) -> np.ndarray:
        return np.array([getattr(self, k) for k in PARAMS], dtype=float)

    def with_inter(self, alpha: float, beta: float) -> Params:
        d = asdict(self)
        d.update(alpha_inter=alpha, beta_inter=beta)
        return Params(**d)


def _log2(p: int) -> tuple[int, int]:
    """(floor log2 p, extra steps): non-powers of two take 2 more steps (MPICH)."""
    lg = int(math.floor(math.log2(p))) if p > 1 else 0
    return lg, (0 if 1 << lg == p else 2)


def flat_coef(algo: str, n: float, p: int, nodes: int = 1, local: int | None = None
              ) -> np.ndarray:
    """Coefficients of PARAMS in the time of a flat all-reduce of ``n`` bytes on ``p`` ranks."""
    c = np.zeros(5)
    if p <= 1:
        return c
    local = p if nodes <= 1 else (local or math.ceil(p / nodes))
    multi = nodes > 1
    if algo == "ring":
        a, b = (AE, BE) if multi else (AI, BI)
        c[a] += 2 * (p - 1)
        c[b] += ring_bytes(n, p)
        c[G] += (p - 1) / p * n
        return c
    lg, extra = _log2(p)
    if algo == "rd":
        for i in range(lg):
            cross = multi and (1 << i) >= local
            c[AE if cross else AI] += 1
            c[BE if cross else BI] += n * (local if cross else 1)
            c[G] += n
    elif algo == "rabenseifner":
        # vector halving with distance *doubling* (Open MPI's redscat_allgather and MPICH
        # alike): step i sends n/2^i to the rank 2^(i-1) away, so with ranks placed node by
        # node the steps that cross nodes are the last, with the smallest pieces (on 2 x 4
        # the link carries n in all, against a ring's 2(p-1)/p n)
        for i in range(1, lg + 1):
            m = n / (1 << i)
            cross = multi and 1 << (i - 1) >= local
            c[AE if cross else AI] += 2  # halving step and its doubling mirror
            c[BE if cross else BI] += 2 * m * (local if cross else 1)
            c[G] += m
    else:
        raise ModelError(f"unknown flat algorithm {algo!r}; choose from {', '.join(FLAT_ALGOS)}")
    if extra:  # fold the surplus ranks in and out (one message of n each way, one reduction)
        c[AE if multi else AI] += extra
        c[BE if multi else BI] += extra * n
        c[G] += n
    return c


def _reduce_bcast(n: float, local: int, params: Params) -> float:
    """Reduce to a root plus broadcast inside a node: the cheaper Thakur form of each."""
    if local <= 1:
        return 0.0
    lg = math.ceil(math.log2(local))
    a, b, g = params.alpha_intra, params.beta_intra, params.gamma
    reduce_s = min(lg * (a + n * b + n * g),
                   2 * lg * a + 2 * (local - 1) / local * n * b + (local - 1) / local * n * g)
    bcast_s = min(lg * (a + n * b), (lg + local - 1) * a + 2 * (local - 1) / local * n * b)
    return reduce_s + bcast_s


def hier_coef(n: float, nodes: int, local: int) -> np.ndarray:
    """Coefficients of the reduce-scatter / cross all-reduce / all-gather hierarchy."""
    c = np.zeros(5)
    if local > 1:  # ring reduce-scatter and all-gather inside the node
        c[AI] += 2 * (local - 1)
        c[BI] += ring_bytes(n, local)
        c[G] += (local - 1) / local * n
    if nodes > 1:  # ring over nodes of each n/local shard; the node's link carries all of n
        c[AE] += 2 * (nodes - 1)
        c[BE] += ring_bytes(n, nodes)
        c[G] += (nodes - 1) / nodes * n / local
    return c


def predict(algo: str, n: float, p: int, params: Params, nodes: int = 1,
            local: int | None = None) -> float:
    """Predicted all-reduce seconds of ``algo`` for ``n`` bytes on ``p`` ranks."""
    local = p if nodes <= 1 else (local or math.ceil(p / nodes))
    v = params.vector()
    if algo in FLAT_ALGOS:
        return float(np.nansum(flat_coef(algo, n, p, nodes, local) * v))
    if algo == "native":
        return min(predict(a, n, p, params, nodes, local) for a in FLAT_ALGOS)
    if algo == "hier":
        return float(np.nansum(hier_coef(n, nodes, local) * v))
    if algo == "hier-leader":
        cross = 0.0
        if nodes > 1:
            cross = float(np.nansum(flat_coef("ring", n, nodes, nodes, 1) * v))
        return _reduce_bcast(n, local, params) + cross
    raise ModelError(f"no model for algorithm {algo!r}")


# --- at scale: a training step on nodes, no overlap ------------------------------

@dataclass(kw_only=True)
class Node:
    """Where an all-reduce at scale runs: ``local_size`` GPUs per node, their link and
    reduction speed, and the latency of an inter-node message; the inter-node bandwidth is
    the link rate asked for (``params``). Base of the no-overlap model's ``Scenario`` and
    the overlap model's ``analysis.overlap.Device``."""

    local_size: int
    alpha_intra: float
    beta_intra: float
    gamma: float
    alpha_inter: float = DEFAULT_ALPHA_INTER

    def params(self, gbit_s: float) -> Params:
        return Params(self.alpha_intra, self.beta_intra, self.alpha_inter, 8 / (gbit_s * 1e9),
                      self.gamma, gamma_folded=False)

    def node(self) -> dict:
        """This node's fields alone (to build another scenario on the same node)."""
        return {f.name: getattr(self, f.name) for f in fields(Node)}


@dataclass(kw_only=True)
class Scenario(Node):
    """A training step to extrapolate on a node: gradient bytes and compute seconds."""

    grad_bytes: float
    compute_s: float
    name: str = "custom"


def a100_scenario() -> Scenario:
    """ResNet-50, batch 256, on A100 nodes (NVIDIA's published throughput; no profile)."""
    return Scenario(grad_bytes=RESNET50_GRAD_BYTES, compute_s=A100_RESNET50_COMPUTE_S,
                    name=f"ResNet-50 batch {A100_RESNET50_BATCH} on A100 80GB at "
                         f"{A100_RESNET50_IMG_S:g} img/s", **A100_NODE)


def sync_share(algo: str, ranks: int, gbit_s: float, sc: Scenario) -> tuple[float, float]:
    """(all-reduce seconds, sync share) of a step with no overlap of sync and compute."""
    nodes = max(1, math.ceil(ranks / sc.local_size))
    local = min(ranks, sc.local_size)
    t = predict(algo, sc.grad_bytes, ranks, sc.params(gbit_s), nodes, local)
    return t, t / (t + sc.compute_s)
