"""Debezium's type map (``kafka.envelope: debezium``): column types as Debezium's PostgreSQL connector sends them
with its default modes, for consumers written against it. Pure.

What differs from cdcd's own map (``cdcd.avro.types``), checked against Debezium itself by
``tests/integration/test_debezium_envelope.py``:

* date, time, timestamp: ``io.debezium.time.Date`` (int days), ``MicroTime``/``MicroTimestamp`` (long µs), or
  for a precision of 3 or less ``Time`` (int ms) and ``Timestamp`` (long ms) (``time.precision.mode=adaptive``);
  the values of ±infinity timestamps are the JDBC driver's constants Debezium passes on.
* timestamptz: ``io.debezium.time.ZonedTimestamp``, an ISO-8601 string in UTC (``2024-05-03T10:34:56.500000Z``:
  as many fraction digits as the column's precision), ``infinity``/``-infinity`` as such; timetz:
  ``ZonedTime`` (``10:34:56.789Z``).
* interval: ``io.debezium.time.MicroDuration``, a long of µs counting a month as 30.4375 days
  (``interval.handling.mode=numeric``).
* numeric(p, s): the Kafka Connect Decimal (Connect's schema parameters; the unscaled value in Java's shortest
  two's complement); numeric without a typmod: the ``io.debezium.data.VariableScaleDecimal`` record
  ``{scale, value}`` (fraction digits without trailing zeros), null for NaN and ±Infinity.
* int2 is marked ``connect.type: int16``; uuid ``io.debezium.data.Uuid`` (no Avro uuid logical type).
* enums: ``io.debezium.data.Enum`` strings with the allowed labels.
* everything else as in cdcd's map (text-like types, json/jsonb/xml, bytea, arrays, other user-defined types).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from cdcd.avro.types import (
    AvroSchema,
    Datum,
    TypeMapping,
    type_mapping,
)
from cdcd.pgtypes import (
    CODECS,
    INT64_MAX,
    INT64_MIN,
    NUMERIC_OID,
    interval_binary,
    numeric_binary_to_text,
    parse_interval_text,
)

_US_PER_DAY: Final = 86_400_000_000
_US_PER_MONTH: Final = 2_629_800_000_000  # 30.4375 days: Debezium's average month (365.25 / 12 days)
# The JDBC driver's timestamp infinities (PGStatement.DATE_POSITIVE/NEGATIVE_INFINITY), which Debezium passes on.
POSITIVE_INFINITY: Final = 9_223_372_036_825_200_000
NEGATIVE_INFINITY: Final = -9_223_372_036_832_400_000
_DATE, _TIME, _TIMESTAMP, _TIMESTAMPTZ, _INTERVAL, _TIMETZ, _UUID, _INT2 = 1082, 1083, 1114, 1184, 1186, 1266, 2950, 21


def _connect(kind: str, name: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "connect.version": 1, "connect.name": name, **extra}


def _same(type_oid: int, avro: AvroSchema, kind: str) -> TypeMapping:
    """cdcd's conversion of the type with another schema (the bytes are Debezium's already)."""
    base = type_mapping(type_oid)
    return TypeMapping(base.pg_type, (avro,), kind, base.from_text, base.from_binary)


def _converted(
    type_oid: int, avro: AvroSchema, kind: str, convert: Callable[[Any], Datum], native: tuple[int, int]
) -> TypeMapping:
    """cdcd's conversion of the type followed by ``convert``; ``native``: the compiled conversion doing both
    (``cdcd.avro.encoder.native_kind``, native/src/convert.rs)."""
    base = type_mapping(type_oid)
    text, binary = base.from_text, base.from_binary
    return TypeMapping(
        base.pg_type, (avro,), kind, lambda s: convert(text(s)), lambda b: convert(binary(b)), native=native
    )


# The compiled conversions of Debezium's forms (native/src/convert.rs, Kind::from_code)
_ZONED_TIMESTAMP, _MICRO_TIMESTAMP, _MILLI_TIMESTAMP, _MILLI_TIME, _MICRO_DURATION = 19, 20, 21, 22, 23
_CONNECT_DECIMAL, _VARIABLE_SCALE_DECIMAL, _ZONED_TIME = 24, 25, 26


# --------------------------------------------------------------------------------------------- date and time


def civil_from_days(days: int) -> tuple[int, int, int]:
    """(year, month, day) of a day count since 1970-01-01, proleptic Gregorian, astronomical years."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day


def _iso_year(year: int) -> str:
    """Java's ISO year: four digits, a sign beyond 9999 or before year 0."""
    if 0 <= year <= 9999:
        return f"{year:04d}"
    return f"+{year}" if year > 0 else f"-{-year:04d}"


def _time_of_day(us: int) -> str:
    """``HH:MM:SS`` with as many fraction digits as needed (Java's ISO_LOCAL_TIME)."""
    secs, frac = divmod(us, 1_000_000)
    h, rest = divmod(secs, 3600)
    m, s = divmod(rest, 60)
    text = f"{h:02d}:{m:02d}:{s:02d}"
    return text + f".{frac:06d}".rstrip("0") if frac else text


def zoned_timestamp(us: int, digits: int = 6) -> str:
    """ZonedTimestamp text of a timestamptz in µs since the epoch (UTC), with ``digits`` fraction digits (the
    column's precision)."""
    if us == INT64_MAX:
        return "infinity"
    if us == INT64_MIN:
        return "-infinity"
    days, tod = divmod(us, _US_PER_DAY)
    year, month, day = civil_from_days(days)
    secs, frac = divmod(tod, 1_000_000)
    h, rest = divmod(secs, 3600)
    m, sec = divmod(rest, 60)
    fraction = f".{frac:06d}"[: digits + 1] if digits else ""
    return f"{_iso_year(year)}-{month:02d}-{day:02d}T{h:02d}:{m:02d}:{sec:02d}{fraction}Z"


def _zoned_timestamp(typmod: int) -> TypeMapping:
    digits = _precision(typmod)
    avro = _connect("string", "io.debezium.time.ZonedTimestamp")
    return _converted(_TIMESTAMPTZ, avro, "string", lambda us: zoned_timestamp(us, digits), (_ZONED_TIMESTAMP, digits))


def _zoned_time_text(s: str) -> str:
    """ZonedTime text of PostgreSQL's timetz text (``12:34:56.789+02``): the time in UTC."""
    rest, sep, offset = s.rpartition("+") if "+" in s else s.rpartition("-")
    if not sep or not rest:
        raise ValueError("missing UTC offset")
    parts = [int(p) for p in offset.split(":")]
    if not 1 <= len(parts) <= 3:
        raise ValueError("bad UTC offset")
    east = parts[0] * 3600 + (parts[1] * 60 if len(parts) > 1 else 0) + (parts[2] if len(parts) > 2 else 0)
    east = -east if sep == "-" else east
    local = type_mapping(_TIME).from_text(rest)
    return _time_of_day((local - east * 1_000_000) % _US_PER_DAY) + "Z"


def _zoned_time_binary(b: bytes) -> str:
    return _zoned_time_text(CODECS[_TIMETZ].from_binary(b))


def _timestamp(us: int) -> int:
    if us == INT64_MAX:
        return POSITIVE_INFINITY
    if us == INT64_MIN:
        return NEGATIVE_INFINITY
    return us


def _timestamp_ms(us: int) -> int:
    return _timestamp(us) // 1000 if us in (INT64_MAX, INT64_MIN) else us // 1000


def _precision(typmod: int) -> int:
    """Fractional second digits of time(p)/timestamp(p); 6 without a typmod."""
    return typmod if 0 <= typmod <= 6 else 6


def _time(typmod: int) -> TypeMapping:
    if _precision(typmod) <= 3:
        ms = _connect("int", "io.debezium.time.Time")
        return _converted(_TIME, ms, "int", lambda us: us // 1000, (_MILLI_TIME, 0))
    return _same(_TIME, _connect("long", "io.debezium.time.MicroTime"), "long")


def _timestamp_mapping(typmod: int) -> TypeMapping:
    if _precision(typmod) <= 3:
        ms = _connect("long", "io.debezium.time.Timestamp")
        return _converted(_TIMESTAMP, ms, "long", _timestamp_ms, (_MILLI_TIMESTAMP, 0))
    us = _connect("long", "io.debezium.time.MicroTimestamp")
    return _converted(_TIMESTAMP, us, "long", _timestamp, (_MICRO_TIMESTAMP, 0))


def _micro_duration(parts: tuple[int, int, int]) -> int:
    months, days, micros = parts
    return months * _US_PER_MONTH + days * _US_PER_DAY + micros


# --------------------------------------------------------------------------------------------- numeric

VARIABLE_SCALE_DECIMAL: Final[dict[str, Any]] = {
    "type": "record",
    "name": "VariableScaleDecimal",
    "namespace": "io.debezium.data",
    "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
    "connect.doc": "Variable scaled decimal",
    "connect.version": 1,
    "connect.name": "io.debezium.data.VariableScaleDecimal",
}


def variable_scale_decimal(text: str) -> bytes | None:
    """The Avro record ``{scale, value}`` of a numeric's text form, encoded (kind ``record``): the scale is the
    number of fraction digits without trailing zeros, the value the unscaled number's two's complement bytes.
    NaN and ±Infinity have none: null, as Debezium sends them."""
    if text in ("NaN", "Infinity", "-Infinity"):
        return None
    sign, body = (-1, text[1:]) if text.startswith("-") else (1, text)
    whole, _, fraction = body.partition(".")
    fraction = fraction.rstrip("0")
    if not whole.isdigit() or (fraction and not fraction.isdigit()):
        raise ValueError(f"numeric {text} cannot be a VariableScaleDecimal")
    unscaled = java_decimal_bytes(sign * int(whole + fraction))
    return _long(len(fraction)) + _long(len(unscaled)) + unscaled


def java_decimal_bytes(unscaled: int) -> bytes:
    """Java's BigInteger.toByteArray: the shortest two's complement (-128 is one byte, 0x80)."""
    magnitude = unscaled if unscaled >= 0 else ~unscaled
    return unscaled.to_bytes((magnitude.bit_length() + 8) // 8, "big", signed=True)


def _java_decimal(b: bytes) -> bytes:
    return java_decimal_bytes(int.from_bytes(b, "big", signed=True))


def _long(n: int) -> bytes:
    z, out = (n << 1) ^ (n >> 63), bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _numeric(typmod: int) -> TypeMapping:
    base = type_mapping(NUMERIC_OID, typmod)
    branch = base.branches[0]
    if isinstance(branch, dict) and branch.get("logicalType") == "decimal":
        precision, scale = branch["precision"], branch["scale"]
        params = {"scale": str(scale), "connect.decimal.precision": str(precision)}
        avro = _connect(
            "bytes",
            "org.apache.kafka.connect.data.Decimal",
            logicalType="decimal",
            precision=precision,
            scale=scale,
            **{"connect.parameters": params},
        )
        text, binary = base.from_text, base.from_binary
        java_text, java_binary = (lambda s: _java_decimal(text(s))), (lambda b: _java_decimal(binary(b)))
        native = (_CONNECT_DECIMAL, scale)
        return TypeMapping(base.pg_type, (avro,), "bytes", java_text, java_binary, compiled=False, native=native)
    return TypeMapping(
        "numeric",
        (VARIABLE_SCALE_DECIMAL,),
        "record",
        variable_scale_decimal,
        lambda b: variable_scale_decimal(numeric_binary_to_text(b)),
        native=(_VARIABLE_SCALE_DECIMAL, 0),
    )


# --------------------------------------------------------------------------------------------- the map


def _scalar(type_oid: int, typmod: int) -> TypeMapping | None:
    if type_oid == NUMERIC_OID:
        return _numeric(typmod)
    if type_oid == _TIME:
        return _time(typmod)
    if type_oid == _TIMESTAMP:
        return _timestamp_mapping(typmod)
    if type_oid == _TIMESTAMPTZ:
        return _zoned_timestamp(typmod)
    return _FIXED.get(type_oid)


_FIXED: Final[dict[int, TypeMapping]] = {
    _INT2: _same(_INT2, {"type": "int", "connect.type": "int16"}, "int"),
    _DATE: _same(_DATE, _connect("int", "io.debezium.time.Date"), "int"),
    _INTERVAL: TypeMapping(
        "interval",
        (_connect("long", "io.debezium.time.MicroDuration"),),
        "long",
        lambda s: _micro_duration(parse_interval_text(s)),
        lambda b: _micro_duration(interval_binary(b)),
        native=(_MICRO_DURATION, 0),
    ),
    _TIMETZ: TypeMapping(
        "timetz",
        (_connect("string", "io.debezium.time.ZonedTime"),),
        "string",
        _zoned_time_text,
        _zoned_time_binary,
        native=(_ZONED_TIME, 0),
    ),
    _UUID: _same(_UUID, _connect("string", "io.debezium.data.Uuid"), "string"),
}


def debezium_mapping(
    type_oid: int, typmod: int = -1, user_type: str | None = None, labels: tuple[str, ...] | None = None
) -> TypeMapping:
    """The mapping of a column type in Debezium's form (cdcd's where they agree); ``labels``: the enum's."""
    if labels is not None:
        base = type_mapping(type_oid, typmod, user_type)
        avro = _connect("string", "io.debezium.data.Enum", **{"connect.parameters": {"allowed": ",".join(labels)}})
        return TypeMapping(base.pg_type, (avro,), "string", base.from_text, base.from_binary)
    return type_mapping(type_oid, typmod, user_type, _scalar)
