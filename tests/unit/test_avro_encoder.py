"""The compiled encoder writes exactly fastavro's bytes, for random relations, rows and envelopes.

Values are generated as Python values (int, Decimal, datetime, UUID, ...), rendered to the text form
PostgreSQL prints and to its binary send form, and handed to fastavro as the Python values themselves (its
logical-type writers convert them): so each case checks the conversion *and* the encoding.
"""

from __future__ import annotations

import io
import math
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcd.avro import ConversionError, EnvelopeEncoder, SourceInfo, TxInfo, build_schemas, sanitize
from cdcd.avro.encoder import sequence, varint, write_long
from cdcd.avro.types import format_interval
from cdcd.pgoutput.messages import Column, Relation, Row, Type
from cdcd.rowstage import STAGE

PG_EPOCH = datetime(2000, 1, 1)
PG_EPOCH_UTC = datetime(2000, 1, 1, tzinfo=UTC)
PG_EPOCH_DATE = date(2000, 1, 1)
ENUM_OID = 16_500


@dataclass(frozen=True)
class Sample:
    """One value: PostgreSQL's text form, its binary form, what fastavro writes from, what it reads back."""

    text: str
    binary: bytes | None  # None: no binary form (user types)
    write: Any
    read: Any


@dataclass(frozen=True)
class ColType:
    name: str
    oid: int
    typmod: int
    values: st.SearchStrategy[Sample]
    array_element: bool = True  # may appear inside an array literal


# ------------------------------------------------------------------------------------------------ renderers


def numeric_send(d: Decimal, dscale: int) -> bytes:
    if d.is_nan():
        return struct.pack(">hhHh", 0, 0, 0xC000, 0)
    sign, digits, exp = d.as_tuple()
    assert isinstance(exp, int)
    n = int("".join(map(str, digits)) or "0")
    # integer n * 10^exp -> base-10000 digits aligned on a multiple of 4 decimal places
    pad = -exp % 4 and 4 - (-exp % 4) if exp < 0 else 0
    n *= 10**pad
    e = exp - pad  # multiple of 4 when negative
    if e > 0:
        n *= 10 ** (e % 4)
        e -= e % 4
    groups: list[int] = []
    while n:
        n, r = divmod(n, 10_000)
        groups.append(r)
    groups.reverse()
    low = e // 4  # weight of the last group
    while groups and groups[-1] == 0:  # PostgreSQL strips trailing zero groups
        groups.pop()
        low += 1
    weight = low + len(groups) - 1 if groups else 0
    head = struct.pack(">hhHh", len(groups), weight, 0x4000 if sign and groups else 0, dscale)
    return head + b"".join(struct.pack(">H", g) for g in groups)


def fraction(us: int) -> str:
    return f".{us:06d}".rstrip("0") if us else ""


def offset_text(seconds: int) -> str:
    sign = "-" if seconds < 0 else "+"
    h, rest = divmod(abs(seconds), 3600)
    m, s = divmod(rest, 60)
    return f"{sign}{h:02d}" + (f":{m:02d}" if m or s else "") + (f":{s:02d}" if s else "")


def interval_text(months: int, days: int, us: int) -> str:
    """IntervalStyle postgres, as interval_out prints it."""
    parts = []
    y, mo = int(months / 12), months - int(months / 12) * 12
    for n, unit in ((y, "year"), (mo, "mon"), (days, "day")):
        if n:
            parts.append(f"{n} {unit}{'' if abs(n) == 1 else 's'}")
    if us or not parts:
        neg = us < 0
        secs, frac = divmod(abs(us), 1_000_000)
        h, rest = divmod(secs, 3600)
        m, s = divmod(rest, 60)
        sign = "-" if neg else ("+" if parts and (months < 0 or days < 0) else "")
        parts.append(f"{sign}{h:02d}:{m:02d}:{s:02d}{fraction(frac)}")
    return " ".join(parts)


def array_literal(items: list[str | None]) -> str:
    out = []
    for item in items:
        if item is None:
            out.append("NULL")
        elif item == "" or item.upper() == "NULL" or any(c in item for c in '{},"\\ \t\n'):
            out.append('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"')
        else:
            out.append(item)
    return "{" + ",".join(out) + "}"


def array_send(elem_oid: int, items: list[bytes | None]) -> bytes:
    if not items:
        return struct.pack(">iiI", 0, 0, elem_oid)
    head = struct.pack(">iiIii", 1, int(None in items), elem_oid, len(items), 1)
    body = b"".join(struct.pack(">i", -1) if b is None else struct.pack(">i", len(b)) + b for b in items)
    return head + body


# ------------------------------------------------------------------------------------------------ value strategies

SAFE_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)


def _ints(lo: int, hi: int, fmt: str) -> st.SearchStrategy[Sample]:
    return st.integers(lo, hi).map(lambda n: Sample(str(n), struct.pack(fmt, n), n, n))


def _float4(x: float) -> Sample:
    x = math.nan if math.isnan(x) else struct.unpack(">f", struct.pack(">f", x))[0]  # 'NaN' has no payload
    txt = "NaN" if math.isnan(x) else ("Infinity" if x == math.inf else "-Infinity" if x == -math.inf else repr(x))
    return Sample(txt, struct.pack(">f", x), x, x)


def _float8(x: float) -> Sample:
    x = math.nan if math.isnan(x) else x  # the text 'NaN' has no payload
    txt = "NaN" if math.isnan(x) else ("Infinity" if x == math.inf else "-Infinity" if x == -math.inf else repr(x))
    return Sample(txt, struct.pack(">d", x), x, x)


def _decimal(precision: int, scale: int) -> st.SearchStrategy[Sample]:
    def make(n: int) -> Sample:
        d = Decimal(n).scaleb(-scale)
        return Sample(format(d, "f"), numeric_send(d, scale), d, d)

    return st.integers(-(10**precision) + 1, 10**precision - 1).map(make)


def _free_numeric(d: Decimal) -> Sample:
    if d.is_nan():
        return Sample("NaN", numeric_send(d, 0), "NaN", "NaN")
    exp = d.as_tuple().exponent
    assert isinstance(exp, int)
    dscale = max(0, -exp)
    txt = format(d, "f")
    return Sample(txt, numeric_send(d, dscale), txt, txt)


def _text(s: str) -> Sample:
    return Sample(s, s.encode(), s, s)


def _bytea(b: bytes) -> Sample:
    return Sample("\\x" + b.hex(), b, b, b)


def _uuid(u: uuid.UUID) -> Sample:
    return Sample(str(u), u.bytes, u, u)


def _date(d: date) -> Sample:
    return Sample(d.isoformat(), struct.pack(">i", (d - PG_EPOCH_DATE).days), d, d)


def _time(t: time) -> Sample:
    us = ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond
    return Sample(f"{t:%H:%M:%S}{fraction(t.microsecond)}", struct.pack(">q", us), t, t)


def _timestamp(dt: datetime) -> Sample:
    us = (dt - PG_EPOCH) // timedelta(microseconds=1)
    return Sample(f"{dt:%Y-%m-%d %H:%M:%S}{fraction(dt.microsecond)}", struct.pack(">q", us), dt, dt)


def _timestamptz(arg: tuple[datetime, int]) -> Sample:
    dt, offset = arg
    utc = dt.replace(tzinfo=UTC)
    local = dt + timedelta(seconds=offset)
    us = (utc - PG_EPOCH_UTC) // timedelta(microseconds=1)
    txt = f"{local:%Y-%m-%d %H:%M:%S}{fraction(local.microsecond)}{offset_text(offset)}"
    return Sample(txt, struct.pack(">q", us), utc, utc)


def _interval(arg: tuple[int, int, int]) -> Sample:
    months, days, us = arg
    iso = format_interval(months, days, us)
    return Sample(interval_text(months, days, us), struct.pack(">qii", us, days, months), iso, iso)


def _timetz(arg: tuple[time, int]) -> Sample:
    t, offset = arg
    us = ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond
    txt = f"{t:%H:%M:%S}{fraction(t.microsecond)}{offset_text(offset)}"
    return Sample(txt, struct.pack(">qi", us, -offset), txt, txt)


def _json(s: str) -> Sample:
    return Sample(s, s.encode(), s, s)


def _jsonb(s: str) -> Sample:
    return Sample(s, b"\x01" + s.encode(), s, s)


def _enum(s: str) -> Sample:
    return Sample(s, None, s, s)


ROUNDING = st.sampled_from([1, 10, 100, 1000, 10_000, 100_000, 1_000_000])  # PostgreSQL trims trailing zeros


def _rounded_dt(arg: tuple[datetime, int]) -> datetime:
    return arg[0].replace(microsecond=arg[0].microsecond // arg[1] * arg[1])


def _rounded_t(arg: tuple[time, int]) -> time:
    return arg[0].replace(microsecond=arg[0].microsecond // arg[1] * arg[1])


TIMES = st.tuples(st.times(), ROUNDING).map(_rounded_t)
OFFSETS = st.integers(-15 * 3600, 15 * 3600).map(lambda s: s - s % 60) | st.just(-(5 * 3600 + 53 * 60 + 28))
DATETIMES = st.tuples(st.datetimes(min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31)), ROUNDING).map(
    _rounded_dt
)
JSON_TEXT = st.recursive(
    st.none().map(lambda _: "null") | st.integers().map(str) | SAFE_TEXT.map(lambda s: '"' + s.replace('"', "") + '"'),
    lambda inner: st.lists(inner, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
    max_leaves=5,
)

SCALARS: list[ColType] = [
    ColType("bool", 16, -1, st.booleans().map(lambda b: Sample("t" if b else "f", bytes([b]), b, b))),
    ColType("int2", 21, -1, _ints(-(2**15), 2**15 - 1, ">h")),
    ColType("int4", 23, -1, _ints(-(2**31), 2**31 - 1, ">i")),
    ColType("int8", 20, -1, _ints(-(2**63), 2**63 - 1, ">q")),
    ColType("oid", 26, -1, _ints(0, 2**32 - 1, ">I")),
    ColType("float4", 700, -1, st.floats(width=32).map(_float4)),
    ColType("float8", 701, -1, st.floats().map(_float8)),
    ColType("numeric(12,2)", 1700, ((12 << 16) | 2) + 4, _decimal(12, 2)),
    ColType("numeric(38,0)", 1700, (38 << 16) + 4, _decimal(38, 0)),
    ColType("numeric(5,5)", 1700, ((5 << 16) | 5) + 4, _decimal(5, 5)),
    ColType("numeric", 1700, -1, st.decimals(allow_infinity=False, places=None).map(_free_numeric)),
    ColType("text", 25, -1, SAFE_TEXT.map(_text)),
    ColType("varchar", 1043, -1, SAFE_TEXT.map(_text)),
    ColType("bpchar", 1042, -1, SAFE_TEXT.map(lambda s: _text(s + "  "))),
    ColType("name", 19, -1, SAFE_TEXT.map(_text)),
    ColType("bytea", 17, -1, st.binary(max_size=20).map(_bytea)),
    ColType("uuid", 2950, -1, st.uuids().map(_uuid)),
    ColType("date", 1082, -1, st.dates().map(_date)),
    ColType("time", 1083, -1, TIMES.map(_time)),
    ColType("timestamp", 1114, -1, st.tuples(st.datetimes(), ROUNDING).map(_rounded_dt).map(_timestamp)),
    ColType("timestamptz", 1184, -1, st.tuples(DATETIMES, OFFSETS).map(_timestamptz)),
    ColType(
        "interval",
        1186,
        -1,
        st.tuples(
            st.integers(-(2**31) + 1, 2**31 - 2), st.integers(-(2**31) + 1, 2**31 - 2), st.integers(-(2**62), 2**62)
        ).map(_interval),
    ),
    ColType("timetz", 1266, -1, st.tuples(TIMES, OFFSETS).map(_timetz)),
    ColType("json", 114, -1, JSON_TEXT.map(_json)),
    ColType("jsonb", 3802, -1, JSON_TEXT.map(_jsonb)),
    ColType("xml", 142, -1, SAFE_TEXT.map(lambda s: _text(f"<a>{s}</a>"))),
    ColType("mood (enum)", ENUM_OID, -1, st.sampled_from(["happy", "sad", "NULL", "with space"]).map(_enum), False),
    ColType("point (unknown)", 600, -1, st.sampled_from(["(1,2)", "(0.5,-3)"]).map(_enum), False),
]

ARRAY_OF = {16: 1000, 23: 1007, 20: 1016, 25: 1009, 701: 1022, 1700: 1231, 1184: 1185, 1082: 1182, 2950: 2951}


def _array(element: ColType) -> ColType:
    def make(items: list[Sample | None]) -> Sample:
        txt = array_literal([None if s is None else s.text for s in items])
        raw = array_send(element.oid, [None if s is None else s.binary for s in items])
        return Sample(
            txt,
            raw,
            [None if s is None else s.write for s in items],
            [None if s is None else s.read for s in items],
        )

    values = st.lists(st.none() | element.values, max_size=4).map(make)
    return ColType(f"{element.name}[]", ARRAY_OF[element.oid], element.typmod, values, False)


ARRAYS = [_array(c) for c in SCALARS if c.oid in ARRAY_OF and c.name != "numeric"]
MULTI_DIM = ColType(
    "int4[] (2-D)",
    1007,
    -1,
    st.sampled_from(["{{1,2},{3,4}}", "[0:1]={5,6}"]).map(lambda s: Sample(s, None, s, s)),
    False,
)
ALL_TYPES = [*SCALARS, *ARRAYS, MULTI_DIM]

NAMES = st.text(st.sampled_from("abcXYZ_09 -é$"), min_size=1, max_size=6)


@dataclass
class Case:
    relation: Relation
    types: list[ColType]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    names = draw(st.lists(NAMES, min_size=1, max_size=8, unique_by=sanitize))
    types = [draw(st.sampled_from(ALL_TYPES)) for _ in names]
    keys = [draw(st.booleans()) for _ in names]
    columns = tuple(Column(n, t.oid, t.typmod, k) for n, t, k in zip(names, types, keys, strict=True))
    table = draw(NAMES)
    return Case(Relation(16_400, draw(st.sampled_from(["public", "", "My Schema"])), table, "d", columns), types)


@dataclass
class Drawn:
    row: Row
    write: dict[str, Any]  # what fastavro writes from
    read: dict[str, Any]  # what it reads back
    toast: list[str]


def draw_row(
    draw: Callable[[st.SearchStrategy[Any]], Any], case: Case, *, toast: bool, key_only: bool = False
) -> Drawn:
    row: list[Any] = []
    write: dict[str, Any] = {}
    read: dict[str, Any] = {}
    unchanged: list[str] = []
    for col, t in zip(case.relation.columns, case.types, strict=True):
        field = sanitize(col.name)
        choice = draw(
            st.sampled_from(
                ["text", "binary", "null", "toast"] if toast and not col.is_key else ["text", "binary", "null"]
            )
        )
        if key_only and not col.is_key:
            choice = "null"
        if choice in ("null", "toast"):
            row.append(None if choice == "null" else ...)
            write[field] = read[field] = None
            if choice == "toast":
                unchanged.append(field)
            continue
        sample = draw(t.values)
        row.append(sample.binary if choice == "binary" and sample.binary is not None else sample.text)
        write[field] = sample.write
        read[field] = sample.read
    return Drawn(tuple(row), write, read, unchanged)


def normalize(x: Any) -> Any:
    """NaN compares equal to itself; floats compare by value."""
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    if isinstance(x, dict):
        return {k: normalize(v) for k, v in x.items()}
    if isinstance(x, list):
        return [normalize(v) for v in x]
    return x


def fastavro_bytes(schema: Any, record: Any) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, record)
    return buf.getvalue()


SOURCES = st.builds(
    SourceInfo,
    version=st.sampled_from(["0.1.0", "2.7.0.Final"]),
    db=st.sampled_from(["shop", "données"]),
    ts_us=st.integers(0, 2**53),
    snapshot=st.sampled_from(["false", "true", "last"]),
    tx_id=st.none() | st.integers(0, 2**32),
    commit_lsn=st.none() | st.integers(0, 2**63 - 1),
    last_commit_lsn=st.none() | st.integers(0, 2**63 - 1),
    origin=st.none() | st.sampled_from(["", "node_b"]),
)
TXS = st.none() | st.builds(
    TxInfo, id=st.text(max_size=20), total_order=st.integers(1, 2**40), data_collection_order=st.integers(1, 2**40)
)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), case=cases())
def test_compiled_envelope_equals_fastavro(data: st.DataObject, case: Case) -> None:
    schemas = build_schemas(case.relation, "srv-1.eu", {ENUM_OID: Type(ENUM_OID, "public", "mood")})
    envelope = fastavro.parse_schema(schemas.envelope)
    encoder = EnvelopeEncoder(schemas, stage=STAGE)
    op = data.draw(st.sampled_from(["c", "u", "d", "r", "t"]))
    before: Drawn | None = None
    after: Drawn | None = None
    if op in ("u", "d") and data.draw(st.booleans()):
        before = draw_row(data.draw, case, toast=False, key_only=data.draw(st.booleans()))
    if op in ("c", "u", "r"):
        after = draw_row(data.draw, case, toast=op == "u")
    source = data.draw(SOURCES)
    lsn = data.draw(st.none() | st.integers(0, 2**63 - 1))
    ts_us = data.draw(st.none() | st.integers(0, 2**62))
    tx = data.draw(TXS)

    got = encoder.encode_value(
        op, None if before is None else before.row, None if after is None else after.row, source, lsn, ts_us, tx
    )
    rel = case.relation
    first = "null" if source.last_commit_lsn is None else f'"{source.last_commit_lsn}"'
    source_record = {
        "version": source.version,
        "connector": "postgresql",
        "name": "srv-1.eu",
        "ts_ms": source.ts_us // 1000,
        "ts_us": source.ts_us,
        "snapshot": source.snapshot,
        "db": source.db,
        "sequence": None if lsn is None else f'[{first},"{lsn}"]',
        "schema": rel.schema or "pg_catalog",
        "table": rel.name,
        "txId": source.tx_id,
        "lsn": lsn,
        "commit_lsn": source.commit_lsn,
        "origin": source.origin,
    }
    tx_record = (
        None
        if tx is None
        else {"id": tx.id, "total_order": tx.total_order, "data_collection_order": tx.data_collection_order}
    )

    def envelope_of(part: str) -> dict[str, Any]:
        return {
            "before": None if before is None else getattr(before, part),
            "after": None if after is None else getattr(after, part),
            "source": source_record,
            "op": op,
            "ts_ms": None if ts_us is None else ts_us // 1000,
            "ts_us": ts_us,
            "transaction": tx_record,
            "unchanged_toast": [] if after is None else after.toast,
        }

    assert got == fastavro_bytes(envelope, envelope_of("write"))
    reference = encoder.envelope_record(
        op, None if before is None else before.row, None if after is None else after.row, source, lsn, ts_us, tx
    )
    assert got == fastavro_bytes(envelope, reference)
    assert normalize(fastavro.schemaless_reader(io.BytesIO(got), envelope)) == normalize(envelope_of("read"))

    if (
        schemas.key is not None
        and after is not None
        and all(v is not None for v, c in zip(after.row, rel.columns, strict=True) if c.is_key)
    ):
        key_schema = fastavro.parse_schema(schemas.key)
        key_write = {sanitize(c.name): after.write[sanitize(c.name)] for c in rel.columns if c.is_key}
        assert encoder.encode_key(after.row) == fastavro_bytes(key_schema, key_write)


# ------------------------------------------------------------------------------------------------ primitives and errors


@given(st.integers(-(2**63), 2**63 - 1))
def test_varint_matches_fastavro(n: int) -> None:
    assert write_long(n) == fastavro_bytes("long", n)


def test_varint_rejects_out_of_range() -> None:
    with pytest.raises(OverflowError):
        write_long(2**63)
    with pytest.raises(OverflowError):
        varint(-1)


def _encoder(*cols: Column) -> EnvelopeEncoder:
    return EnvelopeEncoder(build_schemas(Relation(1, "public", "t", "d", cols), "p", {}), stage=STAGE)


SRC = SourceInfo("v", "db", 0)


def test_bad_value_names_table_column_type_and_value() -> None:
    enc = _encoder(Column("id", 23, -1, True), Column("amount", 1700, ((10 << 16) | 2) + 4, False))
    with pytest.raises(ConversionError) as info:
        enc.encode_value("c", None, ("1", "NaN"), SRC, None, None)
    err = info.value
    assert (err.table, err.column, err.pg_type, err.value) == ("public.t", "amount", "numeric(10,2)", "NaN")
    assert "cannot be represented as an Avro decimal" in str(err)
    with pytest.raises(ConversionError, match=r"column 'id'.*type int4"):
        enc.encode_value("c", None, ("one", "1.00"), SRC, None, None)
    with pytest.raises(ConversionError, match="row has 1 values"):
        enc.encode_value("c", None, ("1",), SRC, None, None)


def test_unchanged_toast_only_in_after() -> None:
    enc = _encoder(Column("id", 23, -1, True), Column("doc", 25, -1, False))
    out = enc.encode_value("u", ("1", None), ("1", ...), SRC, 5, 6)
    decoded: Any = fastavro.schemaless_reader(io.BytesIO(out), fastavro.parse_schema(enc.schemas.envelope))
    assert decoded["after"] == {"id": 1, "doc": None}
    assert decoded["unchanged_toast"] == ["doc"]
    with pytest.raises(ConversionError, match="unchanged TOAST value where a full value is required"):
        enc.encode_value("u", ("1", ...), ("1", "x"), SRC, 5, 6)


def test_key_requires_values() -> None:
    enc = _encoder(Column("id", 23, -1, True), Column("doc", 25, -1, False))
    assert enc.encode_key(("7", None)) == b"\x0e"
    with pytest.raises(ConversionError, match="NULL in a key column"):
        enc.encode_key((None, "x"))
    no_key = _encoder(Column("doc", 25, -1, False))
    with pytest.raises(ConversionError, match="no key columns"):
        no_key.encode_key(("x",))


def test_unknown_op_and_binary_user_type() -> None:
    enc = _encoder(Column("id", 23, -1, True))
    with pytest.raises(ConversionError, match="unknown envelope op"):
        enc.encode_value("x", None, ("1",), SRC, None, None)
    rel = Relation(1, "public", "t", "d", (Column("m", ENUM_OID, -1, False),))
    enc = EnvelopeEncoder(build_schemas(rel, "p", {ENUM_OID: Type(ENUM_OID, "public", "mood")}), stage=STAGE)
    with pytest.raises(ConversionError, match=r"binary form of user-defined type public\.mood"):
        enc.encode_value("c", None, (b"happy",), SRC, None, None)


def test_sequence_format() -> None:
    assert sequence(None, 5) == '[null,"5"]'
    assert sequence(3, 5) == '["3","5"]'
    assert sequence(3, None) is None


def test_numeric_send_helper_roundtrips() -> None:
    """The test's own numeric_send agrees with known PostgreSQL bytes (123.45 -> [123, 4500], weight 0)."""
    assert numeric_send(Decimal("123.45"), 2) == struct.pack(">hhHhHH", 2, 0, 0, 2, 123, 4500)
    assert numeric_send(Decimal("-0.5"), 1) == struct.pack(">hhHhH", 1, -1, 0x4000, 1, 5000)
    assert numeric_send(Decimal("10000"), 0) == struct.pack(">hhHhH", 1, 1, 0, 0, 1)
    assert numeric_send(Decimal("0.00"), 2) == struct.pack(">hhHh", 0, 0, 0, 2)


def test_timezone_offset_with_seconds() -> None:
    enc = _encoder(Column("ts", 1184, -1, False))
    got = enc.value_record(("1900-01-01 00:00:00-05:53:28",))[0]["ts"]
    expected = datetime(1900, 1, 1, tzinfo=timezone(timedelta(hours=-5, minutes=-53, seconds=-28)))
    assert got == (expected - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
