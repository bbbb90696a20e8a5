"""GPU check: what commbench does on one CUDA device, in one command, within 5 minutes.

    python -m benchmarks.gpu_check                 # a lent H200: ~3 min after torch's start-up
    python -m benchmarks.gpu_check -o results/gpu  # keep every job's records there
    python -m benchmarks.gpu_check --plan          # the checks' command lines; runs nothing

Run it from the repository root on a machine with an NVIDIA GPU and a CUDA build of
torch 2.11 or later (nothing here, nor on the paths it runs, needs a newer torch API).
Open MPI, Horovod and network namespaces are not needed: a check that needs what the
machine lacks is skipped, saying so. It prints the environment first (Python, torch,
CUDA, cuDNN and NCCL versions, the GPUs, numpy, mpi4py and Horovod, which launchers
exist), then one line per check: ``OK``, ``FAIL`` and the cause, or ``SKIP`` and the
reason. Exit 1 if any check failed (a wrong element always fails its check), 0
otherwise; 2 without a CUDA device or where the tools do not import (every one imports
numpy, which torch does not need), starting nothing.

1. **nccl** — ``torchrun`` with one rank per GPU (at most 2; NCCL refuses two ranks on
   one device, so one rank on a one-GPU machine) trains ResNet-18 (batch 64, 224 px) on
   the torch backend with NCCL, flat and bucketed: ``#wrong`` 0, gradients reduced where
   they live (``staging`` none), ``torch-nccl`` with NCCL's version in the records, peak
   CUDA memory, equal parameter checksums on every rank.
2. **sync-off** — the reference of the next check: the same two-rank job (two ranks under
   ``torchrun`` sharing GPU 0, ResNet-50, batch ``GLOO_BATCH``, 224 px) with no gradient
   sync at all: the tool's own run sequence (``commbench.lifecycle.run_job``) and step
   loop (``commbench.steploop.run_steps``) with a strategy whose ``finish`` does nothing
   (``--sync-off-rank``, this module's rank program). Two ranks on one GPU share its SMs,
   so a one-rank run would not be the reference.
3. **gloo** — those two ranks on Gloo, gradients staged through pinned host memory:
   bucketed, async (staleness 1) and DDP (Gloo's own staging of its CUDA buckets), model
   buffers local. Each run: ``#wrong`` 0; exposed sync < comm where the compute that can
   hide the transfer (backward for bucketed and DDP, the whole step's compute for async,
   whose transfer runs under the next step) is at least as long as comm (a run where it is
   shorter is reported, not judged); compute within 5 % of the reference's (``sync-off``).
   The line states each run's overlap (1 - exposed sync / comm).
4. **device-bench** — ``commbench.microbench --device cuda`` on NCCL (a rank per GPU),
   8 B to 256 MiB by powers of 2, timed as nccl-tests times it: CUDA events around ``-n``
   back-to-back all-reduces on one stream (records say ``timer``
   ``cuda-events-back-to-back``), ``#wrong`` 0. Skipped where the microbenchmark has no
   such mode yet (its ``-z``/``--blocking`` per-call option comes with it).
5. **mpi** — ``mpirun -np 2``: the same training with MPI on host buffers (gradients fused
   on the device and staged through pinned host memory), flat and bucketed; skipped
   without ``mpirun``.
6. **profile** — ``commbench.profile --device cuda`` records ResNet-18 at batch 64, 224 px,
   the procedure that made ``profiles/h200-*.json`` (``profiles/README.md``), and sets its
   forward and backward beside the shipped H200 profile's (a ratio, printed, not a pass
   mark: another GPU may be slower); it must time forward unit by unit (``forward_units``),
   which the shipped profiles, recorded before, do not.

The whole run has a budget (``--budget-s``, default 300 s): each check runs under the
smaller of its own limit and what is left, a check that runs over FAILs as timed out,
and one that would start with less than ``MIN_START_S`` left is skipped. The checks run
in the order above, the issue's first.

Not verified by this check (nor anywhere yet): NCCL between ranks on two GPUs and across
nodes (hierarchical on NCCL among them), Horovod built with NCCL, CUDA-aware MPI.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from launch import commands
from launch.execute import run

ROOT = Path(__file__).resolve().parents[1]
PROG = "benchmarks.gpu_check"
MODEL, BATCH, IMAGE = "resnet18", 64, 224  # as profiles/h200-resnet18-b64.json
SHIPPED = ROOT / "profiles" / f"h200-{MODEL}-b{BATCH}.json"
#: the two-rank Gloo job's model and batch: ResNet-50's 98 MiB gradient through Gloo on the
#: host takes tens of ms; a batch of 128 at 224 px gives backward as long or longer when two
#: ranks share one GPU (~24 GiB a rank of the H200's 141)
GLOO_MODEL, GLOO_BATCH = "resnet50", 128
#: the compute of each Gloo run against the reference (sync off): within this fraction
COMPUTE_TOLERANCE = 0.05
#: the device microbenchmark's sizes, 8 B to 256 MiB
BENCH_MIN, BENCH_MAX = 8, 256 << 20
#: what the device microbenchmark's records say of how a call was timed
BACK_TO_BACK = "cuda-events-back-to-back"
#: the microbenchmark's flag that comes with its device timing (per call, as nccl-tests' -z)
DEVICE_TIMING_FLAG = "--blocking"
#: the whole run's budget (s), and the least a check must have left to start
BUDGET_S = 300.0
MIN_START_S = 20.0
STEPS, WARMUP = 10, 3


# -- the environment --------------------------------------------------------------------

def launchers() -> dict[str, str | None]:
    """Each launcher the checks could use: where it is, or None. torchrun is torch's own
    module (``python -m torch.distributed.run``), there wherever torch is."""
    import importlib.util

    run_module = importlib.util.find_spec("torch.distributed.run") is not None
    return {"torchrun": f"{sys.executable} -m torch.distributed.run" if run_module else None,
            "mpirun": shutil.which("mpirun"), "horovodrun": shutil.which("horovodrun")}


def _nccl_version() -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):  # a torch built without NCCL
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def tools_import() -> str:
    """Why the tools the checks run cannot be imported here (empty: they can). Every one
    imports numpy, for instance (``commbench.comm.mpi``), which torch does not need."""
    try:
        import commbench.allreduce  # noqa: F401 - what each job's ranks import first
        import commbench.microbench  # noqa: F401
    except ImportError as e:
        return f"the tools do not import here ({e}): install what it names"
    return ""


def _version(module: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def environment(found: dict[str, str | None]) -> list[str]:
    """The lines that say what this machine is, before any check."""
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    gpus = [f"GPU {i}: {torch.cuda.get_device_name(i)} "
            f"({torch.cuda.get_device_properties(i).total_memory / 2**30:.1f} GiB)"
            for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return [f"python {platform.python_version()}, torch {torch.__version__}, "
            f"CUDA {torch.version.cuda or 'none'}, cuDNN {cudnn or 'none'}, "
            f"NCCL {_nccl_version() or 'none'}",
            *(gpus or ["no CUDA device"]),
            f"numpy {_version('numpy')}, mpi4py {_version('mpi4py')}, "
            f"horovod {_version('horovod')}",
            "launchers: " + ", ".join(f"{name} {where or 'not found'}"
                                      for name, where in found.items())]


# -- verdicts on the records -------------------------------------------------------------

OK, FAIL, SKIP = "OK", "FAIL", "SKIP"


@dataclass
class Verdict:
    status: str  # OK, FAIL or SKIP
    text: str


def _records(path: Path, kind: str) -> list[dict]:
    """The records of ``kind`` in the JSON Lines file at ``path`` (none where it is
    missing; a line cut short by a job that was ended is left out)."""
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("kind") == kind:
            out.append(rec)
    return out


def _ms(s: float | None) -> str:
    return "n/a" if s is None else f"{s * 1e3:.1f} ms"


def job_problems(s: dict, nccl: bool = False) -> list[str]:
    """What is wrong with one summary of a GPU training job (empty: nothing)."""
    knobs = s.get("knobs") or {}
    problems = [why for why, bad in [
        (f"#wrong {s.get('wrong')}", s.get("wrong") != 0),
        (f"device {s.get('device')}", not str(s.get("device", "")).startswith("cuda")),
        ("no peak_cuda_mb", s.get("peak_cuda_mb") is None),
        ("ranks' parameters differ", len(set(s.get("param_checksum_ranks") or [None])) != 1)]
        if bad]
    if nccl:  # the torch backend on NCCL: device tensors, no staging through the host
        problems += [why for why, bad in [
            (f"backend {s.get('backend')}", s.get("backend") != "torch-nccl"),
            ("no NCCL version", not (s.get("versions") or {}).get("nccl")),
            (f"staged through {knobs.get('staging')}", knobs.get("staging") is not None)]
            if bad]
    return problems


def judge_job(summaries: list[dict], nccl: bool = False) -> Verdict:
    """Every run of a training job right, on the device (``job_problems``)."""
    if not summaries:
        return Verdict(FAIL, "no summaries written")
    problems = [f"{s['strategy']}: {why}" for s in summaries for why in job_problems(s, nccl)]
    if problems:
        return Verdict(FAIL, "; ".join(problems))
    return Verdict(OK, ", ".join(
        f"{s['strategy']} step {_ms(s.get('step_s'))}, exposed sync "
        f"{_ms(s.get('exposed_sync_s'))}, peak {s['peak_cuda_mb']:.0f} MiB" for s in summaries))


#: what can hide each strategy's transfer: bucketed's and DDP's buckets run under the rest
#: of backward, async's (staleness 1) under the next step's whole compute
HIDDEN_BY = {"bucketed": "backward_s", "ddp": "backward_s", "async": "compute_s"}


def overlap_problems(s: dict) -> tuple[list[str], str]:
    """(what is wrong, what was seen) of one Gloo run's overlap: exposed sync < comm
    where the compute that can hide the transfer (``HIDDEN_BY``) is at least comm."""
    comm, exposed = s.get("comm_s"), s.get("exposed_sync_s")
    hide = s.get(HIDDEN_BY.get(s["strategy"], "backward_s"))
    if not comm or exposed is None or hide is None:
        return [f"{s['strategy']}: no comm time or exposed sync recorded"], ""
    seen = (f"{s['strategy']} overlap {1 - exposed / comm:.2f} (exposed {_ms(exposed)} "
            f"of comm {_ms(comm)})")
    if hide < comm:
        return [], seen + f", not judged: {HIDDEN_BY.get(s['strategy'], 'backward_s')[:-2]} " \
                          f"{_ms(hide)} < comm"
    if exposed >= comm:
        return [f"{s['strategy']}: exposed sync {_ms(exposed)} >= comm {_ms(comm)} though "
                f"{_ms(hide)} of compute could hide it"], seen
    return [], seen


def judge_gloo(summaries: list[dict], reference: dict | None,
               tolerance: float = COMPUTE_TOLERANCE) -> Verdict:
    """The two-rank Gloo runs: right (``job_problems``), overlapped where they can be
    (``overlap_problems``), and compute within ``tolerance`` of the reference's."""
    if not summaries:
        return Verdict(FAIL, "no summaries written")
    problems, seen = [], []
    ref = (reference or {}).get("compute_s")
    for s in summaries:
        problems += [f"{s['strategy']}: {why}" for why in job_problems(s)]
        if s["strategy"] == "bucketed" and not (s.get("knobs") or {}).get("staging"):
            problems.append("bucketed: gradients not staged through pinned host memory")
        bad, what = overlap_problems(s)
        problems += bad
        if ref and s.get("compute_s"):
            ratio = s["compute_s"] / ref
            what += f", compute x{ratio:.3f} of sync off"
            if abs(ratio - 1) > tolerance:
                problems.append(f"{s['strategy']}: compute {_ms(s['compute_s'])} is x{ratio:.3f}"
                                f" of the same job's with sync off ({_ms(ref)}), beyond "
                                f"{tolerance:.0%}")
        seen.append(what)
    if not ref:
        problems.append("no reference compute (the sync-off job failed)")
    if problems:
        return Verdict(FAIL, "; ".join(problems))
    return Verdict(OK, "; ".join(seen) + f"; sync off compute {_ms(ref)}")


def bench_sizes(lo: int = BENCH_MIN, hi: int = BENCH_MAX) -> list[int]:
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= 2
    return out


def judge_bench(rows: list[dict]) -> Verdict:
    """The device microbenchmark: every size from 8 B to 256 MiB, ``#wrong`` 0, each
    timed by CUDA events around back-to-back calls."""
    if not rows:
        return Verdict(FAIL, "no rows written")
    problems = []
    wrong = [(r["size"], r["wrong"]) for r in rows if r.get("wrong")]
    if wrong:
        problems.append(f"#wrong (size, count): {wrong}")
    missing = sorted(set(bench_sizes()) - {r["size"] for r in rows})
    if missing:
        problems.append(f"sizes missing: {missing}")
    timers = sorted({str(r.get("timer")) for r in rows})
    if timers != [BACK_TO_BACK]:
        problems.append(f"timed by {', '.join(timers)}, not {BACK_TO_BACK}")
    if problems:
        return Verdict(FAIL, "; ".join(problems))
    by = {r["size"]: r for r in rows}
    small, big = by[BENCH_MIN], by[BENCH_MAX]
    n = big["world_size"]
    bus = (f"busbw {big['busbw']:.1f} GB/s" if n > 1 else
           "no busbw: one rank (2(n-1)/n = 0; the time is NCCL's launch and in-place copy)")
    return Verdict(OK, f"{n} rank(s) on {big.get('device')}: 8 B {small['time_us']['avg']:.1f}"
                   f" us, 256 MiB {big['time_us']['avg']:.0f} us, algbw {big['algbw']:.1f} "
                   f"GB/s, {bus}, NCCL {(big.get('versions') or {}).get('nccl')}")


def judge_profile(path: Path) -> Verdict:
    """The recorded profile: loads for its model, ready times within backward, peak CUDA
    memory, units timed; its times set beside the shipped H200 profile's."""
    from commbench.profilefile import lacks
    from commbench.profilefile import read as read_profile
    from commbench.workloads import compute_profile

    try:
        prof = compute_profile.load(path, MODEL, 1000)
    except compute_profile.ProfileError as e:
        return Verdict(FAIL, str(e))
    problems = []
    if "peak_cuda_mb" not in prof:
        problems.append("no peak_cuda_mb")
    if not all(0 <= g["ready_s"] <= prof["backward_s"] * 1.01 for g in prof["grads"]):
        problems.append("gradient ready times outside backward")
    problems += lacks(prof)  # this commbench records all it reads
    if problems:
        return Verdict(FAIL, "; ".join(problems))
    shipped = read_profile(SHIPPED)
    return Verdict(OK, f"{prof['device']}: forward {_ms(prof['forward_s'])} "
                   f"(x{prof['forward_s'] / shipped.forward_s:.2f} of {SHIPPED.name}), "
                   f"backward {_ms(prof['backward_s'])} "
                   f"(x{prof['backward_s'] / shipped.backward_s:.2f}), "
                   f"peak {prof['peak_cuda_mb']:.0f} MiB "
                   f"(shipped {shipped.raw['peak_cuda_mb']:.0f}), "
                   f"forward in {len(prof['forward_units']) - 1} units and the root")


# -- the checks --------------------------------------------------------------------------

@dataclass
class Check:
    """One check: the command it runs (None: skipped, ``skip`` says why), the most it may
    take, what it writes (``output``) and how that is judged (``judge(check)``)."""

    name: str
    argv: list[str] | None
    limit_s: float
    judge: Callable[[Check], Verdict]
    output: Path | None = None
    skip: str = ""


def nccl_ranks(gpus: int) -> int:
    """Ranks of the NCCL checks: one per GPU, at most 2 (NCCL refuses two on one device)."""
    return max(1, min(2, gpus))


def has_device_timing() -> bool:
    """Whether ``commbench.microbench`` times device calls by events (its per-call option,
    ``DEVICE_TIMING_FLAG``, comes with that mode)."""
    from commbench import microbench

    help_text = microbench.build_parser().format_help()
    flag = rf"(?<![\w-]){re.escape(DEVICE_TIMING_FLAG)}(?![\w-])"
    return re.search(flag, help_text) is not None


def _train_args(model: str, batch: int, strategies: str, output: Path) -> list[str]:
    return ["--workload", "real", "--device", "cuda", "--model", model, "--batch-size",
            str(batch), "--image-size", str(IMAGE), "--strategy", strategies, "--steps",
            str(STEPS), "--warmup", str(WARMUP), "--quiet", "--output", str(output)]


def gloo_args(output: Path, strategies: str = "bucketed,async,ddp") -> list[str]:
    """``commbench.allreduce``'s arguments of the two-rank Gloo job (and of its reference,
    which takes them too: its ``--strategy`` is not run). Model buffers stay local: their
    broadcast would count as exposed sync and is no gradient's."""
    return [*_train_args(GLOO_MODEL, GLOO_BATCH, strategies, output), "--dist-backend",
            "gloo", "--buffers", "local",
            *(["--staleness", "1"] if "async" in strategies.split(",") else [])]


def plan(out: Path, gpus: int, found: dict[str, str | None],
         device_timing: bool) -> list[Check]:
    """Every check, in the order they run, with its command line (none where skipped)."""
    py = sys.executable
    allreduce = "commbench.allreduce"

    def torchrun(n: int, program: list[str]) -> list[str]:
        return commands.launcher_argv("torchrun", n, program)

    nccl_out = out / "gpu-nccl.jsonl"
    ref_out, gloo_out = out / "gpu-sync-off.json", out / "gpu-gloo.jsonl"
    bench_out, mpi_out = out / "gpu-device-bench.jsonl", out / "gpu-mpi.jsonl"
    profile_out = out / f"gpu-{MODEL}-b{BATCH}.json"
    no_torchrun = "" if found.get("torchrun") else "torch.distributed.run is not importable"
    checks = [
        Check("nccl", torchrun(nccl_ranks(gpus), commands.python_module(allreduce, [
            *_train_args(MODEL, BATCH, "flat,bucketed", nccl_out),
            "--dist-backend", "nccl", "--algo", "native"], py)), 90,
            lambda c: judge_job(_records(c.output, "summary"), nccl=True), nccl_out,
            skip=no_torchrun),
        Check("sync-off", torchrun(2, commands.python_module(PROG, [
            "--sync-off-rank", *gloo_args(ref_out, "flat")], py)), 90,
            lambda c: _judge_reference(c.output), ref_out, skip=no_torchrun),
        Check("gloo", torchrun(2, commands.python_module(allreduce, gloo_args(gloo_out), py)),
              150, lambda c: judge_gloo(_records(c.output, "summary"), _read_json(ref_out)),
              gloo_out, skip=no_torchrun),
        Check("device-bench", torchrun(nccl_ranks(gpus), commands.python_module(
            "commbench.microbench", [
                "--device", "cuda", "--dist-backend", "nccl", "-b", str(BENCH_MIN), "-e",
                str(BENCH_MAX), "-f", "2", "--algo", "native", "-n", "20", "-w", "5",
                "--quiet", "--output", str(bench_out)], py)), 90,
            lambda c: judge_bench(_records(c.output, "microbench")), bench_out,
            skip=no_torchrun or ("" if device_timing else
                                 f"commbench.microbench has no {DEVICE_TIMING_FLAG}: its "
                                 "device timing (events around back-to-back calls) is not in "
                                 "yet")),
        Check("mpi", commands.launcher_argv("mpirun", 2, commands.python_module(allreduce, [
            *_train_args(MODEL, BATCH, "flat,bucketed", mpi_out)], py)), 120,
            lambda c: judge_job(_records(c.output, "summary")), mpi_out,
            skip="" if found.get("mpirun") else "no mpirun here (Open MPI's runtime)"),
        Check("profile", commands.python_module("commbench.profile", [
            "--model", MODEL, "--batch-size", str(BATCH), "--image-size", str(IMAGE),
            "--device", "cuda", "--iters", "10", "--warmup", "3", "-o", str(profile_out)], py),
            60, lambda c: judge_profile(c.output), profile_out),
    ]
    for c in checks:
        if c.skip:
            c.argv = None
    return checks


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _judge_reference(path: Path) -> Verdict:
    ref = _read_json(path)
    if not ref or not ref.get("compute_s"):
        return Verdict(FAIL, f"no compute in {path}")
    return Verdict(OK, f"2 ranks sharing the GPU, no gradient sync: compute "
                   f"{_ms(ref['compute_s'])}, backward {_ms(ref.get('backward_s'))} "
                   f"(median of {ref.get('measured_steps')} steps)")


def run_check(c: Check, left_s: float) -> Verdict:
    """Run ``c`` within ``left_s`` of the budget and judge it."""
    if c.argv is None:
        return Verdict(SKIP, c.skip)
    if left_s < MIN_START_S:
        return Verdict(SKIP, f"{left_s:.0f} s of the budget left (--budget-s)")
    limit = min(c.limit_s, left_s)
    res = run(c.argv, timeout=limit, cwd=str(ROOT))
    if res.returncode != 0 or res.timed_out:
        # a wrong element exits 1 and still leaves its records: say what they say
        judged = None
        if c.output is not None and c.output.exists() and not res.timed_out:
            try:
                judged = c.judge(c)
            except (KeyError, TypeError, ValueError):  # records of a job that broke off
                judged = None
        why = (f"exited {res.returncode}" + (f" (timed out after {limit:.0f} s)"
                                              if res.timed_out else "")
               + f": {res.stderr.strip()[-600:]}")
        return Verdict(FAIL, (f"{judged.text}; " if judged else "") + why)
    return c.judge(c)


def say(status: str, name: str, text: str) -> None:
    print(f"{status:4s} {name:12s} {text}", flush=True)


def run_all(checks: Sequence[Check], budget_s: float) -> bool:
    """Run every check in order, each line as it ends; whether none failed."""
    t0 = time.monotonic()
    ok = True
    for c in checks:
        v = run_check(c, budget_s - (time.monotonic() - t0))
        say(v.status, c.name, v.text + (f" -> {c.output}" if c.output and v.status != SKIP
                                        else ""))
        ok = ok and v.status != FAIL
    return ok


# -- the reference's rank program (--sync-off-rank) ---------------------------------------

def sync_off_rank(argv: list[str]) -> int:
    """One rank of the reference job: ``commbench.allreduce``'s run sequence and step loop on
    the same flags, with a strategy that does not sync; rank 0 writes the medians of the
    measured steps (each step's slowest rank, as the tool's records take it) as JSON to
    ``--output``."""
    from commbench import allreduce
    from commbench.lifecycle import run_job
    from commbench.output import step_record, summarize_steps
    from commbench.steploop import run_steps
    from commbench.strategies.base import Strategy
    from commbench.timing import StepTimer
    from commbench.workloads import make_workload

    class SyncOff(Strategy):
        """No gradient sync: each rank keeps its own gradients."""

        name = "sync-off"

        def finish(self) -> None:
            pass

    def body(comm, cfg) -> int:
        workload = make_workload(cfg, comm.rank, comm.size)
        with SyncOff(comm, workload.grads, backward_order=workload.backward_order) as sync:
            samples = run_steps(comm, workload, sync, StepTimer(), cfg.steps, cfg.warmup)
        gathered = comm.gather_object(samples)
        if comm.rank == 0:
            steps = [step_record(per_rank, comm.size) for per_rank in zip(*gathered)]
            summary = summarize_steps(steps, cfg.batch_size * comm.size)
            keep = ("compute_s", "forward_s", "backward_s", "optimizer_s", "step_s",
                    "measured_steps")
            Path(cfg.output).write_text(json.dumps({k: summary[k] for k in keep}) + "\n")
        return 0

    return run_job(f"{PROG} --sync-off-rank", argv, allreduce.parse_config, allreduce.check,
                   body)


# -- the command ---------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n")[0])
    p.add_argument("-o", "--output", help="folder for every job's records (default: a "
                   "temporary folder)")
    p.add_argument("--budget-s", type=float, default=BUDGET_S,
                   help=f"the whole run's time limit in seconds (default {BUDGET_S:.0f})")
    p.add_argument("--plan", action="store_true",
                   help="print the environment and each check's command line; run nothing")
    p.add_argument("--sync-off-rank", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="(run by the sync-off check under torchrun) one rank of the reference "
                        "job, on commbench.allreduce's flags ARGS")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.sync_off_rank is not None:
        return sync_off_rank(a.sync_off_rank)
    if a.budget_s <= 0:
        print(f"{PROG}: error: --budget-s {a.budget_s:g}: give a positive number of seconds",
              file=sys.stderr)
        return 2
    found = launchers()
    if not a.plan and not torch.cuda.is_available():
        print(f"{PROG}: error: torch sees no CUDA device; run it on a GPU machine with a CUDA "
              "build of torch", file=sys.stderr)
        return 2
    for line in environment(found):
        print(f"# {line}", flush=True)
    why = tools_import()
    if why:
        print(f"{PROG}: error: {why}", file=sys.stderr)
        return 2
    gpus = max(1, torch.cuda.device_count())
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(a.output or tmp)
        checks = plan(out, gpus, found, has_device_timing())
        if a.plan:
            for c in checks:
                print(f"{c.name}: " + (shlex.join(c.argv) if c.argv else f"SKIP ({c.skip})"))
            return 0
        out.mkdir(parents=True, exist_ok=True)
        ok = run_all(checks, a.budget_s)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
