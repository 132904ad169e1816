"""PostgreSQL type OID -> Avro type, and converters from PostgreSQL's text and binary forms to Avro *datums*.

A datum is the plain Python value Avro's binary encoding writes for the type, with logical types already
applied: ``int`` for int/long (dates as days, times and timestamps as microseconds), ``float``, ``bool``,
``bytes`` (decimals as big-endian two's complement), ``str``, and for arrays a ``list`` of element datums
(``None`` for NULL elements) or a ``str`` (the text form of an array that has no Avro shape, see below).
``fastavro.schemaless_writer`` given these datums writes exactly the bytes the compiled encoder writes.

Text forms are what PostgreSQL's output functions print with the session settings ``DateStyle=ISO``,
``IntervalStyle=postgres`` (or ``iso_8601``) and ``bytea_output=hex`` (``escape`` is accepted too); the
walsender session must use them (they are PostgreSQL's defaults). ``TimeZone`` may be anything: timestamptz
text carries its offset.

Decisions:

* numeric(p, s) with 0 <= s <= p -> bytes/decimal(p, s). NaN and ±Infinity cannot be decimals: ConversionError.
  Unconstrained numeric (typmod -1), and numeric whose scale is negative or larger than the precision
  (PostgreSQL 15+) -> string holding the exact text form ("NaN", "Infinity", "-Infinity" included).
* date -> int/date (days since 1970-01-01); timestamp -> long/local-timestamp-micros; timestamptz ->
  long/timestamp-micros (UTC); time -> long/time-micros. ``infinity``/``-infinity`` map to the largest and
  smallest value of the Avro type (2**31-1 / -2**31 for dates, 2**63-1 / -2**63 for timestamps): PostgreSQL's
  own binary representation of them. BC dates and years past 9999 are converted exactly (proleptic
  Gregorian, as PostgreSQL). A finite timestamp beyond the Avro long range (years past ~294,000) raises.
* interval -> string, ISO-8601 duration in Debezium's ``interval.handling.mode=string`` shape
  ``P<y>Y<m>M<d>DT<h>H<m>M<s>S`` (each component signed as PostgreSQL keeps it; seconds with up to six
  fraction digits), e.g. ``1 year 2 mons 3 days 04:05:06.5`` -> ``P1Y2M3DT4H5M6.5S``. PostgreSQL 17's
  infinite intervals -> ``"infinity"`` / ``"-infinity"``.
* timetz -> string (text form; from binary rendered as PostgreSQL prints it).
* uuid -> string/uuid (canonical lower-case form); json, jsonb, xml, text, varchar, bpchar (padding kept),
  name, "char" -> string; bytea -> bytes.
* one-dimensional arrays with lower bound 1 -> array of ["null", element]; multi-dimensional arrays and
  arrays with other bounds (``[0:1]={..}``) have no Avro shape: the field is the union [array, string] and
  such a value goes to the string branch as PostgreSQL's text form. In binary form those raise.
* user-defined types (enums, domains, composites, ranges, extension types) and unknown OIDs -> string holding
  the text form. Their binary forms are not decodable without the catalog: ConversionError.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from cdcd.pgtypes import (
    ARRAY_ELEMENTS,
    CODECS,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    NUMERIC_OID,
    IrregularArray,
    binary_unsupported,
    identity,
    interval_binary,
    numeric_binary_parts,
    numeric_typmod,
    parse_interval_text,
    split_array_binary,
    split_array_text,
)

AvroSchema = str | dict[str, Any] | list[Any]
Datum = Any


class ConversionError(ValueError):
    """A value could not be converted to its Avro representation.

    ``table`` (``schema.table``), ``column`` and ``pg_type`` are filled in by the encoder when it knows them;
    ``value`` is the offending input, shown truncated.
    """

    def __init__(
        self, reason: str, *, table: str = "", column: str = "", pg_type: str = "", value: object = None
    ) -> None:
        self.reason = reason
        self.table = table
        self.column = column
        self.pg_type = pg_type
        self.value = value
        super().__init__(str(self))

    def __str__(self) -> str:
        where = []
        if self.table:
            where.append(f"table {self.table}")
        if self.column:
            where.append(f"column {self.column!r}")
        if self.pg_type:
            where.append(f"type {self.pg_type}")
        shown = repr(self.value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        prefix = f"cannot convert {', '.join(where)}: " if where else "cannot convert: "
        return f"{prefix}{self.reason} (value {shown})"


# --------------------------------------------------------------------------------------------- numeric


def decimal_bytes(unscaled: int) -> bytes:
    """Avro decimal bytes: big-endian two's complement, sized as fastavro sizes it (bit_length + 8) // 8."""
    return unscaled.to_bytes((abs(unscaled).bit_length() + 8) // 8, "big", signed=True)


def _numeric_text_to_decimal(scale: int) -> Callable[[str], bytes]:
    def convert(s: str) -> bytes:
        dot = s.find(".")
        if dot > 0 and len(s) - dot - 1 == scale and s[dot + 1 :].isdigit():  # PostgreSQL prints `scale` digits
            n = int(s[:dot] + s[dot + 1 :])
            return n.to_bytes((abs(n).bit_length() + 8) // 8, "big", signed=True)
        neg = s.startswith("-")
        body = s[1:] if neg else s
        ip, _, fp = body.partition(".")
        if not ip.isdigit() or (fp and not fp.isdigit()):
            if body in ("NaN", "Infinity"):
                raise ValueError(f"numeric {s} cannot be represented as an Avro decimal")
            raise ValueError("not a numeric text form")
        if len(fp) > scale:
            if fp[scale:].strip("0"):
                raise ValueError(f"more than {scale} fraction digits")
            fp = fp[:scale]
        n = int(ip + fp + "0" * (scale - len(fp)))
        return decimal_bytes(-n if neg else n)

    return convert


def _numeric_binary_to_decimal(scale: int) -> Callable[[bytes], bytes]:
    def convert(b: bytes) -> bytes:
        sign, n, exp = numeric_binary_parts(b)
        shift = exp + scale
        if shift >= 0:
            n *= 10**shift
        else:
            n, rest = divmod(n, 10**-shift)
            if rest:
                raise ValueError(f"more than {scale} fraction digits")
        return decimal_bytes(sign * n)

    return convert


# --------------------------------------------------------------------------------------------- interval


def format_interval(months: int, days: int, micros: int) -> str:
    """ISO-8601 duration, Debezium's string mode: P<y>Y<m>M<d>DT<h>H<m>M<s>S, components signed."""
    if (months, days, micros) == (INT32_MAX, INT32_MAX, INT64_MAX):
        return "infinity"
    if (months, days, micros) == (INT32_MIN, INT32_MIN, INT64_MIN):
        return "-infinity"
    msign = -1 if months < 0 else 1
    years, mons = divmod(abs(months), 12)
    tsign = "-" if micros < 0 else ""
    secs, frac = divmod(abs(micros), 1_000_000)
    hours, rest = divmod(secs, 3600)
    minutes, seconds = divmod(rest, 60)
    sec_text = f"{seconds}.{frac:06d}".rstrip("0") if frac else str(seconds)
    h = f"-{hours}" if tsign and hours else str(hours)
    mi = f"-{minutes}" if tsign and minutes else str(minutes)
    s = f"-{sec_text}" if tsign and (seconds or frac) else sec_text
    return f"P{msign * years}Y{msign * mons}M{days}DT{h}H{mi}M{s}S"


def _interval_text(s: str) -> str:
    return format_interval(*parse_interval_text(s))


def _interval_binary(b: bytes) -> str:
    return format_interval(*interval_binary(b))


# --------------------------------------------------------------------------------------------- the table


@dataclass(frozen=True, slots=True)
class TypeMapping:
    """How one column type becomes Avro.

    ``branches`` are the non-null Avro types of the field (one, or [array, string] for arrays);
    ``kind`` the primitive the datum is written as ("boolean", "int", "long", "float", "double", "bytes",
    "string" or "array"; "record" for a record-valued type, whose datum is its encoded bytes);
    ``from_text`` / ``from_binary`` turn a tuple value into a datum (raising ValueError, TypeError or
    struct.error on bad input); ``element`` is set for arrays; ``compiled`` False keeps the compiled row
    writer from converting the type itself (another type map's conversion: the reference writer's).
    """

    pg_type: str
    branches: tuple[AvroSchema, ...]
    kind: str
    from_text: Callable[[str], Datum]
    from_binary: Callable[[bytes], Datum]
    element: TypeMapping | None = None
    doc: str | None = field(default=None)
    compiled: bool = True  # whether cdcd._native's conversion of this type and schema applies (cdcd's own map)
    # the compiled conversion (cdcd._native code, parameter) of another map's conversion (Debezium's), if any
    native: tuple[int, int] | None = None


def _m(type_oid: int, avro: AvroSchema, kind: str) -> TypeMapping:
    c = CODECS[type_oid]
    return TypeMapping(c.name, (avro,), kind, c.from_text, c.from_binary)


def _string(type_oid: int, connect_name: str | None = None) -> TypeMapping:
    avro: AvroSchema = {"type": "string", "connect.name": connect_name} if connect_name else "string"
    return _m(type_oid, avro, "string")


_INTERVAL_MAPPING: Final = TypeMapping(
    "interval",
    ({"type": "string", "connect.name": "io.debezium.time.Interval"},),
    "string",
    _interval_text,
    _interval_binary,
)
_BASE: dict[int, TypeMapping] = {
    16: _m(16, "boolean", "boolean"),
    17: _m(17, "bytes", "bytes"),
    18: _string(18),
    19: _string(19),
    20: _m(20, "long", "long"),
    21: _m(21, "int", "int"),
    23: _m(23, "int", "int"),
    25: _string(25),
    26: _m(26, "long", "long"),
    114: _string(114, connect_name="io.debezium.data.Json"),
    142: _string(142, connect_name="io.debezium.data.Xml"),
    700: _m(700, "float", "float"),
    701: _m(701, "double", "double"),
    1042: _string(1042),
    1043: _string(1043),
    1082: _m(1082, {"type": "int", "logicalType": "date"}, "int"),
    1083: _m(1083, {"type": "long", "logicalType": "time-micros"}, "long"),
    1114: _m(1114, {"type": "long", "logicalType": "local-timestamp-micros"}, "long"),
    1184: _m(1184, {"type": "long", "logicalType": "timestamp-micros"}, "long"),
    1186: _INTERVAL_MAPPING,
    1266: _string(1266),
    2950: _m(2950, {"type": "string", "logicalType": "uuid"}, "string"),
    3802: _string(3802, "io.debezium.data.Json"),
}


def _numeric(typmod: int) -> TypeMapping:
    pm = numeric_typmod(typmod)
    if pm is None or not (0 <= pm[1] <= pm[0]) or pm[0] < 1:
        return _string(NUMERIC_OID)
    precision, scale = pm
    return TypeMapping(
        f"numeric({precision},{scale})",
        ({"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale},),
        "bytes",
        _numeric_text_to_decimal(scale),
        _numeric_binary_to_decimal(scale),
    )


def _scalar(type_oid: int, typmod: int) -> TypeMapping | None:
    if type_oid == NUMERIC_OID:
        return _numeric(typmod)
    return _BASE.get(type_oid)


def array_mapping(element: TypeMapping) -> TypeMapping:
    etext, ebinary = element.from_text, element.from_binary

    def from_text(s: str) -> list[Datum] | str:
        try:
            items = split_array_text(s)
        except IrregularArray:
            return s
        return [None if e is None else etext(e) for e in items]

    def from_binary(b: bytes) -> list[Datum]:
        return [None if e is None else ebinary(e) for e in split_array_binary(b)]

    avro = {"type": "array", "items": ["null", element.branches[0]]}
    return TypeMapping(f"{element.pg_type}[]", (avro, "string"), "array", from_text, from_binary, element)


ScalarMap = Callable[[int, int], TypeMapping | None]


def type_mapping(
    type_oid: int, typmod: int = -1, user_type: str | None = None, scalar: ScalarMap | None = None
) -> TypeMapping:
    """The mapping of a column type. ``user_type`` is ``schema.name`` from a pgoutput Type message when the
    OID is a user-defined type (enum, domain, ...): such columns are strings of the text form. ``scalar``:
    another map's mapping of (type oid, typmod), where it has one (cdcd's own elsewhere, and for array elements
    it would make records)."""
    own = scalar(type_oid, typmod) if scalar is not None else None
    base = own or _scalar(type_oid, typmod)
    if base is not None:
        return base
    element_oid = ARRAY_ELEMENTS.get(type_oid)
    if element_oid is not None:
        element = scalar(element_oid, typmod) if scalar is not None else None
        if element is None or element.kind == "record":
            element = _scalar(element_oid, typmod)
        assert element is not None
        return array_mapping(element)
    if user_type is not None:
        return TypeMapping(
            user_type,
            ({"type": "string", "pg.type": user_type},),
            "string",
            identity,
            binary_unsupported(f"user-defined type {user_type} (oid {type_oid})"),
            doc=f"PostgreSQL type {user_type} (oid {type_oid}), as its text form",
        )
    return TypeMapping(
        f"oid {type_oid}",
        ({"type": "string", "pg.type.oid": type_oid},),
        "string",
        identity,
        binary_unsupported(f"type oid {type_oid}"),
        doc=f"PostgreSQL type oid {type_oid} (not built in), as its text form",
    )
