"""What the replication core hands to a sink: a committed ``Transaction`` (its changes decoded, or encoded as
they arrived in ``EncodedRun``s), a ``SnapshotBatch`` of rows, or transactions already ``Shaped`` into records
(by the compiled lane, ``cdcd.replication.lane``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from cdcd.lsn import pg_to_unix_us
from cdcd.pgoutput.decoder import Decoder
from cdcd.pgoutput.messages import Change, Relation, Row, RowChange

if TYPE_CHECKING:
    from cdcd.avro.encoder import EnvelopeEncoder
    from cdcd.rowstage.stage import Encoded


@dataclass(eq=False, slots=True)
class EncodedRun:
    """Consecutive changes of one table version, encoded as they arrived (``EventShaper.early``) instead of kept
    decoded: ``rows`` (the compiled row stage's ``Encoded``) holds each one's key, before and after, and its pgoutput
    message; what depends on the transaction is spliced in at commit. ``encoder``: the ``EnvelopeEncoder`` that
    encoded them; ``encoding``: the stream's text encoding (``wire_encoding``), to decode the messages again."""

    relation: Relation
    encoder: EnvelopeEncoder
    rows: Encoded
    encoding: str

    @property
    def count(self) -> int:
        return len(self.rows)

    @property
    def nbytes(self) -> int:
        return self.rows.nbytes

    def first_lsn(self) -> int:
        """The LSN of the run's first change (a run holds one at least)."""
        lsn = self.rows.first_lsn()
        assert lsn is not None, "a run holds one change at least"
        return lsn

    def changes(self) -> list[RowChange]:
        """The changes decoded again, as the decoder made them on arrival (for a stage that needs values)."""
        decoder = Decoder(self.encoding, stage=self.encoder.stage)
        decoder.relations[self.relation.relation_id] = self.relation
        out: list[RowChange] = []
        for payload, wal_lsn, in_stream in self.rows.messages():
            decoder.in_stream = in_stream
            change = decoder.decode(payload, wal_lsn)
            assert isinstance(change, RowChange)
            out.append(change)
        return out


Buffered = Change | EncodedRun  # what a transaction's buffer holds


def decoded(changes: Iterable[Buffered]) -> Iterator[Change]:
    """``changes`` with every encoded run decoded again, for a stage that needs the values."""
    for change in changes:
        if isinstance(change, EncodedRun):
            yield from change.changes()
        else:
            yield change


class Changes(Protocol):
    """A transaction's buffered changes (``cdcd.assembly.ChangeBuffer``): iterated once, then closed."""

    @property
    def count(self) -> int: ...
    def __iter__(self) -> Iterator[Buffered]: ...
    def close(self) -> None: ...


@dataclass(eq=False)
class Transaction:
    """A committed transaction. Iterate ``changes()`` once; it releases the buffer when done."""

    xid: int
    commit_lsn: int
    end_lsn: int
    commit_time: int  # PostgreSQL µs since 2000-01-01
    streamed: bool
    buffer: Changes = field(repr=False)
    origin: str | None = None
    gid: str | None = None

    @property
    def change_count(self) -> int:
        return self.buffer.count

    def changes(self) -> Iterator[Buffered]:
        try:
            yield from self.buffer
        finally:
            self.buffer.close()

    def release(self) -> None:
        self.buffer.close()


def observed(changes: Iterator[Buffered], observe: Callable[[Change], None]) -> Iterator[Buffered]:
    """``changes``, each shown to ``observe`` as it passes (the snapshot window watching the stream); an
    encoded run's changes decoded again for it."""
    for change in changes:
        if isinstance(change, EncodedRun):
            for each in change.changes():
                observe(each)
        else:
            observe(change)
        yield change


@dataclass(frozen=True)
class SnapshotBatch:
    """Rows of one table to write as ``r`` events at stream position ``lsn``.

    ``lsn``: the slot's consistent point (initial snapshot) or the chunk's high watermark (incremental), so
    that ordering events by (commit LSN, LSN) puts snapshot rows after everything they already contain.
    ``first``/``last``: the first or last row of the whole initial snapshot gets ``source.snapshot`` first/last.
    ``done``: called once every row is acknowledged. ``encoded``: the rows made into records already (a parallel
    initial snapshot's readers), ``rows`` then empty.
    """

    relation: Relation
    rows: Sequence[Row]
    lsn: int
    ts_us: int
    marker: Literal["true", "incremental"]
    first: bool = False
    last: bool = False
    done: Callable[[], None] | None = None
    encoded: SnapshotRecords | None = None

    def row_marker(self, index: int) -> str:
        """``source.snapshot`` of row ``index``: first or last at the ends of the whole initial snapshot."""
        if index == 0 and self.first:
            return "first"
        if self.last and index == len(self.rows) - 1:
            return "last"
        return self.marker


Plain = tuple[str, bytes | None, bytes | None]  # a Kafka record without headers: topic, key, value


@dataclass(frozen=True, slots=True)
class SnapshotRecords:
    """Initial-snapshot rows of one table made into their Kafka records where they were read (a parallel initial
    snapshot's reader threads: ``cdcd.shaping.SnapshotEncoder``), one a row, in order, all marked ``true``; the
    first and last rows kept as values, for the ends of the whole snapshot, whose records ``mark(row, marker)``
    makes again with their own mark (``EventShaper.snapshot_records``); ``ts_us``: the time the records carry."""

    records: list[Plain]
    first: Row
    last: Row
    ts_us: int
    mark: Callable[[Row, str], Plain]

    def __len__(self) -> int:
        return len(self.records)


@dataclass(frozen=True, slots=True)
class Shaped:
    """Whole transactions made into Kafka records (topic, key, value) in one go; confirmable at ``end_lsn`` once
    every record is acknowledged. ``commit_lsn``: the last transaction's; ``commit_times``: each one's
    (PostgreSQL µs), in commit order."""

    records: list[Plain]
    commit_lsn: int
    end_lsn: int
    commit_times: list[int]

    @property
    def transactions(self) -> int:
        return len(self.commit_times)

    def unix_commit_times(self) -> list[float]:
        """The commit times in unix seconds, as ``Ledger`` takes them."""
        return [pg_to_unix_us(t) / 1e6 for t in self.commit_times]


@dataclass(frozen=True)
class Notification:
    """One of Debezium's snapshot notifications (``cdcd.snapshot.notifications`` makes them, the sink writes
    them to ``notifications.kafka.topic``)."""

    id: str
    aggregate_type: str  # Incremental Snapshot | Initial Snapshot
    type: str  # STARTED, IN_PROGRESS, TABLE_SCAN_COMPLETED, COMPLETED, ABORTED, PAUSED, RESUMED
    additional_data: dict[str, str]
    timestamp: int  # unix milliseconds
