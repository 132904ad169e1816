"""The stack's ``debezium`` component: Debezium's PostgreSQL connector in Kafka Connect streams a scratch database's
changes to Kafka, Avro in the Confluent wire format that the registry's Confluent API decodes (as cdcd's output)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.integration.conftest import Database, PgServer, close_bounded, scratch_database, stack15
from tests.integration.kafka_harness import delete_topics

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TABLE item (id int PRIMARY KEY, name text NOT NULL, price numeric(10, 2), seen timestamptz, tags text[]);
CREATE PUBLICATION dbz_pub FOR TABLE item;
"""


@dataclass
class Event:
    key: dict[str, Any] | None
    value: dict[str, Any] | None  # None: a tombstone


class Reader:
    """Reads one topic from the start, keys and values decoded through the registry's Confluent API (as
    kafka_harness does for cdcd). Debezium's own headers (context, not Avro) are left alone."""

    def __init__(self, env: dict[str, str], topic: str) -> None:
        self.topic = topic
        self.deserialize = AvroDeserializer(SchemaRegistryClient({"url": env["CDCD_SCHEMA_REGISTRY__URL"]}))
        self.consumer = Consumer(
            {
                "bootstrap.servers": env["CDCD_KAFKA__BOOTSTRAP_SERVERS"],
                "group.id": f"{topic}-{uuid.uuid4().hex[:6]}",
                "auto.offset.reset": "earliest",
                "topic.metadata.refresh.interval.ms": 500,
            }
        )
        self.consumer.subscribe([topic])
        self.events: list[Event] = []

    def read(self, count: int, timeout: float = 60) -> list[Event]:
        """Until ``count`` messages were read."""
        deadline = time.monotonic() + timeout
        while len(self.events) < count:
            assert time.monotonic() < deadline, f"timed out with {len(self.events)} of {count} messages"
            message = self.consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:  # before Connect creates the topic, the subscription finds none
                if error.code() in {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._PARTITION_EOF}:
                    continue
                raise KafkaException(error)
            raw_key, raw_value = message.key(), message.value()
            key = (
                None
                if raw_key is None
                else self.deserialize(raw_key, SerializationContext(self.topic, MessageField.KEY))
            )
            value = (
                None
                if raw_value is None
                else self.deserialize(raw_value, SerializationContext(self.topic, MessageField.VALUE))
            )
            self.events.append(Event(key, value))
        return self.events


@pytest.fixture
def connector(pg15: PgServer, debezium_env: dict[str, str]) -> Iterator[tuple[Database, Reader]]:
    """A scratch database with a slot, and a Debezium connector streaming from it (topic prefix = its name);
    yields the database and a reader of the table's topic. The connector, slot, database and topics go."""
    with scratch_database(pg15) as db:
        db.execute(SCHEMA)
        name = f"dbz_{db.name}"
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [name])
        reader = Reader(debezium_env, f"{name}.public.item")
        try:
            stack15("debezium-connector", "start", name, db.name, name, "dbz_pub")
            yield db, reader
        finally:
            close_bounded(reader.consumer)
            stack15("debezium-connector", "stop", name)
            delete_topics(debezium_env["CDCD_KAFKA__BOOTSTRAP_SERVERS"], (f"{name}.",))
            registry = SchemaRegistryClient({"url": debezium_env["CDCD_SCHEMA_REGISTRY__URL"]})
            for subject in registry.get_subjects():
                if subject.startswith(f"{name}."):
                    registry.delete_subject(subject)


def test_debezium_streams_changes_to_kafka(connector: tuple[Database, Reader]) -> None:
    db, reader = connector
    db.execute(
        "INSERT INTO item VALUES (1, 'apple', 1.25, '2024-05-03 12:00:00.123456+02', '{red,green}'), "
        "(2, 'pear', NULL, NULL, NULL)"
    )
    db.execute("UPDATE item SET price = 2.50, name = 'big apple' WHERE id = 1")
    db.execute("DELETE FROM item WHERE id = 2")

    # c 1, c 2, u 1, d 2 and the delete's tombstone
    events = reader.read(5)

    assert [(e.key, None if e.value is None else e.value["op"]) for e in events] == [
        ({"id": 1}, "c"),
        ({"id": 2}, "c"),
        ({"id": 1}, "u"),
        ({"id": 2}, "d"),
        ({"id": 2}, None),
    ]
    created, second, updated, deleted = (e.value or {} for e in events[:4])
    assert created["before"] is None
    assert created["after"] == {
        "id": 1,
        "name": "apple",
        "price": Decimal("1.25"),
        "seen": "2024-05-03T10:00:00.123456Z",
        "tags": ["red", "green"],
    }
    assert second["after"] == {"id": 2, "name": "pear", "price": None, "seen": None, "tags": None}
    assert updated["after"] == {**created["after"], "name": "big apple", "price": Decimal("2.50")}
    # REPLICA IDENTITY DEFAULT: a delete's before holds the key only (Debezium puts '' in a NOT NULL text column)
    assert (deleted["before"], deleted["after"]) == (
        {"id": 2, "name": "", "price": None, "seen": None, "tags": None},
        None,
    )
    source = created["source"]
    assert (source["connector"], source["db"], source["schema"], source["table"]) == (
        "postgresql",
        db.name,
        "public",
        "item",
    )
    assert source["version"].startswith("3.6.")
    assert created["source"]["txId"] == second["source"]["txId"] != updated["source"]["txId"]
