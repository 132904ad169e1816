"""cdcd.spark end to end on the real stack, PostgreSQL 15 only (Spark is slow): PostgreSQL → `cdcd run` → Kafka →
the Spark job → Delta mirror tables, which must equal the source tables row for row after a mixed workload,
across runs of the job that resume from its checkpoint, one of them killed mid-stream."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from cdcd.spark.job import LOCAL_CONF, BatchWriter, Options, session, start
from tests.integration.conftest import STACK, Database, PgServer
from tests.integration.kafka_harness import Run, scratch_run
from tests.procs import spawn

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("spark")]  # one worker: see conftest.py

SCHEMA = """
CREATE SCHEMA shop;
CREATE TABLE shop.items (id int PRIMARY KEY, v text NOT NULL, n int, price numeric(10,2), at timestamptz,
    local timestamp, day date, big text, tags text[], ref uuid, raw bytea, ratio float8);
ALTER TABLE shop.items ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE pairs (a int, b text, x int, PRIMARY KEY (a, b));
CREATE TABLE audit (id int NOT NULL, v text);
ALTER TABLE audit REPLICA IDENTITY FULL; -- no primary key: a keyless topic, mirrored with --key
CREATE PUBLICATION cdcd_pub FOR TABLE shop.items, pairs, audit;
"""
TABLES = {"shop.items": ("id",), "public.pairs": ("a", "b"), "public.audit": ("id",)}
BIG = "".join(uuid.uuid4().hex for _ in range(400))  # 12,800 characters, stored out of line (not compressed)


@pytest.fixture(scope="session")
def env15(kafka_env: dict[str, str]) -> dict[str, str]:
    subprocess.run([str(STACK), "up", "spark"], check=True, env=os.environ.copy())
    return kafka_env


# The short-lived job JVMs the tests start (a killed job, a cluster's driver and executor) compile with C1 only: a
# micro-batch or two, all warm-up, which C2's compiling (threads of their own on two cores) slows. C1 alone gets a
# 48 MiB code cache by default, which Spark, Delta and Iceberg fill: the JIT then stops and the JVM runs on
# interpreted, many times slower (the shared session did so 89 s into a CI run, and its jobs never finished):
# these JVMs get the tiered default's 240 MiB. The session every Spark test shares keeps the default JIT, as a
# long-running job does.
QUICK_JIT = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
JOB_JAVA_OPTIONS = f"{LOCAL_CONF['spark.driver.extraJavaOptions']} {QUICK_JIT}"  # the job's own, and C1


@pytest.fixture(scope="session")
def spark(env15: dict[str, str]) -> Iterator[SparkSession]:
    """One local session for every Spark test module (test_spark_cluster's gets this one back from getOrCreate)."""
    conf = {"spark.ui.enabled": "false"}
    s = session("local[2]", env15["CDCD_SPARK_JARS"], conf)
    s.sparkContext.setLogLevel("WARN")
    yield s
    s.stop()


@pytest.fixture
def run15(pg15: PgServer, env15: dict[str, str], tmp_path: Path) -> Iterator[Run]:
    with scratch_run(pg15, SCHEMA, env15, tmp_path) as r:
        yield r


def first_part(db: Database) -> None:
    with db.connect() as conn:
        conn.execute(
            "INSERT INTO shop.items SELECT g, 'v' || g, g, g * 1.25, '2024-03-01 12:00:00+02'::timestamptz + g * "
            "interval '1 hour', '2024-03-01 12:00:00'::timestamp - g * interval '1 day', date '2024-01-01' + g, "
            "NULL, ARRAY['a' || g, NULL, 'b'], gen_random_uuid(), decode(md5(g::text), 'hex'), g / 3.0 "
            "FROM generate_series(1, 300) g"
        )
        conn.execute("UPDATE shop.items SET big = %s || id WHERE id <= 20", [BIG])
        conn.execute("UPDATE shop.items SET n = n + 1000 WHERE id <= 10")  # big not sent: unchanged TOAST
        conn.execute("INSERT INTO pairs SELECT g % 7, 'k' || g, g FROM generate_series(1, 100) g")
        conn.execute("INSERT INTO audit SELECT g, 'a' || g FROM generate_series(1, 50) g")
        conn.execute("UPDATE audit SET v = 'changed' WHERE id % 5 = 0")
        conn.execute("DELETE FROM audit WHERE id % 7 = 0")
        conn.execute("UPDATE audit SET id = id + 1000 WHERE id BETWEEN 1 AND 3")  # FULL: one update, old row whole
        conn.execute("DELETE FROM shop.items WHERE id BETWEEN 280 AND 290")
        conn.execute("UPDATE shop.items SET id = id + 1000 WHERE id BETWEEN 270 AND 275")  # key changes
        conn.execute("UPDATE shop.items SET id = id + 5000 WHERE id BETWEEN 16 AND 18")  # key changes, big kept
        # One transaction large enough to be streamed (64kB work mem), savepoints rolled back in it.
        conn.execute("BEGIN")
        conn.execute("INSERT INTO shop.items (id, v) SELECT g, 'streamed' FROM generate_series(2000, 3500) g")
        conn.execute("SAVEPOINT a")
        conn.execute("INSERT INTO shop.items (id, v) SELECT g, 'rolled back' FROM generate_series(8000, 8600) g")
        conn.execute("UPDATE shop.items SET v = 'rolled back' WHERE id <= 50")
        conn.execute("ROLLBACK TO SAVEPOINT a")
        conn.execute("UPDATE shop.items SET v = 'kept', ratio = NULL WHERE id BETWEEN 100 AND 150")
        conn.execute("DELETE FROM shop.items WHERE id BETWEEN 3000 AND 3100")
        conn.execute("COMMIT")


def second_part(db: Database) -> None:
    with db.connect() as conn:
        conn.execute("ALTER TABLE shop.items ADD COLUMN note text")
        conn.execute("UPDATE shop.items SET note = 'noted ' || id, n = -n WHERE id % 3 = 0 AND id < 400")
        conn.execute("UPDATE shop.items SET v = 'toast kept' WHERE id BETWEEN 11 AND 15")  # unchanged TOAST again
        conn.execute("TRUNCATE pairs")
        conn.execute("INSERT INTO pairs SELECT g % 5, 'after' || g, g FROM generate_series(1, 40) g")
        conn.execute("ALTER TABLE audit DROP COLUMN v")
        conn.execute("INSERT INTO audit SELECT g FROM generate_series(100, 140) g")
        for i in range(30):  # many small transactions
            conn.execute("UPDATE shop.items SET n = %s WHERE id = %s", [i, 2000 + i])


def third_part(db: Database) -> None:
    with db.connect() as conn:
        conn.execute("DELETE FROM shop.items WHERE id BETWEEN 2500 AND 2600")
        conn.execute("UPDATE shop.items SET big = 'short now' WHERE id = 1")
        conn.execute("UPDATE pairs SET x = -x WHERE a = 1")
        conn.execute("INSERT INTO shop.items (id, v, note) VALUES (9999, 'last', 'the end')")


def options(r: Run, tmp_path: Path, **extra: Any) -> Options:
    return Options(
        bootstrap_servers=r.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"],
        topic_prefix=r.prefix,
        registry_url=r.env["CDCD_SCHEMA_REGISTRY__URL"],
        checkpoint=str(tmp_path / "checkpoint"),
        mirror=str(tmp_path / "mirror"),
        changelog=str(tmp_path / "changelog"),
        keys={"public.audit": ("id",)},
        **extra,
    )


def run_available_now(spark: SparkSession, opts: Options) -> None:
    await_queries(spark, {"the job": start(spark, opts)}, 300)


def await_queries(spark: SparkSession, queries: dict[str, StreamingQuery], timeout: float) -> None:
    """Until every query has applied what Kafka holds (available-now). One still running at the deadline fails the
    test with the driver's busy JVM threads (where it hangs), and every query is stopped: none runs on under the
    next test of the shared session."""
    deadline = time.monotonic() + timeout
    try:
        for name, query in queries.items():
            query.awaitTermination(timeout=max(1, int(deadline - time.monotonic())))
            if query.isActive:
                raise AssertionError(
                    f"{name}: did not finish what was in Kafka within {timeout:.0f} s\n{busy_jvm_threads(spark)}"
                )
            assert query.exception() is None, f"{name}: {query.exception()}"
    finally:
        for query in queries.values():
            if query.isActive:
                query.stop()


def busy_jvm_threads(spark: SparkSession) -> str:
    """The driver JVM's threads that run tasks, streams, SQL or Delta (jstack), or are blocked, and any deadlock."""
    pid = spark.sparkContext._jvm.ProcessHandle.current().pid()  # type: ignore[union-attr]
    try:
        dump = subprocess.run(["jstack", str(pid)], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"(no thread dump: {e})"
    wanted = ("Executor task launch", "stream execution", "Java-level deadlock", "BLOCKED", "delta", "MergeInto")
    blocks = [b for b in dump.split("\n\n") if any(w in b for w in wanted) and "getTask" not in b]  # not idle
    return "\n\n".join("\n".join(b.splitlines()[:40]) for b in blocks)


def normalize(value: Any) -> Any:
    """Source (psycopg) and mirror (Spark) values as one Python representation, strictly."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return ("instant", value.astimezone(dt.UTC).replace(tzinfo=None))
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, list):
        return [normalize(v) for v in value]
    return value


def mirror_value(value: Any, column: str, timestamptz: set[str]) -> Any:
    if column in timestamptz and value is not None:  # Spark hands instants over as naive local time
        return ("instant", value.astimezone(dt.UTC).replace(tzinfo=None))
    if hasattr(value, "asDict") and set(value.asDict()) == {"elements", "text"}:  # an array column
        assert value["text"] is None
        return normalize(value["elements"])
    return normalize(value)


def source_rows(db: Database, table: str, keys: tuple[str, ...]) -> tuple[list[str], list[tuple[Any, ...]]]:
    with db.connect() as conn:
        cursor = conn.execute(f"SELECT * FROM {table} ORDER BY {', '.join(keys)}")
        assert cursor.description is not None
        names = [c.name for c in cursor.description]
        return names, [tuple(normalize(v) for v in row) for row in cursor.fetchall()]


def mirror_rows(spark: SparkSession, path: Path, keys: tuple[str, ...]) -> tuple[list[str], list[tuple[Any, ...]]]:
    frame = spark.read.format("delta").load(str(path))
    names = [c for c in frame.columns if not c.startswith("_cdc_")]
    timestamptz = {f.name for f in frame.schema.fields if f.dataType.typeName() == "timestamp"}
    rows = frame.select(*names).orderBy(*keys).collect()
    return names, [tuple(mirror_value(row[c], c, timestamptz) for c in names) for row in rows]


def assert_mirrors_equal(
    spark: SparkSession, db: Database, root: Path, tables: dict[str, tuple[str, ...]] = TABLES
) -> None:
    for table, keys in tables.items():
        schema, name = table.split(".")
        expected = source_rows(db, table, keys)
        actual = mirror_rows(spark, root / schema / name, keys)
        assert actual[0] == expected[0], f"{table}: columns differ"
        assert len(actual[1]) == len(expected[1]), f"{table}: {len(actual[1])} rows, source has {len(expected[1])}"
        for got, want in zip(actual[1], expected[1], strict=True):
            differs = {c: (g, w) for c, g, w in zip(actual[0], got, want, strict=True) if g != w}
            assert not differs, (
                f"{table}, row {dict(zip(keys, want[: len(keys)], strict=True))}: (mirror, source) {differs}"
            )


def wait_for_commit(
    checkpoint: Path, beyond: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        commits = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")]
        if commits and max(commits) > beyond:
            return
        assert proc.poll() is None, f"the job exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no new micro-batch committed:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)


def test_mirror_equals_source_across_restarts(spark: SparkSession, run15: Run, tmp_path: Path) -> None:
    db = run15.db
    run15.start()
    first_part(db)
    run15.sync()
    opts = options(run15, tmp_path, available_now=True, max_offsets_per_trigger=700)
    run_available_now(spark, opts)
    assert_mirrors_equal(spark, db, tmp_path / "mirror")

    # The job as a process (`python -m cdcd.spark`), killed mid-stream with SIGKILL after a committed batch.
    second_part(db)
    run15.sync()
    done = max(int(p.name) for p in (tmp_path / "checkpoint" / "commits").glob("[0-9]*"))
    log = tmp_path / "spark.log"
    args = ["--topic-prefix", run15.prefix, "--bootstrap-servers", opts.bootstrap_servers,
            "--registry-url", opts.registry_url, "--checkpoint", opts.checkpoint, "--mirror", str(opts.mirror),
            "--changelog", str(opts.changelog), "--key", "public.audit=id", "--max-offsets-per-trigger", "100",
            "--trigger-interval", "0 seconds", "--jars-dir", run15.env["CDCD_SPARK_JARS"],
            "--conf", f"spark.driver.extraJavaOptions={JOB_JAVA_OPTIONS}"]  # fmt: skip
    with log.open("wb") as out:
        proc = spawn([sys.executable, "-m", "cdcd.spark", *args], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_commit(tmp_path / "checkpoint", done, proc, log)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    third_part(db)
    run15.sync()
    run_available_now(spark, opts)
    assert_mirrors_equal(spark, db, tmp_path / "mirror")
    # The changelog holds every event once, replays included (Delta's idempotent appends).
    events = spark.read.format("delta").load(str(tmp_path / "changelog" / "shop" / "items"))
    assert events.count() == events.select("_partition", "_offset").distinct().count()
    ops = {r["_op"]: r["count"] for r in events.groupBy("_op").count().collect()}
    assert ops["c"] == 300 + 6 + 3 + 1501 + 1  # inserts, key changes, the streamed transaction, the last row
    assert ops["d"] == 11 + 6 + 3 + 101 + 101
    pairs = spark.read.format("delta").load(str(tmp_path / "changelog" / "public" / "pairs"))
    assert pairs.where("_op = 't'").count() == 1

    # A batch holding nothing but a truncate (no key in the batch: the mirror's own key columns are used).
    db.execute("TRUNCATE audit")
    run15.sync()
    run_available_now(spark, opts)
    assert_mirrors_equal(spark, db, tmp_path / "mirror")
    assert spark.read.format("delta").load(str(tmp_path / "mirror" / "public" / "audit")).count() == 0


def kafka_records(
    spark: SparkSession, r: Run, topic: str, ranges: dict[int, tuple[int, int]] | None = None
) -> DataFrame:
    """The records of ``topic`` in the offset ranges [start, end) per partition (default: all), as the streaming
    query reads them (batch mode, explicit offsets)."""
    starts, ends = "earliest", "latest"
    if ranges is not None:
        starts = json.dumps({topic: {str(p): start for p, (start, _) in ranges.items()}})
        ends = json.dumps({topic: {str(p): end for p, (_, end) in ranges.items()}})
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", r.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"])
        .option("subscribe", topic)
        .option("startingOffsets", starts)
        .option("endingOffsets", ends)
        .option("includeHeaders", "true")
        .load()
        .select("topic", "partition", "offset", "key", "value", "headers")
    )


def test_key_changes_keep_unchanged_toast_across_batches_and_partitions(
    spark: SparkSession, run15: Run, tmp_path: Path
) -> None:
    """A key change whose TOASTed column is unchanged is a delete (plus tombstone) and a create without that
    value: the mirror moves the row to the new key and keeps it, as PostgreSQL's subscriber does, whether both
    halves come in one micro-batch or the delete or the create first (another batch, another partition), for
    rows updated just before their key changes, row after row (one MERGE), and through chains and reused keys
    (one batch split in parts)."""
    db = run15.db
    run15.start(partitions=2)
    topic = f"{run15.prefix}.shop.items"
    db.execute("INSERT INTO shop.items (id, v, n, big) SELECT g, 'v' || g, g, repeat(md5(g::text), 200)"
               " FROM generate_series(1, 40) g")  # fmt: skip
    run15.sync()
    inserted = offsets(run15, topic)
    db.execute("UPDATE shop.items SET id = id + 100 WHERE id <= 10")  # big: unchanged TOAST
    for i in range(32, 36):  # updated, then moved, row after row: one MERGE however many rows
        db.execute("UPDATE shop.items SET v = 'updated, then moved' WHERE id = %s", [i])
        db.execute("UPDATE shop.items SET id = id + 600 WHERE id = %s", [i])
    run15.sync()
    moved, moved_rows = offsets(run15, topic), source_rows(db, "shop.items", ("id",))
    with db.connect() as conn:
        with conn.transaction():  # a chain: 11 -> 211 -> 311
            conn.execute("UPDATE shop.items SET id = 211 WHERE id = 11")
            conn.execute("UPDATE shop.items SET id = 311 WHERE id = 211")
        with conn.transaction():  # updated, then moved, then updated under the new key
            conn.execute("UPDATE shop.items SET v = 'before the move' WHERE id BETWEEN 21 AND 25")
            conn.execute("UPDATE shop.items SET id = id + 400 WHERE id BETWEEN 21 AND 25")
            conn.execute("UPDATE shop.items SET n = -1 WHERE id BETWEEN 421 AND 423")
        conn.execute("DELETE FROM shop.items WHERE id = 30")
        conn.execute("UPDATE shop.items SET id = 30 WHERE id = 31")  # onto a key deleted just before
        conn.execute("INSERT INTO shop.items (id, v) VALUES (31, 'reborn')")  # the old key used again
    run15.sync()
    ends = offsets(run15, topic)

    halves: dict[bytes, dict[str, tuple[int, int]]] = {}  # the key changes of the first phase: old key -> halves
    for record in kafka_records(spark, run15, topic, {p: (inserted[p], moved[p]) for p in moved}).collect():
        for name, value in record["headers"] or []:
            half, old = ("d", bytes(record["key"])) if name == "__debezium.newkey" else ("c", bytes(value))
            halves.setdefault(old, {})[half] = (record["partition"], record["offset"])
    assert len(halves) == 14, "each key change has its two halves"
    apart = next((h for h in halves.values() if h["d"][0] != h["c"][0]), None)
    assert apart is not None, "no key change of the first phase has its halves in different partitions"

    def replay(plan: str, cuts: list[dict[int, int]], start: dict[int, int], base: Path | None = None) -> Path:
        """Feed the topic from offsets ``start`` to a new mirror (a copy of mirror root ``base``, if given) in
        micro-batches ending at ``cuts`` (offsets per partition)."""
        root = tmp_path / plan
        if base is not None:
            shutil.copytree(base / "mirror", root / "mirror")
        writer = BatchWriter(spark, replace(options(run15, root), changelog=None))
        for batch_id, cut in enumerate(cuts):
            writer.write_batch(kafka_records(spark, run15, topic, {p: (start[p], cut[p]) for p in ends}), batch_id)
            start = cut
        return root

    # Every plan starts from the mirror of the inserted rows, built once.
    inserts = replay("inserted", [inserted], {p: 0 for p in ends})
    for plan, first_half in (("delete_first", apart["d"]), ("create_first", apart["c"])):
        second = apart["c"] if first_half == apart["d"] else apart["d"]
        mirror = replay(plan, [{**moved, second[0]: second[1]}, moved], inserted, inserts)
        assert mirror_rows(spark, mirror / "mirror" / "shop" / "items", ("id",)) == moved_rows, plan
    mirror = replay("one_batch", [ends], inserted, inserts)
    assert mirror_rows(spark, mirror / "mirror" / "shop" / "items", ("id",)) == source_rows(db, "shop.items", ("id",))


def offsets(r: Run, topic: str) -> dict[int, int]:
    """The end offset of each partition of ``topic`` (its high watermark)."""
    return {p: r.consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(2)}
