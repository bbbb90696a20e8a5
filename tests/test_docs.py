"""The docs against the tree: the layout listing, relative links, the README's commands.

Pure file reading (no process, no import of the project's modules): fast, no lock.

- ``docs/layout.md`` lists every module: each ``.py`` file under the code
  packages appears as a line ``- `path` — ...`` (a package's ``__init__.py`` and
  ``__main__.py`` by its folder, ``path/``), and every listed path exists.
- Every relative link in ``README.md`` and ``docs/*.md`` points at an existing file
  (and, for a Markdown page, at one of its headings where it names one).
- The README starts with the two commands, and CI (``.ci/run``) runs its test command.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = ROOT / "docs" / "layout.md"
CODE_DIRS = ("commbench", "launch", "analysis", "benchmarks")
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
