"""ZeRO-3 in the overlap model: per-unit parameter gathers against forward and backward
compute, and per-unit reduce-scatters against backward.

``analysis.overlap`` prices the bucketed strategy: buckets reduced while backward still
runs. ZeRO-3 (``commbench/strategies/zero3.py``, docs/strategies.md) moves three kinds of
transfer through its engines, and two of them can stall compute itself, not only the end
of the step. Its schedule is replayed here on a compute profile that times forward unit by
unit (``forward_units``: ``commbench.profile``):

1. A gradient belongs to the unit whose module path prefixes its name (the longest such
   unit), else to the root unit (``commbench.models.units``; tied parameters are the
   root's). A unit's bytes are its gradients' bytes: what each of its all-gathers and its
   reduce-scatter moves. Units without parameters move nothing.
2. Forward. At forward's start the root is gathered and waited for; with prefetch the
   first unit's gather is handed over then. Unit ``k``'s forward begins at its profiled
   start moved by the stalls so far (the replay moves its schedule by them; on a device
   compute waits as long): its gather (handed over now where not prefetched) is waited
   for, a stall of ``max(0, end - arrival)``, and with prefetch the next unit's is handed
   over.
3. Backward. The root is gathered again at its start (the head's backward) and waited
   for, unless it was kept gathered from forward (``reshard_root`` off: FSDP2's root);
   with prefetch the unit backward reaches first is handed over. Unit ``k``'s
   backward begins when its output's gradient is in: at the ready time of the gradient
   backward announces just before the unit's first (``order``), moved by the stalls; its
   gather is waited for there and the next unit in backward's order prefetched. Each
   gradient is ready at its profiled time moved by the stalls; as a unit's last is in,
   its reduce-scatter is handed over.
4. Engines serve in the order handed over, one at a time (``commbench.buckets``'
   rule): ``shared`` one engine for gathers and reduce-scatters (a backward gather queues
   behind reduce-scatters handed over before it), ``separate`` an engine each.
5. Exposed sync = the stalls (forward and backward) + what the last transfer runs past
   backward's end; step = compute + exposed sync, compute the profile's (forward +
   backward + optimizer). Unit order is the profile's; a profile whose backward
   interleaves units (``commbench.workloads.synthetic.forward_plan`` then replays the
   chain in the root) is a ModelError.

The FSDP2 peer on Gloo (``fsdp_step``) issues every collective from one thread, its
backward gathers and its reduce-scatters blocking; the replay's device computes on
while the host waits, and a unit's computation begins no earlier than its gather's end.

Each collective of ``x`` bytes costs half an all-reduce of ``x`` on the same path (a ring
all-reduce is a reduce-scatter then an all-gather: ``analysis.alphabeta``'s ring,
``(p-1)`` latencies and ``(p-1)/p x`` bytes through the busiest link each).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis.alphabeta import ModelError, Params
from analysis.load import get, num, stat
from analysis.overlap import (
    OverlapCheck,
    Profile,
    Step,
    check_lines,
    checked,
    fitted_links,
    left_out,
    path_cost,
    run_layout,
    run_params,
    run_profile,
)

ROOT = ""
Cost = Callable[[float], float]


def unit_of_grads(names: Sequence[str], units: Sequence[str]) -> list[str]:
    """Each gradient's unit: the longest unit path that prefixes its name, else the root."""
    paths = sorted((u for u in units if u), key=len, reverse=True)
    return [next((u for u in paths if n.startswith(u + ".")), ROOT) for n in names]


@dataclass
class ShardedStep(Step):
    """A predicted ZeRO-3 step: ``Step``'s figures, and the stalls apart (seconds)."""

    forward_stall_s: float = 0.0
    backward_stall_s: float = 0.0
    tail_s: float = 0.0


class _Engine:
    """One transfer engine: serves what it is handed in that order, one at a time."""

    def __init__(self) -> None:
        self.free_at = 0.0
        self.busy_s = 0.0
        self.ends: list[float] = []

    def submit(self, t: float, seconds: float) -> float:
        start = max(t, self.free_at)
        self.free_at = start + seconds
        self.busy_s += seconds
        self.ends.append(self.free_at)
        return self.free_at


def times_units(prof: Profile) -> bool:
    """Whether ``zero3_step`` can schedule ``prof``: it times forward unit by unit and names
    its gradients."""
    return bool(prof.units) and len(prof.names) == len(prof.nbytes)


class _Gathers:
    """Each unit's all-gather on engine ``ag``: when the one in flight ends."""

    def __init__(self, ag: _Engine, size: dict[str, float], cost: Cost) -> None:
        self.ag, self.size, self.cost = ag, size, cost
        self.ends: dict[str, float] = {}  # unit -> when its gather in flight ends

    def start(self, u: str, t: float) -> None:
        if u in self.size and u not in self.ends:
            self.ends[u] = self.ag.submit(t, self.cost(self.size[u]))

    def ensure(self, u: str, t: float) -> float:
        """Wait at ``t`` for ``u``'s gather (handed over now where it was not): the stall."""
        if u not in self.size:
            return 0.0
        self.start(u, t)
        return max(0.0, self.ends.pop(u) - t)


def _units(prof: Profile) -> tuple[list[str], dict[str, float], list]:
    """Each gradient's unit, each unit's bytes, and the units with bytes in forward order."""
    if not prof.units:
        raise ModelError(f"profile {prof.name} times no forward unit: ZeRO-3 gathers per "
                         "unit (record one with commbench.profile)")
    if len(prof.names) != len(prof.nbytes):
        raise ModelError(f"profile {prof.name}: the gradients' names are not known")
    home = unit_of_grads(prof.names, [u.name for u in prof.units])
    size: dict[str, float] = {}
    for u, n in zip(home, prof.nbytes):
        size[u] = size.get(u, 0.0) + n
    forward = [u for u in sorted(prof.units[1:], key=lambda u: u.start_s) if u.name in size]
    _check_contiguous(prof, home, {u.name for u in forward})
    return home, size, forward


def _forward(gathers: _Gathers, forward: list, prefetch: bool) -> float:
    """Forward's stalls (module docstring, 2); every unit freed after its forward."""
    order = [u.name for u in forward]
    stall = gathers.ensure(ROOT, 0.0)
    if prefetch and order:
        gathers.start(order[0], stall)
    for k, u in enumerate(forward):
        stall += gathers.ensure(u.name, u.start_s + stall)
        if prefetch and k + 1 < len(order):
            gathers.start(order[k + 1], u.start_s + stall)
    gathers.ends.clear()
    return stall


def _backward(prof: Profile, home: Sequence[str]):
    """Backward's gradients in its order, each as ``(i, unit, begins, ends, ready)``:
    ``begins`` where ``i`` is the first of a unit's (never the root's), ``ends`` where it is
    its unit's last, ``ready`` the latest ready time of the gradients before it."""
    left = {u: home.count(u) for u in set(home)}
    begun: set[str] = set()
    previous_ready = 0.0
    for i in prof.order:
        u = home[i]
        begins = u != ROOT and u not in begun
        begun.add(u)
        left[u] -= 1
        yield i, u, begins, not left[u], previous_ready
        previous_ready = max(previous_ready, prof.ready_s[i])


def zero3_step(prof: Profile, allgather: Cost, reduce_scatter: Cost, *, prefetch: bool = True,
               separate: bool = False, reshard_root: bool = True) -> ShardedStep:
    """Predicted step of ZeRO-3 on ``prof`` (module docstring); ``allgather(bytes)`` and
    ``reduce_scatter(bytes)`` -> seconds of one collective of a unit's bytes;
    ``reshard_root``: the root is freed after forward and gathered again for backward."""
    home, size, forward = _units(prof)
    ag = _Engine()
    rs = _Engine() if separate else ag
    gathers = _Gathers(ag, size, allgather)
    forward_stall = _forward(gathers, forward, prefetch)
    # backward
    t0 = prof.forward_s + forward_stall
    back = gathers.ensure(ROOT, t0) if reshard_root else 0.0
    reverse = [u.name for u in reversed(forward)]
    if prefetch and reverse:
        gathers.start(reverse[0], t0 + back)
    for i, u, begins, ends, previous_ready in _backward(prof, home):
        if begins:
            t = t0 + previous_ready + back
            back += gathers.ensure(u, t)
            k = reverse.index(u)
            if prefetch and k + 1 < len(reverse):
                gathers.start(reverse[k + 1], t0 + previous_ready + back)
        if ends:
            rs.submit(t0 + prof.ready_s[i] + back, reduce_scatter(size[u]))
    end_backward = t0 + prof.backward_s + back
    last = max([*ag.ends, *rs.ends], default=end_backward)
    tail = max(0.0, last - end_backward)
    busy = ag.busy_s + (rs.busy_s if separate else 0.0)
    return ShardedStep(prof.compute_s, forward_stall + back + tail, busy, len(size),
                       forward_stall, back, tail)


def fsdp_step(prof: Profile, allgather: Cost, reduce_scatter: Cost) -> ShardedStep:
    """Predicted step of the FSDP2 peer (``--strategy fsdp``, commbench/strategies/fsdp.py)
    on Gloo under the replay: one thread issues its collectives, in its order, on one
    group.

    Forward is ZeRO-3's with prefetch (the peer's explicit forward prefetch; the root
    gathered first). Backward is the host's: FSDP2 keeps the root gathered; at backward's
    start and at each unit's backward it gathers the next unit in backward's order,
    *blocking* (its implicit prefetch: CPU streams are no-ops); as a unit's last gradient
    is in it reduce-scatters the unit's gradients, also blocking, but that holds the host
    only: the replay's device computes on (a gradient is due at its time moved by the
    waits). A unit's computation begins no earlier than its gather's end
    (``Workload.blocked``), which the host, behind the device, may have asked for late. The
    root's reduce-scatter is last. Exposed sync = the stalls + what the host runs past the
    device's end of backward."""
    home, size, forward = _units(prof)
    engine = _Engine()
    gathers = _Gathers(engine, size, allgather)
    forward_stall = _forward(gathers, forward, True)
    t0 = prof.forward_s + forward_stall
    reverse = [u.name for u in reversed(forward)]
    back = 0.0  # how far backward's schedule moved
    host = t0
    arrived: dict[str, float] = {}

    def gather(u: str) -> None:
        nonlocal host
        host = arrived[u] = engine.submit(host, allgather(size[u]))

    if reverse:
        gather(reverse[0])  # the root's pre-backward prefetches backward's first unit
    for i, u, begins, ends, previous_ready in _backward(prof, home):
        if begins:
            device = t0 + previous_ready + back
            back += max(0.0, arrived[u] - device)
            host = max(host, device)  # its output's gradient is in
            k = reverse.index(u)
            if k + 1 < len(reverse):
                gather(reverse[k + 1])
        host = max(host, t0 + prof.ready_s[i] + back)
        if ends and u != ROOT:
            host = engine.submit(host, reduce_scatter(size[u]))
    end_backward = t0 + prof.backward_s + back
    host = max(host, end_backward)
    if ROOT in size:
        host = engine.submit(host, reduce_scatter(size[ROOT]))
    tail = host - end_backward
    return ShardedStep(prof.compute_s, forward_stall + back + tail, engine.busy_s, len(size),
                       forward_stall, back, tail)


def _check_contiguous(prof: Profile, home: Sequence[str], units: set[str]) -> None:
    """ModelError where backward's order interleaves two units' gradients (the replay then
    runs the chain in the root: no per-unit schedule to predict)."""
    seen: list[str] = []
    for i in prof.order:
        u = home[i]
        if u in units and (not seen or seen[-1] != u):
            if u in seen:
                raise ModelError(f"profile {prof.name}: backward interleaves unit {u}'s "
                                 "gradients with another unit's")
            seen.append(u)


#: zero3's ``knobs.algo`` -> the engine path whose all-reduce model prices it (``hier``: the
#: topology-aware forms, half the two-level all-reduce each)
ALGO_PATH = {"native": "thread", "ring": "ring", "hier": "hier"}


def measured_costs(rec: dict, kept: float = 0.0) -> tuple[Cost, Cost] | None:
    """The run's own seconds per byte of each kind, from its median step's time in each
    (``comm_phases_s``: two all-gathers, less ``kept`` bytes (a root kept gathered from
    forward to backward), and one reduce-scatter of the gradient's bytes a step):
    ``(allgather, reduce_scatter)``; None where the record lacks them."""
    phases = rec.get("comm_phases_s") or {}
    psi = num(rec.get("grad_bytes"))
    ag, rs = num(phases.get("allgather")), num(phases.get("reduce_scatter"))
    if not (psi > 0 and ag > 0 and rs > 0):
        return None
    return (lambda n: n * ag / (2 * psi - kept)), (lambda n: n * rs / psi)


def _predict(r: dict, prof: Profile, ag: Cost, rs: Cost) -> ShardedStep:
    """The run's strategy on ``prof``: zero3 with its recorded settings, or the peer."""
    if r.get("strategy") == "fsdp":
        return fsdp_step(prof, ag, rs)
    knobs = r.get("knobs") or {}
    return zero3_step(prof, ag, rs, prefetch=knobs.get("prefetch", "on") == "on",
                      separate=knobs.get("reduce_scatter_group") == "separate",
                      reshard_root=knobs.get("reshard_root", "on") == "on")


def _kept(r: dict, prof: Profile) -> float:
    """The bytes the run keeps gathered from forward to backward: the root's, for the peer
    and for zero3 with ``--reshard-root off``."""
    if r.get("strategy") != "fsdp" and (r.get("knobs") or {}).get("reshard_root",
                                                                  "on") == "on":
        return 0.0
    _, size, _ = _units(prof)
    return size.get(ROOT, 0.0)


def check_runs(records: Sequence[dict], params: Params, base: Path | None = None,
               pricing: str = "measured") -> tuple[list[OverlapCheck], list[str]]:
    """Each zero3 summary with a compute profile that times units, predicted
    (``zero3_step``, its prefetch, reduce-scatter group and root as recorded), and each
    summary of the FSDP2 peer (``fsdp_step``), compared with what it measured; and why each
    other such summary was left out. ``pricing``:
    ``measured`` prices each collective at the run's own seconds per byte of its kind
    (``measured_costs``: the schedule alone is checked; the backend's reduce-scatter may
    cost more than its bytes, as Gloo's does), falling back to ``fit`` where the record
    lacks them; ``fit``: half the fitted model's all-reduce on its path (``analysis.overlap
    .path_cost``; the inter-node beta as ``run_params`` picks it). The compute is the run's
    measured ``compute_s``."""
    checks, skipped = [], []
    fit_links = fitted_links(records)
    for r in records:
        if r.get("kind") != "summary" or r.get("strategy") not in ("zero3", "fsdp"):
            continue
        rid = str(r.get("run_id"))
        knobs = r.get("knobs") or {}
        path = ALGO_PATH.get(str(knobs.get("algo") or "native"))
        why = left_out(r, base, None if path is not None
                       else f"no model of algorithm {knobs.get('algo')}")
        if why:
            skipped.append(f"{rid}: {why}")
            continue
        prof = run_profile(r, base)
        p = run_params(r, params, fit_links)
        ranks, nodes, local = run_layout(r)
        if nodes > 1 and math.isnan(p.beta_inter):
            skipped.append(f"{rid}: multi-node without a fitted or measured link")
            continue
        allreduce = path_cost(path, ranks, p, nodes, local)

        def half(n: float, allreduce: Cost = allreduce) -> float:
            return allreduce(n) / 2

        try:
            costs = measured_costs(r, _kept(r, prof)) if pricing == "measured" else None
            ag, rs = costs or (half, half)
            st = _predict(r, prof, ag, rs)
        except ModelError as e:
            skipped.append(f"{rid}: {e}")
            continue
        checks.append(checked(rid, r, st))
    return checks, skipped


CHECK_HEAD = ("# overlap model vs measured zero3 and FSDP2-peer runs (fsdp_step): inputs "
              "per run are its compute profile x compute_scale (forward units, ready "
              "times), its prefetch, reduce-scatter group and root resharding, its "
              "measured compute_s, and each collective kind's seconds per byte as the run "
              "measured them (comm_phases_s: the schedule is what is checked; where a run "
              "lacks them, half the fitted alpha-beta-gamma model's all-reduce on its "
              "path); exposed sync = the stalls for gathers + the tail past backward; a "
              "separate reduce-scatter group's two engines share the link, which the model "
              "does not price (analysis/sharded.py)")


def zero3_lines(records: Sequence[dict], params: Params | None) -> list[str]:
    """The report's lines: each zero3 run predicted against measured, the medians against
    the overlap model's goal (``analysis.overlap.GOAL``)."""
    checks, skipped = check_runs(records, params if params is not None else Params())
    return check_lines(checks, skipped, CHECK_HEAD, "zero3 and fsdp runs")


#: the strategies the report's comparison sets side by side (the peers beside the family)
COMPARED = ("ddp", "flat", "bucketed", "zero1", "zero2", "zero3", "fsdp", "hsdp")


def _setup(r: dict) -> tuple:
    """What runs must share to be compared: the model and its compute, the layout, the
    link, the dilation and the launcher (a missing number: 0, so that keys compare)."""
    def n(name: str, default: float = 0.0) -> float:
        x = num(get(r, name))
        return default if math.isnan(x) else x

    return (str(get(r, "model")), str(Path(str(get(r, "compute_profile") or "")).name),
            n("compute_scale", 1.0), n("compute_ms"), int(n("world_size")),
            max(1, int(n("nodes"))), n("link_gbps"), n("dilation", 1.0) or 1.0,
            str(get(r, "launcher")))


def _label(r: dict) -> str:
    """A run's row: its strategy, and for zero3 its prefetch, reduce-scatter group and
    whether the root stays gathered from forward to backward."""
    name = str(r["strategy"])
    if name != "zero3":
        return name
    knobs = r.get("knobs") or {}
    group = "separate" if knobs.get("reduce_scatter_group") == "separate" else "shared"
    kept = " root-kept" if knobs.get("reshard_root") == "off" else ""
    return f"zero3 {'prefetch' if knobs.get('prefetch', 'on') == 'on' else 'no-prefetch'} " \
        f"{group}{kept}"


def comparison_lines(records: Sequence[dict]) -> list[str]:
    """Per set-up where the folder ran a sharded strategy beside another of ``COMPARED``:
    each strategy's medians over its runs (step, exposed sync, sync share, model-state
    peak and the RSS high-water mark, MB), fastest first."""
    sets: dict[tuple, dict[str, list[dict]]] = {}
    for r in records:
        if r.get("kind") == "summary" and r.get("strategy") in COMPARED:
            sets.setdefault(_setup(r), {}).setdefault(_label(r), []).append(r)
    out = []
    for key, by in sets.items():
        if len(by) < 2 or not {b.split()[0] for b in by} & {"zero1", "zero2", "zero3", "hsdp",
                                                             "fsdp"}:
            continue
        model, prof, scale, ms, ranks, nodes, link, k, launcher = key
        what = f"{prof} x {scale:g}" if prof else f"{ms:g} ms"
        out += [f"# {model} ({what}) on {ranks} ranks, {nodes} node(s), "
                f"{link:.3g} Gbit/s, K = {k:g}, {launcher}: medians over runs",
                f"{'strategy':25s} {'runs':>4s} {'step ms':>9s} {'exposed ms':>10s} "
                f"{'sync share':>10s} {'state MB':>9s} {'RSS MB':>8s}"]
        rows = []
        for name, runs in by.items():
            med = [float(np.median([x for x in (f(r) for r in runs) if not math.isnan(x)]
                                   or [math.nan]))
                   for f in (lambda r: stat(r, "step_s"), lambda r: stat(r, "exposed_sync_s"),
                             lambda r: num(r.get("model_state_bytes_peak")) / 1e6,
                             lambda r: num(r.get("peak_rss_mb")))]
            rows.append((name, len(runs), *med))
        for name, n, step, exposed, state, rss in sorted(rows, key=lambda row: row[2]):
            share = exposed / step if step > 0 else math.nan
            out.append(f"{name:25s} {n:4d} {step * 1e3:9.1f} {exposed * 1e3:10.1f} "
                       f"{share:10.1%} {state:9.1f} {rss:8.1f}")
        out.append("")
    return out


def memory_lines(records: Sequence[dict]) -> list[str]:
    """Each zero3 run's model-state peak (``model_state_bytes_peak``: the largest over its
    steps and ranks) against the issue's bound without communication buffers, the shards
    plus 2 x the largest unit's parameters plus its gradients (``knobs.model_state_bytes``),
    and what the rest is in units: the root's parameters and gradient buffer (whole
    through backward) and the largest unit's (a reduce-scatter's buffer in flight)."""
    out = []
    for r in records:
        if r.get("kind") != "summary" or r.get("strategy") != "zero3":
            continue
        terms = (r.get("knobs") or {}).get("model_state_bytes") or {}
        peak, shards = num(r.get("model_state_bytes_peak")), num(terms.get("shard_bytes"))
        largest, root = num(terms.get("largest_unit_bytes")), num(terms.get("root_unit_bytes"))
        if any(math.isnan(x) for x in (peak, shards, largest, root)) or largest <= 0:
            continue  # written before the gradients were sharded at rest
        bound = shards + 3 * largest
        over = peak - bound
        words = "within" if over <= 0 else (
            f"{over / 1e6:.1f} MB over: {over / largest:.2f} x the largest unit, "
            f"{'within' if over <= 2 * root + largest else 'beyond'} the root's parameters "
            "and gradients + one reduce-scatter buffer")
        out.append(f"{str(r.get('run_id'))[:24]:24s} peak {peak / 1e6:8.1f} MB, shards "
                   f"{shards / 1e6:6.1f}, largest unit {largest / 1e6:5.1f}, root "
                   f"{root / 1e6:5.1f}; bound shards + 3 x largest = {bound / 1e6:8.1f} MB: "
                   f"{words}; RSS {num(r.get('peak_rss_mb')):.0f} MB")
    if out:
        out.insert(0, "# zero3 model-state memory per rank (counted from the strategy's live "
                      "tensors; peak over steps and ranks) against (P + G + O)/n + 2 x the "
                      "largest unit's parameters + its gradients, before communication "
                      "buffers")
    return out
