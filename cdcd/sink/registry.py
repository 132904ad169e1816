"""The shaper's ``Registry`` at the Kafka edge: schema ids from a Confluent-API schema registry, and topics
created (``kafka.create_topics``) before their first record. Both wait for a service that is away, with the
transport serving acknowledgements and status updates going on meanwhile (a stop request ends the wait); a
refusal stops cdcd (``SinkFailure``): nothing after it was confirmed. A registry request ends by
``schema_registry.timeout_s``: one that is never answered is a registry away."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from cdcd.avro.schema import column_changes
from cdcd.config import KafkaSettings, SchemaRegistrySettings
from cdcd.logging import library_logger
from cdcd.sink import SinkFailure
from cdcd.sink.clients import kafka_away, log_wait

if TYPE_CHECKING:  # the registry's client module (HTTP, TLS) is most of the sink's import: loaded when first used
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

log = structlog.get_logger("cdcd.sink.kafka")

_REGISTRY_RETRY_PAUSE_S = 1.0
# A 409 is asked again this often before it counts as a refusal: two writers registering a new subject at once
# (daemons sharing a topic prefix, the transaction topic) get a 409 "already exists" from Apicurio for the loser;
# the same request then answers with the winner's id. A compatibility refusal answers the same every time.
_CONFLICT_ATTEMPTS = 4
_CONFLICT_PAUSE_S = 0.25
# A topic's creation is asked for again this often while Kafka is away; one request waits at most _TOPIC_REQUEST_S.
_TOPIC_RETRY_PAUSE_S = 1.0
_TOPIC_OPERATION_S = 10.0
_TOPIC_REQUEST_S = 15.0


class Waiting(Protocol):
    """What a wait goes on with (``KafkaTransport``): acknowledgements served, failures raised, status updates."""

    def wait(self, seconds: float) -> None: ...
    def client_error(self, error: KafkaError) -> None: ...


class KafkaRegistry:
    """Schema ids (cached per subject and schema) and the topics made so far."""

    def __init__(self, kafka: KafkaSettings, registry: SchemaRegistrySettings, waiting: Waiting) -> None:
        self.settings = kafka
        self.waiting = waiting
        admin_config: dict[str, Any] = {
            **kafka.client_config(),
            "logger": library_logger("cdcd.librdkafka"),
            "error_cb": waiting.client_error,
        }
        self.admin = AdminClient(admin_config)
        self._registry_config = registry.client_config()
        self._registry: SchemaRegistryClient | None = None
        self._topics: set[str] = set()
        self._schema_ids: dict[tuple[str, str], int] = {}

    @property
    def registry(self) -> SchemaRegistryClient:
        """The registry's client, made as a session starts streaming (its module is loaded by then, not before the
        slot is active: ``KafkaSink.start_session``) or at the first schema; a bad client setting stops cdcd then."""
        if self._registry is None:
            from confluent_kafka.schema_registry import SchemaRegistryClient  # noqa: PLC0415

            self._registry = SchemaRegistryClient(self._registry_config)
        return self._registry

    @registry.setter
    def registry(self, client: SchemaRegistryClient) -> None:
        self._registry = client

    def close(self) -> None:
        del self.admin  # its callbacks point into the transport: gone with it, while the interpreter is whole

    # -- schemas -------------------------------------------------------------------------------------

    def schema_id(self, subject: str, schema: dict[str, Any]) -> int:
        text = json.dumps(schema, sort_keys=True)
        cached = self._schema_ids.get((subject, text))
        if cached is not None:
            return cached
        schema_id = self._register(subject, schema, text)
        self._schema_ids[(subject, text)] = schema_id
        return schema_id

    def _register(self, subject: str, schema: dict[str, Any], text: str) -> int:
        """The id the registry gives ``schema`` under ``subject``. A refusal (incompatible, unauthorized, invalid)
        stops cdcd; a registry that is away or failing (no connection, a timeout, HTTP 5xx) is waited for, with
        status updates going on (a stop request ends the wait; nothing after it was confirmed)."""
        from confluent_kafka.schema_registry import Schema  # noqa: PLC0415 - see registry
        from confluent_kafka.schema_registry.error import SchemaRegistryError  # noqa: PLC0415

        logged_at = None
        conflicts = 0
        while True:
            try:
                schema_id: int = self.registry.register_schema(subject, Schema(text, "AVRO"))
                return schema_id
            except SchemaRegistryError as exc:
                conflicts += exc.http_status_code == 409
                if exc.http_status_code == 409 and conflicts < _CONFLICT_ATTEMPTS:
                    self.waiting.wait(_CONFLICT_PAUSE_S)
                    continue
                if exc.http_status_code < 500:
                    raise SinkFailure(self._refused(subject, schema, exc)) from None
                error = str(exc)
            except Exception as exc:  # the client raises its HTTP library's errors: connection, timeout
                error = str(exc) or type(exc).__name__
            logged_at = log_wait("the schema registry", f"register {subject}", error, logged_at)
            self.waiting.wait(_REGISTRY_RETRY_PAUSE_S)

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

    def _changes_from_registered(self, subject: str, schema: dict[str, Any]) -> list[str]:
        """What differs from the subject's latest registered schema (best effort: for the error message)."""
        try:
            latest = json.loads(self.registry.get_latest_version(subject).schema.schema_str or "{}")
        except Exception:
            return []
        return column_changes(latest, schema)

    # -- topics --------------------------------------------------------------------------------------

    def ensure_topic(self, topic: str) -> None:
        if topic in self._topics:
            return
        if self.settings.create_topics:
            settings = self.settings
            self.create_topic(topic, settings.partitions, dict(settings.topic_config))
        self._topics.add(topic)

    def create_topic(self, topic: str, partitions: int, config: dict[str, str]) -> None:
        """Create ``topic`` unless it exists. While Kafka is away (a broker restarting, no controller yet) the
        request is made again each second, status updates going on, for as long as a record would wait for it; a
        refusal (authorization, an invalid setting, too few brokers) stops cdcd."""
        new = NewTopic(
            topic, num_partitions=partitions, replication_factor=self.settings.replication_factor, config=config
        )
        logged_at = None
        while (error := self._create(new)) is not None:
            if not kafka_away(error):
                raise SinkFailure(f"cannot create topic {topic}: {error.str()}")
            logged_at = log_wait("Kafka", f"create topic {topic}", error.str(), logged_at)
            self.waiting.wait(_TOPIC_RETRY_PAUSE_S)

    def _create(self, new: NewTopic) -> KafkaError | None:
        """One request to create ``new``: None once the topic exists (made now or before), else the error."""
        future = self.admin.create_topics(
            [new], operation_timeout=_TOPIC_OPERATION_S, request_timeout=_TOPIC_REQUEST_S
        )[new.topic]
        while True:
            try:
                future.result(timeout=0.5)
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                return None if error.code() == KafkaError.TOPIC_ALREADY_EXISTS else error
            except TimeoutError:  # meanwhile: client errors (authentication, TLS) and status updates
                self.admin.poll(0)
                self.waiting.wait(0)
                continue
            log.info("topic created", topic=new.topic, partitions=new.num_partitions)
            return None
