"""GPU check: what commbench does on one CUDA device, in one command.

    python -m benchmarks.gpu_check                 # ~2 min on an H200 after torch's start-up
    python -m benchmarks.gpu_check -o results/gpu  # keep the profile and the records there

Run it from the repository root on a machine with an NVIDIA GPU, a CUDA build of
torch and the set-up of ``scripts/setup.sh`` (Open MPI, mpi4py). It checks, and
prints one line per check (``OK`` or ``FAIL`` with the cause), exit 1 if any fails:

1. **device** — torch sees a CUDA device (its name, torch's and CUDA's versions);
2. **profile** — ``commbench.profile --device cuda`` records ResNet-18 at batch 64,
   224 px, the procedure that made ``profiles/h200-*.json`` (``profiles/README.md``):
   the profile loads for its model, its gradient ready times rise within backward,
   ``peak_cuda_mb`` is there, and forward and backward are set beside the shipped
   H200 profile of the same model and batch (a ratio, printed, not a pass mark:
   another GPU is allowed to be slower);
3. **job** — ``mpirun -np 2 python -m commbench.allreduce --workload real --device
   cuda``: two ranks on the one device train ResNet-18 with flat and bucketed sync
   (gradients fused on the device, staged through pinned host buffers, all-reduced
   by MPI on the host); every summary has ``#wrong`` 0, ``device`` cuda,
   ``peak_cuda_mb`` and equal parameter checksums on both ranks;
4. **nccl-job** — the same training under ``torchrun`` on the torch backend with NCCL
   (``--dist-backend nccl``), one rank per GPU (NCCL refuses two ranks on one device,
   so a one-GPU machine runs one rank): gradients stay on the device (``staging``
   none, ``comm_device`` cuda), records say ``torch-nccl`` with NCCL's version, flat
   and bucketed, ``#wrong`` 0, equal parameter checksums;
5. **nccl-bench** — ``torchrun ... commbench.microbench --device cuda -b 64M -e 64M``:
   NCCL's own all-reduce on device buffers, ``#wrong`` 0, its busbw printed (as
   nccl-tests' ``all_reduce_perf`` prints it; a one-GPU machine has no busbw: one rank).

Not verified by this check (nor anywhere yet): Horovod built with NCCL
(``COMMBENCH_WITH_NCCL=1 ./scripts/setup.sh``) and its GPU all-reduce; NCCL across
nodes; CUDA-aware MPI. The shipped profiles were
recorded once on an H200 by hand with the command in step 2; this script makes that
run repeatable.

Without a CUDA device it says so and exits 2, starting nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from commbench.profilefile import read as read_profile
from commbench.workloads import compute_profile
from launch import commands
from launch.execute import run

ROOT = Path(__file__).resolve().parents[1]
MODEL, BATCH, IMAGE = "resnet18", 64, 224  # as profiles/h200-resnet18-b64.json
SHIPPED = ROOT / "profiles" / f"h200-{MODEL}-b{BATCH}.json"
JOB_TIMEOUT_S = 600  # two ranks, ResNet-18, a few steps: minutes even with torch's start-up


def _line(ok: bool, name: str, text: str) -> bool:
    print(f"{'OK  ' if ok else 'FAIL'} {name:8s} {text}", flush=True)
    return ok


def check_device() -> bool:
    if not torch.cuda.is_available():
        return False
    return _line(True, "device", f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
                 f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s)")


def check_profile(out: Path) -> bool:
    path = out / f"gpu-{MODEL}-b{BATCH}.json"
    res = run([sys.executable, "-m", "commbench.profile", "--model", MODEL, "--batch-size",
               str(BATCH), "--image-size", str(IMAGE), "--device", "cuda", "--iters", "10",
               "--warmup", "3", "-o", str(path)], timeout=JOB_TIMEOUT_S, cwd=str(ROOT))
    if res.returncode != 0 or res.timed_out:
        return _line(False, "profile", f"commbench.profile exited {res.returncode}"
                     f"{' (timed out)' if res.timed_out else ''}: {res.stderr.strip()[-600:]}")
    try:
        prof = compute_profile.load(path, MODEL, 1000)
    except compute_profile.ProfileError as e:
        return _line(False, "profile", str(e))
    ready = [g["ready_s"] for g in prof["grads"]]
    problems = []
    if "peak_cuda_mb" not in prof:
        problems.append("no peak_cuda_mb")
    if not all(0 <= r <= prof["backward_s"] * 1.01 for r in ready):
        problems.append("gradient ready times outside backward")
    if problems:
        return _line(False, "profile", "; ".join(problems))
    shipped = read_profile(SHIPPED)
    return _line(True, "profile",
                 f"{prof['device']}: forward {prof['forward_s'] * 1e3:.1f} ms "
                 f"(x{prof['forward_s'] / shipped.forward_s:.2f} of {SHIPPED.name}), "
                 f"backward {prof['backward_s'] * 1e3:.1f} ms "
                 f"(x{prof['backward_s'] / shipped.backward_s:.2f}), "
                 f"peak {prof['peak_cuda_mb']:.0f} MiB "
                 f"(shipped {shipped.raw['peak_cuda_mb']:.0f}) -> {path}")


def _records(path: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == kind]


def _failed(name: str, launcher: str, res) -> bool:
    return _line(False, name, f"{launcher} exited {res.returncode}"
                 f"{' (timed out)' if res.timed_out else ''}: {res.stderr.strip()[-600:]}")


def nccl_ranks() -> int:
    """Ranks of the NCCL checks: one per GPU, at most 2 (NCCL refuses two on one device)."""
    return max(1, min(2, torch.cuda.device_count()))


def _job_checks(s: dict, nccl: bool) -> list[tuple[str, bool]]:
    """(what is wrong, whether it is) for one summary of a GPU training job."""
    knobs = s.get("knobs") or {}
    checks = [
        ("#wrong > 0", s.get("wrong") != 0),
        (f"device {s.get('device')}", not str(s.get("device", "")).startswith("cuda")),
        ("no peak_cuda_mb", s.get("peak_cuda_mb") is None),
        ("ranks' parameters differ", len(set(s.get("param_checksum_ranks") or [None])) != 1)]
    if nccl:  # the torch backend on NCCL: device tensors, no staging through the host
        checks += [
            (f"backend {s.get('backend')}", s.get("backend") != "torch-nccl"),
            ("no NCCL version", not (s.get("versions") or {}).get("nccl")),
            (f"staged through {knobs.get('staging')}", knobs.get("staging") is not None)]
    return checks


def check_job(out: Path, launcher: str = "mpirun") -> bool:
    """Train on the GPU under ``launcher``: ``mpirun`` (MPI on host buffers, 2 ranks on the
    device) or ``torchrun`` (the torch backend on NCCL, device buffers, a rank per GPU)."""
    nccl = launcher == "torchrun"
    name = "nccl-job" if nccl else "job"
    records = out / f"gpu-{name}.jsonl"
    program = commands.python_module("commbench.allreduce", [
        "--workload", "real", "--device", "cuda", "--model", MODEL, "--batch-size",
        str(BATCH), "--image-size", str(IMAGE), "--strategy", "flat,bucketed", "--steps", "5",
        "--warmup", "2", "--quiet", "--output", str(records),
        # NCCL: no point-to-point messages here, so no ring (hier crosses nodes on NCCL's
        # own all-reduce)
        *(["--dist-backend", "nccl", "--algo", "native"] if nccl else [])])
    res = run(commands.launcher_argv(launcher, nccl_ranks() if nccl else 2, program),
              timeout=JOB_TIMEOUT_S, cwd=str(ROOT))
    if res.returncode != 0 or res.timed_out:
        return _failed(name, launcher, res)
    summaries = _records(records, "summary")
    problems = [f"{s['strategy']}: {why}" for s in summaries
                for why, bad in _job_checks(s, nccl) if bad]
    if not summaries:
        problems.append(f"no summaries in {records}")
    if problems:
        return _line(False, name, "; ".join(problems))
    return _line(True, name, ", ".join(
        f"{s['strategy']} step {s['step_s'] * 1e3:.0f} ms, exposed sync "
        f"{s['exposed_sync_s'] * 1e3:.0f} ms, peak {s['peak_cuda_mb']:.0f} MiB"
        for s in summaries) + f" -> {records}")


def check_nccl_bench(out: Path) -> bool:
    """NCCL's all-reduce of 64 MiB device buffers in the microbenchmark: its busbw."""
    records = out / "gpu-nccl-bench.jsonl"
    program = commands.python_module("commbench.microbench", [
        "--device", "cuda", "--dist-backend", "nccl", "-b", "64M", "-e", "64M", "--algo",
        "native", "-n", "20", "-w", "5", "--quiet", "--output", str(records)])
    res = run(commands.launcher_argv("torchrun", nccl_ranks(), program),
              timeout=JOB_TIMEOUT_S, cwd=str(ROOT))
    if res.returncode != 0 or res.timed_out:
        return _failed("nccl-bench", "torchrun", res)
    rows = _records(records, "microbench")
    if not rows or any(r.get("wrong") for r in rows) or rows[0].get("backend") != "torch-nccl":
        seen = [(r.get("backend"), r.get("wrong")) for r in rows]
        return _line(False, "nccl-bench", f"(backend, #wrong) of the rows: {seen}")
    r = rows[0]
    bus = (f"busbw {r['busbw']:.1f} GB/s" if r["world_size"] > 1 else
           "busbw not measured: one GPU, one rank (busbw = algbw x 2(n-1)/n is 0; the "
           "time is NCCL's launch and in-place copy, no link)")
    return _line(True, "nccl-bench", f"{r['world_size']} rank(s), 64 MiB float32 on "
                 f"{r.get('device')}: {r['time_us']['avg']:.0f} us, algbw {r['algbw']:.1f} "
                 f"GB/s, {bus}, NCCL {r['versions'].get('nccl')} -> {records}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check",
                                description=__doc__.split("\n")[0])
    p.add_argument("-o", "--output", help="folder for the profile and the records "
                   "(default: a temporary folder)")
    a = p.parse_args(argv)
    if not check_device():
        print("benchmarks.gpu_check: error: torch sees no CUDA device; run it on a GPU "
              "machine with a CUDA build of torch", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(a.output or tmp)
        out.mkdir(parents=True, exist_ok=True)
        ok = [check_profile(out), check_job(out), check_job(out, "torchrun"),
              check_nccl_bench(out)]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
