"""Kafka side of the integration harness: a `cdcd run` process and a consumer reading its topics through the
schema registry."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from cdcd.shaping import NEW_KEY_HEADER, OLD_KEY_HEADER
from tests.integration.conftest import Database, PgServer, cdcd_env, close_bounded, scratch_database
from tests.procs import spawn

# Before cdcd creates the topics the pattern subscription finds none; end of partition is not an error.
_TRANSIENT = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._PARTITION_EOF}
KEY_HEADERS = (OLD_KEY_HEADER, NEW_KEY_HEADER)


@dataclass
class Event:
    topic: str
    key: dict[str, Any] | None
    value: dict[str, Any] | None  # None: a tombstone
    # __debezium.oldkey / __debezium.newkey of a key change's create / delete, decoded as keys are
    moved: dict[str, dict[str, Any]] = field(default_factory=dict)
    partition: int = 0
    offset: int = 0


class Run:
    """A `cdcd run` process producing to Kafka, and a consumer of everything under its topic prefix."""

    def __init__(self, db: Database, env: dict[str, str], tmp_path: Path) -> None:
        self.db, self.env, self.tmp_path = db, env, tmp_path
        self.prefix = f"it_{db.name}"
        self.slot = f"s_{db.name}"
        self.log = tmp_path / "run.log"
        self.proc: subprocess.Popen[bytes] | None = None
        registry = SchemaRegistryClient({"url": env["CDCD_SCHEMA_REGISTRY__URL"]})
        self._deserialize = AvroDeserializer(registry)
        self._consumer: Consumer | None = None
        self.events: list[Event] = []
        self.positions: dict[tuple[str, int], int] = {}  # next offset to read, per topic partition

    @property
    def consumer(self) -> Consumer:
        """The consumer of the prefix's topics, made on first use: a test that never reads through it leaves no
        group member behind that was never polled (closing one can block in librdkafka)."""
        if self._consumer is None:
            self._consumer = self._new_consumer()
        return self._consumer

    def _new_consumer(self) -> Consumer:
        consumer = Consumer(
            {
                "bootstrap.servers": self.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"],
                "group.id": f"{self.prefix}-{uuid.uuid4().hex[:6]}",
                "auto.offset.reset": "earliest",
                "topic.metadata.refresh.interval.ms": 500,
                # quiet: tests stop Kafka on purpose, and its reconnect errors would bury the failure's message
                "log_level": 2,
            }
        )
        consumer.subscribe([f"^{self.prefix}\\..*"])
        return consumer

    def reread(self) -> None:
        """Read every topic again from the start with a new consumer group."""
        if self._consumer is not None:
            close_bounded(self._consumer)
        self._consumer = None
        self.events = []
        self.positions = {}

    def start(self, source: dict[str, Any] | None = None, extra: dict[str, Any] | None = None, **kafka: Any) -> Run:
        """Start `cdcd run`; ``source`` keys override the source section, ``extra`` adds top-level sections."""
        config = {
            "source": {
                "dsn": self.db.dsn(self.db.server.streaming_options),
                "slot": self.slot,
                "publications": [{"name": "cdcd_pub"}],
                "status_interval_s": 0.3,
                **(source or {}),
            },
            "sink": {"kind": "kafka", "flush_timeout_s": 20},
            "kafka": {
                "bootstrap_servers": self.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"],
                "topic_prefix": self.prefix,
                **kafka,
            },
            "schema_registry": {"url": self.env["CDCD_SCHEMA_REGISTRY__URL"]},
            "buffer": {"spill_dir": str(self.tmp_path / "spill"), "memory_limit": "256KiB"},
            "snapshot": {"state_dir": str(self.tmp_path / "state"), "chunk_size": 2000},
            "log": {"format": "json"},
            "metrics": {"listen": "127.0.0.1:0"},
            **(extra or {}),
        }
        path = self.tmp_path / "run.yaml"
        path.write_text(yaml.safe_dump(config))
        env = cdcd_env()
        with self.log.open("ab") as log:
            self.proc = spawn(
                [sys.executable, "-m", "cdcd", "run", "--config", str(path)],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=env,
            )
        deadline = time.monotonic() + 30
        while not self.db.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active", [self.slot]):
            self._check_alive()
            assert time.monotonic() < deadline, f"never streamed:\n{self.log.read_text()[-3000:]}"
            time.sleep(0.1)
        self._expect_row_stage()
        return self

    def _expect_row_stage(self, timeout: float = 30) -> None:
        """The row stage CDCD_IMPL asks for is the one running (the default: the compiled one). The slot can be
        active before the daemon logs its ``connected`` line (an initial snapshot's slot is made first)."""
        want = os.environ.get("CDCD_IMPL") or "native"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log.read_text().splitlines():
                if line.startswith("{") and json.loads(line).get("event") == "connected":
                    assert json.loads(line)["row_stage"] == want, line
                    return
            self._check_alive()
            time.sleep(0.05)
        raise AssertionError(f"no 'connected' line:\n{self.log.read_text()[-3000:]}")

    def logged(self, event: str) -> dict[str, Any]:
        """The last log line of ``event`` (JSON logs)."""
        found: list[dict[str, Any]] = [json.loads(x) for x in self.log.read_text().splitlines() if x.startswith("{")]
        matching = [line for line in found if line.get("event") == event]
        assert matching, f"no {event!r} line:\n{self.log.read_text()[-3000:]}"
        return matching[-1]

    def metrics_url(self, timeout: float = 30) -> str:
        """http://127.0.0.1:<port> of the daemon's metrics endpoint (it picks a free port and logs it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log.read_text().splitlines():
                if line.startswith("{") and json.loads(line).get("event") == "serving metrics":
                    return f"http://127.0.0.1:{json.loads(line)['port']}"
            self._check_alive()
            time.sleep(0.1)
        raise AssertionError(f"no 'serving metrics' line:\n{self.log.read_text()[-3000:]}")

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"cdcd run exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Signal cdcd and wait for its exit code; a SIGTERM that does not end it with 0 prints the log's tail
        (a test's ``assert run.stop() == 0`` shows the code only)."""
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = None
        if sig == signal.SIGTERM and code != 0:
            print(f"cdcd run: exit {code} after SIGTERM:\n{self.log.read_text()[-3000:]}", file=sys.stderr)
        if code is None:
            raise AssertionError("cdcd run did not stop within 60 s of the signal")
        return code

    def consume_until(self, done: Callable[[list[Event]], bool], timeout: float = 90) -> list[Event]:
        deadline = time.monotonic() + timeout
        check = True
        while not (check and done(self.events)):
            assert time.monotonic() < deadline, self._stalled(f"timed out with {len(self.events)} events")
            message = self.consumer.poll(0.5)
            # `done` looks at every event: ask it when the topics are drained for now, or every 2000 events.
            check = message is None or len(self.events) % 2000 == 0
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() in _TRANSIENT:
                    continue
                raise KafkaException(error)
            event = self._event(message)
            self.events.append(event)
            self.positions[event.topic, event.partition] = event.offset + 1
        return self.events

    def _stalled(self, what: str) -> str:
        """``what``, with what tells a stalled consumer from a stalled daemon: the consumer's partitions and
        positions, and the daemon's state and log's tail."""
        assignment = [(tp.topic, tp.partition) for tp in self.consumer.assignment()]
        if self.proc is None:
            state = "not started"
        elif self.proc.poll() is None:
            state = "running"
        else:
            state = f"exited {self.proc.returncode}"
        log = self._stacks_and_log()
        gauges = self._gauges() if state == "running" else ""
        return f"{what}; consumer assigned {assignment}, read to {self.positions}; cdcd {state}:{gauges}\n{log}"

    _STALL_GAUGES = ("cdcd_received_lsn", "cdcd_flushed_lsn", "cdcd_in_flight_messages", "cdcd_events_total")

    def _gauges(self) -> str:
        """The daemon's positions and messages in flight (what tells a producer waiting on Kafka from a reader
        waiting on WAL), best effort."""
        try:
            url = self.metrics_url(timeout=1)
            text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
        except (AssertionError, OSError) as exc:
            return f" (no metrics: {exc})"
        lines = [x for x in text.splitlines() if x.startswith(self._STALL_GAUGES)]
        return "\n" + "\n".join(lines)

    def _stacks_and_log(self) -> str:
        """The log's tail, with every thread's stack first written to it (SIGUSR1) if cdcd is still running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(1)
        return self.log.read_text()[-12000:] if self.log.exists() else "(no log)"

    def _event(self, message: Message) -> Event:
        topic = str(message.topic())
        key_ctx = SerializationContext(topic, MessageField.KEY)
        value_ctx = SerializationContext(topic, MessageField.VALUE)
        key = None if message.key() is None else self._deserialize(message.key(), key_ctx)
        value = None if message.value() is None else self._deserialize(message.value(), value_ctx)
        headers: list[tuple[str, bytes]] = message.headers() or []  # type: ignore[assignment]
        # the key-change headers carry Avro keys; others (Debezium's __debezium.context.*) are left alone
        moved = {name: self._deserialize(raw, key_ctx) for name, raw in headers if raw and name in KEY_HEADERS}
        return Event(topic, key, value, moved, message.partition() or 0, message.offset() or 0)

    def read_to_end(self, isolation: str = "read_committed", timeout: float = 120) -> list[Event]:
        """Every message under the prefix, from the start to the current end of every partition, read by a new
        consumer with ``isolation`` (read_committed never passes an open Kafka transaction)."""
        bootstrap = self.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"]
        return [self._event(m) for m in read_partitions(bootstrap, self.prefix, isolation, timeout)]

    def sync(self, timeout: float = 90) -> list[Event]:
        """Everything cdcd will publish for what was committed so far: emit a message, wait until cdcd confirmed
        its LSN (so Kafka acknowledged every event before it), then consume to the end of every topic."""
        self.wait_confirmed(timeout)
        ends = self._high_watermarks()
        return self.consume_until(lambda _: all(self.positions.get(tp, 0) >= end for tp, end in ends.items()), timeout)

    def writes_to(self) -> Database:
        """Where the test's writes go: the source (a standby's primary: test_standby.py)."""
        return self.db

    def wait_confirmed(self, timeout: float = 90) -> None:
        """Until cdcd confirmed the position of a message emitted now: Kafka has everything committed before."""
        lsn = self.writes_to().execute("SELECT pg_logical_emit_message(true, 'test', 'sync')")[0][0]
        deadline = time.monotonic() + timeout
        query = "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s"
        while not self.db.execute(query, [lsn, self.slot])[0][0]:
            self._check_alive()
            assert time.monotonic() < deadline, f"cdcd never confirmed {lsn}:\n{self._stacks_and_log()}"
            time.sleep(0.1)

    def _high_watermarks(self) -> dict[tuple[str, int], int]:
        metadata = self.consumer.list_topics(timeout=10)
        ends = {}
        for name, topic in metadata.topics.items():
            if name.startswith(f"{self.prefix}."):
                for partition in topic.partitions:
                    _, high = self.consumer.get_watermark_offsets(TopicPartition(name, partition), timeout=10)
                    ends[name, partition] = high
        return ends

    def close(self) -> None:
        if self._consumer is not None:
            close_bounded(self._consumer)
        if self.proc is not None and self.proc.poll() is None:
            self.stop(signal.SIGKILL)
        delete_topics(self.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"], (f"{self.prefix}.", f"__cdcd-progress-{self.prefix}"))


def delete_topics(bootstrap: str, prefixes: tuple[str, ...]) -> None:
    """Delete the topics whose names start with one of ``prefixes``, best effort and bounded: a broker that keeps
    every test's topics starts ever slower (it loads each partition; 17.7 s with 4,727 topics, 8.5 s with ~100)
    and serves ever larger metadata to every pattern subscription."""
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        names = [name for name in admin.list_topics(timeout=10).topics if name.startswith(prefixes)]
        if names:
            for future in admin.delete_topics(names, request_timeout=15).values():
                future.result(timeout=20)
    except (KafkaException, concurrent.futures.TimeoutError) as exc:
        print(f"kafka harness: topics {prefixes} not deleted: {exc}", file=sys.stderr)


def read_partitions(
    bootstrap: str, prefix: str, isolation: str = "read_committed", timeout: float = 120
) -> list[Message]:
    """Every message of the topics ``<prefix>.*``, from the start to the current end of every partition, read by
    a new consumer with ``isolation``."""
    return list(each_message(bootstrap, prefix, isolation, timeout))


def each_message(
    bootstrap: str, prefix: str, isolation: str = "read_committed", timeout: float = 120
) -> Iterator[Message]:
    """``read_partitions`` one message at a time (millions of messages need not be held at once)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{prefix}-{uuid.uuid4().hex[:6]}",
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    try:
        topics = consumer.list_topics(timeout=10).topics
        partitions = [
            TopicPartition(name, p, OFFSET_BEGINNING)
            for name, topic in topics.items()
            if name.startswith(f"{prefix}.")
            for p in topic.partitions
        ]
        consumer.assign(partitions)
        remaining = {(tp.topic, tp.partition) for tp in partitions}
        deadline = time.monotonic() + timeout
        while remaining:
            assert time.monotonic() < deadline, f"{isolation}: no end of {sorted(remaining)} in {timeout} s"
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                remaining.discard((str(message.topic()), message.partition() or 0))
            elif error is not None:
                raise KafkaException(error)
            else:
                yield message
    finally:
        close_bounded(consumer)


@contextlib.contextmanager
def scratch_run(pg: PgServer, schema: str, env: dict[str, str], tmp_path: Path) -> Iterator[Run]:
    """A Run (not started) on a new database of ``pg`` holding ``schema``; closed and dropped afterwards."""
    with scratch_database(pg) as db:
        db.execute(schema)
        r = Run(db, env, tmp_path)
        try:
            yield r
        finally:
            r.close()
