"""Known values: every mapped type from its text and its binary form, and the schema decisions."""

from __future__ import annotations

import struct
from typing import Any

import fastavro
import pytest

from cdcd.avro import ConversionError, SchemaError, build_schemas, sanitize, type_mapping
from cdcd.avro.types import decimal_bytes, format_interval
from cdcd.pgoutput.messages import Column, Relation, Type
from cdcd.pgtypes import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    IrregularArray,
    days_from_civil,
    parse_interval_text,
    split_array_text,
)

PG_EPOCH_US = 946_684_800_000_000


def numeric_typmod(precision: int, scale: int) -> int:
    return ((precision << 16) | (scale & 0x7FF)) + 4


def text(oid: int, value: str, typmod: int = -1) -> Any:
    return type_mapping(oid, typmod).from_text(value)


def binary(oid: int, value: bytes, typmod: int = -1) -> Any:
    return type_mapping(oid, typmod).from_binary(value)


def numeric_send(digits: list[int], weight: int, sign: int, dscale: int) -> bytes:
    return struct.pack(">hhHh", len(digits), weight, sign, dscale) + b"".join(struct.pack(">H", d) for d in digits)


# ------------------------------------------------------------------------------------------------ scalars


@pytest.mark.parametrize(
    ("oid", "txt", "raw", "datum"),
    [
        (16, "t", b"\x01", True),
        (16, "f", b"\x00", False),
        (21, "-32768", struct.pack(">h", -32768), -32768),
        (23, "2147483647", struct.pack(">i", 2147483647), 2147483647),
        (20, "-9223372036854775808", struct.pack(">q", INT64_MIN), INT64_MIN),
        (26, "4294967295", struct.pack(">I", 4294967295), 4294967295),
        (701, "1.5", struct.pack(">d", 1.5), 1.5),
        (700, "0.25", struct.pack(">f", 0.25), 0.25),
        (701, "-Infinity", struct.pack(">d", float("-inf")), float("-inf")),
        (25, "héllo wörld", "héllo wörld".encode(), "héllo wörld"),
        (1043, "x", b"x", "x"),
        (1042, "ab  ", b"ab  ", "ab  "),  # bpchar keeps its padding
        (19, "pg_class", b"pg_class", "pg_class"),
        (114, '{"a": [1, 2]}', b'{"a": [1, 2]}', '{"a": [1, 2]}'),
        (3802, '{"a": 1}', b'\x01{"a": 1}', '{"a": 1}'),
        (142, "<a>x</a>", b"<a>x</a>", "<a>x</a>"),
        (17, "\\x00ff10", b"\x00\xff\x10", b"\x00\xff\x10"),
        (
            2950,
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            bytes.fromhex("a0eebc999c0b4ef8bb6d6bb9bd380a11"),
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        ),
        (1082, "2000-01-01", struct.pack(">i", 0), 10957),
        (1082, "1970-01-01", struct.pack(">i", -10957), 0),
        (1082, "infinity", struct.pack(">i", INT32_MAX), INT32_MAX),
        (1082, "-infinity", struct.pack(">i", INT32_MIN), INT32_MIN),
        (1083, "13:00:00.123456", struct.pack(">q", 46_800_123_456), 46_800_123_456),
        (1083, "24:00:00", struct.pack(">q", 86_400_000_000), 86_400_000_000),
        (
            1184,
            "2026-11-21 13:00:00.123456+00",
            struct.pack(">q", 1_795_266_000_123_456 - PG_EPOCH_US),
            1_795_266_000_123_456,
        ),
        (
            1184,
            "2026-11-21 18:30:00.5+05:30",
            struct.pack(">q", 1_795_266_000_500_000 - PG_EPOCH_US),
            1_795_266_000_500_000,
        ),
        (1184, "2026-11-21 09:00:00-04", struct.pack(">q", 1_795_266_000_000_000 - PG_EPOCH_US), 1_795_266_000_000_000),
        (1114, "2026-11-21 13:00:00.1", struct.pack(">q", 1_795_266_000_100_000 - PG_EPOCH_US), 1_795_266_000_100_000),
        (1114, "infinity", struct.pack(">q", INT64_MAX), INT64_MAX),
        (1184, "-infinity", struct.pack(">q", INT64_MIN), INT64_MIN),
        (1186, "1 day 02:03:04.5", struct.pack(">qii", 7_384_500_000, 1, 0), "P0Y0M1DT2H3M4.5S"),
        (1186, "1 year 2 mons 3 days 04:05:06.789", struct.pack(">qii", 14_706_789_000, 3, 14), "P1Y2M3DT4H5M6.789S"),
        (
            1186,
            "-1 years -2 mons +3 days -04:05:06",
            struct.pack(">qii", -14_706_000_000, 3, -14),
            "P-1Y-2M3DT-4H-5M-6S",
        ),
        (1186, "00:00:00", struct.pack(">qii", 0, 0, 0), "P0Y0M0DT0H0M0S"),
        (1186, "-00:00:00.5", struct.pack(">qii", -500_000, 0, 0), "P0Y0M0DT0H0M-0.5S"),
        (1186, "100:00:00", struct.pack(">qii", 360_000_000_000, 0, 0), "P0Y0M0DT100H0M0S"),
        (1266, "13:00:00.5+05:30", struct.pack(">qi", 46_800_500_000, -19_800), "13:00:00.5+05:30"),
        (1266, "01:02:03-08", struct.pack(">qi", 3_723_000_000, 28_800), "01:02:03-08"),
    ],
)
def test_scalar_text_and_binary(oid: int, txt: str, raw: bytes, datum: Any) -> None:
    assert text(oid, txt) == datum
    assert binary(oid, raw) == datum


def test_dates_bc_and_far_future() -> None:
    assert text(1082, "0001-01-01 BC") == days_from_civil(0, 1, 1)
    assert text(1082, "0044-03-15 BC") == days_from_civil(-43, 3, 15)
    assert text(1082, "10000-01-01") == days_from_civil(10000, 1, 1) == 2_932_897
    assert text(1184, "0044-03-15 12:00:00+00 BC") == days_from_civil(-43, 3, 15) * 86_400_000_000 + 43_200_000_000
    assert days_from_civil(2000, 1, 1) == 10957


def test_timestamp_beyond_avro_long_raises() -> None:
    with pytest.raises(ValueError, match="long range"):
        binary(1184, struct.pack(">q", INT64_MAX - 1))


def test_numeric_constrained_is_decimal() -> None:
    mod = numeric_typmod(10, 2)
    m = type_mapping(1700, mod)
    assert m.branches == ({"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},)
    assert m.from_text("123.45") == decimal_bytes(12345) == b"\x30\x39"
    assert m.from_text("-123.45") == decimal_bytes(-12345)
    assert m.from_text("0.00") == b"\x00"
    assert m.from_text("5") == decimal_bytes(500)  # fewer fraction digits than the scale
    assert m.from_text("1.500") == decimal_bytes(150)  # extra zero digits are exact
    # numeric_send of 123.45: digits [123, 4500], weight 0, dscale 2
    assert m.from_binary(numeric_send([123, 4500], 0, 0, 2)) == decimal_bytes(12345)
    assert m.from_binary(numeric_send([123, 4500], 0, 0x4000, 2)) == decimal_bytes(-12345)
    assert m.from_binary(numeric_send([1], 2, 0, 0)) == decimal_bytes(10**8 * 100)  # 1 * 10000^2 at scale 2
    assert m.from_binary(numeric_send([], 0, 0, 0)) == b"\x00"
    # fastavro's own sizing: 128 needs two bytes, -128 too (it sizes by the magnitude)
    assert decimal_bytes(128) == b"\x00\x80"
    assert decimal_bytes(-128) == b"\xff\x80"
    assert decimal_bytes(-129) == b"\xff\x7f"


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_numeric_nan_and_infinity_cannot_be_decimals(value: str) -> None:
    m = type_mapping(1700, numeric_typmod(10, 2))
    with pytest.raises(ValueError, match="cannot be represented"):
        m.from_text(value)
    sign = {"NaN": 0xC000, "Infinity": 0xD000, "-Infinity": 0xF000}[value]
    with pytest.raises(ValueError, match="cannot be represented"):
        m.from_binary(numeric_send([], 0, sign, 0))


def test_numeric_unconstrained_and_odd_scales_are_exact_strings() -> None:
    for mod in (-1, numeric_typmod(3, 5), numeric_typmod(2, -3)):
        m = type_mapping(1700, mod)
        assert m.branches == ("string",)
        assert m.from_text("123.4500") == "123.4500"
        assert m.from_text("NaN") == "NaN"
    m = type_mapping(1700, -1)
    assert m.from_binary(numeric_send([123, 4500], 0, 0, 4)) == "123.4500"
    assert m.from_binary(numeric_send([5000], -1, 0x4000, 1)) == "-0.5"
    assert m.from_binary(numeric_send([1], 3, 0, 0)) == "1000000000000"
    assert m.from_binary(numeric_send([], 0, 0, 3)) == "0.000"
    assert m.from_binary(numeric_send([], 0, 0xD000, 0)) == "Infinity"
    assert m.from_binary(numeric_send([], 0, 0xC000, 0)) == "NaN"


def test_bytea_escape_format() -> None:
    assert text(17, "abc\\\\d\\000\\377") == b"abc\\d\x00\xff"
    with pytest.raises(ValueError, match="escape"):
        text(17, "bad\\9")


def test_interval_styles_and_infinity() -> None:
    assert parse_interval_text("P1Y2M3DT4H5M6.5S") == (14, 3, 14_706_500_000)
    assert parse_interval_text("P-1Y-2M") == (-14, 0, 0)
    assert parse_interval_text("1 mon") == (1, 0, 0)
    assert text(1186, "infinity") == "infinity"
    assert binary(1186, struct.pack(">qii", INT64_MIN, INT32_MIN, INT32_MIN)) == "-infinity"
    assert format_interval(-25, 0, 0) == "P-2Y-1M0DT0H0M0S"
    with pytest.raises(ValueError, match="IntervalStyle"):
        text(1186, "@ 1 day")  # postgres_verbose
    with pytest.raises(ValueError, match="IntervalStyle"):
        text(1186, "1-2 3 4:05:06")  # sql_standard


def test_bad_text_raises_value_error() -> None:
    for oid, value in [(16, "yes"), (23, "x"), (1082, "01/02/2026"), (1184, "2026-11-21 13:00:00"), (1083, "1pm")]:
        with pytest.raises(ValueError):  # noqa: PT011 - any ValueError, the encoder turns it into ConversionError
            text(oid, value)


# ------------------------------------------------------------------------------------------------ arrays


def test_array_text_elements() -> None:
    assert split_array_text("{}") == []
    assert split_array_text("{1,2,NULL}") == ["1", "2", None]
    assert split_array_text('{"a b","NULL",NULL,"x\\"y","back\\\\slash",""}') == [
        "a b",
        "NULL",
        None,
        'x"y',
        "back\\slash",
        "",
    ]
    assert split_array_text('{"{}",",",plain}') == ["{}", ",", "plain"]
    for bad in ("{1,2", '{"a}', "{a,{b}}x", "1,2"):
        with pytest.raises(ValueError):  # noqa: PT011
            split_array_text(bad)
    for no_shape in ("{{1,2},{3,4}}", "[0:1]={1,2}"):
        with pytest.raises(IrregularArray):
            split_array_text(no_shape)


def test_array_mappings() -> None:
    ints = type_mapping(1007)
    assert ints.branches == ({"type": "array", "items": ["null", "int"]}, "string")
    assert ints.from_text("{1,NULL,-3}") == [1, None, -3]
    assert ints.from_text("{{1,2},{3,4}}") == "{{1,2},{3,4}}"  # multi-dimensional: the text form
    assert ints.from_text("[0:1]={1,2}") == "[0:1]={1,2}"
    raw = struct.pack(">iiIii", 1, 1, 23, 3, 1) + struct.pack(">i", 4) + struct.pack(">i", 1)
    raw += struct.pack(">i", -1) + struct.pack(">i", 4) + struct.pack(">i", -3)
    assert ints.from_binary(raw) == [1, None, -3]
    assert ints.from_binary(struct.pack(">iiI", 0, 0, 23)) == []
    with pytest.raises(ValueError, match="multi-dimensional"):
        ints.from_binary(struct.pack(">iiIiiii", 2, 0, 23, 1, 1, 1, 1) + struct.pack(">ii", 4, 1))
    nums = type_mapping(1231, numeric_typmod(5, 1))
    assert nums.from_text("{1.5,NULL}") == [decimal_bytes(15), None]
    tstz = type_mapping(1185)
    assert tstz.from_text('{"2000-01-01 00:00:00+00",infinity}') == [PG_EPOCH_US, INT64_MAX]
    texts = type_mapping(1009)
    assert texts.from_text('{"NULL",NULL}') == ["NULL", None]


# ------------------------------------------------------------------------------------------------ schemas


def test_user_and_unknown_types_are_text() -> None:
    mood = Type(16_500, "public", "mood")
    rel = Relation(1, "public", "t", "d", (Column("id", 23, -1, True), Column("m", 16_500, -1, False)))
    rel = Relation(1, "public", "t", "d", (*rel.columns, Column("p", 600, -1, False)))  # point: unknown
    schemas = build_schemas(rel, "srv", {16_500: mood})
    m_field = schemas.value["fields"][1]
    assert m_field["type"] == ["null", {"type": "string", "pg.type": "public.mood"}]
    assert "public.mood" in m_field["doc"]
    assert schemas.columns[1].mapping.from_text("happy") == "happy"
    with pytest.raises(ValueError, match=r"binary form of user-defined type public\.mood"):
        schemas.columns[1].mapping.from_binary(b"happy")
    p_field = schemas.value["fields"][2]
    assert p_field["type"] == ["null", {"type": "string", "pg.type.oid": 600}]
    assert schemas.columns[2].mapping.from_text("(1,2)") == "(1,2)"
    with pytest.raises(ValueError, match="binary form of type oid 600"):
        schemas.columns[2].mapping.from_binary(b"\x00")


def test_schema_names_and_nullability() -> None:
    rel = Relation(
        7,
        "",
        "my-table",
        "d",
        (Column("id", 20, -1, True), Column("1st col", 25, -1, False), Column("ts", 1184, -1, False)),
    )
    schemas = build_schemas(rel, "my-server.eu", {})
    assert schemas.namespace == "my_server.eu.pg_catalog.my_table"
    assert schemas.key == {
        "type": "record",
        "name": "Key",
        "namespace": "my_server.eu.pg_catalog.my_table",
        "connect.name": "my_server.eu.pg_catalog.my_table.Key",
        "fields": [{"name": "id", "type": "long"}],
    }
    fields = schemas.value["fields"]
    assert fields[0] == {"name": "id", "type": ["null", "long"], "default": None}
    assert fields[1] == {"name": "_1st_col", "type": ["null", "string"], "default": None, "pg.column": "1st col"}
    assert fields[2]["type"] == ["null", {"type": "long", "logicalType": "timestamp-micros"}]
    names = [f["name"] for f in schemas.envelope["fields"]]
    assert names == ["before", "after", "source", "op", "ts_ms", "ts_us", "transaction", "unchanged_toast"]
    src = schemas.envelope["fields"][2]["type"]
    assert src["name"] == "io.debezium.connector.postgresql.Source"
    assert [f["name"] for f in src["fields"]] == [
        "version",
        "connector",
        "name",
        "ts_ms",
        "ts_us",
        "snapshot",
        "db",
        "sequence",
        "schema",
        "table",
        "txId",
        "lsn",
        "commit_lsn",
        "origin",
    ]
    fastavro.parse_schema(schemas.envelope)
    fastavro.parse_schema(schemas.key)
    no_key = build_schemas(Relation(8, "s", "t", "f", (Column("a", 23, -1, False),)), "p", {})
    assert no_key.key is None


def test_sanitize_and_collisions() -> None:
    assert sanitize("ok_Name1") == "ok_Name1"
    assert sanitize("a-b c") == "a_b_c"
    assert sanitize("9lives") == "_9lives"
    assert sanitize("") == "_"
    assert sanitize("größe") == "gr__e"
    rel = Relation(1, "public", "t", "d", (Column("a-b", 23, -1, True), Column("a_b", 23, -1, False)))
    with pytest.raises(SchemaError, match="'a-b' and 'a_b'"):
        build_schemas(rel, "p", {})


def test_conversion_error_names_everything() -> None:
    err = ConversionError("bad", table="public.t", column="c", pg_type="int4", value="x" * 200)
    assert isinstance(err, ValueError)
    msg = str(err)
    assert "table public.t" in msg
    assert "column 'c'" in msg
    assert "type int4" in msg
    assert "..." in msg
    assert len(msg) < 200


def test_every_mapped_schema_parses() -> None:
    oids = [16, 17, 18, 19, 20, 21, 23, 25, 26, 114, 142, 700, 701, 1042, 1043, 1082, 1083, 1114, 1184, 1186, 1266]
    oids += [2950, 3802, 1000, 1007, 1009, 1016, 1022, 1115, 1182, 1185, 1187, 1231, 2951, 3807]
    cols = tuple(Column(f"c{oid}", oid, numeric_typmod(9, 3), i == 0) for i, oid in enumerate([*oids, 1700]))
    schemas = build_schemas(Relation(1, "public", "all", "d", cols), "p", {})
    fastavro.parse_schema(schemas.envelope)
    assert schemas.columns[-1].mapping.branches[0] == {
        "type": "bytes",
        "logicalType": "decimal",
        "precision": 9,
        "scale": 3,
    }


def test_column_changes_name_dropped_added_and_retyped_columns() -> None:
    from cdcd.avro.schema import build_schemas, column_changes  # noqa: PLC0415
    from cdcd.pgoutput.messages import Column, Relation  # noqa: PLC0415

    old = Relation(
        1, "public", "t", "d", (Column("id", 23, -1, True), Column("v", 23, -1, False), Column("gone", 25, -1, False))
    )
    new = Relation(
        1,
        "public",
        "t",
        "d",
        (Column("id", 23, -1, True), Column("v", 25, -1, False), Column("new col", 16, -1, False)),
    )
    changes = column_changes(build_schemas(old, "p").envelope, build_schemas(new, "p").envelope)
    assert changes == ["column gone dropped", "column new col added", "column v changed type from int to string"]
    assert column_changes(build_schemas(old, "p").key or {}, build_schemas(old, "p").key or {}) == []


def test_text_kept_as_is_is_the_function_the_encoder_inlines() -> None:
    from cdcd.avro.encoder import _datum_expr  # noqa: PLC0415 - the compiled encoder's inlining rule
    from cdcd.pgtypes import identity  # noqa: PLC0415

    for oid in (25, 1043, 2950, 114, 99999):  # text, varchar, uuid, json, a type not built in
        assert type_mapping(oid).from_text is identity
        assert _datum_expr(type_mapping(oid), "f") == "v"
    assert _datum_expr(type_mapping(23), "f") == "int(v)"
