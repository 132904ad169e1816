"""The progress topic of exactly-once delivery: one compacted record per slot, written inside every Kafka
transaction beside the data it covers, and read back (``read_committed``) at the start of each session.

The record is JSON (an internal topic: no registry, readable with any console consumer)::

    {"version": 2, "slot": "cdcd", "system_id": "7301...", "flush_lsn": 23456, "position": 23400,
     "snapshot": {"digest": "9f2c...", "queued": 3, "initial": "done"} | null}

``snapshot`` names the snapshot state committed with the data, which the state file keeps
(``StateStore.stage``): the record stays small however many tables are queued, and holds no chunk key. A
version 1 record (read still) carried the state itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from cdcd.logging import library_logger
from cdcd.sink import Committed, SinkFailure
from cdcd.sink.clients import kafka_away

VERSION = 2
_READABLE = (1, 2)
_WINDOWS = (256, 4096, 65536)  # records read back from the end of a partition before reading it all


class ProgressTopicError(SinkFailure):
    """The progress topic is missing, unreadable or holds a record cdcd cannot use: never a silent reset."""


class ProgressTopicUnreachable(ProgressTopicError):
    """Kafka did not answer (away, restarting, a timeout): worth waiting for, unlike a definite error."""


class Missing:
    """The topic does not exist."""


MISSING = Missing()


def encode(slot: str, system_id: str, committed: Committed) -> tuple[bytes, bytes]:
    """The record's key and value."""
    value = {
        "version": VERSION,
        "slot": slot,
        "system_id": system_id,
        "flush_lsn": committed.flush_lsn,
        "position": committed.position,
        "snapshot": committed.snapshot,
    }
    return slot.encode(), json.dumps(value, separators=(",", ":")).encode()


def decode(value: bytes, slot: str, system_id: str, topic: str) -> Committed:
    """The committed position in ``value``, which must be a record of ``slot`` on database system ``system_id``."""
    where = f"progress topic {topic}, slot {slot}"
    try:
        data: Any = json.loads(value)
        version, record_slot, record_system = data["version"], data["slot"], data["system_id"]
        committed = Committed(int(data["flush_lsn"]), int(data["position"]), data["snapshot"])
    except (ValueError, TypeError, KeyError) as exc:
        raise ProgressTopicError(f"{where}: the last record is not a cdcd progress record ({exc!r})") from None
    if version not in _READABLE:
        raise ProgressTopicError(f"{where}: record version {version} is not {VERSION} (written by another cdcd?)")
    if record_slot != slot:
        raise ProgressTopicError(f"{where}: the record keyed {slot!r} names slot {record_slot!r}")
    if record_system != system_id:
        raise ProgressTopicError(
            f"{where}: the last committed position belongs to database system {record_system}, this server is"
            f" {system_id}. Another cluster used the same slot name with this topic: set"
            " kafka.exactly_once.progress_topic (and transactional_id) apart for each source"
        )
    if committed.snapshot is not None and not isinstance(committed.snapshot, dict):
        raise ProgressTopicError(f"{where}: the record's snapshot state is not an object")
    return committed


def read_last(client_config: dict[str, Any], topic: str, slot: str, timeout: float) -> bytes | Missing | None:
    """The value of the last committed record keyed ``slot`` in ``topic`` (None: there is none). Reads the
    end of each partition first, then more of it, then all of it: compaction keeps the topic short, but only
    once segments roll."""
    errors: list[str] = []
    consumer = Consumer(
        {
            **client_config,
            "group.id": f"cdcd-progress-{slot}",  # never committed: offsets are assigned
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "error_cb": lambda e: errors.append(e.str()),
            "logger": library_logger("cdcd.librdkafka"),  # its lines as JSON, not raw on stderr
        }
    )
    try:
        try:
            metadata = consumer.list_topics(topic, timeout=timeout)
        except KafkaException as exc:
            raise _error(topic, exc.args[0]) from None
        described = metadata.topics.get(topic)
        if described is None or (described.error is not None and described.error.code() in _MISSING_CODES):
            return MISSING
        if described.error is not None:
            raise _error(topic, described.error)
        reader = _Reader(consumer, topic, slot.encode(), timeout, errors)
        for partition in sorted(described.partitions):  # a key's records are all in one partition
            found = reader.last(partition)
            if found is not None:
                return found
        return None
    finally:
        consumer.close()


_MISSING_CODES = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})


def _error(topic: str, error: KafkaError | None, why: str = "") -> ProgressTopicError:
    """The error for a failed read: ``Unreachable`` when Kafka did not answer (``error`` None) or answered with
    an error a wait can cure."""
    message = f"cannot read progress topic {topic}: {why or (error.str() if error else '')}"
    if error is None or kafka_away(error):
        return ProgressTopicUnreachable(message)
    return ProgressTopicError(message)


@dataclass
class _Reader:
    consumer: Consumer
    topic: str
    key: bytes
    timeout: float
    errors: list[str]

    def last(self, partition: int) -> bytes | None:
        """The value of the last record keyed ``key`` in ``partition``, read committed."""
        try:
            low, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, partition), self.timeout)
        except KafkaException as exc:
            raise _error(self.topic, exc.args[0]) from None
        end = high
        for window in (*_WINDOWS, None):
            start = low if window is None else max(low, high - window)
            found = self._scan(partition, start, end)
            if found is not None or start == low:
                return found
            end = start
        return None

    def _scan(self, partition: int, start: int, end: int) -> bytes | None:
        """The last record keyed ``key`` at offsets [start, end)."""
        if start >= end:
            return None
        self.consumer.assign([TopicPartition(self.topic, partition, start)])
        found: bytes | None = None
        while True:
            message = self.consumer.poll(self.timeout)
            if message is None:
                cause = f" ({self.errors[-1]})" if self.errors else ""
                raise _error(self.topic, None, f"no answer within {self.timeout:g} s{cause}")
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return found
                raise _error(self.topic, error)
            if (message.offset() or 0) >= end:
                return found
            value = message.value()
            if message.key() == self.key and value is not None:
                found = value
