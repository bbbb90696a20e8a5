"""Node-link bytes per step of the sharded strategies against DDP, read on the link counters.

The bytes a sync scheme puts through a node's link are fixed by arithmetic
(issue "sharded data parallel"; ZeRO paper §7). With Ψ gradient bytes on N
nodes x L ranks, node-ordered, n = NL, per direction through one node's link:

| operation | ring | topology-aware | pairwise |
|---|---|---|---|
| all-reduce | 2Ψ(n−1)/n | 2Ψ(N−1)/N | 2LΨ(N−1)/N |
| reduce-scatter, all-gather (each) | Ψ(n−1)/n | Ψ(N−1)/N | LΨ(N−1)/N |

So DDP, ZeRO-1 and ZeRO-2 move one all-reduce's worth (a reduce-scatter plus an
all-gather), ZeRO-3 one and a half (its parameters gathered again in backward),
and HSDP (reduce-scatter inside the node, each shard all-reduced across nodes,
all-gathered inside) the topology-aware all-reduce's.

One job (``--launcher``, default ``mpirun``) replays a committed profile's
gradient (``--model``, default ResNet-50's 102 MB) on an emulated cluster
(``--layout``, default 2x4, at ``--rate``, default 1 Gbit/s) with every strategy
the tool has of: flat (``--algo ring,native,hier``), ``ddp`` (PyTorch DDP on
Gloo: a second ring), ``zero1``, ``zero2``, and ``zero3`` and ``hsdp`` where
registered. Each step's ``link_bytes`` is what the node's interface counted over
that step (``commbench.steploop``: the larger of received and sent, by the node's
first rank; the largest node's), so every byte on the wire is in it: TCP/IP
framing, the acknowledgements of the other direction, and the job's own side
traffic in the step. The table prints, per run:

- measured MB per step (median over the measured steps, with the range);
- that over the framing factor (the link test's interface rate ÷ its payload
  rate, ``link_wire_gbps / link_gbps``): the payload the counter saw;
- the table's value in each column, in units of Ψ, and the column nearest the
  measurement; for a scheme whose form is fixed (the project's ring and hier,
  DDP's Gloo ring, HSDP) the ratio to its own column; for the library's own
  choice (Open MPI native, the backend's reduce-scatter and all-gather under
  zero1/zero2) the column it matched within 5 % is a reading of what the library
  did, or ``none``: on Open MPI 4.1, 2x4, ResNet-50, flat native read 1.00Ψ
  (topology-aware) and zero1/zero2's ``MPI_Reduce_scatter`` plus
  ``MPI_Allgatherv`` 3.50Ψ, twice the ring's 1.75Ψ and in no column;
- the ratio to DDP's and to the project's ring's measured bytes (the goals:
  ZeRO-1 and ZeRO-2 ÷ DDP = 1.00 ± 0.03, ZeRO-3 1.50 ± 0.03, HSDP ÷ hier 1.00).

Bytes do not depend on the dilation, so the default is K = 1 (``--dilation``
takes a K, as the other benchmarks do); each step is one synchronous exchange,
so nothing of one step falls in the next one's window.

Run it from the repository root, as root::

    python -m benchmarks.shard_bytes                 # ResNet-50 2x4 at 1 Gbit/s
    python -m benchmarks.shard_bytes --model resnet18 --layout 2x2 --dry-run
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from commbench.strategies import STRATEGIES
from commbench.tables import Column, format_table
from experiments.bench import (
    Benchmark,
    add_output_flags,
    names_arg,
    parse_layout,
    parser,
    records,
)
from experiments.job import Job
from experiments.replay import replay_config
from experiments.runner import Runner
from launch.commands import LAUNCHERS

ROOT = Path(__file__).resolve().parent.parent
JOB_TIMEOUT_S = 900.0
#: each model's committed profile and the batch it was recorded at
PROFILES = {"resnet18": ("profiles/h200-resnet18-b64.json", 64),
            "resnet50": ("profiles/h200-resnet50-b256.json", 256),
            "resnet101": ("profiles/h200-resnet101-b64.json", 64),
            "gpt-tiny": ("profiles/cpu-gpt-tiny-b32.json", 32)}
FORMS = ("ring", "topology", "pairwise")
#: the sharded strategies, where registered, and the reference ones
SHARDED = ("zero1", "zero2", "zero3", "hsdp")
FLAT_ALGOS = ("ring", "native", "hier")
#: the strategies whose rows are one per --algo (the zeros': native, ring and hier)
ALGO_STRATEGIES = ("flat", "zero1", "zero2", "zero3")
#: a library's own choice is read as a column of the table only within this share of it
READ_TOLERANCE = 0.05


@dataclass(frozen=True)
class Scheme:
    """What one run's strategy moves through a node link, in all-reduces' worth (``ops``:
    2 = a reduce-scatter and an all-gather, 3 = ZeRO-3's extra gather) and the form it takes
    (None: the library's own choice, read from the measurement)."""

    ops: int
    form: str | None


def scheme(strategy: str, algo: str | None) -> Scheme:
    # the project's ring or topology-aware forms; else the backend's: its choice
    form = {"ring": "ring", "hier": "topology"}.get(algo or "")
    if strategy == "flat":
        return Scheme(2, form)
    return {"ddp": Scheme(2, "ring"),  # Gloo's ring all-reduce
            "zero1": Scheme(2, form), "zero2": Scheme(2, form),  # a RS and an AG
            "zero3": Scheme(3, form),
            "hsdp": Scheme(2, "topology")}[strategy]


def per_psi(form: str, ops: int, nodes: int, local: int) -> float:
    """The table's bytes through one node's link, one direction, in units of Ψ, for ``ops``
    half-all-reduces (reduce-scatters or all-gathers) of the gradient."""
    n = nodes * local
    one = {"ring": (n - 1) / n, "topology": (nodes - 1) / nodes,
           "pairwise": local * (nodes - 1) / nodes}[form]
    return ops * one


def expected_bytes(form: str, ops: int, psi: float, nodes: int, local: int) -> float:
    return per_psi(form, ops, nodes, local) * psi


def nearest_form(measured: float, ops: int, psi: float, nodes: int, local: int) -> str:
    """The table's column closest to ``measured`` (by ratio)."""
    return min(FORMS, key=lambda f: abs(measured / expected_bytes(f, ops, psi, nodes, local)
                                        - 1))


def framing(rec: dict) -> float:
    """The link test's interface bytes per payload byte (1 where it was not measured)."""
    wire, pay = rec.get("link_wire_gbps"), rec.get("link_gbps")
    return wire / pay if wire and pay else 1.0


def step_link_bytes(rec: dict, steps: list[dict]) -> list[float]:
    """The measured steps' link bytes of run ``rec`` (its step records)."""
    return [s["link_bytes"] for s in steps if s.get("run_id") == rec.get("run_id")
            and not s.get("warmup") and s.get("link_bytes") is not None]


def build_parser() -> argparse.ArgumentParser:
    p = parser("benchmarks.shard_bytes", __doc__)
    p.add_argument("--model", choices=tuple(PROFILES), default="resnet50",
                   help="the gradient replayed: a committed profile's model")
    p.add_argument("--layout", type=parse_layout, default=(2, 4), help="NODESxRANKS")
    p.add_argument("--rate", default="1gbit", help="the node links' rate (tc's notation)")
    p.add_argument("--launcher", choices=LAUNCHERS, default="mpirun",
                   help="mpirun: the mpi backend (zero's collectives are Open MPI's) with "
                        "DDP on Gloo beside; torchrun: the torch backend on Gloo")
    p.add_argument("--algos", type=names_arg(FLAT_ALGOS, "algorithm"), default=FLAT_ALGOS,
                   help="the algorithms each strategy that takes --algo runs, of "
                        f"{','.join(FLAT_ALGOS)} (default all; fewer runs make the job "
                        "shorter and its ranks' memory smaller)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    add_output_flags(p, "shard-bytes")
    p.set_defaults(dilation=1.0)
    return p


def strategies() -> list[str]:
    return ["flat", "ddp", *(s for s in SHARDED if s in STRATEGIES)]


def plan(args: argparse.Namespace) -> list[Job]:
    path, batch = PROFILES[args.model]
    nodes, slots = args.layout
    cfg = replay_config(args.model, ROOT / path, batch, 1.0, args.steps, args.warmup,
                        strategies(), algos=tuple(args.algos))
    name = f"{args.model}-{nodes}x{slots}-{args.launcher}"
    return [Job.place(name, cfg, nodes, slots, args.rate, launcher=args.launcher,
                      timeout_s=JOB_TIMEOUT_S, sets={name})]


TABLE = [Column("strategy", "", 9), Column("algo", "", 7), Column("MB/step", "", 8, ".2f"),
         Column("range", "", 13), Column("payload", "MB", 8, ".2f"),
         Column("payload", "Ψ", 7, ".3f"), Column("ring", "Ψ", 6, ".3f"),
         Column("topo", "Ψ", 6, ".3f"), Column("pairw", "Ψ", 6, ".3f"),
         Column("form", "", 9), Column("÷ form", "", 7, ".3f"),
         Column("÷ DDP", "", 7, ".3f"), Column("÷ ring", "", 7, ".3f"),
         Column("÷ hier", "", 7, ".3f"),
         Column("#wrong", "", 6)]


def rows_of(summaries: list[dict], steps: list[dict], nodes: int, local: int
            ) -> tuple[list[list], dict[str, float]]:
    """The table's rows, and each run's payload bytes per step by ``strategy algo``."""
    payload: dict[str, float] = {}
    info = []
    for s in summaries:
        vals = step_link_bytes(s, steps)
        if not vals:
            continue
        med = statistics.median(vals)
        algo = s.get("algo") if s["strategy"] in ALGO_STRATEGIES else None
        key = f"{s['strategy']} {algo or ''}".strip()
        payload[key] = med / framing(s)
        info.append((s, key, algo, min(vals), max(vals), med))
    rows = []
    for s, key, algo, lo, hi, med in info:
        psi = float(s["grad_bytes"])
        sch = scheme(s["strategy"], algo)
        pay = payload[key]
        form = sch.form or nearest_form(pay, sch.ops, psi, nodes, local)
        cols = [per_psi(f, sch.ops, nodes, local) for f in FORMS]
        ddp, ring, hier = payload.get("ddp"), payload.get("flat ring"), payload.get("flat hier")
        vs_form = pay / expected_bytes(form, sch.ops, psi, nodes, local)
        if sch.form:
            reading = form
        elif abs(vs_form - 1) <= READ_TOLERANCE:
            reading = f"{form}?"
        else:  # a library's own choice that moves none of the table's bytes
            reading = "none"
        rows.append([s["strategy"], algo or "-", med / 1e6, f"{lo / 1e6:.1f}-{hi / 1e6:.1f}",
                     pay / 1e6, pay / psi, *cols, reading, vs_form,
                     pay / ddp if ddp else None, pay / ring if ring else None,
                     pay / hier if hier else None,
                     s.get("wrong")])
    return rows, payload


def check(args: argparse.Namespace, jobs: list[Job], runner: Runner) -> int:
    nodes, slots = args.layout
    out = runner.outputs(jobs[0])[0]
    summaries = records(out, "summary")
    steps = records(out, "step")
    if not summaries:
        print(f"shard_bytes: no summary records in {out}", file=sys.stderr)
        return 1
    rows, _ = rows_of(summaries, steps, nodes, slots)
    first = summaries[0]
    psi = float(first["grad_bytes"])
    print(format_table(TABLE, rows, title=(
        f"shard_bytes  {args.model} {nodes}x{slots}  Ψ = {psi / 1e6:.2f} MB  "
        f"link {first.get('link_gbps') or 'not measured'} Gbit/s payload, framing x "
        f"{framing(first):.4f}  K = {first.get('dilation', 1)}"),
        footer=["MB/step: the node interface's bytes per measured step (median; range); "
                "payload: over the framing factor; ring/topo/pairw: the table's bytes in Ψ",
                "form: the scheme's own column; 'X?': the column a library's own choice "
                f"matched within {READ_TOLERANCE:.0%} (a reading, not an expectation); 'none': "
                "it matched no column (÷ form is against the nearest)",
                "goals: ring forms: zero1, zero2 ÷ DDP 1.00 ± 0.03, zero3 ÷ DDP 1.50 ± 0.03; "
                "topology-aware forms (--algo hier) ÷ flat hier: the same; "
                "hsdp ÷ flat hier 1.00 ± 0.03",
                f"records: {out}"]))
    return 0


BENCHMARK = Benchmark("shard-bytes", build_parser, plan, check)
main = BENCHMARK.main


if __name__ == "__main__":
    sys.exit(main())
