"""A small test-only pgoutput encoder: message values in, wire bytes out (the inverse of cdcd.pgoutput.Decoder).

Written from the protocol description ("Logical Replication Message Formats"), not from the decoder. The optional
Xid of Relation, Type, Insert/Update/Delete, Truncate and Message (protocol 2+, inside a streamed block) is written
when the value's ``xid`` is set; Stream Abort's abort LSN and timestamp (protocol 4, streaming = parallel) when set.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from cdcd.pgoutput.messages import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    LogicalMessage,
    Message,
    Origin,
    Prepare,
    Relation,
    RollbackPrepared,
    Row,
    RowChange,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
)


def u8(value: int) -> bytes:
    return struct.pack(">B", value)


def i16(value: int) -> bytes:
    return struct.pack(">h", value)


def i32(value: int) -> bytes:
    return struct.pack(">i", value)


def u32(value: int) -> bytes:
    return struct.pack(">I", value)


def u64(value: int) -> bytes:
    return struct.pack(">Q", value)


def i64(value: int) -> bytes:
    return struct.pack(">q", value)


def string(value: str) -> bytes:
    data = value.encode()
    assert b"\0" not in data, "a protocol String cannot contain NUL"
    return data + b"\0"


def xid_part(xid: int | None) -> bytes:
    return b"" if xid is None else u32(xid)


def tuple_data(row: Row) -> bytes:
    out = [i16(len(row))]
    for value in row:
        if value is None:
            out.append(b"n")
        elif value is UNCHANGED_TOAST:
            out.append(b"u")
        elif isinstance(value, str):
            data = value.encode()
            out.append(b"t" + i32(len(data)) + data)
        elif isinstance(value, bytes):
            out.append(b"b" + i32(len(value)) + value)
        else:
            raise TypeError(f"not a TupleData value: {value!r}")
    return b"".join(out)


def relation(msg: Relation) -> bytes:
    columns = b"".join(
        u8(1 if c.is_key else 0) + string(c.name) + u32(c.type_oid) + i32(c.type_modifier) for c in msg.columns
    )
    return (
        b"R"
        + xid_part(msg.xid)
        + u32(msg.relation_id)
        + string(msg.schema)
        + string(msg.name)
        + msg.replica_identity.encode()
        + i16(len(msg.columns))
        + columns
    )


def row_change(msg: RowChange) -> bytes:
    kind = {"insert": b"I", "update": b"U", "delete": b"D"}[msg.op]
    out = kind + xid_part(msg.xid) + u32(msg.relation.relation_id)
    if msg.old is not None:
        out += (b"K" if msg.old_is_key else b"O") + tuple_data(msg.old)
    if msg.new is not None:
        out += b"N" + tuple_data(msg.new)
    return out


def truncate(msg: Truncate) -> bytes:
    options = (1 if msg.cascade else 0) | (2 if msg.restart_identity else 0)
    ids = b"".join(u32(r.relation_id) for r in msg.relations)
    return b"T" + xid_part(msg.xid) + i32(len(msg.relations)) + u8(options) + ids


def encode(msg: Message) -> bytes:
    """The wire form of one message."""
    if isinstance(msg, Begin):
        return b"B" + u64(msg.final_lsn) + i64(msg.commit_time) + u32(msg.xid)
    if isinstance(msg, Commit):
        return b"C" + u8(msg.flags) + u64(msg.commit_lsn) + u64(msg.end_lsn) + i64(msg.commit_time)
    if isinstance(msg, Origin):
        return b"O" + u64(msg.commit_lsn) + string(msg.name)
    if isinstance(msg, Relation):
        return relation(msg)
    if isinstance(msg, Type):
        return b"Y" + xid_part(msg.xid) + u32(msg.type_oid) + string(msg.schema) + string(msg.name)
    if isinstance(msg, RowChange):
        return row_change(msg)
    if isinstance(msg, Truncate):
        return truncate(msg)
    if isinstance(msg, LogicalMessage):
        return (
            b"M"
            + xid_part(msg.xid)
            + u8(1 if msg.transactional else 0)
            + u64(msg.lsn)
            + string(msg.prefix)
            + i32(len(msg.content))
            + msg.content
        )
    if isinstance(msg, StreamStart):
        return b"S" + u32(msg.xid) + u8(1 if msg.first_segment else 0)
    if isinstance(msg, StreamStop):
        return b"E"
    if isinstance(msg, StreamCommit):
        return b"c" + u32(msg.xid) + u8(msg.flags) + u64(msg.commit_lsn) + u64(msg.end_lsn) + i64(msg.commit_time)
    if isinstance(msg, StreamAbort):
        out = b"A" + u32(msg.xid) + u32(msg.subxid)
        if msg.abort_lsn is not None or msg.abort_time is not None:
            assert msg.abort_lsn is not None
            assert msg.abort_time is not None
            out += u64(msg.abort_lsn) + i64(msg.abort_time)
        return out
    if isinstance(msg, BeginPrepare):
        return b"b" + u64(msg.prepare_lsn) + u64(msg.end_lsn) + i64(msg.prepare_time) + u32(msg.xid) + string(msg.gid)
    if isinstance(msg, Prepare | StreamPrepare):
        kind = b"P" if isinstance(msg, Prepare) else b"p"
        return (
            kind
            + u8(msg.flags)
            + u64(msg.prepare_lsn)
            + u64(msg.end_lsn)
            + i64(msg.prepare_time)
            + u32(msg.xid)
            + string(msg.gid)
        )
    if isinstance(msg, CommitPrepared):
        return (
            b"K"
            + u8(msg.flags)
            + u64(msg.commit_lsn)
            + u64(msg.end_lsn)
            + i64(msg.commit_time)
            + u32(msg.xid)
            + string(msg.gid)
        )
    if isinstance(msg, RollbackPrepared):
        return (
            b"r"
            + u8(msg.flags)
            + u64(msg.prepare_end_lsn)
            + u64(msg.rollback_end_lsn)
            + i64(msg.prepare_time)
            + i64(msg.rollback_time)
            + u32(msg.xid)
            + string(msg.gid)
        )
    raise TypeError(f"not a pgoutput message: {msg!r}")


def encode_all(messages: Iterable[Message]) -> list[bytes]:
    return [encode(m) for m in messages]
