"""COPY ... TO STDOUT text format -> rows in pgoutput's text form. Pure.

COPY writes each value with the type's output function, as pgoutput's text mode does, then escapes
backslash, tab, newline, carriage return, backspace, form feed and vertical tab, and writes NULL as ``\\N``.
Undoing that gives the exact strings the stream would carry, so snapshot rows go through the same encoder.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from cdcd.pgoutput.messages import Row

_ESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r", "b": "\b", "f": "\f", "v": "\v"}
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)


class CopyFormatError(ValueError):
    """A COPY text line that PostgreSQL's COPY TO would not write."""


def _unescape_match(match: re.Match[str]) -> str:
    char = match.group(1)
    try:
        return _ESCAPES[char]
    except KeyError:
        raise CopyFormatError(f"unexpected escape \\{char} in COPY text output") from None


def _field(text: str) -> str | None:
    if text == "\\N":
        return None
    if "\\" not in text:
        return text
    return _ESCAPE.sub(_unescape_match, text)


def parse_line(line: str, width: int) -> Row:
    """One COPY text line (without its newline) as a row of ``width`` text values (None for NULL)."""
    fields = line.split("\t")
    if len(fields) != width:
        raise CopyFormatError(f"COPY line has {len(fields)} fields, expected {width}")
    if "\\" not in line:
        return tuple(fields)
    return tuple(map(_field, fields))


RowReader = Callable[[bytes, int], Row]  # read(line with its newline, width): one COPY text row
RowsReader = Callable[[bytes, int], list[Row]]  # read(lines, each with its newline, width): their rows


def row_reader() -> RowReader:
    """``read(data, width)``: the row of one COPY text line as COPY sends it (newline included): the Python
    specification of the row stage's COPY reader (``cdcd.rowstage``, ``copy_row_reader``)."""

    def read(data: bytes, width: int) -> Row:
        return parse_line(data[:-1].decode(), width)

    return read


def rows_reader() -> RowsReader:
    """``read(data, width)``: the rows of COPY text lines as COPY sends them, joined (each ending in its newline;
    a newline in a value is escaped, so one ends only a line): the Python specification of the row stage's
    ``copy_rows_reader``."""

    def read(data: bytes, width: int) -> list[Row]:
        lines = data.split(b"\n")
        unterminated = lines.pop()
        rows = [parse_line(line.decode(), width) for line in lines]
        if unterminated:
            raise CopyFormatError("COPY text does not end with a newline")
        return rows

    return read
