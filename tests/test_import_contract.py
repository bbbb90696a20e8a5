"""The layering contract, read from the source.

The product's import graph is built with ``ast`` from every ``.py`` file under
``commbench/``, ``launch/`` and ``analysis/``; imports inside functions count. An
import of ``a.b.c`` first runs ``a/__init__`` and ``a/b/__init__``, so those packages
are reached too (but a package's ``__init__`` importing its own submodules closes no
cycle: Python runs the ``__init__`` first). The rules hold for everything a module
reaches, not only what it names:

- No import cycle among product modules (one was allreduce -> strategies -> ps ->
  allreduce): a cycle makes import order matter and ties the layers together.
- A strategy reaches no tool, no run-layer module, no parameter server and no workload:
  tools run strategies on workloads, so a strategy that reaches either ties a sync
  algorithm to one tool's run sequence.
- A communicator reaches no strategy, no workload and no tool.
- A workload reaches no strategy, no tool, no run-layer module and no communicator.
- The run layer reaches no tool and no parameter server; it uses strategies through
  ``commbench.strategies.base``.
- ``analysis/`` reaches no ``commbench.comm``, torch, mpi4py or horovod: it reads result
  files and must work where MPI and torch are absent. ``launch/`` never imports
  ``commbench.comm`` itself (and should not reach it either).
- Imports of the product's own modules inside functions are few, and each says why.
- No product module (``commbench/``, ``launch/``, ``analysis/``, ``docker/``) reads a
  ``COMMBENCH_TEST_*`` variable or knows of the tests in any other way: test doubles live
  in ``tests/fakes.py``, which wraps product objects.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import ROOT

#: the top-level packages of the product's Python (docker/ holds none)
PACKAGES = ("commbench", "launch", "analysis", "experiments")

#: the tools (``python -m commbench.X``)
TOOLS = ("commbench.allreduce", "commbench.microbench", "commbench.staleness",
         "commbench.ps", "commbench.profile")
#: the run sequence the tools share: a tool's life, what it writes, the step loop
RUN_LAYER = ("commbench.lifecycle", "commbench.output", "commbench.steploop")
PARAMSERVER = ("commbench.paramserver",)
STRATEGIES = ("commbench.strategies",)
COMM = ("commbench.comm",)
WORKLOADS = ("commbench.workloads",)
#: what analysis/ may not need: it only reads files
HEAVY = ("torch", "mpi4py", "horovod")

#: launch modules allowed to reach ``commbench.comm`` through other modules: none. The
#: experiments (``experiments/``) plan the tools' typed configurations; every launcher
#: (sweep, cluster, commands, links, execute, slurm) runs where neither torch nor MPI need be.
LAUNCH_TRANSITIVE_EXEMPT: list[str] = []
#: imports of the product's own modules that may sit inside functions (each with a comment)
MAX_IMPORTS_IN_FUNCTIONS = 6


def under(name: str, prefixes: Iterable[str]) -> bool:
    """Whether ``name`` is one of ``prefixes`` or inside one (``a.b`` is under ``a``)."""
    return any(name == p or name.startswith(p + ".") for p in prefixes)


# --- the graph ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Import:
    """One module named by an import statement, resolved."""

    module: str  #: a product module; or a third-party name as written; or, unresolved, as named
    line: int
    end_line: int
    in_function: bool
    type_only: bool  #: under ``if TYPE_CHECKING:``; never runs, so closes no cycle


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    imports: list[Import] = field(default_factory=list)  #: of product modules
    external: list[Import] = field(default_factory=list)  #: of anything else (torch, tests)
    unresolved: list[Import] = field(default_factory=list)  #: product names with no file


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _ImportFinder(ast.NodeVisitor):
    """Every import statement, with whether it sits in a function or a TYPE_CHECKING block."""

    def __init__(self) -> None:
        self.found: list[tuple[ast.Import | ast.ImportFrom, bool, bool]] = []
        self._functions = 0
        self._type_only = 0

    def visit_FunctionDef(self, node: ast.AST) -> None:
        self._functions += 1
        self.generic_visit(node)
        self._functions -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        self._type_only += 1
        for child in node.body:
            self.visit(child)
        self._type_only -= 1
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        self.found.append((node, self._functions > 0, self._type_only > 0))

    visit_ImportFrom = visit_Import


def _relative_base(node: ast.ImportFrom, importer: str, is_package: bool) -> str | None:
    """The absolute name of ``from <dots><module>`` in ``importer`` (None: above the top)."""
    package = importer if is_package else importer.rpartition(".")[0]
    parts = package.split(".") if package else []
    if node.level - 1 > len(parts) - 1:
        return None
    base = ".".join(parts[:len(parts) - (node.level - 1)])
    return f"{base}.{node.module}" if node.module else base


def imports_in(source: str, importer: str, known: set[str], *,
               is_package: bool = False) -> list[tuple[str, Import]]:
    """Every module ``source`` (module ``importer``) imports, as ``(kind, Import)``: kind is
    ``"project"`` (a module in ``known``), ``"unresolved"`` (under a package of ``known`` but
    no module there) or ``"external"``. ``from a import b`` is module ``a.b`` where that is
    a module, else ``a``."""
    roots = {k.partition(".")[0] for k in known}
    finder = _ImportFinder()
    finder.visit(ast.parse(source))
    out: list[tuple[str, Import]] = []
    for node, in_function, type_only in finder.found:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = (_relative_base(node, importer, is_package) if node.level
                    else node.module or "")
            if base is None:  # relative past the top: name it as written
                names = ["." * node.level + (node.module or "")]
            elif base.partition(".")[0] in roots:
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                         for alias in node.names]
            else:
                names = [base]
        for name in dict.fromkeys(names):
            kind = ("project" if name in known else
                    "unresolved" if name.partition(".")[0] in roots or name.startswith(".")
                    else "external")
            out.append((kind, Import(name, node.lineno, node.end_lineno or node.lineno,
                                     in_function, type_only)))
    return out


def module_name(path: Path, root: Path) -> tuple[str, bool]:
    """``(dotted name, is a package)`` of the module in ``path`` under ``root``."""
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


@dataclass
class Graph:
    root: Path
    modules: dict[str, Module]

    def _packages_above(self, module: str) -> list[str]:
        parts = module.split(".")
        return [p for p in (".".join(parts[:n]) for n in range(1, len(parts)))
                if p in self.modules]

    def edges(self, name: str) -> list[str]:
        """What importing ``name`` runs (in functions too; not under TYPE_CHECKING): the
        edges that form cycles. They include the packages above each import, whose
        ``__init__`` runs first, except ``name``'s own: those have begun before ``name``
        (a package's ``__init__`` importing its submodules closes no cycle)."""
        out: set[str] = set()
        for i in self.modules[name].imports:
            if not i.type_only:
                out.add(i.module)
                out.update(p for p in self._packages_above(i.module) if not under(name, [p]))
        out.discard(name)
        return sorted(out)

    def reach_edges(self, name: str) -> list[str]:
        """What importing ``name`` reaches: its imports (type-only ones too, as they tie the
        layers alike) and every package above each, ``name``'s own too."""
        out: set[str] = set()
        for i in self.modules[name].imports:
            out.add(i.module)
            out.update(self._packages_above(i.module))
        out.discard(name)
        return sorted(out)

    def _next(self, name: str) -> list[str]:
        if name not in self.modules:  # a third-party name: not followed
            return []
        return self.reach_edges(name) + sorted({i.module for i in self.modules[name].external})

    def chain(self, start: str, targets: Iterable[str]) -> list[str] | None:
        """The shortest import chain from ``start`` to a module (or third-party name) under
        one of ``targets``, e.g. ``[a, b, torch]``; None if ``start`` reaches none."""
        targets = tuple(targets)
        parent: dict[str, str | None] = {start: None}
        queue = deque([start])
        while queue:
            name = queue.popleft()
            for nxt in self._next(name):
                if nxt in parent:
                    continue
                parent[nxt] = name
                if under(nxt, targets):
                    path = [nxt]
                    while (before := parent[path[-1]]) is not None:
                        path.append(before)
                    return path[::-1]
                queue.append(nxt)
        return None

    def reachable(self, start: str) -> set[str]:
        """Every product module and third-party name ``start`` reaches (not itself)."""
        seen = {start}
        queue = deque([start])
        while queue:
            for nxt in self._next(queue.popleft()):
                if nxt not in seen:
                    seen.add(nxt)
                    queue.append(nxt)
        return seen - {start}

    def cycles(self) -> list[list[str]]:
        """Every module's shortest import cycle (``[a, b, a]``), each once, from its
        alphabetically first module; empty when the graph has none."""
        found: set[tuple[str, ...]] = set()
        for start in sorted(self.modules):
            parent: dict[str, str] = {}
            queue = deque([start])
            while queue and start not in parent:
                name = queue.popleft()
                for nxt in self.edges(name):
                    if nxt not in parent:
                        parent[nxt] = name
                        queue.append(nxt)
            if start in parent:
                cycle = [start]
                while len(cycle) == 1 or cycle[-1] != start:
                    cycle.append(parent[cycle[-1]])
                cycle = cycle[::-1][:-1]  # a, b, c (a imports b, c imports a)
                first = cycle.index(min(cycle))
                found.add(tuple(cycle[first:] + cycle[:first]))
        return [[*c, c[0]] for c in sorted(found)]

    def in_functions(self) -> list[tuple[str, Import]]:
        """Every import of a product module (resolved or not) inside a function, with the
        path of the module that holds it."""
        return [(str(m.path.relative_to(self.root)), i)
                for m in sorted(self.modules.values(), key=lambda m: m.name)
                for i in m.imports + m.unresolved if i.in_function]


def build_graph(root: Path, packages: Iterable[str] = PACKAGES) -> Graph:
    """The import graph of every ``.py`` file under ``root``'s ``packages``."""
    paths = sorted(p for d in packages for p in (root / d).rglob("*.py")
                   if "__pycache__" not in p.parts)
    modules = {}
    for path in paths:
        name, is_package = module_name(path, root)
        modules[name] = Module(name, path, is_package)
    known = set(modules)
    for m in modules.values():
        lists = {"project": m.imports, "external": m.external, "unresolved": m.unresolved}
        for kind, imp in imports_in(m.path.read_text(), m.name, known, is_package=m.is_package):
            lists[kind].append(imp)
    return Graph(root, modules)


#: a comment that says nothing about why
_PRAGMA = re.compile(r"#\s*(noqa|type:|pragma|fmt:)")


def has_reason(source: str, imp: Import) -> bool:
    """Whether a ``#`` comment sits on ``imp``'s lines, or alone on the line above it or
    above the run of import statements it ends (one comment over a group of imports)."""
    trailing, alone = set(), set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and not _PRAGMA.match(tok.string):
            (alone if tok.line.lstrip().startswith("#") else trailing).add(tok.start[0])
    if any(n in trailing or n in alone for n in range(imp.line, imp.end_line + 1)):
        return True
    importing = {n for node in ast.walk(ast.parse(source))
                 if isinstance(node, (ast.Import, ast.ImportFrom))
                 for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)}
    above = imp.line - 1
    while above in importing:
        above -= 1
    return above in alone


def show_chain(chain: list[str]) -> str:
    return " -> ".join(chain)


# --- the product's graph and its rules ----------------------------------------------------

GRAPH = build_graph(ROOT)


@dataclass(frozen=True)
class Rule:
    name: str
    sources: tuple[str, ...]  #: the modules the rule is about (and those below)
    forbidden: tuple[str, ...]  #: what none of them may reach
    exempt: tuple[str, ...] = ()  #: source modules not held to it (yet)


RULES = [
    Rule("strategies", STRATEGIES, TOOLS + RUN_LAYER + PARAMSERVER + WORKLOADS),
    Rule("communicators", COMM, STRATEGIES + WORKLOADS + TOOLS),
    Rule("workloads", WORKLOADS, STRATEGIES + TOOLS + RUN_LAYER + COMM),
    Rule("run layer", RUN_LAYER, TOOLS + PARAMSERVER),
    Rule("analysis", ("analysis",), COMM + HEAVY),
    # launch/ is launchers: it starts ranks and clusters, plans and judges nothing
    Rule("launchers", ("launch",), TOOLS + ("analysis", "experiments")),
]


def violations(graph: Graph, rule: Rule) -> list[str]:
    """``a -> b -> c`` for every module of ``rule.sources`` that reaches what it forbids."""
    out = []
    for name in sorted(graph.modules):
        if under(name, rule.sources) and name not in rule.exempt:
            chain = graph.chain(name, rule.forbidden)
            if chain is not None:
                out.append(show_chain(chain))
    return out


def test_the_graph_holds_the_whole_product():
    files = [p for d in PACKAGES for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts]
    assert len(GRAPH.modules) == len(files)
    assert {"commbench", "commbench.comm.base", "commbench.strategies.flat",
            "commbench.strategies.base", "commbench.strategies.asynchronous",
            "launch.sweep", "analysis.plot"} <= set(GRAPH.modules)
    assert "commbench.strategies.ps" not in GRAPH.modules  # the parameter server is a tool
    assert "torch" in GRAPH.reachable("commbench.strategies.flat")  # third-party names seen


def test_every_import_of_the_product_names_a_module():
    """An import of a product module with no file (moved, renamed) would leave edges out
    of the graph, and every rule here would pass on what it cannot see."""
    stale = [f"{m.path.relative_to(ROOT)}:{i.line} {i.module}"
             for m in GRAPH.modules.values() for i in m.unresolved]
    assert stale == []


def test_no_import_cycles():
    cycles = [show_chain(c) for c in GRAPH.cycles()]
    assert cycles == [], "import cycles among product modules:\n" + "\n".join(cycles)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_layers_reach_only_what_they_may(rule: Rule):
    held = [n for n in GRAPH.modules if under(n, rule.sources) and n not in rule.exempt]
    assert held, f"no module under {rule.sources}: the rule checks nothing"
    found = violations(GRAPH, rule)
    assert found == [], (f"{rule.name} reach {', '.join(rule.forbidden)}:\n"
                         + "\n".join(found))


def test_launch_imports_no_communicator_directly():
    found = [f"{m.path.relative_to(ROOT)}:{i.line} {i.module}"
             for m in GRAPH.modules.values() if under(m.name, ("launch",))
             for i in m.imports + m.unresolved if under(i.module, COMM)]
    assert found == []


def test_launch_reaches_no_communicator():
    rule = Rule("launch", ("launch",), COMM, tuple(LAUNCH_TRANSITIVE_EXEMPT))
    found = violations(GRAPH, rule)
    assert found == [], "launch reaches commbench.comm:\n" + "\n".join(found)
    assert LAUNCH_TRANSITIVE_EXEMPT == [], "the contract has no exemptions"


def test_few_imports_inside_functions_each_with_a_reason():
    found = GRAPH.in_functions()
    listed = [f"{path}:{i.line} {i.module}" for path, i in found]
    assert len(found) <= MAX_IMPORTS_IN_FUNCTIONS, (
        f"{len(found)} imports of product modules inside functions "
        f"(at most {MAX_IMPORTS_IN_FUNCTIONS}):\n" + "\n".join(listed))
    silent = [f"{path}:{i.line} {i.module}" for path, i in found
              if not has_reason((ROOT / path).read_text(), i)]
    assert silent == [], "imports inside functions without a comment saying why:\n" + "\n".join(
        silent)


# --- the checker itself -------------------------------------------------------------------

#: a product as the checker sees it, for parsing snippets (independent of the moves)
KNOWN = {"commbench", "commbench.allreduce", "commbench.ps", "commbench.staleness",
         "commbench.microbench", "commbench.profile", "commbench.paramserver",
         "commbench.metrics", "commbench.steploop", "commbench.comm", "commbench.comm.base",
         "commbench.strategies", "commbench.strategies.base", "commbench.strategies.x",
         "commbench.workloads", "commbench.workloads.synthetic"}
STRATEGY_RULE = RULES[0]


@pytest.mark.parametrize("source,found", [
    ("def f():\n    from commbench.allreduce import run_one\n", ["commbench.allreduce"]),
    ("import commbench.workloads.synthetic as s\n", ["commbench.workloads.synthetic"]),
    ("from commbench import ps\n", ["commbench.ps"]),
    ("from .. import staleness\n", ["commbench.staleness"]),
    ("from ..workloads import make_workload\n", ["commbench.workloads"]),
    ("from commbench.paramserver import run_ps\n", ["commbench.paramserver"]),
    ("from commbench import microbench, profile\n", ["commbench.microbench", "commbench.profile"]),
    ("class A:\n    async def f(self):\n        import commbench.steploop\n",
     ["commbench.steploop"]),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from commbench.ps import Server\n",
     ["commbench.ps"]),
    ("try:\n    from commbench.steploop import run_steps\nexcept ImportError:\n    pass\n",
     ["commbench.steploop"]),
    ("import commbench.strategies.base\nfrom commbench.metrics import busbw\n", []),
])
def test_the_check_sees_every_form_of_import(source, found):
    names = [i.module for _, i in imports_in(source, "commbench.strategies.x", KNOWN)]
    assert [n for n in names if under(n, STRATEGY_RULE.forbidden)] == found


@pytest.mark.parametrize("source,importer,is_package,found", [
    ("from . import base\n", "commbench.strategies", True,
     [("project", "commbench.strategies.base")]),
    ("from . import base\n", "commbench.strategies.x", False,
     [("project", "commbench.strategies.base")]),
    ("from .base import Strategy\n", "commbench.strategies.x", False,
     [("project", "commbench.strategies.base")]),
    ("from commbench.strategies import make\n", "commbench.strategies.x", False,
     [("project", "commbench.strategies")]),
    ("import horovod.torch as hvd\nfrom torch import nn\n", "commbench.comm", True,
     [("external", "horovod.torch"), ("external", "torch")]),
    ("from commbench.config import X\nimport commbench.gone\n", "commbench.x", False,
     [("unresolved", "commbench.config"), ("unresolved", "commbench.gone")]),
    ("from tests import fakes\n", "commbench.x", False, [("external", "tests")]),
])
def test_imports_resolve_to_modules(source, importer, is_package, found):
    out = imports_in(source, importer, KNOWN, is_package=is_package)
    assert [(kind, i.module) for kind, i in out] == found


def tree(root: Path, files: Mapping[str, str]) -> Graph:
    """A product of ``files`` (path: source) under ``root``, and its graph."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return build_graph(root, sorted({rel.partition("/")[0] for rel in files}))


def test_a_cycle_is_found_and_shown(tmp_path):
    graph = tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/c.py": "import pkg.a\n",
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": "def f():\n    from pkg.c import g\n",  # in a function: still a cycle
        "pkg/d.py": "import pkg.a\n",  # reaches the cycle, is not on it
    })
    assert [show_chain(c) for c in graph.cycles()] == ["pkg.a -> pkg.b -> pkg.c -> pkg.a"]


def test_a_package_importing_its_own_submodules_is_no_cycle(tmp_path):
    graph = tree(tmp_path, {
        "pkg/__init__.py": "from pkg.sub import thing\nfrom . import other\n",
        "pkg/sub.py": "from pkg.other import x\n",  # runs pkg/__init__ first: no cycle
        "pkg/other.py": "import pkg.deep.leaf\n",
        "pkg/deep/__init__.py": "",
        "pkg/deep/leaf.py": "from .. import other\n",  # a real cycle, through the sub-package
    })
    assert graph.cycles() == [["pkg.deep.leaf", "pkg.other", "pkg.deep.leaf"]]
    assert graph.chain("pkg.sub", ["pkg.deep"]) == ["pkg.sub", "pkg.other", "pkg.deep"]
    assert "pkg" in graph.reachable("pkg.sub")  # the package above is reached...
    assert graph.edges("pkg.sub") == ["pkg.other"]  # ...but is no edge of a cycle


def test_a_submodule_importing_a_name_from_its_package_is_a_cycle(tmp_path):
    graph = tree(tmp_path, {
        "pkg/__init__.py": "from pkg.sub import thing\nNAME = 1\n",
        "pkg/sub.py": "from pkg import NAME\n",
    })
    assert graph.cycles() == [["pkg", "pkg.sub", "pkg"]]


def test_an_import_of_a_submodule_runs_its_package_and_can_close_a_cycle(tmp_path):
    graph = tree(tmp_path, {
        "app/__init__.py": "",
        "app/x.py": "from lib.sub import y\n",  # runs lib/__init__ first
        "lib/__init__.py": "def load():\n    from app import x\n",
        "lib/sub.py": "",
    })
    assert [show_chain(c) for c in graph.cycles()] == ["app.x -> lib -> app.x"]


def test_type_only_imports_close_no_cycle_but_count_for_layers(tmp_path):
    graph = tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "import pkg.b\n",
        "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n",
    })
    assert graph.cycles() == []
    assert graph.chain("pkg.b", ["pkg.a"]) == ["pkg.b", "pkg.a"]
    assert graph.in_functions() == []


def test_imports_in_functions_are_listed_with_their_reasons(tmp_path):
    source = ("import os\n"
              "from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n"
              "    import pkg.b\n"
              "def f():\n"
              "    import json\n"  # third-party: not counted
              "    # pkg.b imports us at its top\n"
              "    import pkg.b\n"
              "    from pkg import c  # only the plotting path needs c\n"
              "    from pkg.b import (\n"
              "        x,  # the reason may sit on any line of the statement\n"
              "    )\n"
              "    y = 0\n"
              "    import pkg.c  # noqa: F401\n"
              "class K:\n"
              "    def g(self):\n"
              "        x = 1  # a comment for another line\n"
              "        import pkg.c\n"
              "    def h(self):\n"
              "        # one reason for the group below\n"
              "        import pkg.b\n"
              "        import pkg.c\n")
    graph = tree(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": source,
                            "pkg/b.py": "", "pkg/c.py": ""})
    found = graph.in_functions()
    assert [(path, i.line, i.module) for path, i in found] == [
        ("pkg/a.py", 8, "pkg.b"), ("pkg/a.py", 9, "pkg.c"), ("pkg/a.py", 10, "pkg.b"),
        ("pkg/a.py", 14, "pkg.c"), ("pkg/a.py", 18, "pkg.c"), ("pkg/a.py", 21, "pkg.b"),
        ("pkg/a.py", 22, "pkg.c")]
    assert [has_reason(source, i) for _, i in found] == [
        True, True, True, False, False, True, True]


def test_the_shortest_chain_is_shown_through_packages_and_to_third_parties(tmp_path):
    graph = tree(tmp_path, {
        "app/__init__.py": "",
        "app/a.py": "import app.b\nimport app.long1\n",
        "app/b.py": "from lib.sub import y\n",  # runs lib/__init__ first
        "app/long1.py": "import app.long2\n",
        "app/long2.py": "import torch\n",
        "lib/__init__.py": "import horovod.torch as hvd\n",
        "lib/sub.py": "",
    })
    assert show_chain(graph.chain("app.a", ["horovod"])) == "app.a -> app.b -> lib -> horovod.torch"
    assert graph.chain("app.a", ["torch"]) == ["app.a", "app.long1", "app.long2", "torch"]
    assert graph.chain("lib.sub", ["torch", "horovod"]) is None
    rule = Rule("app", ("app",), ("horovod",))
    assert violations(graph, rule) == ["app.a -> app.b -> lib -> horovod.torch",
                                       "app.b -> lib -> horovod.torch"]


# --- no test hooks in the product ---------------------------------------------------------

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
    assert {"commbench/comm/base.py", "launch/sweep.py", "analysis/plot.py",
            "docker/Dockerfile", "commbench/steploop.py", "commbench/comm/algos.py"} <= names


@pytest.mark.parametrize("path", _product_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_product_module_reads_a_test_hook_or_imports_the_tests(path: Path):
    text = path.read_text(errors="replace")
    hits = [f"{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
            if TEST_HOOK in line]
    assert hits == [], f"{path.relative_to(ROOT)} names test hooks (move them to tests/fakes.py)"
    if path.suffix == ".py":
        name, is_package = module_name(path, ROOT)
        names = [i.module for kind, i in imports_in(text, name, set(GRAPH.modules),
                                                    is_package=is_package) if kind == "external"]
        assert [n for n in names if under(n, ("tests",))] == []
