"""Time dilation: the emulated cluster run K times slower, so this machine looks K times faster.

On one machine with fewer cores than ranks, part of an emulated figure is the
host's (scheduling, polling, copying), not the link's or the algorithm's. Time-
dilated emulation (Gupta et al., "To Infinity and Beyond: Time-Warped Network
Emulation", NSDI 2006; DieCast, NSDI 2008) slows the links by K and scales
everything else that runs on emulated time by the same K; the host's work then
costs 1/K of what it did in emulated time. Validity is not assumed but checked:
a figure is trusted where it stops changing as K grows
(``benchmarks/dilation.py``, ``commbench.hostload``).

What runs on emulated time here, and how it is scaled:

- the links: ``launch.cluster`` shapes them at rate / K, tbf's burst the same in
  bytes and its latency K times longer, so both are the same in emulated time;
- every duration a rank measures: ``now`` is the emulated clock
  (``time.perf_counter() / K``), so records hold emulated time;
- every sleep on that clock (``sleep``): replayed compute (its own factor, apart
  from ``--compute-scale``), the pollers' intervals;
- Horovod's cycle time (``horovod_cycle_ms``), the watchdog's and Horovod's stall
  deadlines (``wall``), and the launcher's job deadlines;
- the link test, whose Gbit/s is multiplied back by K.

Not dilated: the kernel's TCP timers, loopback latency, Open MPI's own timers,
and real (not replayed) forward and backward passes, which under dilation
stand for a node K times faster than this machine's share of it (the records
say so).

The launcher passes K to every rank in ``COMMBENCH_DILATION``; unset means 1.
Only the standard library: the launchers import this too.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, MutableMapping

#: the dilation a launcher gives every rank
DILATION_ENV = "COMMBENCH_DILATION"
#: the factors ``--dilation auto`` tries, smallest first
AUTO_FACTORS = (1, 2, 4, 8)
#: where ``--dilation auto`` keeps its probes' records, inside a results folder; the analysis
#: skips it when it searches a folder (a probe is a shortened copy of a real run)
PROBE_DIR = "dilation-probes"
#: the largest factor accepted (the links then run at rate / K)
MAX_FACTOR = 64.0
#: Horovod's cycle time when the user sets none (ms; Horovod's own default since 0.20)
HOROVOD_CYCLE_DEFAULT_MS = 1.0


class DilationError(ValueError):
    """A dilation that cannot be used; the message names the flag or variable."""


def parse(text: str | float | int, flag: str = "--dilation", allow_auto: bool = False
          ) -> float | str:
    """A dilation as given: a number >= 1 (1 is none), or ``'auto'`` where allowed."""
    if allow_auto and isinstance(text, str) and text.strip().lower() == "auto":
        return "auto"
    try:
        k = float(text)
    except (TypeError, ValueError):
        k = math.nan
    if not (math.isfinite(k) and 1.0 <= k <= MAX_FACTOR):
        what = "a number from 1 (none) to 64" + (", or auto" if allow_auto else "")
        raise DilationError(f"{flag} {text}: the dilation must be {what}: the links run at "
                            "rate / K and everything else on emulated time K times slower")
    return k


def from_env(environ: Mapping[str, str] | None = None) -> float:
    """The dilation a launcher gave this process (``DILATION_ENV``); 1 when unset."""
    raw = (os.environ if environ is None else environ).get(DILATION_ENV, "").strip()
    if not raw:
        return 1.0
    return float(parse(raw, flag=DILATION_ENV))


def env(k: float) -> dict[str, str]:
    """What a launcher exports to every rank for dilation ``k`` (nothing for 1)."""
    return {DILATION_ENV: text(k)} if k != 1 else {}


def text(k: float) -> str:
    """``4.0`` -> ``'4'``; ``1.5`` -> ``'1.5'``."""
    return f"{k:g}"


_K = from_env()


def factor() -> float:
    """This process's dilation K (wall time / emulated time)."""
    return _K


def set_factor(k: float) -> None:
    """Set this process's dilation (a rank reads it from ``DILATION_ENV`` at import; a test
    or a tool running in one process may set it)."""
    global _K
    _K = float(parse(k))


def now() -> float:
    """Emulated time: this process's ``time.perf_counter`` divided by K."""
    return time.perf_counter() / _K


def sleep(emulated_s: float) -> None:
    """Sleep ``emulated_s`` of emulated time (K times that on the wall)."""
    time.sleep(emulated_s * _K)


def wall(emulated_s: float) -> float:
    """Wall seconds of ``emulated_s``: what deadlines and timers are set to."""
    return emulated_s * _K


#: the cycle time (ms, emulated) Horovod was given before ``apply_horovod_cycle`` scaled it
HOROVOD_CYCLE_BASE_ENV = "COMMBENCH_HOROVOD_CYCLE_MS"


def apply_horovod_cycle(environ: MutableMapping[str, str] | None = None) -> float:
    """Before ``hvd.init``: set ``HOROVOD_CYCLE_TIME`` to the user's (or 1 ms) x K; return the
    cycle in emulated ms, which records carry. Applied once per process (the emulated value
    is kept in ``HOROVOD_CYCLE_BASE_ENV``); nothing is set at K = 1."""
    env = os.environ if environ is None else environ
    done = env.get(HOROVOD_CYCLE_BASE_ENV)
    if done:
        return float(done)
    raw = env.get("HOROVOD_CYCLE_TIME", "").strip()
    try:
        base = float(raw) if raw else HOROVOD_CYCLE_DEFAULT_MS
    except ValueError:
        raise DilationError(f"HOROVOD_CYCLE_TIME={raw!r}: expected milliseconds") from None
    if _K != 1:
        env["HOROVOD_CYCLE_TIME"] = f"{base * _K:g}"
        env[HOROVOD_CYCLE_BASE_ENV] = f"{base:g}"
    return base
