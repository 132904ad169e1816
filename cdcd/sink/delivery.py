"""How the Kafka sink delivers: the strategy it holds (``kafka.delivery``), at-least-once here, exactly-once in
``sink/transactional.py``, both on a ``KafkaTransport`` and with the same small interface (``Delivery``).

At least once: each entry is finished once Kafka acknowledged every record of it (delivery callbacks to
``Ledger``); after a restart, what was written beyond the slot's confirmed position may be written again. A
transaction of ``kafka.whole_transaction_changes`` or more is produced whole, by a second producer that reports
failures only (``KafkaTransport.produce_whole``).
"""

from __future__ import annotations

import time
from typing import Protocol

import structlog

from cdcd.batches import Transaction
from cdcd.config import KafkaSettings
from cdcd.ledger import Entry, Ledger
from cdcd.sink import Committed, SessionContext
from cdcd.sink.transport import KafkaTransport, Shape

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

    def wake_in(self) -> float:
        return self.transport.wake_in()

    def poll(self) -> None:
        """Acknowledgements are the transport's: nothing to commit."""

    def flush(self) -> None:
        """Nothing held beyond the producer's queue."""

    def end_session(self, ledger: Ledger) -> None:
        """Nothing held beyond the ledger's entries: it drops the unsealed ones itself."""
