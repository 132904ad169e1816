"""cdcd.spark.schema without Spark: cdcd's Avro types as mirror column types, and schema alignment."""

from __future__ import annotations

import copy
import hashlib
import uuid
from typing import Any

import pytest

from cdcd.avro.schema import build_schemas
from cdcd.pgoutput.messages import Column as PgColumn
from cdcd.pgoutput.messages import Relation
from cdcd.spark.schema import (
    DEBEZIUM,
    NATIVE,
    UNAVAILABLE,
    VALUE,
    Column,
    TableSchema,
    UnsupportedSchema,
    aligned_struct,
    envelope,
    key_columns,
    key_json_ddl,
    mapping,
    placeholder_sql,
    spark_type,
    table_schema,
    unchanged_sql,
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
    columns = table_schema(envelope).columns
    assert [(c.name, c.ddl, c.convert) for c in columns] == [("id", "int", VALUE), ("c", expected, VALUE)]


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


# (type OID, typmod) -> Spark type, decoded type, converted by SQL, in Debezium's type map (kafka.envelope:
# debezium), which tests/integration/test_debezium_envelope.py checks against Debezium's own schemas
DEBEZIUM_CASES = [
    (21, -1, "int", "int", False),
    (1700, (10 << 16 | 2) + 4, "decimal(10,2)", "decimal(10,2)", False),
    (1700, -1, "string", "struct<`scale`: int, `value`: binary>", True),  # VariableScaleDecimal
    (1082, -1, "date", "int", True),
    (1083, -1, "bigint", "bigint", False),  # MicroTime
    (1083, 3, "bigint", "int", True),  # Time (ms)
    (1114, -1, "timestamp_ntz", "bigint", True),  # MicroTimestamp
    (1114, 3, "timestamp_ntz", "bigint", True),  # Timestamp (ms)
    (1184, -1, "timestamp", "string", True),  # ZonedTimestamp
    (1266, -1, "string", "string", False),  # ZonedTime
    (1186, -1, "bigint", "bigint", False),  # MicroDuration
    (2950, -1, "string", "string", False),  # Uuid
    (3802, -1, "string", "string", False),  # Json
    (1182, -1, "struct<elements: array<date>, text: string>", "struct<member0: array<int>, member1: string>", True),
]


@pytest.mark.parametrize(("oid", "typmod", "ddl", "decoded", "converted"), DEBEZIUM_CASES)
def test_debeziums_semantic_types_have_spark_types(
    oid: int, typmod: int, ddl: str, decoded: str, converted: bool
) -> None:
    schemas = build_schemas(relation(("id", 23, -1, True), ("c", oid, typmod, False)), "p", debezium=True)
    column = envelope(schemas.envelope).table.columns[1]
    assert (column.ddl, column.decoded, column.convert != VALUE) == (ddl, decoded, converted)


def test_semantic_conversions_are_sql_of_the_decoded_value() -> None:
    assert mapping({"type": "int", "connect.name": "io.debezium.time.Date"}).apply("x") == "date_from_unix_date(x)"
    micro = mapping({"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"}).apply("x")
    assert micro == "timestampadd(MICROSECOND, x, TIMESTAMP_NTZ'1970-01-01 00:00:00')"
    dates = mapping({"type": "array", "items": ["null", {"type": "int", "connect.name": "io.debezium.time.Date"}]})
    assert (dates.ddl, dates.raw) == ("array<date>", "array<int>")
    assert dates.apply("a") == "transform(a, x0 -> date_from_unix_date(x0))"
    plain = mapping({"type": "array", "items": ["null", "string"]})
    assert (plain.ddl, plain.convert) == ("array<string>", VALUE)


def test_envelope_layouts() -> None:
    rel = relation(("id", 23, -1, True), ("v", 25, -1, False))
    native = envelope(build_schemas(rel, "p").envelope)
    assert (native.layout, native.commit_lsn, native.unchanged_toast) == (NATIVE, True, True)
    cdcd_debezium = envelope(build_schemas(rel, "p", debezium=True).envelope)
    assert (cdcd_debezium.layout, cdcd_debezium.commit_lsn, cdcd_debezium.unchanged_toast) == (DEBEZIUM, True, True)
    theirs = debezium_own(build_schemas(rel, "p", debezium=True).envelope)
    own = envelope(theirs)
    assert (own.layout, own.commit_lsn, own.unchanged_toast) == (DEBEZIUM, False, False)
    assert own.table == cdcd_debezium.table
    with pytest.raises(UnsupportedSchema, match="a debezium envelope, but the job reads native ones"):
        envelope(theirs, "native")
    with pytest.raises(UnsupportedSchema, match="a native envelope, but the job reads debezium ones"):
        envelope(build_schemas(rel, "p").envelope, "debezium")


def debezium_own(schema: dict[str, Any]) -> dict[str, Any]:
    """The envelope as Debezium writes it: cdcd's Debezium layout without unchanged_toast and commit_lsn."""
    out = copy.deepcopy(schema)
    out["fields"] = [f for f in out["fields"] if f["name"] != "unchanged_toast"]
    source = next(f for f in out["fields"] if f["name"] == "source")["type"]
    source["fields"] = [f for f in source["fields"] if f["name"] != "commit_lsn"]
    return out


def test_placeholders_by_decoded_type() -> None:
    text = placeholder_sql("string")
    assert text is not None
    assert "'__debezium_unavailable_value'" in text
    assert placeholder_sql("binary") == f"({VALUE} <=> X'{b'__debezium_unavailable_value'.hex()}')"
    ints = placeholder_sql("array<int>", "ab")
    assert ints == f"({VALUE} <=> array(97, 98))"
    uuids = placeholder_sql("array<string>", "x")
    assert uuids is not None
    java = uuid.UUID(bytes=hashlib.md5(b"x").digest(), version=3)  # Java's nameUUIDFromBytes
    assert f"array('{java}')" in uuids
    assert placeholder_sql("int") is None
    assert placeholder_sql("timestamp") is None


def test_unchanged_columns_by_placeholder() -> None:
    schema = TableSchema((Column("id", "int"), Column("big", "string"), Column("raw", "binary")))
    sql = unchanged_sql("e.after", schema)
    assert sql.startswith("CASE WHEN e.after IS NULL THEN CAST(array() AS array<string>) ELSE array_compact(array(")
    assert "THEN 'big' END" in sql
    assert "THEN 'raw' END" in sql
    assert "'id'" not in sql
    assert unchanged_sql("e.after", TableSchema((Column("id", "int"),))) == "CAST(array() AS array<string>)"
    aligned = aligned_struct("e.after", schema, schema, UNAVAILABLE)
    assert "CASE WHEN (e.after.`big` <=> '__debezium_unavailable_value'" in aligned


def test_keys_from_json_headers() -> None:
    key = {"type": "record", "name": "Key", "fields": [
        {"name": "id", "type": "int"},
        {"name": "day", "type": {"type": "int", "connect.name": "io.debezium.time.Date"}},
        {"name": "n", "type": {"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 2}},
    ]}  # fmt: skip
    ddl, values = key_json_ddl(key)
    assert ddl == "struct<`id`: int, `day`: int, `n`: string>"
    assert values == [
        ("id", VALUE),
        ("day", f"date_from_unix_date({VALUE})"),
        ("n", f"try_cast({VALUE} AS decimal(5,2))"),
    ]
