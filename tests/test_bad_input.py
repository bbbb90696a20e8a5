"""Bad input: every tool exits 2 with one line naming the cause, and writes nothing.

One table of every case: the tool, its arguments, the text(s) its error line
must contain, and how it is started. Most run as one plain process (a tool
started without a launcher is a job of one rank), forked from one that has
imported the tools (``tests/forkrun.py``: the same ``python -m``); the cases
marked with ranks run under mpirun, where every rank must stop with status 2
and the line be said once (by rank 0), with nothing on stdout. Then the
refusals of the tools' parsers in-process (``ConfigError`` naming the flag).

In the arguments ``{tmp}`` is the case's own directory (holding an empty
``empty.jsonl``) and ``{root}`` the project's; a ``commbench`` tool given no
``--output`` gets one there.
After the run that directory must hold nothing new: no partial output.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from commbench import allreduce, microbench
from commbench.flags import ConfigError
from tests.conftest import PY, ROOT, launch


def case(module: str, args: list[str], *names: str, ranks: int | None = None):
    """A row: ``module`` run with ``args`` must exit 2 with one error line holding every
    one of ``names``; under mpirun with ``ranks`` ranks, or as one plain process."""
    marks = [pytest.mark.mpi] if ranks else []
    return pytest.param(module, args, names, ranks, marks=marks,
                        id=f"{module}:{' '.join(args) or '(none)'}"
                           + (f":np{ranks}" if ranks else ""))


A, MB, PS = "commbench.allreduce", "commbench.microbench", "commbench.ps"
ANALYSIS = ("analysis.plot", "analysis.export", "analysis.costmodel", "analysis.timeline",
            "analysis.report")
CLUSTER_RUN = ["run", "--name", "cbt"]  # the cluster tests' name; a bad line creates nothing
STUDY = ["--quick", "-o", "{tmp}/s"]

BAD = [
    # -- commbench.allreduce: flags and their values -----------------------------------
    case(A, ["--strategy", "nope"], "--strategy"),
    case(A, ["--algo", "bogus"], "--algo"),
    case(A, ["--steps", "0"], "--steps"),
    case(A, ["--steps", "-3"], "--steps"),
    case(A, ["--warmup", "-1"], "--warmup"),
    case(A, ["--batch-size", "abc"], "--batch-size"),
    case(A, ["--model", "resnet7"], "--model"),
    case(A, ["--backend", "nccl2"], "--backend"),
    # the torch backend: no rendezvous outside torchrun; NCCL without CUDA; a library flag
    # for another backend (under torchrun: tests/test_torch_backend.py)
    case(A, ["--backend", "torch"], "--backend torch", "rendezvous", "torchrun"),
    case(MB, ["--backend", "torch"], "--backend torch", "rendezvous"),
    case(PS, ["--backend", "torch"], "--backend torch", "rendezvous"),
    case(A, ["--dist-backend", "gloo"], "--dist-backend gloo", "mpi backend"),
    *(case(A, [*args, "--dist-backend", "nccl"], "--dist-backend nccl", "CUDA")
      for args in ([], ["--backend", "torch"])),
    case(MB, ["--device", "cuda"], "--device cuda"),
    case(A, ["--compute-ms", "nan"], "--compute-ms"),
    case(A, ["--step-timeout", "-1"], "--step-timeout"),
    case(A, ["--step-timeout", "0.05"], "--step-timeout"),
    case(A, ["--workload", "real", "--image-size", "8"], "--image-size"),
    case(A, ["--compute-profile", "/nonexistent/p.json"], "/nonexistent/p.json"),
    case(A, ["--model", "resnet18", "--compute-profile", "{root}/profiles/h200-resnet50-b256.json"],
         "--compute-profile", "resnet50"),
    case(A, ["--workload", "real", "--image-size", "16"], "--image-size"),
    case(A, ["--workload", "real", "--batch-size", "0"], "--batch-size"),
    case(A, ["--workload", "real", "--model", "resnet9"], "--model"),
    case(A, ["--buffers", "sum"], "--buffers", "'sum'"),
    case(A, ["--dataset", "digits"], "--dataset digits: needs --workload real"),
    case(A, ["--no-such-flag"], "--no-such-flag"),
    case(A, ["--output", "/proc/commbench/r.jsonl"], "--output"),
    case(A, ["--bucket-mb", "-3"], "--bucket-mb"),
    *(case(A, ["--strategy", "bucketed", "--bucket-mb", v], "--bucket-mb")
      for v in ("-1", "-0.5", "abc", "inf", "nan")),
    case(A, ["--strategy", "async", "--transfer", "nbc"], "--transfer"),
    case(A, ["--strategy", "async", "--staleness", "-1"], "--staleness"),
    case(A, ["--strategy", "async", "--staleness", "x"], "--staleness"),
    case(A, ["--strategy", "async", "--staleness", "5", "--steps", "4"], "--staleness 5"),
    # the parameter server is a tool of its own now: the old flag says where it went
    case(A, ["--strategy", "ps"], "python -m commbench.ps"),
    case(A, ["--strategy", "flat,ps"], "python -m commbench.ps"),
    case(A, ["--accum-steps", "0"], "--accum-steps"),
    case(A, ["--accum-steps", "-2"], "--accum-steps"),
    case(A, ["--compression", "int8"], "--compression"),
    case(A, ["--strategy", "horovod", "--workload", "real", "--compression", "bf16"],
         "bfloat16"),
    # the ZeRO stages: what they cannot honour names the pair (zero1 honours --accum-steps)
    case(A, ["--strategy", "flat,zero2", "--accum-steps", "2"],
         "--strategy zero2", "--accum-steps 2"),
    case(A, ["--strategy", "zero1", "--compression", "fp16"],
         "--strategy zero1", "--compression fp16"),
    case(A, ["--strategy", "zero2", "--compression", "bf16"],
         "--strategy zero2", "--compression bf16"),
    case(A, ["--strategy", "bucketed,zero1", "--bucket-mb", "auto"],
         "--strategy zero1", "--bucket-mb auto"),
    case(A, ["--strategy", "zero2", "--accum-steps", "2"], "--strategy zero2",
         "--accum-steps 2", ranks=2),
    # -- every rank of a launched job -------------------------------------------------
    case(A, ["--strategy", "nope"], "--strategy", ranks=3),
    case(A, ["--backend", "nccl2"], "--backend", ranks=3),
    case(A, ["--model", "resnet7"], "--model", ranks=3),
    case(A, ["--steps", "0"], "--steps", ranks=3),
    case(A, ["--batch-size", "-4"], "--batch-size", ranks=3),
    case(A, ["--output", "/proc/commbench/r.jsonl"], "--output", ranks=3),
    # found once the backend is up, on every rank alike
    case(A, ["--workload", "real", "--model", "resnet18", "--image-size", "32",
             "--batch-size", "4", "--num-classes", "10", "--steps", "2", "--warmup", "1",
             "--strategy", "horovod"], "needs the horovod backend", ranks=2),
    case(A, ["--model", "resnet18", "--slow-rank", "2:3", "--steps", "1", "--warmup", "0"],
         "--slow-rank 2:3: the job has ranks 0-1", ranks=2),
    # -- commbench.microbench ---------------------------------------------------------
    case(MB, ["-b", "1K", "-e", "8"], "-b/--minbytes"),
    case(MB, ["-f", "1"], "-f/--stepfactor"),
    case(MB, ["-d", "float64"], "float64"),
    case(MB, ["-b", "3", "-e", "64"], "not a multiple"),
    case(MB, ["-n", "0"], "-n/--iters"),
    case(MB, ["--step-timeout", "soon"], "--step-timeout"),
    case(MB, ["-e", "12Q"], "-e/--maxbytes"),
    case(MB, ["-b", "1K", "-e", "8"], "--minbytes", ranks=2),
    case(MB, ["-f", "0"], "--stepfactor", ranks=2),
    case(MB, ["-d", "int8"], "--datatype", ranks=2),
    case(MB, ["--algo", "native,tree"], "--algo", ranks=2),
    case(MB, ["-b", "4", "-e", "66"], "--maxbytes", ranks=2),
    case(MB, ["-n", "0"], "--iters", ranks=2),
    case(MB, ["-w", "-1"], "--warmup_iters", ranks=2),
    case(MB, ["--output", "/proc/commbench/r.jsonl"], "--output", ranks=2),
    case(MB, ["--mpi-algorithm", "ring", "--algo", "ring"], "--mpi-algorithm", "--algo native"),
    case(MB, ["--mpi-algorithm", "ring", "--backend", "horovod"], "--mpi-algorithm",
         "Horovod"),
    case(MB, ["--mpi-algorithm", "tree"], "--mpi-algorithm"),
    # -- commbench.ps and commbench.staleness -----------------------------------------
    case(PS, [], "at least 2 ranks"),  # one process: a singleton MPI job
    case(PS, ["--strategy", "ps"], "--strategy"),
    case(PS, ["--accum-steps", "2"], "--accum-steps"),
    case(PS, ["--steps", "0"], "--steps"),
    case(PS, ["--compression", "fp8"], "--compression"),
    case("commbench.staleness", ["--staleness", "0,-2"], "--staleness"),
    case("commbench.staleness", ["--staleness", "9", "--steps", "8"], "9"),
    case("commbench.staleness", ["--target-accuracy", "1.5"], "--target-accuracy"),
    case("commbench.staleness", [], "at least 2 ranks"),
    # -- launch -----------------------------------------------------------------------
    case("launch.sweep", ["--set", "foo=1"], "foo=1"),
    case("launch.sweep", ["--set", "ranks=a"], "ranks"),
    case("launch.sweep", ["--launcher", "srun"], "--launcher"),
    case("launch.sweep", ["/nonexistent/sweep.toml"], "/nonexistent/sweep.toml"),
    case("launch.sweep", ["--set", "ranks=4", "--set", "nodes=1", "--set", "slots=2"],
         "4 ranks"),
    case("launch.sweep", ["--set", "ranks=1", "--timeout", "0"], "timeout"),
    case("experiments.study", [*STUDY, "--claims", "C2,C9"], "unknown claim C9"),
    case("experiments.study", [*STUDY, "--ranks", "1,16"],
         "--ranks 16: more ranks than the cluster has"),
    case("experiments.study", [*STUDY, "--nodes", "1", "--claims", "C2"],
         "cluster has one node"),
    case("experiments.study", [*STUDY, "--hosts", "a:4,b"], "--hosts: 'b' is not HOST:SLOTS"),
    case("experiments.study", [*STUDY, "--hosts", "a:2,b:2", "--ranks", "8"],
         "more ranks than the cluster has"),
    case("experiments.study", [*STUDY, "--hostfile", "/nonexistent/hosts"],
         "--hostfile /nonexistent/hosts"),
    case("experiments.study", [*STUDY, "--launcher", "horovodrun-gloo", "--claims", "C4"],
         "C4 needs point-to-point"),
    case("experiments.study", ["--quick", "-o", "/dev/null"], "/dev/null is not a directory"),
    case("experiments.study", [*STUDY, "--steps", "0"], "--steps 0: must be at least 1"),
    # the full study's async runs go up to staleness 4 (the quick study's to 1)
    case("experiments.study", ["-o", "{tmp}/s", "--steps", "3"], "--steps 3", "staleness 4"),
    case("experiments.study", [*STUDY, "--compute-scale", "0"],
         "--compute-scale 0: must be > 0"),
    case("launch.cluster", [*CLUSTER_RUN, "--nodes", "2", "--slots", "2", "--np", "5", "--",
                            "python", "-c", "pass"], "more ranks than"),
    case("launch.cluster", [*CLUSTER_RUN, "--nodes", "2", "--slots", "2", "--rate", "fast",
                            "--", "python", "-c", "pass"], "--rate"),
    case("launch.cluster", [*CLUSTER_RUN, "--", "python", "-c", "pass"], "not up"),
    # -- time dilation: 0, negative, not a number; where nothing is emulated ------------
    *(case("launch.cluster", [*CLUSTER_RUN, "--nodes", "2", "--slots", "1", "--dilation", v,
                              "--", "python", "-c", "pass"], "--dilation")
      for v in ("0", "-2", "fast", "auto")),
    case("launch.cluster", ["up", "--name", "cbt", "--slots", "1,1", "--dilation", "0.5"],
         "--dilation"),
    *(case("launch.sweep", ["--set", "slots=1", "--set", "nodes=2", "--dilation", v],
           "dilation") for v in ("0", "-1", "x")),
    case("launch.sweep", ["--set", "ranks=2", "--dilation", "4"],
         "applies to emulated links only"),
    # auto (one K per compared set, chosen by probes) is the experiment runner's, not a
    # sweep's: refused on this host and on an emulated cluster alike, by flag or grid
    case("launch.sweep", ["--set", "ranks=2", "--dilation", "auto"], "--dilation auto",
         "experiment runner"),
    case("launch.sweep", ["--set", "slots=1", "--set", "nodes=2", "--dilation", "auto"],
         "--dilation auto", "experiment runner"),
    case("launch.sweep", ["--set", "slots=1", "--set", "nodes=2", "--set", "dilation=1,auto"],
         "grid.dilation auto", "experiment runner"),
    *(case("experiments.study", [*STUDY, "--dilation", v], "--dilation")
      for v in ("0", "-4", "x")),
    case("experiments.study", [*STUDY, "--hosts", "a:4,b:4", "--dilation", "4"],
         "applies to emulated links only"),
    case("benchmarks.dilation", ["--factors", "1,0", "--dry-run"], "--factors"),
    case("benchmarks.hier_bound", ["--dilation", "0", "--dry-run"], "--dilation"),
    # the replay names its profile job's file before auto could choose a K
    case("benchmarks.replay_fidelity", ["--dilation", "auto", "--dry-run"], "--dilation auto",
         "give K"),
    # -- analysis ---------------------------------------------------------------------
    *(case(m, ["{tmp}/missing", "-o", "{tmp}/o"], "missing", "no such file") for m in ANALYSIS),
    *(case(m, ["{tmp}", "--no-such-flag", "-o", "{tmp}/o"], "--no-such-flag")
      for m in ANALYSIS),
    case("analysis.plot", ["{tmp}/empty.jsonl", "-o", "{tmp}/plots"], "empty.jsonl"),
    case("analysis.plot", ["{tmp}", "--no-such-flag"], "--no-such-flag"),
]


#: tools whose argparse choices still print argparse's usage block (a line "usage: ..." and
#: its indented continuation lines) above the error line; every other tool says one line
USAGE_BLOCK = {"launch.sweep", "benchmarks.dilation", "benchmarks.hier_bound"}


def _stderr_lines(module: str, stderr: str) -> list[str]:
    lines = [line for line in stderr.splitlines() if line.strip()]
    if module in USAGE_BLOCK:
        lines = [line for line in lines if not line.startswith(("usage:", " "))]
    return lines


def _argv(module: str, args: list[str], d: Path) -> list[str]:
    argv = [a.format(tmp=d, root=ROOT) for a in args]
    if module.startswith("commbench.") and "--output" not in argv:
        argv += ["--output", str(d / "out" / "r.jsonl")]
    return argv


def _case_dir(factory, i: int) -> Path:
    d = factory.mktemp(f"bad{i}")
    (d / "empty.jsonl").write_text("")
    return d


@pytest.fixture(scope="module")
def plain_runs(request, tmp_path_factory) -> dict:
    """Every selected plain-process case, each in its own directory, run by
    ``tests/forkrun.py``: the tools imported once, each case a forked ``python -m``
    (start-up is mostly importing torch); keyed by (module, args)."""
    selected = [item.callspec.params for item in request.session.items
                if item.originalname == "test_bad_input_exits_2_with_one_line_naming_the_cause"]
    cases = [(c["module"], c["args"]) for c in selected if c["ranks"] is None]
    if not cases:
        return {}
    dirs = [_case_dir(tmp_path_factory, i) for i in range(len(cases))]
    lines = "".join(json.dumps({"module": m, "args": _argv(m, a, d), "cwd": str(d),
                                "timeout": 120}) + "\n"
                    for (m, a), d in zip(cases, dirs))
    modules = sorted({m for m, _ in cases})
    res = subprocess.run([PY, str(ROOT / "tests" / "forkrun.py"), *modules], input=lines,
                         capture_output=True, text=True, cwd=str(ROOT), timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
    answers = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(answers) == len(cases), res.stderr
    return {(m, tuple(a)): (SimpleNamespace(**ans), d)
            for (m, a), d, ans in zip(cases, dirs, answers)}


def test_every_case_is_listed_once():
    keys = [(p.values[0], tuple(p.values[1]), p.values[3]) for p in BAD]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("module,args,names,ranks", BAD)
def test_bad_input_exits_2_with_one_line_naming_the_cause(plain_runs, tmp_path_factory,
                                                           module, args, names, ranks):
    if ranks is None:
        res, d = plain_runs[(module, tuple(args))]
        errors = _stderr_lines(module, res.stderr)
    else:
        d = _case_dir(tmp_path_factory, 0)
        res = launch("mpirun", ranks, [PY, "-m", module, *_argv(module, args, d)], timeout=120)
        errors = [line for line in res.stderr.splitlines() if f"{module}: error" in line]
        assert not res.stdout.strip(), res.stdout
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    assert len(errors) == 1 and all(n in errors[0] for n in names), res.stderr
    assert sorted(p.name for p in d.iterdir()) == ["empty.jsonl"]  # no partial output


# -- the parsers, in-process: a ConfigError that names the flag --------------------------

REFUSED = {  # parser: {the flag its error names: command lines (shell words) it refuses}
    allreduce.parse_config: {
        "--strategy": ["--strategy nope", "--strategy ''"],
        "--algo": ["--algo native,tree"],
        "--backend": ["--backend nccl"],
        "--model": ["--model vgg19"],
        "--workload": ["--workload bert"],
        "--steps": ["--steps 0", "--steps two"],
        "--warmup": ["--warmup -1"],
        "--batch-size": ["--batch-size 0"],
        "--compute-ms": ["--compute-ms -5", "--compute-ms nan"],
        "--no-such-flag": ["--no-such-flag"],
    },
    microbench.parse_config: {
        "--minbytes": ["-b 1K -e 8", "-b 6 -e 64",  # float32 is 4 bytes
                       "-b 2 -d float16,float32", "-b 1X"],
        "--stepfactor": ["-f 1", "-f 0", "-f 1.5"],
        "--datatype": ["-d int8", "-d float32,fp8"],
        "--algo": ["--algo native,tree"],
        "--maxbytes": ["-b 4 -e 66"],
        "--iters": ["-n 0", "-n -3"],
        "--warmup_iters": ["-w -1"],
        "--output": ["--output /proc/commbench/r.jsonl"],
    },
}


@pytest.mark.parametrize("parse,line,flag", [
    pytest.param(parse, line, flag, id=f"{parse.__module__}:{line}")
    for parse, by_flag in REFUSED.items() for flag, lines in by_flag.items() for line in lines])
def test_parser_refuses_naming_the_flag(parse, line, flag):
    with pytest.raises(ConfigError, match=flag):
        parse(shlex.split(line))
