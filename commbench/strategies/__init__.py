"""Synchronisation strategies, registered by name (one module each) with their settings.

A new strategy is one module with a ``Strategy`` subclass and its frozen settings
class (a ``CommonSettings``, whose fields declare the flags that set them), plus one line
in ``STRATEGIES``; ``SETTINGS`` registers the settings class beside it. Every strategy is
built the same way, from the communicator, the gradients and its settings. A strategy
imports no tool and no workload (``tests/test_import_contract.py``); the parameter
server, which runs its own loops rather than a step's sync, is a tool:
``python -m commbench.ps``.

A job's command line sets every strategy's flags at once: ``Sync`` holds each flag's
value once (``--transfer`` is bucketed's and async's) and builds each strategy's settings
from them (``Sync.settings``). A planner gives ``commbench.allreduce.Config`` its
strategies' settings objects (``Config(strategies=["bucketed"],
sync=BucketedSettings(bucket_mb=5))``), which it reads as a ``Sync``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from commbench import flags
from commbench.comm.base import Communicator
from commbench.strategies.asynchronous import AsyncSettings, AsyncStrategy
from commbench.strategies.base import Strategy
from commbench.strategies.bucketed import BucketedSettings, BucketedStrategy
from commbench.strategies.flat import FlatSettings, FlatStrategy
from commbench.strategies.fsdp import FSDPSettings, FSDPStrategy
from commbench.strategies.hierarchical import HierarchicalStrategy
from commbench.strategies.hsdp import HsdpSettings, HsdpStrategy
from commbench.strategies.peers import DDPSettings, DDPStrategy, HorovodSettings, HorovodStrategy
from commbench.strategies.settings import CommonSettings, EngineSettings
from commbench.strategies.tuner import BucketTuner
from commbench.strategies.zero import (
    Zero1Settings,
    Zero1Strategy,
    Zero2Settings,
    Zero2Strategy,
    ZeroSettings,
)
from commbench.strategies.zero3 import Zero3Settings, Zero3Strategy

STRATEGIES: dict[str, type[Strategy]] = {
    "flat": FlatStrategy,
    "bucketed": BucketedStrategy,
    "hierarchical": HierarchicalStrategy,
    "horovod": HorovodStrategy,  # hvd.DistributedOptimizer on the workload's model
    "ddp": DDPStrategy,  # torch DistributedDataParallel on Gloo
    "async": AsyncStrategy,  # bounded staleness s (module asynchronous: async is a keyword)
    "zero1": Zero1Strategy,  # ZeRO-1: optimizer state sharded (module zero)
    "zero2": Zero2Strategy,  # ZeRO-2: gradients sharded too
    "zero3": Zero3Strategy,  # ZeRO-3/FSDP: parameters sharded at rest, gathered per unit
    "hsdp": HsdpStrategy,  # ZeRO-2 inside each node, the shards all-reduced across nodes
    "fsdp": FSDPStrategy,  # torch's FSDP2 (fully_shard) on the torch backend
}

#: each strategy's settings class, beside it (its ``settings_class``)
SETTINGS: dict[str, type[CommonSettings]] = {
    name: cls.settings_class for name, cls in STRATEGIES.items()}

#: the strategies' flags of ``commbench.allreduce`` (by field name), in the order its help
#: lists them and records carry them
SYNC_FLAGS = ("compression", "bucket_mb", "first_bucket_mb", "progress", "transfer",
              "staleness", "staleness_lr", "staleness_warmup", "accum_steps", "prefetch",
              "reduce_scatter_group", "reshard_root")

#: each flag's owner: the first registered settings class with the field, which declares it
#: (another that reads the same flag takes its field with ``flags.same_flag``)
FLAG_OWNERS: dict[str, type[CommonSettings]] = {
    name: next(cls for cls in SETTINGS.values() if name in cls.flag_fields())
    for name in SYNC_FLAGS}

#: each flag's one default
FLAG_DEFAULTS: dict[str, Any] = {
    name: flags.field_default({f.name: f for f in dataclasses.fields(cls)}[name])
    for name, cls in FLAG_OWNERS.items()}


def settings_class(name: str) -> type[CommonSettings]:
    """The settings class of strategy ``name``; a ValueError lists the strategies."""
    if name not in SETTINGS:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    return SETTINGS[name]


def settings_for(name: str, **fields: Any) -> CommonSettings:
    """Strategy ``name``'s settings with ``fields`` (``settings_for("bucketed",
    bucket_mb=5)``); a field its class has not is a TypeError, a bad value a ValueError
    naming the flag."""
    return settings_class(name)(**fields)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass(frozen=True, init=False)
class Sync:
    """The strategies' settings of one job, as its command line gives them
    (``commbench.allreduce.Config.sync``): each strategy flag's value once, by field name
    (``values``, in ``SYNC_FLAGS`` order; ``sync.bucket_mb`` reads one), from which each
    strategy's settings are built (``settings``).

    Built from settings objects (the values they set away from their defaults; two that
    set one flag differently are a ValueError), flag values by field name (which replace
    theirs), or both; the rest keep their defaults::

        Sync(BucketedSettings(bucket_mb=5))           # --bucket-mb 5
        Sync(AsyncSettings(staleness=2), transfer="ring")
        Sync(bucket_mb=5, staleness=2)

    Each value is checked by the class that declares its flag (a ValueError names it);
    what one strategy refuses (Horovod has no bf16) when its settings are built.
    """

    values: dict[str, Any]

    def __init__(self, *settings: CommonSettings, **values: Any) -> None:
        unknown = [name for name in values if name not in SYNC_FLAGS]
        if unknown:
            raise TypeError(f"Sync: {', '.join(map(repr, unknown))} sets no strategy's flag; "
                            f"the flags' fields are {', '.join(SYNC_FLAGS)}")
        given: dict[str, Any] = {}
        for s in settings:
            if not isinstance(s, CommonSettings):
                raise TypeError(f"Sync takes strategies' settings, not {type(s).__name__}")
            for name in type(s).flag_fields():
                value = getattr(s, name)
                if value == FLAG_DEFAULTS[name]:
                    continue
                if name in given and given[name] != value:
                    raise ValueError(f"{_flag(name)}: the settings give both {given[name]!r} "
                                     f"and {value!r}; a job has one")
                given[name] = value
        given.update(values)
        merged = {name: given.get(name, FLAG_DEFAULTS[name]) for name in SYNC_FLAGS}
        for owner in dict.fromkeys(FLAG_OWNERS.values()):  # each declaring class checks
            owner(**{name: merged[name] for name in owner.flag_fields()})
        object.__setattr__(self, "values", merged)

    def __getattr__(self, name: str) -> Any:
        """A flag's value by its field name: ``sync.bucket_mb``."""
        values = self.__dict__.get("values")
        if values is None or name not in values:
            raise AttributeError(f"{type(self).__name__} has no {name!r}; its flags' fields "
                                 f"are {', '.join(SYNC_FLAGS)}")
        return values[name]

    def settings(self, name: str, **fields: Any) -> CommonSettings:
        """Strategy ``name``'s settings: its class (``SETTINGS``) built from the values of
        the flags that apply to it, and ``fields`` (the per-run ``algo`` and
        ``broadcast_buffers``). A ValueError names a flag the strategy refuses."""
        cls = settings_class(name)
        return cls(**{n: self.values[n] for n in cls.flag_fields()}, **fields)

    def for_run(self, name: str, algo: str | None, buffers: str) -> CommonSettings:
        """Strategy ``name``'s settings for one run: its ``--algo`` and its ``--buffers``
        rule."""
        return self.settings(name, algo=algo or "native",
                             broadcast_buffers=buffers == "broadcast")

    def to_argv(self) -> list[str]:
        """The flags that give these values: those away from their defaults."""
        out: list[str] = []
        for name in SYNC_FLAGS:
            f = {f.name: f for f in dataclasses.fields(FLAG_OWNERS[name])}[name]
            out += flags.flag_argv(f.metadata["flag"], self.values[name], FLAG_DEFAULTS[name])
        return out

    @staticmethod
    def add_flags(group: argparse._ArgumentGroup) -> None:
        """Add every strategy flag to ``group``, each from the class that declares it."""
        for name in SYNC_FLAGS:
            flags.add_fields(group, FLAG_OWNERS[name], [name])

    @classmethod
    def of(cls, sync: Sync | CommonSettings | Sequence[CommonSettings] | None) -> Sync:
        """``sync`` as a ``Sync``: itself, or one built from a settings object or several
        (None: every default)."""
        if isinstance(sync, Sync):
            return sync
        if sync is None:
            return cls()
        if isinstance(sync, CommonSettings):
            return cls(sync)
        return cls(*sync)


def make_strategy(name: str, comm: Communicator, grads: Sequence[torch.Tensor],
                  settings: CommonSettings | None = None, *,
                  backward_order: Sequence[int] | None = None, workload: Any = None,
                  **fields: Any) -> Strategy:
    """Build strategy ``name`` from ``settings`` (an instance of ``SETTINGS[name]``;
    default: its defaults); ``fields`` given by keyword (``bucket_mb=5``) replace those of
    ``settings`` (a name that is no field of the strategy's settings class is a TypeError).
    Whoever builds a strategy closes it."""
    cls = settings_class(name)
    settings = replace(settings, **fields) if settings is not None else cls(**fields)
    return STRATEGIES[name](comm, grads, settings, backward_order=backward_order,
                            workload=workload)


__all__ = ["FLAG_OWNERS", "SETTINGS", "STRATEGIES", "SYNC_FLAGS", "AsyncSettings",
           "BucketTuner", "BucketedSettings", "CommonSettings", "DDPSettings",
           "EngineSettings", "FSDPSettings", "FlatSettings", "HorovodSettings", "HsdpSettings",
           "Strategy", "Sync", "Zero1Settings", "Zero2Settings", "Zero3Settings",
           "ZeroSettings", "make_strategy", "settings_class", "settings_for"]
