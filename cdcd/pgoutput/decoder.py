"""pgoutput decoder: bytes of one logical replication message in, one message value out. No I/O.

The decoder keeps the two pieces of state the wire format needs: whether it is inside a streamed block
(changes then carry an Xid), and the relation and type caches (changes refer to relations by id). Every
change is bound to the Relation that was current when it arrived, so a buffered change keeps its own
column list even if the table is altered before the transaction commits.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from cdcd.pgoutput.errors import DecodeError
from cdcd.pgoutput.messages import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    LogicalMessage,
    Message,
    Op,
    Origin,
    Prepare,
    Relation,
    ReplicaIdentity,
    RollbackPrepared,
    Row,
    RowChange,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    TableFacts,
    Truncate,
    Type,
    Value,
)

if TYPE_CHECKING:
    from cdcd.rowstage import RowStage

_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from
_U32 = struct.Struct(">I").unpack_from
_U64 = struct.Struct(">Q").unpack_from
_I64 = struct.Struct(">q").unpack_from
_U32_U32 = struct.Struct(">II").unpack_from
_BEGIN = struct.Struct(">xQqI")  # final LSN, commit timestamp, Xid
_COMMIT = struct.Struct(">xBQQq")  # flags, commit LSN, end LSN, commit timestamp

MESSAGE_NAMES = {
    ord("B"): "Begin",
    ord("C"): "Commit",
    ord("O"): "Origin",
    ord("R"): "Relation",
    ord("Y"): "Type",
    ord("I"): "Insert",
    ord("U"): "Update",
    ord("D"): "Delete",
    ord("T"): "Truncate",
    ord("M"): "Message",
    ord("S"): "Stream Start",
    ord("E"): "Stream Stop",
    ord("c"): "Stream Commit",
    ord("A"): "Stream Abort",
    ord("b"): "Begin Prepare",
    ord("P"): "Prepare",
    ord("K"): "Commit Prepared",
    ord("r"): "Rollback Prepared",
    ord("p"): "Stream Prepare",
}

_T, _N, _U, _B = ord("t"), ord("n"), ord("u"), ord("b")
_REPLICA_IDENTITIES: dict[int, ReplicaIdentity] = {ord("d"): "d", ord("n"): "n", ord("f"): "f", ord("i"): "i"}


class _Reader:
    """Bounds-checked reads of one message's fields; every failure names the message and offset."""

    __slots__ = ("buf", "encoding", "name", "pos")

    def __init__(self, buf: bytes, name: str, encoding: str) -> None:
        self.buf = buf
        self.pos = 1
        self.name = name
        self.encoding = encoding

    def fail(self, reason: str, offset: int | None = None) -> DecodeError:
        return DecodeError(self.name, self.pos if offset is None else offset, reason)

    def _need(self, n: int, what: str) -> int:
        pos = self.pos
        if pos + n > len(self.buf):
            raise self.fail(f"truncated: {what} needs {n} bytes, {len(self.buf) - pos} left")
        self.pos = pos + n
        return pos

    def u8(self, what: str) -> int:
        return self.buf[self._need(1, what)]

    def i16(self, what: str) -> int:
        value: int = _I16(self.buf, self._need(2, what))[0]
        return value

    def i32(self, what: str) -> int:
        value: int = _I32(self.buf, self._need(4, what))[0]
        return value

    def u32(self, what: str) -> int:
        value: int = _U32(self.buf, self._need(4, what))[0]
        return value

    def u64(self, what: str) -> int:
        value: int = _U64(self.buf, self._need(8, what))[0]
        return value

    def i64(self, what: str) -> int:
        value: int = _I64(self.buf, self._need(8, what))[0]
        return value

    def string(self, what: str) -> str:
        start = self.pos
        end = self.buf.find(b"\0", start)
        if end < 0:
            raise self.fail(f"truncated: {what} has no NUL terminator")
        self.pos = end + 1
        try:
            return self.buf[start:end].decode(self.encoding)
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not valid {self.encoding}: {exc.reason}", start) from None

    def raw(self, n: int, what: str) -> bytes:
        if n < 0:
            raise self.fail(f"negative {what} length {n}", self.pos - 4)
        start = self._need(n, what)
        return self.buf[start : start + n]

    def flag(self, what: str) -> bool:
        value = self.u8(what)
        if value > 1:
            raise self.fail(f"{what} must be 0 or 1, got {value}", self.pos - 1)
        return value == 1

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise self.fail(f"{len(self.buf) - self.pos} unexpected trailing bytes")


def read_tuple(buf: bytes, pos: int, name: str, encoding: str) -> tuple[Row, int]:
    """Parse TupleData at ``pos``; return the row and the offset after it. This is the per-row hot loop."""
    end = len(buf)
    if pos + 2 > end:
        raise DecodeError(name, pos, "truncated: TupleData column count")
    count: int = _I16(buf, pos)[0]
    if count < 0:
        raise DecodeError(name, pos, f"negative TupleData column count {count}")
    pos += 2
    values: list[Value] = []
    append = values.append
    for _ in range(count):
        if pos >= end:
            raise DecodeError(name, pos, "truncated: TupleData column kind")
        kind = buf[pos]
        if kind in (_T, _B):
            if pos + 5 > end:
                raise DecodeError(name, pos + 1, "truncated: TupleData value length")
            length: int = _I32(buf, pos + 1)[0]
            start = pos + 5
            pos = start + length
            if length < 0 or pos > end:
                raise DecodeError(name, start - 4, f"TupleData value length {length} exceeds message")
            if kind == _T:
                try:
                    append(buf[start:pos].decode(encoding))
                except UnicodeDecodeError as exc:
                    raise DecodeError(name, start, f"text value is not valid {encoding}: {exc.reason}") from None
            else:
                append(buf[start:pos])
        elif kind == _N:
            append(None)
            pos += 1
        elif kind == _U:
            append(UNCHANGED_TOAST)
            pos += 1
        else:
            raise DecodeError(name, pos, f"unknown TupleData kind byte {kind:#04x}")
    return tuple(values), pos


class Decoder:
    """Stateful decoder for one replication session. Create a new one after reconnecting."""

    def __init__(
        self,
        encoding: str = "utf-8",
        *,
        parallel_streaming: bool = False,
        stage: RowStage | None = None,
        describe: Callable[[Relation], TableFacts] | None = None,
        labels: Callable[[Type], tuple[str, ...] | None] | None = None,
    ) -> None:
        """``parallel_streaming``: the session asked for streaming = parallel (protocol 4), so every Stream
        Abort carries the abort LSN and timestamp; otherwise none does. ``stage``: the row stage whose reader
        reads a change's tuples (``cdcd.rowstage.STAGE``; None: the Python reading here). ``describe``: the
        catalog's facts of a table (from the edge), applied to each Relation: its NOT NULL columns, and under
        REPLICA IDENTITY FULL the primary key as the key columns (without it such tables have none);
        ``labels``: an enum type's labels, added to its Type message."""
        self.encoding = encoding
        self.describe = describe
        self.labels = labels
        self.parallel_streaming = parallel_streaming
        self.relations: dict[int, Relation] = {}
        self.types: dict[int, Type] = {}
        self.in_stream = False
        self._read_change = None if stage is None else stage.change_reader(encoding)
        # Whether changes are read by the compiled code, which reads UTF-8 text only (the lane,
        # ``cdcd.replication.lane``, is taken on this condition too).
        self.compiled = self._read_change is not None
        self._handlers: dict[int, Callable[[_Reader, bytes, int], Message]] = {
            ord("B"): self._begin,
            ord("C"): self._commit,
            ord("O"): self._origin,
            ord("R"): self._relation,
            ord("Y"): self._type,
            ord("T"): self._truncate,
            ord("M"): self._message,
            ord("S"): self._stream_start,
            ord("E"): self._stream_stop,
            ord("c"): self._stream_commit,
            ord("A"): self._stream_abort,
            ord("b"): self._begin_prepare,
            ord("P"): self._prepare,
            ord("K"): self._commit_prepared,
            ord("r"): self._rollback_prepared,
            ord("p"): self._stream_prepare,
        }

    def decode(self, data: bytes, wal_lsn: int = 0) -> Message:
        """Decode one message. ``wal_lsn`` (the XLogData start) is recorded on changes."""
        if not data:
            raise DecodeError("(empty)", 0, "empty message")
        kind = data[0]
        if (kind == 73 or kind == 85 or kind == 68) and self._read_change is not None:  # noqa: PLR1714 - fastest
            change: RowChange | None = self._read_change(data, wal_lsn, self.in_stream, self.relations, RowChange)
            if change is not None:
                return change  # else the Python decoder names the problem
        if kind == 73:  # 'I'
            return self._row_change("insert", data, wal_lsn)
        if kind == 85:  # 'U'
            return self._row_change("update", data, wal_lsn)
        if kind == 68:  # 'D'
            return self._row_change("delete", data, wal_lsn)
        # Begin and Commit of a well-formed length in one unpack (one of each per transaction); others via _Reader.
        if kind == 66 and len(data) == _BEGIN.size:  # 'B'
            return Begin(*_BEGIN.unpack(data))
        if kind == 67 and len(data) == _COMMIT.size:  # 'C'
            return Commit(*_COMMIT.unpack(data))
        handler = self._handlers.get(kind)
        if handler is None:
            raise DecodeError(f"unknown type {kind:#04x}", 0, f"unknown message type byte {chr(kind)!r}")
        reader = _Reader(data, MESSAGE_NAMES[kind], self.encoding)
        message = handler(reader, data, wal_lsn)
        reader.end()
        # State changes only once the whole message proved well-formed.
        if isinstance(message, Relation):
            message = self._described(message)
            self.relations[message.relation_id] = message
        elif isinstance(message, Type):
            if self.labels is not None:
                message = replace(message, labels=self.labels(message))
            self.types[message.type_oid] = message
        elif isinstance(message, StreamStart):
            self.in_stream = True
        elif isinstance(message, StreamStop):
            self.in_stream = False
        return message

    def _described(self, relation: Relation) -> Relation:
        """The relation with the catalog's facts: NOT NULL and stored generated columns; under REPLICA IDENTITY
        FULL (pgoutput flags every column, which is no row identity) the primary key as its key, when all its
        columns are sent."""
        full = relation.replica_identity == "f"
        if self.describe is None:
            if not full:
                return relation
            facts = TableFacts()
        else:
            facts = self.describe(relation)
        names = {c.name for c in relation.columns}
        key = facts.primary_key if facts.primary_key <= names else frozenset()
        columns = tuple(
            replace(
                c,
                is_key=c.name in key if full else c.is_key,
                not_null=c.name in facts.not_null,
                generated=c.name in facts.generated,
            )
            for c in relation.columns
        )
        return replace(relation, columns=columns)

    # -- changes (hot path) -------------------------------------------------------------------

    def _row_change(self, op: Op, buf: bytes, wal_lsn: int) -> RowChange:
        name = MESSAGE_NAMES[buf[0]]
        end = len(buf)
        pos = 1
        xid: int | None = None
        if self.in_stream:
            if end < 10:
                raise DecodeError(name, pos, "truncated: Xid and relation id")
            xid, relation_id = _U32_U32(buf, 1)
            pos = 9
        else:
            if end < 6:
                raise DecodeError(name, pos, "truncated: relation id")
            relation_id = _U32(buf, 1)[0]
            pos = 5
        relation = self.relations.get(relation_id)
        if relation is None:
            raise DecodeError(name, pos - 4, f"unknown relation id {relation_id} (no Relation message seen)")
        if pos >= end:
            raise DecodeError(name, pos, "truncated: expected a tuple part ('N', 'K' or 'O')")
        old: Row | None = None
        old_is_key = False
        read = read_tuple
        part = buf[pos]
        if op != "insert" and part in (75, 79):  # 'K' or 'O'
            old_is_key = part == 75
            old, pos = read(buf, pos + 1, name, self.encoding)
            if op == "update":
                if pos >= end:
                    raise DecodeError(name, pos, "truncated: expected 'N' after the old tuple")
                part = buf[pos]
        new: Row | None = None
        if op == "delete":
            if old is None:
                raise DecodeError(name, pos, f"expected 'K' or 'O', got {chr(part)!r}")
        elif part == 78:  # 'N'
            new, pos = read(buf, pos + 1, name, self.encoding)
        else:
            raise DecodeError(name, pos, f"expected 'N'{'' if op == 'insert' else ', K or O'}, got {chr(part)!r}")
        if pos != end:
            raise DecodeError(name, pos, f"{end - pos} unexpected trailing bytes")
        for row in (old, new):
            if row is not None and len(row) != len(relation.columns):
                raise DecodeError(
                    name, pos, f"tuple has {len(row)} columns, relation {relation.name!r} has {len(relation.columns)}"
                )
        return RowChange(op, relation, old, new, old_is_key, xid, wal_lsn, end)

    def _stream_xid(self, r: _Reader) -> int | None:
        return r.u32("Xid") if self.in_stream else None

    def _truncate(self, r: _Reader, buf: bytes, wal_lsn: int) -> Truncate:
        xid = self._stream_xid(r)
        count = r.i32("relation count")
        if count < 0:
            raise r.fail(f"negative relation count {count}", r.pos - 4)
        options = r.u8("options")
        relations = []
        for _ in range(count):
            relation_id = r.u32("relation id")
            relation = self.relations.get(relation_id)
            if relation is None:
                raise r.fail(f"unknown relation id {relation_id} (no Relation message seen)", r.pos - 4)
            relations.append(relation)
        return Truncate(tuple(relations), bool(options & 1), bool(options & 2), xid, wal_lsn)

    # -- schema -----------------------------------------------------------------------------

    def _relation(self, r: _Reader, buf: bytes, wal_lsn: int) -> Relation:
        xid = self._stream_xid(r)
        relation_id = r.u32("relation id")
        schema = r.string("namespace")
        name = r.string("relation name")
        identity_byte = r.u8("replica identity")
        identity = _REPLICA_IDENTITIES.get(identity_byte)
        if identity is None:
            raise r.fail(f"unknown replica identity {identity_byte:#04x}", r.pos - 1)
        count = r.i16("column count")
        if count < 0:
            raise r.fail(f"negative column count {count}", r.pos - 2)
        columns = []
        for _ in range(count):
            flags = r.u8("column flags")
            column_name = r.string("column name")
            columns.append(Column(column_name, r.u32("column type oid"), r.i32("type modifier"), bool(flags & 1)))
        return Relation(relation_id, schema, name, identity, tuple(columns), xid)

    def _type(self, r: _Reader, buf: bytes, wal_lsn: int) -> Type:
        xid = self._stream_xid(r)
        type_oid = r.u32("type oid")
        return Type(type_oid, r.string("namespace"), r.string("type name"), xid)

    # -- transactions -----------------------------------------------------------------------

    def _begin(self, r: _Reader, buf: bytes, wal_lsn: int) -> Begin:
        return Begin(r.u64("final LSN"), r.i64("commit timestamp"), r.u32("Xid"))

    def _commit(self, r: _Reader, buf: bytes, wal_lsn: int) -> Commit:
        return Commit(r.u8("flags"), r.u64("commit LSN"), r.u64("end LSN"), r.i64("commit timestamp"))

    def _origin(self, r: _Reader, buf: bytes, wal_lsn: int) -> Origin:
        return Origin(r.u64("origin commit LSN"), r.string("origin name"))

    def _message(self, r: _Reader, buf: bytes, wal_lsn: int) -> LogicalMessage:
        xid = self._stream_xid(r)
        transactional = r.flag("flags")
        lsn = r.u64("message LSN")
        prefix = r.string("prefix")
        content = r.raw(r.i32("content length"), "content")
        return LogicalMessage(transactional, lsn, prefix, content, xid)

    # -- streaming (protocol 2+) ------------------------------------------------------------

    def _stream_start(self, r: _Reader, buf: bytes, wal_lsn: int) -> StreamStart:
        if self.in_stream:
            raise r.fail("Stream Start inside a streamed block (no Stream Stop)", 0)
        return StreamStart(r.u32("Xid"), r.flag("first segment"))

    def _stream_stop(self, r: _Reader, buf: bytes, wal_lsn: int) -> StreamStop:
        if not self.in_stream:
            raise r.fail("Stream Stop outside a streamed block", 0)
        return StreamStop()

    def _stream_commit(self, r: _Reader, buf: bytes, wal_lsn: int) -> StreamCommit:
        return StreamCommit(
            r.u32("Xid"), r.u8("flags"), r.u64("commit LSN"), r.u64("end LSN"), r.i64("commit timestamp")
        )

    def _stream_abort(self, r: _Reader, buf: bytes, wal_lsn: int) -> StreamAbort:
        xid, subxid = r.u32("Xid"), r.u32("subtransaction Xid")
        if not self.parallel_streaming:
            return StreamAbort(xid, subxid)
        return StreamAbort(xid, subxid, r.u64("abort LSN"), r.i64("abort timestamp"))

    # -- two-phase commit (protocol 3+) -----------------------------------------------------

    def _begin_prepare(self, r: _Reader, buf: bytes, wal_lsn: int) -> BeginPrepare:
        return BeginPrepare(
            r.u64("prepare LSN"), r.u64("end LSN"), r.i64("prepare timestamp"), r.u32("Xid"), r.string("GID")
        )

    @staticmethod
    def _transaction_end(r: _Reader, event: str) -> tuple[int, int, int, int, int, str]:
        """Flags, <event> LSN, end LSN, <event> timestamp, Xid, GID: Prepare, Commit Prepared, Stream Prepare."""
        return (
            r.u8("flags"),
            r.u64(f"{event} LSN"),
            r.u64("end LSN"),
            r.i64(f"{event} timestamp"),
            r.u32("Xid"),
            r.string("GID"),
        )

    def _prepare(self, r: _Reader, buf: bytes, wal_lsn: int) -> Prepare:
        return Prepare(*self._transaction_end(r, "prepare"))

    def _commit_prepared(self, r: _Reader, buf: bytes, wal_lsn: int) -> CommitPrepared:
        return CommitPrepared(*self._transaction_end(r, "commit"))

    def _rollback_prepared(self, r: _Reader, buf: bytes, wal_lsn: int) -> RollbackPrepared:
        return RollbackPrepared(
            r.u8("flags"),
            r.u64("prepare end LSN"),
            r.u64("rollback end LSN"),
            r.i64("prepare timestamp"),
            r.i64("rollback timestamp"),
            r.u32("Xid"),
            r.string("GID"),
        )

    def _stream_prepare(self, r: _Reader, buf: bytes, wal_lsn: int) -> StreamPrepare:
        return StreamPrepare(*self._transaction_end(r, "prepare"))
