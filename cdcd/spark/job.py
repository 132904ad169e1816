"""The Spark side: the session, the Kafka stream and what each micro-batch does (see merge.py for the SQL)."""

from __future__ import annotations

import glob
import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro
from pyspark.sql.streaming.query import StreamingQuery

from cdcd.spark.merge import (
    EV_COMMIT_LSN,
    EV_LSN,
    MOVED_FROM,
    MOVED_TO,
    OFFSET,
    OP,
    UNCHANGED,
    Position,
    evolve_sql,
    first_conflict_sql,
    insert_sql,
    latest_sql,
    merge_sql,
    moved_latest_sql,
    moves_sql,
    truncate_sql,
    window_sql,
)
from cdcd.spark.schema import (
    COMMIT_LSN,
    LSN,
    TableSchema,
    aligned_struct,
    key_columns,
    literal,
    quote,
    table_schema,
    union,
)
from cdcd.spark.wire import HEADER_SIZE, Registry, header, schema_id, table_of, topic_pattern

log = logging.getLogger("cdcd.spark")

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # A MERGE copies its source first unless told not to, in case reading it twice gives other rows. Ours
    # gives the same rows each time: the micro-batch's events (cached; read again, the same Kafka offsets) and
    # the mirror table at the version the MERGE started from.
    "spark.databricks.delta.merge.materializeSource": "none",
}
# Laptop defaults; anything here can be overridden with --conf (a cluster sets its own master and resources).
LOCAL_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    # Delta rebuilds a table's snapshot (its file list) after each commit, in 50 tasks by default: seconds of a
    # micro-batch on a laptop for a log of a few hundred files.
    "spark.databricks.delta.snapshotPartitions": "2",
    # The stream execution thread of a first `make demo` on a cold machine (JVM starved of CPU: its code still
    # interpreted, whose frames are larger) died with a StackOverflowError 1,024 frames deep in java.util.regex
    # at the default 1 MiB stack; the driver's threads get 16 MiB (virtual memory, touched only as used).
    "spark.driver.extraJavaOptions": "-Xss16m",
}
PROP_SCHEMA_ID = "cdcd.schema_id"
PROP_SCHEMA_AT = "cdcd.schema_position"
PROP_TRUNCATED_AT = "cdcd.truncated_position"
PROP_KEYS = "cdcd.key_columns"
# The headers of a key change's two events (cdcd.sink.kafka): the other key, in the wire format of keys.
MOVED_HEADERS = {MOVED_FROM: "__debezium.oldkey", MOVED_TO: "__debezium.newkey"}


@dataclass
class Options:
    """What the job does; the CLI (``python -m cdcd.spark --help``) documents each."""

    bootstrap_servers: str
    topic_prefix: str
    registry_url: str
    checkpoint: str
    mirror: str | None = None
    changelog: str | None = None
    changelog_format: str = "delta"
    trigger_interval: str = "5 seconds"
    available_now: bool = False
    max_offsets_per_trigger: int | None = None
    starting_offsets: str = "earliest"
    kafka_options: dict[str, str] = field(default_factory=dict)
    keys: dict[str, tuple[str, ...]] = field(default_factory=dict)  # "schema.table" -> key columns
    registry_auth: tuple[str, str] | None = None
    table_threads: int = 4  # tables of a micro-batch written at once


def session(
    master: str | None = "local[2]", jars_dir: str | None = None, conf: dict[str, str] | None = None
) -> SparkSession:
    """A session with Delta Lake. ``master`` None leaves it to spark-submit; ``jars_dir`` (default
    ``$CDCD_SPARK_JARS``, set by the local stack) holds the Kafka, Avro and Delta jars; on a cluster pass them
    with spark-submit's ``--packages`` instead."""
    builder = SparkSession.builder.appName("cdcd-spark")
    if master:
        builder = builder.master(master)
    jars_dir = jars_dir or os.environ.get("CDCD_SPARK_JARS")
    if jars_dir:
        jars = sorted(glob.glob(os.path.join(jars_dir, "*.jar")))
        if not jars:
            raise FileNotFoundError(f"no jars in {jars_dir} (run: deploy/local/stack up spark)")
        builder = builder.config("spark.jars", ",".join(jars))
    for key, value in {**LOCAL_CONF, **DELTA_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    _quiet_deletion_vector_scans(spark)
    return spark


def _quiet_deletion_vector_scans(spark: SparkSession) -> None:
    """Delta 4.0 logs "ERROR ... Failed to translate filter EqualTo(__delta_internal_is_row_deleted,0)" for each
    scan of a table with deletion vectors: it filters deleted rows after the Parquet reader instead, which is
    correct. Silenced in this JVM (the driver; executors of a cluster keep their own logging)."""
    jvm: Any = spark.sparkContext._jvm
    log4j = jvm.org.apache.logging.log4j
    log4j.core.config.Configurator.setLevel("org.apache.spark.sql.delta.DeltaParquetFileFormat", log4j.Level.FATAL)


def kafka_stream(spark: SparkSession, options: Options) -> DataFrame:
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", options.bootstrap_servers)
        .option("subscribePattern", topic_pattern(options.topic_prefix))
        .option("startingOffsets", options.starting_offsets)
        .option("kafka.metadata.max.age.ms", "5000")  # find new tables' topics within seconds
        .option("includeHeaders", "true")
        # never what an aborted or open Kafka transaction holds (cdcd's kafka.delivery: exactly_once)
        .option("kafka.isolation.level", "read_committed")
    )
    if options.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(options.max_offsets_per_trigger))
    # One task per topic partition otherwise: a one-partition topic would be read and decoded on one core.
    reader = reader.option("minPartitions", str(spark.sparkContext.defaultParallelism))
    for key, value in options.kafka_options.items():
        reader = reader.option(key, value)
    return reader.load().select("topic", "partition", "offset", "key", "value", "headers")


def start(spark: SparkSession, options: Options) -> StreamingQuery:
    """Start the streaming query (mirror and/or changelog); checkpointed in ``options.checkpoint``."""
    if not options.mirror and not options.changelog:
        raise ValueError("nothing to write: give a mirror path, a changelog path or both")
    writer = BatchWriter(spark, options)
    stream = kafka_stream(spark, options).writeStream.foreachBatch(writer.write_batch)
    stream = stream.option("checkpointLocation", options.checkpoint).queryName("cdcd-spark")
    if options.available_now:
        stream = stream.trigger(availableNow=True)
    else:
        stream = stream.trigger(processingTime=options.trigger_interval)
    return stream.start()


@dataclass(frozen=True)
class MirrorState:
    """What the job keeps in a mirror table's properties: the schema its columns follow and the stream position
    that schema was taken at, the key columns, and the position of the newest truncate applied."""

    schema_id: int
    schema_at: Position
    keys: tuple[str, ...]
    truncated_at: Position | None = None

    def properties(self) -> dict[str, str]:
        props = {PROP_SCHEMA_ID: str(self.schema_id), PROP_SCHEMA_AT: _text(self.schema_at),
                 PROP_KEYS: json.dumps(list(self.keys))}  # fmt: skip
        if self.truncated_at is not None:
            props[PROP_TRUNCATED_AT] = _text(self.truncated_at)
        return props

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> MirrorState | None:
        schema_at = _position(props.get(PROP_SCHEMA_AT))
        if schema_at is None or PROP_SCHEMA_ID not in props or PROP_KEYS not in props:
            return None
        keys = tuple(json.loads(props[PROP_KEYS]))
        return cls(int(props[PROP_SCHEMA_ID]), schema_at, keys, _position(props.get(PROP_TRUNCATED_AT)))


@dataclass(frozen=True)
class BatchSummary:
    """One table's micro-batch in brief: its newest event (position, schema id), newest truncate, row events."""

    last: Position
    last_schema: int
    truncated: Position | None
    rows: int
    moves: int  # events of key changes
    events: int = 0  # truncates included


def _position(text: str | None) -> Position | None:
    if not text:
        return None
    commit_lsn, lsn = text.split("/")
    return int(commit_lsn), int(lsn)


def _text(position: Position) -> str:
    return f"{position[0]}/{position[1]}"


@dataclass
class TableBatch:
    """One table's events of a micro-batch, decoded and aligned to the union of the schemas involved."""

    schema: str
    table: str
    events: DataFrame
    schemas: dict[int, TableSchema]
    key_ids: set[int]

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"


class BatchWriter:
    """The foreachBatch function, with the registry client and each mirror table's state."""

    def __init__(self, spark: SparkSession, options: Options) -> None:
        self.spark = spark
        self.options = options
        self.registry = Registry(options.registry_url, options.registry_auth)
        self.states: dict[str, MirrorState | None] = {}
        self.warned: set[str] = set()

    def write_batch(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        self.spark = batch.sparkSession  # the micro-batch's own session: its temp views are only visible there
        moved = [
            f"try_element_at(filter(headers, h -> h.key = {literal(header)}), 1).value AS {column}"
            for column, header in MOVED_HEADERS.items()
        ]
        raw = batch.where("value IS NOT NULL").selectExpr(  # tombstones carry nothing the mirror needs
            "topic",
            "partition",
            "offset",
            "value",
            f"substring(value, 1, {HEADER_SIZE}) AS _vh",
            f"substring(key, 1, {HEADER_SIZE}) AS _kh",
            *moved,
        )
        raw.persist()
        tables: list[TableBatch] = []
        summaries: list[BatchSummary] = []
        try:
            # Two Spark jobs before the writes, whatever the number of tables: the schema ids (which also reads
            # Kafka into the cache), then every table's summary (which decodes each table's events into the cache).
            heads = raw.select("topic", "_vh", "_kh").distinct().collect()
            read = time.monotonic()
            tables = list(self._tables(raw, heads))
            for table_batch in tables:
                table_batch.events.persist()
            summaries = self._summaries(tables)
            decoded = time.monotonic()
            writes = zip(tables, summaries, strict=True)
            self._in_parallel([partial(self._write_table, tb, summary, batch_id) for tb, summary in writes])
        finally:
            for table_batch in tables:
                table_batch.events.unpersist()
            raw.unpersist()
        done = time.monotonic()
        log.info("batch %d: %d events of %d tables in %.1f s (read %.1f s, decode %.1f s, write %.1f s)", batch_id,
                 sum(s.events for s in summaries), len(tables), done - started, read - started, decoded - read,
                 done - decoded)  # fmt: skip

    def _in_parallel(self, calls: list[Callable[[], None]]) -> None:
        """Make ``calls`` (one table's writes each) on up to ``options.table_threads`` threads: a table's writes are
        a few Spark jobs and Delta commits that mostly wait on the driver, so a batch of several tables takes
        about as long as its slowest table rather than the sum of all. Each call runs with a copy of this thread's
        Spark local properties, so its jobs belong to the streaming query (stopping it cancels them too)."""
        threads = min(self.options.table_threads, len(calls))
        if threads <= 1:
            for call in calls:
                call()
            return
        context: Any = self.spark.sparkContext._jsc.sc()
        properties = context.getLocalProperties()

        def run(call: Callable[[], None]) -> None:
            context.setLocalProperties(properties.clone())
            call()

        with ThreadPoolExecutor(threads, thread_name_prefix="cdcd-table") as pool:
            for future in [pool.submit(run, call) for call in calls]:
                future.result()  # the first table that failed fails the batch, once every table is done

    def _tables(self, raw: DataFrame, heads: Iterable[Any]) -> Iterable[TableBatch]:
        by_topic: dict[str, tuple[set[int], set[int]]] = {}
        for row in heads:
            value_ids, key_ids = by_topic.setdefault(row["topic"], (set(), set()))
            value_id, key_id = schema_id(row["_vh"]), schema_id(row["_kh"])
            assert value_id is not None
            value_ids.add(value_id)
            if key_id is not None:
                key_ids.add(key_id)
        for topic, (value_ids, key_ids) in sorted(by_topic.items()):
            names = table_of(topic, self.options.topic_prefix)
            if names is None:
                continue
            schemas = {i: table_schema(self.registry.parsed(i)) for i in sorted(value_ids)}
            state = self._state(*names)
            if state is not None and state.schema_id not in schemas:
                schemas[state.schema_id] = table_schema(self.registry.parsed(state.schema_id))
            wide = union(schemas.values())
            parts = [self._decode(raw, topic, i, schemas[i], wide, key_ids=key_ids) for i in sorted(value_ids)]
            events = parts[0]
            for part in parts[1:]:
                events = events.unionByName(part)
            yield TableBatch(names[0], names[1], events, schemas, key_ids)

    def _decode(
        self, raw: DataFrame, topic: str, id_: int, writer: TableSchema, wide: TableSchema, *, key_ids: set[int]
    ) -> DataFrame:
        envelope = self._avro("value", id_)
        rows = raw.where((F.col("topic") == topic) & (F.col("_vh") == F.lit(bytearray(header(id_)))))
        moved = [self._moved_key(column, key_ids).alias(column) for column in MOVED_HEADERS]
        return rows.select(envelope.alias("e"), "partition", "offset", *moved).selectExpr(
            f"e.op AS {OP}",
            f"coalesce(e.source.commit_lsn, 0) AS {EV_COMMIT_LSN}",
            f"coalesce(e.source.lsn, 0) AS {EV_LSN}",
            f"offset AS {OFFSET}",
            "partition AS _partition",
            "e.source.txId AS _tx_id",
            "e.ts_ms AS _ts_ms",
            f"coalesce(e.unchanged_toast, array()) AS {UNCHANGED}",
            f"{aligned_struct('e.before', writer, wide)} AS before",
            f"{aligned_struct('e.after', writer, wide)} AS after",
            f"{id_} AS _schema_id",
            MOVED_FROM,
            MOVED_TO,
        )

    def _avro(self, column: str, id_: int) -> SparkColumn:
        """The Avro body of ``column`` (wire format) decoded with writer schema ``id_``."""
        body = F.expr(f"substring({column}, {HEADER_SIZE + 1})")
        return from_avro(body, self.registry.schema(id_), {"mode": "FAILFAST"})

    def _moved_key(self, column: str, key_ids: set[int]) -> SparkColumn:
        """The key in a key change's header ``column``, decoded with the key schema its header names (null for
        other events; a keyless table has none)."""
        if not key_ids:
            return F.lit(None)
        decoded = [
            F.when(
                F.expr(f"substring({column}, 1, {HEADER_SIZE})") == F.lit(bytearray(header(i))), self._avro(column, i)
            )
            for i in sorted(key_ids)
        ]
        return F.coalesce(*decoded) if len(decoded) > 1 else decoded[0]

    def _summaries(self, tables: list[TableBatch]) -> list[BatchSummary]:
        """Each table's :class:`BatchSummary`, all in one Spark job."""
        if not tables:
            return []
        parts = [
            tb.events.selectExpr(
                f"{i} AS _table",
                "count(*) AS n",
                f"count_if({OP} <> 't') AS rows",
                f"max(struct({EV_COMMIT_LSN}, {EV_LSN}, {OFFSET}, _schema_id)) AS last",
                f"max(CASE WHEN {OP} = 't' THEN struct({EV_COMMIT_LSN}, {EV_LSN}) END) AS truncated",
                f"count_if({MOVED_FROM} IS NOT NULL OR {MOVED_TO} IS NOT NULL) AS moves",
            )
            for i, tb in enumerate(tables)
        ]
        union_all = parts[0]
        for part in parts[1:]:
            union_all = union_all.unionByName(part)
        rows = {row["_table"]: row for row in union_all.collect()}
        out = []
        for i in range(len(tables)):
            row = rows[i]
            last, truncated = row["last"], row["truncated"]
            out.append(BatchSummary(
                (last[0], last[1]),
                last[3],
                None if truncated is None else (truncated[0], truncated[1]),
                row["rows"],
                row["moves"],
                row["n"],
            ))  # fmt: skip
        return out

    def _write_table(self, tb: TableBatch, summary: BatchSummary, batch_id: int) -> None:
        if self.options.changelog:
            self._append_changelog(tb, batch_id)
        if self.options.mirror:
            self._mirror(tb, summary)

    # -- changelog ---------------------------------------------------------------------------------

    def _append_changelog(self, tb: TableBatch, batch_id: int) -> None:
        assert self.options.changelog
        path = f"{self.options.changelog.rstrip('/')}/{tb.schema}/{tb.table}"
        events = tb.events.drop("_schema_id", MOVED_FROM, MOVED_TO)
        writer = events.write.mode("append").format(self.options.changelog_format)
        if self.options.changelog_format == "delta":
            # Delta skips a (txnAppId, txnVersion) it already committed: a replayed batch is not appended twice.
            writer = writer.option("txnAppId", self.options.checkpoint).option("txnVersion", str(batch_id))
            writer = writer.option("mergeSchema", "true")
        writer.save(path)

    # -- mirror ------------------------------------------------------------------------------------

    def _path(self, schema: str, table: str) -> str:
        assert self.options.mirror
        return f"{self.options.mirror.rstrip('/')}/{schema}/{table}"

    def _sql_name(self, schema: str, table: str) -> str:
        return f"delta.{quote(self._path(schema, table))}"

    def _state(self, schema: str, table: str) -> MirrorState | None:
        if not self.options.mirror:
            return None
        path = self._path(schema, table)
        if path not in self.states:
            self.states[path] = self._read_state(schema, table)
        return self.states[path]

    def _read_state(self, schema: str, table: str) -> MirrorState | None:
        from delta.tables import DeltaTable  # noqa: PLC0415 - the delta package is only needed with a mirror

        if not DeltaTable.isDeltaTable(self.spark, self._path(schema, table)):
            return None
        rows = self.spark.sql(f"SHOW TBLPROPERTIES {self._sql_name(schema, table)}").collect()
        state = MirrorState.from_properties({r["key"]: r["value"] for r in rows})
        if state is None:
            raise ValueError(f"{self._path(schema, table)} is a Delta table, but not a mirror written by cdcd.spark")
        return state

    def _keys(self, tb: TableBatch, state: MirrorState | None, batch: BatchSummary) -> tuple[str, ...] | None:
        if tb.key_ids:
            return key_columns(self.registry.parsed(max(tb.key_ids)))
        if tb.name in self.options.keys:
            return self.options.keys[tb.name]
        if state is not None:  # a batch of truncates only: they have no key
            return state.keys
        if batch.rows and tb.name not in self.warned:
            self.warned.add(tb.name)
            log.warning("%s has no key (no primary key): not mirrored; give one with --key", tb.name)
        return None

    def _mirror(self, tb: TableBatch, batch: BatchSummary) -> None:
        state = self._state(tb.schema, tb.table)
        keys = self._keys(tb, state, batch)
        if keys is None:
            return
        name = self._sql_name(tb.schema, tb.table)
        created = state is None
        if state is None:
            state = self._create(tb, MirrorState(batch.last_schema, batch.last, keys))
        elif batch.last > state.schema_at and batch.last_schema != state.schema_id:
            for statement in evolve_sql(name, tb.schemas[state.schema_id], tb.schemas[batch.last_schema]):
                self.spark.sql(statement)
            state = self._save(tb, replace(state, schema_id=batch.last_schema, schema_at=batch.last, keys=keys))
        if batch.truncated is not None and (state.truncated_at is None or batch.truncated > state.truncated_at):
            self.spark.sql(truncate_sql(name, batch.truncated))
            state = self._save(tb, replace(state, truncated_at=batch.truncated))
        if not batch.rows:
            return
        target = tb.schemas[state.schema_id]
        view = f"cdcd_events_{abs(hash(tb.name))}"
        tb.events.createOrReplaceTempView(view)
        if not batch.moves:
            self._view(view + "_latest", latest_sql(view, keys, target, state.truncated_at))
            # A table created by this batch is empty: its rows are inserted, no MERGE needed.
            self.spark.sql((insert_sql if created else merge_sql)(name, view + "_latest", keys, target))
            return
        # Key changes: each moved row takes its old key's earlier events and mirror row along, in one MERGE; a
        # batch with chains or reused keys in one MERGE per part, split at each key change one pass cannot take.
        rest, moves, part = f"{view}_rest", f"{view}_moves", f"{view}_part"
        start: Position | None = None
        while True:
            self._view(rest, window_sql(view, state.truncated_at, start, None))
            self._view(moves, moves_sql(rest, keys))
            first = self.spark.sql(first_conflict_sql(rest, moves, keys)).first()
            end = None if first is None or first["first"] is None else (first["first"][0], first["first"][1])
            self._view(part, window_sql(rest, None, None, end))
            self._view(moves, moves_sql(part, keys))
            self._view(view + "_latest", moved_latest_sql(part, moves, name, keys, target))
            self.spark.sql(merge_sql(name, view + "_latest", keys, target, moved=True))
            if end is None:
                return
            start = end

    def _view(self, name: str, sql: str) -> None:
        self.spark.sql(sql).createOrReplaceTempView(name)

    def _create(self, tb: TableBatch, state: MirrorState) -> MirrorState:
        columns = f"{tb.schemas[state.schema_id].ddl()}, {COMMIT_LSN} bigint, {LSN} bigint"
        props = {
            "delta.columnMapping.mode": "name",  # lets dropped columns be dropped
            "delta.enableDeletionVectors": "true",  # a MERGE marks replaced rows instead of rewriting whole files
            **state.properties(),
        }
        listed = ", ".join(f"{literal(k)} = {literal(v)}" for k, v in props.items())
        self.spark.sql(
            f"CREATE TABLE IF NOT EXISTS {self._sql_name(tb.schema, tb.table)} ({columns}) USING delta "
            f"TBLPROPERTIES ({listed})"
        )
        self.states[self._path(tb.schema, tb.table)] = state
        return state

    def _save(self, tb: TableBatch, state: MirrorState) -> MirrorState:
        listed = ", ".join(f"{literal(k)} = {literal(v)}" for k, v in state.properties().items())
        self.spark.sql(f"ALTER TABLE {self._sql_name(tb.schema, tb.table)} SET TBLPROPERTIES ({listed})")
        self.states[self._path(tb.schema, tb.table)] = state
        return state
