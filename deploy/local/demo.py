"""`make demo`: cdcd on the local stack, on a demo workload, showing committed changes flow into Kafka.

Creates the `cdcd_demo` database (afresh each run) and its tables, starts `cdcd run` with config/demo.yaml (Avro
envelopes on `demo.shop.*` topics through the schema registry), waits until it streams (its /status), however
long a cold machine takes, then runs a small shop workload (plain transactions, a large
transaction that PostgreSQL streams before commit, savepoints rolled back, a transaction aborted whole, a
truncate, a logical decoding message; a row filter publishes only orders with id <= 1500), reads the topics
back with a registry-aware consumer and prints what arrived. The Spark job (cdcd.spark, local[2]) runs all along,
started before the workload as it would run in production, and mirrors the topics into Delta tables under a
temporary directory; the demo prints row counts of source and mirror each second, counted from the workload's
last COMMIT, until the mirror has caught up. Finally it stops cdcd with SIGTERM and shows the LSN it confirmed.
It exits 0 only when every kind of event arrived as many times as the workload makes it (``EXPECTED``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

ROOT = Path(__file__).resolve().parents[2]
DB = "cdcd_demo"
PREFIX = "demo"


def stack_env() -> dict[str, str]:
    out = subprocess.run(
        ["bash", "-c", f'eval "$({ROOT}/deploy/local/stack env)" && env -0'], check=True, capture_output=True
    ).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def reset_database(admin_dsn: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", [DB])
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")


def create_tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE SCHEMA shop;"
            "CREATE TABLE shop.customers (id int PRIMARY KEY, name text NOT NULL, city text);"
            "CREATE TABLE shop.orders (id bigserial PRIMARY KEY, customer int, amount numeric(10,2), note text)"
        )


def wait_streaming(daemon: subprocess.Popen[bytes], status_url: str, timeout: float) -> None:
    """Wait until cdcd streams from its slot (its /status says so), however slow the machine: a change committed
    before the slot exists would only reach Kafka through the initial snapshot, as the end state."""
    deadline = time.monotonic() + timeout
    state = "not answering"
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise SystemExit(f"cdcd run exited {daemon.returncode} before it was streaming")
        try:
            with urllib.request.urlopen(status_url, timeout=2) as response:
                state = json.load(response).get("state", "?")
        except (OSError, ValueError) as exc:  # not serving yet
            state = f"not answering ({exc})"
        if state == "streaming":
            return
        time.sleep(0.2)
    raise SystemExit(f"cdcd was not streaming within {timeout:.0f} s (its state: {state})")


def workload(dsn: str) -> float:
    """The shop workload; returns the time.monotonic() of its last COMMIT."""
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO shop.customers VALUES (1, 'Ada', 'London'), (2, 'Grace', 'NYC'), (3, 'Linus', NULL)")
        conn.commit()
        conn.execute("UPDATE shop.customers SET city = 'Helsinki' WHERE id = 3")
        conn.execute("DELETE FROM shop.customers WHERE id = 2")
        conn.commit()
        # Large enough to be streamed with logical_decoding_work_mem = 64kB, with a savepoint rolled back.
        conn.execute("INSERT INTO shop.orders (customer, amount) SELECT 1, g FROM generate_series(1, 2000) g")
        conn.execute("SAVEPOINT oops")
        conn.execute(
            "INSERT INTO shop.orders (customer, amount, note) SELECT 3, g, 'rolled back' FROM generate_series(1, 500) g"
        )
        conn.execute("ROLLBACK TO SAVEPOINT oops")
        conn.execute("SELECT pg_logical_emit_message(true, 'demo', 'batch imported')")
        conn.commit()
        conn.execute(
            "INSERT INTO shop.orders (customer, amount, note) SELECT 2, g, 'aborted' FROM generate_series(1, 800) g"
        )
        conn.rollback()
        conn.execute("TRUNCATE shop.orders")
        conn.commit()
        return time.monotonic()


def reset_topics(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(f"{PREFIX}.")]
    for future in admin.delete_topics(topics).values() if topics else []:
        future.result()
    while topics and any(t.startswith(f"{PREFIX}.") for t in admin.list_topics(timeout=10).topics):
        time.sleep(0.2)


def consume(env: dict[str, str], wanted: int, timeout: float) -> list[tuple[str, Any]]:
    """Read the demo topics through the schema registry until ``wanted`` change events have arrived."""
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": env["CDCD_SCHEMA_REGISTRY__URL"]}))
    consumer = Consumer({"bootstrap.servers": env["CDCD_KAFKA__BOOTSTRAP_SERVERS"], "group.id": f"demo-{time.time()}",
                         "auto.offset.reset": "earliest", "topic.metadata.refresh.interval.ms": 500})  # fmt: skip
    consumer.subscribe([f"^{PREFIX}\\..*"])
    events: list[tuple[str, Any]] = []
    deadline = time.monotonic() + timeout
    try:
        while sum(1 for t, v in events if v is not None and not t.endswith(".transaction")) < wanted:
            if time.monotonic() > deadline:
                break
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            topic = str(message.topic())
            raw = message.value()
            value = None if raw is None else deserialize(raw, SerializationContext(topic, MessageField.VALUE))
            events.append((topic, value))
    finally:
        consumer.close()
    return events


def summarize(events: list[tuple[str, Any]]) -> None:
    print("\n--- first events read back from Kafka (Avro, through the schema registry) ---")
    for topic, value in [e for e in events if e[0].startswith(f"{PREFIX}.shop.")][:4]:
        shown = {k: value[k] for k in ("op", "before", "after")} if value else None
        print(f"{topic}: {shown}")
    print("...")
    counts = Counter((topic, "tombstone" if v is None else v.get("op") or v.get("status")) for topic, v in events)
    print("\n--- events by (topic, op) ---")
    for (topic, op), count in sorted(counts.items()):
        print(f"  {topic:<22} {op:<10} {count}")
    notes = Counter(str(((v or {}).get("after") or {}).get("note")) for _, v in events)
    print(
        f"\nrows from a rolled-back savepoint: {notes['rolled back']}, from an aborted transaction: {notes['aborted']}"
    )
    ids = [((v or {}).get("after") or {}).get("id") for t, v in events if t.endswith(".shop.orders")]
    top = max((i for i in ids if i is not None), default=None)
    print(f"orders published: {len([i for i in ids if i is not None])} of 2000, highest id {top} (filter: id <= 1500)")


# (table, the source rows the mirror must hold: the row filter publishes orders with id <= 1500 only)
MIRRORED = (("customers", "SELECT count(*) FROM shop.customers"),
            ("orders", "SELECT count(*) FROM shop.orders WHERE id <= 1500"))  # fmt: skip


class MirrorCounts:
    """Each mirror table's row count, counted again (by Spark, in the job's JVM) only when the job has committed a
    new version of it: a reader sees a Delta table change at commits only, and counting every second would run a
    Spark job beside each of the mirror job's own on the same two cores."""

    def __init__(self, spark: Any, root: Path) -> None:
        self.spark, self.root = spark, root
        self.seen: dict[str, tuple[int, int]] = {}  # table -> (version, rows)

    def __call__(self) -> list[int]:
        out: list[int] = []
        for table, _ in MIRRORED:
            path = self.root / "shop" / table
            # The table exists once its first commit does (_delta_log/ appears before it: reading then fails).
            version = max((int(p.stem) for p in (path / "_delta_log").glob("*.json") if p.stem.isdigit()), default=-1)
            if version >= 0 and self.seen.get(table, (-1, 0))[0] != version:
                self.seen[table] = (version, self.spark.read.format("delta").load(str(path)).count())
            out.append(self.seen[table][1] if table in self.seen else 0)  # no table yet: no rows yet
        return out


def start_mirror(env: dict[str, str]) -> tuple[Any, Any, Path]:
    """Start the Spark job on the demo topics, as it runs in production: before the changes, all along."""
    from cdcd.spark import Options, session, start  # noqa: PLC0415 - Spark starts only here

    work = Path(tempfile.mkdtemp(prefix="cdcd-demo-spark-"))
    print(f"--- Spark job mirroring {PREFIX}.shop.* into Delta tables in {work}/mirror, from now on ---")
    spark = session("local[2]", env["CDCD_SPARK_JARS"], {"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    options = Options(
        bootstrap_servers=env["CDCD_KAFKA__BOOTSTRAP_SERVERS"],
        topic_prefix=PREFIX,
        registry_url=env["CDCD_SCHEMA_REGISTRY__URL"],
        checkpoint=str(work / "checkpoint"),
        mirror=str(work / "mirror"),
        trigger_interval="1 second",
        max_offsets_per_trigger=5000,
    )
    return spark, start(spark, options), work


def watch_mirror(spark: Any, query: Any, work: Path, dsn: str, committed: float, *, messages: int) -> bool:
    """Print source vs mirror row counts each second until the job has read the table topics' ``messages`` and
    the mirror caught up (at most 180 s)."""
    print(f"\n--- the mirror in {work}/mirror, seconds since the workload's last COMMIT ---")
    caught_up = False
    mirror_counts = MirrorCounts(spark, work / "mirror")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            source = [int(conn.execute(q).fetchone()[0]) for _, q in MIRRORED]  # type: ignore[index]
        while not caught_up and time.monotonic() - committed < 180:
            applied = sum(int(p["numInputRows"]) for p in query.recentProgress)  # Kafka messages read
            counts = mirror_counts()
            shown = ", ".join(f"{t} {m}/{s}" for (t, _), m, s in zip(MIRRORED, counts, source, strict=True))
            print(f"  t={time.monotonic() - committed:4.0f}s  mirror/source rows: {shown}  "
                  f"(Kafka messages read so far: {applied})")  # fmt: skip
            status = query.status  # live, unlike the progress of idle micro-batches (reported every 10 s)
            idle = applied >= messages and not status["isDataAvailable"] and not status["isTriggerActive"]
            caught_up = idle and counts == source
            if not caught_up:
                time.sleep(1)
    finally:
        query.stop()
        spark.stop()
    if caught_up:
        print(f"mirror caught up with the source {time.monotonic() - committed:.0f} s after the last COMMIT")
    else:
        print("the mirror did NOT catch up within 180 s")
    return caught_up


# What the workload must show in Kafka, by (topic, op): 3 inserts, an update and a delete of customers, the 1500
# orders of the streamed transaction that the row filter passes (none from the rolled-back savepoint or the aborted
# transaction), the truncate, and the logical decoding message.
EXPECTED = {
    (f"{PREFIX}.shop.customers", "c"): 3,
    (f"{PREFIX}.shop.customers", "u"): 1,
    (f"{PREFIX}.shop.customers", "d"): 1,
    (f"{PREFIX}.shop.orders", "c"): 1500,
    (f"{PREFIX}.shop.orders", "t"): 1,
    (f"{PREFIX}.message", "m"): 1,
}


def missing_events(events: list[tuple[str, Any]]) -> list[str]:
    """What the topics lack or hold beyond ``EXPECTED`` (empty when the demo showed every kind of event)."""
    counts = Counter(
        (topic, v.get("op")) for topic, v in events if v is not None and not topic.endswith(".transaction")
    )
    wrong = [f"{t} op {op}: {counts[t, op]} of {n}" for (t, op), n in EXPECTED.items() if counts[t, op] != n]
    wrong += [f"{t} op {op}: {n} unexpected" for (t, op), n in counts.items() if (t, op) not in EXPECTED]
    return wrong


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="cdcd on the local stack, on a demo workload")
    parser.add_argument("--no-mirror", action="store_true", help="without the Spark job (the tests' quick run)")
    parser.add_argument(
        "--start-delay", type=float, default=0.0, help="start cdcd this many seconds late (a slow machine, in tests)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = stack_env()
    reset_database(env["CDCD_SOURCE__DSN"])
    reset_topics(env["CDCD_KAFKA__BOOTSTRAP_SERVERS"])
    dsn = env["CDCD_SOURCE__DSN"].replace("dbname=cdcd", f"dbname={DB}")
    create_tables(dsn)
    child_env = {**os.environ, **env, "CDCD_SOURCE__DSN": dsn + " options='-c logical_decoding_work_mem=64kB'",
                 "CDCD_SNAPSHOT__STATE_DIR": tempfile.mkdtemp(prefix="cdcd-demo-state-")}  # fmt: skip
    cmd = [sys.executable, "-m", "cdcd", "run", "--config", str(ROOT / "config/demo.yaml")]
    mirror = None if args.no_mirror else start_mirror(env)  # before the changes, all along, as in production
    print("$", " ".join(cmd[2:]))
    if args.start_delay:
        cmd = ["sh", "-c", f'sleep {args.start_delay:g} && exec "$0" "$@"', *cmd]
    daemon = subprocess.Popen(cmd, env=child_env)
    mirrored, watched = True, False
    try:
        wait_streaming(daemon, "http://127.0.0.1:9187/status", 300)
        committed = workload(dsn)
        events = consume(env, sum(EXPECTED.values()), 90)
        summarize(events)
        if mirror is not None:
            messages = sum(1 for t, _ in events if t.startswith(f"{PREFIX}.shop."))  # tombstones too
            watched = True  # watch_mirror stops the job whatever happens
            mirrored = watch_mirror(*mirror, dsn, committed, messages=messages)
        time.sleep(1.5)  # one more status interval so the confirmed LSN is visible
    finally:
        if mirror is not None and not watched:
            mirror[1].stop()
            mirror[0].stop()
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(60)
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn, pg_current_wal_lsn() FROM pg_replication_slots WHERE slot_name = %s", [DB]
        ).fetchone()
    confirmed, wal = row if row else ("?", "?")
    print(f"\ncdcd run exited {code}; slot {DB} confirmed up to {confirmed} (server WAL at {wal})")
    wrong = missing_events(events)
    for line in wrong:
        print(f"NOT AS EXPECTED: {line}")
    return 0 if code == 0 and not wrong and mirrored else 1


if __name__ == "__main__":
    sys.exit(main())
