"""``python -m analysis.advise``: the ranking, its model inputs, its cluster, its refusals.

Single process and fast: the ranking is checked on a scenario whose best scheme is
worked out by hand; the table and figure are made from committed fixtures
(``tests/data/advise``: a tiny results folder the cost model fits, one that holds no fit,
and a small Kineto trace of one step in ``commbench.torchtrace``'s names); every bad
input is a ``python -m analysis.advise`` (forked by ``tests/forkrun.py``) that must exit
2 with one line naming the flag and write nothing.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from analysis import advise
from analysis.alphabeta import Params
from analysis.overlap import Profile
from commbench.buckets import MB
from tests.conftest import PY, ROOT

DATA = ROOT / "tests" / "data" / "advise"
TRACE = DATA / "step.pt.trace.json"
PROFILE = ROOT / "profiles" / "h200-resnet50-b256.json"
TIMEOUT = 120
#: the all-reduce families (the closed-form tests rank these; the sharded family apart)
ALLREDUCE = ("flat", "hierarchical", "bucketed")

# --- the ranking, in closed form ---------------------------------------------------------

A = 100e-6  # inter-node alpha, s
B = 0.8e-9  # inter-node beta, s/B (10 Gbit/s)
S = 4 * MB  # each gradient's bytes: S * B = 3.36 ms
FORWARD, BACKWARD = 0.010, 0.020


def two_gradients() -> Profile:
    """Two 4 MiB gradients, the first ready half-way through a 20 ms backward, the other
    at its end; forward 10 ms, no optimizer."""
    return Profile("two gradients", FORWARD, BACKWARD, 0.0, [S, S], [BACKWARD / 2, BACKWARD],
                   [0, 1])


def two_nodes_of_one() -> advise.Cluster:
    return advise.Cluster(1, Params(alpha_intra=0.0, beta_intra=0.0, alpha_inter=A,
                                    beta_inter=B, gamma=0.0, gamma_folded=False))


def test_the_ranking_is_the_closed_form_one():
    """2 nodes x 1 GPU, gamma 0: every message crosses the link (alpha a, beta b).

    After backward, one all-reduce of n = 2s: recursive doubling is one exchange of n,
    a + n b; ring, Rabenseifner, hier and hier-leader on 2 ranks are two steps, 2a + n b.
    Bucketed: the first bucket is capped at 1 MiB, so each 4 MiB gradient is a bucket of
    its own. Bucket 1 is full at B/2 and done before B (its cost, under 3.6 ms, is less
    than B/2 = 10 ms); bucket 2 starts at B, so the exposed sync is one bucket's cost:
    a + s b on the thread path (native: the cheapest, rd), 2a + s b on ring or hier.
    With a < s b (0.1 ms < 3.36 ms): bucketed on thread (a + s b) < bucketed on ring =
    on hier (2a + s b) < flat rd (a + 2 s b) < the four others (2a + 2 s b). The pick
    wins by a over the runner-up.
    """
    got = advise.advise(two_gradients(), two_nodes_of_one(), 2, ALLREDUCE, caps_mb=[25])
    names = [p.scheme for p in got.exact]
    compute = FORWARD + BACKWARD
    assert got.pick.scheme == "bucketed 25 MB on thread"
    assert got.pick.exposed_s == pytest.approx(A + S * B)
    assert got.pick.step_s == pytest.approx(compute + A + S * B)
    assert got.pick.efficiency == pytest.approx(compute / (compute + A + S * B))
    assert got.pick.sync_share == pytest.approx((A + S * B) / (compute + A + S * B))
    assert set(names[1:3]) == {"bucketed 25 MB on ring", "bucketed 25 MB on hier"}
    assert got.runner_up.step_s - got.pick.step_s == pytest.approx(A)
    assert names[3] == "flat rd"
    assert got.exact[3].exposed_s == pytest.approx(A + 2 * S * B)
    assert sorted(names[4:]) == ["flat rabenseifner", "flat ring", "hierarchical hier",
                                 "hierarchical hier-leader"]
    assert all(p.exposed_s == pytest.approx(2 * A + 2 * S * B) for p in got.exact[4:])


def test_a_margin_inside_the_models_error_is_called_a_tie():
    """On the closed-form scenario the pick beats bucketed on ring and on hier by a alone
    (0.1 ms of a 33.5 ms step, 0.3 %), flat rd by s b (9 %) and the other four by a + s b
    (9.4 %): at --tie-pct 1 the first two tie with it, at 10 every exact scheme does, at 0
    none; the tie line names them and asks for a measurement."""
    def tied(pct: float) -> list[str]:
        return [p.scheme for p in advise.advise(two_gradients(), two_nodes_of_one(), 2,
                                                ALLREDUCE, caps_mb=[25], tie_pct=pct).tied]

    assert sorted(tied(1)) == ["bucketed 25 MB on hier", "bucketed 25 MB on ring"]
    assert len(tied(10)) == 7 and tied(0) == []
    lines = advise.pick_lines(advise.advise(two_gradients(), two_nodes_of_one(), 2,
                                            ALLREDUCE, caps_mb=[25], tie_pct=1))
    assert "0.10 ms (0.3%) faster than the runner-up" in lines[1]
    assert lines[2].startswith("#   a tie: 2 other schemes within --tie-pct 1 % of its step")
    assert lines[2].endswith("measure them on your cluster before choosing")
    assert len(advise.pick_lines(advise.advise(two_gradients(), two_nodes_of_one(), 2,
                                               ALLREDUCE, caps_mb=[25], tie_pct=0))) == 2


def test_schemes_that_change_the_maths_are_apart_unless_asked_for():
    """On the same scenario: fp16 halves the bytes (a + s b / 2 on the best bucketed);
    accumulation over K divides the exposed sync by K; async at any S hides the whole
    all-reduce (a + 2 s b = 6.8 ms on thread, under the 30 ms compute)."""
    got = advise.advise(two_gradients(), two_nodes_of_one(), 2, caps_mb=[25])
    approx = {p.scheme: p for p in got.approximate}
    assert approx["fp16 wire, bucketed 25 MB on thread"].exposed_s == pytest.approx(
        A + S * B / 2)
    assert approx["accumulate 4, bucketed 25 MB on thread"].exposed_s == pytest.approx(
        (A + S * B) / 4)
    assert approx["async S=1 on thread"].exposed_s == 0
    assert got.pick.exact and all(not p.exact for p in got.approximate)
    loose = advise.advise(two_gradients(), two_nodes_of_one(), 2, caps_mb=[25],
                          allow_approximate=True)
    assert loose.pick.scheme == "async S=1 on thread"


def test_the_sharded_family_in_closed_form():
    """The same two nodes of one GPU. A reduce-scatter or all-gather of n bytes on 2 ranks is
    half a 2-rank ring all-reduce, a + n b / 2. zero2 (25 MB, so a bucket a gradient):
    the second bucket's reduce-scatter after backward, a + s b / 2, then the parameters'
    all-gather after the step, a + s b: 2a + 1.5 s b. hsdp: nothing to shard in a node of
    one, each bucket all-reduced across the two nodes, 2a + s b. No zero3 row: the profile
    times no forward unit. zero2's time is zero1's; neither builds on fp16 or accumulation
    (the sharded strategies refuse --compression)."""
    got = advise.advise(two_gradients(), two_nodes_of_one(), 2, caps_mb=[25, "auto"])
    rows = {p.scheme: p for p in got.exact if p.family == "sharded"}
    # auto is bucketed's alone
    assert set(rows) == {"zero2 25 MB", "zero2 25 MB topology-aware", "hsdp 25 MB"}
    assert rows["zero2 25 MB"].exposed_s == pytest.approx(2 * A + 1.5 * S * B)
    # a rank a node: the two levels are the cross-node one, the ring's
    assert rows["zero2 25 MB topology-aware"].exposed_s == pytest.approx(2 * A + 1.5 * S * B)
    assert rows["hsdp 25 MB"].exposed_s == pytest.approx(2 * A + S * B)
    assert got.pick.scheme == "bucketed 25 MB on thread"  # a + s b: the sharded lose here
    assert not any("zero" in p.scheme or "hsdp" in p.scheme for p in got.approximate)
    one_node = advise.advise(two_gradients(), advise.Cluster(2, two_nodes_of_one().params), 2,
                             ["sharded"], caps_mb=[25])
    assert [p.scheme for p in one_node.exact] == ["zero2 25 MB"]  # hsdp needs two nodes


def test_topology_aware_rows_cross_the_link_once_per_node():
    """2 nodes x 4 GPUs, the node's links free: a topology-aware reduce-scatter or
    all-gather is half the two-level all-reduce, whose one crossing carries n each way in
    two steps: a + n b / 2, as on two nodes of one GPU, so zero2's row is again
    2a + 1.5 s b; the ring's crosses the link at each of its 7 steps, 7a + 7/8 n b."""
    cluster = advise.Cluster(4, two_nodes_of_one().params)
    got = advise.advise(two_gradients(), cluster, 8, ["sharded"], caps_mb=[25])
    rows = {p.scheme: p for p in got.exact}
    assert rows["zero2 25 MB topology-aware"].exposed_s == pytest.approx(2 * A + 1.5 * S * B)
    assert rows["zero2 25 MB"].exposed_s == pytest.approx(14 * A + 7 / 8 * 3 * S * B)


def test_zero3_is_ranked_where_the_profile_times_its_units():
    """A profile with forward units gets the three zero3 rows, each the overlap model's
    ZeRO-3 schedule (analysis.sharded) at half a ring all-reduce per collective."""
    from analysis.sharded import zero3_step
    from commbench.profilefile import Unit

    prof = Profile("units", FORWARD, BACKWARD, 0.0, [S, S], [BACKWARD / 2, BACKWARD], [0, 1],
                   (Unit("", 0.0, FORWARD), Unit("a", 0.0, FORWARD / 2),
                    Unit("b", FORWARD / 2, FORWARD)), (), ("b.w", "a.w"))
    got = advise.advise(prof, two_nodes_of_one(), 2, ["sharded"], caps_mb=[25])
    rows = {p.scheme: p for p in got.exact}
    assert {"zero3 prefetch, shared", "zero3 prefetch, separate RS group",
            "zero3 no prefetch", "zero3 prefetch, shared, root kept"} <= set(rows)

    def half(n: float) -> float:
        return A + n * B / 2

    for name, kw in (("zero3 prefetch, shared", {}),
                     ("zero3 prefetch, separate RS group", {"separate": True}),
                     ("zero3 no prefetch", {"prefetch": False}),
                     ("zero3 prefetch, shared, root kept", {"reshard_root": False})):
        assert rows[name].exposed_s == pytest.approx(zero3_step(prof, half, half,
                                                                **kw).exposed_s)
    assert rows["zero3 no prefetch"].exposed_s > rows["zero3 prefetch, shared"].exposed_s


def test_async_is_bounded_by_the_link_whatever_the_staleness():
    """One gradient per step crosses the link: a 25 ms all-reduce under 10 ms of compute
    leaves 15 ms exposed at S = 1 and at S = 4; a 5 ms one is hidden from S = 1."""
    assert advise.async_exposed(0.010, 0.025, 1) == pytest.approx(0.015)
    assert advise.async_exposed(0.010, 0.025, 4) == pytest.approx(0.015)
    assert advise.async_exposed(0.010, 0.005, 1) == 0


def test_every_scheme_every_cap_at_eight_scales():
    """The full table at every scale (its speed is the command's last line, a figure, not a
    timed test: docs/analysis.md)."""
    prof = advise.profile_input(str(PROFILE), "resnet50", 256)
    flags = advise.ClusterFlags(8, link_gbps=100.0, latency_us=10.0)
    cluster = advise.cluster_params(flags, None, multi_node=True)
    tables = [advise.advise(prof, cluster, r) for r in (8, 16, 32, 64, 128, 256, 512, 1024)]
    assert all(len(t.exact) == rows_at(t.ranks, 8) for t in tables)


def rows_at(ranks: int, local: int) -> int:
    """The exact rows of the default table on a profile without units: flat's 3,
    hierarchical's 2, bucketed's 3 paths at each cap, zero2 at each numeric cap, zero2
    topology-aware and hsdp too where there are several nodes."""
    caps = len([c for c in advise.CAPS_MB if c != "auto"])
    return 3 + 2 + 3 * len(advise.CAPS_MB) + caps + (2 * caps if ranks > local else 0)


# --- tables from the committed fixtures ----------------------------------------------------

def run_advise(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "analysis.advise", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)


def exact_tables(text: str) -> dict[int, list[tuple[str, float]]]:
    """{ranks: [(scheme, step ms)]} of the exact rows of each scale's table."""
    out: dict[int, list[tuple[str, float]]] = {}
    ranks = 0
    for line in text.splitlines():
        if line.startswith("# ") and " ranks = " in line:
            ranks = int(line.split()[1])
            out[ranks] = []
        elif line.strip() and not line.startswith("#") and not line.split()[0].startswith("a"):
            head, step, _exposed, _share, _eff = line.rsplit(None, 4)
            out[ranks].append((head.split(None, 1)[1].strip(), float(step)))
    return out


def test_the_committed_fit_is_the_model_that_timed_it():
    """The fixture's times are ring formulas: intra 5 us + 1 ns/B on 4 ranks of one host,
    inter 50 us + 8 ns/B on 2 x 2 emulated nodes (dilation 4, alpha_us measured)."""
    params, emulated, _ = advise.fitted_params([str(DATA / "fit")])
    assert params.alpha_intra == pytest.approx(5e-6, rel=0.02)
    assert params.beta_intra == pytest.approx(1e-9, rel=0.02)
    assert params.beta_inter == pytest.approx(8e-9, rel=0.02)
    assert emulated


def test_table_and_figure_from_a_committed_fit(tmp_path):
    out = tmp_path / "advice"
    res = run_advise("--profile", PROFILE, "--fit-results", DATA / "fit", "--latency-us", 10,
                     "--ranks", "8,16,64", "-o", out)
    assert res.returncode == 0, res.stderr
    text = res.stdout
    for src in ("intra alpha fitted", "intra beta fitted", "inter alpha from --latency-us",
                "inter beta fitted"):
        assert src in text
    tables = exact_tables(text)
    assert sorted(tables) == [8, 16, 64]
    assert {"bucketed auto on thread", "bucketed 25 MB on hier"} <= {s for s, _ in tables[64]}
    for ranks, rows in tables.items():
        assert len(rows) == rows_at(ranks, 8)
        steps = [s for _, s in rows]
        assert steps == sorted(steps)
        assert f"# recommended at {ranks} ranks: {rows[0][0]}," in text
    # a profile recorded before units says what it lacks
    assert "# note: the profile has no per-unit forward times (forward_units: recorded " in text
    assert (out / "advise.txt").read_text() == text
    assert (out / "advise.png").stat().st_size > 10_000
    assert (out / "advise.svg").exists()


def test_a_commbench_trace_gives_its_phases_and_ready_times():
    """The fixture's step: forward 9.0 ms, backward from 1009.2 ms, the six AccumulateGrad
    calls ending 0.82 .. 17.94 ms into it, optimizer 1.5 ms (commbench.torchtrace's names)."""
    prof = advise.trace_profile(str(TRACE))
    assert prof.forward_s == pytest.approx(0.009)
    assert prof.optimizer_s == pytest.approx(0.0015)
    assert prof.backward_s == pytest.approx(0.01794)
    assert prof.ready_s == pytest.approx([0.00082, 0.00085, 0.00683, 0.00724, 0.01733, 0.01794])
    assert prof.nbytes == [40, 40960, 4096, 8388608, 8192, 16777216]


def _events() -> list[dict]:
    return json.loads(TRACE.read_text())["traceEvents"]


def _trace_of(path: Path, events: list[dict]) -> Path:
    """The fixture's trace with ``events`` in place of its own, written to ``path``."""
    doc = json.loads(TRACE.read_text())
    doc["traceEvents"] = events
    path.write_text(json.dumps(doc))
    return path


def test_a_plain_torch_profiler_trace_needs_no_commbench_ranges(tmp_path):
    """Without commbench's ranges and step: backward starts at autograd's first
    evaluate_function (1009.3 ms), forward at the trace's first event (1000.15 ms), the
    optimizer is torch's Optimizer.step# call (1.4 ms)."""
    ours = {"ProfilerStep#3", "forward", "backward", "sync", "optimizer", "commbench collective"}
    plain = _trace_of(tmp_path / "plain.json", [e for e in _events() if e.get("name") not in ours])
    prof = advise.trace_profile(str(plain))
    assert prof.forward_s == pytest.approx(0.00915)
    assert prof.optimizer_s == pytest.approx(0.0014)
    assert prof.backward_s == pytest.approx(0.01784)
    assert len(prof.nbytes) == 6


def test_an_unmarked_trace_of_two_steps_is_read_up_to_its_first_optimizer_step(tmp_path):
    """torch names steps (``ProfilerStep#k``) only under a profiler schedule: two unmarked
    steps are one trace, of which the first step (up to its Optimizer.step#) is read."""
    ours = {"ProfilerStep#3", "forward", "backward", "sync", "optimizer", "commbench collective"}
    one = [e for e in _events() if e.get("name") not in ours]
    two = one + [{**e, "ts": e["ts"] + 40000} for e in one if e.get("ph") == "X"]
    prof = advise.trace_profile(str(_trace_of(tmp_path / "two.json", two)))
    assert len(prof.nbytes) == 6
    assert prof.backward_s == pytest.approx(0.01784)


def test_table_and_figure_from_a_committed_trace(tmp_path):
    out = tmp_path / "advice"
    res = run_advise("--trace", TRACE, "--local-size", 4, "--ranks", "4,8,32",
                     "--link-gbps", 10, "--latency-us", 20, "-o", out)
    assert res.returncode == 0, res.stderr
    assert ("# model: step.pt.trace.json: forward 9.0 ms, backward 17.9 ms, optimizer 1.5 ms, "
            "25.2 MB gradient in 6 tensors") in res.stdout
    assert sorted(exact_tables(res.stdout)) == [4, 8, 32]
    assert (out / "advise.png").stat().st_size > 10_000


# --- a registered model and a step time: spread by FLOPs ------------------------------------

def test_model_compute_is_spread_by_flops_not_parameters():
    """ResNet-18's layer4 holds about three quarters of its parameters but about a
    quarter of its multiply-adds: backward reaches layer4's first convolution's gradient
    about a quarter of the way through (by parameters it would be three quarters)."""
    from commbench.models.flops import flop_profile

    prof = flop_profile("resnet18", 8, 0.090)
    grads = {g["name"]: g for g in prof["grads"]}
    numel = {n: math.prod(g["shape"]) for n, g in grads.items()}
    layer4 = sum(v for n, v in numel.items() if n.startswith("layer4.")) / sum(numel.values())
    assert layer4 > 0.6
    frac = grads["layer4.0.conv1.weight"]["ready_s"] / prof["backward_s"]
    assert 0.15 < frac < 0.35
    assert prof["forward_s"] == pytest.approx(0.030) and prof["backward_s"] == pytest.approx(0.060)
    assert prof["backward_order"][0].startswith("fc.")
    assert grads["conv1.weight"]["ready_s"] == pytest.approx(prof["backward_s"])


def test_model_and_compute_ms_on_the_command_line():
    res = run_advise("--model", "resnet18", "--compute-ms", 90, "--batch-size", 8,
                     "--schemes", "flat,bucketed", "--bucket-mb", 25)
    assert res.returncode == 0, res.stderr
    assert "# model: resnet18 batch 8, 90 ms spread by FLOPs" in res.stdout
    assert "# note: the profile has no per-unit forward times (forward_units: spread by FLOPs" \
        in res.stdout
    assert "# recommended at 8 ranks:" in res.stdout


# --- bad input ---------------------------------------------------------------------------

def _no_shapes(e: dict) -> dict:
    return {**e, "args": {}} if e.get("name") == advise.ACCUMULATE else e


BAD = [
    (["--profile", "{profile}", "--model", "resnet101"], "--model resnet101"),
    (["--profile", "{profile}", "--batch-size", "64"], "--batch-size 64"),
    (["--profile", "{profile}", "--nodes", "0"], "--nodes"),
    (["--profile", "{profile}", "--link-gbps", "-5"], "--link-gbps"),
    (["--profile", "{profile}", "--intra-gbps", "0"], "--intra-gbps"),
    (["--profile", "{profile}", "--latency-us", "0"], "--latency-us"),
    (["--profile", "{profile}", "--link-gbps", "10", "--ranks", "8,12"], "--ranks 12"),
    (["--profile", "{profile}", "--schemes", "flat,zero3"], "--schemes"),
    (["--profile", "{profile}", "--fit-results", "{data}/nofit"],
     "--fit-results", "commbench.microbench --algo ring"),
    (["--profile", "{profile}", "--fit-results", "{data}/fit", "--nodes", "2"],
     "--fit-results", "emulated", "--latency-us"),
    (["--profile", "{profile}", "--nodes", "2"], "--link-gbps"),
    (["--profile", "{profile}", "--trace", "{data}/step.pt.trace.json"], "--profile and --trace"),
    (["--nodes", "2", "--link-gbps", "10"], "--profile FILE"),
    (["--model", "resnet18"], "--compute-ms"),
    (["--model", "nosuchnet", "--compute-ms", "10"], "--model nosuchnet"),
    (["--trace", "{tmp}/noshapes.json"], "--trace", "record_shapes=True"),
    (["--trace", "{tmp}/nograds.json"], "--trace", "no gradient-ready events"),
    (["--profile", "{profile}", "--tie-pct", "-1"], "--tie-pct"),
    (["--profile", "{profile}", "--tie-pct", "much"], "--tie-pct"),
]


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory) -> list[tuple[SimpleNamespace, Path]]:
    """Every BAD case in its own directory (holding the two broken traces), forked by
    ``tests/forkrun.py`` from one process that imported analysis.advise."""
    dirs = []
    for i in range(len(BAD)):
        d = tmp_path_factory.mktemp(f"advise-bad{i}")
        _trace_of(d / "noshapes.json", [_no_shapes(e) for e in _events()])
        _trace_of(d / "nograds.json",
                  [e for e in _events() if "AccumulateGrad" not in str(e.get("name"))])
        dirs.append(d)
    lines = "".join(json.dumps({"module": "analysis.advise", "cwd": str(d), "timeout": TIMEOUT,
                                "args": [a.format(profile=PROFILE, data=DATA, tmp=d)
                                         for a in args] + ["-o", str(d / "out")]}) + "\n"
                    for (args, *_), d in zip(BAD, dirs))
    res = subprocess.run([PY, str(ROOT / "tests" / "forkrun.py"), "analysis.advise"],
                         input=lines, capture_output=True, text=True, cwd=str(ROOT),
                         timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
    answers = [SimpleNamespace(**json.loads(line)) for line in res.stdout.splitlines()]
    assert len(answers) == len(BAD), res.stderr
    return list(zip(answers, dirs))


@pytest.mark.parametrize("i", range(len(BAD)), ids=[" ".join(c[0]) for c in BAD])
def test_bad_input_exits_2_with_one_line_naming_the_flag(bad_runs, i):
    res, d = bad_runs[i]
    names = BAD[i][1:]
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("analysis.advise: error: "), res.stderr
    assert all(n in lines[0] for n in names), lines[0]
    assert not (d / "out").exists()  # no partial output
