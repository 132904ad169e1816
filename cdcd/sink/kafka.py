"""Kafka transport: the records of ``cdcd.shaping`` produced to their topics, schemas in a Confluent registry.

Every record of a transaction is produced asynchronously by an idempotent producer (acks=all); delivery
callbacks acknowledge them to ``Ledger``, so the flush LSN reaches a transaction's end only once Kafka has
every message of it and of all earlier transactions. A full local queue blocks (the daemon stops reading WAL;
nothing is dropped). A failed delivery stops the daemon with the LSN it reached. What the records are (topics,
keys, envelopes, tombstones, key changes, transaction metadata) is ``cdcd.shaping``'s business.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from cdcd.avro.schema import column_changes
from cdcd.batches import Buffered, Plain, Shaped, SnapshotBatch, Transaction
from cdcd.config import KafkaSettings, SchemaRegistrySettings
from cdcd.heartbeat import Heartbeat
from cdcd.ledger import Entry, Ledger
from cdcd.logging import library_logger
from cdcd.lsn import pg_to_unix_us
from cdcd.pgoutput.messages import LogicalMessage
from cdcd.shaping import Emit, EmitMany, EventShaper, Headers
from cdcd.sink import AtLeastOnce, SessionContext, SinkFailure
from cdcd.sink.clients import FATAL_CLIENT_ERRORS, log_wait

log = structlog.get_logger("cdcd.sink.kafka")

Acked = Callable[[KafkaError | None, Message], None]

ACK_POLL_S = 0.01  # how often acknowledgements are served while the loop has nothing to read
# produce() is called with positional arguments only: (topic, value, key, partition, on_delivery, _, timestamp,
# headers). Keyword arguments cost confluent-kafka ~0.3 µs per call (benchmarks/produce.py), a fifth of the call.
# The partition -1 is librdkafka's RD_KAFKA_PARTITION_UA (the partitioner chooses), timestamp 0 the default.
_ANY_PARTITION = -1
_REGISTRY_RETRY_PAUSE_S = 1.0
# A 409 is asked again this often before it counts as a refusal: two writers registering a new subject at once
# (daemons sharing a topic prefix, the transaction topic) get a 409 "already exists" from Apicurio for the loser;
# the same request then answers with the winner's id. A compatibility refusal answers the same every time.
_CONFLICT_ATTEMPTS = 4
_CONFLICT_PAUSE_S = 0.25


class KafkaSink(AtLeastOnce):
    def __init__(self, kafka: KafkaSettings, registry: SchemaRegistrySettings) -> None:
        self.settings = kafka
        self.producer: Producer
        self._start_producer()
        admin_config: dict[str, Any] = {
            **kafka.client_config(),
            "logger": library_logger("cdcd.librdkafka"),
            "error_cb": self._client_error,
        }
        self.admin = AdminClient(admin_config)
        self.registry = SchemaRegistryClient(registry.client_config())
        self.keep_alive: Callable[[], None] = lambda: None
        self._topics: set[str] = set()
        self._schema_ids: dict[tuple[str, str], int] = {}
        self._failure: str | None = None
        self.produced = 0
        self.shaper = EventShaper(
            kafka.topic_prefix,
            self,
            transaction_topic=kafka.transaction_topic,
            tombstones_on_delete=kafka.tombstones_on_delete,
            debezium=kafka.envelope == "debezium",
        )
        self.events = self.shaper.events  # (table, op) -> events produced
        self.delivery_errors = 0
        self._whole_producer: Producer | None = None  # for whole transactions (_produce_whole), made on first use
        self._waiting = 0  # messages in the producer at the last poll
        self._moved_at = time.monotonic()  # when the producer's queue last shrank or was empty

    def _start_producer(self) -> None:
        self.producer = self._producer({})

    def _producer(self, fixed: dict[str, Any]) -> Producer:
        """An idempotent producer (acks=all) with the user's settings, and ``fixed`` over them."""
        config: dict[str, Any] = {
            "bootstrap.servers": self.settings.bootstrap_servers,
            "logger": library_logger("cdcd.librdkafka"),
            "error_cb": self._client_error,
            "linger.ms": 20,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 100_000,
            "queue.buffering.max.kbytes": 65_536,  # the local queue is bounded: 64 MiB
            "message.timeout.ms": 0,  # while Kafka is away, wait for it rather than fail (0 = no limit)
            **self.settings.producer,
            "enable.idempotence": True,
            "acks": "all",
            **fixed,
        }
        return Producer(config)

    def in_flight(self) -> int:
        return len(self.producer)

    def wake_in(self) -> float:
        """While messages are in flight, soon: their acknowledgements finish transactions (the flush position, the
        commit-to-acknowledgement latency), and the loop would otherwise wait in its read for up to a second
        before serving them."""
        return ACK_POLL_S if self.in_flight() else math.inf

    def ready(self) -> bool:
        """No delivery failed, and Kafka acknowledged something within 30 s whenever messages are waiting."""
        return self._failure is None and (len(self.producer) == 0 or time.monotonic() - self._moved_at < 30)

    # -- the Sink protocol ----------------------------------------------------------------------

    def start_session(self, session: SessionContext) -> None:
        self.shaper.start_session(session.database, session.types, session.plans, session.encoding)
        self.keep_alive = session.keep_alive

    def write_transaction(self, txn: Transaction, changes: Iterable[Buffered], progress: Ledger) -> None:
        entry = progress.open(txn.end_lsn, pg_to_unix_us(txn.commit_time) / 1e6)
        whole = self.settings.whole_transaction_changes
        if whole and txn.change_count >= whole:
            began, produced = time.monotonic(), self.produced
            self._produce_whole(lambda emit, emit_many: self.shaper.transaction(txn, changes, emit, emit_many))
            log.info(
                "large transaction in Kafka",
                xid=txn.xid,
                changes=txn.change_count,
                messages=self.produced - produced,
                seconds=round(time.monotonic() - began, 2),
            )
        else:
            acked = self._acked(progress, entry)
            emit_many = self._producing_many(acked, entry)
            self.shaper.transaction(txn, changes, self._producing(acked, entry), emit_many)
        progress.seal(entry)

    def write_shaped(self, shaped: Shaped, progress: Ledger) -> None:
        entry = progress.open(shaped.end_lsn, commit_times=shaped.unix_commit_times())
        self._producing_many(self._acked(progress, entry), entry)(shaped.records)
        progress.seal(entry)

    def already_written(self) -> int:
        """Transactions committed at or below this LSN are in Kafka already: none known (at-least-once)."""
        return 0

    def write_message(self, message: LogicalMessage, progress: Ledger) -> None:
        entry = progress.open(message.lsn)
        self.shaper.message(message, self._emitter(progress, entry))
        progress.seal(entry)

    def write_snapshot(self, batch: SnapshotBatch, progress: Ledger) -> None:
        entry = progress.open(batch.lsn, None, batch.done)
        self.shaper.snapshot(batch, self._emitter(progress, entry))
        progress.seal(entry)

    def write_heartbeat(self, beat: Heartbeat, progress: Ledger) -> None:
        """A heartbeat record, as an entry at the position confirmable already: it confirms nothing new."""
        entry = progress.open(progress.flushed_lsn)
        self.shaper.heartbeat(self.settings.heartbeat_topic, beat, self._emitter(progress, entry))
        progress.seal(entry)

    def poll(self) -> None:
        self.producer.poll(0)
        self._note_progress()
        self._raise_failure()

    def _note_progress(self) -> None:
        """Kafka is acknowledging when the queue shrinks between polls (or is empty): once per poll, not per ack."""
        waiting = len(self.producer)
        if waiting == 0 or waiting < self._waiting:
            self._moved_at = time.monotonic()
        self._waiting = waiting

    def flush(self, timeout: float) -> bool:
        remaining = self.producer.flush(timeout)
        self._raise_failure()
        return remaining == 0

    def close(self) -> None:
        """Destroy the Kafka clients now, while the interpreter is whole. They hold callbacks into this sink (a
        cycle the frozen collector leaves to interpreter shutdown), and a librdkafka thread calling back during
        shutdown crashed the process (SIGSEGV after a SASL authentication failure). What was not acknowledged
        by now is dropped: it was never confirmed, so the next run sends it again."""
        producers = [self.producer] if hasattr(self, "producer") else []  # exactly-once: made with its session
        if self._whole_producer is not None:  # never self.producer here: _produce_whole restores that
            producers.append(self._whole_producer)
        for producer in producers:
            producer.purge()
            try:
                producer.close()  # flushes: after the purge, only the purged messages' reports
            except KafkaException as exc:  # e.g. a fenced transactional producer: nothing left to confirm
                log.warning("Kafka producer closed with an error", error=exc.args[0].str())
        if hasattr(self, "producer"):
            del self.producer
        self._whole_producer = None
        del self.admin

    # -- producing ------------------------------------------------------------------------------

    def _client_error(self, error: KafkaError) -> None:
        """A failed authentication or TLS handshake is a configuration problem that retrying will not fix: stop
        (nothing unacknowledged is confirmed). Other client errors (broker away...) are retried by librdkafka."""
        if self._failure is None and (error.code() in FATAL_CLIENT_ERRORS or error.fatal()):
            self._failure = f"Kafka client error: {error.str()}"

    def _failed(self, topic: str, error: KafkaError) -> None:
        self.delivery_errors += 1
        if self._failure is None:
            self._failure = f"delivery to {topic} failed: {error.str()}"

    def _emitter(self, progress: Ledger, entry: Entry) -> Emit:
        """Produce each record for ``entry``: it is finished once Kafka acknowledged every one."""
        return self._producing(self._acked(progress, entry), entry)

    def _acked(self, progress: Ledger, entry: Entry) -> Acked:
        """The delivery report of a record of ``entry``."""
        failed = self._failed

        def acked(error: KafkaError | None, message: Message) -> None:
            if error is None:
                progress.ack(entry)
            else:
                failed(str(message.topic()), error)

        return acked

    def _producing(self, acked: Acked | None, entry: Entry | None) -> Emit:
        """Produce each record, with ``acked`` as its delivery report; each counts as outstanding work of
        ``entry`` (None: neither, as in a Kafka transaction, whose commit fails if a message failed)."""
        producer = self.producer
        produce = producer.produce

        def emit(topic: str, key: bytes | None, value: bytes | None, headers: Headers | None) -> None:
            if entry is not None:
                entry.outstanding += 1
            try:
                produce(topic, value, key, _ANY_PARTITION, acked, None, 0, headers)
            except BufferError:  # the local queue is full: wait for Kafka, never drop
                self._produce_when_room(topic, key, value, acked, headers)
            self.produced += 1
            if self.produced % 1000 == 0:
                producer.poll(0)

        return emit

    def _produce_whole(self, shape: Callable[[Emit, EmitMany], None]) -> None:
        """What ``shape`` emits, in Kafka when this returns. A delivery report is a Python call per message
        (~0.6 µs: confluent-kafka makes a Message for each, whatever the callback); the second producer reports
        failures only, so its messages are acknowledged together once none is left in it. Every message
        produced before is in Kafka first, and nothing is produced after before these are: no message of a
        partition overtakes another across the two producers."""
        self._drain()
        if self._whole_producer is None:
            self._whole_producer = self._producer({"delivery.report.only.error": True, "on_delivery": self._report})
        single, self.producer = self.producer, self._whole_producer
        try:
            shape(self._producing(None, None), self._producing_many(None, None))
            self._drain()
        finally:
            self.producer = single

    def _report(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self._failed(str(message.topic()), error)

    def _drain(self) -> None:
        """Wait until Kafka has every message produced (a failure stops the sink)."""
        while len(self.producer):
            self._wait(ACK_POLL_S)
        self._raise_failure()

    def _producing_many(self, acked: Acked | None, entry: Entry | None) -> EmitMany:
        """As ``_producing``'s ``emit`` for each record of a list, inlined: fewer Python calls per record."""

        def emit_many(records: list[Plain]) -> None:
            if entry is not None:
                entry.outstanding += len(records)  # sealed later: acknowledgements meanwhile cannot finish it
            producer = self.producer
            produce = producer.produce
            for topic, key, value in records:
                try:
                    produce(topic, value, key, _ANY_PARTITION, acked)
                except BufferError:  # the local queue is full: wait for Kafka, never drop
                    self._produce_when_room(topic, key, value, acked, None)
            produced = self.produced
            self.produced = produced + len(records)
            if produced // 1000 != self.produced // 1000:
                producer.poll(0)

        return emit_many

    def _produce_when_room(
        self, topic: str, key: bytes | None, value: bytes | None, acked: Acked | None, headers: Headers | None
    ) -> None:
        while True:
            # Briefly: a producer that reports failures only (_produce_whole) has nothing for poll to serve as the
            # queue empties, so poll waits out its timeout meanwhile.
            self._wait(ACK_POLL_S)
            try:
                self.producer.produce(topic, value, key, _ANY_PARTITION, acked, None, 0, headers)
                return
            except BufferError:
                continue

    def _wait(self, seconds: float) -> None:
        """Blocked (a full queue, a registry away): serve acknowledgements meanwhile, stop on a client failure,
        and keep status updates going, or the server drops us (a stop request ends the wait)."""
        self.producer.poll(seconds)
        self._note_progress()
        self._raise_failure()
        self.keep_alive()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise SinkFailure(self._failure)

    # -- the shaper's Registry: schemas and topics ---------------------------------------------------

    def _changes_from_registered(self, subject: str, schema: dict[str, Any]) -> list[str]:
        """What differs from the subject's latest registered schema (best effort: for the error message)."""
        try:
            latest = json.loads(self.registry.get_latest_version(subject).schema.schema_str or "{}")
        except Exception:
            return []
        return column_changes(latest, schema)

    def _register(self, subject: str, schema: dict[str, Any], text: str) -> int:
        """The id the registry gives ``schema`` under ``subject``. A refusal (incompatible, unauthorized, invalid)
        stops cdcd; a registry that is away or failing (no connection, a timeout, HTTP 5xx) is waited for, with
        status updates going on (a stop request ends the wait; nothing after it was confirmed)."""
        logged_at = None
        conflicts = 0
        while True:
            try:
                schema_id: int = self.registry.register_schema(subject, Schema(text, "AVRO"))
                return schema_id
            except SchemaRegistryError as exc:
                conflicts += exc.http_status_code == 409
                if exc.http_status_code == 409 and conflicts < _CONFLICT_ATTEMPTS:
                    self._wait(_CONFLICT_PAUSE_S)
                    continue
                if exc.http_status_code < 500:
                    raise SinkFailure(self._refused(subject, schema, exc)) from None
                error = str(exc)
            except Exception as exc:  # the client raises its HTTP library's errors: connection, timeout
                error = str(exc) or type(exc).__name__
            logged_at = log_wait("the schema registry", f"register {subject}", error, logged_at)
            self._wait(_REGISTRY_RETRY_PAUSE_S)

    def _refused(self, subject: str, schema: dict[str, Any], exc: SchemaRegistryError) -> str:
        refused = f"schema registry refused the new schema for {subject}"
        if exc.http_status_code != 409:  # credentials, an invalid schema: not a question of compatibility
            return f"{refused}: {exc}; nothing after it was confirmed"
        changes = self._changes_from_registered(subject, schema)
        what = f" ({'; '.join(changes)})" if changes else ""
        return (
            f"{refused}{what}: {exc}. The registry's compatibility rule forbids this change: set the subject's"
            " compatibility or make the change compatible, then restart: nothing after it was confirmed"
        )

    def schema_id(self, subject: str, schema: dict[str, Any]) -> int:
        text = json.dumps(schema, sort_keys=True)
        cached = self._schema_ids.get((subject, text))
        if cached is not None:
            return cached
        schema_id = self._register(subject, schema, text)
        self._schema_ids[(subject, text)] = schema_id
        return schema_id

    def ensure_topic(self, topic: str) -> None:
        if topic in self._topics:
            return
        if self.settings.create_topics:
            settings = self.settings
            self.create_topic(topic, settings.partitions, dict(settings.topic_config))
        self._topics.add(topic)

    def create_topic(self, topic: str, partitions: int, config: dict[str, str]) -> None:
        """Create ``topic`` unless it exists."""
        new = NewTopic(
            topic, num_partitions=partitions, replication_factor=self.settings.replication_factor, config=config
        )
        future = self.admin.create_topics([new], operation_timeout=30)[topic]
        deadline = time.monotonic() + 60
        while True:
            try:
                future.result(timeout=0.5)
                log.info("topic created", topic=topic, partitions=partitions)
                break
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise SinkFailure(f"cannot create topic {topic}: {exc.args[0].str()}") from None
                break
            except TimeoutError:  # meanwhile: client errors (authentication, TLS) and status updates
                self.admin.poll(0)
                self.producer.poll(0)
                self._raise_failure()
                self.keep_alive()
                if time.monotonic() > deadline:
                    raise SinkFailure(f"cannot create topic {topic}: Kafka did not answer within 60 s") from None
