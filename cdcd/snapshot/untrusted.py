"""What comes from outside the configuration, read with bounds. Pure.

Any database role can write a logical decoding message into the WAL (``pg_logical_emit_message`` is executable by
PUBLIC), and anyone who may write to the signal topic can write a signal record. Their JSON, the table patterns and
the WHERE conditions they carry are read here and nowhere else:

* ``json_object``: at most ``MAX_DOCUMENT_BYTES`` and ``MAX_DEPTH`` levels of nesting (checked before parsing, so a
  document of 100,000 ``[`` costs a scan, not a ``RecursionError``);
* ``pattern``: a regular expression compiled by RE2 (``cdcd.patterns``: linear time in the name matched, whatever
  the pattern), at most ``cdcd.patterns.MAX_PATTERN`` characters;
* ``condition``: a WHERE condition in the row-filter grammar of ``cdcd.filters`` (one expression over the table's
  columns, constants, operators and immutable built-ins: no subqueries, no statement separators, no functions of
  the database's), checked against the table's columns and rendered by cdcd (pglast's canonical form), so that no
  text of the request reaches the server as written.

Each refusal is a ``Rejected`` with a short ``reason`` (a metric label) and the detail for the log; ``Rejections``
counts them by source and reason (``cdcd_control_rejected_total``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cdcd.patterns import Matcher, PatternError, whole

MAX_DOCUMENT_BYTES = 64 * 1024
MAX_DEPTH = 16
MAX_CONDITION = 4096
MAX_NAME = 256  # schema.table: two quoted identifiers of at most 63 bytes each, with room to spare


@dataclass(frozen=True)
class Rejected:
    """Input cdcd does not act on: ``reason`` is the metric's label, ``detail`` what the log says."""

    reason: str
    detail: str


@dataclass
class Rejections:
    """Control input refused, by (source, reason): ``wal`` (a WAL request), ``signal`` (a signal record)."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(self, source: str, reason: str) -> None:
        self.counts[(source, reason)] = self.counts.get((source, reason), 0) + 1


def json_object(raw: str | bytes, what: str) -> dict[str, Any] | Rejected:
    """``raw`` as a JSON object, or why not."""
    if len(raw) > MAX_DOCUMENT_BYTES:
        return Rejected("too_large", f"its {what} has {len(raw)} bytes (at most {MAX_DOCUMENT_BYTES})")
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Rejected("not_json", f"its {what} is not UTF-8: {exc}")
    if _depth(raw) > MAX_DEPTH:
        return Rejected("too_deep", f"its {what} nests deeper than {MAX_DEPTH} levels")
    try:
        document = json.loads(raw)
    except ValueError as exc:
        return Rejected("not_json", f"its {what} is not JSON: {exc}")
    return document if isinstance(document, dict) else Rejected("not_json", f"its {what} is not a JSON object")


def _depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (a JSON text or not), stopping past ``MAX_DEPTH``."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_DEPTH:
                    break
        elif char in "]}":
            depth -= 1
    return deepest


@functools.lru_cache(maxsize=256)
def pattern(text: str) -> Matcher | Rejected:
    """A matcher of whole names for the regular expression ``text`` (``cdcd.patterns``), or why not."""
    try:
        return whole(text)
    except PatternError as exc:
        return Rejected("pattern", str(exc))


def names(text: str, table: str) -> bool:
    """Whether ``text`` (a table's name, or a pattern matching the whole of it) names ``table``; a pattern cdcd
    does not read names only itself."""
    if text == table:
        return True
    matcher = pattern(text)
    return not isinstance(matcher, Rejected) and matcher(table)


class ColumnLike(Protocol):
    """What ``condition`` needs of a column (``cdcd.pgoutput.messages.Column`` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def type_oid(self) -> int: ...
    @property
    def type_modifier(self) -> int: ...


def condition(text: str, columns: Sequence[ColumnLike] | None = None) -> str | Rejected:
    """``text`` as cdcd renders it (one expression of the row-filter grammar, checked against ``columns`` when
    given), or why not."""
    from cdcd.filters.expr import ColumnType, FilterError, compile_filter, parse_filter  # noqa: PLC0415 - pglast

    if len(text) > MAX_CONDITION:
        return Rejected("condition", f"a condition of {len(text)} characters (at most {MAX_CONDITION})")
    try:
        parsed = parse_filter(text)
        if columns is not None:
            compile_filter(parsed, [ColumnType(c.name, c.type_oid, c.type_modifier) for c in columns])
    except (FilterError, RecursionError) as exc:
        return Rejected("condition", f"condition {text[:200]!r} is refused: {exc}")
    return parsed.sql
