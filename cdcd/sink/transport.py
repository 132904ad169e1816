"""Kafka transport: records produced to their topics, and Kafka's acknowledgements reported to ``Ledger``.

Every record is produced asynchronously by an idempotent producer (acks=all); delivery callbacks acknowledge
them to ``Ledger``, so an entry is finished only once Kafka has every message of it. A full local queue blocks
(the daemon stops reading WAL; nothing is dropped). A failed delivery or a client error that retrying will not
fix stops the daemon (``SinkFailure`` from ``poll``, ``flush`` or a wait). Which records, and when an entry
counts as delivered (acknowledged, or committed in a Kafka transaction), is the delivery strategy's business
(``sink/delivery.py``, ``sink/transactional.py``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from cdcd.batches import Plain
from cdcd.config import KafkaSettings
from cdcd.ledger import Entry, Ledger
from cdcd.logging import library_logger
from cdcd.shaping import Emit, EmitMany, Headers
from cdcd.sink import SinkFailure
from cdcd.sink.clients import FATAL_CLIENT_ERRORS

log = structlog.get_logger("cdcd.sink.kafka")

Acked = Callable[[KafkaError | None, Message], None]
Shape = Callable[[Emit, EmitMany], None]  # shapes one unit of work through the emitters it is given

ACK_POLL_S = 0.01  # how often acknowledgements are served while the loop has nothing to read
# produce() is called with positional arguments only: (topic, value, key, partition, on_delivery, _, timestamp,
# headers). Keyword arguments cost confluent-kafka ~0.3 µs per call (benchmarks/produce.py), a fifth of the call.
# The partition -1 is librdkafka's RD_KAFKA_PARTITION_UA (the partitioner chooses), timestamp 0 the default.
_ANY_PARTITION = -1


class KafkaTransport:
    """The producers, what was produced, and the first failure seen. The producer is made by ``start`` (the
    exactly-once delivery makes it with its session: its transactional.id needs the database system id)."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self.settings = kafka
        self.keep_alive: Callable[[], None] = lambda: None
        # the delivery strategy's name for a client error it knows better (None: the transport's own)
        self.explain: Callable[[KafkaError], str | None] = lambda error: None
        self.produced = 0
        self.delivery_errors = 0
        self._producer: Producer | None = None
        self._failure: str | None = None
        self._whole_producer: Producer | None = None  # for whole transactions (produce_whole), made on first use
        self._second_bulk: Producer | None = None  # produce_bulk's other producer (the first: the whole one)
        self._waiting = 0  # messages in the producer at the last poll
        self._moved_at = time.monotonic()  # when the producer's queue last shrank or was empty

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            raise RuntimeError("the Kafka producer is made when the sink's session starts (Sink.committed)")
        return self._producer

    @producer.setter
    def producer(self, producer: Producer) -> None:
        self._producer = producer

    @property
    def started(self) -> bool:
        return self._producer is not None

    def start(self, fixed: dict[str, Any]) -> Producer:
        """Make the producer, with ``fixed`` settings over the usual ones."""
        self._producer = self.make_producer(fixed)
        return self._producer

    def make_producer(self, fixed: dict[str, Any]) -> Producer:
        """An idempotent producer (acks=all) with the user's settings, and ``fixed`` over them."""
        config: dict[str, Any] = {
            "bootstrap.servers": self.settings.bootstrap_servers,
            "logger": library_logger("cdcd.librdkafka"),
            "error_cb": self.client_error,
            "linger.ms": 5,  # the wait is latency (benchmarks/latency.py); under load batches fill before it ends
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
        return 0 if self._producer is None else len(self._producer)

    def wake_in(self) -> float:
        """While messages are in flight, soon: their acknowledgements finish transactions (the flush position, the
        commit-to-acknowledgement latency), and the loop would otherwise wait in its read for up to a second
        before serving them."""
        return ACK_POLL_S if self.in_flight() else math.inf

    def ready(self) -> bool:
        """A producer, no failure, and Kafka acknowledged something within 30 s whenever messages are waiting."""
        producer = self._producer
        if producer is None or self._failure is not None:
            return False
        return len(producer) == 0 or time.monotonic() - self._moved_at < 30

    def poll(self) -> None:
        self.producer.poll(0)
        self._note_progress()
        self.raise_failure()

    def _note_progress(self) -> None:
        """Kafka is acknowledging when the queue shrinks between polls (or is empty): once per poll, not per ack."""
        waiting = len(self.producer)
        if waiting == 0 or waiting < self._waiting:
            self._moved_at = time.monotonic()
        self._waiting = waiting

    def flush(self, timeout: float) -> bool:
        remaining = self.producer.flush(timeout)
        self.raise_failure()
        return remaining == 0

    def close(self) -> None:
        """Destroy the producers now, while the interpreter is whole. They hold callbacks into this transport (a
        cycle the frozen collector leaves to interpreter shutdown), and a librdkafka thread calling back during
        shutdown crashed the process (SIGSEGV after a SASL authentication failure). What was not acknowledged
        by now is dropped: it was never confirmed, so the next run sends it again."""
        producers = [p for p in (self._producer, self._whole_producer, self._second_bulk) if p is not None]
        for producer in producers:  # never the whole producer twice: produce_whole restores the first
            producer.purge()
            try:
                producer.close()  # flushes: after the purge, only the purged messages' reports
            except KafkaException as exc:  # e.g. a fenced transactional producer: nothing left to confirm
                log.warning("Kafka producer closed with an error", error=exc.args[0].str())
        self._producer = self._whole_producer = self._second_bulk = None

    # -- failures -------------------------------------------------------------------------------

    def client_error(self, error: KafkaError) -> None:
        """A failed authentication or TLS handshake is a configuration problem that retrying will not fix: stop
        (nothing unacknowledged is confirmed). Other client errors (broker away...) are retried by librdkafka."""
        if self._failure is None:
            self._failure = self.explain(error)
        if self._failure is None and (error.code() in FATAL_CLIENT_ERRORS or error.fatal()):
            self._failure = f"Kafka client error: {error.str()}"

    def failed(self, topic: str, error: KafkaError) -> None:
        self.delivery_errors += 1
        if self._failure is None:
            self._failure = f"delivery to {topic} failed: {error.str()}"

    def raise_failure(self) -> None:
        if self._failure is not None:
            raise SinkFailure(self._failure)

    # -- producing ------------------------------------------------------------------------------

    def acked(self, progress: Ledger, entry: Entry) -> Acked:
        """The delivery report of a record of ``entry``."""
        failed = self.failed

        def acked(error: KafkaError | None, message: Message) -> None:
            if error is None:
                progress.ack(entry)
            else:
                failed(str(message.topic()), error)

        return acked

    def producing(self, acked: Acked | None, entry: Entry | None) -> Emit:
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

    def producing_many(self, acked: Acked | None, entry: Entry | None) -> EmitMany:
        """As ``producing``'s ``emit`` for each record of a list, inlined: fewer Python calls per record."""

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

    def produce_whole(self, shape: Shape) -> None:
        """What ``shape`` emits, in Kafka when this returns. A delivery report is a Python call per message
        (~0.6 µs: confluent-kafka makes a Message for each, whatever the callback); the second producer reports
        failures only, so its messages are acknowledged together once none is left in it. Every message
        produced before is in Kafka first, and nothing is produced after before these are: no message of a
        partition overtakes another across the two producers."""
        self._drain()
        single, self._producer = self._producer, self._whole()
        try:
            shape(self.producing(None, None), self.producing_many(None, None))
            self._drain()
        finally:
            self._producer = single

    def produce_bulk(self, shape: Shape, lane: int) -> None:
        """What ``shape`` emits, by bulk producer ``lane`` (0 or 1; they report failures only, as the producer of
        whole transactions, which is the first), not waited for: ``bulk_drained`` tells when Kafka has all that a
        producer was given, ``drain_bulk`` waits for both. While one takes messages the other empties, so that
        what it had is known to be in Kafka without a pause. Their messages may overtake each other: only an
        initial snapshot's records, one per key, go there. Every message of the single producer is in Kafka first,
        and the caller drains both before the single producer takes more."""
        self._drain()
        single, self._producer = self._producer, self._bulk_producer(lane)
        try:
            shape(self.producing(None, None), self.producing_many(None, None))
        finally:
            self._producer = single

    def bulk_drained(self, lane: int) -> bool:
        """Whether Kafka has every message bulk producer ``lane`` was given (a failure stops the sink)."""
        producer = self._whole_producer if lane == 0 else self._second_bulk
        if producer is None:
            return True
        producer.poll(0)
        self.raise_failure()
        return len(producer) == 0

    def drain_bulk(self) -> None:
        """Wait until Kafka has every message ``produce_bulk`` produced (a failure stops the sink)."""
        single = self._producer
        try:
            for producer in (self._whole_producer, self._second_bulk):
                if producer is not None:
                    self._producer = producer
                    self._drain()
        finally:
            self._producer = single

    def _bulk_producer(self, lane: int) -> Producer:
        if lane == 0:
            return self._whole()
        if self._second_bulk is None:
            self._second_bulk = self._failures_only()
        return self._second_bulk

    def _whole(self) -> Producer:
        if self._whole_producer is None:
            self._whole_producer = self._failures_only()
        return self._whole_producer

    def _failures_only(self) -> Producer:
        """A producer that reports failed deliveries only (no Python call per acknowledged message)."""
        return self.make_producer({"delivery.report.only.error": True, "on_delivery": self._report})

    def _report(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.failed(str(message.topic()), error)

    def _drain(self) -> None:
        """Wait until Kafka has every message produced (a failure stops the sink)."""
        while len(self.producer):
            self.wait(ACK_POLL_S)
        self.raise_failure()

    def _produce_when_room(
        self, topic: str, key: bytes | None, value: bytes | None, acked: Acked | None, headers: Headers | None
    ) -> None:
        while True:
            # Briefly: a producer that reports failures only (produce_whole) has nothing for poll to serve as the
            # queue empties, so poll waits out its timeout meanwhile.
            self.wait(ACK_POLL_S)
            try:
                self.producer.produce(topic, value, key, _ANY_PARTITION, acked, None, 0, headers)
                return
            except BufferError:
                continue

    def wait(self, seconds: float) -> None:
        """Blocked (a full queue, a registry away): serve acknowledgements meanwhile, stop on a client failure,
        and keep status updates going, or the server drops us (a stop request ends the wait)."""
        self.producer.poll(seconds)
        self._note_progress()
        self.raise_failure()
        self.keep_alive()
