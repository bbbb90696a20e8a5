"""Published scaling results and the inputs a prediction of them needs, read from TOML.

Issue 48's published checks: a prediction of a published scaling efficiency
is only a check if every input it rests on was fixed, with its source, before
the first prediction. Each file in this folder is one published result set
(``horovod_512.toml``: Horovod's 90 / 90 / 68 % at 512 GPUs), with:

- ``[published]``: the source, the GPU count and one ``[[published.check]]``
  per model (``model``, its ``model_kwargs`` for ``commbench.models``, and
  the published ``efficiency``); ``[[earlier]]`` further published points;
- ``[inputs...]``: every input, one table each, nested by topic
  (``inputs.cycle_time``, ``inputs.model.vgg16.step_compute``), each with a
  ``value`` (number or text), its ``unit``, its ``source`` (a URL or a
  document and section; ``"no source found..."`` where none was, then a
  ``note`` gives the assumption and why), ``uncertain`` (varied by the file's
  ``vary``, +-20 %, to make the prediction's band) and an optional ``note``.

This module only reads and checks the form, with the standard library (so
``analysis/`` stays free of torch): it predicts nothing. The advisor reads
the inputs through :func:`load`::

    >>> from analysis.published import HOROVOD_512, load
    >>> pub = load(HOROVOD_512)
    >>> [(c.model, c.efficiency) for c in pub.checks]
    [('resnet101', 0.9), ('inception_v3', 0.9), ('vgg16', 0.68)]
    >>> pub.input("cycle_time").value, pub.input("cycle_time").unit
    (5.0, 'ms')
    >>> round(pub.input("model.vgg16.step_compute").band(pub.vary)[1], 4)  # +20 %
    0.5867
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.9 and 3.10: the same parser, published as tomli
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
HOROVOD_512 = HERE / "horovod_512.toml"
SCHEMA = 1
#: how a ``source`` says that none was found (a ``note`` must then give the assumption)
NO_SOURCE = "no source found"
_INPUT_KEYS = {"value", "unit", "source", "uncertain", "note"}


class PublishedError(ValueError):
    """A file that is not a valid published-results file; the message names the file and
    the key."""


@dataclass(frozen=True)
class Input:
    """One input of a prediction, with where it comes from."""

    key: str  # dotted, below [inputs]: "model.vgg16.step_compute"
    value: float | int | str
    unit: str
    source: str
    uncertain: bool = False
    note: str = ""

    @property
    def sourced(self) -> bool:
        """Whether a source was found (else ``note`` holds the assumption)."""
        return not self.source.lower().startswith(NO_SOURCE)

    def band(self, vary: float) -> tuple[float, float]:
        """``(low, high)``: the value +-``vary`` where it is uncertain, else the value
        twice; ValueError for a text value."""
        if isinstance(self.value, str):
            raise ValueError(f"input {self.key} is text ({self.value!r}), it has no band")
        if not self.uncertain:
            return float(self.value), float(self.value)
        return self.value * (1 - vary), self.value * (1 + vary)


@dataclass(frozen=True)
class Check:
    """One published figure a prediction is held against."""

    model: str  # a commbench.models name
    gpus: int
    efficiency: float  # as a fraction: 0.9 for 90 %
    model_kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class PublishedSet:
    """A published result set: its checks and every input, by dotted key."""

    name: str
    path: Path
    vary: float
    source: str
    checks: tuple[Check, ...]
    inputs: dict[str, Input]
    earlier: tuple[dict, ...] = ()

    def input(self, key: str) -> Input:
        """The input ``key`` (dotted, below ``[inputs]``); KeyError naming those there are."""
        try:
            return self.inputs[key]
        except KeyError:
            raise KeyError(f"{self.path.name} has no input {key!r}; it has "
                           f"{', '.join(self.inputs)}") from None

    def model_inputs(self, model: str) -> dict[str, Input]:
        """The inputs under ``inputs.model.<model>``, by their last name (``step_compute``)."""
        prefix = f"model.{model}."
        return {k[len(prefix):]: v for k, v in self.inputs.items() if k.startswith(prefix)}


def load(path: str | Path = HOROVOD_512) -> PublishedSet:
    """Read and check a published-results file; PublishedError naming the file and key."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise PublishedError(f"{path}: cannot read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise PublishedError(f"{path}: not TOML: {e}") from None

    def need(table: Mapping, key: str, kind: type | tuple[type, ...], where: str):
        v = table.get(key)
        if not isinstance(v, kind) or isinstance(v, bool) and bool not in _kinds(kind):
            raise PublishedError(f"{path.name}: {where}{key} must be "
                                 f"{_kind_name(kind)}, got {v!r}")
        return v

    if doc.get("schema") != SCHEMA:
        raise PublishedError(f"{path.name}: schema must be {SCHEMA}, got {doc.get('schema')!r}")
    vary = need(doc, "vary", (int, float), "")
    if not 0 < vary < 1:
        raise PublishedError(f"{path.name}: vary must be a fraction in (0, 1), got {vary}")
    pub = need(doc, "published", dict, "")
    gpus = need(pub, "gpus", int, "published.")
    checks = []
    for i, c in enumerate(need(pub, "check", list, "published.")):
        where = f"published.check[{i}]."
        eff = need(c, "efficiency", (int, float), where)
        if not 0 < eff <= 1:
            raise PublishedError(f"{path.name}: {where}efficiency must be a fraction in "
                                 f"(0, 1], got {eff}")
        checks.append(Check(need(c, "model", str, where), gpus, float(eff),
                            dict(c.get("model_kwargs", {}))))
    if not checks:
        raise PublishedError(f"{path.name}: published.check lists no figure to check")
    inputs: dict[str, Input] = {}
    _walk(path, need(doc, "inputs", dict, ""), "", inputs)
    return PublishedSet(name=str(doc.get("name", path.stem)), path=path, vary=float(vary),
                        source=need(pub, "source", str, "published."), checks=tuple(checks),
                        inputs=inputs, earlier=tuple(doc.get("earlier", ())))


def _walk(path: Path, table: Mapping, prefix: str, out: dict[str, Input]) -> None:
    """Collect every table holding a ``value`` as an Input; anything else must be tables."""
    if "value" in table:
        out[prefix] = _input(path, prefix, table)
        return
    for key, sub in table.items():
        if not isinstance(sub, dict):
            raise PublishedError(f"{path.name}: inputs.{prefix}{'.' if prefix else ''}{key} is "
                                 "neither an input (a table with value, unit and source) nor "
                                 "a table of inputs")
        _walk(path, sub, f"{prefix}.{key}" if prefix else key, out)


def _input(path: Path, key: str, t: Mapping) -> Input:
    where = f"{path.name}: inputs.{key}"
    extra = set(t) - _INPUT_KEYS
    if extra:
        raise PublishedError(f"{where}: unknown key {', '.join(sorted(extra))} (an input has "
                             f"{', '.join(sorted(_INPUT_KEYS))})")
    value = t["value"]
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise PublishedError(f"{where}: value must be a number or text, got {value!r}")
    for k in ("unit", "source"):
        if not isinstance(t.get(k), str) or not t[k].strip():
            raise PublishedError(f"{where}: {k} is missing (every input says its {k})")
    uncertain = t.get("uncertain", False)
    if not isinstance(uncertain, bool):
        raise PublishedError(f"{where}: uncertain must be true or false, got {uncertain!r}")
    if uncertain and isinstance(value, str):
        raise PublishedError(f"{where}: a text value cannot be varied (uncertain = true)")
    note = t.get("note", "")
    if not isinstance(note, str):
        raise PublishedError(f"{where}: note must be text")
    inp = Input(key, value, t["unit"], t["source"], uncertain, note)
    if not inp.sourced and not note.strip():
        raise PublishedError(f"{where}: no source found, so a note must give the assumption "
                             "and why")
    return inp


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "text", dict: "a table",
             list: "an array of tables"}
    return " or ".join(dict.fromkeys(names.get(k, k.__name__) for k in _kinds(kind)))
