"""The layering contract, read from the source.

- A strategy imports no tool and no workload: tools run strategies on
  workloads, so a strategy that imports either closes an import cycle
  (allreduce -> strategies -> ps -> allreduce was one) and ties a sync
  algorithm to one tool's run sequence.
- A communicator imports no strategy.
- ``analysis/`` and ``launch/`` never import ``commbench.comm``: they read
  result files and start processes, and must work where MPI is absent.
- No product module (``commbench/``, ``launch/``, ``analysis/``, ``docker/``)
  reads a ``COMMBENCH_TEST_*`` variable or knows of the tests in any other
  way: test doubles live in ``tests/fakes.py``, which wraps product objects.

Imports inside functions count.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

#: the tools (``python -m commbench.X``), what only tools build on (the run layer, the
#: parameter server's loops) and the workloads
FORBIDDEN = ("commbench.allreduce", "commbench.microbench", "commbench.staleness",
             "commbench.ps", "commbench.run", "commbench.paramserver", "commbench.profile",
             "commbench.workloads")
STRATEGIES = sorted((ROOT / "commbench" / "strategies").glob("*.py"))


def imports_of(source: str, module: str) -> set[str]:
    """Every module named by an import in ``source`` (of ``module``, for relative imports);
    ``from a import b`` names ``a`` and ``a.b``, as ``b`` may be a module."""
    package = module.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x / from ..a import b
                parts = package.split(".")
                parent = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def forbidden(names: set[str]) -> list[str]:
    return sorted(n for n in names for f in FORBIDDEN if n == f or n.startswith(f + "."))


def test_every_strategy_module_is_checked():
    assert {p.name for p in STRATEGIES} >= {"__init__.py", "base.py", "flat.py", "asynchronous.py"}
    assert "ps.py" not in {p.name for p in STRATEGIES}  # the parameter server is a tool


@pytest.mark.parametrize("path", STRATEGIES, ids=lambda p: p.name)
def test_no_strategy_imports_a_tool_or_a_workload(path: Path):
    module = "commbench.strategies." + path.stem
    assert forbidden(imports_of(path.read_text(), module)) == []


def _modules(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


@pytest.mark.parametrize("path", _modules("commbench/comm"), ids=lambda p: p.name)
def test_communicators_import_no_strategy(path: Path):
    names = imports_of(path.read_text(), _module_name(path))
    assert [n for n in names if n.startswith("commbench.strategies")] == []


@pytest.mark.parametrize("path", _modules("analysis", "launch"),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_analysis_and_launch_import_no_communicator(path: Path):
    names = imports_of(path.read_text(), _module_name(path))
    assert [n for n in names if n == "commbench.comm" or n.startswith("commbench.comm.")] == []


@pytest.mark.parametrize("source,found", [
    ("def f():\n    from commbench.allreduce import run_one\n",
     ["commbench.allreduce", "commbench.allreduce.run_one"]),
    ("import commbench.workloads.synthetic as s\n", ["commbench.workloads.synthetic"]),
    ("from commbench import ps\n", ["commbench.ps"]),
    ("from .. import staleness\n", ["commbench.staleness"]),
    ("from ..workloads import make_workload\n",
     ["commbench.workloads", "commbench.workloads.make_workload"]),
    ("from commbench.paramserver import run_ps\n",
     ["commbench.paramserver", "commbench.paramserver.run_ps"]),
    ("from commbench import microbench, profile\n", ["commbench.microbench", "commbench.profile"]),
    ("import commbench.strategies.base\nfrom commbench.runner import run_steps\n", []),
])
def test_the_check_sees_every_form_of_import(source, found):
    assert forbidden(imports_of(source, "commbench.strategies.x")) == found


#: the product: everything a user runs or ships (tests/, scripts/, benchmarks/ are not)
PRODUCT_DIRS = ("commbench", "launch", "analysis", "docker")
#: what the tests' hooks were named when product code read them; nothing there may now
TEST_HOOK = "COMMBENCH_" + "TEST_"


def _product_files() -> list[Path]:
    """Every text file of the product (sources, scripts, the Dockerfile, compose files)."""
    out = []
    for d in PRODUCT_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and b"\0" not in p.read_bytes()[:4096]:
                out.append(p)
    return out


def test_the_product_is_scanned():
    names = {str(p.relative_to(ROOT)) for p in _product_files()}
    assert {"commbench/runner.py", "commbench/comm/base.py", "commbench/strategies/algos.py",
            "launch/sweep.py", "analysis/plot.py", "docker/Dockerfile"} <= names


@pytest.mark.parametrize("path", _product_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_product_module_reads_a_test_hook_or_imports_the_tests(path: Path):
    text = path.read_text(errors="replace")
    hits = [f"{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
            if TEST_HOOK in line]
    assert hits == [], f"{path.relative_to(ROOT)} names test hooks (move them to tests/fakes.py)"
    if path.suffix == ".py":
        names = imports_of(text, _module_name(path))
        assert [n for n in names if n == "tests" or n.startswith("tests.")] == []
