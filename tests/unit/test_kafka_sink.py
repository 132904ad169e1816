"""The Kafka sink's edges that need no broker: `cdcd check` against a port nothing listens on, and what schema
registration does when the registry refuses or is away."""

from __future__ import annotations

import time
from typing import Any

import pytest
import structlog
from confluent_kafka.schema_registry.error import SchemaRegistryError

from cdcd.config import KafkaSettings, SchemaRegistrySettings
from cdcd.sink import SinkFailure
from cdcd.sink import kafka as sink_kafka
from cdcd.sink.kafka import KafkaSink, check_kafka

SCHEMA = {"type": "record", "name": "Value", "fields": [{"name": "id", "type": "int"}]}


def test_a_refused_broker_is_named_without_waiting_out_the_timeout() -> None:
    """librdkafka retries a refused connection for ever; the check reports it once every bootstrap server has
    refused (all brokers down), long before its timeout, and names the registry's problem too."""
    kafka = KafkaSettings(bootstrap_servers="127.0.0.1:9", producer={"log_level": 0})
    began = time.monotonic()
    problems = check_kafka(kafka, SchemaRegistrySettings(url="http://127.0.0.1:9"), timeout=60)
    assert time.monotonic() - began < 30
    assert len(problems) == 2, problems
    assert problems[0].startswith("cannot reach Kafka at 127.0.0.1:9: ")
    assert "brokers are down" in problems[0]
    assert problems[1].startswith("schema registry at http://127.0.0.1:9 does not answer")


class Answers:
    """A registry client that answers register_schema from a list: an exception to raise, or an id."""

    def __init__(self, *answers: Exception | int) -> None:
        self.answers = list(answers)
        self.calls = 0

    def register_schema(self, subject: str, schema: Any) -> int:
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def get_latest_version(self, subject: str) -> Any:
        raise SchemaRegistryError(404, 40401, "Subject not found")


@pytest.fixture
def sink(monkeypatch: pytest.MonkeyPatch) -> KafkaSink:
    monkeypatch.setattr(sink_kafka, "_REGISTRY_RETRY_PAUSE_S", 0.0)
    kafka = KafkaSettings(bootstrap_servers="127.0.0.1:9", producer={"log_level": 0})
    return KafkaSink(kafka, SchemaRegistrySettings(url="http://127.0.0.1:9"))


def test_a_registry_that_is_away_or_failing_is_waited_for(sink: KafkaSink) -> None:
    away = ConnectionRefusedError(111, "Connection refused")  # what the client's HTTP library raises
    sink.registry = Answers(away, SchemaRegistryError(503, 50301, "unavailable"), away, 7)  # type: ignore[assignment]
    beats: list[int] = []
    sink.keep_alive = lambda: beats.append(1)
    with structlog.testing.capture_logs() as logs:
        assert sink.schema_id("t-value", SCHEMA) == 7
    assert len(beats) == 3  # status updates (and a stop request) go on while it waits
    waits = [e for e in logs if e["event"] == "waiting for the schema registry"]
    assert [e["to"] for e in waits] == ["register t-value"]  # logged once per 30 s
    assert sink.schema_id("t-value", SCHEMA) == 7  # cached: no second registration
    assert sink.registry.calls == 4  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("status", "hint"),
    [(409, "compatibility rule forbids this change"), (401, "Unauthorized"), (422, "Invalid schema")],
)
def test_a_refusal_stops_and_names_the_cause(sink: KafkaSink, status: int, hint: str) -> None:
    message = {409: "Incompatible schema", 401: "Unauthorized", 422: "Invalid schema"}[status]
    sink.registry = Answers(SchemaRegistryError(status, status * 100, message))  # type: ignore[assignment]
    with pytest.raises(SinkFailure, match="schema registry refused the new schema for t-value") as refused:
        sink.schema_id("t-value", SCHEMA)
    assert hint in str(refused.value)
    assert ("compatibility" in str(refused.value)) == (status == 409)
    assert "nothing after it was confirmed" in str(refused.value)
