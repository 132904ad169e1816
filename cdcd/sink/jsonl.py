"""JSON-lines output for ``cdcd tail``: one line per committed change, on disk before the LSN is confirmed.

A transaction's lines are written as it comes; it is finished (its position may be confirmed to PostgreSQL) at
the next ``poll`` or ``flush``, which flushes everything written since the last one and, for a regular file,
``fsync``s it: once per round of the loop, not per line (``sink.fsync: false`` skips the fsync, trusting the
page cache: a crash of the machine can then lose lines already confirmed).

Line fields: ``op`` (c, u, d, t, m), ``schema``, ``table``, ``before``, ``after``, ``xid``, ``commit_lsn``,
``lsn``; values are PostgreSQL's text form (binary-format values as ``\\x`` hex). A TOASTed column the server
did not resend is left out of ``after`` and listed in ``unchanged_toast``. Truncate gives one line per table.
The column rules (``columns:``, ``cdcd.columns``) apply as in Kafka: columns left out are absent, masked ones
hold the masked text (a binary-format value masked in its ``\\x`` hex form).
"""

from __future__ import annotations

import base64
import json
import os
import stat
from collections import Counter
from collections.abc import Callable, Iterable
from typing import BinaryIO

from cdcd.batches import Buffered, SnapshotBatch, Transaction, decoded
from cdcd.columns import NO_RULES, ColumnRules, Mask, TableColumns
from cdcd.ledger import Entry, Ledger
from cdcd.lsn import format_lsn, pg_to_unix_us
from cdcd.pgoutput.messages import LogicalMessage, Relation, Row, RowChange, Truncate, Value
from cdcd.plan import JsonShape, Plans, RelationPlan, RowWriter
from cdcd.sink import AtLeastOnce, SessionContext, SinkFailure

_quote: Callable[[str], str] = json.encoder.encode_basestring
_OPS = {"insert": "c", "update": "u", "delete": "d"}


def _other(value: Value) -> str:
    """JSON for a value that is not text: NULL, or a binary-format value as bytea hex."""
    return "null" if value is None else '"\\\\x' + value.hex() + '"'  # type: ignore[union-attr]


def _row_writer(relation: Relation, rules: TableColumns | None = None) -> RowWriter:
    """Build a serializer for one relation's rows, with its column names quoted once."""
    if rules is not None:
        return _ruled_row_writer(relation, rules)
    names = [_quote(c.name) + ":" for c in relation.columns]
    keys = [c.is_key for c in relation.columns]
    none: list[str] = []

    def write(row: Row | None, key_only: bool) -> tuple[str, list[str]]:
        if row is None:
            return "null", none
        if not key_only and ... not in row:  # the common case: every column present
            values = [n + (_quote(v) if v.__class__ is str else _other(v)) for n, v in zip(names, row, strict=True)]
            return "{" + ",".join(values) + "}", none
        parts = []
        unchanged = []
        for name, is_key, value in zip(names, keys, row, strict=True):
            if key_only and not is_key:
                continue
            if value is ...:
                unchanged.append(name[:-1])
            else:
                parts.append(name + (_quote(value) if value.__class__ is str else _other(value)))
        return "{" + ",".join(parts) + "}", unchanged

    return write


def _masked(mask: Mask, value: Value) -> str:
    text = value if isinstance(value, str) else "\\x" + value.hex()  # type: ignore[union-attr]
    masked = mask.apply(text)
    return "null" if masked is None else _quote(masked)


def _ruled_row_writer(relation: Relation, rules: TableColumns) -> RowWriter:
    """The serializer of a table with column rules: the columns it sends, masked."""
    columns = [
        (i, _quote(c.name) + ":", c.is_key, rules.masks.get(c.name))
        for i, c in enumerate(relation.columns)
        if rules.sent(c.name)
    ]

    def write(row: Row | None, key_only: bool) -> tuple[str, list[str]]:
        if row is None:
            return "null", []
        parts = []
        unchanged = []
        for i, name, is_key, mask in columns:
            value = row[i]
            if key_only and not is_key:
                continue
            if value is ...:
                unchanged.append(name[:-1])
            elif value is None:
                parts.append(name + "null")
            elif mask is not None:
                parts.append(name + _masked(mask, value))
            else:
                parts.append(name + (_quote(value) if value.__class__ is str else _other(value)))
        return "{" + ",".join(parts) + "}", unchanged

    return write


class JsonLinesSink(AtLeastOnce):
    """Writes transactions as they come; they are finished once their lines are on disk (``poll``, ``flush``)."""

    def __init__(self, out: BinaryIO, fsync: bool = True, columns: ColumnRules = NO_RULES) -> None:
        self.out = out
        self.columns = columns
        self.fsync = fsync and _regular_file(out)  # a pipe or a terminal has nothing to sync
        self._directory_synced = not self.fsync
        self.plans = Plans()
        self.rows_written = 0
        self.events: Counter[tuple[str, str]] = Counter()  # (table, op) -> lines written
        self.delivery_errors = 0
        self._unsynced: list[tuple[Ledger, Entry]] = []  # written, not yet on disk: not finished
        self._unsynced_lines = 0

    def in_flight(self) -> int:
        return self._unsynced_lines

    def ready(self) -> bool:
        return not self.out.closed

    def _shape(self, relation: Relation) -> tuple[RelationPlan, JsonShape]:
        plan = self.plans.get(relation)
        shape = plan.json
        if shape is None:
            where = f'"schema":{_quote(relation.schema)},"table":{_quote(relation.name)}'
            heads = {op: f'{{"op":"{code}",{where},"before":' for op, code in _OPS.items()}
            shape = plan.json = JsonShape(_row_writer(relation, self.columns.of(relation)), heads)
        return plan, shape

    def write_transaction(self, txn: Transaction, changes: Iterable[Buffered], progress: Ledger) -> None:
        entry = self._open(progress, progress.open(txn.end_lsn, pg_to_unix_us(txn.commit_time) / 1e6))
        events = self.events
        tail = f',"xid":{txn.xid},"commit_lsn":"{format_lsn(txn.commit_lsn)}","lsn":"'
        lines = []
        for change in decoded(changes):  # JSON lines need the values (cdcd tail encodes nothing early)
            if isinstance(change, RowChange):
                table, line = self._row_line(change, tail)
                lines.append(line)
                events[table, _OPS[change.op]] += 1
            elif isinstance(change, Truncate):
                lines.extend(self._truncate_lines(change, tail))
                events.update((f"{r.schema}.{r.name}", "t") for r in change.relations)
            else:
                lines.append(self._message_line(change, tail))
                events["", "m"] += 1
            if len(lines) >= 4096:
                self._emit(lines)
        self._emit(lines)
        progress.seal(entry)

    def write_message(self, message: LogicalMessage, progress: Ledger) -> None:
        entry = self._open(progress, progress.open(message.lsn))
        self.events["", "m"] += 1
        self._emit([self._message_line(message, ',"xid":null,"commit_lsn":null,"lsn":"')])
        progress.seal(entry)

    def write_snapshot(self, batch: SnapshotBatch, progress: Ledger) -> None:
        entry = self._open(progress, progress.open(batch.lsn, None, batch.done))
        relation = batch.relation
        plan, shape = self._shape(relation)
        write = shape.write
        lsn = format_lsn(batch.lsn)
        head = f'{{"op":"r","schema":{_quote(relation.schema)},"table":{_quote(relation.name)},"before":null,"after":'
        lines = []
        for i, row in enumerate(batch.rows):
            tail = f',"snapshot":"{batch.row_marker(i)}","xid":null,"commit_lsn":"{lsn}","lsn":"{lsn}"}}'
            lines.append(f"{head}{write(row, False)[0]}{tail}")
        self.events[plan.table, "r"] += len(lines)
        self._emit(lines)
        progress.seal(entry)

    def start_session(self, session: SessionContext) -> None:
        """Rows are written in their text form: only the table plans to learn."""
        self.plans = session.plans

    def poll(self) -> None:
        """Finish what was written since the last round: flush, fsync, then acknowledge."""
        if self._unsynced:
            self._sync()

    def flush(self, timeout: float) -> bool:
        self._sync()
        return True

    def close(self) -> None:
        """Nothing to release: the caller owns the output file."""

    def _open(self, progress: Ledger, entry: Entry) -> Entry:
        entry.outstanding += 1  # its lines, until they are on disk
        self._unsynced.append((progress, entry))
        return entry

    def _sync(self) -> None:
        self.out.flush()
        if self.fsync:
            try:
                os.fsync(self.out.fileno())
                if not self._directory_synced:  # a file just made is durable once its directory entry is too
                    _sync_directory(self.out)
                    self._directory_synced = True
            except OSError as exc:  # what the kernel could not write is lost: never confirm it
                raise SinkFailure(f"cannot fsync the output file: {exc}") from exc
        synced, self._unsynced, self._unsynced_lines = self._unsynced, [], 0
        for progress, entry in synced:
            progress.ack(entry)

    def _emit(self, lines: list[str]) -> None:
        if lines:
            self.out.write(("\n".join(lines) + "\n").encode())
            self.rows_written += len(lines)
            self._unsynced_lines += len(lines)
            lines.clear()

    def _row_line(self, change: RowChange, tail: str) -> tuple[str, str]:
        """The table's name and the change's line."""
        plan, shape = self._shape(change.relation)
        write, heads = shape.write, shape.heads
        before = "null" if change.old is None else write(change.old, change.old_is_key)[0]
        after, unchanged = write(change.new, False)
        extra = f',"unchanged_toast":[{",".join(unchanged)}]' if unchanged else ""
        lsn = change.wal_lsn
        return (
            plan.table,
            f'{heads[change.op]}{before},"after":{after}{extra}{tail}{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"}}',
        )

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


def _regular_file(out: BinaryIO) -> bool:
    try:
        return stat.S_ISREG(os.fstat(out.fileno()).st_mode)
    except (OSError, ValueError):  # no descriptor (an in-memory stream)
        return False


def _sync_directory(out: BinaryIO) -> None:
    name = getattr(out, "name", None)
    if not isinstance(name, str):
        return  # opened from a descriptor: its directory is not known
    fd = os.open(os.path.dirname(os.path.abspath(name)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
