"""The local stack's Kafka and schema registry work with the real client libraries cdcd uses."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from tests.integration.conftest import STACK, close_bounded, stack_env

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    for component in ("kafka", "registry"):
        subprocess.run([str(STACK), "up", component], check=True, env=os.environ.copy())
    return stack_env("15")


def test_kafka_round_trip(env: dict[str, str]) -> None:
    bootstrap = env["CDCD_KAFKA__BOOTSTRAP_SERVERS"]
    topic = f"stack-test-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(timeout=30)
    delivered: list[str] = []
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    for i in range(10):
        producer.produce(topic, key=str(i), value=f"v{i}", on_delivery=lambda err, msg: delivered.append(str(err)))
    assert producer.flush(30) == 0
    assert delivered == ["None"] * 10
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    values: list[bytes] = []
    try:
        while len(values) < 10:
            message = consumer.poll(30)
            assert message is not None, f"timed out after {len(values)} messages"
            if message.error():
                raise KafkaException(message.error())
            value = message.value()
            assert isinstance(value, bytes)
            values.append(value)
    finally:
        close_bounded(consumer)
    assert values == [f"v{i}".encode() for i in range(10)]
    admin.delete_topics([topic])


def test_registry_speaks_the_confluent_api(env: dict[str, str]) -> None:
    client = SchemaRegistryClient({"url": env["CDCD_SCHEMA_REGISTRY__URL"]})
    subject = f"stack-test-{uuid.uuid4().hex[:8]}-value"
    record = {"type": "record", "name": "T", "namespace": "cdcd.test", "fields": [{"name": "id", "type": "int"}]}
    schema_id = client.register_schema(subject, Schema(json.dumps(record), "AVRO"))
    fetched = client.get_schema(schema_id)
    assert fetched.schema_str is not None
    assert json.loads(fetched.schema_str) == record
    assert client.get_latest_version(subject).schema_id == schema_id
    evolved = {**record, "fields": [*record["fields"], {"name": "v", "type": ["null", "string"], "default": None}]}
    second = client.register_schema(subject, Schema(json.dumps(evolved), "AVRO"))
    assert second != schema_id
    assert [v for v in client.get_versions(subject)] == [1, 2]
