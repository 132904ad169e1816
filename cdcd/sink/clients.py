"""What the Kafka-side clients share: which errors mean the configuration is wrong and which mean Kafka is away,
and the logged wait."""

from __future__ import annotations

import time

import structlog
from confluent_kafka import KafkaError

log = structlog.get_logger("cdcd.sink.kafka")

# librdkafka errors that mean the configuration is wrong (credentials, certificates), not that Kafka is away.
FATAL_CLIENT_ERRORS = frozenset({KafkaError._AUTHENTICATION, KafkaError._SSL})
# Errors of a broker that is away or not ready yet, whatever their retriable flag (librdkafka marks few of them).
_AWAY_CODES = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._RESOLVE,
        KafkaError._DESTROY_BROKER,  # a request to a broker that left the metadata (in controlled shutdown)
        KafkaError._NODE_UPDATE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.NOT_CONTROLLER,
        KafkaError.BROKER_NOT_AVAILABLE,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
    }
)
WAITING_LOG_S = 30.0  # how often a wait for Kafka or the schema registry is logged


def log_wait(service: str, what: str, error: str, logged_at: float | None) -> float:
    """Log a wait for ``service`` (Kafka, the schema registry) at most every ``WAITING_LOG_S``; the time it was
    last logged."""
    now = time.monotonic()
    if logged_at is not None and now - logged_at < WAITING_LOG_S:
        return logged_at
    log.warning(f"waiting for {service}", to=what, error=error)
    return now


def kafka_away(error: KafkaError) -> bool:
    """Whether ``error`` means Kafka is away or not ready (wait for it), not a refusal (stop). A KRaft cluster
    whose brokers are all fenced (starting, or in controlled shutdown) answers a topic's creation with
    INVALID_REPLICATION_FACTOR, as it does a replication factor above its brokers; only the message tells them
    apart ("All brokers are currently fenced", Kafka 3.3 to 4.x)."""
    if error.retriable() or error.code() in _AWAY_CODES:
        return True
    return error.code() == KafkaError.INVALID_REPLICATION_FACTOR and "currently fenced" in error.str()
