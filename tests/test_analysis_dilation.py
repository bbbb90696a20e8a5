"""Time dilation and the host verdict in analysis/ (schema 4: ``dilation``, ``host``, ``bound``).

A run's dilation K is a set-up field, so runs at two K are never pooled; every matched
set is shown with its K and host verdict; claims that compare comm times prefer sets whose
runs were all link-bound and say so where they could not; the overlap model's error is
judged on link-bound runs. Records are made by hand (``tests/test_claims.py``'s summaries,
given schema 4 fields here) and the verdict strings by ``commbench.hostload.verdict``
itself. Pure Python: no process is started.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from analysis import claims, match, overlap, report
from commbench import hostload
from tests.test_claims import claim, ids_of
from tests.test_claims import run as summary  # named so: a call to run() marks a test a job
from tests.test_overlap_model import FIT, _record, _write_profile

#: 8 ranks on a core 20 % and waiting for one 75 % of the window, outside polling
HOST = hostload.verdict({"cpu_share": [0.2] * 8, "runq_share": [0.75] * 8,
                         "runq_share_median": 0.75})
LINK = hostload.verdict({"cpu_share": [0.02] * 8, "runq_share": [0.01] * 8,
                         "runq_share_median": 0.01})


def v4(recs: list[dict], bound: str | None, k: float = 1.0) -> list[dict]:
    """``recs`` as schema 4 writes them: at dilation ``k``, with the host verdict ``bound``."""
    return [{**r, "schema": 4, "dilation": k, "bound": bound} for r in recs]


def test_the_verdicts_used_here_are_hostloads_own():
    assert HOST.startswith(f"{hostload.HOST_BOUND} (rank 0 spent 95% of the window")
    assert LINK == hostload.LINK_BOUND


# -- matching ----------------------------------------------------------------------------

def test_runs_differing_only_in_dilation_are_different_set_ups():
    (one,) = v4([summary()], LINK, k=1.0)
    four = {**one, "dilation": 4.0}
    assert match.differences(one, four) == ["dilation"]
    assert not match.same_setup(one, four, vary=("sync",))
    assert len(match.matched_sets([one, four], vary=("sync",))) == 2
    assert "dilation 4" in match.describe(four) and "dilation" not in match.describe(one)
    assert "time dilation" in match.WORDS.values()


def test_an_old_record_without_dilation_matches_a_k1_record():
    old = summary()  # schema 2: no dilation, no verdict
    assert "dilation" not in old and match.dilation(old) == 1.0
    (k1,) = v4([old], LINK, k=1.0)
    (k2,) = v4([old], LINK, k=2.0)
    assert match.same_setup(old, k1)
    assert match.differences(old, k2) == ["dilation"]
    assert match.matched_sets([old, k1, k2]) == [[old, k1], [k2]]


def test_a_set_is_described_with_its_dilation_and_host_verdict():
    flat, ring = summary("flat", "native"), summary("flat", "ring")
    assert match.host_words(v4([flat, ring], LINK, k=4.0)) == "dilation 4, link-bound"
    assert match.host_words([flat, ring]) == "dilation 1, host load not judged"
    mixed = [*v4([flat], LINK), *v4([ring], HOST)]
    assert match.host_words(mixed) == (
        f"dilation 1, host-bound: 1 of 2 runs (flat/ring: {HOST[len('host-bound ('):-1]})")
    assert match.host_verdict([*v4([flat], LINK), ring]) == (
        "link-bound: 1 of 2 runs, host load of 1 not judged")
    # one reason given for two runs is given once, naming both
    assert match.host_verdict(v4([flat, ring], HOST)) == (
        f"host-bound (flat/native, flat/ring: {HOST[len('host-bound ('):-1]})")
    assert [match.host_rank(g) for g in (v4([flat], LINK), [flat], mixed)] == [2, 1, 0]


# -- claims that compare comm times across nodes ------------------------------------------

def _c2(nodes: int, local: int) -> list[dict]:
    return [summary("flat", "ring", nodes=nodes, local=local, exposed_s=1.0),
            summary("hierarchical", "hier", nodes=nodes, local=local, exposed_s=0.5)]


def _c3(nodes: int, local: int) -> list[dict]:
    return [summary("bucketed", None, nodes=nodes, local=local)]


def _c4(nodes: int, local: int) -> list[dict]:
    return [summary(s, "native", config={"staleness": 1}, throughput=t, nodes=nodes,
                    local=local) for s, t in (("flat", 40.0), ("async", 20.0))]


def _c7(nodes: int, local: int) -> list[dict]:
    return [summary(config={"accum_steps": k}, sync_share=0.3 / k, nodes=nodes, local=local)
            for k in (1, 4)]


COMM_CLAIMS = {"C2": _c2, "C3": _c3, "C4": _c4, "C7": _c7}


@pytest.mark.parametrize("cid", list(COMM_CLAIMS))
def test_comm_claims_prefer_a_link_bound_set_to_a_larger_host_bound_one(cid):
    big = v4(COMM_CLAIMS[cid](4, 2), HOST)  # 8 ranks: the larger set
    small = v4(COMM_CLAIMS[cid](2, 2), LINK, k=4.0)
    c = claim(cid, [*big, *small])
    assert ids_of(c) == {r["run_id"] for r in small}
    assert c.host == "dilation 4, link-bound"
    assert "host-bound" not in c.reason and "not judged" not in c.reason
    assert "dilation" not in c.setup  # given once, by the host words
    (other,) = c.others
    assert "8 ranks on 4 node(s)" in other and "(dilation 1, host-bound (" in other
    assert all(r["run_id"] in other for r in big)


@pytest.mark.parametrize("cid", list(COMM_CLAIMS))
def test_comm_claims_judge_a_host_bound_set_and_say_so(cid):
    big = v4(COMM_CLAIMS[cid](4, 2), HOST)
    c = claim(cid, big)
    assert c.verdict != claims.NOT_HERE  # judged, not silently: the reason says how
    assert ids_of(c) == {r["run_id"] for r in big}
    assert "its runs were host-bound (" in c.reason
    assert "rank 0 spent 95% of the window" in c.reason
    assert "rerun at --dilation 2 (python -m experiments.study)" in c.reason
    assert c.host.startswith("dilation 1, host-bound (")


@pytest.mark.parametrize("cid", list(COMM_CLAIMS))
def test_comm_claims_on_records_without_a_verdict_are_judged_as_before(cid):
    big, small = COMM_CLAIMS[cid](4, 2), COMM_CLAIMS[cid](2, 2)
    c = claim(cid, [*small, *big])
    assert ids_of(c) == {r["run_id"] for r in big}  # the largest, as before
    assert "host load not judged" in c.reason and "host-bound" not in c.reason
    assert c.host == "dilation 1, host load not judged"


def test_c2_never_pools_runs_of_two_dilations():
    # the ring at K = 1, the hierarchy at K = 4: not one set-up, so nothing to compare
    ring, hier = _c2(2, 4)
    c = claim("C2", [*v4([ring], LINK), *v4([hier], LINK, k=4.0)])
    assert c.verdict == claims.NOT_HERE and "differs in time dilation" in c.reason


def test_c1_takes_a_link_bound_run_before_a_larger_host_bound_one():
    host = v4([summary(batch_size=64, config={"batch_size": 64})], HOST)
    link = v4([summary()], LINK, k=2.0)
    c = claim("C1", [*host, *link])
    assert c.runs == {"sync share": [link[0]["run_id"]]}
    assert c.host == "dilation 2, link-bound" and "host-bound" not in c.reason
    assert c.measured.startswith("largest global batch among link-bound runs here 256 ")
    # a host-bound run alone is still reported, with why; on one node without the advice
    c = claim("C1", host)
    assert "its runs were host-bound (" in c.reason and "rerun at --dilation 2" in c.reason
    # at the emulation's highest K there is no higher one to name
    c = claim("C1", v4([summary()], HOST, k=64.0))
    assert "K = 64 is the highest the emulation runs" in c.reason and "rerun" not in c.reason
    one = v4([summary(nodes=1, local=4, link=None, gbps=None)], HOST)
    c = claim("C1", one)
    assert "its runs were host-bound (" in c.reason and "--dilation" not in c.reason


# -- claims of compute: the verdict stated, not preferred ----------------------------------

def test_c5_keeps_the_largest_set_and_states_that_it_was_host_bound():
    def sweep(**kw):
        return [summary(batch_size=b, config={"batch_size": b}, throughput=t, **kw)
                for b, t in ((32, 100.0), (64, 150.0))]

    big = v4(sweep(), HOST)  # 8 ranks on 2 nodes
    small = v4(sweep(nodes=1, local=2, link=None, gbps=None), LINK)
    c = claim("C5", [*small, *big])
    assert ids_of(c) == {r["run_id"] for r in big}
    assert "its runs were host-bound (" in c.reason and "--dilation" not in c.reason
    assert c.host.startswith("dilation 1, host-bound (")
    assert "(dilation 1, link-bound)" in c.others[0]


def test_c8_states_the_host_verdict_of_every_summary():
    recs = [*v4([summary()], LINK, k=4.0), *v4([summary("flat", "ring")], HOST, k=4.0),
            summary("bucketed", None)]
    c = claim("C8", recs)
    assert c.host.startswith("dilation 1, 4, host-bound: 1 of 3 runs (flat/ring: rank 0 spent")
    assert c.host.endswith(", host load of 1 not judged")


# -- the overlap model's error ---------------------------------------------------------------

def test_overlap_error_is_judged_on_link_bound_runs_where_there_are_some(tmp_path):
    _write_profile(tmp_path / "tiny.json")
    # predicted exposed sync 4 ms for both (tests/test_overlap_model.py): r1 errs by 20 %
    # and was host-bound, r2 errs by 0 and was link-bound
    r1 = {**_record("r1", 0.005, 0.015), "bound": HOST}
    r2 = {**_record("r2", 0.004, 0.014), "bound": LINK}
    checks, _ = overlap.check_runs([r1, r2], FIT, base=tmp_path)
    assert [c.link_bound for c in checks] == [False, True]
    used, which = overlap.judged_on(checks)
    assert [c.run_id for c in used] == ["r2"]
    assert which == "link-bound runs only (1 host-bound left out)"
    text = "\n".join(overlap.check_lines(checks, []))
    assert ("over 1 runs: exposed sync 0.0%, step 0.0% (goal <= 15%); judged on link-bound "
            "runs only (1 host-bound left out)") in text
    assert any(ln.startswith("r1") and ln.endswith("host-bound") for ln in text.splitlines())
    # no link-bound run: every run, and which they were
    r3 = _record("r3", 0.004, 0.014)
    checks, _ = overlap.check_runs([r1, r3], FIT, base=tmp_path)
    used, which = overlap.judged_on(checks)
    assert len(used) == 2 and which == "all runs, none link-bound (1 host-bound, 1 not judged)"
    assert overlap.judged_on(checks[1:])[1] == "all runs, host load not judged"
    c3 = claims.c3([{**r1, "_file": str(tmp_path / "x.jsonl")},
                    {**r2, "_file": str(tmp_path / "x.jsonl")}],
                   SimpleNamespace(params=FIT, scenario=overlap.default_scenario()))
    assert ("median error on 1 bucketed runs here: exposed sync 0%, step 0% (judged on "
            "link-bound runs only (1 host-bound left out))") in c3.model


# -- the report ----------------------------------------------------------------------------

def test_report_gives_the_host_verdict_of_every_row_and_beside_every_claims_set(tmp_path):
    big = v4(_c2(4, 2), HOST)
    small = v4(_c2(2, 2), LINK, k=4.0)
    old = _c4(2, 2)
    for r in big:
        r["_file"] = "big.jsonl"
    page = report.build([*big, *small, *old], tmp_path).read_text()
    host = page[page.index("## Host load"):page.index("## Figures")]
    assert "| 1 | 4 | 0 | 2 | 2 |" in host and "| 4 | 2 | 2 | 0 | 0 |" in host
    assert "**2 host-bound rows**" in host
    for r in big:
        assert (f"| `big.jsonl` | {r['run_id']} | {r['strategy']}/{r['algo']} | 1 | rank 0 "
                "spent 95% of the window") in host
    c2 = next(ln for ln in page.splitlines() if ln.startswith("| C2 |"))
    assert "| dilation 4, link-bound |" in c2
    c4 = next(ln for ln in page.splitlines() if ln.startswith("| C4 |"))
    assert "| dilation 1, host load not judged |" in c4 and "host load not judged" in c4
    details = page[page.index("### Runs behind each claim"):]
    c2_runs = details[details.index("**C2**"):details.index("**C3**")]
    assert c2_runs.splitlines()[0].endswith("; host: dilation 4, link-bound")
    assert "(dilation 1, host-bound (" in c2_runs  # the other set, beside its figure


def test_a_searched_folder_skips_dilation_probes(tmp_path):
    """``--dilation auto``'s probes are shortened copies of real runs: a folder searched for
    results leaves them out; a probe file named on its own is still read. The experiment
    runner keeps each probe as a one-point sweep of its own, in
    ``<outdir>/dilation-probes/<launcher>-<layout>@<rate>-k<K>/`` (``experiments.runner``)."""
    from analysis.load import result_files
    from commbench.dilation import PROBE_DIR
    from experiments.runner import PROBE_DIR as RUNNERS

    assert RUNNERS == PROBE_DIR  # where the runner writes them is where the loader skips
    (tmp_path / "run.jsonl").write_text("{}\n")
    sweep = tmp_path / PROBE_DIR / "mpirun-2x4@1gbit-k1"
    sweep.mkdir(parents=True)
    probe = sweep / "flat-np8-probe-0123abcd.jsonl"
    probe.write_text("{}\n")
    assert result_files([tmp_path]) == [tmp_path / "run.jsonl"]
    assert result_files([probe]) == [probe]
