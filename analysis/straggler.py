"""What a straggler costs, from matched runs with and without it.

Under a straggler (``--slow-rank R:F``, ``--compute-jitter``) the ranks that
finish their compute early enter each collective first and move part of its
data while they wait for the late one, so a step's summed wait
(``sync_wait_s``) overstates what the imbalance costs, and its transfer
(``sync_transfer_s``, the shortest duration over ranks, timed after the last
rank arrived) reads as the remainder. Measured on 2 x 4 at 1 Gbit/s with the
flat ring and ResNet-50's replayed profile x 20, one rank twice as slow raised
the wait from 98 to 1207 ms, lowered the transfer from 1511 to 1258 ms and
raised the exposed sync by 866 ms (docs/metrics.md).

What the imbalance costs is therefore read from two runs of one set-up that
differ only in the straggler (``analysis.match``, vary ``straggler``): the
difference in exposed sync, straggler minus none, with its spread over repeats
(``stats.diff_spread``), beside the straggler run's wait and transfer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from analysis import match, stats
from analysis.load import stat


@dataclass
class StragglerCost:
    setup: str  # the matched set-up in words, less the straggler
    scheme: str  # the sync scheme in words
    straggler: str  # the straggler's settings in words
    wait: stats.Spread  # the straggler runs' sync_wait_s
    transfer: stats.Spread  # the straggler runs' sync_transfer_s
    exposed: stats.Spread  # the straggler runs' exposed_sync_s
    exposed_without: stats.Spread  # the runs without it
    cost: stats.Spread  # exposed sync with - without
    runs: dict[str, list[str]]


def _has_straggler(r: dict) -> bool:
    slow, jitter = match.straggler_settings(r)
    return bool(slow) or bool(jitter)


def _straggler_words(r: dict) -> str:
    slow, jitter = match.straggler_settings(r)
    return ", ".join(x for x in (f"rank {slow[0]} x {slow[1]:g}" if slow else "",
                                 f"jitter cv {jitter:g}" if jitter else "") if x)


def costs(records: Sequence[dict]) -> list[StragglerCost]:
    """Every scheme run with a straggler beside runs of its set-up and scheme without one."""
    runs = [r for r in records if r.get("kind") == "summary"]
    out = []
    for g in match.matched_sets(runs, ("straggler",)):
        for scheme in dict.fromkeys(match.sync_scheme(r) for r in g):
            mine = [r for r in g if match.sync_scheme(r) == scheme]
            slow = [r for r in mine if _has_straggler(r)]
            even = [r for r in mine if not _has_straggler(r)]
            if not slow or not even:
                continue
            for kind in dict.fromkeys(map(_straggler_words, slow)):
                these = [r for r in slow if _straggler_words(r) == kind]

                def read(rs: list[dict], name: str) -> list[float]:
                    return [stat(r, name) for r in rs]

                out.append(StragglerCost(
                    match.describe(these[0], ("straggler",)), match.scheme_words(these[0]),
                    kind, stats.spread_of(read(these, "sync_wait_s")),
                    stats.spread_of(read(these, "sync_transfer_s")),
                    stats.spread_of(read(these, "exposed_sync_s")),
                    stats.spread_of(read(even, "exposed_sync_s")),
                    stats.diff_spread(read(these, "exposed_sync_s"),
                                      read(even, "exposed_sync_s")),
                    {"straggler": match.run_ids(these), "none": match.run_ids(even)}))
    return out


def report_lines(records: Sequence[dict]) -> list[str]:
    """The report's section: one row per scheme and straggler, in ms."""
    found = costs(records)
    if not found:
        return []

    def ms(sp: stats.Spread) -> str:
        return stats.Spread(sp.value * 1e3, sp.lo * 1e3, sp.hi * 1e3, sp.kind,
                            sp.n).words(".0f")

    lines = ["## What a straggler costs", "",
             "Runs with a straggler beside runs of the same set-up and scheme without one. "
             "The early ranks move part of the data while they wait, so the straggler run's "
             "summed wait overstates what the imbalance costs; its cost is the difference "
             "in exposed sync, with and without (`analysis/straggler.py`). Medians per "
             "step, ms, with their spread over repeats.", "",
             "| set-up | scheme | straggler | wait | transfer | exposed sync | without | "
             "cost |", "|---|---|---|---|---|---|---|---|"]
    for c in found:
        lines.append(f"| {c.setup} | {c.scheme} | {c.straggler} | {ms(c.wait)} | "
                     f"{ms(c.transfer)} | {ms(c.exposed)} | {ms(c.exposed_without)} | "
                     f"{ms(c.cost)} |")
    return [*lines, ""]
