"""Command-line flags of ``commbench.allreduce``, grouped, with their checks.

The workload's flags (``WorkloadSpec``, ``add_workload_flags``) and the step
loop's (``add_run_flags``) are shared with the other tool that trains one,
``commbench.ps``.

Everything is checked here, on every rank, before any library is
initialised or any collective runs: a bad flag ends every rank with exit
status 2 and one line naming the flag. Later issues add flags to
``build_parser``'s groups.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from commbench.torchtrace import DEFAULT_STEPS


class ConfigError(Exception):
    """A user error in the command line; the message names the flag."""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter,
                     argparse.RawDescriptionHelpFormatter):
    """Defaults shown after every flag; the epilog's example lines kept as written."""


def help_formatter(prog: str) -> argparse.HelpFormatter:
    return _HelpFormatter(prog, width=96)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump, exit 2 by the caller
        raise ConfigError(message)


def csv_list(choices: tuple[str, ...] | None, flag: str):
    def parse(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"{flag} needs at least one value")
        if choices is not None:
            bad = [x for x in items if x not in choices]
            if bad:
                raise argparse.ArgumentTypeError(
                    f"unknown value {bad[0]!r}; choose from {', '.join(choices)}")
        return items
    return parse


def _checked(convert, expected: str, ok, bound: str):
    """An argparse type: ``convert`` the text, then require ``ok(value)``; both errors
    name what was expected."""
    def parse(text: str):
        try:
            v = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(
                f"must be {bound}, got {v if convert is int else text}")
        return v
    return parse


positive_int = _checked(int, "an integer", lambda v: v > 0, "> 0")
nonneg_int = _checked(int, "an integer", lambda v: v >= 0, ">= 0")
nonneg_float = _checked(float, "a number", lambda v: 0 <= v < math.inf,
                        "a finite number >= 0")
positive_float = _checked(float, "a number", lambda v: 0 < v < math.inf,
                          "a finite number > 0")
fraction = _checked(float, "a number", lambda v: 0 < v <= 1, "in (0, 1]")


def slow_rank(text: str) -> tuple[int, float]:
    """``--slow-rank R:F``: rank R's replayed compute times F (> 0)."""
    rank, sep, factor = text.partition(":")
    try:
        r, f = int(rank), float(factor)
    except ValueError:
        r, f = -1, math.nan
    if not sep or r < 0:
        raise argparse.ArgumentTypeError(f"expected RANK:FACTOR (e.g. 1:2), got {text!r}")
    if not 0 < f < math.inf:
        raise argparse.ArgumentTypeError(f"factor must be a finite number > 0, got {factor!r}")
    return r, f


@dataclass
class JobOutput:
    """The backend and where records go: what every tool's configuration carries."""

    backend: str = "auto"
    output: str | None = None
    output_dir: str = "results"
    quiet: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class WorkloadSpec:
    """What a workload is built from (``commbench.workloads.make_workload``); every tool
    that trains one extends or builds it."""

    workload: str = "synthetic"
    model: str | None = None  # resnet50; resnet18 for the real workload on a CPU
    model_kwargs: dict = field(default_factory=dict)  # the model's keyword arguments
    input_shape: tuple[int, ...] | None = None  # one sample; None: 3 x image_size^2
    vocab: int | None = None  # inputs are token ids below this
    batch_size: int | None = None  # 32; 64 for the real workload on a GPU
    num_classes: int = 1000
    image_size: int | None = None  # real workload: 64 px on a CPU, 224 on a GPU
    device: str = "auto"
    dataset: str = "synthetic"
    lr: float = 0.01
    compute_ms: float = 100.0
    compute_profile: str | None = None
    compute_scale: float = 1.0
    slow_rank: tuple[int, float] | None = None  # (rank, factor on its replayed compute)
    compute_jitter: float = 0.0  # coefficient of variation of each step's replayed compute
    seed: int = 0

    def sample_shape(self) -> tuple[int, ...]:
        """One input sample's shape: ``--input-shape``, else a 3-channel image of
        ``--image-size`` pixels a side."""
        return self.input_shape or (3, self.image_size, self.image_size)

    def label(self) -> str:
        """What computes in each step, for a table's title."""
        if self.workload == "resnet":
            if self.image_size is None:  # a model of token ids (models.input_kind)
                what = "token sequences"
            elif self.input_shape is None:
                what = f"{self.image_size} px"
            else:
                what = "input " + "x".join(map(str, self.input_shape)) + \
                    (f" tokens < {self.vocab}" if self.vocab else "")
            return f"batch {self.batch_size} x {what} on {self.device}"
        what = (f"compute {self.compute_profile} x {self.compute_scale:g}"
                if self.compute_profile else f"compute {self.compute_ms:g} ms")
        if self.slow_rank is not None:
            what += f"  rank {self.slow_rank[0]} x {self.slow_rank[1]:g}"
        if self.compute_jitter:
            what += f"  jitter cv {self.compute_jitter:g}"
        return what


@dataclass
class Config(WorkloadSpec):
    strategies: list[str] = field(default_factory=lambda: ["flat"])
    algos: list[str] = field(default_factory=lambda: ["native", "ring"])
    bucket_mb: float = 25.0  # DDP's bucket_cap_mb default
    first_bucket_mb: float = 1.0  # DDP's first bucket
    accum_steps: int = 1
    progress: str = "thread"
    transfer: str = "thread"  # async, bucketed --progress thread: the engine's path
    compression: str = "none"
    staleness: int = 0  # --strategy async: apply step t's all-reduce at step t+s
    staleness_lr: bool = False
    staleness_warmup: int = 0
    backend: str = "auto"
    buffers: list[str] = field(default_factory=lambda: ["broadcast"])  # DDP's default
    steps: int = 20
    warmup: int = 3
    validate: bool = True
    step_timeout: float | None = None  # seconds; None = auto (commbench.watchdog), 0 = off
    output: str | None = None
    output_dir: str = "results"
    quiet: bool = False
    #: None; "commbench" = every phase interval per rank in kind "trace" records (the
    #: timeline); "torch" = a window of steps under torch.profiler, a trace file per rank
    trace: str | None = None
    trace_steps: int | None = None  # --trace torch: steps in its window (torchtrace)

    def as_dict(self) -> dict:
        return asdict(self)


TRACE_KINDS = ("commbench", "torch")

#: former strategies that are tools of their own now (name -> the tool's module), so that
#: ``--strategy NAME`` can say where they went
MOVED_STRATEGIES = {"ps": "commbench.ps"}  # the parameter server runs its own loops


def _strategy_list(names: tuple[str, ...]):
    parse_names = csv_list(names, "--strategy")

    def parse(text: str) -> list[str]:
        for name in (x.strip() for x in text.split(",")):
            if name in MOVED_STRATEGIES:
                raise argparse.ArgumentTypeError(
                    f"{name} is a tool of its own now: run python -m {MOVED_STRATEGIES[name]} "
                    "(it takes the same workload flags)")
        return parse_names(text)
    return parse


def build_parser() -> argparse.ArgumentParser:
    # imports torch: launch.sweep imports this module and must start without it
    from commbench.buffers import BUFFER_RULES
    from commbench.comm.engine import TRANSFER_PATHS
    from commbench.strategies import ALGOS, STRATEGIES

    d = Config()
    p = Parser(
        prog="python -m commbench.allreduce",
        description="Time every training step under a gradient-sync strategy and report "
                    "how much of it is spent waiting for gradients. Run it under "
                    "horovodrun or mpirun.",
        formatter_class=help_formatter,
        epilog="examples:\n"
               "  horovodrun -np 8 -H localhost:8 python -m commbench.allreduce\n"
               "  mpirun -np 4 python -m commbench.allreduce --algo ring --model resnet18\n"
               "  mpirun -np 64 --hostfile hosts python -m commbench.allreduce --steps 100")

    g = p.add_argument_group("synchronisation")
    add_flag(g, d, "--strategy", dest="strategies", metavar="NAME[,NAME]",
             type=_strategy_list(tuple(STRATEGIES)),
             help=f"strategies to run, one run each: {', '.join(STRATEGIES)}")
    add_flag(g, d, "--algo", dest="algos", metavar="NAME[,NAME]",
             type=csv_list(tuple(ALGOS), "--algo"),
             help="all-reduce algorithms for strategies that take one: native = the "
                  "backend's own, ring = the project's reduce-scatter + all-gather")
    add_flag(g, d, "--bucket-mb", metavar="MB", type=nonneg_float,
             help="--strategy bucketed and ddp: bucket cap in MB (2**20 bytes, as DDP's "
                  "bucket_cap_mb); 0 = one all-reduce per tensor")
    add_flag(g, d, "--first-bucket-mb", metavar="MB", type=nonneg_float,
             help="--strategy bucketed: the first bucket's cap, DDP's 1 MiB by default, so "
                  "the first all-reduce starts early in backward")
    add_flag(g, d, "--progress", choices=("poll", "thread"),
             help="--strategy bucketed: how buckets' all-reduces advance during backward: "
                  "poll = MPI non-blocking all-reduce tested from the compute loop, "
                  "thread = blocking all-reduces on a comm thread (Horovod's design)")
    add_flag(g, d, "--transfer", choices=TRANSFER_PATHS,
             help="--strategy async and bucketed (--progress thread): how the background "
                  "transfer engine runs each all-reduce: thread = the backend's blocking "
                  "all-reduce on its own thread (at link speed; Open MPI spins a core "
                  "while it waits), ring = the project's ring on point-to-point "
                  "messages, tested between sleeps (light on the CPU; needs MPI)")
    add_flag(g, d, "--accum-steps", metavar="K", type=positive_int,
             help="gradient accumulation: K micro-batches per step, synchronised once "
                  "(Horovod's backward_passes_per_step)")
    add_flag(g, d, "--compression", choices=("none", "fp16", "bf16"),
             help="cast gradients to this dtype for the all-reduce and back after "
                  "(hvd.Compression.fp16)")
    add_flag(g, d, "--staleness", metavar="S", type=nonneg_int,
             help="--strategy async: step t's all-reduce runs while later steps compute "
                  "and is applied at step t+S; 0 = synchronous")
    g.add_argument("--staleness-lr", action="store_true",
                   help="--strategy async: scale the learning rate by 1/staleness "
                        "(Zhang et al. 2016)")
    add_flag(g, d, "--staleness-warmup", metavar="N", type=nonneg_int,
             help="--strategy async: run the first N steps synchronously, then "
                  "staleness S")
    add_backend_flag(g)

    g = p.add_argument_group("workload")
    add_workload_flags(g, d)
    add_flag(g, d, "--device", choices=("auto", "cpu", "cuda"),
             help="--workload resnet: where forward/backward run (auto = cuda if "
                  "present)")
    add_flag(g, d, "--buffers", metavar="RULE[,RULE]", type=csv_list(BUFFER_RULES, "--buffers"),
             help="model buffers (BatchNorm statistics), one run each: broadcast = rank "
                  "0's before every forward, timed as sync (DDP's broadcast_buffers); "
                  "local = each rank keeps its own (Horovod after its first broadcast); "
                  "the horovod peer always follows Horovod's rule")

    g = p.add_argument_group("run")
    add_run_flags(g, steps=d.steps, warmup=d.warmup, seed=d.seed)
    g.add_argument("--no-validate", dest="validate", action="store_false",
                   help="skip the correctness pass (known values, closed-form sum)")
    add_step_timeout_flag(g)

    g = add_output_group(p, "allreduce")
    g.add_argument("--trace", "--timeline", dest="trace", nargs="?", const="commbench",
                   choices=TRACE_KINDS, default=d.trace, metavar="KIND",
                   help="commbench (or no value): also record every rank's phase and "
                        "collective intervals per step (kind \"trace\" records; python -m "
                        "analysis.timeline makes a Chrome trace of them); torch: run "
                        "--trace-steps measured steps under torch.profiler and write one "
                        "trace per rank beside the results file (Perfetto, TensorBoard, "
                        "Holistic Trace Analysis open it). Under horovodrun write --trace: "
                        "horovodrun reads --timeline after the program as an ambiguous "
                        "abbreviation of its own --timeline-filename and exits")
    g.add_argument("--trace-steps", metavar="N", type=positive_int, default=d.trace_steps,
                   help="--trace torch: how many measured steps (the first ones) to trace; "
                        "default 5")
    return p


def model_name(text: str) -> str:
    """``--model``: a registered model, or ``package.module:factory`` (imported later, in
    ``resolve_workload``, so its errors come with the other flags' checks)."""
    # imports torch: launch.sweep imports this module and must start without it
    from commbench.models import MODELS
    from commbench.models.factory import ModelError, check_ref, is_factory

    if is_factory(text):
        try:
            return check_ref(text)
        except ModelError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix(f"--model {text}: ")) from None
    if text not in MODELS:
        raise argparse.ArgumentTypeError(f"unknown model {text!r}; choose from "
                                         f"{', '.join(MODELS)}, or give package.module:factory")
    return text


def model_kwargs(text: str) -> dict:
    """``--model-kwargs``: a JSON object or ``k=v,k=v``."""
    # imports torch: launch.sweep imports this module and must start without it
    from commbench.models.factory import parse_kwargs

    try:
        return parse_kwargs(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def input_shape(text: str) -> tuple[int, ...]:
    """``--input-shape``: one sample's dimensions, e.g. ``3,224,224`` or ``512``."""
    try:
        dims = tuple(int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        dims = ()
    if not dims or min(dims) <= 0:
        raise argparse.ArgumentTypeError(f"expected sizes > 0 separated by commas (e.g. "
                                         f"3,224,224 or 512), got {text!r}")
    return dims


def add_flag(group: argparse._ArgumentGroup, defaults: object, flag: str, **kwargs) -> None:
    """``group.add_argument(flag, ...)`` with the default of the configuration field the
    flag sets (``--bucket-mb`` sets ``bucket_mb``, or ``dest``): a flag's default is
    written once, in its dataclass, so ``--help`` and a configuration built without the
    command line agree."""
    dest = kwargs.pop("dest", flag.removeprefix("--").replace("-", "_"))
    group.add_argument(flag, dest=dest, default=getattr(defaults, dest), **kwargs)


def add_workload_flags(g: argparse._ArgumentGroup, d: WorkloadSpec) -> None:
    """The workload's flags (``WorkloadSpec``), shared by the tools that train one."""
    # imports torch (launch.sweep imports this module), and commbench.workloads imports it
    from commbench.models import MODELS
    from commbench.workloads import WORKLOADS

    g.add_argument("--workload", choices=tuple(WORKLOADS), default=d.workload,
                   help="synthetic = a real model's gradient shapes, compute replayed")
    g.add_argument("--model", metavar="NAME|PKG.MOD:FACTORY", type=model_name, default=d.model,
                   help=f"model whose gradients are synchronised: {', '.join(MODELS)} (default "
                        "resnet50; resnet18 for --workload resnet on a CPU), or your own: a "
                        "callable returning a torch.nn.Module, importable on every rank")
    g.add_argument("--model-kwargs", metavar="JSON|K=V,...", type=model_kwargs,
                   default=d.model_kwargs,
                   help="keyword arguments of the model's factory: a JSON object "
                        "('{\"depth\": 4}') or depth=4,width=256 (values read as JSON)")
    g.add_argument("--input-shape", metavar="D[,D...]", type=input_shape, default=d.input_shape,
                   help="one input sample's shape (e.g. 3,224,224; 512 for a sequence of token "
                        "ids with --vocab); default 3,S,S with S = --image-size. The loss: the "
                        "model's own loss(output, target) if it has one, else cross-entropy "
                        "for an (N, C) output, over tokens for (N, T, C), else mean square")
    g.add_argument("--vocab", metavar="N", type=positive_int, default=d.vocab,
                   help="inputs are token ids drawn from [0, N) (int64) instead of floats")
    g.add_argument("--batch-size", type=positive_int, default=d.batch_size,
                   help="samples per rank per step (throughput = ranks * batch / step); "
                        "default 32, 64 for --workload resnet on a GPU")
    add_flag(g, d, "--image-size", type=positive_int,
             help="--workload resnet: input pixels per side (default 64 on a CPU, 224 "
                  "on a GPU; at least 32)")
    add_flag(g, d, "--lr", type=nonneg_float,
             help="SGD rate of --workload resnet (and of the parameter server's updates "
                  "on any workload)")
    add_flag(g, d, "--dataset", choices=("synthetic", "digits"),
             help="--workload resnet: synthetic inputs, or scikit-learn's digits (a real "
                  "labelled set shipped in the package; sets 10 classes, reports "
                  "held-out accuracy)")
    add_flag(g, d, "--num-classes", type=positive_int,
             help="classifier width (sets the last layer's gradient size)")
    add_flag(g, d, "--compute-ms", type=nonneg_float,
             help="forward+backward time per step replayed by the synthetic workload "
                  "(1/3 forward, 2/3 backward)")
    add_flag(g, d, "--compute-profile", metavar="FILE",
             help="synthetic workload: replay this profile (python -m commbench.profile) "
                  "instead of --compute-ms")
    add_flag(g, d, "--compute-scale", type=nonneg_float,
             help="multiply the profile's times (0.02 = a device 50x faster)")
    add_flag(g, d, "--slow-rank", metavar="R:F", type=slow_rank,
             help="synthetic workload: a straggler on purpose, rank R's replayed compute "
                  "takes F times as long")
    add_flag(g, d, "--compute-jitter", metavar="CV", type=nonneg_float,
             help="synthetic workload: draw each rank's compute per step around its "
                  "mean with this coefficient of variation (gamma, seeded per rank)")


def add_run_flags(g: argparse._ArgumentGroup, steps: int, warmup: int, seed: int) -> None:
    """``--steps``, ``--warmup`` and ``--seed``, shared by the tools with a step loop."""
    g.add_argument("--steps", type=positive_int, default=steps,
                   help="measured steps per run")
    g.add_argument("--warmup", type=nonneg_int, default=warmup,
                   help="warm-up steps before them (recorded, flagged, excluded from summaries)")
    g.add_argument("--seed", type=nonneg_int, default=seed, help="seed for gradient values")


def add_backend_flag(group: argparse._ArgumentGroup) -> None:
    """``--backend``, shared by every tool that runs under a launcher."""
    # imports torch: launch.sweep imports this module and must start without it
    from commbench.comm import BACKENDS

    group.add_argument("--backend", choices=("auto", *BACKENDS), default="auto",
                       help="communication backend; auto = horovod under horovodrun, mpi "
                            "under mpirun")


def add_step_timeout_flag(group: argparse._ArgumentGroup, what: str = "step") -> None:
    """``--step-timeout``, shared by every tool with a step loop (``commbench.watchdog``)."""
    group.add_argument("--step-timeout", metavar="SECONDS", type=nonneg_float, default=None,
                       help=f"end the job, naming the stalled rank(s), when one {what} runs "
                            "longer than this on any rank; 0 = never; default: 300 s or 5x the "
                            f"slowest {what} so far, whichever is larger")


def check_step_timeout(timeout: float | None, compute_s: float) -> None:
    """Refuse a deadline shorter than the compute a step replays by design."""
    if timeout and timeout <= compute_s:
        raise ConfigError(f"--step-timeout {timeout:g} s is not above the {compute_s:g} s of "
                          "compute every step replays (--compute-ms x --accum-steps); raise it "
                          "or use 0 for no deadline")


def add_output_group(p: argparse.ArgumentParser, tool: str) -> argparse._ArgumentGroup:
    """``--output`` and ``--quiet``, shared by every tool that writes records."""
    g = p.add_argument_group("output")
    g.add_argument("--output", metavar="FILE", default=None,
                   help=f"JSON Lines results file (default: results/{tool}-<time>-<backend>"
                        "-np<N>.jsonl)")
    g.add_argument("--quiet", action="store_true", help="no table on rank 0")
    return g


def check_writable(path: Path, flag: str) -> None:
    """Fail unless ``path`` can be created (parents included) or overwritten."""
    if path.is_dir():
        raise ConfigError(f"{flag}: {path} is a directory")
    anc = path.parent
    while not anc.exists():
        if anc.parent == anc:
            break
        anc = anc.parent
    if not anc.is_dir():
        raise ConfigError(f"{flag}: cannot create {path}: {anc} is not a directory")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag}: cannot write under {anc}: permission denied")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{flag}: {path} is not writable")
    if str(anc).startswith(("/proc", "/sys")):
        raise ConfigError(f"{flag}: cannot write under {anc}")


def parse_config(argv: list[str] | None = None) -> Config:
    """Parse and check ``argv``; raise ConfigError naming the flag on bad input."""
    ns = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    cfg = Config(**{k: v for k, v in vars(ns).items() if k in Config.__dataclass_fields__})
    resolve_defaults(cfg)
    if cfg.workload == "synthetic" and not cfg.compute_profile:
        check_step_timeout(cfg.step_timeout, cfg.compute_ms * cfg.accum_steps / 1e3)
    out = Path(cfg.output) if cfg.output else Path(cfg.output_dir) / "x.jsonl"
    check_writable(out, "--output")
    return cfg


def check_staleness(cfg: Config) -> None:
    """The async flags: checks that need no communicator (ranks are checked later)."""
    if "async" in cfg.strategies and cfg.staleness > cfg.steps:
        raise ConfigError(f"--staleness {cfg.staleness}: larger than --steps {cfg.steps}; a run "
                          "of N steps applies N - S updates, so S must be <= N")


def resolve_defaults(cfg: Config, cuda: bool | None = None) -> None:
    """Check the strategies against the workload, then fill and check the workload's
    defaults (``resolve_workload``)."""

    if "horovod" in cfg.strategies and cfg.compression == "bf16":
        raise ConfigError("--compression bf16: Horovod has no bfloat16 compressor (its "
                          "Compression offers none and fp16); use fp16 with --strategy horovod")
    check_staleness(cfg)
    check_trace(cfg)
    resolve_workload(cfg, cuda)


def check_trace(cfg: Config) -> None:
    """``--trace-steps`` belongs to ``--trace torch`` and fits in ``--steps``."""
    if cfg.trace != "torch":
        if cfg.trace_steps is not None:
            raise ConfigError("--trace-steps: needs --trace torch")
        return
    if cfg.trace_steps is None:
        cfg.trace_steps = min(DEFAULT_STEPS, cfg.steps)
    if cfg.trace_steps > cfg.steps:
        raise ConfigError(f"--trace-steps {cfg.trace_steps}: more than --steps {cfg.steps} "
                          "(the window is measured steps)")


def check_slow_rank(spec: WorkloadSpec, ranks: int, computing: range | None = None) -> None:
    """``--slow-rank R:F`` must name a rank of the job that computes (``computing``,
    default every rank); checked on every rank once the job's size is known."""
    if spec.slow_rank is None:
        return
    r = spec.slow_rank[0]
    computing = range(ranks) if computing is None else computing
    if r not in computing:
        what = (f"the job has ranks 0-{ranks - 1}" if r >= ranks
                else f"rank {r} computes nothing here (ranks {computing.start}-"
                     f"{computing.stop - 1} do)")
        raise ConfigError(f"--slow-rank {r}:{spec.slow_rank[1]:g}: {what}")


def _takes_tokens(model: str) -> bool:
    """Whether ``model`` takes token ids (built on the meta device: no weights)."""
    # imports torch: launch.sweep imports this module and must start without it
    from commbench.models import build_model, input_kind

    return input_kind(build_model(model, device="meta")) == "tokens"


def resolve_workload(spec: WorkloadSpec, cuda: bool | None = None) -> None:
    """Fill the defaults that depend on the workload and the device, then check them."""
    # imports torch (launch.sweep imports this module), and commbench.workloads imports it
    from commbench.models.factory import is_factory
    from commbench.workloads.real import MIN_IMAGE_SIZE

    if cuda is None:
        import torch  # launch.sweep imports this module and must start without torch

        cuda = torch.cuda.is_available()
    real = spec.workload == "resnet"
    for flag, given in (("--slow-rank", spec.slow_rank is not None),
                        ("--compute-jitter", spec.compute_jitter > 0)):
        if given and real:
            raise ConfigError(f"{flag}: only replayed compute can be slowed on purpose; "
                              "use --workload synthetic (--compute-ms or --compute-profile)")
    if spec.dataset != "synthetic":
        if not real:
            raise ConfigError(f"--dataset {spec.dataset}: needs --workload resnet")
        spec.num_classes = 10
    if spec.device == "auto":
        spec.device = "cuda" if cuda and real else "cpu"
    if spec.device == "cuda" and not cuda:
        raise ConfigError("--device cuda: no CUDA device here")
    gpu = real and spec.device == "cuda"
    if spec.model is None:
        spec.model = "resnet18" if real and not gpu else "resnet50"
    if spec.batch_size is None:
        spec.batch_size = 64 if gpu else 32
    if spec.image_size is None:
        spec.image_size = 224 if gpu else 64
    if real and not is_factory(spec.model) and spec.input_shape is None \
            and _takes_tokens(spec.model):
        if spec.dataset != "synthetic":
            raise ConfigError(f"--dataset {spec.dataset}: holds images; --model {spec.model} "
                              "takes token ids (it trains on synthetic sequences)")
        spec.image_size = None  # its inputs are sequences of its context's length
    elif real and spec.image_size < MIN_IMAGE_SIZE and spec.input_shape is None \
            and not is_factory(spec.model):
        raise ConfigError(f"--image-size: {spec.image_size} px is too small for a ResNet "
                          f"(at least {MIN_IMAGE_SIZE})")
    check_model(spec)
    if spec.compute_profile:
        if real:
            raise ConfigError("--compute-profile: only the synthetic workload replays a "
                              "profile; --workload resnet computes for real")
        from commbench.profile import ProfileError, load  # imports torch (see above)

        try:
            load(spec.compute_profile, spec.model, spec.num_classes, spec.model_kwargs)
        except ProfileError as e:
            raise ConfigError(str(e)) from None


def check_model(spec: WorkloadSpec) -> None:
    """A user's model (or a registered one given ``--input-shape``/``--vocab``/
    ``--model-kwargs``) must build and take its inputs: one forward and backward on the
    meta device (``workloads.objective.probe_spec``), on every rank before any collective."""
    # imports torch: launch.sweep imports this module and must start without it
    from commbench.models.factory import ModelError, is_factory

    if not (is_factory(spec.model) or spec.input_shape or spec.vocab or spec.model_kwargs):
        return
    if spec.dataset != "synthetic" and (spec.input_shape or spec.vocab):
        raise ConfigError(f"--dataset {spec.dataset}: its samples are 3 x --image-size "
                          "images; drop --input-shape and --vocab")
    from commbench.workloads.objective import probe_spec  # imports torch (see above)

    try:
        probe_spec(spec.model, spec.model_kwargs, spec.num_classes, spec.batch_size,
                   spec.sample_shape(), spec.vocab, shape_given=spec.input_shape is not None)
    except ModelError as e:
        raise ConfigError(str(e)) from None
    except ValueError as e:  # a registered model given keyword arguments it rejects
        raise ConfigError(f"--model {spec.model}: {e}") from None


# nccl-tests' size suffixes: binary multiples (1K = 1024 bytes)
_SUFFIXES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes from ``8``, ``64K``, ``256M`` or ``1G`` (K/M/G = 2**10/20/30, any case)."""
    s = text.strip()
    mult = _SUFFIXES.get(s[-1:].upper(), 1)
    digits = s[:-1] if mult > 1 else s
    if not digits.isdigit():  # refuses "", "-8", "1.5K", "8B", "1T"
        raise argparse.ArgumentTypeError(
            f"expected a byte count such as 8, 64K, 256M or 1G, got {text!r}")
    value = int(digits) * mult
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def message_sizes(minbytes: int, maxbytes: int, stepfactor: int) -> list[int]:
    """``minbytes``, times ``stepfactor`` each step, while not above ``maxbytes``."""
    sizes, size = [], minbytes
    while size <= maxbytes:
        sizes.append(size)
        size *= stepfactor
    return sizes
