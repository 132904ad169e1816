"""Latency from a PostgreSQL COMMIT to the event in Kafka, at a steady rate of one-row transactions, for each
``kafka.delivery`` mode.

One scratch database (``bench_<random>``) with ``lat (id bigint PRIMARY KEY, pad text)`` in a publication.
Per round and per mode (``--modes``, default ``at_least_once,exactly_once``, alternating), in this order:

1. ``cdcd run`` starts (its own slot and topic prefix, ``snapshot.mode: never``) and is streaming;
2. a consumer in this process (``isolation.level=read_committed``, ``fetch.wait.max.ms`` 5) is assigned the
   table topic at its end;
3. one connection commits ``--rate`` transactions per second (default 2,000) for ``--seconds`` (default 20),
   each ``INSERT INTO lat VALUES (id, ...)`` in autocommit, paced to a schedule; the time each COMMIT returned
   is kept by id;
4. the consumer reads until it has every id; an event's latency is the time it was received minus the time its
   COMMIT returned (same clock, same host). The first ``--warmup`` seconds are left out.

Reported per mode and round: the achieved commit rate, p50 / p90 / p99 / max latency in ms, and cdcd's CPU; then
where the milliseconds go (``PARTS``), p50 / p99 of each event's components from the clocks it carries: its commit
timestamp (``source.ts_us``) -> the time cdcd shaped it (the envelope's ``ts_us``) -> the broker's append (cdcd's
topics get ``message.timestamp.type: LogAppendTime`` from the generated config, ms) -> this process's receipt.
Targets (issue 31): p99 <= 15 ms at_least_once, <= 50 ms exactly_once (Sequin publishes 253 ms p99). This is an
upper bound of cdcd's own latency: it includes the consumer's fetch and this process's scheduling on a loaded
two-core machine.

``--reference CMD`` runs every mode with that cdcd command too (e.g. ../previous/.venv/bin/cdcd), alternating with
this tree's in each round; ``--producer linger.ms=20`` (repeatable) and ``--exactly-once '{"commit_interval_ms":
50}'`` set the generated config's ``kafka.producer`` and ``kafka.exactly_once`` for both.

    .venv/bin/python benchmarks/latency.py                     # 2 rounds x 2 modes, 20 s each (~2 min)
    .venv/bin/python benchmarks/latency.py --rate 500 --seconds 10 --rounds 1

Servers as kafka.py (``--dsn``, ``--bootstrap-servers``, ``--registry``). The database, slots and topics are
removed at the end. Exits 1 if an event is missing or cdcd fails, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml
from confluent_kafka import OFFSET_END, TIMESTAMP_LOG_APPEND_TIME, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.schema_registry import SchemaRegistryClient
from drain import DEFAULT_DSN, BenchError, _cdcd_command, _connect, _cpu_s, _kill, _log_tail
from fastavro import parse_schema, schemaless_reader
from kafka import DEFAULT_BOOTSTRAP, DEFAULT_REGISTRY
from psycopg import sql
from psycopg.conninfo import make_conninfo

MODES = ("at_least_once", "exactly_once")
TARGET_P99_MS = {"at_least_once": 15.0, "exactly_once": 50.0}  # issue 31


@dataclass
class Result:
    mode: str
    round_no: int
    rate: float  # commits per second achieved
    latencies_ms: list[float]
    cdcd_cpu_s: float | None
    parts_ms: dict[str, list[float]] = field(default_factory=dict)  # the components, as PARTS
    who: str = "this tree"

    def quantile(self, q: float) -> float:
        return _quantile(self.latencies_ms, q)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# Where an event's milliseconds go, from the clocks it carries (one host, one wall clock): the commit timestamp
# (source.ts_us), the time cdcd shaped it (the envelope's ts_us), the broker's append (the topics' timestamps are
# LogAppendTime, in ms) and the time this process received it.
PARTS = {
    "pg_to_cdcd": "PG commit timestamp -> cdcd shaped it (walsender decoding and sending, cdcd reading, decoding)",
    "cdcd_to_broker": "shaped -> broker appended (the producer's linger and batching, the request; ms clock)",
    "broker_to_consumer": "appended -> received (acks; exactly-once: the transaction commit; the consumer's fetch)",
}


def zigzag_long(data: bytes, at: int = 5) -> int:
    """The Avro long after a Confluent header: the id in a record key ``{"id": long}``."""
    shift = result = 0
    while True:
        byte = data[at]
        result |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1)
        shift += 7


@dataclass
class Reader:
    """Receive times by id, from a read_committed consumer of one topic."""

    bootstrap: str
    topic: str
    registry: str
    received: dict[int, int] = field(default_factory=dict)  # id -> time.perf_counter_ns() at receipt
    clocks: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)  # id -> commit, shaped, append, recv
    schemas: dict[int, Any] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    error: str | None = None

    def start(self) -> threading.Thread:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"{self.topic}-latency",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 5,
            }
        )
        consumer.assign([TopicPartition(self.topic, 0, OFFSET_END)])
        thread = threading.Thread(target=self._run, args=(consumer,), daemon=True)
        thread.start()
        return thread

    def _run(self, consumer: Consumer) -> None:
        try:
            while not self.stop.is_set():
                message = consumer.poll(0.05)  # consume(n) would wait for n messages or its timeout
                now, wall_us = time.perf_counter_ns(), time.time_ns() // 1000
                if message is None or message.error() is not None:
                    continue  # an error: the topic's partition not there yet (cdcd makes it with the first event)
                key, value = message.key(), message.value()
                if key is not None and value is not None:
                    self.received[zigzag_long(key)] = now
                    self._clocks(zigzag_long(key), value, message.timestamp(), wall_us)
        except KafkaException as exc:
            self.error = str(exc)
        finally:
            consumer.close()

    def _clocks(self, key: int, value: bytes, timestamp: tuple[int, int], wall_us: int) -> None:
        schema_id = int.from_bytes(value[1:5], "big")
        schema = self.schemas.get(schema_id)
        if schema is None:
            text = SchemaRegistryClient({"url": self.registry}).get_schema(schema_id).schema_str
            schema = self.schemas[schema_id] = parse_schema(json.loads(text or "{}"))
        envelope = schemaless_reader(io.BytesIO(value[5:]), schema, None)
        kind, append_ms = timestamp
        if kind == TIMESTAMP_LOG_APPEND_TIME and isinstance(envelope, dict):
            commit_us = envelope["source"]["ts_us"] or envelope["source"]["ts_ms"] * 1000
            self.clocks[key] = (commit_us, envelope["ts_us"], append_ms * 1000, wall_us)


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args, self.workdir = args, workdir
        self.database = f"bench_{os.urandom(4).hex()}"
        self.dsn = make_conninfo(args.dsn, dbname=self.database)
        self.admin = _connect(args.dsn)
        self.kafka = AdminClient({"bootstrap.servers": args.bootstrap_servers})
        self.slots: list[str] = []
        self.topics: list[str] = []
        self.next_id = 0

    def setup(self) -> None:
        self.admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))
        with _connect(self.dsn) as conn:
            conn.execute("CREATE TABLE lat (id bigint PRIMARY KEY, pad text)")
            conn.execute("CREATE PUBLICATION lat_pub FOR TABLE lat")

    def round(self, mode: str, round_no: int, who: str = "this tree") -> Result:
        prefix = f"lat{self.database.removeprefix('bench')}-{mode}-{round_no}{'-ref' if who == 'reference' else ''}"
        slot = prefix.replace("-", "_")
        topic = f"{prefix}.public.lat"
        self.slots.append(slot)
        self.topics += [topic, f"__cdcd-progress-{prefix}"]
        log = self.workdir / f"{slot}.log"
        command = [self.args.reference] if who == "reference" else _cdcd_command()
        proc = self._start_cdcd(command, mode, prefix, slot, log)
        try:
            self._commit(1)  # cdcd makes the topic and registers the schemas: not timed
            self._wait_topic(topic, proc, log)
            reader = Reader(self.args.bootstrap_servers, topic, self.args.registry)
            thread = reader.start()
            time.sleep(1.0)  # the consumer is assigned and fetching
            committed, rate = self._steady_load()
            deadline = time.monotonic() + 60
            while not committed.keys() <= reader.received.keys():
                if time.monotonic() > deadline or proc.poll() is not None:
                    missing = len(committed.keys() - reader.received.keys())
                    raise BenchError(f"{mode}: {missing} events never arrived:\n{_log_tail(log)}")
                time.sleep(0.05)
            reader.stop.set()
            thread.join()
            cpu = _cpu_s(proc.pid)
        finally:
            _kill(proc)
        warm = self.args.warmup * self.args.rate
        counted = [i for n, i in enumerate(committed) if n >= warm]
        latencies = [(reader.received[i] - committed[i]) / 1e6 for i in counted]
        clocks = [reader.clocks[i] for i in counted if i in reader.clocks]
        parts = {
            "pg_to_cdcd": [(shaped - commit) / 1000 for commit, shaped, _, _ in clocks],
            "cdcd_to_broker": [(append - shaped) / 1000 for _, shaped, append, _ in clocks],
            "broker_to_consumer": [(received - append) / 1000 for _, _, append, received in clocks],
        }
        return Result(mode, round_no, rate, latencies, cpu, parts, who)

    def _start_cdcd(self, command: list[str], mode: str, prefix: str, slot: str, log: Path) -> subprocess.Popen[bytes]:
        config = {
            "source": {
                "dsn": self.dsn,
                "slot": slot,
                "publications": [{"name": "lat_pub"}],
                "status_interval_s": 1,
            },
            "sink": {"kind": "kafka"},
            "kafka": {
                "bootstrap_servers": self.args.bootstrap_servers,
                "topic_prefix": prefix,
                "delivery": mode,
                "topic_config": {"message.timestamp.type": "LogAppendTime"},  # the broker's append time: PARTS
                "producer": dict(self.args.producer),
                **({"exactly_once": self.args.exactly_once} if self.args.exactly_once else {}),
            },
            "schema_registry": {"url": self.args.registry},
            "snapshot": {"mode": "never", "state_dir": str(self.workdir / "state")},
            "log": {"format": "json"},
        }
        path = self.workdir / f"{slot}.yaml"
        path.write_text(yaml.safe_dump(config))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CDCD_")}
        with log.open("wb") as err:
            proc = subprocess.Popen(
                [*command, "run", "--config", str(path)], stdout=subprocess.DEVNULL, stderr=err, env=env
            )
        deadline = time.monotonic() + 60
        while b'"streaming"' not in log.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                _kill(proc)
                raise BenchError(f"cdcd did not start streaming:\n{_log_tail(log)}")
            time.sleep(0.05)
        return proc

    def _wait_topic(self, topic: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        deadline = time.monotonic() + 60
        while topic not in self.kafka.list_topics(timeout=10).topics:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"cdcd never made {topic}:\n{_log_tail(log)}")
            time.sleep(0.1)
        time.sleep(1.0)  # and its first event is committed

    def _commit(self, count: int) -> None:
        with _connect(self.dsn) as conn:
            for _ in range(count):
                self.next_id += 1
                conn.execute("INSERT INTO lat VALUES (%s, 'warm')", [self.next_id])

    def _steady_load(self) -> tuple[dict[int, int], float]:
        """Commit at ``--rate`` for ``--seconds``; the perf_counter_ns each COMMIT returned at, by id."""
        args = self.args
        committed: dict[int, int] = {}
        total = int(args.rate * args.seconds)
        with _connect(self.dsn) as conn:
            conn.execute("SET synchronous_commit = on")
            start = time.perf_counter()
            for n in range(total):
                due = start + n / args.rate
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                self.next_id += 1
                conn.execute("INSERT INTO lat VALUES (%s, 'x')", [self.next_id])
                committed[self.next_id] = time.perf_counter_ns()
            rate = total / (time.perf_counter() - start)
        return committed, rate

    def cleanup(self) -> list[str]:
        problems = []
        for slot in self.slots:
            try:
                self.admin.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                    [slot],
                )
            except psycopg.Error as exc:
                problems.append(f"cannot drop slot {slot}: {exc}")
        try:
            self.admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.database)))
        except psycopg.Error as exc:
            problems.append(f"cannot drop database {self.database}: {exc}")
        existing = set(self.kafka.list_topics(timeout=10).topics)
        doomed = [t for t in self.topics if t in existing]
        for topic, future in (self.kafka.delete_topics(doomed, operation_timeout=30) if doomed else {}).items():
            try:
                future.result(timeout=60)
            except KafkaException as exc:
                problems.append(f"cannot delete topic {topic}: {exc}")
        self.admin.close()
        return problems


def report(results: list[Result]) -> None:
    print(
        f"{'mode':<14} {'cdcd':<10} {'round':>5} {'commits/s':>10} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8}"
        f" {'max ms':>8} cdcd CPU"
    )
    for r in results:
        cpu = "-" if r.cdcd_cpu_s is None else f"{r.cdcd_cpu_s:.1f} s"
        print(
            f"{r.mode:<14} {r.who:<10} {r.round_no:>5} {r.rate:>10,.0f} {r.quantile(0.5):>8.1f}"
            f" {r.quantile(0.9):>8.1f} {r.quantile(0.99):>8.1f} {max(r.latencies_ms):>8.1f} {cpu}"
        )
    print("\nwhere the milliseconds go, p50 / p99 of each component (one wall clock):")
    for name, text in PARTS.items():
        print(f"  {name}: {text}")
    print(f"{'mode':<14} {'cdcd':<10} {'round':>5} " + " ".join(f"{name:>20}" for name in PARTS))
    for r in results:
        cells = []
        for name in PARTS:
            values = r.parts_ms.get(name) or [math.nan]
            cells.append(f"{_quantile(values, 0.5):>9.1f} / {_quantile(values, 0.99):>7.1f}")
        print(f"{r.mode:<14} {r.who:<10} {r.round_no:>5} " + " ".join(cells))
    for mode in dict.fromkeys(r.mode for r in results):
        for who in dict.fromkeys(r.who for r in results):
            p99s = [r.quantile(0.99) for r in results if r.mode == mode and r.who == who]
            p50s = [r.quantile(0.5) for r in results if r.mode == mode and r.who == who]
            p99 = statistics.median(p99s)
            verdict = "met" if p99 <= TARGET_P99_MS[mode] else "NOT met"
            print(
                f"{mode} ({who}): median p50 {statistics.median(p50s):.1f} ms, p99 {p99:.1f} ms"
                f" (target <= {TARGET_P99_MS[mode]:.0f} ms: {verdict})"
            )


def _setting(text: str) -> tuple[str, str | int | float]:
    key, _, value = text.partition("=")
    for kind in (int, float):
        try:
            return key, kind(value)
        except ValueError:
            continue
    return key, value


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("CDCD_SOURCE__DSN", DEFAULT_DSN))
    parser.add_argument(
        "--bootstrap-servers", default=os.environ.get("CDCD_KAFKA__BOOTSTRAP_SERVERS", DEFAULT_BOOTSTRAP)
    )
    parser.add_argument("--registry", default=os.environ.get("CDCD_SCHEMA_REGISTRY__URL", DEFAULT_REGISTRY))
    parser.add_argument("--modes", default=",".join(MODES), help="kafka.delivery modes, comma-separated")
    parser.add_argument("--rate", type=float, default=2000, help="commits per second (default 2000)")
    parser.add_argument("--seconds", type=float, default=20, help="seconds of steady load per run (default 20)")
    parser.add_argument("--warmup", type=float, default=2, help="seconds left out at the start (default 2)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every mode (default 2)")
    parser.add_argument(
        "--reference", default=None, help="also run this cdcd command (e.g. ../previous/.venv/bin/cdcd), alternating"
    )
    parser.add_argument(
        "--producer",
        action="append",
        default=[],
        type=_setting,
        metavar="KEY=VALUE",
        help="a kafka.producer setting for both (e.g. linger.ms=5), repeatable",
    )
    parser.add_argument("--exactly-once", type=json.loads, default=None, help="kafka.exactly_once as JSON")
    parser.add_argument("--keep-workdir", action="store_true")
    args = parser.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or not set(args.modes) <= set(MODES):
        parser.error(f"--modes: choose from {', '.join(MODES)}")
    if args.rate <= 0 or args.seconds <= args.warmup or args.rounds < 1:
        parser.error("--rate > 0, --seconds > --warmup and --rounds >= 1 please")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="cdcd-latency-"))
    bench = Bench(args, workdir)
    results: list[Result] = []
    failed = False
    try:
        bench.setup()
        for round_no in range(1, args.rounds + 1):
            for mode in args.modes:
                whos = ["this tree", "reference"] if args.reference else ["this tree"]
                for who in whos if round_no % 2 else whos[::-1]:
                    results.append(bench.round(mode, round_no, who))
                    print(f"latency: {mode} round {round_no} ({who}) done", file=sys.stderr)
    except (BenchError, psycopg.Error, KafkaException) as exc:
        print(f"latency: {exc}", file=sys.stderr)
        failed = True
    finally:
        for problem in bench.cleanup():
            print(f"latency: cleanup: {problem}", file=sys.stderr)
            failed = True
    if results:
        report(results)
    print(f"latency: logs in {workdir}" if args.keep_workdir or failed else "", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
