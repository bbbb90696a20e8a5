"""What a workload is built from (``WorkloadSpec``), its flags, and their resolution.

Every tool that trains a workload (``commbench.allreduce``, ``commbench.ps``)
extends ``WorkloadSpec``: its flags are declared on its fields
(``commbench.flags.flag``) and added with ``add_workload_flags``.
``resolve_workload`` fills the defaults that depend on the workload and the
device (a ResNet-18 at 64 px on a CPU, a ResNet-50 at 224 px on a GPU) and
checks them, on every rank before any library starts: a user's model is
built and run once on the meta device (``check_model``), a profile is read
against the model it is replayed for.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import torch

from commbench.flags import (
    ConfigError,
    DeviceRequest,
    add_fields,
    flag,
    float_text,
    momentum_value,
    nonneg_float,
    nonneg_int,
    positive_int,
)
from commbench.models.factory import ModelError, check_ref, is_factory, parse_kwargs
from commbench.models.registry import MODELS, build_model, input_kind
from commbench.workloads.compute_profile import ProfileError, load
from commbench.workloads.objective import probe_spec
from commbench.workloads.real import MIN_IMAGE_SIZE

#: ``--workload``: replayed compute, or real forward and backward passes of any model
WORKLOAD_NAMES = ("synthetic", "real")
#: former ``--workload`` names, still accepted (records since schema 3 say ``real``)
WORKLOAD_ALIASES = {"resnet": "real"}


def workload_name(text: str) -> str:
    """``--workload``: one of ``WORKLOAD_NAMES``, or a former name of one."""
    name = WORKLOAD_ALIASES.get(text, text)
    if name not in WORKLOAD_NAMES:
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from "
                                         f"{', '.join(WORKLOAD_NAMES)})")
    return name


def model_name(text: str) -> str:
    """``--model``: a registered model, or ``package.module:factory`` (imported later, in
    ``resolve_workload``, so its errors come with the other flags' checks)."""
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
class WorkloadSpec:
    """What a workload is built from (``commbench.workloads.make_workload``); every tool
    that trains one extends or builds it. None: filled by ``resolve_workload``."""

    workload: str = flag(
        "--workload", default="synthetic", type=workload_name, metavar="{synthetic,real}",
        help="synthetic = a real model's gradient shapes, compute replayed; real = real "
             "forward and backward passes of the model (resnet: its former name)")
    model: str | None = flag(
        "--model", default=None, metavar="NAME|PKG.MOD:FACTORY", type=model_name,
        help=f"model whose gradients are synchronised: {', '.join(MODELS)} (default resnet50; "
             "resnet18 for --workload real on a CPU), or your own: a callable returning a "
             "torch.nn.Module, importable on every rank")
    model_kwargs: dict = flag(
        "--model-kwargs", default_factory=dict, metavar="JSON|K=V,...", type=model_kwargs,
        help="keyword arguments of the model's factory: a JSON object ('{\"depth\": 4}') or "
             "depth=4,width=256 (values read as JSON)")
    input_shape: tuple[int, ...] | None = flag(
        "--input-shape", default=None, metavar="D[,D...]", type=input_shape,
        help="one input sample's shape (e.g. 3,224,224; 512 for a sequence of token ids with "
             "--vocab); default 3,S,S with S = --image-size. The loss: the model's own "
             "loss(output, target) if it has one, else cross-entropy for an (N, C) output, "
             "over tokens for (N, T, C), else mean square")
    vocab: int | None = flag(
        "--vocab", default=None, metavar="N", type=positive_int,
        help="inputs are token ids drawn from [0, N) (int64) instead of floats")
    batch_size: int | None = flag(
        "--batch-size", default=None, type=positive_int,
        help="samples per rank per step (throughput = ranks * batch / step); default 32, 64 "
             "for --workload real on a GPU")
    num_classes: int = flag("--num-classes", default=1000, type=positive_int,
                            help="classifier width (sets the last layer's gradient size)")
    image_size: int | None = flag(
        "--image-size", default=None, type=positive_int,
        help="--workload real: input pixels per side (default 64 on a CPU, 224 on a GPU; at "
             "least 32)")
    device: str = flag("--device", default="auto", choices=("auto", "cpu", "cuda"),
                       help="--workload real: where forward/backward run (auto = cuda if "
                            "present)")
    dataset: str = flag(
        "--dataset", default="synthetic", choices=("synthetic", "digits"),
        help="--workload real: synthetic inputs, or scikit-learn's digits (a real labelled "
             "set shipped in the package; sets 10 classes, reports held-out accuracy)")
    lr: float = flag("--lr", default=0.01, type=nonneg_float,
                     help="SGD rate of --workload real (and of the parameter server's updates "
                          "on any workload)")
    momentum: float = flag("--momentum", default=0.9, type=momentum_value,
                           help="SGD momentum of --workload real, in [0, 1)")
    compute_ms: float = flag(
        "--compute-ms", default=100.0, type=nonneg_float,
        help="forward+backward time per step replayed by the synthetic workload (1/3 "
             "forward, 2/3 backward)")
    compute_profile: str | None = flag(
        "--compute-profile", default=None, metavar="FILE",
        help="synthetic workload: replay this profile (python -m commbench.profile) instead "
             "of --compute-ms")
    compute_scale: float = flag("--compute-scale", default=1.0, type=nonneg_float,
                                help="multiply the profile's times (0.02 = a device 50x "
                                     "faster)")
    slow_rank: tuple[int, float] | None = flag(
        "--slow-rank", default=None, metavar="R:F", type=slow_rank,
        render=lambda v: f"{v[0]}:{float_text(v[1])}",
        help="synthetic workload: a straggler on purpose, rank R's replayed compute takes F "
             "times as long")
    compute_jitter: float = flag(
        "--compute-jitter", default=0.0, metavar="CV", type=nonneg_float,
        help="synthetic workload: draw each rank's compute per step around its mean with this "
             "coefficient of variation (gamma, seeded per rank)")
    seed: int = flag("--seed", default=0, type=nonneg_int,
                     help="seed for gradient values (and the real workload's weights)")

    def __post_init__(self) -> None:
        """A configuration built in code or from a record reads as one from the command line
        does: a former workload name as today's, sequences as the tuples the flags give."""
        self.workload = WORKLOAD_ALIASES.get(self.workload, self.workload)
        if self.workload not in WORKLOAD_NAMES:
            raise ValueError(f"--workload must be one of {', '.join(WORKLOAD_NAMES)}, got "
                             f"{self.workload!r}")
        if self.slow_rank is not None:
            self.slow_rank = (int(self.slow_rank[0]), float(self.slow_rank[1]))
        if self.input_shape is not None:
            self.input_shape = tuple(self.input_shape)

    def device_request(self) -> DeviceRequest:
        """Where the gradients live: the device a real workload trains on (``--device``, once
        ``resolve_workload`` has filled ``auto``); replayed compute keeps its gradients in
        host memory, whatever ``--device`` says."""
        if self.workload != "real":
            return DeviceRequest("cpu", why_host="--workload synthetic replays compute and "
                                                 "keeps its gradients there")
        return DeviceRequest("cpu" if self.device == "auto" else self.device)

    def sample_shape(self) -> tuple[int, ...]:
        """One input sample's shape: ``--input-shape``, else a 3-channel image of
        ``--image-size`` pixels a side."""
        return self.input_shape or (3, self.image_size, self.image_size)

    def label(self) -> str:
        """What computes in each step, for a table's title."""
        if self.workload == "real":
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


#: every workload flag, in ``--help`` order; ``seed`` goes with the run's flags
WORKLOAD_FLAGS = ("workload", "model", "model_kwargs", "input_shape", "vocab", "batch_size",
                  "image_size", "lr", "momentum", "dataset", "num_classes", "compute_ms",
                  "compute_profile",
                  "compute_scale", "slow_rank", "compute_jitter", "device")


def add_workload_flags(g: argparse._ArgumentGroup, cls: type = WorkloadSpec,
                       leave_out: tuple[str, ...] = ()) -> None:
    """The workload's flags, shared by the tools that train one (``cls``: the tool's
    configuration, which may give a field another default)."""
    add_fields(g, cls, [f for f in WORKLOAD_FLAGS if f not in leave_out])


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
    return input_kind(build_model(model, device="meta")) == "tokens"


def resolve_workload(spec: WorkloadSpec, cuda: bool | None = None) -> None:
    """Fill the defaults that depend on the workload and the device, then check them."""
    if cuda is None:
        cuda = torch.cuda.is_available()
    real = spec.workload == "real"
    for name, given in (("--slow-rank", spec.slow_rank is not None),
                        ("--compute-jitter", spec.compute_jitter > 0)):
        if given and real:
            raise ConfigError(f"{name}: only replayed compute can be slowed on purpose; "
                              "use --workload synthetic (--compute-ms or --compute-profile)")
    if spec.dataset != "synthetic":
        if not real:
            raise ConfigError(f"--dataset {spec.dataset}: needs --workload real")
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
                              "profile; --workload real computes for real")
        try:
            load(spec.compute_profile, spec.model, spec.num_classes, spec.model_kwargs)
        except ProfileError as e:
            raise ConfigError(str(e)) from None


def check_model(spec: WorkloadSpec) -> None:
    """A user's model (or a registered one given ``--input-shape``/``--vocab``/
    ``--model-kwargs``) must build and take its inputs: one forward and backward on the
    meta device (``workloads.objective.probe_spec``), on every rank before any collective."""
    if not (is_factory(spec.model) or spec.input_shape or spec.vocab or spec.model_kwargs):
        return
    if spec.dataset != "synthetic" and (spec.input_shape or spec.vocab):
        raise ConfigError(f"--dataset {spec.dataset}: its samples are 3 x --image-size "
                          "images; drop --input-shape and --vocab")
    try:
        probe_spec(spec.model, spec.model_kwargs, spec.num_classes, spec.batch_size,
                   spec.sample_shape(), spec.vocab, shape_given=spec.input_shape is not None)
    except ModelError as e:
        raise ConfigError(str(e)) from None
    except ValueError as e:  # a registered model given keyword arguments it rejects
        raise ConfigError(f"--model {spec.model}: {e}") from None
