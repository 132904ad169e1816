"""JSON-lines output for ``cdcd tail``: one line per committed change, written before the LSN is confirmed.

Line fields: ``op`` (c, u, d, t, m), ``schema``, ``table``, ``before``, ``after``, ``xid``, ``commit_lsn``,
``lsn``; values are PostgreSQL's text form (binary-format values as ``\\x`` hex). A TOASTed column the server
did not resend is left out of ``after`` and listed in ``unchanged_toast``. Truncate gives one line per table.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import BinaryIO

from cdcd.assembly import Transaction
from cdcd.lsn import format_lsn
from cdcd.pgoutput.messages import LogicalMessage, Relation, Row, RowChange, Truncate
from cdcd.progress import Progress

_quote: Callable[[str], str] = json.encoder.encode_basestring
_OPS = {"insert": "c", "update": "u", "delete": "d"}

RowWriter = Callable[[Row | None, bool], tuple[str, list[str]]]


def _row_writer(relation: Relation) -> RowWriter:
    """Build a serializer for one relation's rows, with its column names quoted once."""
    names = [_quote(c.name) + ":" for c in relation.columns]
    keys = [c.is_key for c in relation.columns]

    def write(row: Row | None, key_only: bool) -> tuple[str, list[str]]:
        if row is None:
            return "null", []
        parts = []
        unchanged = []
        for name, is_key, value in zip(names, keys, row, strict=True):
            if key_only and not is_key:
                continue
            if value is None:
                parts.append(name + "null")
            elif value.__class__ is str:
                parts.append(name + _quote(value))
            elif value is ...:
                unchanged.append(name[:-1])
            else:
                parts.append(name + '"\\\\x' + value.hex() + '"')  # type: ignore[union-attr]
        return "{" + ",".join(parts) + "}", unchanged

    return write


class JsonLinesSink:
    """Writes transactions synchronously; a transaction is done once its lines are flushed."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self._writers: dict[int, tuple[Relation, RowWriter]] = {}  # relation id -> (the Relation, its writer)
        self.rows_written = 0

    def _writer(self, relation: Relation) -> RowWriter:
        cached = self._writers.get(relation.relation_id)
        if cached is None or cached[0] is not relation:
            cached = self._writers[relation.relation_id] = (relation, _row_writer(relation))
        return cached[1]

    def write_transaction(self, txn: Transaction, progress: Progress) -> None:
        entry = progress.open(txn.end_lsn)
        tail = f',"xid":{txn.xid},"commit_lsn":"{format_lsn(txn.commit_lsn)}","lsn":"'
        lines = []
        for change in txn.changes():
            if isinstance(change, RowChange):
                lines.append(self._row_line(change, tail))
            elif isinstance(change, Truncate):
                lines.extend(self._truncate_lines(change, tail))
            else:
                lines.append(self._message_line(change, tail))
            if len(lines) >= 4096:
                self._emit(lines)
        self._emit(lines)
        self.out.flush()
        progress.seal(entry)

    def write_message(self, message: LogicalMessage, progress: Progress) -> None:
        entry = progress.open(message.lsn)
        self._emit([self._message_line(message, ',"xid":null,"commit_lsn":null,"lsn":"')])
        self.out.flush()
        progress.seal(entry)

    def _emit(self, lines: list[str]) -> None:
        if lines:
            self.out.write(("\n".join(lines) + "\n").encode())
            self.rows_written += len(lines)
            lines.clear()

    def _row_line(self, change: RowChange, tail: str) -> str:
        relation = change.relation
        write = self._writer(relation)
        before, _ = write(change.old, change.old_is_key)
        after, unchanged = write(change.new, False)
        head = f'{{"op":"{_OPS[change.op]}","schema":{_quote(relation.schema)},"table":{_quote(relation.name)}'
        extra = f',"unchanged_toast":[{",".join(unchanged)}]' if unchanged else ""
        return f'{head},"before":{before},"after":{after}{extra}{tail}{format_lsn(change.wal_lsn)}"}}'

    def _truncate_lines(self, change: Truncate, tail: str) -> list[str]:
        options = f',"cascade":{str(change.cascade).lower()},"restart_identity":{str(change.restart_identity).lower()}'
        return [
            f'{{"op":"t","schema":{_quote(r.schema)},"table":{_quote(r.name)},"before":null,"after":null'
            f'{options}{tail}{format_lsn(change.wal_lsn)}"}}'
            for r in change.relations
        ]

    def _message_line(self, message: LogicalMessage, tail: str) -> str:
        content = base64.b64encode(message.content).decode()
        return (
            f'{{"op":"m","schema":null,"table":null,"before":null,"after":null,"prefix":{_quote(message.prefix)},'
            f'"content_base64":"{content}","transactional":{str(message.transactional).lower()}'
            f'{tail}{format_lsn(message.lsn)}"}}'
        )
