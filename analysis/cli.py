"""What every ``python -m analysis.*`` command shares: flags, errors, warnings.

Bad input ends the command with one line on stderr naming the cause and exit
status 2, never a traceback, and before any output file is written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

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
