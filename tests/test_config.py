import importlib
import subprocess
import sys

import pytest

from commbench.allreduce import Config, parse_config
from commbench.flags import ConfigError
from tests.conftest import PY, ROOT


def test_defaults():
    cfg = parse_config([])
    assert cfg.strategies == ["flat"] and cfg.algos == ["native", "ring"]
    assert cfg.backend == "auto" and cfg.model == "resnet50" and cfg.steps > 0
    assert cfg.as_dict() == Config.from_dict(cfg.as_dict()).as_dict()


def test_lists_and_values():
    cfg = parse_config(["--algo", "ring", "--model", "resnet18", "--steps", "7", "--warmup", "0",
                        "--compute-ms", "12.5", "--batch-size", "64", "--seed", "3"])
    assert (cfg.algos, cfg.model, cfg.steps, cfg.warmup, cfg.compute_ms, cfg.batch_size,
            cfg.seed) == (["ring"], "resnet18", 7, 0, 12.5, 64, 3)


def test_unwritable_outputs(tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match="--output.*not a directory"):
        parse_config(["--output", str(a_file / "sub" / "r.jsonl")])
    with pytest.raises(ConfigError, match="--output.*is a directory"):
        parse_config(["--output", str(tmp_path)])
    # a path whose parents do not exist yet is fine: they are made at the first record
    assert parse_config(["--output", str(tmp_path / "a" / "b" / "r.jsonl")]).output


def test_help_shows_groups_and_defaults():
    res = subprocess.run([PY, "-m", "commbench.allreduce", "--help"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert res.returncode == 0
    for text in ("synchronisation:", "workload:", "run:", "output:", "--strategy", "--algo",
                 "--backend", "--workload", "--model", "--batch-size", "--steps", "--warmup",
                 "--compute-ms", "--output", "--seed", "(default: 20)"):
        assert text in res.stdout, text


@pytest.mark.parametrize("tool", ["commbench.allreduce", "commbench.microbench", "commbench.ps",
                                  "commbench.staleness"])
def test_horovodrun_passes_every_flag_to_the_program(tool, monkeypatch):
    """horovodrun's own parser reads abbreviations of its options even after the
    program (``--timeline`` is ambiguous there); every flag of ours must reach the
    program unchanged, as it would on a user's command line."""
    launch = pytest.importorskip("horovod.runner.launch")
    parser = importlib.import_module(tool).build_parser()
    flags = [o for a in parser._actions for o in a.option_strings
             if o.startswith("--") and o != "--help" and o != "--timeline"]
    assert "--trace" in flags or tool != "commbench.allreduce"
    for flag in flags:
        argv = ["horovodrun", "-np", "2", "python", "-m", tool, flag, "1"]
        monkeypatch.setattr(sys, "argv", argv)
        args = launch.parse_args()
        assert args.command[-2:] == [flag, "1"], flag


def test_transformer_models_for_both_workloads():
    cfg = parse_config(["--model", "gpt2-small"])
    assert (cfg.workload, cfg.model) == ("synthetic", "gpt2-small")
    cfg = parse_config(["--workload", "real", "--model", "gpt-tiny"])
    assert cfg.image_size is None and "token sequences" in cfg.label()
    with pytest.raises(ConfigError, match="--dataset digits.*token ids"):
        parse_config(["--workload", "real", "--model", "gpt-tiny", "--dataset", "digits"])


def test_the_real_workload_is_called_real_and_resnet_still_works():
    """``--workload real`` runs any model for real; ``resnet``, its former name, is read as
    ``real`` (records say ``real`` since schema 3; the analysis reads both)."""
    assert parse_config(["--workload", "real"]).workload == "real"
    assert parse_config(["--workload", "resnet", "--model", "smallcnn"]).workload == "real"
    with pytest.raises(ConfigError, match="--workload.*synthetic, real"):
        parse_config(["--workload", "bert"])
