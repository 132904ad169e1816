"""What the Kafka-side clients share: the errors that mean the configuration is wrong, and the logged wait."""

from __future__ import annotations

import time

import structlog
from confluent_kafka import KafkaError

log = structlog.get_logger("cdcd.sink.kafka")

# librdkafka errors that mean the configuration is wrong (credentials, certificates), not that Kafka is away.
FATAL_CLIENT_ERRORS = frozenset({KafkaError._AUTHENTICATION, KafkaError._SSL})
WAITING_LOG_S = 30.0  # how often a wait for Kafka or the schema registry is logged


def log_wait(service: str, what: str, error: str, logged_at: float | None) -> float:
    """Log a wait for ``service`` (Kafka, the schema registry) at most every ``WAITING_LOG_S``; the time it was
    last logged."""
    now = time.monotonic()
    if logged_at is not None and now - logged_at < WAITING_LOG_S:
        return logged_at
    log.warning(f"waiting for {service}", to=what, error=error)
    return now
