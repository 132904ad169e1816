"""The pgoutput logical replication messages, protocol versions 1 to 4, as plain values.

Timestamps are kept as PostgreSQL sends them (µs since 2000-01-01); see ``cdcd.lsn`` to convert.
``xid`` on a change is set only inside a streamed block (protocol 2+), where it is the xid of the
(sub)transaction that made the change; Stream Start carries the top-level xid.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import EllipsisType
from typing import Final, Literal

# One column of a TupleData: None is SQL NULL ('n'); UNCHANGED_TOAST is a TOASTed value the server did not
# send because it did not change ('u'); str is the text form ('t'); bytes the binary send form ('b').
# Ellipsis is used for 'u' because it is a singleton that marshal (the spill format) can store.
UNCHANGED_TOAST: Final = ...
Value = str | bytes | None | EllipsisType
Row = tuple[Value, ...]

ReplicaIdentity = Literal["d", "n", "f", "i"]  # default (primary key), nothing, full, index


@dataclass(frozen=True, slots=True)
class TableFacts:
    """What the catalog knows of a table that pgoutput does not send: its primary key, NOT NULL columns and
    stored generated columns."""

    primary_key: frozenset[str] = frozenset()
    not_null: frozenset[str] = frozenset()
    generated: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    type_modifier: int
    is_key: bool  # keys the table's events: part of the replica identity; under FULL, of the primary key
    not_null: bool = False  # NOT NULL in the catalog (not sent by pgoutput: the decoder's ``describe`` fills it)
    generated: bool = False  # a STORED generated column (sent on PostgreSQL 18 with publish_generated_columns)


@dataclass(frozen=True, slots=True)
class Relation:
    relation_id: int
    schema: str  # empty string means pg_catalog
    name: str
    replica_identity: ReplicaIdentity
    columns: tuple[Column, ...]
    xid: int | None = None

    @property
    def key_columns(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.is_key)


@dataclass(frozen=True, slots=True)
class Type:
    type_oid: int
    schema: str
    name: str
    xid: int | None = None
    labels: tuple[str, ...] | None = None  # an enum's labels, from the catalog (the decoder's ``describe``)


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    commit_time: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(frozen=True, slots=True)
class Origin:
    commit_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes
    xid: int | None = None


Op = Literal["insert", "update", "delete"]


@dataclass(slots=True)
class RowChange:
    """Insert, Update or Delete. ``old`` is the K (replica identity only, other columns NULL) or O
    (whole old row) tuple; ``old_is_key`` says which. ``wal_lsn`` is the XLogData start of the message."""

    op: Op
    relation: Relation
    old: Row | None
    new: Row | None
    old_is_key: bool
    xid: int | None
    wal_lsn: int
    size: int  # bytes of the wire message, for buffer accounting


@dataclass(frozen=True, slots=True)
class Truncate:
    relations: tuple[Relation, ...]
    cascade: bool
    restart_identity: bool
    xid: int | None
    wal_lsn: int


@dataclass(frozen=True, slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    xid: int
    subxid: int
    abort_lsn: int | None = None  # protocol 4 with streaming = parallel
    abort_time: int | None = None


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    prepare_lsn: int
    end_lsn: int
    prepare_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class Prepare:
    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    flags: int
    prepare_end_lsn: int
    rollback_end_lsn: int
    prepare_time: int
    rollback_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class StreamPrepare:
    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_time: int
    xid: int
    gid: str


Change = RowChange | Truncate | LogicalMessage

Message = (
    Begin
    | Commit
    | Origin
    | Relation
    | Type
    | RowChange
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
    | BeginPrepare
    | Prepare
    | CommitPrepared
    | RollbackPrepared
    | StreamPrepare
)
