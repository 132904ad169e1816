"""``cdcd check`` at the Kafka edge: everything about the broker and the schema registry that would stop
``cdcd run``, and whether the registry would take the tables' schemas as they are now. The source database's
checks are in ``cdcd/source/checks.py``; ``cli.py`` (``_check``) gathers both."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from cdcd.avro.schema import column_changes
from cdcd.config import KafkaSettings, SchemaRegistrySettings
from cdcd.logging import library_logger
from cdcd.sink.clients import FATAL_CLIENT_ERRORS


@dataclass
class Compatibility:
    """What the registry says of the schemas the tables have now (``check_compatibility``)."""

    refused: list[str] = field(default_factory=list)  # a table's schema its subject's rule would refuse
    new: list[str] = field(default_factory=list)  # subjects not registered yet (their first version is fine)
    problems: list[str] = field(default_factory=list)  # questions the registry did not answer


def check_compatibility(
    registry: SchemaRegistrySettings, candidates: Iterable[tuple[str, str, dict[str, Any]]], timeout: float = 10
) -> Compatibility:
    """Ask the registry (the Confluent API's compatibility endpoint) whether each (table, subject, schema) would be
    accepted as the subject's next version under its compatibility rule."""
    client = SchemaRegistryClient({**registry.client_config(), "timeout": timeout})
    found = Compatibility()
    for table, subject, schema in candidates:
        try:
            if not client.test_compatibility(subject, Schema(json.dumps(schema, sort_keys=True), "AVRO")):
                found.refused.append(_refusal(client, table, subject, schema))
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:  # no such subject (40401) or no version in it (40402)
                found.new.append(subject)
            else:
                found.problems.append(f"cannot ask the schema registry about {subject}: {exc}")
        except Exception as exc:  # connection errors, timeouts
            found.problems.append(f"cannot ask the schema registry about {subject}: {exc or type(exc).__name__}")
    return found


def _refusal(client: SchemaRegistryClient, table: str, subject: str, schema: dict[str, Any]) -> str:
    """Table ``table``'s schema is refused under ``subject``: what changed, by column."""
    try:
        latest = json.loads(client.get_latest_version(subject).schema.schema_str or "{}")
        changes = "; ".join(column_changes(latest, schema))
    except Exception:  # best effort: the refusal is reported anyway
        changes = ""
    return (
        f"table {table}: the schema registry would refuse its current schema under {subject}"
        f"{f' ({changes})' if changes else ''}: the subject's compatibility rule forbids the change"
    )


def check_kafka(kafka: KafkaSettings, registry: SchemaRegistrySettings, timeout: float = 10) -> list[str]:
    """Every problem that would stop `cdcd run` on the Kafka side: the broker and the schema registry."""
    problems = []
    try:
        broker = _check_broker(kafka, timeout)
        if broker:
            problems.append(broker)
    except KafkaException as exc:
        problems.append(f"cannot reach Kafka at {kafka.bootstrap_servers}: {exc.args[0].str()}")
    try:
        SchemaRegistryClient({**registry.client_config(), "timeout": timeout}).get_subjects()
    except Exception as exc:  # connection errors, HTTP errors and bad URLs all land here
        problems.append(f"schema registry at {registry.url} does not answer the Confluent API: {exc}")
    return problems


# What makes the broker check answer before its timeout: wrong credentials or certificates, or no bootstrap
# server accepting a connection (librdkafka would go on retrying; a check reports what it sees now).
_CHECK_DEFINITE = FATAL_CLIENT_ERRORS | {KafkaError._ALL_BROKERS_DOWN}


def _check_broker(kafka: KafkaSettings, timeout: float) -> str | None:
    """The broker's problem, or None: metadata asked for in quarter-second slices until it comes, the client
    reports a definite error, or ``timeout`` passes."""
    errors: list[KafkaError] = []  # what the client saw: names the cause (authentication, TLS) better than a timeout
    config: dict[str, Any] = {**kafka.client_config(), "logger": library_logger("cdcd.librdkafka"),
                              "error_cb": errors.append}  # fmt: skip
    admin = AdminClient(config)
    deadline = time.monotonic() + timeout
    while True:
        slice_end = min(deadline, time.monotonic() + 0.25)
        try:
            metadata = admin.list_topics(timeout=max(0.05, slice_end - time.monotonic()))
            return None if metadata.brokers else f"Kafka at {kafka.bootstrap_servers} reports no brokers"
        except KafkaException as exc:
            # serves error_cb; an error that comes back at once waits out its slice (not a request per millisecond)
            admin.poll(max(0.0, slice_end - time.monotonic()))
            definite = [e for e in errors if e.code() in _CHECK_DEFINITE or e.fatal()]
            if definite or time.monotonic() >= deadline:
                seen = definite or errors
                named = f" ({seen[-1].str()})" if seen else ""
                return f"cannot reach Kafka at {kafka.bootstrap_servers}: {exc.args[0].str()}{named}"
