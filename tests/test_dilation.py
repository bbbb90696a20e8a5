"""commbench.dilation: the flag's and the variable's values, the emulated clock and sleeps,
and Horovod's cycle time under dilation. No process is started; the clock and sleep are
checked against a fake ``time`` and, briefly, the real one."""

from __future__ import annotations

import math
import os
import time
from types import SimpleNamespace

import pytest

from commbench import dilation
from commbench.dilation import DILATION_ENV, DilationError


@pytest.fixture
def k():
    """Set this process's dilation for one test; always back to none (1) afterwards."""
    dilation.set_factor(1.0)
    try:
        yield dilation.set_factor
    finally:
        dilation.set_factor(1.0)


@pytest.fixture
def fake_time(monkeypatch):
    """dilation's ``time`` replaced: perf_counter reads 100 s, sleeps are recorded."""
    slept: list[float] = []
    monkeypatch.setattr(dilation, "time",
                        SimpleNamespace(perf_counter=lambda: 100.0, sleep=slept.append))
    return slept


# --- parse ---------------------------------------------------------------------------------

@pytest.mark.parametrize("given, expected", [
    ("1", 1.0), ("4", 4.0), (" 8 ", 8.0), ("2.5", 2.5), ("64", 64.0), ("64.0", 64.0),
    (2, 2.0), (1.5, 1.5), (64, 64.0),
])
def test_parse_numbers_from_1_to_64(given, expected):
    got = dilation.parse(given)
    assert got == expected and isinstance(got, float)


@pytest.mark.parametrize("given", ["auto", "AUTO", " Auto "])
def test_parse_auto_where_allowed(given):
    assert dilation.parse(given, allow_auto=True) == "auto"


@pytest.mark.parametrize("given", ["0", "-2", "0.5", "nan", "inf", "-inf", "abc", "65", "64.5",
                                   "", 0, -1, 0.99, 65, math.nan, math.inf, None])
def test_parse_rejects_naming_the_flag(given):
    with pytest.raises(DilationError) as err:
        dilation.parse(given, flag="--study-dilation")
    msg = str(err.value)
    assert msg.startswith(f"--study-dilation {given}: ")
    assert "from 1 (none) to 64" in msg and "auto" not in msg


def test_parse_auto_only_where_allowed():
    with pytest.raises(DilationError, match=r"^--dilation auto: .*to 64: "):
        dilation.parse("auto")
    # where auto is allowed, a bad number's message offers it
    with pytest.raises(DilationError, match=r"^--dilation 0: .*to 64, or auto: "):
        dilation.parse("0", allow_auto=True)
    with pytest.raises(DilationError, match=r"^--dilation 65: "):
        dilation.parse("65", allow_auto=True)


def test_dilation_error_is_a_value_error():
    # callers that catch ValueError for every bad flag catch this one too
    assert issubclass(DilationError, ValueError)


# --- the launcher's variable ---------------------------------------------------------------

@pytest.mark.parametrize("environ", [{}, {DILATION_ENV: ""}, {DILATION_ENV: "  "}])
def test_from_env_unset_is_none(environ):
    assert dilation.from_env(environ) == 1.0


def test_from_env_reads_the_variable():
    assert dilation.from_env({DILATION_ENV: "4"}) == 4.0
    assert dilation.from_env({DILATION_ENV: " 2.5 "}) == 2.5


@pytest.mark.parametrize("value", ["0", "-1", "65", "nan", "inf", "abc", "auto"])
def test_from_env_rejects_naming_the_variable(value):
    # auto is the flag's, resolved by the tool: a rank is always given a number
    with pytest.raises(DilationError, match=rf"^{DILATION_ENV} {value}: "):
        dilation.from_env({DILATION_ENV: value})


def test_from_env_defaults_to_this_process(monkeypatch):
    monkeypatch.setenv(DILATION_ENV, "8")
    assert dilation.from_env() == 8.0
    monkeypatch.delenv(DILATION_ENV)
    assert dilation.from_env() == 1.0


def test_env_and_text():
    assert dilation.env(1) == {} and dilation.env(1.0) == {}
    assert dilation.env(4.0) == {DILATION_ENV: "4"}
    assert dilation.env(1.5) == {DILATION_ENV: "1.5"}
    assert dilation.text(4.0) == "4" and dilation.text(1.5) == "1.5" and dilation.text(64) == "64"


@pytest.mark.parametrize("factor", [*dilation.AUTO_FACTORS, 1.5, dilation.MAX_FACTOR])
def test_env_round_trips_through_from_env(factor):
    # what a launcher exports is what every rank reads back
    assert dilation.from_env(dilation.env(factor)) == factor


# --- this process's factor -----------------------------------------------------------------

def test_set_factor(k):
    assert dilation.factor() == 1.0
    k(4)
    assert dilation.factor() == 4.0 and isinstance(dilation.factor(), float)
    k("2.5")
    assert dilation.factor() == 2.5


@pytest.mark.parametrize("bad", [0.5, 0, 65, "auto", "abc", math.nan])
def test_set_factor_rejects_and_keeps_the_factor(k, bad):
    k(2)
    with pytest.raises(DilationError, match="^--dilation "):
        k(bad)
    assert dilation.factor() == 2.0


@pytest.mark.parametrize("factor, emulated", [(1, 100.0), (4, 25.0), (2.5, 40.0)])
def test_now_is_perf_counter_over_k(k, fake_time, factor, emulated):
    k(factor)
    assert dilation.now() == emulated


@pytest.mark.parametrize("factor, wall", [(1, 0.25), (4, 1.0), (2.5, 0.625)])
def test_sleep_is_k_times_longer_on_the_wall(k, fake_time, factor, wall):
    k(factor)
    dilation.sleep(0.25)
    assert fake_time == [wall]


@pytest.mark.parametrize("factor, wall", [(1, 3.0), (4, 12.0), (2.5, 7.5)])
def test_wall(k, factor, wall):
    k(factor)
    assert dilation.wall(3.0) == wall


def test_real_clock_and_sleep_under_dilation(k):
    k(4)
    t0 = time.perf_counter()
    e0 = dilation.now()
    t1 = time.perf_counter()
    assert t0 / 4 <= e0 <= t1 / 4
    dilation.sleep(0.005)  # 20 ms on the wall
    e1 = dilation.now()
    assert time.perf_counter() - t1 >= 0.02
    assert e1 - e0 >= 0.005  # at least the emulated time asked for


# --- Horovod's cycle time ------------------------------------------------------------------

BASE = dilation.HOROVOD_CYCLE_BASE_ENV


def test_horovod_cycle_untouched_without_dilation(k):
    environ: dict[str, str] = {}
    assert dilation.apply_horovod_cycle(environ) == dilation.HOROVOD_CYCLE_DEFAULT_MS == 1.0
    assert environ == {}
    environ = {"HOROVOD_CYCLE_TIME": "5"}
    assert dilation.apply_horovod_cycle(environ) == 5.0
    assert environ == {"HOROVOD_CYCLE_TIME": "5"}


def test_horovod_cycle_default_times_k(k):
    k(4)
    environ: dict[str, str] = {}
    assert dilation.apply_horovod_cycle(environ) == 1.0  # what the records carry: emulated
    assert environ == {"HOROVOD_CYCLE_TIME": "4", BASE: "1"}


def test_horovod_cycle_users_times_k_once(k):
    k(4)
    environ = {"HOROVOD_CYCLE_TIME": " 2.5 "}
    assert dilation.apply_horovod_cycle(environ) == 2.5
    assert environ == {"HOROVOD_CYCLE_TIME": "10", BASE: "2.5"}
    # a second call (a second communicator in the process) does not scale it again
    assert dilation.apply_horovod_cycle(environ) == 2.5
    assert environ == {"HOROVOD_CYCLE_TIME": "10", BASE: "2.5"}


@pytest.mark.parametrize("factor", [1, 4])
def test_horovod_cycle_bad_value_raises(k, factor):
    k(factor)
    environ = {"HOROVOD_CYCLE_TIME": "fast"}
    with pytest.raises(DilationError, match=r"^HOROVOD_CYCLE_TIME='fast': expected milliseconds"):
        dilation.apply_horovod_cycle(environ)
    assert environ == {"HOROVOD_CYCLE_TIME": "fast"}


def test_horovod_cycle_defaults_to_this_process(k, monkeypatch):
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "3")
    monkeypatch.setenv(BASE, "")  # recorded, so the test's end removes what the call sets
    monkeypatch.delenv(BASE)
    k(2)
    assert dilation.apply_horovod_cycle() == 3.0
    assert os.environ["HOROVOD_CYCLE_TIME"] == "6" and os.environ[BASE] == "3"


# --- deadlines ------------------------------------------------------------------------------

def test_watchdog_and_horovod_stall_deadlines_are_k_times_longer(k):
    from commbench import watchdog

    class OneRank:
        rank, size = 0, 1

    k(4.0)
    wd = watchdog.Watchdog("t", OneRank(), 10)
    try:
        assert wd.deadline() == 40.0  # 10 s of emulated time is 40 s on the wall
    finally:
        wd.stop()
    env: dict[str, str] = {}
    watchdog.horovod_stall_env(10, env)
    assert env["HOROVOD_STALL_CHECK_TIME_SECONDS"] == "40"
    k(1.0)
    env = {}
    watchdog.horovod_stall_env(10, env)
    assert env["HOROVOD_STALL_CHECK_TIME_SECONDS"] == "10"


def test_tbf_shaping_under_dilation():
    from launch import links

    argv = links.shape_argv("eth0", 1.0, dilation=4)
    # the link at rate / K; the burst the same in bytes; the queue's latency K times longer
    assert argv[argv.index("rate") + 1] == "250000kbit"
    assert argv[argv.index("burst") + 1] == links.TBF_BURST
    assert argv[argv.index("latency") + 1] == f"{links.TBF_LATENCY_MS * 4:g}ms"
