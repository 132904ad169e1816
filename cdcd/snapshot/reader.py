"""Reading tables for snapshots, on a regular connection (psycopg): the I/O edge of ``cdcd.snapshot``.

* ``SnapshotReader.use_exported``: the initial snapshot reads in the snapshot the slot exported.
* ``SnapshotReader.rows``: one table in chunk-key order with ``COPY (SELECT ...) TO STDOUT``, from a key on;
  ``row_batches``, the same in lists, each decoded by the row stage in one call (a parallel initial snapshot's
  threads), and ``split``, where to cut a table into key ranges for them (``cdcd.snapshot.ranges``).
* ``SnapshotReader.chunk``: an incremental chunk in its own transaction, between a low and a high watermark
  written with ``pg_logical_emit_message``, with the ``pg_current_snapshot()`` it was read in; ``read_only``:
  in a read-only transaction, with that snapshot and the WAL position then instead of watermarks, so that
  nothing is written to the source (``cdcd.snapshot.window``).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
import structlog
from psycopg import pq, sql
from psycopg.errors import QueryCanceled, UndefinedTable, error_from_result
from psycopg.generators import fetch_many

from cdcd.config import ConfigError, SourceSettings
from cdcd.filters.checks import ColumnInfo, TableInfo
from cdcd.pgoutput.messages import Column, Relation, Row, Type
from cdcd.snapshot import control, untrusted
from cdcd.snapshot.copy import RowReader, RowsReader, row_reader, rows_reader
from cdcd.snapshot.position import wal_position
from cdcd.snapshot.ranges import INTEGER_TYPES, histogram_cuts, integer_cuts, key_ranges
from cdcd.snapshot.xids import SnapshotXids
from cdcd.source.catalog import (
    Captured,
    ancestors,
    captured,
    captured_tables,
    describe_table,
    enum_labels,
    index_columns,
    published_columns,
    publishes_generated_columns,
    table_facts,
)
from cdcd.source.primary import Primary
from cdcd.source.standby import INCREMENTAL_NEEDS_PRIMARY, in_recovery, wait_replayed
from cdcd.source.walsender import SourceDisconnected, SourceError, Timeouts, connect

Conn = psycopg.Connection[Any]
log = structlog.get_logger("cdcd.snapshot")
_T = TypeVar("_T")

_ROWS_AT_ONCE = 1000  # COPY lines ``rows`` decodes in one call of the row stage
_FIRST_USER_TYPE = 10000  # pgoutput sends Type messages for types at or above FirstGenbkiObjectId
# A table without statistics is counted (for the snapshot's progress) when it takes at most this much disk: a
# count of 8 MiB is a few milliseconds; a larger table's estimate is "unknown" rather than a scan before its scan.
COUNT_ROWS_UP_TO_BYTES = 8 << 20
# Whether any table holding the rows (the table, or a partitioned table's leaves) has no statistics (never vacuumed
# nor analyzed: reltuples -1, or relpages 0 as an index built on it left them), and their size.
_STATISTICS = (
    "SELECT coalesce(bool_or((c.reltuples < 0 OR c.relpages = 0) AND c.relkind <> 'p'), false),"
    " coalesce(sum(pg_relation_size(c.oid)), 0) FROM pg_class c"
    " WHERE c.oid = %(table)s OR c.oid IN (SELECT relid FROM pg_partition_tree(%(table)s::oid::regclass))"
)


class TableGone(LookupError):
    """The table no longer exists (dropped or renamed since the snapshot was queued)."""


class ChunkDeadline(SourceDisconnected, TimeoutError):
    """An incremental chunk outlasted its connection's deadline, which gave the connection up."""


class ChunkTooSlow(TimeoutError):
    """An incremental chunk outlasted its statement_timeout (just within the connection's deadline): the server
    cancelled it, and the connection and the session go on."""


@dataclass(frozen=True)
class SnapshotTable:
    """A table as a snapshot reads it: its Relation (what pgoutput would send) and its chunk key."""

    name: str  # schema.table
    relation: Relation
    key_columns: tuple[str, ...]  # primary key or replica identity index, in index order; () when none
    key_types: tuple[str, ...]  # format_type of each key column, for the typed key comparison
    partitioned: bool
    types: tuple[Type, ...]  # user-defined column types, as pgoutput Type messages


@dataclass(frozen=True)
class ChunkRead:
    table: SnapshotTable
    rows: list[Row]
    xids: SnapshotXids
    watermark: str  # the high watermark's id
    position: int | None = None  # read-only: the WAL position right after the snapshot (no watermark written)


def _split(name: str) -> tuple[str, str]:
    schema, table = name.split(".")
    return schema, table


def describe(conn: Conn, name: str, publications: Sequence[str] = ()) -> SnapshotTable:
    """``name`` as the stream sends it through ``publications`` (``_relation``), with its chunk key."""
    info = describe_table(conn, name)
    if info is None:
        raise TableGone(f"table {name} does not exist")
    # the replica identity index (i), else the primary key (which is the identity under d)
    key = info.identity_columns if info.replica_identity in ("i", "d") else ()
    key = key or index_columns(conn, info.oid, "i.indisprimary")
    relation, key = _relation(conn, info, key, publications)
    key_types = tuple(
        conn.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s AND attname = %s",
            [info.oid, k],
        ).fetchone()[0]  # type: ignore[index]
        for k in key
    )
    return SnapshotTable(name, relation, key, key_types, info.partitioned, _user_types(conn, info))


def _relation(
    conn: Conn, info: TableInfo, key: tuple[str, ...], publications: Sequence[str]
) -> tuple[Relation, tuple[str, ...]]:
    """The table's Relation as pgoutput sends it, and its chunk key: the readable columns pgoutput sends (a stored
    generated column only where ``publications`` publish it), flagged as ``Decoder.describe`` flags the stream's.
    A key holding a generated column the stream leaves out is none (nor is it the key under FULL)."""
    name = info.name
    readable = _readable(conn, name, info)
    lost = [k for k in key if k not in {c.name for c in readable}]
    if lost:
        raise SourceError(f"{name} changed since the snapshot was taken: its key column {', '.join(lost)} is gone")
    # the publications are asked only about a table that has a stored generated column (one query per chunk)
    stored = any(c.generated == "s" for c in readable) and publishes_generated_columns(conn, publications, name)
    sent = published_columns(readable, stored)
    if not set(key) <= {c.name for c in sent}:
        key = ()
    identity, not_null = info.replica_identity, table_facts(conn, info.oid).not_null
    keyed = key if identity == "f" else info.identity_columns
    columns = tuple(
        Column(c.name, c.type_oid, c.type_modifier, c.name in keyed, c.name in not_null, c.generated == "s")
        for c in sent
    )
    schema, table = _split(name)
    return Relation(info.oid, schema, table, identity, columns), key  # type: ignore[arg-type]


def _user_types(conn: Conn, info: TableInfo) -> tuple[Type, ...]:
    """The user-defined types of the table's columns, as pgoutput's Type messages describe them."""
    types = conn.execute(
        "SELECT t.oid, n.nspname, t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace"
        " WHERE t.oid = ANY(%s) AND t.oid >= %s",
        [[c.type_oid for c in info.columns], _FIRST_USER_TYPE],
    ).fetchall()
    return tuple(Type(oid, nsp, typ, None, enum_labels(conn, oid)) for oid, nsp, typ in types)


def _readable(conn: Conn, name: str, info: TableInfo) -> tuple[ColumnInfo, ...]:
    """The columns of ``info`` (the table as the transaction's snapshot sees it) that can still be read: queries
    are planned against the current catalog, so a column dropped since the snapshot was taken (or dropped and
    added again with another type) cannot be selected, and its values are not in the snapshot. In a transaction
    the table is locked first (ACCESS SHARE, which reading it takes anyway, until the transaction ends), so no
    schema change comes between this check and the read."""
    target = sql.Identifier(*_split(name))
    if conn.info.transaction_status == pq.TransactionStatus.INTRANS:
        conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(target))
    current = conn.execute(sql.SQL("SELECT * FROM {} LIMIT 0").format(target)).description or []
    now = {(c.name, c.type_code) for c in current}
    return tuple(c for c in info.columns if (c.name, c.type_oid) in now)


def select_sql(
    table: SnapshotTable, condition: str | None, after: Sequence[str | None] | None, limit: int | None
) -> sql.Composed:
    """``COPY (<select_query>) TO STDOUT``."""
    return sql.SQL("COPY ({}) TO STDOUT").format(select_query(table, condition, after, limit))


def select_query(
    table: SnapshotTable, condition: str | None, after: Sequence[str | None] | None, limit: int | None
) -> sql.Composed:
    """``SELECT <columns> FROM [ONLY] t WHERE ... ORDER BY <key> [LIMIT n]``; ``after`` is the last key read
    (text values, cast to the key's types)."""
    rel = table.relation
    target = sql.Identifier(rel.schema, rel.name)
    columns = sql.SQL(", ").join(sql.Identifier(c.name) for c in rel.columns)
    where: list[sql.Composable] = []
    if condition:
        where.append(sql.SQL("(") + sql.SQL(condition) + sql.SQL(")"))
    keys = [sql.Identifier(k) for k in table.key_columns]
    if after is not None:
        typed = [
            sql.SQL("CAST({} AS {})").format(sql.Literal(v), sql.SQL(t))
            for v, t in zip(after, table.key_types, strict=True)
        ]
        where.append(sql.SQL("({}) > ({})").format(sql.SQL(", ").join(keys), sql.SQL(", ").join(typed)))
    query = sql.SQL("SELECT {} FROM {}{}").format(columns, sql.SQL("" if table.partitioned else "ONLY "), target)
    if where:
        query += sql.SQL(" WHERE ") + sql.SQL(" AND ").join(where)
    if keys:
        query += sql.SQL(" ORDER BY ") + sql.SQL(", ").join(keys)
    if limit is not None:
        query += sql.SQL(f" LIMIT {int(limit)}")
    return query


def upper_bound(table: SnapshotTable, until: Sequence[str | None]) -> str:
    """SQL holding the rows whose key is at most ``until`` (text values, cast to the key's types); ``false`` for
    an empty bound. Values are literals rendered by psycopg, never pasted."""
    if not until:
        return "false"
    keys = sql.SQL(", ").join(sql.Identifier(k) for k in table.key_columns)
    typed = [
        sql.SQL("CAST({} AS {})").format(sql.Literal(v), sql.SQL(t))
        for v, t in zip(until, table.key_types, strict=True)
    ]
    return sql.SQL("({}) <= ({})").format(keys, sql.SQL(", ").join(typed)).as_string(None)


class SnapshotReader:
    """A regular connection that reads tables for snapshots and writes watermarks (none when ``read_only``)."""

    def __init__(
        self,
        dsn: str,
        password: str | None,
        slot: str,
        timeouts: Timeouts | None = None,
        read_row: RowReader | None = None,
        *,
        read_rows: RowsReader | None = None,
        read_only: bool = False,
        standby: bool = False,
        primary: Primary | None = None,
        publications: Sequence[str] = (),
    ) -> None:
        """``read_row``, ``read_rows``: the row stage's COPY row readers (``cdcd.rowstage``; None: the Python ones).
        ``read_only``: incremental chunks write nothing to the source (``snapshot.read_only``). ``standby``: the
        source is a hot standby, whose watermarks are written on ``primary`` (``source.primary_dsn``).
        ``publications``: those the stream reads, which decide whether a table's stored generated columns are
        read (none of them without)."""
        self.publications = tuple(publications)
        self.read_only = read_only
        self.read_row = read_row or row_reader()
        self.read_rows = read_rows or rows_reader()
        self.timeouts = timeouts or Timeouts()
        self.conn = connect(dsn, password, self.timeouts)
        # never a prepared statement: one for `SELECT * FROM t LIMIT 0` (psycopg prepares a query run 5 times)
        # fails once a column is added ("cached plan must not change result type"), and these are catalog reads
        self.conn.prepare_threshold = None
        self.slot = slot
        self.standby = standby
        self.primary = primary

    def close(self) -> None:
        self.conn.close()

    def cancel(self) -> None:
        """Cancel the statement running now (PostgreSQL's cancel; from another thread): it ends in an error."""
        try:
            self.conn.cancel_safe(timeout=5)
        except psycopg.Error as exc:  # the connection is lost anyway: the statement ends with it
            log.debug("cannot cancel the snapshot statement", error=_first(exc))

    def use_exported(self, snapshot_name: str) -> None:
        """Read in the snapshot CREATE_REPLICATION_SLOT exported (until ``end_transaction``)."""
        try:
            self.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            self.conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))
        except psycopg.Error as exc:
            raise SourceError(f"cannot use the slot's exported snapshot {snapshot_name}: {_first(exc)}") from None

    def end_transaction(self) -> None:
        self.conn.execute("COMMIT")

    def captured_tables(self, publications: Sequence[str]) -> list[str]:
        return self._guard(lambda: captured_tables(self.conn, publications))

    def captured(self, publications: Sequence[str]) -> Captured:
        return self._guard(lambda: captured(self.conn, publications))

    def describe(self, name: str) -> SnapshotTable:
        try:
            return self._guard(lambda: describe(self.conn, name, self.publications))
        except UndefinedTable:  # dropped (or renamed) between its catalog entry and reading its columns
            raise TableGone(f"table {name} does not exist") from None

    def ancestors(self, relation_id: int) -> list[str]:
        return self._guard(lambda: ancestors(self.conn, relation_id))

    def last_key(self, table: SnapshotTable) -> list[str | None]:
        """The chunk key of ``table``'s last row in key order, as text ([] when it is empty)."""
        rel = table.relation
        # qualified: an output column named as the key (``id::text`` is ``id``) would order as text
        keys = [sql.Identifier(rel.schema, rel.name, k) for k in table.key_columns]
        query = sql.SQL("SELECT {} FROM {}{} ORDER BY {} LIMIT 1").format(
            sql.SQL(", ").join(sql.SQL("{}::text").format(k) for k in keys),
            sql.SQL("" if table.partitioned else "ONLY "),
            sql.Identifier(rel.schema, rel.name),
            sql.SQL(", ").join(sql.SQL("{} DESC").format(k) for k in keys),
        )
        try:
            row = self._guard(lambda: self.conn.execute(query).fetchone())
        except UndefinedTable:  # dropped since it was described
            raise TableGone(f"table {table.name} does not exist") from None
        return [] if row is None else list(row)

    def upper_bound(self, table: SnapshotTable, until: Sequence[str | None]) -> str:
        return upper_bound(table, until)

    def rows(self, table: SnapshotTable, condition: str | None, after: Sequence[str | None] | None) -> Iterator[Row]:
        """Every row of ``table`` matching ``condition``, in key order, after key ``after`` (read as ``row_batches``
        reads them: lines decoded a batch at a time)."""
        for rows in self.row_batches(table, condition, after, _ROWS_AT_ONCE):
            yield from rows

    def row_batches(
        self, table: SnapshotTable, condition: str | None, after: Sequence[str | None] | None, size: int
    ) -> Iterator[list[Row]]:
        """As ``rows``, in lists of up to ``size`` rows: each list's COPY lines (``copy_batches``) decoded in one
        call of the row stage (the compiled one parses without holding the GIL)."""
        width = len(table.relation.columns)
        read = self.read_rows
        for data in self.copy_batches(table, condition, after, size):
            yield read(data, width)

    def copy_batches(
        self, table: SnapshotTable, condition: str | None, after: Sequence[str | None] | None, size: int
    ) -> Iterator[bytes]:
        """As ``rows``, as COPY text: up to ``size`` lines at a time, joined as COPY sends them (each ending in its
        newline). The lines are appended to the buffer as they come: holding psycopg's line objects until the end
        of a batch costs twice as much (the garbage collector walks them)."""
        try:
            with self.conn.cursor().copy(select_sql(table, condition, after, None)) as copy:
                yield from _copy_batches(self.conn, copy, size)
        except psycopg.OperationalError as exc:
            raise SourceDisconnected(f"snapshot connection lost: {_first(exc)}") from None
        except psycopg.Error as exc:
            raise SourceError(f"cannot read {table.name} for the snapshot: {_first(exc)}") from None

    def split(self, table: SnapshotTable, condition: str | None, parts: int) -> list[str]:
        """Up to ``parts`` key ranges of ``table`` as SQL conditions on its first key column, which together hold
        every row once (``cdcd.snapshot.ranges``); [] when it is not cut (one part, no key, no bounds known).
        ``condition`` (row filters) does not narrow the bounds: finding them stays a few index probes."""
        if parts < 2 or not table.key_columns:
            return []
        try:
            with self.timeouts.deadline(self.conn):
                cuts = self._cuts(table, parts)
                column, key_type = sql.Identifier(table.key_columns[0]), sql.SQL(table.key_types[0])
                return [_range_sql(column, key_type, low, high).as_string(self.conn) for low, high in key_ranges(cuts)]
        except psycopg.OperationalError as exc:
            raise SourceDisconnected(f"snapshot connection lost: {_first(exc)}") from None
        except psycopg.Error as exc:
            raise SourceError(f"cannot find key ranges of {table.name}: {_first(exc)}") from None

    def _cuts(self, table: SnapshotTable, parts: int) -> list[str]:
        rel, column = table.relation, table.key_columns[0]
        if table.key_types[0] in INTEGER_TYPES:
            only = sql.SQL("" if table.partitioned else "ONLY ")
            query = sql.SQL("SELECT min({0}), max({0}) FROM {1}{2}").format(
                sql.Identifier(column), only, sql.Identifier(rel.schema, rel.name)
            )
            low, high = self.conn.execute(query).fetchone() or (None, None)
            return [] if low is None or high is None else [str(c) for c in integer_cuts(low, high, parts)]
        row = self.conn.execute(
            "SELECT histogram_bounds::text::text[] FROM pg_stats"
            " WHERE schemaname = %s AND tablename = %s AND attname = %s ORDER BY inherited DESC LIMIT 1",
            [rel.schema, rel.name, column],
        ).fetchone()
        return histogram_cuts(row[0], parts) if row is not None and row[0] else []

    def estimate(self, table: SnapshotTable, condition: str | None, after: Sequence[str | None] | None) -> int | None:
        """The rows ``rows`` would read: the planner's estimate (``pg_class.reltuples`` scaled to the table's
        current size, narrowed by ``condition`` and by the key range after ``after``). A table PostgreSQL has no
        statistics for (never vacuumed or analyzed) gets no estimate, as the planner's guess
        from its pages is then far off (850 rows for a 2-row table); when it is small, its rows are counted.
        None: unknown."""
        query = select_query(table, condition, after, None)
        try:
            with self.timeouts.deadline(self.conn):
                return self._estimate(table, query)
        except psycopg.OperationalError as exc:
            raise SourceDisconnected(f"snapshot connection lost: {_first(exc)}") from None
        except psycopg.Error as exc:
            raise SourceError(f"cannot estimate the rows of {table.name}: {_first(exc)}") from None

    def _estimate(self, table: SnapshotTable, query: sql.Composed) -> int | None:
        """Each statement alone in the extended protocol (``binary``: psycopg sends no text of several), in a
        read-only transaction: ``query`` holds a condition a request asked for."""
        with _read_only(self.conn):
            statistics = self.conn.execute(_STATISTICS, {"table": table.relation.relation_id}).fetchone()
            assert statistics is not None
            unanalyzed, size = statistics
            if not unanalyzed:
                explain = sql.SQL("EXPLAIN (FORMAT JSON) ") + query
                plan = self.conn.execute(explain, binary=True).fetchone()[0]  # type: ignore[index]
                return int((json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]["Plan Rows"])
            if size > COUNT_ROWS_UP_TO_BYTES:
                return None
            count = sql.SQL("SELECT count(*) FROM ({}) AS t").format(query)
            return int(self.conn.execute(count, binary=True).fetchone()[0])  # type: ignore[index]

    def server(self) -> str:
        """``host:port/database`` of the source, for the operator (no user, no password)."""
        info = self.conn.info
        return f"{info.host}:{info.port}/{info.dbname}"

    def chunk(
        self, name: str, condition: str | None, after: Sequence[str | None] | None, limit: int, watermark: str
    ) -> ChunkRead:
        """One incremental chunk: low watermark, then in one transaction the snapshot's xids, the table's
        description and up to ``limit`` rows after ``after``, then the high watermark. ``read_only``: no
        watermark, the WAL position after the snapshot instead, in a read-only transaction."""
        conn = self.conn
        read = self._chunk_read_only if self.read_only else self._chunk
        try:
            with self.timeouts.deadline(conn) as passed:
                return read(name, condition, after, limit, watermark)
        except ConfigError:
            raise
        except QueryCanceled:
            if passed.is_set():
                raise ChunkDeadline(f"a chunk of {limit} rows of {name} outlasted its deadline") from None
            seconds = self.timeouts.receive_s
            raise ChunkTooSlow(f"a chunk of {limit} rows of {name} took more than {seconds:g} s") from None
        except psycopg.OperationalError as exc:
            if passed.is_set():
                seconds = self.timeouts.deadline_s
                raise ChunkDeadline(f"a chunk of {limit} rows of {name} took more than {seconds:g} s") from None
            raise SourceDisconnected(f"snapshot connection lost: {_first(exc)}") from None
        except UndefinedTable:  # dropped between its description and its lock
            raise TableGone(f"table {name} does not exist") from None
        except (psycopg.Error, ValueError) as exc:
            raise SourceError(f"cannot read a chunk of {name}: {_first(exc)}") from None

    def _chunk(
        self, name: str, condition: str | None, after: Sequence[str | None] | None, limit: int, mark: str
    ) -> ChunkRead:
        if self.standby:
            return self._standby_chunk(name, condition, after, limit, mark)
        conn = self.conn
        emit(conn, control.WATERMARK_PREFIX, {"slot": self.slot, "id": mark, "mark": "low"})
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        try:
            self._limit_statements()
            xids = SnapshotXids.parse(conn.execute("SELECT pg_current_snapshot()::text").fetchone()[0])  # type: ignore[index]
            table = describe(conn, name, self.publications)
            rows = list(_copy_rows(conn, table, select_sql(table, condition, after, limit), self.read_row))
            emit(conn, control.WATERMARK_PREFIX, {"slot": self.slot, "id": mark, "mark": "high"})
            # A non-transactional message waits for the WAL writer (up to wal_writer_delay) before the
            # walsender may send it; a commit with an xid and synchronous_commit on flushes it at once.
            conn.execute("SET LOCAL synchronous_commit = on")
            conn.execute("SELECT pg_current_xact_id()")
        finally:
            conn.execute("COMMIT" if conn.info.transaction_status == 2 else "ROLLBACK")  # 2: INTRANS
        return ChunkRead(table, rows, xids, mark)

    def _chunk_read_only(
        self, name: str, condition: str | None, after: Sequence[str | None] | None, limit: int, mark: str
    ) -> ChunkRead:
        table, rows, xids, position = self._read_only(name, condition, after, limit, position=True)
        return ChunkRead(table, rows, xids, mark, position)

    def _read_only(
        self, name: str, condition: str | None, after: Sequence[str | None] | None, limit: int, position: bool
    ) -> tuple[SnapshotTable, list[Row], SnapshotXids, int | None]:
        """Up to ``limit`` rows after ``after`` in a read-only transaction of their own, with its snapshot's xids
        and (``position``) the WAL position right after that snapshot was taken."""
        conn = self.conn
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        try:
            self._limit_statements()  # SET takes no snapshot
            # the first statement takes the transaction's snapshot; the position is read after it
            snapshot = conn.execute("SELECT pg_current_snapshot()::text").fetchone()[0]  # type: ignore[index]
            xids = SnapshotXids.parse(snapshot, running_known=not self.standby)
            at = wal_position(conn) if position else None
            table = describe(conn, name, self.publications)
            rows = list(_copy_rows(conn, table, select_sql(table, condition, after, limit), self.read_row))
        finally:
            conn.execute("COMMIT" if conn.info.transaction_status == 2 else "ROLLBACK")  # 2: INTRANS
        return table, rows, xids, at

    def _limit_statements(self) -> None:
        """Within a chunk's transaction: the server cancels a statement that runs for ``receive_s``, before the
        connection's deadline (5 s later) would give the connection, and with it the session, up."""
        if self.timeouts.receive_s:
            self.conn.execute(f"SET LOCAL statement_timeout = {int(self.timeouts.receive_s * 1000)}")

    def _standby_chunk(
        self, name: str, condition: str | None, after: Sequence[str | None] | None, limit: int, mark: str
    ) -> ChunkRead:
        """On a standby: the watermarks written on the primary, and the chunk read once the standby has replayed
        the low one (so its snapshot is not older than the low watermark's place in the stream; the high one is
        written after the read, so it comes after whatever the standby had replayed). A standby promoted before it
        replayed either is a lost source: the session starts again, and the chunk is read again."""
        if self.primary is None:
            raise ConfigError(INCREMENTAL_NEEDS_PRIMARY)
        conn, primary = self.conn, self.primary
        low = primary.emit(control.WATERMARK_PREFIX, control.encode({"slot": self.slot, "id": mark, "mark": "low"}))
        if not wait_replayed(conn, low):
            raise SourceDisconnected("the standby was promoted while a snapshot chunk waited for its low watermark")
        table, rows, xids, _ = self._read_only(name, condition, after, limit, position=False)
        high = primary.emit(control.WATERMARK_PREFIX, control.encode({"slot": self.slot, "id": mark, "mark": "high"}))
        if not wait_replayed(conn, high):  # a promoted standby never replays it: the chunk would wait for good
            raise SourceDisconnected("the standby was promoted before it replayed a snapshot chunk's high watermark")
        return ChunkRead(table, rows, xids, mark)

    def _guard(self, call: Callable[[], _T]) -> _T:
        try:
            with self.timeouts.deadline(self.conn):
                return call()
        except psycopg.OperationalError as exc:
            raise SourceDisconnected(f"snapshot connection lost: {_first(exc)}") from None


@contextlib.contextmanager
def _read_only(conn: Conn) -> Iterator[None]:
    """A read-only transaction, unless ``conn`` is in one already (the initial snapshot's is read-only)."""
    if conn.info.transaction_status != pq.TransactionStatus.IDLE:
        yield
        return
    conn.execute("BEGIN READ ONLY")
    try:
        yield
    finally:
        conn.execute("ROLLBACK")


def _range_sql(column: sql.Identifier, key_type: sql.SQL, low: str | None, high: str | None) -> sql.Composed:
    """``low <= column < high`` (an open end left out)."""
    bounds: list[sql.Composable] = []
    if low is not None:
        bounds.append(sql.SQL("{} >= CAST({} AS {})").format(column, sql.Literal(low), key_type))
    if high is not None:
        bounds.append(sql.SQL("{} < CAST({} AS {})").format(column, sql.Literal(high), key_type))
    return sql.SQL(" AND ").join(bounds)


def _copy_rows(conn: Conn, table: SnapshotTable, copy_sql: sql.Composed, read: RowReader) -> Iterator[Row]:
    """The rows ``COPY ... TO STDOUT`` (text format) writes, in pgoutput's text form."""
    width = len(table.relation.columns)
    with conn.cursor().copy(copy_sql) as copy:
        for data in copy:
            yield read(bytes(data), width)


def _copy_batches(conn: Conn, copy: psycopg.Copy, size: int) -> Iterator[bytes]:
    """The lines of ``copy`` (a COPY TO), up to ``size`` at a time, joined. Read from libpq itself while it holds
    whole lines (``PQgetCopyData`` without waiting, ~0.3 µs a line, against ~0.8 µs through psycopg's ``read``, a
    generator and a wait per line, all of it holding the GIL); when it holds none, psycopg's ``read`` waits for
    the server (without the GIL) and takes the next line, or the end and the COPY's result. An end libpq gives here
    is not psycopg's to see (libpq's next call would find no COPY in progress): its result is fetched here."""
    pgconn, read = conn.pgconn, copy.read
    get = pgconn.get_copy_data
    data, lines = bytearray(), 0
    while True:
        got, line = get(1)
        if got > 0:
            data += line
        elif got == 0:  # nothing buffered: wait for the server
            waited = read()
            if not waited:
                break
            data += waited
        else:
            _copy_result(conn)
            break
        lines += 1
        if lines == size:
            yield bytes(data)
            data, lines = bytearray(), 0
    if lines:
        yield bytes(data)


def _copy_result(conn: Conn) -> None:
    """The result of a COPY TO whose end libpq reported: raised when it is an error."""
    results = conn.wait(fetch_many(conn.pgconn))
    if results and results[0].status != pq.ExecStatus.COMMAND_OK:
        raise error_from_result(results[0], encoding=conn.info.encoding)


def emit(conn: Conn, prefix: str, content: dict[str, Any]) -> None:
    """A non-transactional logical decoding message: it reaches the stream at its WAL position."""
    conn.execute("SELECT pg_logical_emit_message(false, %s, %s)", [prefix, control.encode(content)])


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class SnapshotRequestError(ValueError):
    """A snapshot request that cannot be honoured (table not captured, no key, bad condition)."""


def request_snapshot(settings: SourceSettings, table: str, where: str | None, key: bytes) -> str:
    """Check the request against the database, then write it into the WAL, signed with ``key``, for the daemon on
    ``settings.slot``."""
    conn = connect(settings.dsn.get_secret_value(), settings.read_password())
    try:
        standby = in_recovery(conn)
        if standby and settings.primary_dsn is None:
            raise SnapshotRequestError(
                "source.dsn is a hot standby, where the request cannot be written: " + INCREMENTAL_NEEDS_PRIMARY
            )
        captured = captured_tables(conn, settings.publication_names)
        if table not in captured:
            raise SnapshotRequestError(
                f"{table} is not published by {', '.join(p.name for p in settings.publications)}"
                f" (captured: {', '.join(captured) or 'none'})"
            )
        described = describe(conn, table, settings.publication_names)
        if not described.key_columns:
            raise SnapshotRequestError(f"{table} has no primary key or replica identity index to chunk by")
        condition = None if where is None else untrusted.condition(where, described.relation.columns)
        if isinstance(condition, untrusted.Rejected):
            raise SnapshotRequestError(f"--where: {condition.detail}")
        try:
            conn.execute(sql.SQL("EXPLAIN ") + select_query(described, condition, None, 1))
        except psycopg.Error as exc:
            raise SnapshotRequestError(f"--where does not work on {table}: {_first(exc)}") from None
        request_id = uuid.uuid4().hex[:12]
        request = control.signed({"slot": settings.slot, "table": table, "where": condition, "id": request_id}, key)
        if standby:
            _request_on_primary(settings, request)
        else:
            emit(conn, control.REQUEST_PREFIX, request)
        return request_id
    except psycopg.OperationalError as exc:
        raise SourceDisconnected(f"connection lost: {_first(exc)}") from None
    finally:
        conn.close()


def _request_on_primary(settings: SourceSettings, request: dict[str, Any]) -> None:
    """``source.dsn`` is a standby: the request is written on its primary, whose WAL it replays."""
    primary = Primary.of(settings)
    assert primary is not None  # refused before without one
    try:
        primary.emit(control.REQUEST_PREFIX, control.encode(request))
    finally:
        primary.close()
