"""Debezium event shaping without Kafka: which records a transaction, a message or a snapshot batch becomes."""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader

from cdcd.batches import SnapshotBatch, Transaction
from cdcd.pgoutput.messages import UNCHANGED_TOAST, Change, Column, LogicalMessage, Relation, Row, RowChange, Truncate
from cdcd.plan import Plans, definition
from cdcd.shaping import (
    NEW_KEY_HEADER,
    OLD_KEY_HEADER,
    Emit,
    EventShaper,
    Order,
    Record,
    key_changed,
    table_subjects,
    topic_name,
)

REL = Relation(16384, "public", "t", "d", (Column("id", 23, -1, True), Column("v", 25, -1, False)))
# REPLICA IDENTITY FULL as the decoder gives it: keyed by the primary key, or by nothing without one.
FULL = Relation(16385, "public", "f", "f", (Column("id", 23, -1, True), Column("v", 25, -1, False)))
FULL_NO_KEY = Relation(16386, "public", "g", "f", (Column("id", 23, -1, False), Column("v", 25, -1, False)))
NOW_US = 1_700_000_000_000_000


class Registry:
    """An in-memory schema registry: ids by (subject, schema), the topics asked for."""

    def __init__(self) -> None:
        self.schemas: dict[int, dict[str, Any]] = {}
        self.ids: dict[tuple[str, str], int] = {}
        self.topics: list[str] = []

    def schema_id(self, subject: str, schema: dict[str, Any]) -> int:
        text = json.dumps(schema, sort_keys=True)
        if (subject, text) not in self.ids:
            self.ids[subject, text] = len(self.ids) + 1
            self.schemas[self.ids[subject, text]] = schema
        return self.ids[subject, text]

    def ensure_topic(self, topic: str) -> None:
        self.topics.append(topic)

    def decode(self, data: bytes | None) -> Any:
        """A Confluent wire-format message (magic byte, schema id, Avro) as its datum."""
        if data is None:
            return None
        magic, schema_id = struct.unpack_from(">bI", data)
        assert magic == 0
        return schemaless_reader(io.BytesIO(data[5:]), parse_schema(self.schemas[schema_id]), None)


class Buffer:
    def __init__(self, changes: Iterable[Change]) -> None:
        self.changes = list(changes)
        self.count = len(self.changes)

    def __iter__(self) -> Iterator[Change]:
        return iter(self.changes)

    def close(self) -> None:
        """Nothing to release."""


def shaper(registry: Registry, **options: Any) -> EventShaper:
    shaper = EventShaper("cdcd", registry, clock_us=lambda: NOW_US, **options)
    shaper.start_session("shop", {}, Plans())
    return shaper


def txn(*changes: Change, xid: int = 7, commit_lsn: int = 0x100) -> Transaction:
    return Transaction(xid, commit_lsn, commit_lsn + 8, 0, False, Buffer(changes))


def collect(shaping: Callable[[Emit], None]) -> list[Record]:
    records: list[Record] = []
    shaping(lambda topic, key, value, headers: records.append((topic, key, value, headers)))
    return records


def shape(s: EventShaper, t: Transaction) -> list[Record]:
    return collect(partial(s.transaction, t, t.changes()))


def row(op: str, old: Row | None, new: Row | None, rel: Relation = REL, old_is_key: bool = False) -> RowChange:
    return RowChange(op, rel, old, new, old_is_key, None, 0x80, 10)  # type: ignore[arg-type]


def decoded(registry: Registry, records: Iterable[Record]) -> list[tuple[str, Any, Any]]:
    return [(topic, registry.decode(key), registry.decode(value)) for topic, key, value, _ in records]


def test_topic_names_are_kafka_legal() -> None:
    assert topic_name("cdcd", "public", "orders") == "cdcd.public.orders"
    assert topic_name("cdcd", "", "pg_class") == "cdcd.pg_catalog.pg_class"
    assert topic_name("p", "Sales Dept", 'we"ird/tbl') == "p.Sales_Dept.we_ird_tbl"


def test_key_change_detection() -> None:
    keys = Plans().get(REL).key_positions
    assert key_changed(row("update", ("1", None), ("2", "x"), old_is_key=True), keys)
    assert not key_changed(row("update", ("1", "a"), ("1", "b")), keys)  # full old row, same key
    assert key_changed(row("update", ("1", "a"), ("2", "a")), keys)


def test_definition_ignores_the_streamed_xid() -> None:
    streamed = Relation(1, "public", "t", "d", REL.columns, xid=777)
    assert definition(streamed) == definition(Relation(1, "public", "t", "d", REL.columns))
    assert definition(Relation(1, "public", "t", "f", REL.columns)) != definition(streamed)


def test_transaction_order_counts_per_topic_and_in_total() -> None:
    order = Order("5:99")
    orders = [order.next(topic) for topic in ("a", "b", "a", "a", "b")]
    assert [(o.total_order, o.data_collection_order) for o in orders] == [(1, 1), (2, 1), (3, 2), (4, 3), (5, 2)]
    assert {o.id for o in orders} == {"5:99"}
    assert dict(order.counts) == {"a": 3, "b": 2}


def test_a_transaction_is_begin_its_events_in_order_and_end() -> None:
    registry = Registry()
    s = shaper(registry)
    records = shape(
        s, txn(row("insert", None, ("1", "a")), row("update", None, ("1", "b")), row("delete", ("1", None), None))
    )
    topics = [r[0] for r in records]
    assert topics == ["cdcd.transaction", *["cdcd.public.t"] * 4, "cdcd.transaction"]
    out = decoded(registry, records)
    begin, end = out[0][2], out[-1][2]
    assert (begin["status"], begin["id"], out[0][1]) == ("BEGIN", "7:256", {"id": "7:256"})
    assert (end["status"], end["event_count"]) == ("END", 3)
    assert end["data_collections"] == [{"data_collection": "cdcd.public.t", "event_count": 3}]
    events = [value for _, _, value in out[1:-1]]
    assert [e and e["op"] for e in events] == ["c", "u", "d", None]  # the delete's tombstone last
    assert [key for _, key, _ in out[1:-1]] == [{"id": 1}] * 4
    assert events[0]["after"] == {"id": 1, "v": "a"}
    assert events[0]["before"] is None
    assert events[2]["before"] == {"id": 1, "v": None}
    assert events[2]["after"] is None
    blocks = [(e["transaction"]["total_order"], e["transaction"]["data_collection_order"]) for e in events[:3]]
    assert blocks == [(1, 1), (2, 2), (3, 3)]
    assert {e["source"]["db"] for e in events[:3]} == {"shop"}
    assert events[0]["source"]["sequence"] == '[null,"128"]'
    assert s.events == {("public.t", "c"): 1, ("public.t", "u"): 1, ("public.t", "d"): 1}


def test_the_next_transaction_names_the_last_commit_lsn_in_its_sequence() -> None:
    registry = Registry()
    s = shaper(registry, transaction_topic=False)
    shape(s, txn(row("insert", None, ("1", "a")), commit_lsn=0x100))
    (record,) = shape(s, txn(row("insert", None, ("2", "a")), commit_lsn=0x200))
    assert registry.decode(record[2])["source"]["sequence"] == '["256","128"]'


def test_a_key_change_is_delete_tombstone_and_create_naming_each_other() -> None:
    registry = Registry()
    s = shaper(registry, transaction_topic=False)
    records = shape(s, txn(row("update", ("1", None), ("2", UNCHANGED_TOAST), old_is_key=True)))
    assert [(registry.decode(k), (v is not None) and registry.decode(v)["op"]) for _, k, v, _ in records] == [
        ({"id": 1}, "d"),
        ({"id": 1}, False),
        ({"id": 2}, "c"),
    ]
    delete, tombstone, create = records
    assert delete[3] == [(NEW_KEY_HEADER, create[1])]
    assert create[3] == [(OLD_KEY_HEADER, delete[1])]
    assert tombstone[3] is None
    assert registry.decode(create[2])["unchanged_toast"] == ["v"]


def test_no_tombstones_when_turned_off_and_no_key_under_replica_identity_full_without_primary_key() -> None:
    registry = Registry()
    records = shape(
        shaper(registry, transaction_topic=False, tombstones_on_delete=False), txn(row("delete", ("1", None), None))
    )
    assert [r[2] is None for r in records] == [False]
    full = shape(shaper(registry, transaction_topic=False), txn(row("delete", ("1", "x"), None, rel=FULL_NO_KEY)))
    assert [(topic, key) for topic, key, _, _ in full] == [("cdcd.public.g", None)]  # no key: no tombstone
    update = shape(
        shaper(registry, transaction_topic=False), txn(row("update", ("1", "x"), ("2", "x"), rel=FULL_NO_KEY))
    )
    assert [registry.decode(v)["op"] for _, _, v, _ in update] == ["u"]  # no key to change


def test_replica_identity_full_is_keyed_by_its_primary_key() -> None:
    """The whole old row (an O tuple) of a FULL table: deletes keyed and tombstoned by the primary key, an update
    of other columns one event, an update of the key a delete + tombstone + create as for any keyed table."""
    registry = Registry()
    changes = (
        row("delete", ("1", "x"), None, rel=FULL),
        row("update", ("2", "x"), ("2", "y"), rel=FULL),
        row("update", ("3", "x"), ("4", "x"), rel=FULL),
    )
    records = shape(shaper(registry, transaction_topic=False), txn(*changes))
    events = [
        (registry.decode(k), None if v is None else registry.decode(v)["op"], h is not None) for _, k, v, h in records
    ]
    assert events == [
        ({"id": 1}, "d", False),
        ({"id": 1}, None, False),
        ({"id": 2}, "u", False),
        ({"id": 3}, "d", True),
        ({"id": 3}, None, False),
        ({"id": 4}, "c", True),
    ]
    assert registry.decode(records[0][2])["before"] == {"id": 1, "v": "x"}  # the whole old row stays in before


def test_truncate_is_one_keyless_event_per_table() -> None:
    registry = Registry()
    records = shape(shaper(registry), txn(Truncate((REL, FULL), False, False, None, 0x90)))
    tables = [(topic, key, registry.decode(value)["op"]) for topic, key, value, _ in records[1:-1]]
    assert tables == [("cdcd.public.t", None, "t"), ("cdcd.public.f", None, "t")]


def test_no_begin_and_end_for_a_transaction_without_events() -> None:
    assert shape(shaper(Registry()), txn()) == []


def test_messages_go_to_the_message_topic() -> None:
    registry = Registry()
    s = shaper(registry)
    ((topic, key, value, _),) = collect(partial(s.message, LogicalMessage(False, 0x40, "app", b"hello")))
    assert (topic, registry.decode(key)) == ("cdcd.message", {"prefix": "app"})
    assert registry.decode(value)["message"] == {"prefix": "app", "content": b"hello"}
    in_txn = shape(s, txn(LogicalMessage(True, 0x50, "app", b"x")))
    assert [r[0] for r in in_txn] == ["cdcd.transaction", "cdcd.message", "cdcd.transaction"]
    assert s.events == {("", "m"): 2}


@pytest.mark.parametrize(
    ("first", "last", "markers"), [(True, False, ["first", "true", "true"]), (False, True, ["true", "true", "last"])]
)
def test_snapshot_rows_are_read_events_marked_at_the_ends(first: bool, last: bool, markers: list[str]) -> None:
    registry = Registry()
    s = shaper(registry)
    batch = SnapshotBatch(REL, [("1", "a"), ("2", "b"), ("3", "c")], 0x300, NOW_US, "true", first, last)
    out = decoded(registry, collect(partial(s.snapshot, batch)))
    assert [(key, value["op"], value["source"]["snapshot"]) for _, key, value in out] == [
        ({"id": i + 1}, "r", m) for i, m in enumerate(markers)
    ]
    assert s.events == {("public.t", "r"): 3}


def test_schemas_are_registered_once_per_table_version() -> None:
    registry = Registry()
    s = shaper(registry, transaction_topic=False)
    for i in range(3):
        again = Relation(REL.relation_id, REL.schema, REL.name, REL.replica_identity, REL.columns, xid=i)
        shape(s, txn(row("insert", None, ("1", "a"), rel=again)))
    assert registry.topics == ["cdcd.public.t"]
    assert len(registry.ids) == 2
    wider = Relation(REL.relation_id, "public", "t", "d", (*REL.columns, Column("w", 20, -1, False)))
    (record,) = shape(s, txn(row("insert", None, ("1", "a", "5"), rel=wider)))
    assert registry.decode(record[2])["after"] == {"id": 1, "v": "a", "w": 5}
    assert len(registry.ids) == 3  # a new value schema; the key schema is the same


def test_debezium_envelope_transaction_metadata_messages_headers_and_placeholders() -> None:
    """kafka.envelope: debezium: BEGIN named after the first event's LSN, END pairing with it, both at the commit
    time and naming tables; events named <xid>:<their LSN>; a message in the transaction gets the block; a key
    change's headers are JSON text, repeated on the tombstone; an unchanged TOAST text is the placeholder."""
    registry = Registry()
    shaper = EventShaper("cdcd", registry, clock_us=lambda: NOW_US, debezium=True)
    shaper.start_session("shop", {}, Plans())
    changes = (
        RowChange("update", REL, ("1", None), ("2", UNCHANGED_TOAST), True, None, 0x80, 10),
        LogicalMessage(True, 0x90, "pfx", b"hi", 7),
    )
    commit_time = 700_000_000  # PostgreSQL µs since 2000-01-01
    t = Transaction(7, 0x100, 0x108, commit_time, False, Buffer(changes))
    records = shape(shaper, t)
    topics = [topic for topic, _, _, _ in records]
    assert topics == ["cdcd.transaction", *["cdcd.public.t"] * 3, "cdcd.message", "cdcd.transaction"]
    begin, delete, tombstone, create, message, end = records
    commit_ms = (commit_time + 946_684_800_000_000) // 1000
    assert registry.decode(begin[2]) == {
        "status": "BEGIN", "id": "7:128", "event_count": None, "data_collections": None, "ts_ms": commit_ms
    }  # fmt: skip
    assert registry.decode(end[2])["id"] == "7:128"
    assert registry.decode(end[2])["ts_ms"] == commit_ms
    assert registry.decode(end[2])["data_collections"] == [
        {"data_collection": "message", "event_count": 1},
        {"data_collection": "public.t", "event_count": 2},
    ]
    assert delete[3] == tombstone[3] == [(NEW_KEY_HEADER, b'{"id":2}')]
    assert create[3] == [(OLD_KEY_HEADER, b'{"id":1}')]
    created = registry.decode(create[2])
    assert created["after"] == {"id": 2, "v": "__debezium_unavailable_value"}
    assert created["unchanged_toast"] == ["v"]
    assert created["transaction"] == {"id": "7:128", "total_order": 2, "data_collection_order": 2}
    assert registry.decode(message[2])["transaction"] == {"id": "7:144", "total_order": 3, "data_collection_order": 1}
    assert registry.decode(message[1]) == {"prefix": "pfx"}


def test_table_subjects_are_what_the_shaper_registers() -> None:
    """`cdcd check` asks about the same subjects and schemas a stream registers (EventShaper.wire)."""
    for relation in (REL, FULL_NO_KEY):
        registry = Registry()
        EventShaper("shop", registry).wire(Plans().get(relation))
        registered = dict(registry.ids)  # (subject, the schema as JSON) -> id
        subjects = table_subjects(relation, "shop", {}, debezium=False)
        assert {(s, json.dumps(schema, sort_keys=True)) for s, schema in subjects} == set(registered)
    assert [s for s, _ in table_subjects(FULL_NO_KEY, "shop", {}, debezium=False)] == ["shop.public.g-value"]
