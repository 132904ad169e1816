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

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from cdcd.lsn import PG_EPOCH_OFFSET_US

AvroSchema = str | dict[str, Any] | list[Any]
Datum = Any

INT32_MAX: Final = 2**31 - 1
INT32_MIN: Final = -(2**31)
INT64_MAX: Final = 2**63 - 1
INT64_MIN: Final = -(2**63)
PG_EPOCH_DAYS: Final = 10_957  # 2000-01-01 in days since 1970-01-01
_US_PER_DAY: Final = 86_400_000_000


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


def decimal_bytes(unscaled: int) -> bytes:
    """Avro decimal bytes: big-endian two's complement, sized as fastavro sizes it (bit_length + 8) // 8."""
    return unscaled.to_bytes((abs(unscaled).bit_length() + 8) // 8, "big", signed=True)


def numeric_typmod(typmod: int) -> tuple[int, int] | None:
    """(precision, scale) of a numeric typmod, or None when unconstrained."""
    if typmod < 4:
        return None
    t = typmod - 4
    precision = (t >> 16) & 0xFFFF
    scale = ((t & 0x7FF) ^ 1024) - 1024  # 11-bit signed since PostgreSQL 15
    return precision, scale


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


_NUMERIC_HEAD = struct.Struct(">hhHh")
_NUMERIC_SPECIAL = {0xC000: "NaN", 0xD000: "Infinity", 0xF000: "-Infinity"}


def _numeric_binary_parts(b: bytes) -> tuple[int, int, int]:
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


def _numeric_binary_to_decimal(scale: int) -> Callable[[bytes], bytes]:
    def convert(b: bytes) -> bytes:
        sign, n, exp = _numeric_binary_parts(b)
        shift = exp + scale
        if shift >= 0:
            n *= 10**shift
        else:
            n, rest = divmod(n, 10**-shift)
            if rest:
                raise ValueError(f"more than {scale} fraction digits")
        return decimal_bytes(sign * n)

    return convert


def _numeric_binary_to_text(b: bytes) -> str:
    if len(b) >= 8:
        special = _NUMERIC_HEAD.unpack_from(b)[2]
        if special in _NUMERIC_SPECIAL:
            return _NUMERIC_SPECIAL[special]
    sign, n, exp = _numeric_binary_parts(b)
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


def _interval_text(s: str) -> str:
    return format_interval(*parse_interval_text(s))


_INTERVAL = struct.Struct(">qii")


def _interval_binary(b: bytes) -> str:
    micros, days, months = _INTERVAL.unpack(b)
    return format_interval(months, days, micros)


# --------------------------------------------------------------------------------------------- arrays


class NoAvroShape(Exception):
    """An array value that is not one-dimensional with lower bound 1 (goes to the string branch)."""


def split_array_text(s: str) -> list[str | None]:
    """Elements of a one-dimensional PostgreSQL array literal (``{a,"b c",NULL,"NULL"}``), None for NULL.

    Raises NoAvroShape for multi-dimensional arrays or explicit bounds, ValueError when malformed.
    """
    if not s.startswith("{"):
        if s.startswith("["):
            raise NoAvroShape
        raise ValueError("not an array literal")
    if s == "{}":
        return []
    if s[1:2] == "{":
        raise NoAvroShape
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


def _binary_unsupported(pg_type: str) -> Callable[[bytes], Datum]:
    def convert(b: bytes) -> Datum:
        raise ValueError(f"the binary form of {pg_type} is not supported; use the text format (binary: false)")

    return convert


def identity(s: str) -> str:
    return s


@dataclass(frozen=True, slots=True)
class TypeMapping:
    """How one column type becomes Avro.

    ``branches`` are the non-null Avro types of the field (one, or [array, string] for arrays);
    ``kind`` the primitive the datum is written as ("boolean", "int", "long", "float", "double", "bytes",
    "string" or "array"); ``from_text`` / ``from_binary`` turn a tuple value into a datum (raising
    ValueError, TypeError or struct.error on bad input); ``element`` is set for arrays.
    """

    pg_type: str
    branches: tuple[AvroSchema, ...]
    kind: str
    from_text: Callable[[str], Datum]
    from_binary: Callable[[bytes], Datum]
    element: TypeMapping | None = None
    doc: str | None = field(default=None)


def _m(
    pg_type: str, avro: AvroSchema, kind: str, text: Callable[[str], Datum], binary: Callable[[bytes], Datum]
) -> TypeMapping:
    return TypeMapping(pg_type, (avro,), kind, text, binary)


def _string(pg_type: str, binary: Callable[[bytes], Datum] = _utf8, connect_name: str | None = None) -> TypeMapping:
    avro: AvroSchema = {"type": "string", "connect.name": connect_name} if connect_name else "string"
    return _m(pg_type, avro, "string", identity, binary)


_BASE: dict[int, TypeMapping] = {
    16: _m("bool", "boolean", "boolean", _bool_text, _bool_binary),
    17: _m("bytea", "bytes", "bytes", _bytea_text, bytes),
    18: _string("char"),
    19: _string("name"),
    20: _m("int8", "long", "long", int, _int8_binary),
    21: _m("int2", "int", "int", int, _int2_binary),
    23: _m("int4", "int", "int", int, _int4_binary),
    25: _string("text"),
    26: _m("oid", "long", "long", int, _oid_binary),
    114: _string("json", connect_name="io.debezium.data.Json"),
    142: _string("xml", connect_name="io.debezium.data.Xml"),
    700: _m("float4", "float", "float", float, _float4_binary),
    701: _m("float8", "double", "double", float, _float8_binary),
    1042: _string("bpchar"),
    1043: _string("varchar"),
    1082: _m("date", {"type": "int", "logicalType": "date"}, "int", _date_text, _date_binary),
    1083: _m("time", {"type": "long", "logicalType": "time-micros"}, "long", _time_text, _time_binary),
    1114: _m(
        "timestamp",
        {"type": "long", "logicalType": "local-timestamp-micros"},
        "long",
        _timestamp_text,
        _timestamp_binary,
    ),
    1184: _m(
        "timestamptz", {"type": "long", "logicalType": "timestamp-micros"}, "long", _timestamptz_text, _timestamp_binary
    ),
    1186: _m(
        "interval",
        {"type": "string", "connect.name": "io.debezium.time.Interval"},
        "string",
        _interval_text,
        _interval_binary,
    ),
    1266: _string("timetz", _timetz_binary),
    2950: _m("uuid", {"type": "string", "logicalType": "uuid"}, "string", identity, _uuid_binary),
    3802: _string("jsonb", _jsonb_binary, "io.debezium.data.Json"),
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


def _numeric(typmod: int) -> TypeMapping:
    pm = numeric_typmod(typmod)
    if pm is None or not (0 <= pm[1] <= pm[0]) or pm[0] < 1:
        return _string("numeric", _numeric_binary_to_text)
    precision, scale = pm
    return _m(
        f"numeric({precision},{scale})",
        {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale},
        "bytes",
        _numeric_text_to_decimal(scale),
        _numeric_binary_to_decimal(scale),
    )


def _scalar(type_oid: int, typmod: int) -> TypeMapping | None:
    if type_oid == NUMERIC_OID:
        return _numeric(typmod)
    return _BASE.get(type_oid)


def _array(element: TypeMapping) -> TypeMapping:
    etext, ebinary = element.from_text, element.from_binary

    def from_text(s: str) -> list[Datum] | str:
        try:
            items = split_array_text(s)
        except NoAvroShape:
            return s
        return [None if e is None else etext(e) for e in items]

    def from_binary(b: bytes) -> list[Datum]:
        return [None if e is None else ebinary(e) for e in split_array_binary(b)]

    avro = {"type": "array", "items": ["null", element.branches[0]]}
    return TypeMapping(f"{element.pg_type}[]", (avro, "string"), "array", from_text, from_binary, element)


def type_mapping(type_oid: int, typmod: int = -1, user_type: str | None = None) -> TypeMapping:
    """The mapping of a column type. ``user_type`` is ``schema.name`` from a pgoutput Type message when the
    OID is a user-defined type (enum, domain, ...): such columns are strings of the text form."""
    scalar = _scalar(type_oid, typmod)
    if scalar is not None:
        return scalar
    element_oid = ARRAY_ELEMENTS.get(type_oid)
    if element_oid is not None:
        element = _scalar(element_oid, typmod)
        assert element is not None
        return _array(element)
    if user_type is not None:
        return TypeMapping(
            user_type,
            ({"type": "string", "pg.type": user_type},),
            "string",
            identity,
            _binary_unsupported(f"user-defined type {user_type} (oid {type_oid})"),
            doc=f"PostgreSQL type {user_type} (oid {type_oid}), as its text form",
        )
    return TypeMapping(
        f"oid {type_oid}",
        ({"type": "string", "pg.type.oid": type_oid},),
        "string",
        identity,
        _binary_unsupported(f"type oid {type_oid}"),
        doc=f"PostgreSQL type oid {type_oid} (not built in), as its text form",
    )
