"""The docs against the tree: the layout listing, relative links, the README's commands,
and the values the docs state that the code also states.

Pure file reading (no process, no import of the project's modules) but for the flag tables'
defaults, read from the tools' parsers (imported: torch): fast, no lock.

- ``docs/layout.md`` lists every module: each ``.py`` file under the code
  packages appears as a line ``- `path` — ...`` (a package's ``__init__.py`` and
  ``__main__.py`` by its folder, ``path/``), and every listed path exists.
- Every relative link in ``README.md`` and ``docs/*.md`` points at an existing file
  (and, for a Markdown page, at one of its headings where it names one).
- The README starts with the two commands, and CI (``.ci/run``) runs its test command.
- Every reference in backticks or in a fenced command resolves against the code, read
  with ``ast``: dotted names (``commbench.results.read_records``, ``Strategy.algos_for``),
  repository paths, ``python -m`` modules, ``--flags`` (the project's parsers define them,
  or ``ALLOW_LIST`` names their program), names in code font (``COMMBENCH_VENV``) and a
  call's keywords; one assertion lists them all as ``page:line: `ref` — why``.
- The schema the docs call current (`` `schema` (currently N``) is
  ``commbench.results.SCHEMA_VERSION``, and every table with a ``flag`` and a ``default``
  column gives each flag's default as the parser of the tool its page's title names
  (``python -m commbench.microbench``) has it.
"""

from __future__ import annotations

import ast
import functools
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = ROOT / "docs" / "layout.md"
CODE_DIRS = ("commbench", "launch", "analysis", "benchmarks", "experiments")
PACKAGE_FILES = ("__init__.py", "__main__.py")  # listed by their package's folder
DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: a listing line: ``- `commbench/comm/ring.py` — what it is``
LISTED = re.compile(r"^- `([^`]+)`\s+(?:—|–|-)\s+\S")
#: a Markdown link or image target: ``[text](target)``; the target ends at a space or ")"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*```")


def listed_paths() -> list[str]:
    return [m.group(1) for line in LAYOUT.read_text().splitlines()
            if (m := LISTED.match(line))]


def modules() -> list[str]:
    """Every .py file of the code packages, relative to the root (caches left out)."""
    out = []
    for top in CODE_DIRS:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" not in path.parts:
                out.append(path.relative_to(ROOT).as_posix())
    return out


def expected_entry(module: str) -> str:
    """What the listing must hold for ``module``: its path, or its package's folder."""
    folder, _, name = module.rpartition("/")
    return f"{folder}/" if name in PACKAGE_FILES else module


def test_layout_lists_something() -> None:
    paths = listed_paths()
    assert len(paths) >= len(CODE_DIRS), f"no listing lines (`- `path` — ...`) in {LAYOUT}"
    assert len(paths) == len(set(paths)), \
        f"listed twice: {sorted({p for p in paths if paths.count(p) > 1})}"


def test_every_module_is_listed() -> None:
    listed = set(listed_paths())
    missing = sorted({expected_entry(m) for m in modules()} - listed)
    assert not missing, (f"{LAYOUT.relative_to(ROOT)} misses these modules (add one line "
                         f"each: - `path` — what it is): {missing}")


def test_every_listed_path_exists() -> None:
    gone = [p for p in listed_paths()
            if not (ROOT / p).exists() or (p.endswith("/") and not (ROOT / p).is_dir())]
    assert not gone, f"{LAYOUT.relative_to(ROOT)} lists paths that do not exist: {gone}"


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in ``page`` outside fenced code blocks."""
    out, fenced = [], False
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out += [(n, target) for target in LINK.findall(line)]
    return out


def relative_links(page: Path) -> list[tuple[int, str]]:
    """Links to files: not a URL (http:, mailto:, ...), not a heading of the same page."""
    return [(n, t) for n, t in links(page)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I) and not t.startswith("#")]


def same_page_anchors(page: Path) -> list[tuple[int, str]]:
    return [(n, t) for n, t in links(page) if t.startswith("#")]


def anchors(page: Path) -> set[str]:
    """The heading anchors GitHub makes for ``page``: lower case, punctuation dropped
    (hyphens and underscores kept), spaces as hyphens; a repeated one gets ``-1``, ``-2``."""
    seen: dict[str, int] = {}
    out, fenced = set(), False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        if fenced or not (m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_point_at_files(page: Path) -> None:
    broken = []
    for n, target in relative_links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve()
        if not resolved.exists():
            broken.append(f"line {n}: {target}")
        elif not resolved.is_relative_to(ROOT):
            broken.append(f"line {n}: {target} (outside the repository)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"line {n}: {target} (no such heading)")
    for n, target in same_page_anchors(page):
        if target[1:] not in anchors(page):
            broken.append(f"line {n}: {target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


def test_link_finder_sees_links() -> None:
    """The checker would pass vacuously if it found no links: the README links the docs."""
    targets = [t for _, t in relative_links(ROOT / "README.md")]
    assert "docs/layout.md" in targets, targets


def test_readme_starts_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```sh\n(.*?)```", text, re.S)
    assert block and text.index(block.group(0)) < text.index("\n## "), \
        "README.md must open with a ```sh block before its first section"
    commands = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    assert commands == ["make run", "make test"], commands


def test_ci_runs_the_readme_test_command() -> None:
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert "make test" in ci, f".ci/run no longer runs `make test` (the README's): {ci}"


# -- References in the docs, resolved against the code ----------------------------------
#
# Every backticked reference in README.md and docs/*.md, and every project command line in
# their fenced blocks, is resolved statically (``ast`` and file lookups: no import, so no
# torch or MPI): dotted names (``commbench.results.read_records``), repository paths
# (``launch/commands.py``), ``python -m`` modules, and ``--flags``. One test lists every
# reference that does not resolve, as ``page:line: `ref` — why``.

#: packages a dotted name may start with (``tests`` for ``python -m tests.fakes``, faults.md)
PACKAGES = (*CODE_DIRS, "tests")
#: the repository's top-level folders: a backticked path that starts with one must exist
REPO_DIRS = (*CODE_DIRS, "tests", "docker", "scripts", "profiles", "docs", ".ci")
#: Python files whose parsers define the flags: the code packages and the test fakes
#: (faults.md documents ``--fault`` and its kin)
FLAG_FILES = (*CODE_DIRS, "tests/fakes.py")
#: shell scripts whose ``case`` patterns define flags (``docker/build.sh --local-base``)
SCRIPT_DIRS = ("docker", "scripts")
#: where a name in code font (``COMMBENCH_VENV``, ``mpirun_emulated``) must occur
NAME_SOURCES = (*CODE_DIRS, "tests", "docker", "scripts", "Makefile", ".ci")
CODE_SUFFIXES = (".py", ".sh", ".in", ".yml", ".yaml", ".toml", "")  # "": Makefile, .ci/run

#: flags of other programs that the docs name on their own, in backticks (a command line
#: of another program, ``mpirun ...``, is skipped up to the project program it runs)
ALLOW_LIST = frozenset({
    # mpirun (Open MPI)
    "--allow-run-as-root",
    # horovodrun
    "--gloo", "--mpi", "--timeline-filename",
    # docker-compose
    "--exit-code-from",
})
#: names from outside the repository that the docs put in code font and no code spells
OUTSIDE_NAMES = frozenset({
    "btl_tcp_flags",  # Open MPI: an MCA parameter of its TCP transport (analysis.md)
})

#: a code span: a run of backticks, the code, the same run (CommonMark)
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
#: a dotted name in a project package: ``commbench.results.read_records``, ``launch.*``
DOTTED = re.compile(rf"(?<![\w./:-])((?:{'|'.join(PACKAGES)})(?:\.(?:[A-Za-z_]\w*|\*))+)")
#: a name in code font, maybe called: ``mpirun_emulated``, ``mpirun(np, prog, hostfile=…)``
CODE_NAME = re.compile(r"^([A-Za-z_]\w*)(?:\((.*)\))?$")
#: a short form: ``Class.attr`` or ``module.attr`` without the package
SHORT = re.compile(r"^([A-Za-z_]\w*)\.([A-Za-z_]\w*)(?:\(\))?$")
#: a path in the repository: ``commbench/comm/ring.py``, ``./scripts/setup.sh``, ``tests/mpi/``
REPO_PATH = re.compile(r"(?<![\w./<>~-])(?:\./)?((?:" + "|".join(map(re.escape, REPO_DIRS))
                       + r")/[^\s`'\",;:()]*)")
#: a long flag: ``--bucket-mb``, also inside ``--extra-args "RANK:--steps 4"``
FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")
#: a span that maps an outside name to a flag: ``bucket_cap_mb = --bucket-mb``
NAME_IS_FLAG = re.compile(r"^\w+ = (--[A-Za-z][\w-]*)$")
#: a shell ``case`` pattern of flags: ``    --local-base)`` or ``--a|--b)``
CASE_FLAGS = re.compile(r"^\s*(--[\w-]+(?:\s*\|\s*--[\w-]+)*)\)", re.M)
ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
SEPARATORS = {"&&", "||", ";", "|", "&", ";;"}
SHELL_WORDS = {"do", "then", "else", "done", "fi", "time", "exec"}
#: a placeholder in a dotted name: ``python -m commbench.X``, ``commbench.*``
PLACEHOLDER = re.compile(r"^(?:\*|[A-Z])$")

Finding = tuple[int, str, str]  # line, reference, why it does not resolve
Lines = list[tuple[int, str]]  # (line number, text), or (line number, word) of a command


class Unresolved(Exception):
    """A name that is not there; the message says which part is missing."""


# -- the code, read statically -------------------------------------------------------------

def module_file(parts: list[str]) -> Path | None:
    """The file of module ``parts`` (a namespace package's folder), or None."""
    if not parts or parts[0] not in PACKAGES or not all(p.isidentifier() for p in parts):
        return None
    base = ROOT.joinpath(*parts)
    if base.with_name(base.name + ".py").is_file():
        return base.with_name(base.name + ".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.is_dir() and any(base.glob("*.py")):
        return base  # a folder of modules without __init__.py (benchmarks/)
    return None


def python_files(tops: tuple[str, ...]) -> list[Path]:
    out = []
    for top in tops:
        path = ROOT / top
        files = [path] if path.is_file() else sorted(path.rglob("*.py"))
        out += [f for f in files if "__pycache__" not in f.parts]
    return out


@functools.cache
def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """A module's statements, into if/try/with/for blocks but not into defs."""
    for node in body:
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for field in ("body", "orelse", "finalbody"):
                yield from _statements(getattr(node, field, []))
            for handler in getattr(node, "handlers", []):
                yield from _statements(handler.body)


def _targets(node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, (ast.Tuple, ast.List)):
        for elt in node.elts:
            yield from _targets(elt)


def bound_names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Name -> the statement that binds it: defs, classes, assignments, imports."""
    names: dict[str, ast.AST] = {}
    for node in _statements(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names.update(dict.fromkeys(_targets(target), node))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            names.update(dict.fromkeys(_targets(node.target), node))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = node
    return names


def class_members(cls: ast.ClassDef) -> dict[str, ast.AST]:
    """Methods, class attributes, dataclass fields, ``__slots__`` and ``self.x = ...``."""
    members = bound_names(cls.body)
    for node in ast.walk(cls):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name) and node.value.id == "self"):
            members.setdefault(node.attr, node)
    slots = members.get("__slots__")
    if isinstance(slots, ast.Assign):
        for elt in ast.walk(slots.value):
            if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                members.setdefault(elt.value, slots)
    return members


def _imported(node: ast.Import | ast.ImportFrom, name: str, module: str, path: Path) -> str:
    """The absolute dotted name that ``name``, bound by import ``node`` in ``module``, is."""
    alias = next(a for a in node.names if (a.asname or a.name.split(".")[0]) == name)
    if isinstance(node, ast.Import):
        return alias.name if alias.asname else name
    source = node.module or ""
    if node.level:
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        source = f"{package}.{source}" if source else package
    return f"{source}.{alias.name}"


def lookup(dotted: str, depth: int = 0) -> ast.AST | None:
    """The definition ``dotted`` names (a module, class or function), or None where the code
    cannot say more (a variable's attributes, a name from outside the project).

    The longest prefix that is a module file, then the attribute chain: module-level
    names, re-exports followed through imports, a class's members and its project bases.
    Raises ``Unresolved`` with the missing part.
    """
    parts = dotted.split(".")
    n = next((n for n in range(len(parts), 0, -1) if module_file(parts[:n])), 0)
    if n == 0:
        raise Unresolved(f"no module `{parts[0]}`" if len(parts) == 1 else "no such module")
    module, path = ".".join(parts[:n]), module_file(parts[:n])
    if path is None or path.is_dir():
        if n < len(parts):
            raise Unresolved(f"no module `{module}.{parts[n]}`")
        return None
    return _member(module, path, parse(path), parts[n:], depth)


def _member(module: str, path: Path, node: ast.AST | None, rest: list[str],
            depth: int) -> ast.AST | None:
    where = module
    for i, name in enumerate(rest):
        if depth > 20:
            return None  # an import cycle: nothing to report
        if isinstance(node, ast.Module):
            found = bound_names(node.body).get(name)
        elif isinstance(node, ast.ClassDef):
            found = class_members(node).get(name)
            if found is None:
                return _inherited(module, path, node, rest[i:], depth, where)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            raise Unresolved(f"`{where}` is a function; it has no `{name}`")
        else:
            return None
        if found is None and where == module and path.name == "__init__.py":
            raise Unresolved(f"no module `{module}.{name}`, and `{module}` defines no `{name}`")
        if found is None:
            raise Unresolved(f"`{where}` has no `{name}`")
        if isinstance(found, (ast.Import, ast.ImportFrom)):
            target = _imported(found, name, module, path)
            if target.split(".")[0] not in PACKAGES:
                return None  # from outside the project: not checked
            return lookup(".".join([target, *rest[i + 1:]]), depth + 1)
        node, where = found, f"{where}.{name}"
    return node


def _inherited(module: str, path: Path, cls: ast.ClassDef, rest: list[str], depth: int,
               where: str) -> ast.AST | None:
    """``rest[0]`` from a base of ``cls`` that the project defines."""
    for base in cls.bases:
        chain = []
        while isinstance(base, ast.Attribute):
            chain.insert(0, base.attr)
            base = base.value
        if not isinstance(base, ast.Name):
            continue
        try:
            found = _member(module, path, parse(path), [base.id, *chain, *rest], depth + 1)
        except Unresolved:
            continue
        if found is not None or _is_project_class(module, path, [base.id, *chain]):
            return found
    raise Unresolved(f"`{where}` has no `{rest[0]}`")


def _is_project_class(module: str, path: Path, chain: list[str]) -> bool:
    try:
        return isinstance(_member(module, path, parse(path), chain, 0), ast.ClassDef)
    except Unresolved:
        return False


class Index(NamedTuple):
    classes: dict[str, list[str]]  # module-level class -> the modules defining it
    functions: dict[str, list[tuple[str, ast.FunctionDef]]]  # module-level function -> defs
    modules: dict[str, list[str]]  # last name -> modules (``results`` -> commbench.results)
    outside: frozenset[str]  # packages the code imports from outside (``horovod``, ``torch``)


@functools.cache
def project_index() -> Index:
    classes: dict[str, list[str]] = {}
    functions: dict[str, list[tuple[str, ast.FunctionDef]]] = {}
    modules: dict[str, list[str]] = {}
    outside = set()
    for path in python_files(CODE_DIRS):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts[:-1]) if rel.name in ("__init__", "__main__") else list(rel.parts)
        module = ".".join(parts)
        if rel.name != "__main__":
            modules.setdefault(parts[-1], []).append(module)
        tree = parse(path)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(module)
            elif isinstance(node, ast.FunctionDef):
                functions.setdefault(node.name, []).append((module, node))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                outside.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                outside.add(node.module.split(".")[0])
    return Index(classes, functions, modules, frozenset(outside - set(PACKAGES)))


@functools.cache
def code_words() -> frozenset[str]:
    """Every word of the repository's code, tests, scripts and image files (but this file,
    whose examples would otherwise vouch for themselves)."""
    words: set[str] = set()
    for top in NAME_SOURCES:
        path = ROOT / top
        for f in [path] if path.is_file() else sorted(path.rglob("*")):
            if f.is_file() and f.suffix in CODE_SUFFIXES and f != Path(__file__).resolve():
                words.update(re.findall(r"\w+", f.read_text(errors="replace")))
    return frozenset(words)


@functools.cache
def project_flags() -> frozenset[str]:
    """Every ``--flag`` the project's parsers define, read from the source.

    A string starting with ``--`` passed to ``add_argument`` or to any call whose name
    says ``flag`` (``add_flag(group, defaults, "--x")``, ``flag("--x")``), given as
    ``flag="--x"``, the value of a ``"flag"`` key (dataclass field metadata) or of a name
    that says ``flag`` (``LATENCY_FLAG = "--x"``, shared by several parsers); and the
    ``case`` patterns of the project's shell scripts.
    """
    def dashed(node: ast.AST | None) -> list[str]:
        ok = (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and node.value.startswith("--"))
        return [node.value] if ok else []

    flags = {"--help"}  # argparse gives every parser its own
    for path in python_files(FLAG_FILES):
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name == "add_argument" or "flag" in name.lower():
                    for arg in node.args:
                        flags.update(dashed(arg))
                for kw in node.keywords:
                    if kw.arg == "flag":
                        flags.update(dashed(kw.value))
            elif isinstance(node, ast.Assign):
                if any("flag" in getattr(t, "id", "").lower() for t in node.targets):
                    flags.update(dashed(node.value))
            elif isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values):
                    if isinstance(key, ast.Constant) and key.value == "flag":
                        flags.update(dashed(value))
    for folder in SCRIPT_DIRS:
        for script in sorted((ROOT / folder).glob("*.sh")):
            for m in CASE_FLAGS.finditer(script.read_text()):
                flags.update(f.strip() for f in m.group(1).split("|"))
    return frozenset(flags)


# -- the docs, read -------------------------------------------------------------------------

def page_parts(page: Path) -> tuple[list[Lines], list[tuple[str, Lines]]]:
    """The page's paragraphs (prose lines between blank lines; a table row on its own) and
    its fenced blocks (info string, lines), every line with its number."""
    paragraphs: list[Lines] = [[]]
    blocks: list[tuple[str, Lines]] = []
    fence: Lines | None = None
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(line):
            if fence is None:
                fence = []
                blocks.append((line.strip().strip("`").strip(), fence))
            else:
                fence = None
            paragraphs.append([])
        elif fence is not None:
            fence.append((n, line))
        elif not line.strip() or line.lstrip().startswith("|"):
            paragraphs += [[(n, line)], []] if line.strip() else [[]]
        else:
            paragraphs[-1].append((n, line))
    return [p for p in paragraphs if p], blocks


def code_spans(paragraph: Lines) -> Lines:
    """(line, code) of every code span in ``paragraph``; a span may wrap a line."""
    text = "\n".join(line for _, line in paragraph)
    out = []
    for m in CODE_SPAN.finditer(text):
        code = m.group(2).replace("\n", " ")
        if code.startswith(" ") and code.endswith(" ") and code.strip():
            code = code[1:-1]
        out.append((paragraph[0][0] + text.count("\n", 0, m.start()), code))
    return out


def shell_words(text: str, comments: bool) -> list[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#" if comments else ""
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote: prose, not a command
        return text.split()


# -- the checks -----------------------------------------------------------------------------

def check_dotted(line: int, dotted: str) -> list[Finding]:
    parts = dotted.split(".")
    cut = next((i for i, p in enumerate(parts) if PLACEHOLDER.match(p)), len(parts))
    try:
        lookup(".".join(parts[:cut]))
    except Unresolved as e:
        return [(line, dotted, str(e))]
    return []


def check_short(line: int, code: str) -> list[Finding]:
    """``Strategy.algos_for``, ``results.read_records``: where the first name is one
    project class, or one project module that no outside package shares, resolve it."""
    if not (m := SHORT.match(code)):
        return []
    first, attr = m.groups()
    index = project_index()
    if len(index.classes.get(first, [])) == 1:
        owner = f"{index.classes[first][0]}.{first}"
    elif len(index.modules.get(first, [])) == 1 and first not in index.outside:
        owner = index.modules[first][0]
    else:
        return []  # not the project's, or not one place
    return [(line, code, why) for _, _, why in check_dotted(line, f"{owner}.{attr}")]


def check_name(line: int, code: str) -> list[Finding]:
    """A name in code font that looks like code (``mpirun_emulated``, ``COMMBENCH_VENV``,
    ``srun(ntasks, prog)``) is a word of the code; a call's keywords are parameters of
    the one project function of that name."""
    if not (m := CODE_NAME.match(code)):
        return []
    name, args = m.groups()
    if name in OUTSIDE_NAMES or ("_" not in name.strip("_") and args is None):
        return []
    if name not in code_words():
        return [(line, name, "named nowhere in the code")]
    defs = project_index().functions.get(name, [])
    if args is None or len(defs) != 1 or defs[0][1].args.kwarg:
        return []
    module, func = defs[0]
    params = {a.arg for a in [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]}
    return [(line, f"{name}({kw}=…)", f"`{module}.{name}` takes no `{kw}`")
            for kw in re.findall(r"(?<![\w.])([A-Za-z_]\w*)\s*=(?!=)", args) if kw not in params]


def check_paths(line: int, text: str) -> list[Finding]:
    out = []
    for m in REPO_PATH.finditer(text):
        ref = m.group(1).rstrip(".")
        pattern = re.sub(r"<[^>]*>", "*", ref).rstrip("/")
        hits = list(ROOT.glob(pattern)) if "*" in pattern else [ROOT / pattern]
        if ref.endswith("/"):
            hits = [h for h in hits if h.is_dir()]
        if not any(h.exists() for h in hits):
            out.append((line, ref, "no such file" if "*" not in pattern else "matches no file"))
    return out


def check_flags(words: Lines, allowed: frozenset[str] = frozenset()) -> list[Finding]:
    out = []
    for line, word in words:
        for flag in FLAG.findall(word):
            if flag not in project_flags() and flag not in allowed:
                out.append((line, flag, "no project parser defines it"))
    return out


def check_module(line: int, module: str, rest: Lines) -> list[Finding]:
    """``python -m module rest...``: a module ``python -m`` can run, then its flags
    (after ``--``, the program it wraps; after ``-m``, the module a wrapper runs)."""
    parts = module.split(".")
    if parts[0] not in PACKAGES:
        return []  # python -m pytest, pip, ...: not checked
    if any(PLACEHOLDER.match(p) for p in parts):
        return check_dotted(line, module)
    path = module_file(parts)
    if path is None:
        return [(line, module, "no such module")]
    if path.is_dir() or (path.name == "__init__.py"
                         and not (path.parent / "__main__.py").is_file()):
        return [(line, module, "a package without __main__.py: `python -m` cannot run it")]
    out: list[Finding] = []
    for i, (n, word) in enumerate(rest):
        if word == "--":
            wrapped = rest[i + 1:]
            if wrapped and wrapped[0][1].startswith("-"):
                return out + check_flags(wrapped)  # handed on: launch.sweep ... -- --steps 20
            return out + check_command(wrapped)
        if word == "-m" and i + 1 < len(rest):
            return out + check_module(n, rest[i + 1][1], rest[i + 2:])
        if word.startswith("--"):
            out += check_flags([(n, word.split("=", 1)[0])])
    return out


def _is_python(word: str) -> bool:
    return re.fullmatch(r"(?:\S*/)?python(?:3(?:\.\d+)?)?", word) is not None


def check_command(words: Lines) -> list[Finding]:
    """One command: a project program's flags must be the project's; another program's own
    flags (mpirun, horovodrun, docker-compose, ...) are skipped up to the python it runs.
    ``ARGS="..."`` (``make run``, the Docker entrypoint) is the project program's command line."""
    out: list[Finding] = []
    while words and (ASSIGNMENT.match(words[0][1]) or words[0][1] in SHELL_WORDS):
        out += _args_variable(*words[0])
        words = words[1:]
    if not words:
        return out
    (line, program), rest = words[0], words[1:]
    if _is_python(program):
        return out + _check_python(rest)
    if DOTTED.fullmatch(program) and rest:  # `commbench.allreduce --trace`
        return out + check_module(line, program, rest)
    if REPO_PATH.fullmatch(program):  # docker/build.sh --local-base
        return out + check_flags(rest)
    for i, (n, word) in enumerate(rest):
        out += _args_variable(n, word)  # make run ARGS="--steps 10"
        if _is_python(word):
            return out + _check_python(rest[i + 1:])
    return out


def _args_variable(line: int, word: str) -> list[Finding]:
    name, _, value = word.partition("=")
    return check_flags([(line, w) for w in shell_words(value, False)]) if name == "ARGS" else []


def _check_python(rest: Lines) -> list[Finding]:
    if len(rest) >= 2 and rest[0][1] == "-m":
        return check_module(rest[1][0], rest[1][1], rest[2:])
    if rest and REPO_PATH.fullmatch(rest[0][1]) and rest[0][1].split("/")[0] in CODE_DIRS:
        return check_flags(rest[1:])  # python benchmarks/instrumentation_overhead.py
    return []


def commands(lines: Lines) -> Iterator[Lines]:
    """The commands of a shell block: continued lines joined, split at ``;``, ``&&``, ``|``;
    a redirection's file dropped."""
    command: Lines = []
    skip = False
    for n, text in lines:
        continued = text.rstrip().endswith("\\")
        for word in shell_words(text.rstrip().rstrip("\\"), comments=True):
            if skip:
                skip = False
            elif word in SEPARATORS:
                yield command
                command = []
            elif word in (">", ">>", "<", "2>"):
                skip = True
            else:
                command.append((n, word))
        if not continued:
            yield command
            command = []
    yield command


def check_span(line: int, code: str, listed: bool) -> list[Finding]:
    """One backticked reference: its dotted names, paths, flags and command line."""
    out = [] if listed else check_paths(line, code)  # a layout line: checked above
    for m in DOTTED.finditer(code):
        out += check_dotted(line, m.group(1))
    out += check_short(line, code)
    out += check_name(line, code)
    if code.startswith("-"):  # `--bucket-mb 25`, `-b/--minbytes`
        out += check_flags([(line, code)], ALLOW_LIST)
    elif m := NAME_IS_FLAG.match(code):
        out += check_flags([(line, m.group(1))])
    else:
        out += check_command([(line, w) for w in shell_words(code, comments=False)])
    return out


def check_block(info: str, lines: Lines) -> list[Finding]:
    out = []
    if info == "toml":  # a sweep file: args = ["--steps", "20"], program = "commbench.ps"
        for n, text in lines:
            key, _, value = text.partition("=")
            if key.strip() == "args":
                out += check_flags([(n, w) for w in re.findall(r'"(--[^"]*)"', value)])
            elif key.strip() == "program" and (m := re.match(r'\s*"([^"]+)"', value)):
                out += check_module(n, m.group(1), [])
    elif info in ("", "sh", "bash", "shell", "console"):
        for n, text in lines:
            out += check_paths(n, text)
        for command in commands(lines):
            out += check_command(command)
    return out


def unresolved(page: Path) -> list[Finding]:
    listed = {n: m.group(1) for n, line in enumerate(page.read_text().splitlines(), 1)
              if page == LAYOUT and (m := LISTED.match(line))}
    paragraphs, blocks = page_parts(page)
    out = []
    for paragraph in paragraphs:
        for line, code in code_spans(paragraph):
            out += check_span(line, code, listed.get(line) == code)
    for info, lines in blocks:
        out += check_block(info, lines)
    first = {(line, ref): why for line, ref, why in reversed(out)}  # one report a reference
    return sorted((line, ref, why) for (line, ref), why in first.items())


def test_doc_references_resolve() -> None:
    """Every name, path, module and flag the docs put in backticks or in a command exists."""
    report = [f"{page.relative_to(ROOT)}:{line}: `{ref}` — {why}"
              for page in DOC_PAGES for line, ref, why in unresolved(page)]
    assert not report, (f"{len(report)} references in the docs do not resolve against "
                        "the code:\n" + "\n".join(report))


def test_reference_checker_sees_references() -> None:
    """The checker would pass vacuously if it read nothing: it knows the flags, resolves
    names, and refuses made-up ones."""
    assert {"--steps", "--bucket-mb", "--strategy"} <= project_flags()
    assert check_dotted(1, "commbench.results.read_records") == []
    assert check_dotted(1, "commbench.results.no_such_name")
    assert check_dotted(1, "commbench.no_such_module")
    assert check_flags([(1, "--no-such-flag")])
    assert check_command([(1, w) for w in shell_words(
        "mpirun -np 2 --oversubscribe python -m commbench.allreduce --no-such-flag", False)])
    spans = [s for page in DOC_PAGES for p in page_parts(page)[0] for s in code_spans(p)]
    assert len(spans) > 500, len(spans)


# -- Values in the docs, against the code ---------------------------------------------------
#
# Numbers the docs state that the code also states: the result records' schema version, and
# the defaults in a page's flag tables (a table with a `flag` and a `default` column), read
# from the parser of the tool the page's title names (`python -m commbench.microbench`).

#: the docs' statement of the current schema: "`schema` (currently 4; ..."
SCHEMA_STATED = re.compile(r"`schema`\s*\(currently\s+(\d+)")
#: a placeholder in a value: ``results/microbench-<time>.jsonl``
VALUE_PLACEHOLDER = re.compile(r"<[^>]*>")
#: a default cell in words for a switch
SWITCH_WORDS = {"off": False, "on": True}


def test_docs_state_the_schema_the_code_writes() -> None:
    node = lookup("commbench.results.SCHEMA_VERSION")
    assert isinstance(node, ast.Assign), "commbench.results.SCHEMA_VERSION is not a constant"
    schema = ast.literal_eval(node.value)
    stated = [(page.relative_to(ROOT).as_posix(), n, int(m.group(1)))
              for page in DOC_PAGES
              for n, line in enumerate(page.read_text().splitlines(), 1)
              for m in SCHEMA_STATED.finditer(line)]
    assert stated, "no page states the current schema (`schema` (currently N; ...)"
    wrong = [f"{page}:{n}: schema {v}" for page, n, v in stated if v != schema]
    assert not wrong, f"the records' schema is {schema} (commbench.results): {wrong}"


class FlagRow(NamedTuple):
    line: int
    flags: list[str]  # one code span each: `-b/--minbytes`, `--output FILE`
    default: str  # the default cell as written


def flag_tables(page: Path) -> list[FlagRow]:
    """The rows of every table of ``page`` whose header has a `flag` and a `default` column."""
    rows: list[FlagRow] = []
    cols: tuple[int, int] | None = None
    fenced = False
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        if fenced or not line.lstrip().startswith("|"):
            cols = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cols is None:
            head = [c.lower() for c in cells]
            cols = (head.index("flag"), head.index("default")) \
                if "flag" in head and "default" in head else (-1, -1)
        elif cols[0] >= 0 and not set(line.strip()) <= set("|-: "):
            spans = [code for _, code in code_spans([(n, cells[cols[0]])])]
            rows.append(FlagRow(n, spans, cells[cols[1]]))
    return rows


def page_tool(page: Path) -> str | None:
    """The tool a page documents, from its title: ``# ...: `python -m commbench.microbench```."""
    title = next((line for line in page.read_text().splitlines() if line.startswith("# ")), "")
    m = re.search(r"`python -m ([\w.]+)`", title)
    return m.group(1) if m else None


def _flag_defaults_checked(page: Path, rows: list[FlagRow]) -> tuple[list[str], int]:
    """(what disagrees, how many defaults were compared) for ``page``'s flag tables."""
    import importlib

    rel = page.relative_to(ROOT).as_posix()
    tool = page_tool(page)
    if tool is None:
        return [f"{rel}: a flag table, and the title names no `python -m` tool"], 0
    parser = importlib.import_module(tool).build_parser()
    actions = {opt: a for a in parser._actions for opt in a.option_strings}
    report, checked = [], 0
    for row in rows:
        found = []  # the row's actions, one per flag (aliases in their own span dropped)
        for span in row.flags:
            names = [f for f in re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", span) if f in actions]
            if not names:
                report.append(f"{rel}:{row.line}: `{span}` is no flag of {tool}")
            elif not found or actions[names[0]] is not found[-1]:
                found.append(actions[names[0]])
        values = [code for _, code in code_spans([(row.line, row.default)])]
        if not values:
            word = row.default.strip().lower()
            if word in SWITCH_WORDS:
                for a in found:  # a switch (store_true, ...) is on where its default is
                    checked += 1  # its const; a flag that takes a value is off as None
                    on = a.default == a.const if a.nargs == 0 else a.default is not None
                    if on != SWITCH_WORDS[word]:
                        report.append(f"{rel}:{row.line}: {a.option_strings[-1]} default "
                                      f"{a.default!r}, the docs say {row.default!r}")
            continue  # a default in words (`the library's choice`): not a value to compare
        if len(values) == 1:
            values = values * len(found)
        if len(values) != len(found):
            report.append(f"{rel}:{row.line}: {len(found)} flags and {len(values)} defaults")
            continue
        for a, text in zip(found, values):
            if VALUE_PLACEHOLDER.search(text):
                continue  # a pattern, not a value
            convert = a.type or (lambda x: x)
            default = convert(a.default) if isinstance(a.default, str) else a.default
            try:
                stated = convert(text)
            except Exception as e:  # the parser's own reading of the value
                report.append(f"{rel}:{row.line}: {a.option_strings[-1]} cannot take the "
                              f"documented default `{text}`: {e}")
                continue
            checked += 1
            if stated != default:
                report.append(f"{rel}:{row.line}: {a.option_strings[-1]} default "
                              f"{a.default!r}, the docs say `{text}`")
    return report, checked


def test_flag_tables_state_the_parsers_defaults() -> None:
    """A table with `flag` and `default` columns states each flag's default as its tool's
    parser has it (imports the tool: its parser is built by code, not written out)."""
    pytest.importorskip("torch")
    pages = [(page, rows) for page in DOC_PAGES if (rows := flag_tables(page))]
    assert pages, "no flag tables (`| flag | default | ... |`) in the docs"
    report, checked = [], 0
    for page, rows in pages:
        r, c = _flag_defaults_checked(page, rows)
        report += r
        checked += c
    assert not report, "flag defaults in the docs disagree with the parsers:\n" + "\n".join(report)
    assert checked >= 10, f"only {checked} defaults compared: the table reader sees too little"


def test_default_checker_refuses_wrong_defaults() -> None:
    """The checker would pass vacuously if it compared nothing: wrong defaults are refused."""
    pytest.importorskip("torch")
    page = ROOT / "docs" / "microbench.md"
    assert page_tool(page) == "commbench.microbench"
    rows = [FlagRow(1, ["-b/--minbytes", "-e/--maxbytes"], "`8`, `64M`"),
            FlagRow(2, ["--sync-each"], "on"),
            FlagRow(3, ["-d/--datatype", "--dtype"], "`float16`"),
            FlagRow(4, ["--no-such-flag"], "`1`"),
            FlagRow(5, ["-n/--iters"], "`20`"),
            FlagRow(6, ["--output FILE"], "`results/x-<time>.jsonl`")]
    report, checked = _flag_defaults_checked(page, rows)
    assert [r.split(": ", 1)[1] for r in report] == [
        "--maxbytes default 33554432, the docs say `64M`",
        "--sync-each default False, the docs say 'on'",
        "--dtype default ['float32'], the docs say `float16`",
        "`--no-such-flag` is no flag of commbench.microbench"], report
    assert checked == 5  # --minbytes, --maxbytes, --sync-each, --dtype, --iters
