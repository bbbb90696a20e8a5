"""What every tool's command line is built from: the parser, argparse types, shared groups.

A flag is declared once, on the dataclass field it sets, with ``flag(...)``:
its name, its default (the field's), its type, choices and help. A tool's
parser adds a dataclass's flags with ``add_fields``, and ``to_argv`` renders a
configuration back to the command line that gives it (``experiments.claims`` plans
typed configurations and runs them this way). So ``--help``, a configuration
built in code and a planned job agree on every default.

Standard library only: ``launch/`` builds command lines without torch.

Every check raises ``ConfigError`` (or ``argparse.ArgumentTypeError`` inside a
type), whose message names the flag; the tools turn it into one line on
stderr and exit status 2 before any library starts (``commbench.lifecycle``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

#: ``--dist-backend``: torch.distributed's library under the torch backend, or ``auto``
#: (``commbench.comm.placement.decide``)
DIST_BACKENDS = ("gloo", "nccl", "auto")


@dataclass(frozen=True)
class DeviceRequest:
    """Where a tool's flags ask for its tensors (``ToolConfig.device_request``), for the one
    decision of where they live and which library reduces them
    (``commbench.comm.placement.decide``). ``device``: ``cpu``, ``cuda`` or ``auto`` (a
    GPU where the collectives take device tensors, else host memory); ``why_host``: why
    they stay in host memory whatever ``--device`` says, for messages (empty where the
    flag says so); ``staging``: whether tensors on a GPU may be copied through host
    memory for a library that reduces host tensors (a workload's gradients), or must be
    the collectives' own (the microbenchmark's buffers)."""

    device: str = "cpu"
    why_host: str = ""
    staging: bool = True


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


# -- argparse types -------------------------------------------------------------------------

def tool_parser(prog: str, description: str, examples: Sequence[str],
                note: str = "") -> Parser:
    """A tool's parser: ``prog``, what it does, and an epilog of ``note`` then its example
    command lines, one per line (the tools' ``--help`` all end so)."""
    return Parser(prog=prog, description=description, formatter_class=help_formatter,
                  epilog=note + "examples:\n" + "\n".join(f"  {e}" for e in examples))


def csv_list(choices: Iterable[str] | None, flag: str) -> Callable[[str], list[str]]:
    """``a,b,c`` as a list, each item one of ``choices`` (any, when None)."""
    allowed = tuple(choices) if choices is not None else None

    def parse(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"{flag} needs at least one value")
        if allowed is not None:
            bad = [x for x in items if x not in allowed]
            if bad:
                raise argparse.ArgumentTypeError(
                    f"unknown value {bad[0]!r}; choose from {', '.join(allowed)}")
        return items
    return parse


def _checked(convert: Callable[[str], Any], expected: str, ok: Callable[[Any], bool],
             bound: str) -> Callable[[str], Any]:
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
momentum_value = _checked(float, "a number", lambda v: 0 <= v < 1, "in [0, 1)")


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


# -- flags declared on dataclass fields -------------------------------------------------------

@dataclass(frozen=True)
class Flag:
    """How a dataclass field is set from the command line (``flag``)."""

    names: tuple[str, ...]  # the first is the one ``to_argv`` writes
    help: str
    kwargs: dict  # argparse's: type, choices, metavar, action, nargs, const
    render: Callable[[Any], str] | None = None  # the value as its type reads it back

    @property
    def name(self) -> str:
        return self.names[0]


def flag(*names: str, default: Any = MISSING, default_factory: Any = MISSING, help: str,
         render: Callable[[Any], str] | None = None, **kwargs: Any) -> Any:
    """A dataclass field set by the flag ``names[0]`` (aliases after it), with its default.

    ``kwargs`` are ``add_argument``'s (``type``, ``choices``, ``metavar``, ``action``...).
    ``action="store_true"`` needs ``default=False``; ``action="store_false"`` a flag such
    as ``--no-validate`` with ``default=True``. ``render`` writes a value as the flag's
    ``type`` reads it, where the plain rule (``a,b`` for lists, JSON for dicts) does not.
    """
    spec = Flag(tuple(names), help, kwargs, render)
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={"flag": spec})


def field_flags(cls: type) -> list[tuple[dataclasses.Field, Flag]]:
    """The fields of dataclass ``cls`` that a flag sets, in declaration order."""
    return [(f, f.metadata["flag"]) for f in dataclasses.fields(cls) if "flag" in f.metadata]


def field_default(f: dataclasses.Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    raise TypeError(f"field {f.name} has no default")


def add_fields(group: argparse._ArgumentGroup, cls: type,
               only: Sequence[str] | None = None, **overrides: dict) -> None:
    """Add the flags declared on ``cls``'s fields (or those named in ``only``, in that
    order) to ``group``, each with its field's default. ``overrides[field]`` replaces
    ``add_argument`` settings where one tool says or offers it differently
    (``backend={"choices": ...}``, ``compression={"help": ...}``)."""
    declared = {f.name: (f, spec) for f, spec in field_flags(cls)}
    for name in only if only is not None else list(declared):
        f, spec = declared[name]
        kwargs = {"help": spec.help, **spec.kwargs, **overrides.get(name, {})}
        group.add_argument(*spec.names, dest=f.name, default=field_default(f), **kwargs)


def _nested(f: dataclasses.Field) -> bool:
    """Whether ``f`` holds a dataclass of settings of its own (``allreduce.Config.sync``),
    whose fields a flat dictionary gives by their own names."""
    try:
        return dataclasses.is_dataclass(field_default(f))
    except TypeError:  # no default: a plain required field
        return False


def values_for(cls: type, ns: argparse.Namespace | dict) -> dict:
    """The values in ``ns`` of ``cls``'s fields (by field name), to build ``cls(**...)``."""
    d = vars(ns) if isinstance(ns, argparse.Namespace) else ns
    return {f.name: d[f.name] for f in dataclasses.fields(cls)
            if f.name in d and f.init and not _nested(f)}


def float_text(value: float) -> str:
    """``value`` as a flag's text: short where that reads back the same float, else exact."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(_text(v) for v in value)
    if isinstance(value, float):
        return float_text(value)
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def flag_argv(spec: Flag, value: Any, default: Any = MISSING) -> list[str]:
    """The words that give ``value`` to flag ``spec``: none where it is ``default``;
    ``store_true``/``store_false`` flags as the bare flag."""
    if value == default:
        return []
    if spec.kwargs.get("action") in ("store_true", "store_false"):
        return [spec.name]
    return [spec.name, spec.render(value) if spec.render else _text(value)]


def to_argv(cfg: Any) -> list[str]:
    """The command line that gives dataclass ``cfg``: each flagged field whose value is not
    its default, as its flag (nested dataclass fields included, as ``add_fields`` adds
    them; a nested value with a ``to_argv`` method, as ``commbench.strategies.Sync``,
    gives its own). ``store_true``/``store_false`` fields appear as the bare flag."""
    out: list[str] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out += value.to_argv() if hasattr(value, "to_argv") else to_argv(value)
            continue
        spec = f.metadata.get("flag")
        if spec is None:
            continue
        try:
            default = field_default(f)
        except TypeError:
            default = MISSING
        out += flag_argv(spec, value, default)
    return out


# -- what every tool shares -----------------------------------------------------------------

def step_timeout_help(what: str = "step") -> str:
    return (f"end the job, naming the stalled rank(s), when one {what} runs longer than "
            f"this on any rank; 0 = never; default: 300 s or 5x the slowest {what} so far, "
            "whichever is larger")


@dataclass
class ToolConfig:
    """What every tool's configuration carries: the backend, where records go, and the
    per-step deadline of ``commbench.watchdog`` (a tool without steps keeps the default)."""

    backend: str = flag("--backend", default="auto",
                        help="communication backend; auto = horovod under horovodrun, torch "
                             "under torchrun, mpi under mpirun")
    dist_backend: str = flag("--dist-backend", default="auto", choices=DIST_BACKENDS,
                             help="the torch backend's library: gloo, nccl, or auto = nccl "
                                  "where the tensors are on a CUDA device, gloo otherwise")
    output: str | None = flag("--output", default=None, metavar="FILE",
                              help="JSON Lines results file (default: results/<tool>-<time>-"
                                   "<backend>-np<N>.jsonl)")
    output_dir: str = "results"
    quiet: bool = flag("--quiet", default=False, action="store_true", help="no table on rank 0")
    step_timeout: float | None = flag("--step-timeout", default=None, metavar="SECONDS",
                                      type=nonneg_float, help=step_timeout_help())

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def device_request(self) -> DeviceRequest:
        """Where this tool's flags ask for its tensors: host memory, unless a tool with
        ``--device`` says otherwise (``commbench.comm.placement.decide`` answers)."""
        return DeviceRequest("cpu", why_host="this tool keeps its tensors there")


#: flags only rank 0 acts on (where it writes, whether it prints): ranks may differ in them
RANK0_ONLY_FIELDS = frozenset({"output", "output_dir", "quiet"})


def add_backend_flag(group: argparse._ArgumentGroup, backends: Iterable[str]) -> None:
    """``--backend``: ``auto`` or one of the communicator registry's names; and
    ``--dist-backend``, the torch backend's library."""
    add_fields(group, ToolConfig, ["backend", "dist_backend"],
               backend={"choices": ("auto", *backends)})


def add_output_group(p: argparse.ArgumentParser, tool: str) -> argparse._ArgumentGroup:
    """``--output`` and ``--quiet``, shared by every tool that writes records."""
    g = p.add_argument_group("output")
    add_fields(g, ToolConfig, ["output", "quiet"], output={
        "help": f"JSON Lines results file (default: results/{tool}-<time>-<backend>-np<N>.jsonl)"})
    return g


def add_step_timeout_flag(group: argparse._ArgumentGroup, what: str = "step") -> None:
    """``--step-timeout`` (``commbench.watchdog``), naming what one deadline covers."""
    add_fields(group, ToolConfig, ["step_timeout"],
               step_timeout={"help": step_timeout_help(what)})


def check_step_timeout(timeout: float | None, compute_s: float) -> None:
    """Refuse a deadline shorter than the compute a step replays by design."""
    if timeout and timeout <= compute_s:
        raise ConfigError(f"--step-timeout {timeout:g} s is not above the {compute_s:g} s of "
                          "compute every step replays (--compute-ms x --accum-steps); raise it "
                          "or use 0 for no deadline")


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


def check_output(cfg: ToolConfig) -> None:
    """``--output`` (or a file under the output folder) can be written."""
    out = Path(cfg.output) if cfg.output else Path(cfg.output_dir) / "x.jsonl"
    check_writable(out, "--output")


def check_dilation(device: str, trace: str | None = None, k: float | None = None,
                   under: str | None = None) -> None:
    """Refuse what time dilation (the launcher's ``--dilation K``, ``commbench.dilation``;
    ``k`` default this process's) cannot place: tensors on a GPU (no emulated cluster has
    one, and neither its kernels nor NCCL's transfers run K times slower) and
    ``--trace torch`` (torch.profiler's trace is on the wall clock, the records' intervals
    on emulated time). Nothing to refuse at K = 1. ``under``: how the message names the
    dilation (default ``--dilation K (COMMBENCH_DILATION=K)``)."""
    from commbench import dilation  # standard library only, as this module

    k = dilation.factor() if k is None else k
    if k == 1:
        return
    under = under or (f"--dilation {dilation.text(k)} "
                      f"({dilation.DILATION_ENV}={dilation.text(k)})")
    if trace == "torch":
        raise ConfigError(f"--trace torch under {under}: torch.profiler's trace runs on the "
                          "wall clock and the collectives placed in it on emulated time "
                          "(wall / K), so they would land in the wrong places; trace at "
                          "--dilation 1")
    if device == "cuda":
        raise ConfigError(f"--device cuda under {under}: no emulated cluster has GPUs, and "
                          "neither a GPU's kernels nor NCCL's transfers run K times slower; "
                          "run on the GPU at --dilation 1")


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value the last ``flag V`` or ``flag=V`` in ``argv`` gives (argparse's rule: the
    last one wins); None where the flag is not there."""
    value = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(flag + "="):
            value = a[len(flag) + 1:]
    return value


def check_dilated_argv(argv: Sequence[str], k: float, under: str | None = None) -> None:
    """``check_dilation``'s ``--trace torch`` on a tool's command line before it is launched
    (a sweep's point, an experiment's job), so that a planned run refuses up front, not
    when its first job starts. ``--device cuda`` is left to the tool: whether its tensors
    reach the GPU depends on its workload (replayed compute keeps them in host memory)."""
    check_dilation("cpu", flag_value(argv, "--trace"), k, under)


@dataclass
class StepCount:
    """How many steps a tool with a step loop runs: ``--steps`` measured after
    ``--warmup`` (recorded, flagged, left out of summaries)."""

    steps: int = flag("--steps", default=20, type=positive_int, help="measured steps per run")
    warmup: int = flag("--warmup", default=3, type=nonneg_int,
                       help="warm-up steps before them (recorded, flagged, excluded from "
                            "summaries)")


#: former ``--strategy`` values that are tools of their own now (name -> the tool's module),
#: so that ``--strategy NAME`` and a sweep that sets it can say where they went
MOVED_STRATEGIES = {"ps": "commbench.ps"}  # the parameter server runs its own loops


def same_flag(cls: type, name: str, default: Any = MISSING) -> Any:
    """Field ``name`` of dataclass ``cls``, flag and all, for another configuration that
    takes the same flag (with its own ``default``, or ``cls``'s): the flag is still
    declared once, where ``cls`` owns it."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    if default is MISSING:
        return dataclasses.field(default=f.default, default_factory=f.default_factory,
                                 metadata=f.metadata)
    return dataclasses.field(default=default, metadata=f.metadata)
