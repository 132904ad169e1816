"""The replication core: walsender frames in, what to do out. Pure (in the style of h11): no socket, no Kafka.

``frame`` takes one CopyData frame of a replication session (XLogData or primary keepalive) and returns at most
one event for the I/O loop to act on:

* ``Write``: hand a committed transaction to the sink, with the changes to write (iterated once);
* ``Shaped``: whole transactions the compiled lane made into records (``cdcd.replication.lane``, which reads
  the core through ``between_transactions``, ``relations``, ``growing`` and reports through ``written``,
  ``encoded``);
* ``Publish``: hand a non-transactional logical decoding message to the sink;
* ``Watermark`` / ``SnapshotRequest``: cdcd's own control messages, for the snapshotter;
* ``StatusRequested``: the server asked for a status update now.

Row filters and the filter of the user's logical decoding messages (``cdcd.filters.messages``) apply as changes
and messages arrive; transactions are assembled in bounded memory. While an incremental snapshot chunk is open,
every change written (of the transactions it ``watches``) is shown to its window (``watcher``) on its way to the
sink. ``position`` is how far this session's stream has come: the highest WAL position a frame reported (a
keepalive's end of WAL, an XLogData's record), for read-only snapshot windows.
``status_due`` and ``status_update`` say when to report and what: the flush LSN is ``Ledger.flushed_lsn``,
never past what the sink finished (acknowledged), whatever the server sent.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from cdcd.assembly import Assembler
from cdcd.assembly.assembler import Growing
from cdcd.batches import Buffered, Shaped, Transaction, observed
from cdcd.filters import RowFilter
from cdcd.filters.messages import MessageFilter
from cdcd.ledger import Ledger
from cdcd.pgoutput import DecodeError, Decoder
from cdcd.pgoutput.messages import Change, LogicalMessage, Message, Relation, RowChange, StreamAbort
from cdcd.snapshot.control import REQUEST_PREFIX, WATERMARK_PREFIX
from cdcd.source.protocol import (
    XLOGDATA_PAYLOAD_OFFSET,
    parse_keepalive,
    parse_xlogdata_header,
    standby_status_update,
)

_W, _K = ord("w"), ord("k")
_CONTROL = (WATERMARK_PREFIX, REQUEST_PREFIX)  # cdcd's own logical decoding messages, never published
CAUGHT_UP_STATUS_S = 0.05  # the least time between two status updates sent because the sink caught up


@dataclass(frozen=True, slots=True)
class Write:
    transaction: Transaction
    changes: Iterator[Buffered]


@dataclass(frozen=True, slots=True)
class Publish:
    message: LogicalMessage


@dataclass(frozen=True, slots=True)
class Watermark:
    message: LogicalMessage


@dataclass(frozen=True, slots=True)
class SnapshotRequest:
    message: LogicalMessage


@dataclass(frozen=True, slots=True)
class StatusRequested:
    pass


STATUS_REQUESTED = StatusRequested()
Event = Write | Shaped | Publish | Watermark | SnapshotRequest | StatusRequested


class ChangeWatcher(Protocol):
    """Sees the changes written while it is ``watching`` (an incremental snapshot's chunk window): those of each
    committed transaction it ``watches``."""

    @property
    def watching(self) -> bool: ...
    def watches(self, xid: int) -> bool: ...
    def observe(self, change: Change) -> None: ...


@dataclass
class Stats:
    transactions: int = 0
    changes: int = 0
    laned: int = 0  # of the transactions, those the compiled lane took (replication/lane.py)
    reconnects: int = 0
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (plain|streamed, commit|abort)


class Silence(Enum):
    """What ``ReplicationCore.silence`` calls for."""

    PING = "ask the server for a keepalive"
    LOST = "the connection is dead"


class ReplicationCore:
    """One replication session's protocol state. ``ledger`` and ``stats`` outlive it (the loop keeps them)."""

    def __init__(
        self,
        decoder: Decoder,
        assembler: Assembler,
        ledger: Ledger,
        *,
        rowfilter: RowFilter | None = None,
        messages: MessageFilter | None = None,
        status_interval_s: float = 10.0,
        receive_timeout_s: float = 0.0,
        stats: Stats | None = None,
        recent_xids: deque[int] | None = None,
    ) -> None:
        self.decoder = decoder
        self.assembler = assembler
        self.ledger = ledger
        self.rowfilter = rowfilter
        self.messages = MessageFilter() if messages is None else messages  # the user's messages published
        self.status_interval_s = status_interval_s
        self.receive_timeout_s = receive_timeout_s  # 0: never give up on a silent server
        self._heard_at = 0.0  # when the server was last heard from (monotonic seconds)
        self._pinged_at: float | None = None  # when it was asked for a keepalive during the current silence
        self.stats = stats or Stats()
        self.watcher: ChangeWatcher | None = None
        self.position = 0  # the highest WAL position this session's frames reported
        # transactions just written, for the snapshot chunks' visibility check
        self.recent_xids: deque[int] = deque(maxlen=4096) if recent_xids is None else recent_xids
        self.next_status = 0.0  # when a status update is due (monotonic seconds)
        self._flush_sent, self._sent_at = 0, -CAUGHT_UP_STATUS_S  # the last update's flush position and time

    def frame(self, frame: bytes) -> Event | None:
        kind = frame[0]
        if kind == _W:
            data_start, wal_end = parse_xlogdata_header(frame)
            position = max(data_start, wal_end)
            self.ledger.received(position)
            self.position = max(self.position, position)
            return self._payload(frame[XLOGDATA_PAYLOAD_OFFSET:], data_start)
        if kind == _K:
            keepalive = parse_keepalive(frame)
            self.ledger.idle(keepalive.wal_end, self.assembler.in_transaction)
            self.position = max(self.position, keepalive.wal_end)
            return STATUS_REQUESTED if keepalive.reply_requested else None
        raise DecodeError("CopyData", 0, f"unknown replication frame type {chr(kind)!r}")

    def status_due(self, now: float) -> bool:
        """Every ``status_interval_s``; and as soon as the sink has finished everything it was handed, if that moved
        the flush position (caught up: the server may free the WAL now, and the slot shows no lag), as
        PostgreSQL's own subscriber reports a moved position at once; then at most every ``CAUGHT_UP_STATUS_S``."""
        if now >= self.next_status:
            return True
        ledger = self.ledger
        return (
            ledger.flushed_lsn > self._flush_sent
            and not ledger.pending
            and not self.assembler.in_transaction
            and now >= self._sent_at + CAUGHT_UP_STATUS_S
        )

    def status_update(self, now: float, now_pg_us: int, reply: bool = False) -> bytes:
        """The standby status update to send now: received up to ``received_lsn``, flushed (confirmed) up to what
        the sink finished; ``reply`` asks the server to answer at once."""
        self.next_status = now + self.status_interval_s
        ledger = self.ledger
        self._flush_sent, self._sent_at = ledger.flushed_lsn, now
        return standby_status_update(ledger.received_lsn, ledger.flushed_lsn, ledger.flushed_lsn, now_pg_us, reply)

    def heard(self, now: float) -> None:
        """Something arrived from the server (data or a keepalive): it is there."""
        self._heard_at, self._pinged_at = now, None

    def silence(self, now: float) -> Silence | None:
        """What a silent server calls for, as PostgreSQL's walreceiver does: at half of ``receive_timeout_s``
        without a message, ``Silence.PING`` (ask it for a keepalive: ``ping``); once the whole timeout passed, and half
        of it since that request, ``LOST`` (the connection is dead: a partition, a server host gone)."""
        timeout = self.receive_timeout_s
        if not timeout:
            return None
        if self._pinged_at is None:
            return Silence.PING if now - self._heard_at >= timeout / 2 else None
        if now - self._heard_at >= timeout and now - self._pinged_at >= timeout / 2:
            return Silence.LOST
        return None

    def ping(self, now: float, now_pg_us: int) -> bytes:
        """A status update that asks the server to answer at once."""
        self._pinged_at = now
        return self.status_update(now, now_pg_us, reply=True)

    def quiet_for(self, now: float) -> float:
        return now - self._heard_at

    def reset(self) -> None:
        """The session ended: unfinished transactions are dropped (the server sends them again)."""
        self.assembler.reset()

    def _payload(self, payload: bytes, wal_lsn: int) -> Event | None:
        assembler = self.assembler
        try:
            message: Message | None = self.decoder.decode(payload, wal_lsn)
            if message.__class__ is RowChange:
                if self.rowfilter is not None:
                    message = self.rowfilter.apply(message)
                if message is not None:
                    assembler.feed(message, payload)  # a row change never finishes anything
                return None
            assert message is not None
            if message.__class__ is LogicalMessage and not self._keep(message):
                return None
            aborted = assembler.aborted_transactions
            done = assembler.feed(message)
        except DecodeError as exc:
            exc.wal_lsn = wal_lsn
            raise
        if assembler.aborted_transactions != aborted:  # a streamed abort, or a rolled-back prepared transaction
            self.stats.outcomes["streamed" if message.__class__ is StreamAbort else "plain", "abort"] += 1
        if done is None:
            return None
        if isinstance(done, Transaction):
            return self._write(done)
        if done.prefix == WATERMARK_PREFIX:
            return Watermark(done)
        if done.prefix == REQUEST_PREFIX:
            return SnapshotRequest(done)
        return Publish(done)

    def _write(self, txn: Transaction) -> Write:
        stats = self.stats
        stats.outcomes["streamed" if txn.streamed else "plain", "commit"] += 1
        stats.transactions += 1
        stats.changes += txn.change_count
        self.recent_xids.append(txn.xid)
        watcher = self.watcher
        if watcher is not None and watcher.watching and watcher.watches(txn.xid):
            return Write(txn, observed(txn.changes(), watcher.observe))
        return Write(txn, txn.changes())

    # -- what the lane (cdcd.replication.lane) reads and reports -----------------------------------------------

    @property
    def relations(self) -> Mapping[int, Relation]:
        """The tables of the session as the decoder knows them now, by relation id."""
        return self.decoder.relations

    @property
    def filters_rows(self) -> bool:
        """A row filter applies to this session's changes (its rules for a table are settled at the first one)."""
        return self.rowfilter is not None

    def between_transactions(self) -> bool:
        """No transaction or stream block is open and no snapshot window watches: the lane may start here."""
        watcher = self.watcher
        return not (
            self.assembler.in_transaction or self.decoder.in_stream or (watcher is not None and watcher.watching)
        )

    def growing(self) -> Growing | None:
        """The open transaction's growing encoded run (``Assembler.growing``), when the changes arriving now
        would go to it: its table version is the decoder's, and it grows in this block (a stream's or not)."""
        growing = self.assembler.growing()
        if growing is None or growing.room <= 0:
            return None
        relation = growing.run.relation
        if self.decoder.relations.get(relation.relation_id) is not relation:
            return None
        return None if (growing.xid is None) == self.decoder.in_stream else growing

    def encoded(self, count: int, nbytes: int, received: int) -> None:
        """The lane encoded ``count`` changes (``nbytes``) into the ``growing`` run from frames that reported WAL
        up to ``received``."""
        self.assembler.took(count, nbytes)
        self.ledger.received(received)
        self.position = max(self.position, received)

    def written(self, xids: list[int], changes: int, received: int) -> None:
        """Transactions the lane (``cdcd.replication.lane``) took from the frames, in commit order, with
        ``changes`` changes in all; ``received``: the highest WAL position their frames reported."""
        self.ledger.received(received)
        self.position = max(self.position, received)
        stats = self.stats
        stats.outcomes["plain", "commit"] += len(xids)
        stats.transactions += len(xids)
        stats.laned += len(xids)
        stats.changes += changes
        self.recent_xids.extend(xids)

    def _keep(self, message: LogicalMessage) -> bool:
        """Messages are always requested (snapshot watermarks); the user's go on only as ``messages`` says."""
        if not message.transactional and message.prefix in _CONTROL:
            return True
        return self.messages.keeps(message.prefix)
