"""Snapshot orchestration: which tables to read, when, and what becomes of their rows. No psycopg, no Kafka:
the reader and the sink are passed in.

* **Initial** (``run_initial``): when cdcd creates its slot, every captured table is read in the snapshot the
  slot exported, in chunk-key order, and written before streaming starts at the slot's consistent point. With
  ``snapshot.parallelism`` > 1 (``Parallel``), on that many connections sharing the exported snapshot
  (``cdcd.snapshot.parallel``), a large table cut into key ranges (``cdcd.snapshot.ranges``), each range an
  entry of its own in the state, so that a restart reads only the ranges not finished.
* **Incremental** (``next_chunk`` / ``observe`` / ``watermark``): while streaming, one chunk at a time in its own
  transaction, with the DBLog window of ``cdcd.snapshot.window``; with a reader in read-only mode
  (``snapshot.read_only``) no watermark is written: the window closes once the stream passed the chunk's WAL
  position (``reached``), and only transactions the chunk's snapshot did not see touch it (``watches``).
  Queued by ``cdcd snapshot`` (a request message in the WAL), by a record of the Kafka signal topic
  (``signal``: execute, stop, pause, resume; its offset is kept in the state, so it is acted on once), for
  tables newly captured since the last start, and for what an interrupted initial snapshot left (its exported
  snapshot died with the connection).

Progress is saved when a chunk's rows are acknowledged; the next chunk does not wait for that. While a table
is read, ``cdcd.snapshot.meter`` counts its rows against the planner's estimate and a progress line is logged
every ``snapshot.progress_interval_s``. With ``notices``, Debezium's notifications are made on the way
(``cdcd.snapshot.notifications``); the loop hands them to the sink.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from cdcd.batches import SnapshotBatch, SnapshotRecords
from cdcd.columns import NO_RULES, ColumnRules
from cdcd.filters.plan import FilterPlan
from cdcd.ledger import Ledger
from cdcd.pgoutput.messages import Change, LogicalMessage, Relation, Row, Type
from cdcd.snapshot import control, signals, untrusted
from cdcd.snapshot.meter import SnapshotMeters
from cdcd.snapshot.notifications import Notices
from cdcd.snapshot.parallel import Part, PartReader, Read, read_parts
from cdcd.snapshot.ranges import parts_for
from cdcd.snapshot.signals import (
    ExecuteSnapshot,
    Ignored,
    PauseSnapshot,
    ResumeSnapshot,
    Signal,
    SignalRecord,
    StopSnapshot,
)
from cdcd.snapshot.sizing import FLOOR, ChunkSize
from cdcd.snapshot.state import SnapshotState, StateStore, TableProgress
from cdcd.snapshot.untrusted import Rejected, Rejections
from cdcd.snapshot.window import ChunkWindow
from cdcd.snapshot.xids import SnapshotXids

log = structlog.get_logger("cdcd.snapshot")

_Rows = list[Row] | SnapshotRecords  # a batch's rows, or their records made where they were read


class SnapshotError(RuntimeError):
    """A snapshot cannot go on (e.g. an interrupted initial snapshot of a table without a key)."""


class Table(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def relation(self) -> Relation: ...
    @property
    def key_columns(self) -> tuple[str, ...]: ...
    @property
    def types(self) -> tuple[Type, ...]: ...


class Chunk(Protocol):
    @property
    def table(self) -> Table: ...
    @property
    def rows(self) -> list[Row]: ...
    @property
    def xids(self) -> SnapshotXids: ...
    @property
    def watermark(self) -> str: ...
    @property
    def position(self) -> int | None: ...  # read-only: the WAL position after the chunk's snapshot


class BatchWriter(Protocol):
    """Where snapshot rows go (the sink)."""

    def write_snapshot(self, batch: SnapshotBatch, progress: Ledger) -> None: ...


class Reader(Protocol):
    def use_exported(self, snapshot_name: str) -> None: ...
    def end_transaction(self) -> None: ...
    def describe(self, name: str) -> Table: ...
    def ancestors(self, relation_id: int) -> list[str]: ...
    def rows(self, table: Any, condition: str | None, after: Sequence[str | None] | None) -> Iterator[Row]: ...
    def estimate(self, table: Any, condition: str | None, after: Sequence[str | None] | None) -> int | None: ...
    def last_key(self, table: Any) -> list[str | None]: ...
    def upper_bound(self, table: Any, until: Sequence[str | None]) -> str: ...
    def chunk(
        self, name: str, condition: str | None, after: Sequence[str | None] | None, limit: int, watermark: str
    ) -> Chunk: ...


@dataclass(frozen=True)
class Parallel:
    """An initial snapshot read on ``connections`` connections (``snapshot.parallelism``)."""

    connections: int
    open_reader: Callable[[], PartReader]  # a new connection, to read parts on
    # a table's key ranges for at most ``parts`` parts, as SQL conditions ([]: not cut): ``SnapshotReader.split``
    split: Callable[[Any, str | None, int], list[str]]
    # what makes a table's rows (its Relation, at the consistent point) into records on the reading threads: the
    # sink's ``snapshot_encoder`` (None: rows are handed over and the sink encodes them)
    encoder: Callable[[Relation, int], Callable[[bytes], SnapshotRecords]] | None = None


def key_values(relation: Relation, key_columns: Sequence[str], row: Row) -> list[str | None]:
    """The chunk key of ``row`` as the text values the next chunk's query compares against."""
    names = [c.name for c in relation.columns]
    out: list[str | None] = []
    for k in key_columns:
        v = row[names.index(k)]
        out.append(v if isinstance(v, str) or v is None else str(v))
    return out


@dataclass
class _Open:
    """The chunk in flight: read, waiting for its high watermark in the stream."""

    progress: TableProgress
    window: ChunkWindow
    relation: Relation
    key_columns: tuple[str, ...]
    last_key: list[str | None] | None  # key of the chunk's last row read (dropped or not)
    final: bool  # fewer rows than chunk_size: the table ends here


@dataclass
class Snapshotter:
    reader: Reader
    sink: BatchWriter
    ledger: Ledger
    store: StateStore
    state: SnapshotState
    plan: FilterPlan
    chunk_size: int
    types: dict[int, Type]  # the decoder's Type cache: snapshot tables' user types go in too
    on_rows: Callable[[str, int], None] = lambda table, rows: None
    meters: SnapshotMeters = field(default_factory=SnapshotMeters)
    window: _Open | None = None
    cursors: dict[str, list[str | None] | None] = field(default_factory=dict)  # id -> last key handed over
    # False for an exactly-once sink: a chunk's progress is saved after the Kafka commit that holds its rows
    # (``saved``), so the state file is never ahead of Kafka
    save_on_done: bool = True
    handed: set[str] = field(default_factory=set)  # ids whose last chunk is handed over
    notices: Notices | None = None  # Debezium's notifications, when a notification topic is configured
    announced: set[str] = field(default_factory=set)  # snapshots whose STARTED was considered
    initial_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])  # the initial snapshot's notifications
    parallel: Parallel | None = None  # the initial snapshot on several connections; None: on ``reader``'s
    # the key `cdcd snapshot` signs its requests with (``snapshot.request_key_file``); None: requests are refused
    request_key: bytes | None = None
    rejections: Rejections = field(default_factory=Rejections)  # control input refused (cdcd_control_rejected)
    renamed: Callable[[int], str | None] = lambda relation_id: None  # a captured table's name now, by relation id
    columns: ColumnRules = NO_RULES  # a key column masked by hash is shown hashed (notifications, logs)
    # the rows of the next incremental chunk, kept by the loop across sessions; None: always ``chunk_size``
    sizes: ChunkSize | None = None

    def __post_init__(self) -> None:
        if self.sizes is None:
            self.sizes = ChunkSize(self.chunk_size, 0.0)

    # -- shared -------------------------------------------------------------------------------------

    def condition(self, item: TableProgress, table: Table) -> str | Rejected | None:
        """The row filters (ORed, as PostgreSQL's initial synchronization applies them), AND the request's, AND the
        key range. The request's condition is read again here against the table's columns, whatever queued it (a
        WAL request, a signal, the state file of an older cdcd): only cdcd's rendering of it reaches the server."""
        ancestors = self.reader.ancestors(table.relation.relation_id)
        filters = self.plan.copy_filters(item.table, ancestors)
        where = None if not item.where else untrusted.condition(item.where, table.relation.columns)
        if isinstance(where, Rejected):
            return where
        return all_of([" OR ".join(f"({f.sql})" for f in filters or ()), where, item.key_range])

    def _refuse(self, item: TableProgress, refused: Rejected) -> None:
        """``item``'s condition is refused: it leaves the queue (ABORTED), and streaming goes on."""
        log.warning("snapshot condition refused", table=item.table, id=item.id, reason=refused.detail)
        self.rejections.add("snapshot", refused.reason)
        self.state.finish(item)
        if self.notices is not None:
            self.notices.aborted(item.snapshot, [item.table])
        self.store.save(self.state)

    def _saved(
        self, item: TableProgress, last_key: list[str | None] | None, rows: int, final: bool
    ) -> Callable[[], None]:
        def done() -> None:
            if not any(p is item for p in self.state.queue):
                return  # stopped by a signal meanwhile
            item.last_key, item.rows, item.chunks = last_key, item.rows + rows, item.chunks + 1
            if final:
                self.state.finish(item)
            if final and not self._ranges_left(item):
                now = time.monotonic()
                meter = self.meters.finish(item.table, _meter_id(item), now)
                view = {} if meter is None else meter.view(now)
                log.info(
                    "table snapshot finished",
                    table=item.table,
                    kind=item.kind,
                    rows=view.get("rows", item.rows) if item.key_range else item.rows,
                    id=_meter_id(item),
                    seconds=view.get("seconds"),
                    estimated_rows=view.get("estimated_rows"),
                )
            if self.save_on_done:
                self.store.save(self.state)

        return done

    def _ranges_left(self, item: TableProgress) -> bool:
        """Whether other key ranges of ``item``'s table are still queued (its table is not finished)."""
        return item.key_range is not None and any(
            p.key_range is not None and p.table == item.table and p.group == item.group for p in self.state.queue
        )

    def _begin(self, item: TableProgress, table: Table, condition: str | None, after: Any) -> None:
        """Start metering ``item`` (unless it runs already): estimate its rows, log that it starts."""
        if self.meters.running(item.table, _meter_id(item)):
            return
        left = self.reader.estimate(table, condition, after)
        estimated = None if left is None else item.rows + left
        meter_id = _meter_id(item)
        self.meters.start(item.table, item.kind, meter_id, estimated=estimated, rows=item.rows, now=time.monotonic())
        self._announce(item)
        log.info(
            "snapshotting table",
            table=item.table,
            kind=item.kind,
            filtered=condition is not None,
            estimated_rows="unknown" if estimated is None else estimated,
            rows_done=item.rows,
            after_key=self.columns.shown_key(table.relation, table.key_columns, after),
            id=item.id,
        )

    def _count(self, item: TableProgress, rows: int) -> None:
        """``rows`` more rows of ``item`` read; log its progress when due."""
        self.on_rows(item.table, rows)
        now = time.monotonic()
        meter = self.meters.add(item.table, rows, now)
        if meter is not None:
            log.info("snapshot progress", id=item.id, **meter.view(now))
            if item.kind == "initial" and self.notices is not None:
                self.notices.initial(self.initial_id, "IN_PROGRESS", self._initial_progress(item, meter.rows))

    def _learn(self, table: Table) -> None:
        for t in table.types:
            self.types.setdefault(t.type_oid, t)

    # -- initial --------------------------------------------------------------------------------------

    def run_initial(self, snapshot_name: str, poll: Callable[[], None]) -> None:
        """Read every queued initial table in the exported snapshot and hand the rows to the sink.
        ``poll`` is called between chunks (sink delivery, heartbeats)."""
        self.reader.use_exported(snapshot_name)
        start = time.monotonic()
        if self.notices is not None:
            self.notices.initial(self.initial_id, "STARTED")
        if self.parallel is None:
            total = self._read_initial(poll)
        else:
            total = self._read_parallel(snapshot_name, poll, self.parallel)
        seconds = time.monotonic() - start
        log.info(
            "initial snapshot read",
            rows=total,
            seconds=round(seconds, 2),
            rows_per_s=round(total / seconds) if seconds else None,
            connections=1 if self.parallel is None else self.parallel.connections,
        )

    def _start_initial(self, item: TableProgress) -> tuple[Table, str | None] | None:
        """An initial table about to be read: described (its types learnt), its condition, its start announced.
        None for a table the exported snapshot does not hold by that name: created after its consistent point, or
        renamed or moved into a published schema since (then it had rows the stream never sends); it is queued
        for an incremental snapshot instead."""
        try:
            table: Table | None = self.reader.describe(item.table)
        except LookupError:  # the reader's TableGone
            table = None
        if table is None or item.relation_id not in (None, table.relation.relation_id):  # its name was another's
            log.warning(
                "table not in the exported snapshot (created, renamed or moved since): queued for an incremental"
                " snapshot",
                table=item.table,
            )
            item.kind = "incremental"
            return None
        self._learn(table)
        condition = self.condition(item, table)
        if isinstance(condition, Rejected):
            self._refuse(item, condition)
            return None
        self._begin(item, table, condition, item.last_key)
        if self.notices is not None:
            self.notices.initial(self.initial_id, "IN_PROGRESS", self._initial_progress(item, item.rows))
        return table, condition

    def _read_initial(self, poll: Callable[[], None]) -> int:
        """The initial tables one after the other on ``reader``'s connection: the rows read."""
        lsn = self.state.consistent_point or 0
        held: tuple[TableProgress, Relation, list[Row], list[str | None] | None] | None = None
        first = True
        total = 0
        for item in [p for p in self.state.queue if p.kind == "initial"]:
            if (started := self._start_initial(item)) is None:
                continue
            table, condition = started
            for rows, final in _chunks(self.reader.rows(table, condition, item.last_key), self.chunk_size):
                if held is not None:
                    self._write_initial(*held, lsn, first=first, last=False, final=held[0] is not item)
                    first = False
                key = key_values(table.relation, table.key_columns, rows[-1]) if table.key_columns else None
                held = (item, table.relation, rows, key)
                total += len(rows)
                self._count(item, len(rows))
                if not final:
                    poll()
            self._table_done(item)  # every row read (the last batch is written with the next table's first)
            if held is None or held[0] is not item:  # an empty table is finished at once
                self._saved(item, item.last_key, 0, True)()
        if held is not None:
            self._write_initial(*held, lsn, first=first, last=True, final=True)
        return total

    def _read_parallel(self, snapshot_name: str, poll: Callable[[], None], parallel: Parallel) -> int:
        """The initial tables' parts read on ``parallel``'s connections, written here as they come: a part's
        batches in its key order, its last one ``final`` (its progress then finished once acknowledged). The
        last batch of all is held back until every part is read, to be marked the snapshot's last."""
        lsn = self.state.consistent_point or 0
        parts, tables = self._parts(parallel)
        left = Counter(id(tables[id(p.owner)]) for p in parts)  # parts not read yet, by table
        held: tuple[TableProgress, Relation, _Rows, list[str | None] | None, bool] | None = None
        first = True
        total = 0
        reading = read_parts(parts, parallel.connections, parallel.open_reader, snapshot_name, self.chunk_size)
        with closing(reading) as reads:
            for read in reads:
                if read is None:
                    poll()
                    continue
                if read.rows:
                    if held is not None:
                        self._write_initial(*held[:4], lsn, first=first, last=False, final=held[4])
                        first = False
                    held = (*self._batch(read), read.final)
                    total += len(read.rows)
                    self._count(read.part.owner, len(read.rows))
                elif read.final:  # a part without rows: finished at once
                    item = read.part.owner
                    self._saved(item, item.last_key, 0, True)()
                if read.final:
                    table_item = tables[id(read.part.owner)]
                    left[id(table_item)] -= 1
                    if not left[id(table_item)]:
                        self._table_done(table_item)
                poll()
        if held is not None:
            self._write_initial(*held[:4], lsn, first=first, last=True, final=held[4])
        return total

    def _batch(self, read: Read) -> tuple[TableProgress, Relation, _Rows, list[str | None] | None]:
        table: Table = read.part.table
        rows = read.rows
        last = rows.last if isinstance(rows, SnapshotRecords) else rows[-1]
        key = key_values(table.relation, table.key_columns, last) if table.key_columns else None
        return read.part.owner, table.relation, rows, key

    def _parts(self, parallel: Parallel) -> tuple[list[Part], dict[int, TableProgress]]:
        """What to read: each initial table whole, or in key ranges when it is large enough; the ranges replace
        its entry in the state (saved at once, so that a restart knows them). With each part's item (by id), the
        table's own item, which its notifications and its meter go by."""
        parts: list[Part] = []
        tables: dict[int, TableProgress] = {}
        lsn = self.state.consistent_point or 0
        for item in [p for p in self.state.queue if p.kind == "initial"]:
            if (started := self._start_initial(item)) is None:
                continue
            table, condition = started
            encode = None if parallel.encoder is None else parallel.encoder(table.relation, lsn)
            meter = self.meters.tables.get(item.table)
            count = parts_for(meter.estimated if meter is not None else None, self.chunk_size, parallel.connections)
            ranges = parallel.split(table, condition, count) if table.key_columns and item.last_key is None else []
            pieces, oid = [item], item.relation_id
            if len(ranges) > 1:
                pieces = [
                    TableProgress(item.table, "initial", item.where, group=item.id, key_range=r, relation_id=oid)
                    for r in ranges
                ]
                at = self.state.queue.index(item)
                self.state.queue[at : at + 1] = pieces
                log.info("table cut into key ranges", table=item.table, ranges=len(pieces), id=item.id)
            for piece in pieces:
                tables[id(piece)] = item
                parts.append(Part(piece, table, all_of([condition, piece.key_range]), piece.last_key, encode))
        self.store.save(self.state)
        return parts, tables

    def _write_initial(
        self,
        item: TableProgress,
        relation: Relation,
        rows: _Rows,
        key: list[str | None] | None,
        lsn: int,
        *,
        first: bool,
        last: bool,
        final: bool,
    ) -> None:
        done = self._saved(item, key, len(rows), final)
        if isinstance(rows, SnapshotRecords):
            batch = SnapshotBatch(relation, (), lsn, rows.ts_us, "true", first, last, done, rows)
        else:
            batch = SnapshotBatch(relation, rows, lsn, time.time_ns() // 1000, "true", first, last, done)
        self.sink.write_snapshot(batch, self.ledger)

    def committable(self) -> dict[str, Any]:
        """What an exactly-once sink's progress record carries for the state in memory (``StateStore.stage``)."""
        return self.store.stage(self.state)

    def saved(self) -> None:
        """The progress in memory is committed (an exactly-once sink's commit): save it."""
        self.store.save(self.state, committed=True)

    def initial_finished(self) -> None:
        self.reader.end_transaction()
        self.state.initial = "done"
        self.store.save(self.state)
        if self.notices is not None:
            self.notices.initial(self.initial_id, "COMPLETED")

    def initial_aborted(self) -> None:
        """A stop came before the initial snapshot finished (a restart continues it incrementally)."""
        if self.notices is not None:
            self.notices.initial(self.initial_id, "ABORTED")

    def _initial_progress(self, item: TableProgress, rows: int) -> dict[str, str]:
        tables = dict.fromkeys(p.table for p in self.state.queue if p.kind == "initial")  # once each, cut or not
        data = {"current_collection_in_progress": item.table, "data_collections": ",".join(tables)}
        meter = self.meters.tables.get(item.table)
        data["total_rows_scanned"] = str(rows)
        if meter is not None and meter.estimated is not None:
            data["estimated_rows"] = str(meter.estimated)
        return data

    # -- notifications --------------------------------------------------------------------------------

    def _tables_of(self, snapshot: str) -> list[str]:
        """The tables of ``snapshot`` still to read (their last chunk not handed over)."""
        return [p.table for p in self.state.queue if p.snapshot == snapshot and p.id not in self.handed]

    def _rows(self, item: TableProgress) -> int:
        """Rows of ``item`` handed over so far (its meter counts them as they go; the state, once acknowledged)."""
        meter = self.meters.tables.get(item.table)
        return meter.rows if meter is not None and meter.id == _meter_id(item) else item.rows

    def _announce(self, item: TableProgress) -> None:
        """STARTED, when the first table of an incremental snapshot begins (not again when it resumes)."""
        if self.notices is None or item.kind != "incremental" or item.snapshot in self.announced:
            return
        self.announced.add(item.snapshot)
        if item.rows == 0 and item.last_key is None:
            self.notices.started(item.snapshot, self._tables_of(item.snapshot))

    def _table_done(self, item: TableProgress, status: str | None = None) -> None:
        """The last rows of ``item`` are read (initial) or handed to the sink (incremental), or it cannot be read:
        TABLE_SCAN_COMPLETED, and COMPLETED after its snapshot's last table. Told then, not once acknowledged, so
        they come in Debezium's order (before the next table's IN_PROGRESS)."""
        if self.notices is None:
            return
        rows = self._rows(item)
        status = status or ("SUCCEEDED" if rows else "EMPTY")
        if item.kind == "initial":
            data = {"scanned_collection": item.table, "total_rows_scanned": str(rows), "status": status}
            self.notices.initial(self.initial_id, "TABLE_SCAN_COMPLETED", data)
            return
        remaining = [  # by id: the other key ranges of a table resumed from a parallel initial snapshot count
            p.table for p in self.state.queue if p.snapshot == item.snapshot and p.id not in self.handed | {item.id}
        ]
        tables = list(dict.fromkeys([item.table, *remaining]))
        self.notices.table_done(item.snapshot, tables, item.table, rows, status)
        if not remaining:
            self.notices.completed(item.snapshot)

    def _chunk_notice(self, item: TableProgress, current: _Open) -> None:
        if self.notices is None:
            return
        meter = self.meters.tables.get(item.table)
        estimated = meter.estimated if meter is not None and meter.id == item.id else None
        tables = self._tables_of(item.snapshot)
        key = self.columns.shown_key(current.relation, current.key_columns, current.last_key)
        self.notices.in_progress(item.snapshot, tables, item.table, key, rows=self._rows(item), estimated=estimated)

    # -- incremental ----------------------------------------------------------------------------------

    @property
    def pending(self) -> bool:
        if self.window is not None:
            return True
        return not self.state.paused and any(p.id not in self.handed for p in self.state.queue)

    def next_chunk(self, recent_xids: Sequence[int]) -> None:
        """Read the next chunk of the first queued table unless one is in flight."""
        if self.window is not None or self.state.paused:
            return
        item = next((p for p in self.state.queue if p.id not in self.handed), None)
        if item is None:
            return
        after = self.cursors.get(item.id, item.last_key)
        watermark = uuid.uuid4().hex
        table = self._describe(item)
        if table is None:
            self._gone(item)
            return
        item.relation_id = table.relation.relation_id  # kept in the state: a restart finds it renamed by it
        if not table.key_columns:
            if item.resumed_initial:
                raise SnapshotError(
                    f"the initial snapshot of {item.table} was interrupted and cannot be resumed: the table has no"
                    " primary key or replica identity index to continue by. Drop the slot and remove"
                    f" {self.store.path} to snapshot again from the start"
                )
            log.error(
                "cannot snapshot a table without a primary key or replica identity index incrementally; skipped",
                table=item.table,
            )
            self._table_done(item, "NO_PRIMARY_KEY")
            self.state.finish(item)
            self.store.save(self.state)
            return
        self._learn(table)
        condition = self.condition(item, table)
        if isinstance(condition, Rejected):
            self._refuse(item, condition)
            return
        self._begin(item, table, condition, after)
        try:
            bound = self._bound(item, table)
            read = self._read_chunk(item, all_of([condition, bound]) if bound else condition, after, watermark)
        except LookupError:  # dropped since it was described
            self._gone(item)
            return
        if read is None:
            return
        chunk, limit = read
        if not ChunkWindow.admits(chunk.xids, recent_xids):
            log.debug(
                "chunk snapshot misses a transaction the stream already emitted; reading it again", table=item.table
            )
            return
        relation = chunk.table.relation
        rows = chunk.rows
        name = (relation.schema, relation.name)
        snapshot = None if chunk.position is None else chunk.xids
        window = ChunkWindow.open(
            name, relation, chunk.table.key_columns, rows, watermark, until=chunk.position, snapshot=snapshot
        )
        last = key_values(relation, chunk.table.key_columns, rows[-1]) if rows else after
        self.window = _Open(item, window, relation, chunk.table.key_columns, last, len(rows) < limit)

    def _bound(self, item: TableProgress, table: Table) -> str | None:
        """The end of an incremental snapshot's key range (``TableProgress.until_key``), looked up when its first
        chunk is read; None for the initial snapshot's, which its exported snapshot bounds."""
        if item.kind != "incremental":
            return None
        if item.until_key is None or (item.until_key and len(item.until_key) != len(table.key_columns)):
            item.until_key = self.reader.last_key(table)  # saved with the next chunk's progress
        return self.reader.upper_bound(table, item.until_key)

    def _describe(self, item: TableProgress) -> Table | None:
        """``item``'s table, followed by relation id when renamed since it was queued (its name may be another
        table's now); None: no longer captured."""
        try:
            table = self.reader.describe(item.table)
        except LookupError:  # the reader's TableGone
            pass
        else:
            if item.relation_id in (None, table.relation.relation_id):
                return table
        name = None if item.relation_id is None else self.renamed(item.relation_id)
        if name is None or name == item.table:
            return None
        log.info("a queued table was renamed: its snapshot follows it", table=name, was=item.table)
        item.table = name
        return self._describe(item)

    def _gone(self, item: TableProgress) -> None:
        """A queued table that no longer exists leaves the queue (its snapshot ends unfinished); cdcd goes on."""
        log.warning(
            "a table queued for a snapshot no longer exists: its snapshot is dropped",
            table=item.table,
            id=item.id,
            rows_done=item.rows,
        )
        self._abandon(item, "UNKNOWN_SCHEMA")

    def _abandon(self, item: TableProgress, status: str) -> None:
        """``item`` leaves the queue unfinished (``status`` in its notification), its meter with it."""
        self._table_done(item, status)
        self.state.finish(item)
        self.cursors.pop(item.id, None)
        meter = self.meters.tables.get(item.table)
        if meter is not None and meter.id == _meter_id(item):
            del self.meters.tables[item.table]
        self.store.save(self.state)

    def _read_chunk(
        self, item: TableProgress, condition: str | None, after: Sequence[str | None] | None, watermark: str
    ) -> tuple[Chunk, int] | None:
        """The next chunk of ``item``, and the rows it asked for (``sizes``). One that outlasted its time is asked
        with fewer rows next time: cancelled by the server's statement_timeout (None: the session goes on), or given
        up with its connection at the deadline (the reader's ChunkDeadline: the session starts again). A chunk of
        a single row that outlasts its time leaves the queue (``_too_slow``): asking again would do the same."""
        sizes = self.sizes
        assert sizes is not None  # __post_init__
        limit, began = sizes.rows, time.monotonic()
        try:
            chunk = self.reader.chunk(item.table, condition, after, limit, watermark)
        except TimeoutError as exc:
            fewer = sizes.timed_out()
            log.warning(
                "snapshot chunk outlasted its deadline: reading it again with fewer rows",
                table=item.table,
                rows=limit,
                next_rows=fewer,
            )
            if isinstance(exc, ConnectionError):  # the reader's ChunkDeadline: the connection was given up
                raise
            if limit <= FLOOR:
                self._too_slow(item)
            return None
        sizes.took(time.monotonic() - began)
        return chunk, limit

    def _too_slow(self, item: TableProgress) -> None:
        """Even one row of ``item`` outlasts a chunk's time (a condition that scans far for its rows without an
        index): its snapshot leaves the queue (ABORTED), counted, and streaming goes on."""
        log.error(
            "snapshot aborted: even a chunk of one row outlasts its time (a condition without an index to use?)",
            table=item.table,
            id=item.id,
            rows_done=item.rows,
        )
        self.rejections.add("snapshot", "too_slow")
        self._abandon(item, "TOO_SLOW")

    @property
    def watching(self) -> bool:
        """A chunk's window is open: the changes written until its high watermark must be shown to ``observe``."""
        return self.window is not None

    def watches(self, xid: int) -> bool:
        """Whether the changes of committed transaction ``xid`` must be shown to ``observe``."""
        return self.window is not None and self.window.window.concerns(xid)

    def observe(self, change: Change) -> None:
        if self.window is not None:
            self.window.window.observe(change)

    @property
    def awaiting(self) -> int | None:
        """The WAL position the read-only window in flight waits for the stream to pass (None: no such window)."""
        return None if self.window is None else self.window.window.until

    def reached(self, position: int) -> None:
        """The stream passed ``position`` (everything before it was emitted and written): a read-only window it
        closes writes its rows."""
        current = self.window
        if current is not None and current.window.reached(position):
            assert current.window.until is not None
            self._close(current, current.window.until)

    def watermark(self, message: LogicalMessage) -> None:
        """A watermark reached the stream: at the high watermark of the chunk in flight, write its rows."""
        content = control.decode(message.content)
        current = self.window
        if isinstance(content, Rejected) or current is None or current.window.until is not None:
            return  # a read-only window has no watermark: another cdcd's (another slot's) passes by
        if content.get("id") != current.window.watermark or content.get("mark") != "high":
            return
        self._close(current, message.lsn)

    def _close(self, current: _Open, lsn: int) -> None:
        """The window of ``current`` closed at stream position ``lsn``: write the rows left."""
        self.window = None
        if current.window.invalid:
            log.info(
                "table changed its key columns during a chunk; reading the chunk again", table=current.progress.table
            )
            return
        item, rows = current.progress, list(current.window.rows.values())
        self.cursors[item.id] = current.last_key
        done = self._saved(item, current.last_key, len(rows), current.final)
        batch = SnapshotBatch(current.relation, rows, lsn, time.time_ns() // 1000, "incremental", done=done)
        self.sink.write_snapshot(batch, self.ledger)
        self._count(item, len(rows))
        self._chunk_notice(item, current)
        if current.final:
            self._table_done(item)
            self.handed.add(item.id)  # stays queued until acknowledged; the next table goes on meanwhile

    def reset(self) -> None:
        """The session ended: a chunk in flight will never see its watermark."""
        self.window = None

    def request(self, message: LogicalMessage, captured: Sequence[str]) -> None:
        """A `cdcd snapshot` request in the stream (any database role can write one): queued when it is signed with
        this cdcd's request key and asks for what cdcd may do; anything else is logged, counted and passed by."""
        try:
            refused = self._request(message, captured)
        except Exception as exc:  # a defect must not stop the stream: the message is passed by all the same
            log.exception("snapshot request not understood", lsn=message.lsn)
            refused = Rejected("internal", f"{type(exc).__name__}: {exc}")
        if refused is not None:
            log.warning("snapshot request refused", lsn=message.lsn, reason=refused.detail)
            self.rejections.add("wal", refused.reason)

    def _request(self, message: LogicalMessage, captured: Sequence[str]) -> Rejected | None:
        content = control.decode(message.content)
        if isinstance(content, Rejected) or content.get("slot") != self.store.slot:
            return content if isinstance(content, Rejected) else None  # another slot's: another cdcd's to act on
        if self.request_key is None:
            return Rejected("requests_off", "snapshot requests in the WAL are off (snapshot.requests)")
        body = control.verify(content, self.request_key)
        if isinstance(body, Rejected):
            return body
        table, where, request_id = body.get("table"), body.get("where"), body.get("id")
        if not isinstance(table, str) or table not in captured:
            return Rejected("not_captured", f"table {str(table)[: untrusted.MAX_NAME]!r} is not captured")
        if (where is not None and not isinstance(where, str)) or not isinstance(request_id, str) or not request_id:
            return Rejected("invalid", "a request's where must be text or null, its id text")
        condition = untrusted.condition(where) if where else None
        if isinstance(condition, Rejected):
            return condition
        item = TableProgress(table, "incremental", condition, id=request_id[:64])
        if item.id in self.state.finished or any(p.id == item.id for p in self.state.queue):
            return None  # the request was replayed after a restart
        if self.state.enqueue(item):
            self.store.save(self.state)
            log.info("incremental snapshot queued", table=table, where=item.where, id=item.id)
        return None

    def captured_now(
        self, relations: Mapping[str, int], partitions: Mapping[int, Mapping[int, str]], snapshot: bool
    ) -> None:
        """What the publications capture now, as looked up while streaming (``follow_captured``): what was not
        captured before is queued for an incremental snapshot when ``snapshot`` (``snapshot.new_tables``)."""
        if follow_captured(self.state, list(relations), relations, partitions, snapshot):
            self.store.save(self.state)

    # -- signals (the Kafka signal topic) --------------------------------------------------------------

    def signal(self, record: SignalRecord, name: str, captured: Sequence[str]) -> None:
        """Act on a record of the signal topic, once: the offset after it goes into the state with what it did
        (committed with the data by an exactly-once sink, saved in the state file at once otherwise)."""
        parsed = signals.parse(record.key, record.value, name, f"signal-{record.partition}-{record.offset}")
        self.state.signal_offsets[str(record.partition)] = record.offset + 1
        where = {"partition": record.partition, "offset": record.offset}
        if not isinstance(parsed, Ignored):
            log.info("signal received", type=type(parsed).__name__, id=parsed.id, **where)
        ignored = parsed if isinstance(parsed, Ignored) else self._acted(parsed, captured)
        if ignored is not None:
            (log.info if ignored.elsewhere else log.warning)("signal record skipped", reason=ignored.reason, **where)
            if not ignored.elsewhere:
                self.rejections.add("signal", ignored.label)
            if ignored.id is not None and self.notices is not None:
                self.notices.aborted(ignored.id, [])
        self.store.save(self.state)

    def _acted(self, signal: Signal, captured: Sequence[str]) -> Ignored | None:
        try:
            self._act(signal, captured)
        except Exception as exc:  # a defect must not stop the stream: the record is passed by all the same
            log.exception("signal not understood", id=signal.id)
            return Ignored(f"{type(exc).__name__}: {exc}", label="internal")
        return None

    def _act(self, signal: Signal, captured: Sequence[str]) -> None:
        if isinstance(signal, ExecuteSnapshot):
            self._execute(signal, captured)
        elif isinstance(signal, StopSnapshot):
            self._stop(signal)
        elif isinstance(signal, PauseSnapshot | ResumeSnapshot):
            self._pause(isinstance(signal, PauseSnapshot))
        else:
            log.info("signal log message", message=signal.message, id=signal.id)

    def _execute(self, signal: ExecuteSnapshot, captured: Sequence[str]) -> None:
        for pattern in signal.collections:
            if not signals.select([pattern], captured):
                log.error("execute-snapshot names no table cdcd captures", data_collection=pattern, id=signal.id)
        for table in signals.select(signal.collections, captured):
            where = signals.condition_for(table, signal.conditions)
            item = TableProgress(table, "incremental", where, group=signal.id)
            if self.state.enqueue(item):
                log.info("incremental snapshot queued", table=table, where=where, id=item.id, signal=signal.id)
            else:
                log.info("an incremental snapshot of this table and condition is queued already", table=table)

    def _stop(self, signal: StopSnapshot) -> None:
        """Stop the incremental snapshots of the tables named, or every one. What an interrupted initial snapshot
        left is stopped only when its table is named: its rows would never arrive otherwise."""
        queue = self.state.queue
        if signal.collections:
            stopped = [p for p in queue if signals.select(signal.collections, [p.table])]
        else:
            stopped = [p for p in queue if not p.resumed_initial]
        if not stopped:
            log.info("stop-snapshot: no incremental snapshot to stop", id=signal.id)
            return
        for item in stopped:
            self.state.finish(item)  # as finished: a `cdcd snapshot` request the stream sends again stays done
        if self.window is not None and any(self.window.progress is s for s in stopped):
            self.window = None  # its high watermark is ignored when it comes
        for item in stopped:
            self.handed.discard(item.id)
            self.cursors.pop(item.id, None)
            meter = self.meters.tables.get(item.table)
            if meter is not None and meter.id == item.id:
                del self.meters.tables[item.table]
            log.info("incremental snapshot stopped", table=item.table, id=item.id, rows=item.rows, signal=signal.id)
        if self.notices is not None:
            for snapshot in dict.fromkeys(p.snapshot for p in stopped):
                self.notices.aborted(snapshot, [p.table for p in stopped if p.snapshot == snapshot])

    def _pause(self, pause: bool) -> None:
        if self.state.paused == pause:
            log.info("incremental snapshots are already " + ("paused" if pause else "running"))
            return
        self.state.paused = pause
        log.info("incremental snapshots " + ("paused" if pause else "resumed"), queued=len(self.state.queue))
        if self.notices is not None:
            tell = self.notices.paused if pause else self.notices.resumed
            for snapshot in dict.fromkeys(p.snapshot for p in self.state.queue):
                tell(snapshot, self._tables_of(snapshot))


def all_of(conditions: Sequence[str | None]) -> str | None:
    """The conditions given (SQL, each whole), ANDed; None when there is none."""
    present = [c for c in conditions if c]
    return " AND ".join(f"({c})" for c in present) if present else None


def _meter_id(item: TableProgress) -> str:
    """The id of the meter that counts ``item``'s rows: its table's, for a key range."""
    return (item.group or item.id) if item.key_range is not None else item.id


def _chunks(rows: Iterator[Row], size: int) -> Iterator[tuple[list[Row], bool]]:
    """``rows`` in lists of ``size``; the flag tells whether it is the last list."""
    batch: list[Row] = []
    for row in rows:
        if len(batch) == size:
            yield batch, False
            batch = []
        batch.append(row)
    if batch:
        yield batch, True


def start_state(
    state: SnapshotState | None,
    slot: str,
    mode: str,
    created: int | None,
    captured: Sequence[str],
    *,
    new_tables: bool = True,
    relations: Mapping[str, int] | None = None,
    partitions: Mapping[int, Mapping[int, str]] | None = None,
) -> SnapshotState:
    """What to snapshot at start. ``created``: the consistent point of a slot created now (None: it existed).
    ``relations``: the captured tables' relation ids, by which a table renamed since the last start is known;
    ``partitions``: the leaf partitions of those published as their root (None: not looked up).

    A new slot (in modes initial, initial_only, when_needed) gets an initial snapshot of every captured table.
    An existing slot resumes what was saved: an initial snapshot that did not finish continues as incremental
    chunks after its last saved key (its exported snapshot is gone, the stream restarts at its consistent
    point). Tables captured since the last start, and partitions attached since to a table published as its root,
    get incremental snapshots (modes initial and when_needed, unless ``new_tables`` is off).
    """
    snapshots, relations = mode != "never", dict(relations or {})
    if created is not None:
        fresh = SnapshotState(slot=slot, known_tables=list(captured), known_relations=relations)
        attached_partitions(fresh, relations, partitions or {})
        if snapshots:
            fresh.initial, fresh.consistent_point = "running", created
            fresh.queue = [TableProgress(t, "initial", relation_id=relations.get(t)) for t in captured]
        return fresh
    if state is None:
        if snapshots:
            log.warning(
                "the slot exists but no snapshot state was found: nothing is snapshotted now"
                " (use `cdcd snapshot --table` to snapshot a table)",
                slot=slot,
            )
        unknown = SnapshotState(slot=slot, known_tables=list(captured), known_relations=relations)
        attached_partitions(unknown, relations, partitions or {})
        return unknown
    _follow_renames(state, relations)
    for item in state.queue:
        if item.kind == "initial":
            item.kind, item.resumed_initial = "incremental", True
            log.warning(  # its key (perhaps to hash) is logged when it is read (``_begin``)
                "initial snapshot was interrupted: continuing it incrementally", table=item.table, rows_done=item.rows
            )
    if state.initial == "running":
        state.initial = "done"
    state.fresh_slot = False
    follow_captured(state, captured, relations, partitions, mode in ("initial", "when_needed") and new_tables)
    return state


def follow_captured(
    state: SnapshotState,
    captured: Sequence[str],
    relations: Mapping[str, int],
    partitions: Mapping[int, Mapping[int, str]] | None,
    snapshot: bool,
) -> bool:
    """Bring the known tables up to date with what the publications capture now (``captured``, their relation ids
    and the leaf partitions of those published as their root; ``partitions`` None: not looked up). A table newly
    captured (added to a publication, by hand or by pattern; a partition attached to a root that publishes its
    leaves) and a partition attached to a table published as its root are queued for an incremental snapshot when
    ``snapshot``: their rows from before were never streamed. Whether the state changed."""
    new = [t for t in captured if _newly_captured(state, t, relations)]
    attached = attached_partitions(state, relations, partitions) if partitions is not None else None
    changed = bool(new) or (attached is not None and attached.changed)
    changed |= (list(captured), dict(relations)) != (state.known_tables, state.known_relations)
    for table in new if snapshot else ():
        if state.enqueue(TableProgress(table, "incremental", relation_id=relations.get(table))):
            log.info("table newly captured: queued for an incremental snapshot", table=table)
    for item in attached.attached if snapshot and attached is not None else ():
        if state.enqueue(item):
            log.info("partition attached: its rows queued for an incremental snapshot", table=item.table)
    state.known_tables, state.known_relations = list(captured), dict(relations)
    return changed


@dataclass
class PartitionChanges:
    attached: list[TableProgress]  # an incremental snapshot of each attached partition's rows, through its root
    changed: bool  # the known partitions changed (saved with the state)


def attached_partitions(
    state: SnapshotState, relations: Mapping[str, int], partitions: Mapping[int, Mapping[int, str]]
) -> PartitionChanges:
    """Partitions attached, since they were last looked at, to tables published as their partitioned root: ATTACH
    writes no change for the rows they hold, so each gets an incremental snapshot of the root restricted to it
    (its partition constraint). ``state.known_partitions`` is brought up to date. A root seen for the first time is
    only remembered: its own snapshot or the stream has its rows. A detached partition's rows stay in the root's
    topic: PostgreSQL writes no change for them either (logged)."""
    names = {oid: name for name, oid in relations.items()}
    known: dict[str, list[int]] = {}
    attached: list[TableProgress] = []
    for root, leaves in partitions.items():
        name = names.get(root)
        if name is None:
            continue
        seen = state.known_partitions.get(str(root))
        if seen is not None:
            attached += [
                TableProgress(name, "incremental", key_range=leaves[leaf], relation_id=root)
                for leaf in sorted(leaves)
                if leaf not in seen
            ]
            if gone := sorted(set(seen) - set(leaves)):
                log.warning(
                    "partition detached: its rows stay in the table's topic (PostgreSQL writes no change for them)",
                    table=name,
                    partitions=gone,
                )
        known[str(root)] = sorted(leaves)
    changed = known != state.known_partitions
    state.known_partitions = known
    return PartitionChanges(attached, changed)


def _newly_captured(state: SnapshotState, table: str, relations: Mapping[str, int]) -> bool:
    """Not captured at the last start: by relation id (a renamed table is not new, a new one under an old name is),
    by name in a state saved without relation ids."""
    relation_id = relations.get(table)
    if relation_id is not None and state.known_relations:
        return relation_id not in state.known_relations.values()
    return table not in state.known_tables


def _follow_renames(state: SnapshotState, relations: Mapping[str, int]) -> None:
    """Queued tables renamed (or moved to another schema) since the last start go on under their new names."""
    names = {oid: name for name, oid in relations.items()}
    for item in state.queue:
        renamed = names.get(item.relation_id) if item.relation_id is not None else None
        if renamed is not None and renamed != item.table:
            log.info("a queued table was renamed: its snapshot follows it", table=renamed, was=item.table)
            item.table = renamed
