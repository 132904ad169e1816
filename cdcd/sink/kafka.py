"""The Kafka sink: the records of ``cdcd.shaping`` delivered to Kafka, schemas in a Confluent registry.

It is three parts the pipeline's wiring (``cli.py``) puts together: the transport (``sink/transport.py``:
producers, acknowledgements to ``Ledger``), the shaper's registry (``sink/registry.py``: schema ids, topics)
and a delivery strategy (``kafka.delivery``): at least once (``sink/delivery.py``) or exactly once
(``sink/transactional.py``). The sink hands each unit of work (a transaction, a message, a snapshot batch, a
heartbeat, what the lane shaped) to the shaper with emitters from its strategy. What the records are (topics,
keys, envelopes, tombstones, key changes, transaction metadata) is ``cdcd.shaping``'s business; the Kafka
checks of ``cdcd check`` are in ``sink/checks.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import partial

from cdcd.batches import Buffered, Notification, Shaped, SnapshotBatch, Transaction
from cdcd.config import KafkaSettings
from cdcd.heartbeat import Heartbeat
from cdcd.ledger import Ledger
from cdcd.lsn import pg_to_unix_us
from cdcd.pgoutput.messages import LogicalMessage, Relation
from cdcd.shaping import EventShaper, SnapshotEncoder
from cdcd.sink import Committed, SessionContext
from cdcd.sink.delivery import Delivery
from cdcd.sink.registry import KafkaRegistry
from cdcd.sink.transport import KafkaTransport


class KafkaSink:
    """``Sink`` (and ``ShapingSink``) for Kafka: the shaper and the transport it is given, the strategy it holds."""

    def __init__(
        self,
        kafka: KafkaSettings,
        shaper: EventShaper,
        transport: KafkaTransport,
        topics: KafkaRegistry,
        delivery: Delivery,
    ) -> None:
        self.settings = kafka
        self.shaper = shaper
        self.transport, self.topics, self.delivery = transport, topics, delivery
        self.transactional = delivery.transactional

    @property
    def events(self) -> Mapping[tuple[str, str], int]:
        return self.shaper.events  # (table, op) -> events produced

    @property
    def delivery_errors(self) -> int:
        return self.transport.delivery_errors

    @property
    def produced(self) -> int:
        return self.transport.produced

    def in_flight(self) -> int:
        return self.transport.in_flight()

    def ready(self) -> bool:
        return self.transport.ready()

    def wake_in(self) -> float:
        return self.delivery.wake_in()

    # -- a session ------------------------------------------------------------------------------

    def committed(
        self, slot: str, system_id: str, slot_created: bool, keep_alive: Callable[[], None]
    ) -> Committed | None:
        self.transport.keep_alive = keep_alive  # a stop request ends a wait for Kafka
        return self.delivery.committed(slot, system_id, slot_created)

    def start_session(self, session: SessionContext) -> None:
        self.topics.registry  # noqa: B018 - its client made now, as streaming starts (see KafkaRegistry.registry)
        self.shaper.start_session(session.database, session.types, session.plans, session.encoding)
        self.transport.keep_alive = session.keep_alive
        self.delivery.start_session(session)

    def end_session(self, ledger: Ledger) -> None:
        self.delivery.end_session(ledger)

    def already_written(self) -> int:
        """Transactions committed at or below this LSN are in Kafka already (exactly-once); 0: none known."""
        return self.delivery.already_written()

    # -- writing --------------------------------------------------------------------------------

    def write_transaction(self, txn: Transaction, changes: Iterable[Buffered], progress: Ledger) -> None:
        commit_time = pg_to_unix_us(txn.commit_time) / 1e6
        if txn.commit_lsn <= self.delivery.already_written():
            for _ in changes:  # in Kafka already; shown to a snapshot window as any transaction written
                pass
            progress.seal(progress.open(txn.end_lsn, commit_time))
            return
        entry = progress.open(txn.end_lsn, commit_time)
        self.delivery.write(progress, entry, partial(self.shaper.transaction, txn, changes), txn.commit_lsn, txn)

    def write_shaped(self, shaped: Shaped, progress: Ledger) -> None:
        entry = progress.open(shaped.end_lsn, commit_times=shaped.unix_commit_times())
        records = shaped.records
        self.delivery.write(progress, entry, lambda _, emit_many: emit_many(records), shaped.commit_lsn, None)

    def write_message(self, message: LogicalMessage, progress: Ledger) -> None:
        if message.lsn <= self.delivery.already_written():
            progress.seal(progress.open(message.lsn))
            return
        entry = progress.open(message.lsn)
        self.delivery.write(progress, entry, lambda emit, _: self.shaper.message(message, emit), message.lsn, None)

    def write_snapshot(self, batch: SnapshotBatch, progress: Ledger) -> None:
        """An initial snapshot's batch is written in bulk (``Delivery.write_bulk``: no acknowledgement per record;
        nothing of it is confirmed before all of it is in Kafka), its records made where it was read when it comes
        ``encoded``."""
        entry = progress.open(batch.lsn, None, batch.done)
        shaper = self.shaper
        if batch.encoded is None and batch.marker != "true":
            self.delivery.write(progress, entry, lambda emit, _: shaper.snapshot(batch, emit), None, None)
            return
        # bulk records may overtake each other: the batches holding the snapshot's first and last records are
        # written alone, so that source.snapshot "first" and "last" are the first and last in their partitions
        if batch.last:
            self.delivery.flush()
        if batch.encoded is not None:
            self.delivery.write_bulk(progress, entry, lambda _, emit_many: shaper.snapshot_records(batch, emit_many))
        else:
            self.delivery.write_bulk(progress, entry, lambda emit, _: shaper.snapshot(batch, emit))
        if batch.first:
            self.delivery.flush()

    def snapshot_encoder(self, relation: Relation, lsn: int) -> SnapshotEncoder:
        """What makes a parallel initial snapshot's rows of ``relation`` into records where they are read."""
        return self.shaper.snapshot_encoder(relation, lsn)

    def write_heartbeat(self, beat: Heartbeat, progress: Ledger) -> None:
        """A heartbeat record, as an entry at the position confirmable already: it confirms nothing new."""
        entry = progress.open(progress.flushed_lsn)
        topic = self.settings.heartbeat_topic
        self.delivery.write(progress, entry, lambda emit, _: self.shaper.heartbeat(topic, beat, emit), None, None)

    def write_notification(self, topic: str, notification: Notification, progress: Ledger) -> None:
        """A snapshot notification, as a heartbeat: an entry that confirms nothing new (with exactly-once, in a Kafka
        transaction like everything else: committed with the snapshot state it tells of)."""
        entry = progress.open(progress.flushed_lsn)
        shape = self.shaper.notification
        self.delivery.write(progress, entry, lambda emit, _: shape(topic, notification, emit), None, None)

    def poll(self) -> None:
        self.transport.poll()
        self.delivery.poll()

    def flush(self, timeout: float) -> bool:
        self.delivery.flush()
        return self.transport.flush(timeout)

    def close(self) -> None:
        self.transport.close()
        self.topics.close()
