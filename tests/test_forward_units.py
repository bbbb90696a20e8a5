"""Forward unit by unit: a model's units, their forward times in a profile (written, then
read by every reader), the replay that calls each unit's module at its time, and the
profiles recorded before units, which still load and say what they lack."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from analysis import advise, match, overlap
from commbench import profile
from commbench.allreduce import parse_config
from commbench.models import build_model
from commbench.models.flops import flop_profile
from commbench.models.units import ROOT, model_units, parameter_units, unit_names
from commbench.profilefile import Unit, lacks, read
from commbench.timing import StepTimer, now
from commbench.workloads import RealWorkload, SyntheticWorkload, make_workload
from commbench.workloads.compute_profile import load
from commbench.workloads.synthetic import forward_plan
from tests.conftest import ROOT as REPO

pytestmark = pytest.mark.usefixtures("one_torch_thread")

R50 = REPO / "profiles" / "h200-resnet50-b256.json"


# --- units ----------------------------------------------------------------------------------

@pytest.mark.parametrize("model,units", [
    ("resnet18", [f"layer{s}.{b}" for s in range(1, 5) for b in range(2)]),
    ("resnet50", [f"layer{s}.{b}" for s, n in zip(range(1, 5), (3, 4, 6, 3))
                  for b in range(n)]),
    ("gpt-tiny", ["transformer.h.0", "transformer.h.1"]),
    ("commbench.models.heldout_vit:vit", [f"blocks.{b}" for b in range(6)]),
    ("vgg16", []),  # its lists hold single layers
    ("smallcnn", []),
    ("inception_v3", []),  # its modules are attributes, in no list
])
def test_units_are_the_top_level_blocks(model, units):
    names, home = model_units(model)
    assert names == units
    for name, unit in home.items():  # a parameter is its unit's, else the root's
        assert unit == next((u for u in units if name.startswith(u + ".")), ROOT), name


def test_a_parameter_tied_across_units_is_the_roots():
    net = torch.nn.Module()
    net.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(2, 2))
                                     for _ in range(2))
    net.blocks[1][0].weight = net.blocks[0][0].weight
    assert unit_names(net) == ["blocks.0", "blocks.1"]
    assert parameter_units(net) == {"blocks.0.0.weight": ROOT, "blocks.0.0.bias": "blocks.0",
                                    "blocks.1.0.bias": "blocks.1"}
    _, home = model_units("gpt-tiny")  # the embedding, tied to the output layer
    assert home["transformer.wte.weight"] == ROOT


def test_forward_plan_cuts_the_chain_between_root_and_units():
    # parameters 0: stem (root), 1 and 2: unit a, 3: unit b, 4: head (root)
    unit_of = [ROOT, "a", "a", "b", ROOT]
    assert forward_plan([0, 1, 2, 3, 4], unit_of, ["a", "b", "c"]) == [
        (ROOT, [0]), ("a", [1, 2]), ("b", [3]), (ROOT, [4]), ("c", [])]
    assert forward_plan([0, 3], unit_of, ["a", "b"]) == [(ROOT, [0]), ("a", []), ("b", [3])]
    # backward does not keep a's gradients together, or runs b's before a's: no cut keeps
    # both orders, so the root applies the chain and the units only wait
    for chain in ([1, 3, 2], [3, 1]):
        assert forward_plan(chain, unit_of, ["a", "b"]) == [(ROOT, chain), ("a", []), ("b", [])]


# --- the replay -----------------------------------------------------------------------------

def with_units(path: Path, out: Path) -> Path:
    """The profile at ``path`` with made-up ``forward_units``: the root's own work in the
    first and last tenth of forward, each unit in turn in between, a gap after each."""
    d = json.loads(path.read_text(encoding="utf-8"))
    names = unit_names(build_model(d["model"], d["num_classes"], device="meta"))
    f = d["forward_s"]
    step = 0.8 * f / len(names)
    d["forward_units"] = [{"name": ROOT, "start_s": 0.0, "end_s": 0.95 * f}] + [
        {"name": n, "start_s": 0.1 * f + k * step, "end_s": 0.1 * f + (k + 0.8) * step}
        for k, n in enumerate(names)]
    out.write_text(json.dumps(d), encoding="utf-8")
    return out


def watch_units(net: torch.nn.Module, names: list[str]) -> list[tuple[str, str, float]]:
    """(``pre``/``post``, unit, when) of every forward hook on the units ``names``."""
    fired: list[tuple[str, str, float]] = []
    for n in names:
        m = net.get_submodule(n)
        m.register_forward_pre_hook(lambda _m, _a, n=n: fired.append(("pre", n, now())))
        m.register_forward_hook(lambda _m, _a, _o, n=n: fired.append(("post", n, now())))
    return fired


def replay_step(wl: SyntheticWorkload) -> tuple[float, list[int], object]:
    """One step of ``wl``: (when it began, the gradients' announced order, the sample)."""
    timer = StepTimer()
    timer.begin_step(0, False)
    t0 = now()
    wl.forward(timer)
    order: list[int] = []
    wl.backward(timer, order.append)
    return t0, order, timer.end_step()


def check_hooks_fire_once_per_unit_in_order(wl: SyntheticWorkload, prof: dict) -> None:
    """One replayed step of ``wl`` (replaying ``prof``) fires each unit's forward hooks
    once, in order, never before the unit's time, and backward is replayed as before."""
    units = wl.forward_units
    names = [u.name for u in units]
    fired = watch_units(wl.net, names)
    replay_step(wl)  # warm-up
    fired.clear()
    t0, order, sample = replay_step(wl)
    # the root's pre-hook, each unit's pre and post in turn, the root's post: once each
    assert [(e, n) for e, n, _ in fired] == [("pre", ROOT)] + [
        (e, n) for n in names[1:] for e in ("pre", "post")] + [("post", ROOT)]
    due = {("pre", u.name): u.start_s * wl.factor for u in units[1:]}
    due.update({("post", u.name): u.end_s * wl.factor for u in units})
    for e, n, t in fired:  # never before the unit's replayed time
        assert t - t0 >= due.get((e, n), 0.0) - 1e-3, (e, n)
    assert sample.forward_s == pytest.approx(wl.forward_s * wl.factor, rel=0.25)
    # backward is replayed as before: the profiled order, every gradient its constant
    index = {n: i for i, n in enumerate(wl.param_names)}
    assert order == [index[n] for n in prof["backward_order"]] == wl.backward_order
    for g, v in zip(wl.grads, wl.grad_values):
        assert float(g.min()) == float(g.max()) == pytest.approx(v)


def test_replay_runs_forward_unit_by_unit(tmp_path):
    """ResNet-50 at its H200 times with units made up: each unit's module is called once,
    in order, at its time, and carries its own parameters' part of the chain (backward
    keeps each bottleneck's gradients together)."""
    prof = load(with_units(R50, tmp_path / "r50.json"), "resnet50", 1000)
    wl = SyntheticWorkload("resnet50", 0, rank=0, profile=prof)
    assert [u.name for u in wl.forward_units] == [u["name"] for u in prof["forward_units"]]
    home = model_units("resnet50")[1]
    for u in prof["forward_units"][1:]:
        chain = wl.net.get_submodule(u["name"]).chain
        assert sorted(wl.param_names[i] for i in chain) == sorted(
            n for n, h in home.items() if h == u["name"])
    check_hooks_fire_once_per_unit_in_order(wl, prof)


def test_compute_scale_and_slow_rank_scale_the_units(tmp_path):
    prof = load(with_units(R50, tmp_path / "r50.json"), "resnet50", 1000)
    wl = SyntheticWorkload("resnet50", 0, rank=0, profile=prof, compute_scale=0.5, slow=2.0)
    assert wl.forward_units[1].start_s == pytest.approx(0.5 * prof["forward_units"][1]["start_s"])
    check_hooks_fire_once_per_unit_in_order(wl, prof)
    assert wl.factor == 2.0  # the hooks fired at the profile's own times: 0.5 x 2


def test_real_workload_runs_the_model_unit_by_unit():
    """``--workload real`` runs the model's own forward: each block's module is called, so
    hooks on the units fire there too, once each, in order."""
    wl = RealWorkload("gpt-tiny", rank=0, batch_size=2)
    names = [ROOT, *unit_names(wl.net)]
    fired = watch_units(wl.net, names)
    timer = StepTimer()
    timer.begin_step(0, False)
    wl.forward(timer)
    assert [(e, n) for e, n, _ in fired] == [("pre", ROOT)] + [
        (e, n) for n in names[1:] for e in ("pre", "post")] + [("post", ROOT)]


# --- a stall: a wait for sync inside forward or backward ------------------------------------

STALL_S = 0.03


def _stall_in(wl, module: torch.nn.Module, seconds: float = STALL_S) -> None:
    """Make ``module``'s forward wait ``seconds`` for sync first, as a sharded strategy's
    gather does (a stall nested in it counts once)."""
    def hook(_m, _a):
        with wl.stall(), wl.stall():
            time.sleep(seconds)
    module.register_forward_pre_hook(hook)


def test_a_stall_in_a_units_forward_is_sync_and_moves_the_rest_of_its_schedule(tmp_path):
    """The replay: a unit that waits for its parameters computes its whole profiled time
    after them (the units after it move later), and the wait is exposed sync, not
    forward compute."""
    prof = load(with_units(R50, tmp_path / "r50.json"), "resnet50", 1000)
    wl = SyntheticWorkload("resnet50", 0, rank=0, profile=prof, compute_scale=2.0)
    units = wl.forward_units
    middle = units[len(units) // 2]
    _stall_in(wl, wl.net.get_submodule(middle.name))
    fired = watch_units(wl.net, [middle.name, units[-1].name])
    replay_step(wl)  # warm-up
    fired.clear()
    t0, _, sample = replay_step(wl)
    assert wl.stalled_s == 0.0  # backward's: nothing waited there
    ends = {n: t - t0 for e, n, t in fired if e == "post"}
    for u in (middle, units[-1]):  # each ends its profiled time after the wait, or later
        assert ends[u.name] >= u.end_s * wl.factor + STALL_S - 1e-3, u.name
    assert sample.forward_s == pytest.approx(wl.forward_s * wl.factor, abs=STALL_S / 3)
    assert sample.exposed_sync_s >= STALL_S * 0.9


def test_the_real_workload_takes_a_stall_out_of_forward_compute():
    wl = RealWorkload("gpt-tiny", rank=0, batch_size=2)
    _stall_in(wl, wl.net.get_submodule(unit_names(wl.net)[0]))
    timer = StepTimer()
    timer.begin_step(0, False)
    t = now()
    wl.forward(timer)
    wall = now() - t
    assert wl.stalled_s == pytest.approx(STALL_S, abs=0.02)
    sample = timer.end_step()
    assert sample.forward_s == pytest.approx(wall - wl.stalled_s, abs=1e-3)
    assert sample.forward_s < wall - 0.9 * STALL_S


# --- the format: written, read by every reader ----------------------------------------------

def test_a_profile_with_units_round_trips_through_every_reader(tmp_path, capsys):
    path = tmp_path / "gpt.json"
    assert profile.main(["--model", "gpt-tiny", "--batch-size", "4", "--iters", "2",
                         "--warmup", "1", "-o", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "forward in 2 units and the root" in out and "commbench.profile: note" not in err
    raw = json.loads(path.read_text(encoding="utf-8"))
    p = read(path)  # commbench.profilefile: what every reader goes through
    assert [u.name for u in p.units] == [ROOT, "transformer.h.0", "transformer.h.1"]
    assert [Unit(**u) for u in raw["forward_units"]] == list(p.units)
    assert p.lacks == [] and "forward_units_missing" not in raw
    root, *units = p.units
    assert root.start_s <= units[0].start_s and units[-1].end_s <= root.end_s <= p.forward_s
    assert all(a.end_s <= b.start_s for a, b in zip(units, units[1:]))
    assert all(u.forward_s > 0 for u in p.units)
    # the replay's reader checks it against the model, and the replay runs it
    prof = load(path, "gpt-tiny", 1000)
    assert prof == raw
    scale = 0.04 / prof["forward_s"]  # 40 ms of forward: long beside the host's own work
    check_hooks_fire_once_per_unit_in_order(
        SyntheticWorkload("gpt-tiny", 0, rank=0, profile=prof, compute_scale=scale), prof)
    # the job's estimate, the analysis readers
    assert parse_config(["--model", "gpt-tiny", "--compute-profile", str(path)]
                        )._replayed_profile().units == p.units
    ov = overlap.load_profile(path)
    assert ov.units == p.units and ov.lacks == ()
    assert ov.scaled(0.5).units[1] == Unit(units[0].name, units[0].start_s / 2,
                                           units[0].end_s / 2)
    assert advise.profile_input(str(path), "gpt-tiny", 4).units == p.units
    assert match._profile_head(path) == ("gpt-tiny", "cpu", None, 1000, 4)


def test_units_a_model_lacks_are_refused(tmp_path):
    d = json.loads(with_units(R50, tmp_path / "r50.json").read_text(encoding="utf-8"))
    d["forward_units"][1]["name"] = "layer9.0"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d), encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.json times units that resnet50 does not have: "
                                         r"layer9\.0 \(its units: layer1\.0"):
        load(bad, "resnet50", 1000)


def test_a_unit_that_runs_twice_is_not_timed_and_the_profile_says_why(tmp_path):
    prof = profile.record("tests.models_for_tests:reused", batch_size=2, image_size=32,
                          input_shape=(8,), iters=1, warmup=1)
    assert "forward_units" not in prof
    path = tmp_path / "reused.json"
    path.write_text(json.dumps(prof), encoding="utf-8")
    (note,) = read(path).lacks
    assert "unit 'blocks.0' ran 2 times in one forward" in note
    assert load(path, "tests.models_for_tests:reused", 1000)["forward_units_missing"]


# --- profiles recorded before units ---------------------------------------------------------

@pytest.mark.parametrize("path", sorted((REPO / "profiles").glob("h200-*.json")),
                         ids=lambda p: p.name)
def test_a_profile_without_units_loads_and_says_what_it_lacks(path):
    p = read(path)
    assert p.units is None
    (note,) = p.lacks
    assert note.startswith("no per-unit forward times (forward_units: recorded before")
    assert "record the profile again" in note
    ov = overlap.load_profile(path)
    assert ov.units == () and ov.lacks == (note,)
    assert ov.scaled(0.5).lacks == (note,)


def test_the_replay_of_a_profile_without_units_is_as_before(capsys):
    path = REPO / "profiles" / "h200-resnet18-b64.json"
    cfg = parse_config(["--model", "resnet18", "--compute-profile", str(path),
                        "--compute-scale", "10"])  # 48 ms of forward
    wl = make_workload(cfg, 0, 1)
    assert f"commbench: note: {path}: no per-unit forward times" in capsys.readouterr().err
    make_workload(cfg, 0, 1, job_rank=1)
    assert capsys.readouterr().err == ""  # rank 0 says it
    assert wl.forward_units == []
    assert {type(m) for m in wl.net.modules()} == {type(wl.net), torch.nn.Module}
    fired = watch_units(wl.net, ["layer1.0"])
    _, order, sample = replay_step(wl)
    assert fired == [] and order == wl.backward_order
    assert sample.forward_s == pytest.approx(10 * read(path).forward_s, rel=0.25)


def test_a_flops_profile_says_it_times_no_unit():
    (note,) = lacks(flop_profile("resnet18", 2, 0.03, image_size=32))
    assert note.startswith("no per-unit forward times (forward_units: spread by FLOPs")
