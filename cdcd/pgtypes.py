"""PostgreSQL's values: the text and binary forms of built-in types parsed into plain Python values. Pure.

Shared by every stage that reads values: the Avro mapping (``cdcd.avro.types``, which adds the Avro schemas and
Debezium's shapes), row filters, and the snapshot window's key comparison. ``codec(oid, typmod)`` gives a
type's two parsers; the values follow Avro's logical-type conventions, so that the Avro encoder writes them as
they are: dates as days since 1970-01-01, times and timestamps as microseconds (timestamptz in UTC), with
``infinity``/``-infinity`` at the type's extremes (PostgreSQL's own binary representation of them).

Text forms are what PostgreSQL's output functions print with the session settings ``DateStyle=ISO``,
``IntervalStyle=postgres`` (or ``iso_8601``) and ``bytea_output=hex`` (``escape`` is accepted too).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from cdcd.lsn import PG_EPOCH_OFFSET_US

INT32_MAX: Final = 2**31 - 1
INT32_MIN: Final = -(2**31)
INT64_MAX: Final = 2**63 - 1
INT64_MIN: Final = -(2**63)
PG_EPOCH_DAYS: Final = 10_957  # 2000-01-01 in days since 1970-01-01
_US_PER_DAY: Final = 86_400_000_000

# --------------------------------------------------------------------------------------------- scalars


def _bool_text(s: str) -> bool:
    if s == "t":
        return True
    if s == "f":
        return False
    raise ValueError("boolean text must be 't' or 'f'")


def _bool_binary(b: bytes) -> bool:
    if b == b"\x01":
        return True
    if b == b"\x00":
        return False
    raise ValueError("boolean binary must be one byte 0 or 1")


_I16 = struct.Struct(">h").unpack
_I32 = struct.Struct(">i").unpack
_U32 = struct.Struct(">I").unpack
_I64 = struct.Struct(">q").unpack
_F32 = struct.Struct(">f").unpack
_F64 = struct.Struct(">d").unpack


def _int2_binary(b: bytes) -> int:
    return int(_I16(b)[0])


def _int4_binary(b: bytes) -> int:
    return int(_I32(b)[0])


def _oid_binary(b: bytes) -> int:
    return int(_U32(b)[0])


def _int8_binary(b: bytes) -> int:
    return int(_I64(b)[0])


def _float4_binary(b: bytes) -> float:
    return float(_F32(b)[0])


def _float8_binary(b: bytes) -> float:
    return float(_F64(b)[0])


def _utf8(b: bytes) -> str:
    return b.decode()


def _jsonb_binary(b: bytes) -> str:
    if b[:1] != b"\x01":
        raise ValueError(f"unsupported jsonb binary version {b[:1]!r} (expected 1)")
    return b[1:].decode()


_OCTAL = re.compile(r"\\(\\|[0-3][0-7][0-7])")


def _bytea_text(s: str) -> bytes:
    if s.startswith("\\x"):
        return bytes.fromhex(s[2:])
    # bytea_output = escape: printable ASCII as is, \\ for a backslash, \ooo octal for the rest
    if "\\" not in s:
        return s.encode("latin-1")
    out = bytearray()
    pos = 0
    for m in _OCTAL.finditer(s):
        out += s[pos : m.start()].encode("latin-1")
        g = m.group(1)
        out.append(92 if g == "\\" else int(g, 8))
        pos = m.end()
    rest = s[pos:]
    if "\\" in rest:
        raise ValueError("bad escape in bytea escape format")
    out += rest.encode("latin-1")
    return bytes(out)


def _uuid_binary(b: bytes) -> str:
    if len(b) != 16:
        raise ValueError("uuid binary must be 16 bytes")
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# --------------------------------------------------------------------------------------------- numeric


def numeric_typmod(typmod: int) -> tuple[int, int] | None:
    """(precision, scale) of a numeric typmod, or None when unconstrained."""
    if typmod < 4:
        return None
    t = typmod - 4
    precision = (t >> 16) & 0xFFFF
    scale = ((t & 0x7FF) ^ 1024) - 1024  # 11-bit signed since PostgreSQL 15
    return precision, scale


_NUMERIC_HEAD = struct.Struct(">hhHh")
_NUMERIC_SPECIAL = {0xC000: "NaN", 0xD000: "Infinity", 0xF000: "-Infinity"}


def numeric_binary_parts(b: bytes) -> tuple[int, int, int]:
    """(sign, magnitude as an integer, exponent of ten) of numeric_send's form; sign is -1/1."""
    ndigits, weight, sign, _dscale = _NUMERIC_HEAD.unpack_from(b)
    if sign in _NUMERIC_SPECIAL:
        raise ValueError(f"numeric {_NUMERIC_SPECIAL[sign]} cannot be represented as an Avro decimal")
    if sign not in (0, 0x4000) or len(b) != 8 + 2 * ndigits:
        raise ValueError("malformed numeric binary form")
    n = 0
    for (d,) in struct.iter_unpack(">H", b[8:]):
        if d > 9999:
            raise ValueError("malformed numeric binary digit")
        n = n * 10000 + d
    return (-1 if sign == 0x4000 else 1), n, 4 * (weight - ndigits + 1)


def numeric_binary_to_text(b: bytes) -> str:
    if len(b) >= 8:
        special = _NUMERIC_HEAD.unpack_from(b)[2]
        if special in _NUMERIC_SPECIAL:
            return _NUMERIC_SPECIAL[special]
    sign, n, exp = numeric_binary_parts(b)
    dscale = _NUMERIC_HEAD.unpack_from(b)[3]
    if exp + dscale >= 0:
        n *= 10 ** (exp + dscale)
    else:
        n //= 10 ** -(exp + dscale)
    digits = str(n).rjust(dscale + 1, "0")
    text = f"{digits[:-dscale]}.{digits[-dscale:]}" if dscale else digits
    return f"-{text}" if sign < 0 and n else text


# --------------------------------------------------------------------------------------------- date/time


def days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year numbering: 1 BC is year 0)."""
    if not (1 <= m <= 12 and 1 <= d <= 31):
        raise ValueError("month or day out of range")
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * ((m + 9) % 12) + 2) // 5 + d - 1
    return era * 146_097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719_468


_DAYS_CACHE: dict[str, int] = {}


def _date_days(s: str) -> int:
    """Days since the Unix epoch of ``YYYY-MM-DD`` (year of 4+ digits), cached: CDC timestamps cluster."""
    days = _DAYS_CACHE.get(s)
    if days is None:
        y, m, d = s.rsplit("-", 2)
        if not (y.isdigit() and m.isdigit() and d.isdigit() and len(m) == 2 and len(d) == 2):
            raise ValueError("not an ISO date")
        days = days_from_civil(int(y), int(m), int(d))
        if len(_DAYS_CACHE) >= 4096:
            _DAYS_CACHE.clear()
        _DAYS_CACHE[s] = days
    return days


def _date_text(s: str) -> int:
    if s.endswith(" BC"):
        y, m, d = s[:-3].rsplit("-", 2)
        if not y.isdigit():
            raise ValueError("not an ISO date")
        days = days_from_civil(1 - int(y), int(m), int(d))
    elif s == "infinity":
        return INT32_MAX
    elif s == "-infinity":
        return INT32_MIN
    else:
        days = _date_days(s)
    if not INT32_MIN < days < INT32_MAX:
        raise ValueError("date out of the Avro int range")
    return days


def _date_binary(b: bytes) -> int:
    (d,) = _I32(b)
    if d in (INT32_MAX, INT32_MIN):
        return int(d)
    return int(d) + PG_EPOCH_DAYS


def _time_of_day_us(s: str) -> int:
    """Microseconds of ``HH:MM:SS[.ffffff]`` (hours may exceed 23 only for 24:00:00)."""
    if s[2:3] != ":" or s[5:6] != ":" or not (s[:2].isdigit() and s[3:5].isdigit() and s[6:8].isdigit()):
        raise ValueError("not an HH:MM:SS time")
    us = (int(s[:2]) * 3600 + int(s[3:5]) * 60 + int(s[6:8])) * 1_000_000
    if len(s) > 8:
        if s[8] != "." or not s[9:].isdigit() or len(s) > 15:
            raise ValueError("bad fraction of a second")
        us += int(s[9:].ljust(6, "0"))
    return us


def _time_text(s: str) -> int:
    return _time_of_day_us(s)


def _time_binary(b: bytes) -> int:
    return int(_I64(b)[0])


def _split_offset(s: str) -> tuple[str, int]:
    """Split a trailing UTC offset (``+HH``, ``-HH:MM``, ``+HH:MM:SS``) off; return (rest, offset seconds)."""
    i = max(s.rfind("+"), s.rfind("-"))
    if i < 8:
        raise ValueError("missing UTC offset")
    parts = s[i + 1 :].split(":")
    if not all(p.isdigit() and len(p) == 2 for p in parts) or len(parts) > 3:
        raise ValueError("bad UTC offset")
    seconds = int(parts[0]) * 3600
    if len(parts) > 1:
        seconds += int(parts[1]) * 60
    if len(parts) > 2:
        seconds += int(parts[2])
    return s[:i], (-seconds if s[i] == "-" else seconds)


def _timestamp_us(s: str, with_tz: bool) -> int:
    if s == "infinity":
        return INT64_MAX
    if s == "-infinity":
        return INT64_MIN
    bc = s.endswith(" BC")
    if bc:
        s = s[:-3]
    offset = 0
    if with_tz:
        s, offset = _split_offset(s)
    date, sep, tod = s.partition(" ")
    if not sep:
        raise ValueError("not an ISO timestamp")
    if bc:
        y, m, d = date.rsplit("-", 2)
        if not y.isdigit():
            raise ValueError("not an ISO date")
        days = days_from_civil(1 - int(y), int(m), int(d))
    else:
        days = _date_days(date)
    us = days * _US_PER_DAY + _time_of_day_us(tod) - offset * 1_000_000
    if not INT64_MIN < us < INT64_MAX:
        raise ValueError("timestamp out of the Avro long range")
    return us


_HOUR_CACHE: dict[str, int] = {}
_FRACTION_SCALE: Final = (0, 100_000, 10_000, 1_000, 100, 10, 1)


def _timestamp_fast(s: str, with_tz: bool) -> int:
    """Fast path for 4-digit years (AD): the microseconds of ``YYYY-MM-DD HH`` plus offset are cached, only
    minutes, seconds and the fraction are parsed per value; anything unusual goes to the full parser."""
    if s[4:5] != "-" or s[13:14] != ":" or s[16:17] != ":" or s.endswith("C"):
        return _timestamp_us(s, with_tz)
    if with_tz:
        i = s.find("+", 19)
        if i < 0:
            i = s.find("-", 19)
            if i < 0:
                return _timestamp_us(s, with_tz)
    else:
        i = len(s)
    key = s[:13] + s[i:]
    base = _HOUR_CACHE.get(key)
    if base is None:
        base = _timestamp_us(f"{s[:13]}:00:00{s[i:]}", with_tz)
        if len(_HOUR_CACHE) >= 4096:
            _HOUR_CACHE.clear()
        _HOUR_CACHE[key] = base
    mm, ss = s[14:16], s[17:19]
    if not (mm.isdigit() and ss.isdigit()):
        return _timestamp_us(s, with_tz)
    us = base + int(mm) * 60_000_000 + int(ss) * 1_000_000
    if i > 19:
        frac = s[20:i]
        if s[19] != "." or not frac.isdigit() or len(frac) > 6:
            return _timestamp_us(s, with_tz)
        us += int(frac) * _FRACTION_SCALE[len(frac)]
    return us


def _timestamp_text(s: str) -> int:
    return _timestamp_fast(s, False)


def _timestamptz_text(s: str) -> int:
    return _timestamp_fast(s, True)


def _timestamp_binary(b: bytes) -> int:
    (t,) = _I64(b)
    if t in (INT64_MAX, INT64_MIN):
        return int(t)
    us = int(t) + PG_EPOCH_OFFSET_US
    if us >= INT64_MAX:
        raise ValueError("timestamp out of the Avro long range")
    return us


def _format_offset(east_seconds: int) -> str:
    sign = "-" if east_seconds < 0 else "+"
    h, rest = divmod(abs(east_seconds), 3600)
    m, s = divmod(rest, 60)
    if s:
        return f"{sign}{h:02d}:{m:02d}:{s:02d}"
    if m:
        return f"{sign}{h:02d}:{m:02d}"
    return f"{sign}{h:02d}"


def _format_time_of_day(us: int) -> str:
    secs, frac = divmod(us, 1_000_000)
    h, rest = divmod(secs, 3600)
    m, s = divmod(rest, 60)
    text = f"{h:02d}:{m:02d}:{s:02d}"
    if frac:
        text += f".{frac:06d}".rstrip("0")
    return text


_TIMETZ = struct.Struct(">qi")


def _timetz_binary(b: bytes) -> str:
    us, zone_west = _TIMETZ.unpack(b)
    return _format_time_of_day(us) + _format_offset(-zone_west)


# --------------------------------------------------------------------------------------------- interval


_INTERVAL_UNITS = {"year": 12, "years": 12, "mon": 1, "mons": 1}
_ISO_INTERVAL = re.compile(
    r"P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)W)?(?:(-?\d+)D)?"
    r"(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?\d+(?:\.\d+)?)S)?)?"
)


def _seconds_us(text: str) -> int:
    neg = text.startswith("-")
    whole, _, frac = text.lstrip("-").partition(".")
    us = int(whole) * 1_000_000 + (int(frac[:6].ljust(6, "0")) if frac else 0)
    return -us if neg else us


def parse_interval_text(s: str) -> tuple[int, int, int]:
    """(months, days, microseconds) of an interval printed with IntervalStyle postgres or iso_8601."""
    if s == "infinity":
        return INT32_MAX, INT32_MAX, INT64_MAX
    if s == "-infinity":
        return INT32_MIN, INT32_MIN, INT64_MIN
    if s.startswith("P"):
        m = _ISO_INTERVAL.fullmatch(s)
        if not m or s == "P" or s.endswith("T"):
            raise ValueError("not an ISO-8601 interval")
        y, mo, w, d, h, mi, sec = m.groups()
        months = int(y or 0) * 12 + int(mo or 0)
        days = int(w or 0) * 7 + int(d or 0)
        micros = (int(h or 0) * 3600 + int(mi or 0) * 60) * 1_000_000 + (_seconds_us(sec) if sec else 0)
        return months, days, micros
    months = days = micros = 0
    tokens = s.split()
    i = 0
    seen_time = False
    while i < len(tokens):
        tok = tokens[i]
        if ":" in tok:
            if seen_time:
                raise ValueError("two time parts in an interval")
            seen_time = True
            neg = tok.startswith("-")
            parts = tok.lstrip("+-").split(":")
            if len(parts) != 3 or not (parts[0].isdigit() and parts[1].isdigit()):
                raise ValueError("bad interval time part (IntervalStyle must be postgres or iso_8601)")
            us = (int(parts[0]) * 3600 + int(parts[1]) * 60) * 1_000_000 + _seconds_us(parts[2])
            micros = -us if neg else us
            i += 1
            continue
        if i + 1 >= len(tokens):
            raise ValueError("interval number without a unit (IntervalStyle must be postgres or iso_8601)")
        if not tok.lstrip("+-").isdigit():
            raise ValueError(f"unexpected interval token {tok!r} (IntervalStyle must be postgres or iso_8601)")
        n = int(tok)
        unit = tokens[i + 1]
        if unit in _INTERVAL_UNITS:
            months += n * _INTERVAL_UNITS[unit]
        elif unit in ("day", "days"):
            days += n
        else:
            raise ValueError(f"unknown interval unit {unit!r} (IntervalStyle must be postgres or iso_8601)")
        i += 2
    if not tokens:
        raise ValueError("empty interval")
    return months, days, micros


_INTERVAL = struct.Struct(">qii")


def interval_binary(b: bytes) -> tuple[int, int, int]:
    """(months, days, microseconds) of interval_send's form."""
    micros, days, months = _INTERVAL.unpack(b)
    return months, days, micros


# --------------------------------------------------------------------------------------------- arrays


class IrregularArray(Exception):
    """An array value that is not one-dimensional with lower bound 1."""


def split_array_text(s: str) -> list[str | None]:
    """Elements of a one-dimensional PostgreSQL array literal (``{a,"b c",NULL,"NULL"}``), None for NULL.

    Raises IrregularArray for multi-dimensional arrays or explicit bounds, ValueError when malformed.
    """
    if not s.startswith("{"):
        if s.startswith("["):
            raise IrregularArray
        raise ValueError("not an array literal")
    if s == "{}":
        return []
    if s[1:2] == "{":
        raise IrregularArray
    if not s.endswith("}"):
        raise ValueError("unterminated array literal")
    if '"' not in s:
        inner = s[1:-1]
        if "{" in inner or "}" in inner or "\\" in inner:
            raise ValueError("malformed array literal")
        return [None if e == "NULL" else e for e in inner.split(",")]
    items: list[str | None] = []
    i, end = 1, len(s) - 1
    while True:
        if s[i] == '"':
            buf: list[str] = []
            i += 1
            while True:
                if i >= end:
                    raise ValueError("unterminated quoted array element")
                c = s[i]
                if c == "\\":
                    buf.append(s[i + 1])
                    i += 2
                elif c == '"':
                    i += 1
                    break
                else:
                    buf.append(c)
                    i += 1
            items.append("".join(buf))
        else:
            j = s.find(",", i, end)
            if j < 0:
                j = end
            tok = s[i:j]
            if '"' in tok or "{" in tok or "}" in tok or "\\" in tok:
                raise ValueError("malformed array literal")
            items.append(None if tok == "NULL" else tok)
            i = j
        if i == end:
            return items
        if s[i] != ",":
            raise ValueError("malformed array literal")
        i += 1


_ARRAY_HEAD = struct.Struct(">iiI")
_ARRAY_DIM = struct.Struct(">ii")


def split_array_binary(b: bytes) -> list[bytes | None]:
    """Elements of array_send's form (one dimension, lower bound 1); raises ValueError otherwise."""
    ndim, _flags, _elem = _ARRAY_HEAD.unpack_from(b)
    if ndim == 0:
        return []
    if ndim != 1:
        raise ValueError("multi-dimensional arrays in binary form are not supported (use the text format)")
    size, lbound = _ARRAY_DIM.unpack_from(b, 12)
    if lbound != 1:
        raise ValueError("arrays with a lower bound other than 1 in binary form are not supported")
    items: list[bytes | None] = []
    pos = 20
    for _ in range(size):
        (n,) = _I32(b[pos : pos + 4])
        pos += 4
        if n < 0:
            items.append(None)
        else:
            if pos + n > len(b):
                raise ValueError("truncated array element")
            items.append(b[pos : pos + n])
            pos += n
    if pos != len(b):
        raise ValueError("trailing bytes after array elements")
    return items


# --------------------------------------------------------------------------------------------- the table


def binary_unsupported(what: str) -> Callable[[bytes], Any]:
    def convert(b: bytes) -> Any:
        raise ValueError(f"the binary form of {what} is not supported; use the text format (binary: false)")

    return convert


def identity(s: str) -> str:
    """A text form kept as it is (the Avro encoder inlines this one)."""
    return s


@dataclass(frozen=True, slots=True)
class Codec:
    """A type's name and its parsers (raising ValueError, TypeError or struct.error on bad input). Unconstrained
    numeric parses to its exact text form; arrays are element lists (a text array that is not one-dimensional
    with lower bound 1 raises IrregularArray); types not built in stay text (their binary form is refused)."""

    name: str
    from_text: Callable[[str], Any]
    from_binary: Callable[[bytes], Any]
    element: Codec | None = None


def _c(name: str, text: Callable[[str], Any], binary: Callable[[bytes], Any]) -> Codec:
    return Codec(name, text, binary)


def _string(name: str, binary: Callable[[bytes], Any] = _utf8) -> Codec:
    return Codec(name, identity, binary)


CODECS: Final[dict[int, Codec]] = {
    16: _c("bool", _bool_text, _bool_binary),
    17: _c("bytea", _bytea_text, bytes),
    18: _string("char"),
    19: _string("name"),
    20: _c("int8", int, _int8_binary),
    21: _c("int2", int, _int2_binary),
    23: _c("int4", int, _int4_binary),
    25: _string("text"),
    26: _c("oid", int, _oid_binary),
    114: _string("json"),
    142: _string("xml"),
    700: _c("float4", float, _float4_binary),
    701: _c("float8", float, _float8_binary),
    1042: _string("bpchar"),
    1043: _string("varchar"),
    1082: _c("date", _date_text, _date_binary),
    1083: _c("time", _time_text, _time_binary),
    1114: _c("timestamp", _timestamp_text, _timestamp_binary),
    1184: _c("timestamptz", _timestamptz_text, _timestamp_binary),
    1186: _c("interval", parse_interval_text, interval_binary),  # (months, days, microseconds)
    1266: _string("timetz", _timetz_binary),
    1700: _string("numeric", numeric_binary_to_text),
    2950: _c("uuid", identity, _uuid_binary),
    3802: _string("jsonb", _jsonb_binary),
}
NUMERIC_OID: Final = 1700

# array type OID -> element type OID
ARRAY_ELEMENTS: Final[dict[int, int]] = {
    1000: 16,
    1001: 17,
    1002: 18,
    1003: 19,
    1005: 21,
    1007: 23,
    1009: 25,
    1014: 1042,
    1015: 1043,
    1016: 20,
    1021: 700,
    1022: 701,
    1028: 26,
    1115: 1114,
    1182: 1082,
    1183: 1083,
    1185: 1184,
    1187: 1186,
    1231: 1700,
    1270: 1266,
    143: 142,
    199: 114,
    2951: 2950,
    3807: 3802,
}


def _array(element: Codec) -> Codec:
    etext, ebinary = element.from_text, element.from_binary

    def from_text(s: str) -> list[Any]:
        return [None if e is None else etext(e) for e in split_array_text(s)]

    def from_binary(b: bytes) -> list[Any]:
        return [None if e is None else ebinary(e) for e in split_array_binary(b)]

    return Codec(f"{element.name}[]", from_text, from_binary, element)


def codec(type_oid: int) -> Codec:
    """The parsers of a column type; types not built in (user-defined, extensions) are their text form."""
    found = CODECS.get(type_oid)
    if found is not None:
        return found
    element = ARRAY_ELEMENTS.get(type_oid)
    if element is not None:
        return _array(CODECS[element])
    return Codec(f"oid {type_oid}", identity, binary_unsupported(f"type oid {type_oid}"))
