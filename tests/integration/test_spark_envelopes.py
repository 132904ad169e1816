"""cdcd.spark on every kind of topic it reads, from one workload (test_spark's, on PostgreSQL 15): cdcd's native
envelope into Iceberg tables (a Hadoop catalog; cdcd in `kafka.delivery: exactly_once`, the topics also holding
aborted Kafka transactions of junk), cdcd's Debezium envelope (`kafka.envelope: debezium`) into Delta, and
Debezium's own PostgreSQL connector (the stack's `debezium`) into Delta. The three jobs are streaming queries of
the one Spark session, run at once, twice: after the first part of the workload and, restarted from their
checkpoints, after the rest (schema changes, a truncate, unchanged TOAST values, key changes). Then each mirror
must equal PostgreSQL row for row: the Delta ones read with Spark, the Iceberg one with pyiceberg (not Spark)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from pyiceberg.table import StaticTable
from pyspark.sql import SparkSession

from cdcd.spark.job import Options, start
from cdcd.spark.schema import UNAVAILABLE, VALUE, mapping, placeholder_sql
from tests.integration import test_spark
from tests.integration.conftest import Database, PgServer, scratch_database, stack15
from tests.integration.kafka_harness import Run, delete_topics, read_partitions
from tests.integration.test_spark import (
    SCHEMA,
    TABLES,
    assert_mirrors_equal,
    first_part,
    normalize,
    second_part,
    source_rows,
    third_part,
)

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("spark")]  # one worker: see conftest.py
# test_spark's fixtures: the stack's jars and the one local session of every Spark test module
env15, spark = test_spark.env15, test_spark.spark
EXACTLY_ONCE: dict[str, Any] = {"delivery": "exactly_once", "exactly_once": {"commit_interval_ms": 30}}


class Sources:
    """One database with test_spark's schema, and three writers of its changes to Kafka: cdcd (native envelope,
    exactly once), cdcd (Debezium's envelope) and Debezium's connector, each with its own slot and prefix."""

    def __init__(self, db: Database, env: dict[str, str], tmp_path: Path) -> None:
        self.db, self.env = db, env
        for name in ("native", "cdcd-debezium"):
            (tmp_path / name).mkdir()
        self.native = Run(db, env, tmp_path / "native")
        self.cdcd_debezium = Run(db, env, tmp_path / "cdcd-debezium")
        self.cdcd_debezium.prefix, self.cdcd_debezium.slot = f"it2_{db.name}", f"s2_{db.name}"
        self.debezium = f"dbz_{db.name}"  # the connector's name, topic prefix and slot

    def wait(self) -> None:
        """Until the three have every change committed so far in Kafka."""
        self.native.wait_confirmed()
        self.cdcd_debezium.wait_confirmed()
        self._wait_debezium()

    def _wait_debezium(self, timeout: float = 120) -> None:
        """Debezium confirms a position to its slot once Kafka Connect committed the offsets of the records
        before it, that is once Kafka acknowledged them: a transactional message is such a position."""
        lsn = self.db.execute("SELECT pg_logical_emit_message(true, 'test', 'sync')")[0][0]
        query = "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s"
        deadline = time.monotonic() + timeout
        while not self.db.execute(query, [lsn, self.debezium])[0][0]:
            assert time.monotonic() < deadline, f"Debezium never confirmed {lsn}"
            time.sleep(0.3)

    def abort_junk(self) -> None:
        """A Kafka transaction of messages that are not in the wire format (a reader would fail on them), into
        two of cdcd's exactly-once topics, aborted: a read_committed reader never sees them."""
        producer = Producer({"bootstrap.servers": self.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"],
                             "transactional.id": f"junk-{self.native.prefix}"})  # fmt: skip
        producer.init_transactions(30)
        producer.begin_transaction()
        for table in ("shop.items", "public.pairs"):
            for i in range(3):
                producer.produce(f"{self.native.prefix}.{table}", key=b"junk", value=b"junk %d" % i)
        producer.flush(30)
        producer.abort_transaction(30)


@pytest.fixture
def sources(pg15: PgServer, env15: dict[str, str], debezium_env: dict[str, str], tmp_path: Path) -> Iterator[Sources]:
    """The database and its three writers, started (nothing written yet); everything is removed afterwards."""
    with scratch_database(pg15) as db:
        db.execute(SCHEMA)
        s = Sources(db, env15, tmp_path)
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [s.debezium])
        try:
            stack15("debezium-connector", "start", s.debezium, db.name, s.debezium, "cdcd_pub",
                    "provide.transaction.metadata=true", "skipped.operations=none")  # fmt: skip
            s.native.start(**EXACTLY_ONCE)
            s.cdcd_debezium.start(envelope="debezium")
            yield s
        finally:
            s.native.close()
            s.cdcd_debezium.close()
            stack15("debezium-connector", "stop", s.debezium)
            delete_topics(env15["CDCD_KAFKA__BOOTSTRAP_SERVERS"], (f"{s.debezium}.",))
            registry = SchemaRegistryClient({"url": env15["CDCD_SCHEMA_REGISTRY__URL"]})
            for subject in registry.get_subjects():
                if subject.startswith(f"{s.debezium}."):
                    registry.delete_subject(subject)


def job_options(s: Sources, tmp_path: Path) -> dict[str, Options]:
    """The three jobs: native -> Iceberg (mirror and changelog), both Debezium envelopes -> Delta."""
    base = Options(
        bootstrap_servers=s.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"],
        registry_url=s.env["CDCD_SCHEMA_REGISTRY__URL"],
        topic_prefix="",
        checkpoint="",
        keys={"public.audit": ("id",)},
        available_now=True,
    )
    iceberg = replace(base, topic_prefix=s.native.prefix, checkpoint=str(tmp_path / "checkpoint-iceberg"),
                      mirror="mirror", changelog="changelog", format="iceberg", catalog="cdcd_it",
                      warehouse=str(tmp_path / "warehouse"), envelope="native")  # fmt: skip
    cdcd_debezium = replace(base, topic_prefix=s.cdcd_debezium.prefix, checkpoint=str(tmp_path / "checkpoint-cd"),
                            mirror=str(tmp_path / "cdcd-debezium"), envelope="debezium")  # fmt: skip
    debezium = replace(base, topic_prefix=s.debezium, checkpoint=str(tmp_path / "checkpoint-dbz"),
                       mirror=str(tmp_path / "debezium"))  # fmt: skip
    jobs = {"iceberg": iceberg, "cdcd-debezium": cdcd_debezium, "debezium": debezium}
    return {name: replace(opts, query_name=name) for name, opts in jobs.items()}


def run_jobs(spark: SparkSession, jobs: dict[str, Options]) -> None:
    """The jobs as streaming queries of one session at once, each until it has applied what Kafka holds."""
    test_spark.await_queries(spark, {name: start(spark, opts) for name, opts in jobs.items()}, 400)


def iceberg_rows(warehouse: Path, table: str, keys: tuple[str, ...]) -> tuple[list[str], list[tuple[Any, ...]]]:
    """A mirror table's rows as pyiceberg reads them (the Hadoop catalog's newest metadata file)."""
    schema, name = table.split(".")
    metadata = warehouse / "mirror" / schema / name / "metadata"
    version = (metadata / "version-hint.text").read_text().strip()
    arrow = StaticTable.from_metadata(str(metadata / f"v{version}.metadata.json")).scan().to_arrow()
    names = [c for c in arrow.column_names if not c.startswith("_cdc_")]
    rows = sorted(arrow.select(names).to_pylist(), key=lambda r: tuple(r[k] for k in keys))
    return names, [tuple(iceberg_value(r[c]) for c in names) for r in rows]


def iceberg_value(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"elements", "text"}:  # an array column
        assert value["text"] is None
        return normalize(value["elements"])
    return normalize(value)


def test_every_envelope_into_delta_and_iceberg_across_a_restart(
    spark: SparkSession, sources: Sources, tmp_path: Path
) -> None:
    s, db = sources, sources.db
    jobs = job_options(s, tmp_path)
    first_part(db)
    s.abort_junk()
    s.wait()
    run_jobs(spark, jobs)

    second_part(db)
    s.abort_junk()
    third_part(db)
    s.wait()
    run_jobs(spark, jobs)  # each job restarted from its checkpoint

    for name in ("cdcd-debezium", "debezium"):
        assert_mirrors_equal(spark, db, Path(str(jobs[name].mirror)))
    for table, keys in TABLES.items():
        assert iceberg_rows(tmp_path / "warehouse", table, keys) == source_rows(db, table, keys), table
    # The aborted junk is in the topic (a read_uncommitted reader gets it), the job never read it.
    bootstrap = s.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"]
    junk = [m for m in read_partitions(bootstrap, s.native.prefix, "read_uncommitted") if m.key() == b"junk"]
    assert len(junk) == 12
    # The Iceberg changelog holds every committed event of the topic once (tombstones are not events).
    events = {(str(m.topic()), m.partition(), m.offset()) for m in read_partitions(bootstrap, s.native.prefix)
              if m.value() is not None and m.topic() == f"{s.native.prefix}.shop.items"}  # fmt: skip
    changelog = tmp_path / "warehouse" / "changelog" / "shop" / "items" / "metadata"
    version = (changelog / "version-hint.text").read_text().strip()
    logged = StaticTable.from_metadata(str(changelog / f"v{version}.metadata.json")).scan().to_arrow()
    offsets = list(zip(logged["_partition"].to_pylist(), logged["_offset"].to_pylist(), strict=True))
    assert len(offsets) == len(set(offsets)) == len(events)


# -- Debezium's semantic types, converted by Spark ------------------------------------------------------------

_DATE = {"type": "int", "connect.name": "io.debezium.time.Date"}
_VSD = {"type": "record", "name": "VariableScaleDecimal", "connect.name": "io.debezium.data.VariableScaleDecimal",
        "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}]}  # fmt: skip


def _semantic(name: str, base: str) -> dict[str, Any]:
    return {"type": base, "connect.name": f"io.debezium.{name}"}


# (Avro type, decoded value as SQL, the mirror's value as Python)
CONVERSIONS: list[tuple[Any, str, Any]] = [
    (_semantic("time.ZonedTimestamp", "string"), "'2024-05-03T10:34:56.123456Z'",
     dt.datetime(2024, 5, 3, 10, 34, 56, 123456, tzinfo=dt.UTC)),
    (_semantic("time.ZonedTimestamp", "string"), "'2024-05-03T10:34:56Z'", dt.datetime(2024, 5, 3, 10, 34, 56,
                                                                                         tzinfo=dt.UTC)),
    (_semantic("time.MicroTimestamp", "long"), "1714732496123456", dt.datetime(2024, 5, 3, 10, 34, 56, 123456)),
    (_semantic("time.MicroTimestamp", "long"), "-62135596800000000", dt.datetime(1, 1, 1)),
    (_semantic("time.Timestamp", "long"), "1714732496123", dt.datetime(2024, 5, 3, 10, 34, 56, 123000)),
    (_semantic("time.NanoTimestamp", "long"), "1714732496123456789", dt.datetime(2024, 5, 3, 10, 34, 56, 123456)),
    (_DATE, "19846", dt.date(2024, 5, 3)),
    (_DATE, "-719162", dt.date(1, 1, 1)),
    (_semantic("time.MicroTime", "long"), "45296789000", 45296789000),
    (_semantic("time.Time", "int"), "45296789", 45296789000),
    (_semantic("time.NanoTime", "long"), "45296789000123", 45296789000),
    (_semantic("time.MicroDuration", "long"), "-259200000000", -259200000000),
    (_semantic("data.Uuid", "string"), "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
     "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    (_semantic("data.Json", "string"), "'{\"a\": 1}'", '{"a": 1}'),
    (_VSD, "named_struct('scale', 6, 'value', X'ff')", "-0.000001"),
    (_VSD, "named_struct('scale', 0, 'value', X'64')", "100"),
    (_VSD, "named_struct('scale', 5, 'value', X'04cb2f')", "3.14159"),
    (_VSD, "named_struct('scale', 2, 'value', X'ff7f')", "-1.29"),
    (_VSD, "named_struct('scale', 0, 'value', X'00')", "0"),
    (_VSD, "named_struct('scale', 3, 'value', X'7fffffffffffffffffff')", "604462909807314587353.087"),
    (_VSD, "CAST(NULL AS struct<scale: int, value: binary>)", None),  # NaN
    ({"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2, "connect.name":
      "org.apache.kafka.connect.data.Decimal"}, "CAST(12345678.91 AS decimal(10,2))", Decimal("12345678.91")),
    ({"type": "array", "items": ["null", _DATE]}, "array(19846, NULL)", [dt.date(2024, 5, 3), None]),
]  # fmt: skip


def test_debeziums_semantic_types_in_spark(spark: SparkSession) -> None:
    """Each conversion evaluated by Spark on a decoded value (Debezium's forms, as test_debezium_envelope checks
    cdcd writes them), ±infinity timestamps as the instants cdcd's native envelope gives them, and the
    placeholder of an unchanged TOAST value recognized in each form Debezium sends it."""
    selected = [f"{mapping(avro).apply(value)} AS c{i}" for i, (avro, value, _) in enumerate(CONVERSIONS)]
    row = spark.sql(f"SELECT {', '.join(selected)}").first()
    assert row is not None
    got = [row[f"c{i}"] for i in range(len(CONVERSIONS))]
    want = [expected for _, _, expected in CONVERSIONS]
    # Spark hands instants over as naive local time
    instants = [
        g.astimezone(dt.UTC) if isinstance(w, dt.datetime) and w.tzinfo else g for g, w in zip(got, want, strict=True)
    ]
    assert instants == want
    zoned = mapping(_semantic("time.ZonedTimestamp", "string"))
    infinities = spark.sql(
        f"SELECT unix_micros({zoned.apply(repr('infinity'))}) AS p, unix_micros({zoned.apply(repr('-infinity'))}) AS n"
    ).first()
    assert infinities is not None
    assert (infinities["p"], infinities["n"]) == (2**63 - 1, -(2**63))
    data = UNAVAILABLE.encode()
    forms = {"string": repr(UNAVAILABLE), "binary": f"X'{data.hex()}'", "array<string>": f"array({UNAVAILABLE!r})",
             "array<int>": f"array({', '.join(map(str, data))})", "array<binary>": f"array(X'{data.hex()}')",
             "array<bigint>": f"array({', '.join(f'{b}L' for b in data)})"}  # fmt: skip
    checks = []
    for raw, form in forms.items():
        check = placeholder_sql(raw)
        assert check is not None
        checks += [check.replace(VALUE, form), check.replace(VALUE, f"CAST(NULL AS {raw})")]
    found = spark.sql(f"SELECT {', '.join(f'{c} AS c{i}' for i, c in enumerate(checks))}").first()
    assert found is not None
    assert list(found) == [True, False] * len(forms)
