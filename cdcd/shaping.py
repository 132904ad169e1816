"""Debezium event shaping: committed transactions, logical decoding messages and snapshot batches in, Kafka
records (topic, key bytes, value bytes, headers) out, in order, to the ``emit`` function passed in (a call per
record: no generator frames on the per-row path). Pure: the schema registry and topic creation are reached
through the ``Registry`` passed in; sending the records is the sink's job.

The rules of Debezium's PostgreSQL connector:

* Table changes go to ``<prefix>.<schema>.<table>``, keyed by the replica identity (under REPLICA IDENTITY
  FULL by the primary key, which the decoder flags), with op ``c``/``u``/``d`` (``r`` for snapshot rows).
* A delete is followed by a tombstone (null value) under its key, unless ``tombstones_on_delete`` is off.
* An update that changes the key becomes a delete of the old key (plus tombstone) and a create under the new
  key, so each key's history stays in one partition; the delete names the new key in a ``__debezium.newkey``
  header, the create the old one in ``__debezium.oldkey`` (the create lacks unchanged TOAST values, which a
  consumer carries over from the old key's row).
* A truncate is one ``t`` event per table, without key.
* Logical decoding messages go to ``<prefix>.message`` (key: the prefix).
* With the transaction topic, a transaction with events gets BEGIN and END events on ``<prefix>.transaction``
  (END counts its events per topic), and every event names it in its ``transaction`` block with its order in
  the transaction and on its topic.
* Unchanged TOAST values are null and named in the envelope's ``unchanged_toast``.
"""

from __future__ import annotations

import itertools
import re
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, cast

from cdcd import __version__
from cdcd.avro import EnvelopeEncoder, SourceInfo, TxInfo, build_schemas
from cdcd.avro.metadata import (
    DEBEZIUM_MESSAGE_KEY,
    DEBEZIUM_MESSAGE_VALUE,
    DEBEZIUM_TRANSACTION_KEY,
    DEBEZIUM_TRANSACTION_VALUE,
    HEARTBEAT_KEY,
    HEARTBEAT_VALUE,
    MESSAGE_KEY,
    NOTIFICATION_KEY,
    NOTIFICATION_VALUE,
    TRANSACTION_KEY,
    TRANSACTION_VALUE,
    TransactionFieldsEncoder,
    encode_debezium_message,
    encode_heartbeat,
    encode_message,
    encode_notification,
    message_value_schema,
)
from cdcd.batches import Buffered, EncodedRun, Notification, Plain, SnapshotBatch, SnapshotRecords, Transaction
from cdcd.columns import NO_RULES, ColumnRules
from cdcd.heartbeat import Heartbeat
from cdcd.lsn import pg_to_unix_us
from cdcd.pgoutput.messages import LogicalMessage, Relation, Row, RowChange, Truncate, Type
from cdcd.plan import Plans, RelationPlan, Wire
from cdcd.rowstage import STAGE, RowStage

if TYPE_CHECKING:
    from cdcd.rowstage.stage import Envelope

# Debezium's op codes for row changes; truncate is "t", a logical decoding message "m", a snapshot row "r".
OP_CODES = {"insert": "c", "update": "u", "delete": "d"}
# Debezium's headers on the two events of a key change; the value is the other key, as the message key is sent.
OLD_KEY_HEADER = "__debezium.oldkey"
NEW_KEY_HEADER = "__debezium.newkey"

Headers = list[tuple[str, str | bytes | None]]
Record = tuple[str, bytes | None, bytes | None, Headers | None]  # topic, key, value, headers
Emit = Callable[[str, bytes | None, bytes | None, Headers | None], None]  # takes a record
# takes records without headers, in order (what the compiled shaper made in one call): fewer Python calls than emit
EmitMany = Callable[[list[Plain]], None]

_RUN = 512  # changes per call of the compiled shaper: bounds the list of changes held at once
_TOPIC_INVALID = re.compile(r"[^A-Za-z0-9._-]")
_WIRE_HEADER = struct.Struct(">bI")  # Confluent wire format: magic byte 0, schema id


def topic_name(prefix: str, schema: str, table: str) -> str:
    """``<prefix>.<schema>.<table>`` with characters Kafka does not allow in topic names replaced by ``_``."""
    return _TOPIC_INVALID.sub("_", f"{prefix}.{schema or 'pg_catalog'}.{table}")


def table_subjects(
    relation: Relation, prefix: str, types: dict[int, Type], *, debezium: bool, columns: ColumnRules = NO_RULES
) -> list[tuple[str, dict[str, Any]]]:
    """The registry subjects of a table's topic, each with the schema cdcd registers under it for ``relation``
    (as ``EventShaper.wire`` does): the key's (when the table has one) and the envelope's."""
    schemas = build_schemas(relation, prefix, types, debezium=debezium, rules=columns.of(relation))
    topic = topic_name(prefix, relation.schema, relation.name)
    key = [] if schemas.key is None else [(f"{topic}-key", schemas.key)]
    return [*key, (f"{topic}-value", schemas.envelope)]


def wire_header(schema_id: int) -> bytes:
    return _WIRE_HEADER.pack(0, schema_id)


def key_changed(change: RowChange, key_positions: tuple[int, ...]) -> bool:
    """Whether an update changed its key; ``key_positions``: the table plan's replica identity columns."""
    if change.old_is_key:
        return True  # PostgreSQL sends a K tuple only when the key changed
    old, new = change.old, change.new
    assert old is not None
    assert new is not None
    return any(old[i] != new[i] for i in key_positions)


class Registry(Protocol):
    """Where schemas get their ids and topics come into being (the Kafka sink, over the network)."""

    def schema_id(self, subject: str, schema: dict[str, Any]) -> int: ...
    def ensure_topic(self, topic: str) -> None: ...


class Order:
    """Debezium's transaction block for one transaction: event order in total and per topic."""

    __slots__ = ("counts", "id", "total")

    def __init__(self, txn_id: str) -> None:
        self.id = txn_id
        self.counts: Counter[str] = Counter()
        self.total = 0

    def next(self, topic: str) -> TxInfo:
        self.counts[topic] += 1
        self.total += 1
        return TxInfo(self.id, self.total, self.counts[topic])


def _clock_us() -> int:
    return time.time_ns() // 1000


class EventShaper:
    """Shapes one daemon's events; ``events`` counts them by (schema.table, op) (("", "m") for messages)."""

    def __init__(
        self,
        prefix: str,
        registry: Registry,
        *,
        transaction_topic: bool = True,
        tombstones_on_delete: bool = True,
        clock_us: Callable[[], int] = _clock_us,
        stage: RowStage = STAGE,
        debezium: bool = False,
        columns: ColumnRules = NO_RULES,
    ) -> None:
        self.stage = stage  # the row stage that encodes (cdcd.rowstage; PYTHON: the Python reference only)
        self.debezium = debezium  # Debezium's types and layouts (kafka.envelope: debezium)
        self.columns = columns  # the columns sent and their masks, applied by each table's encoder
        self._encode_transaction: TransactionFieldsEncoder = stage.transaction_fields_encoder()
        self._transaction_topic = f"{prefix}.transaction"
        self.prefix = prefix
        self.registry = registry
        self.transaction_topic = transaction_topic
        self.tombstones = tombstones_on_delete
        self.clock_us = clock_us
        self.database = ""
        self.types: Mapping[int, Type] = {}
        self.plans = Plans()
        self.events: Counter[tuple[str, str]] = Counter()
        self.last_commit_lsn: int | None = None  # of the last transaction shaped: Debezium's source.sequence
        self._fixed: dict[str, tuple[bytes, bytes]] = {}  # topic -> wire headers of fixed-schema events
        self.encoding = "utf-8"  # the stream's text (``wire_encoding``): what encoded runs are decoded with again
        # early's last table version: (relation, its encoder, compiled envelope (None: not encoded), key positions)
        self._early: tuple[Relation, EnvelopeEncoder | None, Envelope | None, list[int]] | None = None

    def start_session(self, database: str, types: Mapping[int, Type], plans: Plans, encoding: str = "utf-8") -> None:
        self.database, self.types, self.plans, self.encoding = database, types, plans, encoding
        self._early = None

    # -- what goes in --------------------------------------------------------------------------------

    def transaction(
        self, txn: Transaction, changes: Iterable[Buffered], emit: Emit, emit_many: EmitMany | None = None
    ) -> None:
        """Emit the records of a committed transaction, in order; ``changes`` are its changes (``txn.changes()``).
        With ``emit_many``, what the compiled shaper makes goes to it, a list at a time."""
        now_us = self.clock_us()
        order = Order(f"{txn.xid}:{txn.commit_lsn}")
        source = SourceInfo(
            version=__version__,
            db=self.database,
            ts_us=pg_to_unix_us(txn.commit_time),
            tx_id=txn.xid,
            commit_lsn=txn.commit_lsn,
            last_commit_lsn=self.last_commit_lsn,
            origin=txn.origin,
        )
        # Like Debezium, no BEGIN/END for a transaction without events (PostgreSQL 14 sends those; 15+ skips them).
        metadata = self.transaction_topic and txn.change_count > 0
        meta_ts_ms = now_us // 1000
        if self.debezium:  # Debezium: named after the first event's LSN; the commit time
            changes, first_lsn = _first_lsn(changes)
            order.id = f"{txn.xid}:{txn.commit_lsn if first_lsn is None else first_lsn}"
            meta_ts_ms = source.ts_us // 1000
        if metadata:
            emit(*self._transaction_event("BEGIN", order.id, meta_ts_ms, None, None))
        plans, relation, plan, wire = self.plans, None, None, None
        row = self._row
        run: list[RowChange] = []  # a run of one table's changes, for the compiled shaper (wire.encoder.rows)
        for change in changes:
            if change.__class__ is RowChange:
                assert isinstance(change, RowChange)
                if change.relation is not relation:  # most transactions change one table many times
                    if run:
                        self._run(run, plan, wire, source, order, now_us, emit, emit_many)  # type: ignore[arg-type]
                    relation = change.relation
                    plan = plans.get(relation)
                    wire = plan.wire or self.wire(plan)
                assert plan is not None
                assert wire is not None
                if wire.encoder.rows is None:
                    row(change, plan, wire, source, order, now_us, emit)
                else:
                    run.append(change)
                    if len(run) >= _RUN:
                        self._run(run, plan, wire, source, order, now_us, emit, emit_many)
                continue
            if run:
                self._run(run, plan, wire, source, order, now_us, emit, emit_many)  # type: ignore[arg-type]
            if isinstance(change, EncodedRun):
                self._encoded(change, source, order, now_us, emit, emit_many)
            elif isinstance(change, Truncate):
                self._truncate(change, source, order, now_us, emit)
            else:
                assert isinstance(change, LogicalMessage)
                emit(*self._message(change, source, now_us, order if self.debezium else None))
        if run:
            self._run(run, plan, wire, source, order, now_us, emit, emit_many)  # type: ignore[arg-type]
        if metadata:
            counts = tuple(sorted(order.counts.items()))
            if self.debezium:  # Debezium names the tables, not the topics
                counts = tuple((self._collection(topic), n) for topic, n in counts)
            emit(*self._transaction_event("END", order.id, meta_ts_ms, order.total, counts))
        self.last_commit_lsn = txn.commit_lsn

    def heartbeat(self, topic: str, beat: Heartbeat, emit: Emit) -> None:
        """Emit a heartbeat record on ``topic``: Debezium's (keyed by the server name, the prefix), with the
        positions cdcd had then. The same in both layouts."""
        key, value = encode_heartbeat(self.prefix, beat.ts_ms, beat.lsn, beat.received_lsn)
        key_header, value_header = self._fixed_headers(topic, HEARTBEAT_KEY, HEARTBEAT_VALUE)
        emit(topic, key_header + key, value_header + value, None)

    def notification(self, topic: str, notification: Notification, emit: Emit) -> None:
        """Emit a snapshot notification on ``topic``: Debezium's record, keyed by its id. The same in both
        layouts."""
        n = notification
        key, value = encode_notification(n.id, n.type, n.aggregate_type, n.additional_data, n.timestamp)
        key_header, value_header = self._fixed_headers(topic, NOTIFICATION_KEY, NOTIFICATION_VALUE)
        emit(topic, key_header + key, value_header + value, None)

    def message(self, message: LogicalMessage, emit: Emit) -> None:
        """Emit a non-transactional logical decoding message."""
        now_us = self.clock_us()
        emit(*self._message(message, SourceInfo(version=__version__, db=self.database, ts_us=now_us), now_us))

    def snapshot(self, batch: SnapshotBatch, emit: Emit) -> None:
        """Emit a batch of snapshot rows as ``r`` events; ``source.snapshot`` marks the first and last of all."""
        now_us = self.clock_us()
        plan = self.plans.get(batch.relation)
        wire = plan.wire or self.wire(plan)
        key_header, value_header, lsn, topic = wire.key_header, wire.value_header, batch.lsn, wire.topic
        source = SourceInfo(
            version=__version__, db=self.database, ts_us=batch.ts_us, snapshot=batch.marker, commit_lsn=lsn
        )
        rows, compiled = batch.rows, wire.encoder.snapshot_rows
        i = 0
        while i < len(rows):
            if compiled is not None and batch.row_marker(i) == batch.marker:  # the ends of a snapshot differ
                stop = len(rows) - 1 if batch.last else len(rows)
                i = compiled(rows, i, stop, source, lsn, now_us, topic, key_header, value_header, emit)
                if i == len(rows):
                    break
            marker = batch.row_marker(i)
            marked = source if marker == batch.marker else replace(source, snapshot=marker)
            emit(*snapshot_record(wire, rows[i], marked, lsn, now_us), None)
            i += 1
        self.events[plan.table, "r"] += len(rows)

    def snapshot_encoder(self, relation: Relation, lsn: int) -> SnapshotEncoder:
        """What makes initial-snapshot rows of ``relation`` at ``lsn`` into records where they are read (its
        schemas registered now, on the caller's thread); ``snapshot_records`` emits what it made."""
        plan = self.plans.get(relation)
        wire = plan.wire or self.wire(plan)
        return SnapshotEncoder(relation, wire, self.database, lsn, self.clock_us, self.stage)

    def snapshot_records(self, batch: SnapshotBatch, emit_many: EmitMany) -> None:
        """Emit a batch whose rows were made into records where they were read (``batch.encoded``), the first and
        last row of the whole initial snapshot made again with their mark, as ``snapshot`` marks them."""
        encoded = batch.encoded
        assert encoded is not None
        plan = self.plans.get(batch.relation)
        records = encoded.records
        ends = [(0, encoded.first)] if batch.first else []
        if batch.last and not (batch.first and len(records) == 1):  # one row, first and last: first
            ends.append((len(records) - 1, encoded.last))
        for index, row in ends:
            records[index] = encoded.mark(row, "first" if index == 0 and batch.first else "last")
        emit_many(records)
        self.events[plan.table, "r"] += len(records)

    # -- table changes -------------------------------------------------------------------------------

    def _row(  # noqa: PLR0917 - the per-row hot path: everything passed, nothing looked up
        self,
        change: RowChange,
        plan: RelationPlan,
        wire: Wire,
        source: SourceInfo,
        order: Order,
        now_us: int,
        emit: Emit,
    ) -> None:
        old, new, lsn, op = change.old, change.new, change.wal_lsn, OP_CODES[change.op]
        if op == "u" and old is not None and wire.key_header is not None and key_changed(change, plan.key_positions):
            assert new is not None
            old_key, new_key = _key(wire, old), _key(wire, new)
            # the other key in a header: as the message key is, or as Debezium's header converter writes it (JSON)
            old_named, new_named = (
                (wire.encoder.key_json(old), wire.encoder.key_json(new)) if self.debezium else (old_key, new_key)
            )
            self._event(
                plan, wire, "d", old_key, old, None, source, lsn, order, now_us, emit, [(NEW_KEY_HEADER, new_named)]
            )
            self._event(
                plan, wire, "c", new_key, None, new, source, lsn, order, now_us, emit, [(OLD_KEY_HEADER, old_named)]
            )
            return
        key_row = new if new is not None else old
        key = None if wire.key_header is None or key_row is None else _key(wire, key_row)
        self._event(plan, wire, op, key, old, new, source, lsn, order, now_us, emit, None)

    def _run(  # noqa: PLR0917 - as _row, for a run of changes
        self,
        run: list[RowChange],
        plan: RelationPlan,
        wire: Wire,
        source: SourceInfo,
        order: Order,
        now_us: int,
        emit: Emit,
        emit_many: EmitMany | None,
    ) -> None:
        """Shape and emit a run of one table's changes with the compiled shaper, which leaves the changes it does
        not do (key changes, values it refuses) to ``_row``; then empty ``run``."""
        rows = wire.encoder.rows
        assert rows is not None
        topic, start = wire.topic, 0
        while start < len(run):
            total, dco = order.total, order.counts[topic]
            args = (source, now_us, order.id, total, dco, topic, wire.key_header, wire.value_header)
            records: list[Plain] = []  # with emit_many: what this call made
            out = emit if emit_many is None else records
            stop, counts = rows(run, start, *args, plan.key_positions, self.tombstones, out)
            if records:
                assert emit_many is not None
                emit_many(records)
            self._made(plan, order, topic, counts)
            if stop < len(run):
                self._row(run[stop], plan, wire, source, order, now_us, emit)
            start = stop + 1
        run.clear()

    def _encoded(  # noqa: PLR0917 - as _run
        self,
        encoded: EncodedRun,
        source: SourceInfo,
        order: Order,
        now_us: int,
        emit: Emit,
        emit_many: EmitMany | None,
    ) -> None:
        """Emit a run of changes encoded as they arrived (``early``): their records, this transaction's fields
        spliced in. Encoded by another encoder than the table version's now (made again since): decoded again."""
        plan = self.plans.get(encoded.relation)
        wire = plan.wire or self.wire(plan)
        if wire.encoder is not encoded.encoder:
            self._run(encoded.changes(), plan, wire, source, order, now_us, emit, emit_many)
            return
        topic = wire.topic
        records: list[Plain] = []
        fields = (source, now_us, order.id, order.total, order.counts[topic])
        envelope = wire.encoder.envelope
        assert envelope is not None  # it encoded the run
        counts = envelope.splice(
            encoded.rows, *fields, topic, wire.key_header, wire.value_header, self.tombstones, records
        )
        if emit_many is not None:
            emit_many(records)
        else:
            for record in records:
                emit(*record, None)
        self._made(plan, order, topic, counts)

    def _made(self, plan: RelationPlan, order: Order, topic: str, counts: Sequence[int]) -> None:
        """The compiled shaper made ``counts`` c, u and d events of ``plan``'s table on ``topic``: count them."""
        made = sum(counts)
        order.total += made
        order.counts[topic] += made
        for op, count in zip("cud", counts, strict=True):
            if count:
                self.events[plan.table, op] += count

    def early(self, change: RowChange, payload: bytes, run: EncodedRun | None) -> EncodedRun | None:
        """Encode a row change as it arrives (``cdcd.assembly.buffer.Early``), appended to ``run`` or a new run:
        its key, before and after, which no transaction field changes; ``transaction`` splices those in at commit.
        None: the change stays decoded (its table has a row filter, or no compiled envelope in this layout or
        implementation, or the compiled code leaves the change to ``_row``: a key change, a value it refuses)."""
        relation = change.relation
        cached = self._early
        if cached is None or cached[0] is not relation:
            cached = self._early = self._early_plan(relation)
        _, encoder, envelope, positions = cached
        if envelope is None:
            return None
        assert encoder is not None
        if run is None or run.encoder is not encoder:
            run = EncodedRun(relation, encoder, encoder.encoded(), self.encoding)
        return run if envelope.prepare(change, payload, positions, run.rows) else None

    def _early_plan(self, relation: Relation) -> tuple[Relation, EnvelopeEncoder | None, Envelope | None, list[int]]:
        plan = self.plans.get(relation)
        if plan.filter is not None or self.stage.rows is None:
            return relation, None, None, []
        encoder = self.encoder(plan)
        return relation, encoder, encoder.envelope, list(plan.key_positions)

    def _event(  # noqa: PLR0917 - one event's every part
        self,
        plan: RelationPlan,
        wire: Wire,
        op: str,
        key: bytes | None,
        old: Row | None,
        new: Row | None,
        source: SourceInfo,
        lsn: int,
        order: Order,
        now_us: int,
        emit: Emit,
        headers: Headers | None,
    ) -> None:
        topic = wire.topic
        value = wire.encoder.encode_value(op, old, new, source, lsn, now_us, order.next(topic))
        emit(topic, key, wire.value_header + value, headers)
        self.events[plan.table, op] += 1
        if op == "d" and self.tombstones and key is not None:
            emit(topic, key, None, headers if self.debezium else None)  # Debezium's tombstone repeats the headers

    def _truncate(self, change: Truncate, source: SourceInfo, order: Order, now_us: int, emit: Emit) -> None:
        for relation in change.relations:
            plan = self.plans.get(relation)
            wire = plan.wire or self.wire(plan)
            value = wire.encoder.encode_value("t", None, None, source, change.wal_lsn, now_us, order.next(wire.topic))
            self.events[plan.table, "t"] += 1
            emit(wire.topic, None, wire.value_header + value, None)

    def encoder(self, plan: RelationPlan) -> EnvelopeEncoder:
        """The plan's encoder, made once per table version (before its schemas are registered, by ``early``)."""
        if plan.wire is not None:
            return plan.wire.encoder
        if plan.encoder is None:
            relation = plan.relation
            rules = self.columns.of(relation)
            schemas = build_schemas(relation, self.prefix, dict(self.types), debezium=self.debezium, rules=rules)
            plan.encoder = EnvelopeEncoder(schemas, stage=self.stage)
        return plan.encoder

    def wire(self, plan: RelationPlan) -> Wire:
        """Build the plan's Kafka part: schemas registered, topic made."""
        relation = plan.relation
        encoder = self.encoder(plan)
        schemas = encoder.schemas
        topic = topic_name(self.prefix, relation.schema, relation.name)
        self.registry.ensure_topic(topic)
        key_header = None if schemas.key is None else wire_header(self.registry.schema_id(f"{topic}-key", schemas.key))
        value_header = wire_header(self.registry.schema_id(f"{topic}-value", schemas.envelope))
        plan.wire = Wire(topic, encoder, key_header, value_header)
        return plan.wire

    def shaped(self, last_commit_lsn: int, events: list[tuple[str, str, int]]) -> None:
        """Transactions were shaped elsewhere (the lane, ``cdcd.replication.lane``): the last one's commit LSN
        and the events made, as (schema.table, op, count)."""
        self.last_commit_lsn = last_commit_lsn
        for table, op, count in events:
            self.events[table, op] += count

    def transaction_headers(self) -> tuple[str, bytes, bytes] | None:
        """The transaction topic and the wire headers of its BEGIN and END events (in this layout); None
        without the transaction topic."""
        if not self.transaction_topic:
            return None
        return self._transaction_topic, *self._fixed_headers(self._transaction_topic, *self._transaction_schemas())

    # -- fixed-schema events ---------------------------------------------------------------------------

    def _message(self, message: LogicalMessage, source: SourceInfo, now_us: int, order: Order | None = None) -> Record:
        """A message event; ``order``: the transaction it is part of, for Debezium's transaction block."""
        topic = f"{self.prefix}.message"
        self.events["", "m"] += 1
        if self.debezium:
            block = None if order is None else order.next(topic)
            key, value = encode_debezium_message(self.prefix, message, source, now_us // 1000, block)
            schemas = DEBEZIUM_MESSAGE_KEY, DEBEZIUM_MESSAGE_VALUE
        else:
            key, value = encode_message(self.prefix, message, source, now_us // 1000)
            schemas = MESSAGE_KEY, message_value_schema()
        key_header, value_header = self._fixed_headers(topic, *schemas)
        return topic, key_header + key, value_header + value, None

    def collection(self, topic: str) -> str | None:
        """The name END events count ``topic``'s events under when not the topic: Debezium's data collection."""
        return self._collection(topic) if self.debezium else None

    def _collection(self, topic: str) -> str:
        """Debezium's data collection name of a topic: the table (``schema.table``), ``message`` for messages."""
        return topic.removeprefix(f"{self.prefix}.")

    def _transaction_event(
        self, status: str, txn_id: str, ts_ms: int, count: int | None, collections: tuple[tuple[str, int], ...] | None
    ) -> Record:
        topic = self._transaction_topic
        key, value = self._encode_transaction(status, txn_id, ts_ms, count, collections, self.debezium)
        key_header, value_header = self._fixed_headers(topic, *self._transaction_schemas())
        return topic, key_header + key, value_header + value, None

    def _transaction_schemas(self) -> tuple[dict[str, Any], dict[str, Any]]:
        if self.debezium:
            return DEBEZIUM_TRANSACTION_KEY, DEBEZIUM_TRANSACTION_VALUE
        return TRANSACTION_KEY, TRANSACTION_VALUE

    def _fixed_headers(self, topic: str, key: dict[str, Any], value: dict[str, Any]) -> tuple[bytes, bytes]:
        headers = self._fixed.get(topic)
        if headers is None:
            self.registry.ensure_topic(topic)
            key_id = self.registry.schema_id(f"{topic}-key", key)
            value_id = self.registry.schema_id(f"{topic}-value", value)
            headers = self._fixed[topic] = (wire_header(key_id), wire_header(value_id))
        return headers


def _first_lsn(changes: Iterable[Buffered]) -> tuple[Iterable[Buffered], int | None]:
    """The changes again (their first one looked at) and the LSN of the first one."""
    it = iter(changes)
    first = next(it, None)
    if first is None:
        return (), None
    if isinstance(first, EncodedRun):
        lsn = first.first_lsn()
    else:
        lsn = first.lsn if isinstance(first, LogicalMessage) else first.wal_lsn
    return itertools.chain((first,), it), lsn


def _key(wire: Wire, row: Row) -> bytes:
    assert wire.key_header is not None
    return wire.key_header + wire.encoder.encode_key(row)


def snapshot_record(wire: Wire, row: Row, source: SourceInfo, lsn: int, now_us: int) -> Plain:
    """The ``r`` record of a snapshot row, as ``EventShaper.snapshot`` makes it (the specification)."""
    key = None if wire.key_header is None else wire.key_header + wire.encoder.encode_key(row)
    return wire.topic, key, wire.value_header + wire.encoder.encode_value("r", None, row, source, lsn, now_us)


class SnapshotEncoder:
    """One table's initial-snapshot rows from COPY text (lines joined as COPY sends them) to their records, all
    marked ``true``: a parallel initial snapshot's reader threads call it, so that the main thread only produces.
    Compiled, the lines are parsed and encoded in one call without the GIL (``copy_records``); the lines it leaves,
    and all of them with ``CDCD_IMPL=python``, go the specification's way: the stage's COPY reader, then
    ``snapshot_record``, as ``EventShaper.snapshot`` makes them. The encoders cache the last source they encoded,
    so that part (and only it) takes a lock: several threads encode the same table's key ranges, and the caller's
    thread marks the ends of the snapshot (``SnapshotRecords.mark``)."""

    def __init__(  # noqa: PLR0917 - what EventShaper.snapshot_encoder hands over
        self, relation: Relation, wire: Wire, database: str, lsn: int, clock_us: Callable[[], int], stage: RowStage
    ) -> None:
        self.wire, self.database, self.lsn, self.clock_us = wire, database, lsn, clock_us
        self.width = len(relation.columns)
        self.read_rows, self.read_row = stage.copy_rows_reader(), stage.copy_row_reader()
        compiled, encoder = stage.rows, wire.encoder
        self._copy_records = None if compiled is None else compiled.copy_records
        self._writers = encoder.writers
        self._envelope = encoder.envelope
        self._lock = threading.Lock()

    def __call__(self, data: bytes) -> SnapshotRecords:
        """The records of ``data``'s lines (at least one)."""
        now_us = self.clock_us()
        source = SourceInfo(version=__version__, db=self.database, ts_us=now_us, snapshot="true", commit_lsn=self.lsn)
        envelope, writers, copy_records, wire = self._envelope, self._writers, self._copy_records, self.wire
        if envelope is None or writers is None or copy_records is None:
            rows = self.read_rows(data, self.width)
            with self._lock:
                records = [snapshot_record(wire, row, source, self.lsn, now_us) for row in rows]
            return SnapshotRecords(records, rows[0], rows[-1], now_us, self._marking(source, now_us))
        with self._lock:
            rest = envelope.snapshot_rest(source, self.lsn, now_us)
        made, left = copy_records(data, self.width, *writers, wire.key_header, wire.value_header, rest, wire.topic)
        if left:  # every line read before any is encoded, as the specification does (the same first error)
            parsed = [(index, self.read_rows(line, self.width)[0]) for index, line in left]
            with self._lock:
                for index, row in parsed:
                    made[index] = snapshot_record(wire, row, source, self.lsn, now_us)
        first = self.read_row(data[: data.index(b"\n") + 1], self.width)
        last = self.read_row(data[data.rfind(b"\n", 0, len(data) - 1) + 1 :], self.width)
        return SnapshotRecords(cast("list[Plain]", made), first, last, now_us, self._marking(source, now_us))

    def _marking(self, source: SourceInfo, now_us: int) -> Callable[[Row, str], Plain]:
        def mark(row: Row, marker: str) -> Plain:
            with self._lock:
                return snapshot_record(self.wire, row, replace(source, snapshot=marker), self.lsn, now_us)

        return mark
