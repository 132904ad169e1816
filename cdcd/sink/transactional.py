"""Exactly-once delivery (``kafka.delivery: exactly_once``), the delivery strategy a ``KafkaSink`` holds instead
of ``AtLeastOnceDelivery`` (``sink/delivery.py``): the records in Kafka transactions, each also writing the WAL
position it covers to the progress topic (``sink.progress_topic``).

A Kafka transaction holds whole PostgreSQL transactions (one or more: it is committed once
``commit_interval_ms`` passed since it began or ``max_messages`` were written, at a PostgreSQL transaction's
end), snapshot batches and messages, then the progress record: the data and the position commit atomically.
Nothing in it is confirmed to PostgreSQL (``Ledger``) before the commit succeeded.

At the start of each session ``committed`` fences any earlier writer with the same ``transactional.id``
(aborting its open transaction) and reads the last committed record: stream records at or below its position
are not written again, however far back the slot's confirmed position is. An abortable error aborts the Kafka
transaction and raises ``SinkRewind``: the loop reconnects and starts again from the committed position.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException

from cdcd.batches import Plain, Transaction
from cdcd.config import KafkaSettings
from cdcd.ledger import Entry, Ledger
from cdcd.lsn import format_lsn
from cdcd.shaping import Emit, EmitMany, Headers
from cdcd.sink import Committed, SessionContext, SinkFailure, SinkRewind
from cdcd.sink import progress_topic as records
from cdcd.sink.clients import log_wait
from cdcd.sink.registry import KafkaRegistry
from cdcd.sink.transport import KafkaTransport, Shape

log = structlog.get_logger("cdcd.sink.kafka")

_FENCED = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})
_READ_TIMEOUT_S = 10.0  # per request to Kafka while reading the progress topic; then it is tried again
_READ_RETRY_PAUSE_S = 1.0  # between reads of the progress topic: some errors (no leader yet) come back at once
_ABORT_TIMEOUT_S = 5.0  # an abort at a session's end waits this long for Kafka, then is left for the next session


def _not_started(topic: str, key: bytes | None, value: bytes | None, headers: Headers | None) -> None:
    raise RuntimeError("the exactly-once sink writes only once its session started (Sink.committed)")


def _not_started_many(records: list[Plain]) -> None:
    _not_started("", None, None, None)


class ExactlyOnceDelivery:
    transactional = True

    def __init__(self, kafka: KafkaSettings, transport: KafkaTransport, topics: KafkaRegistry) -> None:
        self.settings = kafka
        self.transport, self.topics = transport, topics
        transport.explain = self._explain
        self.options = kafka.exactly_once
        self.progress_topic = kafka.progress_topic
        self.transactional_id = ""
        self.slot = self.system_id = ""
        self.snapshot_state: Callable[[], dict[str, Any] | None] = lambda: None
        self.snapshot_committed: Callable[[], None] = lambda: None
        self.kafka_transactions = 0  # committed
        self._open_at: float | None = None  # monotonic time the open Kafka transaction began (None: none open)
        self._opened_with = 0  # self.produced when it began
        self._held: list[Entry] = []  # entries written in the open Kafka transaction, in order
        self._progress: Ledger | None = None
        self._abort_pending = False  # an abort at a session's end did not go through: done before anything else
        self._position = -1  # start LSN of the last stream record written
        self._committed = Committed(0, -1, None)
        self._emit: Emit = _not_started
        self._emit_many: EmitMany = _not_started_many

    # -- the session's start ----------------------------------------------------------------------

    def committed(self, slot: str, system_id: str, slot_created: bool) -> Committed | None:
        if not self.transport.started:  # made now: its transactional.id needs the database system id
            self._make_transactional(slot, system_id)
        # What the last session left open is aborted, never committed: it comes from a connection that is gone,
        # perhaps to a server since demoted (the promotion check comes after this); the server sends it again.
        self._abort_open("a new replication session starts")
        if self._abort_pending:
            self._retrying("abort a Kafka transaction", lambda: self.transport.producer.abort_transaction(1.0))
            self._abort_pending = False
        self.slot, self.system_id = slot, system_id
        found = self._read_progress(slot)
        self._committed, self._position = Committed(0, -1, None), -1
        if isinstance(found, records.Missing):
            self._progress_topic_missing(slot_created)
            return None
        if slot_created:
            if found is not None:
                log.info("the slot was created now: the progress topic's older record is not used", slot=slot)
            return None
        if found is None:
            log.warning(
                "no committed position in the progress topic: starting at the slot's confirmed position. What an"
                " earlier at-least-once run sent after it is sent again, once",
                topic=self.progress_topic,
                slot=slot,
            )
            return None
        committed = self._committed = records.decode(found, slot, system_id, self.progress_topic)
        self._position = committed.position
        log.info(
            "resuming after the last committed Kafka transaction",
            flush_lsn=format_lsn(committed.flush_lsn),
            position=format_lsn(max(committed.position, 0)),
            transactional_id=self.transactional_id,
        )
        return committed

    def _read_progress(self, slot: str) -> bytes | records.Missing | None:
        """The progress topic's last record for ``slot``, waiting for Kafka while it does not answer (a rewind or
        reconnection can come while the broker restarts): only a definite error stops."""
        logged_at: float | None = None
        while True:
            try:
                return records.read_last(self.settings.client_config(), self.progress_topic, slot, _READ_TIMEOUT_S)
            except records.ProgressTopicUnreachable as exc:
                self.transport.raise_failure()
                logged_at = log_wait("Kafka", "read the progress topic", str(exc), logged_at)
                self.transport.keep_alive()
                time.sleep(_READ_RETRY_PAUSE_S)  # not a new consumer per millisecond

    def _make_transactional(self, slot: str, system_id: str) -> None:
        self.transactional_id = self.options.transactional_id or f"cdcd-{system_id}-{slot}"
        timeout_ms = self.options.transaction_timeout_s * 1000
        producer = self.transport.start(
            {
                "transactional.id": self.transactional_id,
                "transaction.timeout.ms": timeout_ms,
                "message.timeout.ms": timeout_ms,  # librdkafka: at most the transaction's timeout
            }
        )
        self._retrying("initialize Kafka transactions", lambda: producer.init_transactions(1.0))
        self._emit = self.transport.producing(None, None)  # no delivery reports: the commit fails if one failed
        self._emit_many = self.transport.producing_many(None, None)

    def _progress_topic_missing(self, slot_created: bool) -> None:
        topic = self.progress_topic
        if not slot_created:
            raise records.ProgressTopicError(
                f"progress topic {topic} does not exist, but slot {self.slot} does: what was committed is unknown."
                " If exactly-once delivery is new for this slot, create the topic (compacted, one partition) and"
                " start again; cdcd then starts at the slot's confirmed position"
            )
        if not self.settings.create_topics:
            raise records.ProgressTopicError(
                f"progress topic {topic} does not exist and kafka.create_topics is off: create it (cleanup.policy="
                "compact, one partition)"
            )
        self.topics.create_topic(topic, 1, {"cleanup.policy": "compact", "segment.ms": "3600000"})

    def start_session(self, session: SessionContext) -> None:
        self.snapshot_state = session.snapshot_state
        self.snapshot_committed = session.snapshot_committed

    def already_written(self) -> int:
        return self._committed.position

    # -- writing ----------------------------------------------------------------------------------

    def write(
        self, progress: Ledger, entry: Entry, shape: Shape, position: int | None, txn: Transaction | None
    ) -> None:
        """In the open Kafka transaction (one is begun if none is), finished when it commits."""
        self._hold(entry, progress)
        shape(self._emit, self._emit_many)
        if position is not None:
            self._position = position
        progress.seal(entry)
        self._commit_if_due()

    def write_bulk(self, progress: Ledger, entry: Entry, shape: Shape) -> None:
        """As ``write``: every record is in a Kafka transaction, without delivery reports already."""
        self.write(progress, entry, shape, None, None)

    def _hold(self, entry: Entry, progress: Ledger) -> None:
        """``entry`` is finished when the Kafka transaction it is written in commits; open one if none is."""
        assert not self._abort_pending, "an interrupted Kafka transaction is aborted before anything is written"
        if self._open_at is None:
            self._retrying("begin a Kafka transaction", self.transport.producer.begin_transaction)
            self._open_at, self._opened_with = time.monotonic(), self.transport.produced
            self._join_progress_partition()
        self._progress = progress
        entry.outstanding += 1
        self._held.append(entry)

    def _join_progress_partition(self) -> None:
        """librdkafka adds a partition to the transaction (AddPartitionsToTxn, a round trip to the coordinator)
        before it sends the partition's first record: the progress topic's is added now, beside the data's, not
        inside the commit (a commit took 3.7-5.0 ms p50 instead of 6.7-12.7, benchmarks/README.md). The record
        of the last commit: the commit's own record supersedes it, an abort drops both."""
        key, value = records.encode(self.slot, self.system_id, self._committed)
        self._emit(self.progress_topic, key, value, None)

    # -- committing -------------------------------------------------------------------------------

    def wake_in(self) -> float:
        if self._open_at is None:
            return self.transport.wake_in()
        return max(0.0, self._open_at + self.options.commit_interval_ms / 1000 - time.monotonic())

    def poll(self) -> None:
        if self._open_at is not None and self.wake_in() == 0:
            self._commit()

    def flush(self) -> None:
        if self._open_at is not None:
            self._commit()

    def _commit_if_due(self) -> None:
        assert self._open_at is not None
        if (
            self.transport.produced - self._opened_with >= self.options.max_messages
            or time.monotonic() - self._open_at >= self.options.commit_interval_ms / 1000
        ):
            self._commit()

    def end_session(self, ledger: Ledger) -> None:
        """The session ended: an open Kafka transaction holding an entry that is not whole (its write was
        interrupted) is aborted now, once; if Kafka does not answer, before anything else is written (``committed``).
        One whose entries are all whole stays open for a stop's ``flush`` to commit."""
        if self._open_at is None or all(entry.sealed for entry in self._held):
            return
        held = self._drop_open()
        log.info("aborting the Kafka transaction of an interrupted write", entries=len(held))
        try:
            self.transport.producer.abort_transaction(_ABORT_TIMEOUT_S)
        except KafkaException as exc:
            self._abort_pending = True
            log.warning("cannot abort the Kafka transaction now; it is aborted first thing", error=exc.args[0].str())

    def _abort_open(self, why: str) -> None:
        """Abort the open Kafka transaction (if any): its entries are dropped from the ledger, never finished."""
        if self._open_at is None:
            return
        held = self._drop_open()
        log.info("aborting the open Kafka transaction", reason=why, entries=len(held))
        self._retrying("abort a Kafka transaction", lambda: self.transport.producer.abort_transaction(1.0))

    def _drop_open(self) -> list[Entry]:
        """Forget the open Kafka transaction: its entries leave the ledger and what it wrote is not written."""
        held, ledger = self._held, self._progress
        self._forget_open()
        self._position = self._committed.position
        if ledger is not None:
            ledger.drop(held)
        return held

    def _commit(self) -> None:
        """Write the progress record and commit; then, only then, the held entries are finished. Never a Kafka
        transaction holding part of a PostgreSQL transaction or snapshot batch: that one is aborted."""
        held, progress = self._held, self._progress
        assert progress is not None
        if not all(entry.sealed for entry in held):
            self._abort_open("it holds a write that was interrupted")
            return
        for entry in held:  # snapshot progress first (in memory): the record carries the state after these rows
            done, entry.done = entry.done, None
            if done is not None:
                done()
        flush = max([self._committed.flush_lsn, *(entry.end_lsn for entry in held)])
        committed = Committed(flush, self._position, self.snapshot_state())
        key, value = records.encode(self.slot, self.system_id, committed)
        self._emit(self.progress_topic, key, value, None)
        self._retrying("commit a Kafka transaction", lambda: self.transport.producer.commit_transaction(1.0))
        self._committed = committed
        self.kafka_transactions += 1
        self._forget_open()
        if committed.snapshot is not None:
            self.snapshot_committed()
        for entry in held:
            progress.ack(entry)

    def _forget_open(self) -> None:
        self._open_at, self._held = None, []

    def _retrying(self, what: str, call: Callable[[], None]) -> None:
        """``call`` until it succeeds: retriable errors (Kafka away, a timeout) are retried with status updates
        going on (logged every ``WAITING_LOG_S``); an abortable one aborts the transaction and rewinds; a fatal
        one (fenced) stops."""
        logged_at = None
        while True:
            try:
                call()
                return
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
            self.transport.raise_failure()
            if error.fatal() or error.code() in _FENCED:
                raise SinkFailure(self._fatal(what, error))
            if error.txn_requires_abort():
                self._abort(what, error)
            if not error.retriable():
                raise SinkFailure(f"cannot {what}: {error.str()}")
            # e.g. a broker without a transaction coordinator (transaction.state.log.* above the brokers)
            logged_at = log_wait("Kafka", what, error.str(), logged_at)
            self.transport.keep_alive()

    def _fatal(self, what: str, error: KafkaError) -> str:
        if error.code() in _FENCED:
            return (
                f"another producer with transactional.id {self.transactional_id} took over (fenced): is a second"
                " cdcd running for this slot? This one stops; nothing it had not committed was confirmed"
            )
        return f"cannot {what}: {error.str()} (fatal)"

    def _abort(self, what: str, error: KafkaError) -> None:
        log.warning("Kafka transaction failed; aborting it and starting again from the last commit", error=error.str())
        self._drop_open()
        self._retrying("abort a Kafka transaction", lambda: self.transport.producer.abort_transaction(1.0))
        raise SinkRewind(f"cannot {what}: {error.str()}")

    def _explain(self, error: KafkaError) -> str | None:
        """A client error that fenced this producer, named (``KafkaTransport.client_error``). A fatal one only: a
        non-fatal one comes back from the transaction calls, as abortable, and rewinds."""
        return self._fatal("write", error) if error.fatal() and error.code() in _FENCED else None
