"""How the Kafka sink delivers: the strategy it holds (``kafka.delivery``), at-least-once here, exactly-once in
``sink/transactional.py``, both on a ``KafkaTransport`` and with the same small interface (``Delivery``).

At least once: each entry is finished once Kafka acknowledged every record of it (delivery callbacks to
``Ledger``); after a restart, what was written beyond the slot's confirmed position may be written again. A
transaction of ``kafka.whole_transaction_changes`` or more is produced whole, by a second producer that reports
failures only (``KafkaTransport.produce_whole``). An initial snapshot's batches are written in bulk (``write_bulk``)
by two such producers in turn, not waited for: a batch is finished once its producer has nothing left, which the
other producer's turn gives it time for (nothing of an initial snapshot is confirmed before all of it is in
Kafka, and a key range's progress is saved only for what Kafka has).
"""

from __future__ import annotations

import time
from typing import Protocol

import structlog

from cdcd.batches import Transaction
from cdcd.config import KafkaSettings
from cdcd.ledger import Entry, Ledger
from cdcd.sink import Committed, SessionContext
from cdcd.sink.transport import ACK_POLL_S, KafkaTransport, Shape

log = structlog.get_logger("cdcd.sink.kafka")


class Delivery(Protocol):
    """When what the sink writes counts as delivered, and what is done at a session's start and end."""

    transactional: bool  # writes commit atomically with their position: exactly-once

    def committed(self, slot: str, system_id: str, slot_created: bool) -> Committed | None:
        """What the last committed write covered (``Sink.committed``); None: nothing, or not exactly-once."""

    def already_written(self) -> int:
        """Records at or below this LSN are in Kafka already; 0: none known."""

    def start_session(self, session: SessionContext) -> None: ...

    def write(
        self, progress: Ledger, entry: Entry, shape: Shape, position: int | None, txn: Transaction | None
    ) -> None:
        """Produce what ``shape`` emits as ``entry``'s records and seal it. ``position``: the start LSN of the
        stream record written (None: a snapshot batch, a heartbeat); ``txn``: the transaction, when it is one."""

    def write_bulk(self, progress: Ledger, entry: Entry, shape: Shape) -> None:
        """As ``write``, for records whose acknowledgement may wait (an initial snapshot's batch): ``entry`` may be
        finished later than each record's acknowledgement, never before."""

    def wake_in(self) -> float:
        """Seconds until ``poll`` is wanted again (``Sink.wake_in``)."""

    def poll(self) -> None:
        """After the transport's poll: commit what is due."""

    def flush(self) -> None:
        """Before the transport's flush: commit what is held."""

    def end_session(self, ledger: Ledger) -> None:
        """Give up what is held and not whole (``Sink.end_session``)."""


class AtLeastOnceDelivery:
    transactional = False

    def __init__(self, kafka: KafkaSettings, transport: KafkaTransport) -> None:
        self.transport = transport
        self.whole = kafka.whole_transaction_changes
        # written by write_bulk, by bulk producer: finished once that producer has nothing left
        self._bulk: tuple[list[Entry], list[Entry]] = ([], [])
        self._lane = 0  # the bulk producer written to; the other one empties
        self._progress: Ledger | None = None
        transport.start({})

    def committed(self, slot: str, system_id: str, slot_created: bool) -> Committed | None:
        return None

    def already_written(self) -> int:
        return 0

    def start_session(self, session: SessionContext) -> None:
        """Nothing to learn: no position is committed with the data."""

    def write(
        self, progress: Ledger, entry: Entry, shape: Shape, position: int | None, txn: Transaction | None
    ) -> None:
        transport = self.transport
        if any(self._bulk):  # what the bulk producers hold goes first: no message overtakes another of its partition
            self.flush()
        if txn is not None and self.whole and txn.change_count >= self.whole:
            self._produce_whole(txn, shape)
        else:
            acked = transport.acked(progress, entry)
            shape(transport.producing(acked, entry), transport.producing_many(acked, entry))
        progress.seal(entry)

    def _produce_whole(self, txn: Transaction, shape: Shape) -> None:
        began, produced = time.monotonic(), self.transport.produced
        self.transport.produce_whole(shape)
        log.info(
            "large transaction in Kafka",
            xid=txn.xid,
            changes=txn.change_count,
            messages=self.transport.produced - produced,
            seconds=round(time.monotonic() - began, 2),
        )

    def write_bulk(self, progress: Ledger, entry: Entry, shape: Shape) -> None:
        """By one of the two producers that report failures only, without a Python call per message: ``entry``
        waits (one outstanding unit) until that producer has nothing left, then it is finished with all it was
        given. ``poll`` switches producers once the other one is empty, so entries finish while more are written."""
        self.transport.produce_bulk(shape, self._lane)
        entry.outstanding += 1
        self._bulk[self._lane].append(entry)
        self._progress = progress
        progress.seal(entry)

    def wake_in(self) -> float:
        return ACK_POLL_S if any(self._bulk) else self.transport.wake_in()

    def poll(self) -> None:
        """Finish the other bulk producer's entries once Kafka has all of it, then write to that one, so that the
        entries written meanwhile finish as it empties (other acknowledgements are the transport's)."""
        other = 1 - self._lane
        if self._bulk[other] and self.transport.bulk_drained(other):
            self._finish_bulk(other)
        if not self._bulk[other] and self._bulk[self._lane]:
            self._lane = other

    def flush(self) -> None:
        """Wait for Kafka to have every bulk entry, and finish them."""
        if any(self._bulk):
            self.transport.drain_bulk()
            self._finish_bulk(1 - self._lane)
            self._finish_bulk(self._lane)

    def _finish_bulk(self, lane: int) -> None:
        entries, progress = self._bulk[lane][:], self._progress
        self._bulk[lane].clear()
        for entry in entries:
            assert progress is not None
            progress.ack(entry)

    def end_session(self, ledger: Ledger) -> None:
        """Nothing held beyond the ledger's entries: it drops the unsealed ones itself."""
