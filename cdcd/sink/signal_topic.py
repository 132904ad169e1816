"""The signal topic (``signals.kafka.topic``): its records, read from the offsets the snapshot state keeps.

The consumer is assigned its partitions and never commits to a group: where to go on is part of the snapshot
state (``SnapshotState.signal_offsets``), which an exactly-once sink commits with the data and an at-least-once
one saves in the state file, so a signal is acted on once, also across restarts. Reads are ``read_committed``
and never block: a topic that is missing (and cdcd may create it) is created with one partition; Kafka away is
logged and tried again later, never an error of the daemon.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import structlog
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cdcd.logging import library_logger
from cdcd.snapshot.signals import SignalRecord

log = structlog.get_logger("cdcd.signals")

_METADATA_TIMEOUT_S = 2.0  # the replication loop waits this long at most for the topic's partitions
_RETRY_S = 30.0  # between attempts to find the topic while Kafka is away
_BATCH = 100  # records read per poll


class SignalTopic:
    def __init__(self, client_config: dict[str, Any], topic: str, group: str, create: bool) -> None:
        self.topic, self.create = topic, create
        self._client = client_config
        self._consumer = Consumer(
            {
                **client_config,
                "group.id": group,  # never committed: offsets are assigned from the snapshot state
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "logger": library_logger("cdcd.librdkafka"),  # its lines as JSON, not raw on stderr
            }
        )
        self._offsets: dict[str, int] = {}
        self._assigned = False
        self._next_try = 0.0
        self._quiet_until = 0.0  # no read error is logged again before then

    def start(self, offsets: Mapping[str, int]) -> None:
        """Read from ``offsets`` (partition -> next offset; a partition not in it from its beginning)."""
        self._offsets, self._assigned, self._next_try = dict(offsets), False, 0.0
        self._consumer.unassign()
        self._assign()

    def poll(self) -> list[SignalRecord]:
        """The records that arrived since the last poll (none while the topic cannot be read)."""
        if not self._assigned and not self._assign():
            return []
        out = []
        for message in self._consumer.consume(_BATCH, timeout=0):
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF and time.monotonic() >= self._quiet_until:
                    self._quiet_until = time.monotonic() + _RETRY_S  # a topic gone would say so at every poll
                    log.warning("cannot read the signal topic now", topic=self.topic, error=error.str())
                continue
            out.append(SignalRecord(message.partition() or 0, message.offset() or 0, message.key(), message.value()))
        return out

    def close(self) -> None:
        self._consumer.close()

    def _assign(self) -> bool:
        now = time.monotonic()
        if now < self._next_try:
            return False
        self._next_try = now + _RETRY_S
        partitions = self._partitions()
        if partitions is None:
            return False
        self._consumer.assign(
            [TopicPartition(self.topic, p, self._offsets.get(str(p), OFFSET_BEGINNING)) for p in partitions]
        )
        self._assigned = True
        log.info("reading signals", topic=self.topic, partitions=len(partitions), offsets=self._offsets)
        return True

    def _partitions(self) -> list[int] | None:
        try:
            metadata = self._consumer.list_topics(self.topic, timeout=_METADATA_TIMEOUT_S)
        except KafkaException as exc:
            log.warning("cannot read the signal topic's metadata; trying again later", error=exc.args[0].str())
            return None
        described = metadata.topics.get(self.topic)
        if described is not None and described.error is None and described.partitions:
            return sorted(described.partitions)
        if not self.create:
            log.error("the signal topic does not exist (kafka.create_topics is off): create it", topic=self.topic)
            return None
        self._create()
        return None  # assigned at the next try, once the topic is there

    def _create(self) -> None:
        config: dict[str, Any] = {**self._client, "logger": library_logger("cdcd.librdkafka")}
        admin = AdminClient(config)
        future = admin.create_topics([NewTopic(self.topic, num_partitions=1)], operation_timeout=10)[self.topic]
        try:
            future.result(timeout=_METADATA_TIMEOUT_S)
            log.info("topic created", topic=self.topic, partitions=1)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                log.warning("cannot create the signal topic", topic=self.topic, error=exc.args[0].str())
        except TimeoutError:
            log.warning("the signal topic is not created yet", topic=self.topic)
        self._next_try = time.monotonic() + 1.0
