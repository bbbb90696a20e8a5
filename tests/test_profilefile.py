"""The compute profile reader (``commbench.profilefile``): every committed profile reads,
its derived values agree with the file's own numbers, and bad files name themselves."""

from __future__ import annotations

import ast
import json
from functools import reduce
from pathlib import Path

import pytest

from commbench import profilefile
from commbench.profilefile import PROFILE_SCHEMA, ProfileError, read
from tests.conftest import ROOT

PROFILES = sorted((ROOT / "profiles").glob("*.json"))


def test_there_are_committed_profiles():
    assert len(PROFILES) >= 5


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_every_committed_profile_reads(path):
    d = json.loads(path.read_text(encoding="utf-8"))
    p = read(path)
    assert p.path == str(path) and p.raw == d
    assert (p.model, p.num_classes, p.batch_size, p.image_size, p.device) == (
        d["model"], d["num_classes"], d["batch_size"], d["image_size"], d["device"])
    assert [g.name for g in p.grads] == [g["name"] for g in d["grads"]]
    assert [list(g.shape) for g in p.grads] == [g["shape"] for g in d["grads"]]
    assert sorted(p.backward_order) == sorted(g.name for g in p.grads)
    # by hand: elements per gradient, multiplied out; the three phase times added
    params = 0
    for g in d["grads"]:
        params += reduce(lambda a, b: a * b, g["shape"], 1)
    assert p.params == params
    assert p.step_s == pytest.approx(d["forward_s"] + d["backward_s"] + d["optimizer_s"],
                                     rel=1e-12)
    assert all(0 <= g.ready_s <= p.backward_s * 1.01 for g in p.grads)


def test_known_sizes():
    """ResNet-50 has 25,557,032 parameters (torchvision), ResNet-18 11,689,512."""
    assert read(ROOT / "profiles/h200-resnet50-b256.json").params == 25_557_032
    assert read(ROOT / "profiles/h200-resnet18-b64.json").params == 11_689_512


def _good() -> dict:
    return {"schema": PROFILE_SCHEMA, "kind": "compute_profile", "model": "tiny",
            "forward_s": 0.003, "backward_s": 0.006, "optimizer_s": 0.001,
            "backward_order": ["b", "a"],
            "grads": [{"name": "a", "shape": [2, 3], "ready_s": 0.006},
                      {"name": "b", "shape": [], "ready_s": 0.001}]}


def test_a_minimal_profile(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(_good()))
    p = read(path)
    assert p.params == 7 and p.step_s == pytest.approx(0.010)
    assert (p.num_classes, p.batch_size, p.image_size, p.device) == (None,) * 4
    assert p.unused == () and p.backward_order == ("b", "a")
    assert p.units is None and p.lacks[0].startswith("no per-unit forward times")
    with pytest.raises(AttributeError):
        p.model = "other"  # frozen


def _bad(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _change(**kw) -> str:
    d = _good()
    for k, v in kw.items():
        if v is None:
            d.pop(k)
        else:
            d[k] = v
    return json.dumps(d)


@pytest.mark.parametrize("name,text,match", [
    ("notjson.json", "{not json", "cannot read .*notjson.json"),
    ("list.json", "[1, 2]", "list.json is not a compute profile"),
    ("result.json", json.dumps({"kind": "result", "schema": 1}),
     "result.json is not a compute profile"),
    ("schema2.json", _change(schema=2), "schema2.json has schema 2, this commbench reads 1"),
    ("noschema.json", _change(schema=None), "noschema.json has schema None"),
    ("nofwd.json", _change(forward_s=None), "nofwd.json .*no forward_s"),
    ("strtime.json", _change(backward_s="6 ms"), "strtime.json .*backward_s"),
    ("nograds.json", _change(grads=None), "nograds.json .*no grads"),
    ("shape.json", _change(grads=[{"name": "a", "shape": [2.5], "ready_s": 0},
                                  {"name": "b", "shape": [], "ready_s": 0}]), "shape.json"),
    ("order.json", _change(backward_order=["a"]), "order.json has a broken backward_order"),
    ("twice.json", _change(backward_order=["a", "a"]), "twice.json has a broken"),
    ("batch.json", _change(batch_size="64"), "batch.json .*batch_size"),
])
def test_bad_files_raise_profile_error_naming_the_file(tmp_path, name, text, match):
    with pytest.raises(ProfileError, match=match):
        read(_bad(tmp_path, name, text))


def test_a_missing_file_names_itself(tmp_path):
    with pytest.raises(ProfileError, match=r"cannot read .*absent\.json"):
        read(tmp_path / "absent.json")
    assert issubclass(ProfileError, ValueError)


def test_the_replay_and_analysis_readers_are_this_one(tmp_path):
    from analysis import match, overlap

    path = _bad(tmp_path, "bad.json", _change(schema=7))
    with pytest.raises(overlap.ModelError, match="bad.json has schema 7"):
        overlap.load_profile(path)
    assert match._profile_head(path) is None
    head = match._profile_head(ROOT / "profiles/h200-resnet50-b256.json")
    assert head == ("resnet50", "NVIDIA H200", 224, 1000, 256)


def test_the_workload_reexports_schema_and_error():
    pytest.importorskip("torch")
    from commbench.workloads import compute_profile

    assert compute_profile.PROFILE_SCHEMA is profilefile.PROFILE_SCHEMA
    assert compute_profile.ProfileError is profilefile.ProfileError


def test_the_reader_imports_only_the_standard_library():
    tree = ast.parse(Path(profilefile.__file__).read_text(encoding="utf-8"))
    mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
            for a in n.names}
    mods |= {n.module.split(".")[0] for n in ast.walk(tree)
             if isinstance(n, ast.ImportFrom) and n.module}
    assert mods <= {"__future__", "json", "math", "dataclasses", "pathlib"}, mods


UNITS = [{"name": "", "start_s": 0.0, "end_s": 0.003},
         {"name": "h.0", "start_s": 0.001, "end_s": 0.0015},
         {"name": "h.1", "start_s": 0.0015, "end_s": 0.0025}]


def test_a_profile_with_units(tmp_path):
    p = read(_bad(tmp_path, "units.json", _change(forward_units=UNITS)))
    assert p.units == (profilefile.Unit("", 0.0, 0.003), profilefile.Unit("h.0", 0.001, 0.0015),
                       profilefile.Unit("h.1", 0.0015, 0.0025))
    assert p.units[1].forward_s == pytest.approx(0.0005) and p.lacks == []
    why = read(_bad(tmp_path, "why.json", _change(forward_units_missing="a unit ran twice")))
    assert why.units is None
    assert why.lacks == ["no per-unit forward times (forward_units: a unit ran twice): forward "
                         "is one span, so its replay fires no unit's forward hooks"]
    with pytest.raises(ProfileError, match="forward_units_missing is 3"):
        read(_bad(tmp_path, "bad.json", _change(forward_units_missing=3)))


def _units(*changes: tuple[int, str, object]) -> list[dict]:
    units = [dict(u) for u in UNITS]
    for i, key, value in changes:
        if value is None:
            units[i].pop(key)
        else:
            units[i][key] = value
    return units


@pytest.mark.parametrize("units,match", [
    ("all", "forward_units is not a list of units"),
    ([], "forward_units is not a list of units"),
    (UNITS[1:], "forward_units does not start with the root unit"),
    (_units((1, "name", 7)), r"forward_units\[1\] has no name"),
    (_units((1, "name", "")), "forward_units names a unit twice"),
    (_units((2, "name", "h.0")), "forward_units names a unit twice"),
    (_units((1, "end_s", None)), "unit 'h.0': no end_s"),
    (_units((1, "start_s", -1)), "unit 'h.0': start_s is -1"),
    (_units((1, "end_s", 0.0005)), "unit 'h.0' ends before it starts"),
    (_units((2, "start_s", 0.0012)), "unit 'h.1' starts before unit 'h.0' ends"),
    (_units((0, "start_s", 0.0012), (0, "end_s", 0.003)), "unit 'h.0' starts before the root"),
    (_units((2, "end_s", 0.004)), "unit 'h.1' ends after the root unit"),
])
def test_bad_units_raise_profile_error_naming_the_file(tmp_path, units, match):
    with pytest.raises(ProfileError, match=f"units.json is not a compute profile: {match}"):
        read(_bad(tmp_path, "units.json", _change(forward_units=units)))
