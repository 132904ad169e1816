"""The Kafka sink's edges that need no broker: `cdcd check` against a port nothing listens on, what schema
registration does when the registry refuses or is away, and how the lane's shaped records are produced."""

from __future__ import annotations

import concurrent.futures
import math
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import structlog
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.schema_registry.error import SchemaRegistryError

from cdcd.batches import Shaped
from cdcd.config import KafkaSettings, SchemaRegistrySettings
from cdcd.ledger import Ledger
from cdcd.lsn import pg_to_unix_us
from cdcd.shaping import EventShaper
from cdcd.sink import SinkFailure
from cdcd.sink import registry as sink_registry
from cdcd.sink import transport as sink_transport
from cdcd.sink.checks import check_kafka
from cdcd.sink.delivery import AtLeastOnceDelivery
from cdcd.sink.kafka import KafkaSink
from cdcd.sink.registry import KafkaRegistry
from cdcd.sink.transport import KafkaTransport

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


def at_least_once(kafka: KafkaSettings) -> KafkaSink:
    """The sink as ``cli.py`` wires it (at least once)."""
    transport = KafkaTransport(kafka)
    topics = KafkaRegistry(kafka, SchemaRegistrySettings(url="http://127.0.0.1:9"), transport)
    shaper = EventShaper(kafka.topic_prefix, topics)
    return KafkaSink(kafka, shaper, transport, topics, AtLeastOnceDelivery(kafka, transport))


@pytest.fixture
def sink(monkeypatch: pytest.MonkeyPatch) -> KafkaSink:
    monkeypatch.setattr(sink_registry, "_REGISTRY_RETRY_PAUSE_S", 0.0)
    monkeypatch.setattr(sink_registry, "_CONFLICT_PAUSE_S", 0.0)
    monkeypatch.setattr(sink_registry, "_TOPIC_RETRY_PAUSE_S", 0.0)
    return at_least_once(KafkaSettings(bootstrap_servers="127.0.0.1:9", producer={"log_level": 0}))


def test_a_registry_that_is_away_or_failing_is_waited_for(sink: KafkaSink) -> None:
    away = ConnectionRefusedError(111, "Connection refused")  # what the client's HTTP library raises
    registry = sink.topics
    registry.registry = Answers(away, SchemaRegistryError(503, 50301, "unavailable"), away, 7)  # type: ignore[assignment]
    beats: list[int] = []
    sink.transport.keep_alive = lambda: beats.append(1)
    with structlog.testing.capture_logs() as logs:
        assert registry.schema_id("t-value", SCHEMA) == 7
    assert len(beats) == 3  # status updates (and a stop request) go on while it waits
    waits = [e for e in logs if e["event"] == "waiting for the schema registry"]
    assert [e["to"] for e in waits] == ["register t-value"]  # logged once per 30 s
    assert registry.schema_id("t-value", SCHEMA) == 7  # cached: no second registration
    assert registry.registry.calls == 4  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("status", "hint"),
    [(409, "compatibility rule forbids this change"), (401, "Unauthorized"), (422, "Invalid schema")],
)
def test_a_refusal_stops_and_names_the_cause(sink: KafkaSink, status: int, hint: str) -> None:
    message = {409: "Incompatible schema", 401: "Unauthorized", 422: "Invalid schema"}[status]
    refusal = SchemaRegistryError(status, status * 100, message)
    sink.topics.registry = Answers(*[refusal] * 4)  # type: ignore[assignment]
    with pytest.raises(SinkFailure, match="schema registry refused the new schema for t-value") as refused:
        sink.topics.schema_id("t-value", SCHEMA)
    assert sink.topics.registry.calls == (4 if status == 409 else 1)  # type: ignore[attr-defined]
    assert hint in str(refused.value)
    assert ("compatibility" in str(refused.value)) == (status == 409)
    assert "nothing after it was confirmed" in str(refused.value)


def test_a_lost_race_to_create_a_subject_gets_the_winners_id(sink: KafkaSink) -> None:
    """Two writers registering a new subject at once: Apicurio answers the loser 409 "already exists"; asked
    again, it answers with the id the winner got."""
    exists = SchemaRegistryError(409, 409, "An artifact with ID 't-value' in group 'null' already exists.")
    sink.topics.registry = Answers(exists, 5)  # type: ignore[assignment]
    assert sink.topics.schema_id("t-value", SCHEMA) == 5


# What a KRaft broker in controlled shutdown answers (Kafka 4.3, seen in CI), and a replication factor too high.
FENCED = KafkaError(
    KafkaError.INVALID_REPLICATION_FACTOR,
    "Unable to replicate the partition 1 time(s): All brokers are currently fenced, or have all their log"
    " directories cordoned.",
)
TOO_FEW_BROKERS = KafkaError(
    KafkaError.INVALID_REPLICATION_FACTOR,
    "Unable to replicate the partition 3 time(s): The target replication factor of 3 cannot be reached because"
    " only 1 broker(s) are registered or some brokers have all their log directories cordoned.",
)


class Admin:
    """An admin client whose create_topics answers from a list: a KafkaError (or its code) to fail with, ``None``
    for success, or ``"pending"`` for a request that has not finished when its result is first asked for."""

    def __init__(self, *answers: KafkaError | int | str | None) -> None:
        self.answers = list(answers)
        self.calls = 0

    def create_topics(self, new: list[Any], **timeouts: float) -> dict[str, concurrent.futures.Future[None]]:
        assert timeouts["request_timeout"] >= timeouts["operation_timeout"]
        self.calls += 1
        answer = self.answers.pop(0)
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        if answer == "pending":
            threading.Timer(0.7, future.set_result, [None]).start()
        elif isinstance(answer, int):
            future.set_exception(KafkaException(KafkaError(answer)))
        elif isinstance(answer, KafkaError):
            future.set_exception(KafkaException(answer))
        else:
            future.set_result(None)
        return {new[0].topic: future}

    def poll(self, timeout: float) -> int:
        return 0


def test_a_topic_is_created_once_kafka_is_back(sink: KafkaSink) -> None:
    """Kafka away or restarting while a new table's topic is created (found by CI: cdcd stopped after 60 s, and
    on a broker in controlled shutdown): the request is made again, status updates going on, for as long as Kafka
    is away."""
    away = [KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError.NOT_CONTROLLER, KafkaError._DESTROY_BROKER]
    sink.topics.admin = Admin(*away, FENCED, "pending")  # type: ignore[assignment]
    beats: list[int] = []
    sink.transport.keep_alive = lambda: beats.append(1)
    with structlog.testing.capture_logs() as logs:
        sink.topics.ensure_topic("p.public.t")
    assert sink.topics.admin.calls == 6  # type: ignore[attr-defined]
    assert len(beats) >= 6
    waits = [e for e in logs if e["event"] == "waiting for Kafka"]
    assert [e["to"] for e in waits] == ["create topic p.public.t"]  # logged once per 30 s
    assert [e["topic"] for e in logs if e["event"] == "topic created"] == ["p.public.t"]
    sink.topics.ensure_topic("p.public.t")
    assert sink.topics.admin.calls == 6  # type: ignore[attr-defined]


def test_a_topic_that_exists_is_not_waited_for(sink: KafkaSink) -> None:
    sink.topics.admin = Admin(KafkaError.TOPIC_ALREADY_EXISTS)  # type: ignore[assignment]
    sink.topics.ensure_topic("p.public.t")
    assert sink.topics.admin.calls == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "refusal",
    [KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.POLICY_VIOLATION, KafkaError.INVALID_CONFIG, TOO_FEW_BROKERS],
)
def test_a_refused_topic_stops_and_names_it(sink: KafkaSink, refusal: KafkaError | int) -> None:
    sink.topics.admin = Admin(refusal)  # type: ignore[assignment]
    with pytest.raises(SinkFailure, match=r"cannot create topic p\.public\.t: "):
        sink.topics.ensure_topic("p.public.t")
    assert sink.topics.admin.calls == 1  # type: ignore[attr-defined]


class Queue:
    """A producer whose local queue holds ``room`` messages; ``poll`` delivers them (``error``: each fails)."""

    def __init__(self, room: int, error: KafkaError | None = None) -> None:
        self.room, self.error = room, error
        self.queued: list[tuple[str, bytes | None, bytes | None, Any]] = []
        self.delivered: list[tuple[str, bytes | None, bytes | None]] = []

    def produce(  # noqa: PLR0917 - confluent-kafka's signature, which the sink calls positionally
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        callback: Any = None,
        on_delivery: Any = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        assert (partition, timestamp) == (-1, 0)
        if len(self.queued) >= self.room:
            raise BufferError("Local: Queue full")
        self.queued.append((topic, key, value, callback or on_delivery))

    def poll(self, timeout: float = 0) -> int:
        queued, self.queued = self.queued, []
        for topic, key, value, acked in queued:
            self.delivered.append((topic, key, value))
            acked(self.error, Delivered(topic))
        return len(queued)

    def __len__(self) -> int:
        return len(self.queued)


class Delivered:
    def __init__(self, topic: str) -> None:
        self._topic = topic

    def topic(self) -> str:
        return self._topic


COMMIT_TIMES = [800_000_000_000_000 + i * 1_000 for i in range(4)]  # four transactions' (PostgreSQL µs)


def shaped(count: int, end_lsn: int = 0x5000) -> Shaped:
    records: list[tuple[str, bytes | None, bytes | None]] = [
        ("cdc.public.t", b"k%d" % i, None if i % 3 == 2 else b"v%d" % i) for i in range(count)
    ]
    return Shaped(records, 0x4000, end_lsn, COMMIT_TIMES)


def test_shaped_records_are_produced_in_order_and_confirmed_once_all_are_acknowledged(sink: KafkaSink) -> None:
    """The lane's unit: every record produced, in order, even through a full queue (waited for, never dropped);
    its end LSN confirmable only after the last acknowledgement."""
    queue = Queue(room=7)
    sink.transport.producer = queue  # type: ignore[assignment]
    finished: list[float] = []
    progress = Ledger(on_done=finished.append)
    batch = shaped(20)
    sink.write_shaped(batch, progress)
    assert queue.delivered + [q[:3] for q in queue.queued] == batch.records
    assert progress.flushed_lsn == 0  # the last records are still queued
    assert sink.wake_in() == sink_transport.ACK_POLL_S  # the loop comes back soon to serve their acknowledgements
    assert finished == []
    queue.poll()
    assert progress.flushed_lsn == 0x5000
    # the commit-to-acknowledgement histogram: one observation per transaction, each from its own commit
    assert finished == [pg_to_unix_us(t) / 1e6 for t in COMMIT_TIMES]
    assert sink.wake_in() == math.inf
    assert sink.produced == 20


def test_a_shaped_record_that_fails_stops_the_sink_and_nothing_is_confirmed(sink: KafkaSink) -> None:
    queue = Queue(room=100, error=KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    sink.transport.producer = queue  # type: ignore[assignment]
    progress = Ledger()
    sink.write_shaped(shaped(3), progress)
    with pytest.raises(SinkFailure, match=r"delivery to cdc\.public\.t failed"):
        sink.poll()
    assert progress.flushed_lsn == 0


class Reporting(Queue):
    """A producer made with a default delivery report for failures only (``delivery.report.only.error``)."""

    def __init__(self, room: int, report: Any, error: KafkaError | None = None) -> None:
        super().__init__(room, error)
        self.report = report

    def poll(self, timeout: float = 0) -> int:
        queued, self.queued = self.queued, []
        for topic, key, value, acked in queued:
            assert acked is None  # no callback per message: that is the point
            self.delivered.append((topic, key, value))
            if self.error is not None:
                self.report(self.error, Delivered(topic))
        return len(queued)


def whole_setup(
    monkeypatch: pytest.MonkeyPatch, error: KafkaError | None = None
) -> tuple[KafkaSink, Queue, list[Reporting], Any]:
    """A sink whose transactions of 5 changes or more are produced whole, by a ``Reporting`` producer."""
    monkeypatch.setattr(sink_registry, "_REGISTRY_RETRY_PAUSE_S", 0.0)
    kafka = KafkaSettings(bootstrap_servers="127.0.0.1:9", producer={"log_level": 0}, whole_transaction_changes=5)
    sink = at_least_once(kafka)
    single = Queue(room=100)
    sink.transport.producer = single  # type: ignore[assignment]
    made: list[Reporting] = []

    def producer(fixed: dict[str, Any]) -> Reporting:
        assert fixed["delivery.report.only.error"] is True
        made.append(Reporting(room=3, report=fixed["on_delivery"], error=error))
        return made[-1]

    monkeypatch.setattr(sink.transport, "make_producer", producer)

    def transaction(txn: Any, changes: Any, emit: Any, emit_many: Any) -> None:
        assert not single.queued  # every earlier message is in Kafka before the first of these is produced
        records = [("cdc.public.t", b"w%d" % i, b"x%d" % i) for i in range(txn.change_count)]
        emit(*records[0], None)  # as the shaper does: one by one, and a list at a time from the compiled shaper
        emit_many(records[1:])

    monkeypatch.setattr(sink.shaper, "transaction", transaction)
    return (
        sink,
        single,
        made,
        lambda count, end: SimpleNamespace(xid=7, change_count=count, commit_lsn=end - 8, end_lsn=end, commit_time=0),
    )


def test_a_large_transaction_is_produced_whole_after_every_earlier_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a callback per message: in Kafka whole (through a full queue) when write_transaction returns,
    after everything produced before it; smaller ones as before, by the first producer."""
    sink, single, made, txn = whole_setup(monkeypatch)
    progress = Ledger()
    sink.write_shaped(shaped(4, end_lsn=0x4100), progress)
    assert single.queued
    assert progress.flushed_lsn == 0
    sink.write_transaction(txn(8, 0x6000), iter(()), progress)
    assert progress.flushed_lsn == 0x6000  # nothing of it is left anywhere
    (whole,) = made
    assert whole.delivered == [("cdc.public.t", b"w%d" % i, b"x%d" % i) for i in range(8)]
    assert not whole.queued
    assert sink.transport.producer is single  # type: ignore[comparison-overlap]
    sink.write_transaction(txn(4, 0x7000), iter(()), progress)  # below the threshold: acknowledged one by one
    assert len(single.queued) == 4
    assert progress.flushed_lsn == 0x6000
    single.poll()
    assert progress.flushed_lsn == 0x7000
    sink.write_transaction(txn(5, 0x8000), iter(()), progress)
    assert len(made) == 1
    assert progress.flushed_lsn == 0x8000
    assert sink.produced == 4 + 8 + 4 + 5


def test_a_failure_in_a_whole_transaction_stops_the_sink_and_nothing_is_confirmed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sink, single, _, txn = whole_setup(monkeypatch, error=KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    progress = Ledger()
    with pytest.raises(SinkFailure, match=r"delivery to cdc\.public\.t failed"):
        sink.write_transaction(txn(6, 0x6000), iter(()), progress)
    assert progress.flushed_lsn == 0
    assert sink.transport.producer is single  # type: ignore[comparison-overlap]


@pytest.mark.parametrize("client", ["signals", "progress"])
def test_librdkafka_lines_of_the_consumers_go_through_the_log_not_raw_to_stderr(
    client: str, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker that refuses connections: the signal topic's and the progress topic's consumers had librdkafka
    print its own ``%3|…|FAIL|rdkafka#consumer-2|`` lines into `cdcd run`'s JSON log."""
    from cdcd.sink import progress_topic, signal_topic  # noqa: PLC0415 - only this test

    config = {"bootstrap.servers": "127.0.0.1:9", "socket.connection.setup.timeout.ms": 1000}
    if client == "signals":
        monkeypatch.setattr(signal_topic, "_METADATA_TIMEOUT_S", 2.0)
        topic = signal_topic.SignalTopic(config, "signals", "g", create=False)
        assert topic.poll() == []
        topic.close()
    else:
        with pytest.raises(progress_topic.ProgressTopicUnreachable):
            progress_topic.read_last(config, "progress", "slot", 2.0)
    assert "|FAIL|" not in capfd.readouterr().err
