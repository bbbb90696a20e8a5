"""What every ``python -m analysis.*`` command shares: flags, errors, warnings.

Bad input ends the command with one line on stderr naming the cause and exit
status 2, never a traceback, and before any output file is written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from analysis.load import LoadError


class UsageError(Exception):
    """A bad command line or input; the message names the cause."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump; exit 2 in run()
        raise UsageError(message)


def parser(prog: str, description: str) -> Parser:
    return Parser(prog=f"python -m {prog}", description=description,
                  formatter_class=argparse.ArgumentDefaultsHelpFormatter)


def warn(prog: str, messages: Sequence[str]) -> None:
    for m in messages:
        print(f"{prog}: warning: {m}", file=sys.stderr)


def run(prog: str, body: Callable[[list[str]], int], argv: list[str] | None) -> int:
    """Run ``body(argv)``; turn usage and input errors into one line and exit status 2."""
    try:
        return body(sys.argv[1:] if argv is None else argv)
    except (UsageError, LoadError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 1


def entry(prog: str, body: Callable[[list[str]], int]) -> Callable[[list[str] | None], int]:
    """A module's ``main(argv=None)``: ``body`` run under ``run``'s error rule."""
    def main(argv: list[str] | None = None) -> int:
        return run(prog, body, argv)
    return main


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn a failure to write ``path`` (the ``-o/--output`` flag's) into a UsageError."""
    try:
        yield
    except OSError as e:
        raise UsageError(f"-o/--output: cannot write {path}: {e.strerror}") from None


def output_dir(path: str | Path, create: bool = True) -> Path:
    """The ``-o/--output`` directory: refused when it is a file; made when ``create``."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o/--output: {out} is not a directory")
    if create:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"-o/--output: cannot create {out}: {e.strerror}") from None
    return out
