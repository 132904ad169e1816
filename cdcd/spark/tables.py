"""Where the mirror and changelog tables live: Delta tables on paths, or Iceberg tables in a catalog.

The job's SQL (merge.py) names a table by what :meth:`Tables.name` returns; everything else that differs
between the two formats is here: whether a table exists, how it is created (with the job's table properties),
and the changelog's idempotent append.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from pyspark.sql import DataFrame, SparkSession

from cdcd.spark.schema import literal, quote

log = logging.getLogger("cdcd.spark")

DELTA_MIRROR_PROPERTIES: Final = {
    "delta.columnMapping.mode": "name",  # lets dropped columns be dropped
    "delta.enableDeletionVectors": "true",  # a MERGE marks replaced rows instead of rewriting whole files
}
ICEBERG_MIRROR_PROPERTIES: Final = {
    "format-version": "2",
    # A MERGE, UPDATE or DELETE writes position delete files instead of rewriting every data file it touches
    # (Delta's deletion vectors, in Iceberg's format 2, which every Iceberg reader supports).
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
}
ICEBERG_CHANGELOG_PROPERTIES: Final = {
    "format-version": "2",
    "write.spark.accept-any-schema": "true",  # appends add the columns of newer schemas (merge-schema)
}
CHECKPOINT_PROPERTY: Final = "cdcd.checkpoint"
BATCH_PROPERTY: Final = "cdcd.batch"
ICEBERG_EXTENSIONS: Final = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"


def _properties(props: dict[str, str]) -> str:
    return ", ".join(f"{literal(k)} = {literal(v)}" for k, v in props.items())


class Where(NamedTuple):
    """A mirror or changelog table: ``root`` is the mirror's or the changelog's (a path for Delta, a namespace
    for Iceberg), then the source table's schema and name."""

    root: str
    schema: str
    table: str


class Tables:
    """One format's tables."""

    def name(self, where: Where) -> str:
        raise NotImplementedError

    def exists(self, spark: SparkSession, where: Where) -> bool:
        raise NotImplementedError

    def create_mirror(self, spark: SparkSession, where: Where, columns: str, props: dict[str, str]) -> None:
        raise NotImplementedError

    def append(self, events: DataFrame, where: Where, checkpoint: str, batch_id: int) -> None:
        """Append a micro-batch's events to the changelog table, once: a batch replayed after a crash is not
        appended again."""
        raise NotImplementedError


@dataclass
class DeltaTables(Tables):
    """Delta tables at ``<root>/<schema>/<table>``; the changelog may be Parquet (at least once)."""

    changelog_format: str = "delta"

    @staticmethod
    def path(where: Where) -> str:
        return f"{where.root.rstrip('/')}/{where.schema}/{where.table}"

    def name(self, where: Where) -> str:
        return f"delta.{quote(self.path(where))}"

    def exists(self, spark: SparkSession, where: Where) -> bool:
        from delta.tables import DeltaTable  # noqa: PLC0415 - the delta package is only needed with Delta

        return bool(DeltaTable.isDeltaTable(spark, self.path(where)))

    def create_mirror(self, spark: SparkSession, where: Where, columns: str, props: dict[str, str]) -> None:
        listed = _properties({**DELTA_MIRROR_PROPERTIES, **props})
        spark.sql(f"CREATE TABLE IF NOT EXISTS {self.name(where)} ({columns}) USING delta TBLPROPERTIES ({listed})")

    def append(self, events: DataFrame, where: Where, checkpoint: str, batch_id: int) -> None:
        writer = events.write.mode("append").format(self.changelog_format)
        if self.changelog_format == "delta":
            # Delta skips a (txnAppId, txnVersion) it already committed: a replayed batch is not appended twice.
            writer = writer.option("txnAppId", checkpoint).option("txnVersion", str(batch_id))
            writer = writer.option("mergeSchema", "true")
        writer.save(self.path(where))


@dataclass
class IcebergTables(Tables):
    """Iceberg tables ``<catalog>.<root>.<schema>.<table>`` (``root`` may itself have several dot-separated
    parts): namespaces are made as needed."""

    catalog: str
    _last_batch: dict[str, int] = field(default_factory=dict)  # changelog table -> newest batch appended

    def _parts(self, where: Where) -> list[str]:
        return [self.catalog, *where.root.split("."), where.schema, where.table]

    def name(self, where: Where) -> str:
        return ".".join(quote(p) for p in self._parts(where))

    def exists(self, spark: SparkSession, where: Where) -> bool:
        return bool(spark.catalog.tableExists(self.name(where)))

    def _namespaces(self, spark: SparkSession, where: Where) -> None:
        parts = self._parts(where)[:-1]
        for end in range(2, len(parts) + 1):
            spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {'.'.join(quote(p) for p in parts[:end])}")

    def create_mirror(self, spark: SparkSession, where: Where, columns: str, props: dict[str, str]) -> None:
        self._namespaces(spark, where)
        listed = _properties({**ICEBERG_MIRROR_PROPERTIES, **props})
        spark.sql(f"CREATE TABLE IF NOT EXISTS {self.name(where)} ({columns}) USING iceberg TBLPROPERTIES ({listed})")

    def append(self, events: DataFrame, where: Where, checkpoint: str, batch_id: int) -> None:
        """Each append's snapshot records the checkpoint and the batch id in its summary; a batch at or below
        the newest one recorded for this checkpoint was appended already."""
        spark = events.sparkSession
        name = self.name(where)
        if name not in self._last_batch:
            exists = self.exists(spark, where)
            self._last_batch[name] = self._recorded_batch(spark, name, checkpoint) if exists else -1
        if batch_id <= self._last_batch[name]:
            log.info("changelog %s: batch %d was appended before", name, batch_id)
            return
        writer = events.writeTo(name).option(f"snapshot-property.{CHECKPOINT_PROPERTY}", checkpoint)
        writer = writer.option(f"snapshot-property.{BATCH_PROPERTY}", str(batch_id))
        if self.exists(spark, where):
            writer.option("merge-schema", "true").append()
        else:
            self._namespaces(spark, where)
            for key, value in ICEBERG_CHANGELOG_PROPERTIES.items():
                writer = writer.tableProperty(key, value)
            writer.using("iceberg").create()
        self._last_batch[name] = batch_id

    @staticmethod
    def _recorded_batch(spark: SparkSession, name: str, checkpoint: str) -> int:
        row = spark.sql(
            f"SELECT max(CAST(summary[{literal(BATCH_PROPERTY)}] AS bigint)) AS batch FROM {name}.snapshots "
            f"WHERE summary[{literal(CHECKPOINT_PROPERTY)}] = {literal(checkpoint)}"
        ).first()
        return -1 if row is None or row["batch"] is None else int(row["batch"])


def iceberg_catalog_conf(catalog: str, warehouse: str | None, uri: str | None) -> dict[str, str]:
    """The Spark settings of an Iceberg catalog named ``catalog``: a REST catalog at ``uri`` (``warehouse``,
    if given, is the warehouse it serves), else a Hadoop catalog on the path ``warehouse``; none when neither
    is given (the catalog is then configured with --conf)."""
    prefix = f"spark.sql.catalog.{catalog}"
    if uri:
        conf = {prefix: "org.apache.iceberg.spark.SparkCatalog", f"{prefix}.type": "rest", f"{prefix}.uri": uri}
        if warehouse:
            conf[f"{prefix}.warehouse"] = warehouse
        return conf
    if warehouse:
        return {prefix: "org.apache.iceberg.spark.SparkCatalog", f"{prefix}.type": "hadoop",
                f"{prefix}.warehouse": warehouse}  # fmt: skip
    return {}
