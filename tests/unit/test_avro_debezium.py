"""Debezium's type map (``kafka.envelope: debezium``): values as Debezium 3.6 sent them for the same PostgreSQL
values (captured by tests/integration/test_debezium_envelope.py), written by the encoder (compiled and Python)
and read back by fastavro with the registered schema."""

from __future__ import annotations

import io
import struct
from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdcd.avro import EnvelopeEncoder, SourceInfo, TxInfo, build_schemas
from cdcd.avro.debezium import civil_from_days, debezium_mapping, java_decimal_bytes, zoned_timestamp
from cdcd.pgoutput.messages import Column, Relation
from cdcd.pgtypes import days_from_civil
from cdcd.rowstage import STAGE

# (type oid, typmod, PostgreSQL text, what Debezium sent, its connect.name)
CASES: list[tuple[int, int, str, Any, str | None]] = [
    (1184, -1, "2024-05-03 12:34:56.123456+02", "2024-05-03T10:34:56.123456Z", "io.debezium.time.ZonedTimestamp"),
    (1184, -1, "2024-05-03 12:00:00+00", "2024-05-03T12:00:00.000000Z", "io.debezium.time.ZonedTimestamp"),
    (1184, -1, "-infinity", "-infinity", "io.debezium.time.ZonedTimestamp"),
    (1184, -1, "infinity", "infinity", "io.debezium.time.ZonedTimestamp"),
    (1184, 3, "2024-05-03 12:00:00.5+00", "2024-05-03T12:00:00.500Z", "io.debezium.time.ZonedTimestamp"),
    (1266, -1, "12:34:56.789+02", "10:34:56.789Z", "io.debezium.time.ZonedTime"),
    (1266, -1, "00:30:00-03:30", "04:00:00Z", "io.debezium.time.ZonedTime"),
    (1114, -1, "2024-05-03 12:34:56.123456", 1714739696123456, "io.debezium.time.MicroTimestamp"),
    (1114, -1, "infinity", 9223372036825200000, "io.debezium.time.MicroTimestamp"),
    (1114, 3, "2024-05-03 12:34:56.123", 1714739696123, "io.debezium.time.Timestamp"),
    (1114, 3, "-infinity", -9223372036832400, "io.debezium.time.Timestamp"),
    (1083, -1, "12:34:56.123456", 45296123456, "io.debezium.time.MicroTime"),
    (1083, 3, "12:34:56.789", 45296789, "io.debezium.time.Time"),
    (1082, -1, "2024-05-03", 19846, "io.debezium.time.Date"),
    (1186, -1, "1 year 2 mons 3 days 04:05:06.5", 37091106500000, "io.debezium.time.MicroDuration"),
    (1186, -1, "-3 days", -259200000000, "io.debezium.time.MicroDuration"),
    (1700, -1, "3.14159", {"scale": 5, "value": b"\x04\xcb/"}, "io.debezium.data.VariableScaleDecimal"),
    (1700, -1, "-0.000001", {"scale": 6, "value": b"\xff"}, "io.debezium.data.VariableScaleDecimal"),
    (1700, -1, "1.50", {"scale": 1, "value": b"\x0f"}, "io.debezium.data.VariableScaleDecimal"),
    (1700, -1, "100", {"scale": 0, "value": b"\x64"}, "io.debezium.data.VariableScaleDecimal"),
    (1700, -1, "NaN", None, "io.debezium.data.VariableScaleDecimal"),
    (1700, (10 << 16 | 2) + 4, "-1.28", b"\x80", "org.apache.kafka.connect.data.Decimal"),
    (1700, (10 << 16 | 2) + 4, "12345678.91", b"\x49\x96\x02\xd3", "org.apache.kafka.connect.data.Decimal"),
    (2950, -1, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "io.debezium.data.Uuid"),
    (21, -1, "2", 2, None),
]


def _schema_of(branch: Any) -> Any:
    """The schema without logical types: values read as written (decimal bytes), as Debezium's consumers see."""
    if isinstance(branch, dict):
        return {k: _schema_of(v) for k, v in branch.items() if k != "logicalType"}
    if isinstance(branch, list):
        return [_schema_of(b) for b in branch]
    return branch


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
@pytest.mark.parametrize(("oid", "typmod", "text", "expected", "connect_name"), CASES)
def test_values_as_debezium_sends_them(  # noqa: PLR0917 - the parameters of the cases
    oid: int, typmod: int, text: str, expected: Any, connect_name: str | None, native: bool
) -> None:
    relation = Relation(1, "public", "t", "d", (Column("id", 23, -1, True), Column("v", oid, typmod, False)))
    schemas = build_schemas(relation, "p", debezium=True)
    encoder = EnvelopeEncoder(schemas, stage=STAGE if native else None)
    value = encoder.encode_value("c", None, ("1", text), SourceInfo("1", "db", 0), 16, None)
    record = fastavro.schemaless_reader(io.BytesIO(value), fastavro.parse_schema(_schema_of(schemas.envelope)), None)
    assert record["after"] == {"id": 1, "v": expected}  # type: ignore[index,call-overload]
    branch = schemas.value["fields"][1]["type"][1]
    assert (branch.get("connect.name") if isinstance(branch, dict) else None) == connect_name
    if oid == 21:
        assert branch == {"type": "int", "connect.type": "int16"}


def test_the_binary_forms_convert_as_the_text_forms() -> None:
    numeric_send = struct.pack(">hhHhhh", 2, 0, 0, 5, 3, 1415)  # 3.14150: two base-10000 digits, dscale 5
    mapping = debezium_mapping(1700)
    assert mapping.from_binary(numeric_send) == mapping.from_text("3.1415")
    interval = struct.pack(">qii", 14_706_500_000, 3, 14)
    assert debezium_mapping(1186).from_binary(interval) == 37091106500000
    timestamptz = struct.pack(">q", 0)  # 2000-01-01 00:00:00 UTC
    assert debezium_mapping(1184).from_binary(timestamptz) == "2000-01-01T00:00:00.000000Z"


def test_every_timestamptz_renders_its_utc_date_and_time() -> None:
    assert zoned_timestamp(0) == "1970-01-01T00:00:00.000000Z"
    assert zoned_timestamp(-1, 3) == "1969-12-31T23:59:59.999Z"
    assert zoned_timestamp(-1, 0) == "1969-12-31T23:59:59Z"
    bc = days_from_civil(-43, 3, 15) * 86_400_000_000  # 44 BC is astronomical year -43
    assert zoned_timestamp(bc) == "-0043-03-15T00:00:00.000000Z"
    assert zoned_timestamp(days_from_civil(10000, 1, 1) * 86_400_000_000 + 10) == "+10000-01-01T00:00:00.000010Z"


@given(st.integers(-(10**8), 10**8))
def test_days_round_trip(days: int) -> None:
    assert days_from_civil(*civil_from_days(days)) == days


@given(st.integers(-(2**200), 2**200))
def test_java_decimal_bytes_are_the_shortest_twos_complement(n: int) -> None:
    b = java_decimal_bytes(n)
    assert int.from_bytes(b, "big", signed=True) == n
    assert len(b) == 1 or int.from_bytes(b[1:], "big", signed=True) != n  # one byte fewer would not do


def test_cdcds_own_map_is_unchanged_without_the_debezium_envelope() -> None:
    relation = Relation(1, "public", "t", "d", (Column("ts", 1184, -1, True),))
    native = build_schemas(relation, "p")
    assert native.value["fields"][0]["type"][1] == {"type": "long", "logicalType": "timestamp-micros"}


DEBEZIUM_TABLE = Relation(
    7,
    "shop",
    "orders",
    "d",
    (
        Column("id", 20, -1, True),
        Column("note", 25, -1, False, True),  # NOT NULL: not nullable in the Value record, '' when missing
        Column("at", 1184, -1, False),
        Column("amount", 1700, (10 << 16 | 2) + 4, False),
    ),
)


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
@given(
    op=st.sampled_from(["c", "u", "d", "r", "t"]),
    note=st.none() | st.just(...) | st.text(max_size=20),
    tx=st.none() | st.integers(0, 2**32),
    lsn=st.none() | st.integers(0, 2**62),
    ts_us=st.none() | st.integers(0, 2**52),
    order=st.none() | st.tuples(st.integers(1, 10**6), st.integers(1, 10**6)),
    origin=st.none() | st.text(max_size=8),
)
def test_the_debezium_envelope_is_what_fastavro_writes(  # noqa: PLR0917 - the generated parts
    native: bool,
    op: str,
    note: Any,
    tx: int | None,
    lsn: int | None,
    ts_us: int | None,
    order: tuple[int, int] | None,
    origin: str | None,
) -> None:
    schemas = build_schemas(DEBEZIUM_TABLE, "p", debezium=True)
    encoder = EnvelopeEncoder(schemas, stage=STAGE if native else None)
    row = ("7", note, "2024-05-03 12:34:56.5+02", "12.50")
    before = None if op in ("c", "r", "t") else (row[0], row[1] if row[1] is not ... else None, *row[2:])
    after = None if op in ("d", "t") else row
    source = SourceInfo("3.6", "db", 1_714_732_496_500_000, "false", tx, 99, 42, origin)
    transaction = None if order is None else TxInfo(f"{tx}:99", *order)
    written = encoder.encode_value(op, before, after, source, lsn, ts_us, transaction)
    expected = io.BytesIO()
    record = encoder.envelope_record(op, before, after, source, lsn, ts_us, transaction)
    fastavro.schemaless_writer(expected, fastavro.parse_schema(schemas.envelope), record)
    assert written == expected.getvalue()
    read = fastavro.schemaless_reader(io.BytesIO(written), fastavro.parse_schema(_schema_of(schemas.envelope)), None)
    assert [f["name"] for f in schemas.envelope["fields"]] == [
        "before", "after", "source", "transaction", "op", "ts_ms", "ts_us", "ts_ns", "unchanged_toast"
    ]  # fmt: skip
    if order is not None:
        assert read["transaction"]["id"] == (f"{tx}:99" if tx is None or lsn is None else f"{tx}:{lsn}")  # type: ignore[index,call-overload]
    assert read["source"]["ts_ns"] == 1_714_732_496_500_000_000  # type: ignore[index,call-overload]
    if before is not None:
        assert read["before"]["note"] == (note if isinstance(note, str) else "")  # type: ignore[index,call-overload]
    if after is not None and note is ...:
        assert read["after"]["note"] == "__debezium_unavailable_value"  # type: ignore[index,call-overload]
        assert read["unchanged_toast"] == ["note"]  # type: ignore[index,call-overload]
    value = next(f for f in schemas.value["fields"] if f["name"] == "note")
    assert value["type"] == "string"


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_a_key_only_before_image_holds_debeziums_zero_of_each_not_null_type(native: bool) -> None:
    """A delete under the default replica identity sends the key alone: Debezium fills the other NOT NULL columns
    with its placeholder zero. A timestamptz's and a timetz's are times, not '' (which the Spark mirror, casting
    the field, cannot read)."""
    relation = Relation(
        8,
        "shop",
        "events",
        "d",
        (
            Column("id", 20, -1, True),
            Column("at", 1184, -1, False, True),
            Column("at_time", 1266, -1, False, True),
            Column("note", 25, -1, False, True),
            Column("n", 23, -1, False, True),
        ),
    )
    schemas = build_schemas(relation, "p", debezium=True)
    encoder = EnvelopeEncoder(schemas, stage=STAGE if native else None)
    source = SourceInfo("3.6", "db", 1_714_732_496_500_000, "false", 5, 99, 42, None)
    written = encoder.encode_value("d", ("7", None, None, None, None), None, source, 99, 1, None)
    read = fastavro.schemaless_reader(io.BytesIO(written), fastavro.parse_schema(_schema_of(schemas.envelope)), None)
    before = read["before"]  # type: ignore[call-overload,index]
    assert before == {"id": 7, "at": "1970-01-01T00:00:00Z", "at_time": "00:00:00Z", "note": "", "n": 0}
