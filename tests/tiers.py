"""The suite's two tiers: ``make check`` (the edit loop) and ``make test`` (everything).

A test is a *job* when it starts processes: its function, or a fixture or module
function it calls (followed within its module and ``tests/conftest.py``), calls one of
the harness's launchers (``launch``, ``run_tool``, ``run_check``, ``forkrun``...) or
``subprocess``. Jobs are marked ``job`` at collection, so no test needs to say it and a
new one cannot forget to. ``make check`` runs every test that is not a job, plus the
jobs marked ``check``: one per launcher, each covering the whole path (parse, launch,
every rank's records, the table, the exit status).

Its hooks run as ``tests/conftest.py``'s, which imports them.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from functools import cache
from pathlib import Path

import pytest

#: calls that start processes (the harness's launchers and their building blocks)
STARTS_PROCESSES = re.compile(
    r"\b(launch|run_tool|run_check|study_cli|forkrun|run_forked|run_sweep|cli|compose|run|"
    r"cluster|Popen)\(|\bsubprocess\.|\bos\.(fork|system|exec\w*)\(")


@cache
def _module_functions(path: str) -> dict[str, str]:
    """Source of every module-level function of the file at ``path``, by name."""
    try:
        source = Path(path).read_text()
    except OSError:
        return {}
    lines = source.splitlines()
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = "\n".join(lines[node.lineno - 1:node.end_lineno])
    return out


def _starts_processes(name: str, functions: dict[str, str], seen: set[str]) -> bool:
    """Whether module function ``name`` starts processes, itself or through another."""
    if name in seen or name not in functions:
        return False
    seen.add(name)
    body = functions[name]
    if STARTS_PROCESSES.search(body.split("\n", 1)[-1]):  # the body, not the def line
        return True
    called = set(re.findall(r"\b([A-Za-z_]\w*)\(", body)) | set(re.findall(r"\b(\w+)\b", body))
    return any(_starts_processes(c, functions, seen) for c in called if c != name)


def is_job(item: pytest.Item) -> bool:
    fn = getattr(item, "function", None)
    if fn is None:
        return False
    path = inspect.getsourcefile(fn)
    functions = {**_module_functions(str(Path(__file__).with_name("conftest.py"))),
                 **_module_functions(path)}
    names = [fn.__name__, *getattr(item, "fixturenames", ())]
    return any(_starts_processes(n, functions, set()) for n in names)


#: the jobs ``make check`` runs, by node id: one per launcher, and every tool's bad input
CHECK_JOBS = (
    "tests/test_jobs.py::test_mpirun[",  # mpirun, 3 ranks: records, table, exit 0
    "tests/test_jobs.py::test_horovodrun",  # horovodrun (MPI controller)
    "tests/test_jobs.py::test_horovodrun_gloo_native_runs_and_ring_is_refused",  # Gloo
    "tests/test_cluster.py::test_job_across_two_nodes[mpirun]",  # the emulated cluster
    "tests/test_torch_backend.py::test_every_strategy_under_torchrun",  # torchrun, torch
)


def in_check(item: pytest.Item) -> bool:
    """A job ``make check`` runs: ``CHECK_JOBS``, and the bad-input table's one-process
    cases (forked from one process that imported the tools: seconds for all of them)."""
    nodeid = item.nodeid
    if nodeid.startswith("tests/test_bad_input.py::test_bad_input_exits_2"):
        return ":np" not in nodeid
    return nodeid.startswith(CHECK_JOBS)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "job: starts processes (set at collection: tests/tiers.py)")
    config.addinivalue_line("markers", "check: a job that make check runs (one per launcher)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if is_job(item):
            item.add_marker(pytest.mark.job)
            if in_check(item):
                item.add_marker(pytest.mark.check)


if __name__ == "__main__":  # list the jobs: python -m tests.tiers
    sys.exit(pytest.main(["--collect-only", "-q", "-m", "job"]))
