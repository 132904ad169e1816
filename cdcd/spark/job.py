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
    DEBEZIUM,
    LSN,
    UNAVAILABLE,
    VALUE,
    Envelope,
    TableSchema,
    aligned_struct,
    envelope,
    key_columns,
    key_json_ddl,
    literal,
    mapping,
    quote,
    unchanged_sql,
    union,
)
from cdcd.spark.tables import (
    ICEBERG_EXTENSIONS,
    DeltaTables,
    IcebergTables,
    Tables,
    Where,
    iceberg_catalog_conf,
)
from cdcd.spark.wire import HEADER_SIZE, Registry, header, schema_id, table_of, topic_pattern

log = logging.getLogger("cdcd.spark")

DELTA_EXTENSIONS = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CONF = {
    "spark.sql.extensions": DELTA_EXTENSIONS,
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
# The headers of a key change's two events (cdcd.sink.kafka): the other key, in the wire format of keys (cdcd's
# native envelope) or as JSON text (Debezium's, and cdcd's in kafka.envelope: debezium).
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
    format: str = "delta"  # of the mirror and changelog tables: delta or iceberg
    catalog: str = "cdcd"  # the Iceberg catalog (--format iceberg)
    warehouse: str | None = None  # the Iceberg catalog's warehouse: a Hadoop catalog's path (without catalog_uri)
    catalog_uri: str | None = None  # a REST catalog's URI
    envelope: str = "auto"  # auto (each topic's own), native or debezium
    unavailable_placeholder: str = UNAVAILABLE  # Debezium's unavailable.value.placeholder
    query_name: str = "cdcd-spark"  # unique among a session's active streaming queries

    def tables(self) -> Tables:
        if self.format == "iceberg":
            return IcebergTables(self.catalog)
        if self.format == "delta":
            return DeltaTables(self.changelog_format)
        raise ValueError(f"format {self.format!r}: expected delta or iceberg")


def session(
    master: str | None = "local[2]",
    jars_dir: str | None = None,
    conf: dict[str, str] | None = None,
    iceberg: bool | None = None,
) -> SparkSession:
    """A session with Delta Lake, and Iceberg's SQL extensions with ``iceberg`` (default: when ``jars_dir`` has
    Iceberg's Spark runtime). ``master`` None leaves it to spark-submit; ``jars_dir`` (default
    ``$CDCD_SPARK_JARS``, set by the local stack) holds the Kafka, Avro, Delta and Iceberg jars; on a cluster
    pass them with spark-submit's ``--jars`` or ``--packages`` instead."""
    builder = SparkSession.builder.appName("cdcd-spark")
    if master:
        builder = builder.master(master)
    jars_dir = jars_dir or os.environ.get("CDCD_SPARK_JARS")
    jars: list[str] = []
    if jars_dir:
        jars = sorted(glob.glob(os.path.join(jars_dir, "*.jar")))
        if not jars:
            raise FileNotFoundError(f"no jars in {jars_dir} (run: deploy/local/stack up spark)")
        builder = builder.config("spark.jars", ",".join(jars))
    if iceberg is None:
        iceberg = any(os.path.basename(j).startswith("iceberg-spark-runtime") for j in jars)
    settings = {**LOCAL_CONF, **DELTA_CONF}
    if iceberg:
        settings["spark.sql.extensions"] = f"{DELTA_EXTENSIONS},{ICEBERG_EXTENSIONS}"
    for key, value in {**settings, **(conf or {})}.items():
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
    options.tables()  # a format it does not know fails here, not in the first micro-batch
    if options.format == "iceberg":
        for key, value in iceberg_catalog_conf(options.catalog, options.warehouse, options.catalog_uri).items():
            spark.conf.set(key, value)
    writer = BatchWriter(spark, options)
    stream = kafka_stream(spark, options).writeStream.foreachBatch(writer.write_batch)
    stream = stream.option("checkpointLocation", options.checkpoint).queryName(options.query_name)
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


def _key_sql(struct: str, columns: list[tuple[str, str]]) -> str:
    """SQL: the key ``struct`` with each column's conversion (``columns``: name, SQL of :data:`VALUE`) applied."""
    if all(convert == VALUE for _, convert in columns):
        return struct
    fields = ", ".join(f"{literal(n)}, {convert.replace(VALUE, f'{struct}.{quote(n)}')}" for n, convert in columns)
    return f"CASE WHEN {struct} IS NULL THEN NULL ELSE named_struct({fields}) END"


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
        self.tables = options.tables()
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
        log.info("%s batch %d: %d events of %d tables in %.1f s (read %.1f s, decode %.1f s, write %.1f s)",
                 self.options.topic_prefix, batch_id, sum(s.events for s in summaries), len(tables), done - started,
                 read - started, decoded - read, done - decoded)  # fmt: skip

    def _in_parallel(self, calls: list[Callable[[], None]]) -> None:
        """Make ``calls`` (one table's writes each) on up to ``options.table_threads`` threads: a table's writes are
        a few Spark jobs and table commits that mostly wait on the driver, so a batch of several tables takes
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

    def _envelope(self, id_: int) -> Envelope:
        return envelope(self.registry.parsed(id_), self.options.envelope)

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
            envelopes = {i: self._envelope(i) for i in sorted(value_ids)}
            schemas = {i: e.table for i, e in envelopes.items()}
            state = self._state(*names)
            if state is not None and state.schema_id not in schemas:
                schemas[state.schema_id] = self._envelope(state.schema_id).table
            wide = union(schemas.values())
            parts = [self._decode(raw, topic, i, envelopes[i], wide, key_ids=key_ids) for i in sorted(value_ids)]
            events = parts[0]
            for part in parts[1:]:
                events = events.unionByName(part)
            yield TableBatch(names[0], names[1], events, schemas, key_ids)

    def _decode(
        self, raw: DataFrame, topic: str, id_: int, writer: Envelope, wide: TableSchema, *, key_ids: set[int]
    ) -> DataFrame:
        """One writer schema's events of ``topic``, flattened (merge.py's columns), rows aligned to ``wide``.
        Debezium's own events have no commit LSN: their position is (lsn, lsn), the order of one row's changes;
        their unchanged TOAST values are Debezium's placeholder (:func:`unchanged_sql`)."""
        value = self._avro("value", id_)
        rows = raw.where((F.col("topic") == topic) & (F.col("_vh") == F.lit(bytearray(header(id_)))))
        avro_keys = [
            F.when(F.expr(f"substring({column}, 1, {HEADER_SIZE})") == F.lit(bytearray(header(i))),
                   self._avro(column, i)).alias(f"{column}_{i}")
            for column in MOVED_HEADERS
            for i in sorted(key_ids)
        ]  # fmt: skip
        commit = "e.source.commit_lsn" if writer.commit_lsn else "e.source.lsn"
        placeholder = None if writer.unchanged_toast else self.options.unavailable_placeholder
        if placeholder is None:
            unchanged = "coalesce(e.unchanged_toast, array())"
        else:
            unchanged = unchanged_sql("e.after", writer.table, placeholder)
        moved = [
            f"{self._moved_key(column, key_ids, writer.layout == DEBEZIUM)} AS {column}" for column in MOVED_HEADERS
        ]
        return rows.select(value.alias("e"), "partition", "offset", *MOVED_HEADERS, *avro_keys).selectExpr(
            f"e.op AS {OP}",
            f"coalesce({commit}, 0) AS {EV_COMMIT_LSN}",
            f"coalesce(e.source.lsn, 0) AS {EV_LSN}",
            f"offset AS {OFFSET}",
            "partition AS _partition",
            "e.source.txId AS _tx_id",
            "e.ts_ms AS _ts_ms",
            f"{unchanged} AS {UNCHANGED}",
            f"{aligned_struct('e.before', writer.table, wide)} AS before",
            f"{aligned_struct('e.after', writer.table, wide, placeholder)} AS after",
            f"{id_} AS _schema_id",
            *moved,
        )

    def _avro(self, column: str, id_: int) -> SparkColumn:
        """The Avro body of ``column`` (wire format) decoded with writer schema ``id_``."""
        body = F.expr(f"substring({column}, {HEADER_SIZE + 1})")
        return from_avro(body, self.registry.schema(id_), {"mode": "FAILFAST"})

    def _key_conversions(self, id_: int) -> list[tuple[str, str]]:
        return [(f["name"], mapping(f["type"]).convert) for f in self.registry.parsed(id_)["fields"]]

    def _moved_key(self, column: str, key_ids: set[int], json: bool) -> str:
        """SQL: the key in a key change's header ``column``, decoded with the key schema its header names
        (``<column>_<id>``, decoded by :meth:`_decode`), or with ``json`` parsed from its JSON text, its columns
        in the mirror's types (null for other events; a keyless table has none)."""
        if not key_ids:
            return "NULL"
        keys = [_key_sql(f"{column}_{i}", self._key_conversions(i)) for i in sorted(key_ids)]
        if json:
            ddl, values = key_json_ddl(self.registry.parsed(max(key_ids)))
            parsed = f"from_json(CAST({column} AS string), {literal(ddl)})"
            bound = f"element_at(transform(array({parsed}), j -> {_key_sql('j', values)}), 1)"
            keys.append(f"CASE WHEN substring({column}, 1, 1) = X'7B' THEN {bound} END")  # '{'
        return keys[0] if len(keys) == 1 else f"coalesce({', '.join(keys)})"

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
        events = tb.events.drop("_schema_id", MOVED_FROM, MOVED_TO)
        where = Where(self.options.changelog, tb.schema, tb.table)
        self.tables.append(events, where, self.options.checkpoint, batch_id)

    # -- mirror ------------------------------------------------------------------------------------

    def _where(self, schema: str, table: str) -> Where:
        assert self.options.mirror
        return Where(self.options.mirror, schema, table)

    def _sql_name(self, schema: str, table: str) -> str:
        return self.tables.name(self._where(schema, table))

    def _state(self, schema: str, table: str) -> MirrorState | None:
        if not self.options.mirror:
            return None
        name = self._sql_name(schema, table)
        if name not in self.states:
            self.states[name] = self._read_state(schema, table)
        return self.states[name]

    def _read_state(self, schema: str, table: str) -> MirrorState | None:
        if not self.tables.exists(self.spark, self._where(schema, table)):
            return None
        name = self._sql_name(schema, table)
        rows = self.spark.sql(f"SHOW TBLPROPERTIES {name}").collect()
        state = MirrorState.from_properties({r["key"]: r["value"] for r in rows})
        if state is None:
            raise ValueError(f"{name} is a table, but not a mirror written by cdcd.spark")
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
        self.tables.create_mirror(self.spark, self._where(tb.schema, tb.table), columns, state.properties())
        self.states[self._sql_name(tb.schema, tb.table)] = state
        return state

    def _save(self, tb: TableBatch, state: MirrorState) -> MirrorState:
        listed = ", ".join(f"{literal(k)} = {literal(v)}" for k, v in state.properties().items())
        name = self._sql_name(tb.schema, tb.table)
        self.spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ({listed})")
        self.states[name] = state
        return state
