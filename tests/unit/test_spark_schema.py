"""cdcd.spark.schema without Spark: cdcd's Avro types as mirror column types, and schema alignment."""

from __future__ import annotations

from typing import Any

import pytest

from cdcd.avro.schema import build_schemas
from cdcd.pgoutput.messages import Column as PgColumn
from cdcd.pgoutput.messages import Relation
from cdcd.spark.schema import (
    Column,
    TableSchema,
    UnsupportedSchema,
    aligned_struct,
    key_columns,
    spark_type,
    table_schema,
    union,
)

# (type OID, typmod) -> Spark type, through cdcd's own Avro mapping
CASES = [
    (16, -1, "boolean"),
    (21, -1, "int"),
    (23, -1, "int"),
    (20, -1, "bigint"),
    (26, -1, "bigint"),
    (700, -1, "float"),
    (701, -1, "double"),
    (1700, (10 << 16 | 2) + 4, "decimal(10,2)"),
    (1700, -1, "string"),
    (25, -1, "string"),
    (3802, -1, "string"),
    (2950, -1, "string"),
    (17, -1, "binary"),
    (1082, -1, "date"),
    (1083, -1, "bigint"),
    (1114, -1, "timestamp_ntz"),
    (1184, -1, "timestamp"),
    (1186, -1, "string"),
    (1007, -1, "struct<elements: array<int>, text: string>"),
    (99999, -1, "string"),
]


def relation(*columns: tuple[str, int, int, bool]) -> Relation:
    cols = tuple(PgColumn(name, oid, mod, key) for name, oid, mod, key in columns)
    return Relation(1, "public", "t", "d", cols)


@pytest.mark.parametrize(("oid", "typmod", "expected"), CASES)
def test_every_cdcd_type_has_a_spark_type(oid: int, typmod: int, expected: str) -> None:
    envelope = build_schemas(relation(("id", 23, -1, True), ("c", oid, typmod, False)), "p").envelope
    assert table_schema(envelope).columns == (Column("id", "int"), Column("c", expected))


def test_decimals_beyond_spark_precision_are_refused() -> None:
    with pytest.raises(UnsupportedSchema, match="at most 38"):
        spark_type({"type": "bytes", "logicalType": "decimal", "precision": 50, "scale": 2})


def test_reserved_column_names_are_refused() -> None:
    envelope = build_schemas(relation(("_cdc_lsn", 23, -1, True)), "p").envelope
    with pytest.raises(UnsupportedSchema, match="reserved"):
        table_schema(envelope)


def test_key_columns_from_the_key_schema() -> None:
    schemas = build_schemas(relation(("a", 23, -1, True), ("b", 25, -1, True), ("c", 25, -1, False)), "p")
    key: dict[str, Any] | None = schemas.key
    assert key is not None
    assert key_columns(key) == ("a", "b")


OLD = TableSchema((Column("id", "int"), Column("gone", "string"), Column("v", "string")))
NEW = TableSchema((Column("id", "int"), Column("v", "string"), Column("added", "date")))


def test_aligned_struct_fills_added_columns_and_leaves_dropped_ones_out() -> None:
    sql = aligned_struct("e.after", OLD, NEW)
    assert sql == (
        "CASE WHEN e.after IS NULL THEN NULL ELSE named_struct('id', CAST(e.after.`id` AS int), "
        "'v', CAST(e.after.`v` AS string), 'added', CAST(NULL AS date)) END"
    )


def test_union_keeps_every_column_in_first_seen_order_and_refuses_type_changes() -> None:
    assert union([OLD, NEW]).names == ("id", "gone", "v", "added")
    with pytest.raises(UnsupportedSchema, match="changed type from int to bigint"):
        union([OLD, TableSchema((Column("id", "bigint"),))])


def test_quoting_of_odd_names() -> None:
    odd = TableSchema((Column("we`ird", "int"),))
    assert "e.after.`we``ird`" in aligned_struct("e.after", odd, odd)
    assert "'we`ird'" in aligned_struct("e.after", odd, odd)
