"""Every flag has one owner: a dataclass field that declares it, and its default.

- Each tool's parser takes every flag from a field (``commbench.flags.flag``), with that
  field's default: no flag default is written twice.
- No product module adds an argument by hand outside ``commbench/flags.py``.
- ``to_argv`` gives back the command line of a configuration: parsing it gives the same
  configuration (``experiments.claims`` plans jobs this way).
- ``--bucket-mb`` goes from the command line to the bucketed strategy's caps by field name.
- A strategy flag is declared once, on the settings class that owns it; a strategy that
  reads the same flag takes that field (``flags.same_flag``), default and all.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re

import pytest
import torch

from commbench import allreduce, microbench, profile, ps, staleness
from commbench.flags import Flag, ToolConfig, field_default, flag, to_argv
from commbench.strategies import (
    FLAG_OWNERS,
    SETTINGS,
    SYNC_FLAGS,
    AsyncSettings,
    BucketedSettings,
    Sync,
    make_strategy,
)
from tests.conftest import ROOT

TOOLS = {  # tool module -> its configuration
    allreduce: allreduce.Config,
    microbench: microbench.MicroConfig,
    ps: ps.PSConfig,
    staleness: staleness.StudyConfig,
    profile: profile.ProfileConfig,
}


def owner(cfg_cls: type, dest: str) -> dataclasses.Field:
    """The field of ``cfg_cls`` (or of a dataclass field of it) that ``dest`` sets."""
    fields = {f.name: f for f in dataclasses.fields(cfg_cls)}
    if dest in fields:
        return fields[dest]
    if "sync" in fields:  # allreduce.Config: the strategies' flags are their settings'
        return owner(FLAG_OWNERS[dest], dest)
    raise AssertionError(f"{cfg_cls.__name__} has no field {dest!r}")


def flag_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


@pytest.mark.parametrize("tool", TOOLS, ids=lambda m: m.__name__)
def test_every_flag_is_declared_on_a_field_with_its_default(tool):
    cfg_cls = TOOLS[tool]
    actions = flag_actions(tool.build_parser())
    assert actions
    for action in actions:
        f = owner(cfg_cls, action.dest)
        spec = f.metadata.get("flag")
        assert isinstance(spec, Flag), f"{action.option_strings}: {f.name} declares no flag"
        assert list(spec.names) == action.option_strings, action.option_strings
        assert action.default == field_default(f), \
            f"{action.option_strings}: parser default {action.default!r}, field's " \
            f"{field_default(f)!r}"


def test_no_argument_is_added_by_hand_in_the_workers():
    """Only ``commbench/flags.py`` calls ``add_argument``: a tool's flags are fields."""
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "commbench").rglob("*.py"))
            if p.name != "flags.py"
            for n, line in enumerate(p.read_text().splitlines(), 1)
            if re.search(r"\.add_argument\(", line)]
    assert hits == []


def test_a_flag_needs_a_default_or_a_factory_and_a_help():
    with pytest.raises(TypeError):
        flag("--x", default=1)  # no help: every flag says what it does

    @dataclasses.dataclass
    class C:
        x: int = flag("--x", default=1, help="x")
        y: list = flag("--y", default_factory=list, help="y")

    assert [field_default(f) for f in dataclasses.fields(C)] == [1, []]


@pytest.mark.parametrize("cfg", [
    allreduce.Config(strategies=["flat", "bucketed"], algos=["ring"], model="resnet18",
                     steps=4, warmup=1, compute_ms=12.5, slow_rank=(1, 1.23456789),
                     quiet=True, compute_scale=0.0123456789, step_timeout=1234567.5,
                     sync=(BucketedSettings(bucket_mb=5.0, compression="fp16"),
                           AsyncSettings(staleness=2, staleness_lr=True)),
                     model_kwargs={}, validate=False, trace="commbench"),
    allreduce.Config(workload="real", model="smallcnn", dataset="digits", image_size=32,
                     batch_size=16, lr=0.02, num_classes=10),
], ids=["synthetic", "real"])
def test_to_argv_gives_back_the_allreduce_configuration(cfg, tmp_path):
    argv = to_argv(cfg)
    assert "--bucket-mb" not in argv or argv[argv.index("--bucket-mb") + 1] == "5"
    parsed = allreduce.parse_config([*argv, "--output", str(tmp_path / "r.jsonl")])
    want = dataclasses.replace(cfg, output=str(tmp_path / "r.jsonl"))
    allreduce.resolve_defaults(want)
    assert parsed == want


def test_to_argv_gives_back_the_other_tools_configurations(tmp_path):
    out = ["--output", str(tmp_path / "r.jsonl")]
    micro = microbench.MicroConfig(minbytes=64 << 10, maxbytes=64 << 20, stepfactor=4,
                                   iters=3, sync_each=True, algos=["native", "ring"])
    assert microbench.parse_config([*to_argv(micro), *out]) == dataclasses.replace(
        micro, output=out[1])
    study = staleness.StudyConfig(staleness=[0, 2], mitigations=["none", "lr"], ps=False,
                                  steps=30)
    assert staleness.parse_study([*to_argv(study), *out]) == dataclasses.replace(
        study, output=out[1])
    assert to_argv(ToolConfig()) == []  # defaults are left out


def test_a_configuration_from_a_record_reads_as_from_the_command_line(tmp_path):
    """``Config.from_dict`` of a record's flat ``config`` (any schema) gives back the
    configuration: the strategies' settings by name, the former workload name read as
    today's, JSON lists as the tuples the flags give."""
    cfg = allreduce.parse_config(["--slow-rank", "1:2", "--bucket-mb", "5", "--output",
                                  str(tmp_path / "r.jsonl")])
    record = json.loads(json.dumps(cfg.as_dict()))  # as a results file holds it
    assert allreduce.Config.from_dict(record) == cfg
    assert allreduce.Config.from_dict(dataclasses.asdict(cfg)).sync.bucket_mb == 5.0
    old = {**record, "workload": "resnet"}  # schema 1 and 2
    assert allreduce.Config.from_dict(old).workload == "real"
    with pytest.raises(ValueError, match="--workload"):
        allreduce.Config(workload="bert")


def test_bucket_mb_reaches_the_buckets_by_field_name(tmp_path):
    cfg = allreduce.parse_config(["--strategy", "bucketed", "--bucket-mb", "0.001",
                                  "--first-bucket-mb", "0", "--output",
                                  str(tmp_path / "r.jsonl")])
    assert cfg.sync.bucket_mb == 0.001 and cfg.as_dict()["bucket_mb"] == 0.001
    settings = cfg.sync.for_run("bucketed", "native", "broadcast")
    assert isinstance(settings, BucketedSettings)
    assert settings.bucket_mb == 0.001 and settings.broadcast_buffers

    class One:  # a one-rank communicator: the buckets are formed, nothing is sent
        rank, size, name, supports_p2p, device_collectives = 0, 1, "one", True, False

    grads = [torch.zeros(1000) for _ in range(3)]  # 4000 B each, cap 1048 B: one per bucket
    with make_strategy("bucketed", One(), grads, settings) as s:
        assert s.bucket_mb == 0.001 and len(s.buckets) == 3


@pytest.mark.parametrize("bad,match", [
    ({"bucket_mb": -1.0}, "--bucket-mb"), ({"transfer": "nbc"}, "--transfer"),
    ({"progress": "spin"}, "--progress"), ({"staleness": 1.5}, "--staleness"),
    ({"accum_steps": 0}, "--accum-steps"), ({"compression": "int8"}, "--compression")])
def test_strategy_settings_are_checked_once_where_they_are_owned(bad, match):
    """A bad value is refused by the job's settings (``Sync``), as by the class that owns
    its flag."""
    with pytest.raises(ValueError, match=match):
        Sync(**bad)
    with pytest.raises(ValueError, match=match):
        FLAG_OWNERS[next(iter(bad))](**bad)


def test_each_strategy_flag_is_declared_once_with_one_default():
    """Every field a flag sets on any strategy's settings class is one of ``SYNC_FLAGS``;
    classes that read the same flag share its one declaration (names, help, default); the
    tool's help lists them in ``SYNC_FLAGS`` order."""
    declared: dict[str, list] = {}
    for cls in SETTINGS.values():
        for f in dataclasses.fields(cls):
            if "flag" in f.metadata:
                declared.setdefault(f.name, []).append((f.metadata["flag"], field_default(f)))
    assert set(declared) == set(SYNC_FLAGS)
    for name, specs in declared.items():
        assert all(spec == specs[0] for spec in specs), name
    names = [list(declared[n][0][0].names) for n in SYNC_FLAGS]
    listed = [a.option_strings for a in flag_actions(allreduce.build_parser())]
    assert [o for o in listed if o in names] == names
