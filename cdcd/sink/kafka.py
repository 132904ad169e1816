"""Kafka output: Debezium-compatible Avro envelopes on per-table topics, schemas in a Confluent registry.

Every message of a transaction is produced asynchronously by an idempotent producer (acks=all); delivery
callbacks acknowledge them to ``Progress``, so the flush LSN reaches a transaction's end only once Kafka has
every message of it and of all earlier transactions. A full local queue blocks (the daemon stops reading WAL;
nothing is dropped). A failed delivery stops the daemon with the LSN it reached.

Layout: table changes on ``<prefix>.<schema>.<table>`` keyed by the replica identity, a tombstone after each
delete, a truncate event per table; logical decoding messages on ``<prefix>.message``; BEGIN/END events on
``<prefix>.transaction``. An update that changes the key becomes, as in Debezium, a delete of the old key
(plus tombstone) and a create under the new key, so each key's history stays in one partition; the delete
names the new key in a ``__debezium.newkey`` header, the create the old one in ``__debezium.oldkey``.
"""

from __future__ import annotations

import json
import re
import struct
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from cdcd import __version__
from cdcd.assembly import Transaction
from cdcd.avro import EnvelopeEncoder, SourceInfo, TxInfo, build_schemas
from cdcd.avro.metadata import (
    MESSAGE_KEY,
    TRANSACTION_KEY,
    TRANSACTION_VALUE,
    TransactionEvent,
    encode_message,
    encode_transaction,
    message_value_schema,
)
from cdcd.avro.schema import column_changes
from cdcd.config import KafkaSettings, SchemaRegistrySettings
from cdcd.logging import library_logger
from cdcd.lsn import pg_to_unix_us
from cdcd.pgoutput.messages import LogicalMessage, Relation, Row, RowChange, Truncate, Type
from cdcd.progress import Entry, Progress
from cdcd.sink import OP_CODES, SessionContext, SinkFailure
from cdcd.snapshot import SnapshotBatch

log = structlog.get_logger("cdcd.sink.kafka")

_TOPIC_INVALID = re.compile(r"[^A-Za-z0-9._-]")
_WIRE_HEADER = struct.Struct(">bI")  # Confluent wire format: magic byte 0, schema id
# Debezium's headers on the two events of a key change; the value is the other key, as the message key is sent.
OLD_KEY_HEADER = "__debezium.oldkey"
NEW_KEY_HEADER = "__debezium.newkey"
Headers = list[tuple[str, str | bytes | None]]


def topic_name(prefix: str, schema: str, table: str) -> str:
    """``<prefix>.<schema>.<table>`` with characters Kafka does not allow in topic names replaced by ``_``."""
    return _TOPIC_INVALID.sub("_", f"{prefix}.{schema or 'pg_catalog'}.{table}")


class _Table:
    """What producing for one Relation (one schema version of a table) needs."""

    __slots__ = ("encoder", "key_header", "label", "relation", "topic", "value_header")

    def __init__(self, relation: Relation, encoder: EnvelopeEncoder, topic: str, key_id: int | None, value_id: int):
        self.relation = relation
        self.label = f"{relation.schema}.{relation.name}"  # the metrics' table label
        self.encoder = encoder
        self.topic = topic
        self.key_header = None if key_id is None else _WIRE_HEADER.pack(0, key_id)
        self.value_header = _WIRE_HEADER.pack(0, value_id)


def _key_changed(change: RowChange) -> bool:
    if change.old_is_key:
        return True  # PostgreSQL sends a K tuple only when the key changed
    old, new = change.old, change.new
    assert old is not None
    assert new is not None
    return any(old[i] != new[i] for i, c in enumerate(change.relation.columns) if c.is_key)


def _definition(relation: Relation) -> tuple[object, ...]:
    """What makes two Relation messages the same schema version (not the streamed block's xid)."""
    return relation.schema, relation.name, relation.replica_identity, relation.columns


class _Emit:
    """One transaction's production state: its progress entry, delivery callback and per-topic counts."""

    __slots__ = ("acked", "counts", "entry", "now_us", "progress", "total", "txn_id")

    def __init__(
        self, progress: Progress, entry: Entry, failed: Callable[[str, KafkaError], None], txn_id: str, now_us: int
    ) -> None:
        self.progress, self.entry, self.txn_id, self.now_us = progress, entry, txn_id, now_us
        self.counts: Counter[str] = Counter()
        self.total = 0

        def acked(error: KafkaError | None, message: Message) -> None:
            if error is None:
                progress.ack(entry)
            else:
                failed(str(message.topic()), error)

        self.acked = acked

    def order(self, topic: str) -> TxInfo:
        """Debezium's transaction block for the next event on ``topic``."""
        self.counts[topic] += 1
        self.total += 1
        return TxInfo(self.txn_id, self.total, self.counts[topic])


# librdkafka errors that mean the configuration is wrong (credentials, certificates), not that Kafka is away.
_FATAL_CLIENT_ERRORS = frozenset({KafkaError._AUTHENTICATION, KafkaError._SSL})


class KafkaSink:
    def __init__(self, kafka: KafkaSettings, registry: SchemaRegistrySettings) -> None:
        self.settings = kafka
        self.database = ""
        config: dict[str, Any] = {
            "bootstrap.servers": kafka.bootstrap_servers,
            "logger": library_logger("cdcd.librdkafka"),
            "error_cb": self._client_error,
            "linger.ms": 20,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 100_000,
            "queue.buffering.max.kbytes": 65_536,  # the local queue is bounded: 64 MiB
            "message.timeout.ms": 0,  # while Kafka is away, wait for it rather than fail (0 = no limit)
            **kafka.producer,
            "enable.idempotence": True,
            "acks": "all",
        }
        self.producer = Producer(config)
        admin_config: dict[str, Any] = {
            **kafka.client_config(),
            "logger": config["logger"],
            "error_cb": self._client_error,
        }
        self.admin = AdminClient(admin_config)
        self.registry = SchemaRegistryClient(registry.client_config())
        self.types: Mapping[int, Type] = {}
        self.keep_alive: Callable[[], None] = lambda: None
        self._tables: dict[int, _Table] = {}
        self._topics: set[str] = set()
        self._schema_ids: dict[tuple[str, str], int] = {}
        self._fixed_headers: dict[str, tuple[bytes, bytes]] = {}  # topic -> wire headers of fixed-schema events
        self._failure: str | None = None
        self._last_commit_lsn: int | None = None
        self.produced = 0
        self.events: Counter[tuple[str, str]] = Counter()  # (table, op) -> events produced
        self.delivery_errors = 0
        self._waiting = 0  # messages in the producer at the last poll
        self._moved_at = time.monotonic()  # when the producer's queue last shrank or was empty

    def in_flight(self) -> int:
        return len(self.producer)

    def ready(self) -> bool:
        """No delivery failed, and Kafka acknowledged something within 30 s whenever messages are waiting."""
        return self._failure is None and (len(self.producer) == 0 or time.monotonic() - self._moved_at < 30)

    # -- the Sink protocol ----------------------------------------------------------------------

    def start_session(self, session: SessionContext) -> None:
        self.database = session.database
        self.types = session.types
        self.keep_alive = session.keep_alive

    def write_transaction(self, txn: Transaction, progress: Progress) -> None:
        now_us = time.time_ns() // 1000
        entry = progress.open(txn.end_lsn, pg_to_unix_us(txn.commit_time) / 1e6)
        ctx = _Emit(progress, entry, self._failed, f"{txn.xid}:{txn.commit_lsn}", now_us)
        source = SourceInfo(
            version=__version__,
            db=self.database,
            ts_us=pg_to_unix_us(txn.commit_time),
            tx_id=txn.xid,
            commit_lsn=txn.commit_lsn,
            last_commit_lsn=self._last_commit_lsn,
            origin=txn.origin,
        )
        # Like Debezium, no BEGIN/END for a transaction without events (PostgreSQL 14 sends those; 15+ skips them).
        metadata = self.settings.transaction_topic and txn.change_count > 0
        if metadata:
            self._metadata(TransactionEvent("BEGIN", ctx.txn_id, now_us // 1000), ctx)
        for change in txn.changes():
            if isinstance(change, RowChange):
                self._row(change, source, ctx)
            elif isinstance(change, Truncate):
                for relation in change.relations:
                    table = self._table(relation)
                    order = ctx.order(table.topic)
                    value = table.encoder.encode_value("t", None, None, source, change.wal_lsn, now_us, order)
                    self.events[table.label, "t"] += 1
                    self._produce(table.topic, None, table.value_header + value, ctx)
            else:
                self._message(change, source, ctx)
        if metadata:
            end = TransactionEvent("END", ctx.txn_id, now_us // 1000, ctx.total, tuple(sorted(ctx.counts.items())))
            self._metadata(end, ctx)
        self._last_commit_lsn = txn.commit_lsn
        progress.seal(ctx.entry)

    def write_message(self, message: LogicalMessage, progress: Progress) -> None:
        now_us = time.time_ns() // 1000
        ctx = _Emit(progress, progress.open(message.lsn), self._failed, "", now_us)
        source = SourceInfo(version=__version__, db=self.database, ts_us=now_us)
        self._message(message, source, ctx)
        progress.seal(ctx.entry)

    def write_snapshot(self, batch: SnapshotBatch, progress: Progress) -> None:
        now_us = time.time_ns() // 1000
        ctx = _Emit(progress, progress.open(batch.lsn, None, batch.done), self._failed, "", now_us)
        table = self._table(batch.relation)
        encode, key_header, value_header = table.encoder.encode_value, table.key_header, table.value_header
        encode_key = table.encoder.encode_key
        lsn, topic = batch.lsn, table.topic
        source = SourceInfo(version=__version__, db=self.database, ts_us=batch.ts_us, snapshot=batch.marker,
                            commit_lsn=lsn)  # fmt: skip
        for i, row in enumerate(batch.rows):
            marker = batch.row_marker(i)
            marked = source if marker == batch.marker else replace(source, snapshot=marker)
            key = None if key_header is None else key_header + encode_key(row)
            self._produce(topic, key, value_header + encode("r", None, row, marked, lsn, now_us), ctx)
        self.events[table.label, "r"] += len(batch.rows)
        progress.seal(ctx.entry)

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
        self.producer.purge()
        self.producer.close()  # flushes: after the purge, only the purged messages' reports
        del self.producer, self.admin

    # -- events ---------------------------------------------------------------------------------

    def _row(self, change: RowChange, source: SourceInfo, ctx: _Emit) -> None:
        table = self._table(change.relation)
        old, new, lsn = change.old, change.new, change.wal_lsn
        if change.op == "update" and old is not None and table.key_header is not None and _key_changed(change):
            # The key changed: a delete under the old key and a create under the new one (Debezium's behaviour),
            # each naming the other key in a header: the create lacks unchanged TOAST values, which a consumer
            # carries over from the old key's row.
            assert new is not None
            old_key, new_key = self._key(table, old), self._key(table, new)
            moved_to: Headers = [(NEW_KEY_HEADER, new_key)]
            moved_from: Headers = [(OLD_KEY_HEADER, old_key)]
            self._event(table, "d", old_key, old=old, new=None, source=source, lsn=lsn, ctx=ctx, headers=moved_to)
            self._event(table, "c", new_key, old=None, new=new, source=source, lsn=lsn, ctx=ctx, headers=moved_from)
            return
        key_row = new if new is not None else old
        key = None if table.key_header is None or key_row is None else self._key(table, key_row)
        self._event(table, OP_CODES[change.op], key, old=old, new=new, source=source, lsn=lsn, ctx=ctx)

    @staticmethod
    def _key(table: _Table, row: Row) -> bytes:
        assert table.key_header is not None
        return table.key_header + table.encoder.encode_key(row)

    def _event(
        self,
        table: _Table,
        op: str,
        key: bytes | None,
        *,
        old: Row | None,
        new: Row | None,
        source: SourceInfo,
        lsn: int,
        ctx: _Emit,
        headers: Headers | None = None,
    ) -> None:
        value = table.encoder.encode_value(op, old, new, source, lsn, ctx.now_us, ctx.order(table.topic))
        self._produce(table.topic, key, table.value_header + value, ctx, headers)
        self.events[table.label, op] += 1
        if op == "d" and self.settings.tombstones_on_delete and key is not None:
            self._produce(table.topic, key, None, ctx)

    def _message(self, message: LogicalMessage, source: SourceInfo, ctx: _Emit) -> None:
        topic = f"{self.settings.topic_prefix}.message"
        key, value = encode_message(self.settings.topic_prefix, message, source, ctx.now_us // 1000)
        self.events["", "m"] += 1
        self._produce_fixed(topic, (MESSAGE_KEY, key), (message_value_schema(), value), ctx)

    def _metadata(self, event: TransactionEvent, ctx: _Emit) -> None:
        key, value = encode_transaction(event)
        topic = f"{self.settings.topic_prefix}.transaction"
        self._produce_fixed(topic, (TRANSACTION_KEY, key), (TRANSACTION_VALUE, value), ctx)

    def _produce_fixed(
        self, topic: str, key: tuple[dict[str, Any], bytes], value: tuple[dict[str, Any], bytes], ctx: _Emit
    ) -> None:
        """Produce an event of a fixed schema pair (messages, transaction metadata)."""
        headers = self._fixed_headers.get(topic)
        if headers is None:
            self._ensure_topic(topic)
            key_id = self._schema_id(f"{topic}-key", key[0])
            value_id = self._schema_id(f"{topic}-value", value[0])
            headers = self._fixed_headers[topic] = (_WIRE_HEADER.pack(0, key_id), _WIRE_HEADER.pack(0, value_id))
        self._produce(topic, headers[0] + key[1], headers[1] + value[1], ctx)

    # -- producing ------------------------------------------------------------------------------

    def _client_error(self, error: KafkaError) -> None:
        """A failed authentication or TLS handshake is a configuration problem that retrying will not fix: stop
        (nothing unacknowledged is confirmed). Other client errors (broker away...) are retried by librdkafka."""
        if self._failure is None and (error.code() in _FATAL_CLIENT_ERRORS or error.fatal()):
            self._failure = f"Kafka client error: {error.str()}"

    def _failed(self, topic: str, error: KafkaError) -> None:
        self.delivery_errors += 1
        if self._failure is None:
            self._failure = f"delivery to {topic} failed: {error.str()}"

    def _produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        ctx: _Emit,
        headers: Headers | None = None,
    ) -> None:
        ctx.entry.outstanding += 1  # Progress.add, inlined: once per message
        while True:
            try:
                if headers is None:
                    self.producer.produce(topic, value, key, on_delivery=ctx.acked)
                else:
                    self.producer.produce(topic, value, key, on_delivery=ctx.acked, headers=headers)
                break
            except BufferError:  # the local queue is full: wait for Kafka, never drop
                self.producer.poll(0.1)
                self._note_progress()
                self._raise_failure()
                self.keep_alive()  # status updates go on while blocked, or the server drops us
        self.produced += 1
        if self.produced % 1000 == 0:
            self.producer.poll(0)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise SinkFailure(self._failure)

    # -- tables, topics, schemas ----------------------------------------------------------------

    def _table(self, relation: Relation) -> _Table:
        table = self._tables.get(relation.relation_id)
        if table is not None:
            if table.relation is relation:
                return table
            if _definition(table.relation) == _definition(relation):  # sent again (new session, streamed txn)
                table.relation = relation
                return table
        prefix = self.settings.topic_prefix
        schemas = build_schemas(relation, prefix, dict(self.types))
        topic = topic_name(prefix, relation.schema, relation.name)
        self._ensure_topic(topic)
        # Under REPLICA IDENTITY FULL pgoutput flags every column as key: that is no row identity to key by.
        keyless = schemas.key is None or relation.replica_identity == "f"
        key_id = None if keyless else self._schema_id(f"{topic}-key", schemas.key)  # type: ignore[arg-type]
        value_id = self._schema_id(f"{topic}-value", schemas.envelope)
        table = self._tables[relation.relation_id] = _Table(relation, EnvelopeEncoder(schemas), topic, key_id, value_id)
        log.info("table schema registered", topic=topic, key_schema_id=key_id, value_schema_id=value_id)
        return table

    def _changes_from_registered(self, subject: str, schema: dict[str, Any]) -> list[str]:
        """What differs from the subject's latest registered schema (best effort: for the error message)."""
        try:
            latest = json.loads(self.registry.get_latest_version(subject).schema.schema_str or "{}")
        except Exception:
            return []
        return column_changes(latest, schema)

    def _schema_id(self, subject: str, schema: dict[str, Any]) -> int:
        text = json.dumps(schema, sort_keys=True)
        cached = self._schema_ids.get((subject, text))
        if cached is not None:
            return cached
        try:
            schema_id: int = self.registry.register_schema(subject, Schema(text, "AVRO"))
        except Exception as exc:  # the client raises several error types; all mean the same here
            changes = self._changes_from_registered(subject, schema)
            what = f" ({'; '.join(changes)})" if changes else ""
            raise SinkFailure(
                f"schema registry refused the new schema for {subject}{what}: {exc}. If the registry's compatibility"
                " rule forbids this change, set the subject's compatibility or make the change compatible, then"
                " restart: nothing after it was confirmed"
            ) from None
        self._schema_ids[(subject, text)] = schema_id
        return schema_id

    def _ensure_topic(self, topic: str) -> None:
        if topic in self._topics:
            return
        if self.settings.create_topics:
            settings = self.settings
            new = NewTopic(
                topic,
                num_partitions=settings.partitions,
                replication_factor=settings.replication_factor,
                config=dict(settings.topic_config),
            )
            future = self.admin.create_topics([new], operation_timeout=30)[topic]
            deadline = time.monotonic() + 60
            while True:
                try:
                    future.result(timeout=0.5)
                    log.info("topic created", topic=topic, partitions=self.settings.partitions)
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
        self._topics.add(topic)


def check_kafka(kafka: KafkaSettings, registry: SchemaRegistrySettings, timeout: float = 10) -> list[str]:
    """Every problem that would stop `cdcd run` on the Kafka side: the broker and the schema registry."""
    problems = []
    errors: list[str] = []  # what the client saw: names the cause (authentication, TLS) better than the timeout
    try:
        config: dict[str, Any] = {**kafka.client_config(), "logger": library_logger("cdcd.librdkafka"),
                                  "error_cb": lambda e: errors.append(e.str())}  # fmt: skip
        admin = AdminClient(config)
        try:
            metadata = admin.list_topics(timeout=timeout)
        finally:
            admin.poll(0)  # serves error_cb
        if not metadata.brokers:
            problems.append(f"Kafka at {kafka.bootstrap_servers} reports no brokers")
    except KafkaException as exc:
        cause = f" ({errors[-1]})" if errors else ""
        problems.append(f"cannot reach Kafka at {kafka.bootstrap_servers}: {exc.args[0].str()}{cause}")
    try:
        SchemaRegistryClient({**registry.client_config(), "timeout": timeout}).get_subjects()
    except Exception as exc:  # connection errors, HTTP errors and bad URLs all land here
        problems.append(f"schema registry at {registry.url} does not answer the Confluent API: {exc}")
    return problems
