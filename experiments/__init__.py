"""Experiments: a claim or a benchmark is one module that plans its runs and judges them.

- ``experiments.job``: one job type (a tool's typed configuration, its placement, its
  repeats); each configuration answers its own time and its own probe.
- ``experiments.runner``: the one runner (machine check, load reading, one dilation K
  per compared set, the sweeps per launcher, each job's files, repeat and judge).
- ``experiments.claims`` and ``experiments.study``: the seed claims C1-C8 and the study.
- ``experiments.grid``: the advisor's validation grid (issue 48), judged by
  ``experiments.grid_judge``.
- ``benchmarks/*``: one module per benchmark, on the same runner.

``python -m experiments NAME [ARGS]`` runs any of them by name (``EXPERIMENTS``).
"""

from __future__ import annotations

#: every experiment by name -> the module whose ``main`` runs it
EXPERIMENTS = {
    "study": "experiments.study",
    "grid": "experiments.grid",
    "async_speedup": "benchmarks.async_speedup",
    "dilation": "benchmarks.dilation",
    "hier_bound": "benchmarks.hier_bound",
    "horovod_presence": "benchmarks.horovod_presence",
    "hostload_calibration": "benchmarks.hostload_calibration",
    "peer_fairness": "benchmarks.peer_fairness",
    "replay_fidelity": "benchmarks.replay_fidelity",
    "shard_bytes": "benchmarks.shard_bytes",
    "shard_timing": "benchmarks.shard_timing",
}
