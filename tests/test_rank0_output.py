"""Rank 0's printed lines reach a line-tagging launcher whole: text and newline in one
write (``commbench.tables.rank0_print``), as under ``horovodrun`` (PYTHONUNBUFFERED, Open
MPI's ``--tag-output``) ``print``'s two writes let the last line lose its newline."""

from __future__ import annotations

import io

from commbench.tables import rank0_print


class Writes(io.StringIO):
    """A text stream that keeps each write apart."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []
        self.flushed = 0

    def write(self, s: str) -> int:
        self.writes.append(s)
        return super().write(s)

    def flush(self) -> None:
        self.flushed += 1


def test_a_line_and_its_newline_are_one_write():
    out = Writes()
    rank0_print(0, "# hosts: a\n# results: results/x.jsonl", file=out)
    assert out.writes == ["# hosts: a\n# results: results/x.jsonl\n"] and out.flushed


def test_other_ranks_print_nothing():
    out = Writes()
    rank0_print(1, "results: x", file=out)
    assert out.writes == []

