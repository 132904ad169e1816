"""Values in: the readers of a row's columns (text or binary form, as pgoutput sends them) and the input
parsers that read a literal as a supported type, both to the representations described in ``types``."""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final, NoReturn

from cdcd.filters.expr.arith import DATE_END, TS_END, TS_MIN, US_PER_DAY, dec, f4_exact
from cdcd.filters.expr.errors import Unevaluable
from cdcd.filters.expr.strings import to_name
from cdcd.filters.expr.types import DISPLAY, INT_LIMITS, STRINGS, TYPE_OIDS, T
from cdcd.pgoutput.messages import UNCHANGED_TOAST, Row
from cdcd.pgtypes import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    codec,
    days_from_civil,
    numeric_binary_to_text,
    parse_interval_text,
)

_INTERVAL: Final = struct.Struct(">qii")


def _interval_key(months: int, days: int, micros: int) -> int:
    return (months * 30 + days) * US_PER_DAY + micros


# ----------------------------------------------------------------------------------------- column values


def _readers(t: T) -> tuple[Callable[[str], Any] | None, Callable[[bytes], Any]]:
    """(text converter or None for the text itself, binary converter) of a column type."""
    name = t.name
    if name in STRINGS:
        return None, bytes.decode
    if name == "numeric":
        return Decimal, _numeric_binary
    if name == "float4":
        return f4_exact, codec(700).from_binary
    if name == "interval":
        return _interval_text, _interval_binary
    if name == "other":
        return None, bytes
    parsers = codec(TYPE_OIDS[name])
    return (None if name == "uuid" else parsers.from_text), parsers.from_binary


def _numeric_binary(b: bytes) -> Decimal:
    return Decimal(numeric_binary_to_text(b))


def _interval_text(s: str) -> int:
    return _interval_key(*parse_interval_text(s))


def _interval_binary(b: bytes) -> int:
    micros, days, months = _INTERVAL.unpack(b)
    return _interval_key(months, days, micros)


def column_reader(index: int, name: str, t: T) -> Callable[[Row], Any]:
    text, binary = _readers(t)
    toast = f'column "{name}" is an unchanged TOAST value (the server did not send it)'

    def failed(v: object, exc: Exception) -> NoReturn:
        raise Unevaluable(f'column "{name}": cannot read {t} value {v!r:.60}: {exc}') from None

    def read_binary(v: Any) -> Any:
        if v is UNCHANGED_TOAST:
            raise Unevaluable(toast, name)
        try:
            return binary(v)
        except (ValueError, TypeError, struct.error) as exc:
            failed(v, exc)

    if text is None:

        def read(row: Row) -> Any:
            v = row[index]
            if v.__class__ is str or v is None:
                return v
            return read_binary(v)

        return read

    convert = text

    def read_converted(row: Row) -> Any:
        v = row[index]
        if v.__class__ is str:
            try:
                return convert(v)
            except (ValueError, ArithmeticError) as exc:
                failed(v, exc)
        if v is None:
            return None
        return read_binary(v)

    return read_converted


# ----------------------------------------------------------------------------------------- literal input

_SPACE = "[ \t\n\r\v\f]*"
_INT_RE: Final = re.compile(f"{_SPACE}([+-]?[0-9]+){_SPACE}")
_NUM_RE: Final = re.compile(f"{_SPACE}([+-]?(?:[0-9]+\\.?[0-9]*|\\.[0-9]+)(?:[eE][+-]?[0-9]+)?){_SPACE}")
_SPECIALS: Final = {
    "nan": "NaN",
    "infinity": "Infinity",
    "+infinity": "Infinity",
    "-infinity": "-Infinity",
    "inf": "Infinity",
    "+inf": "Infinity",
    "-inf": "-Infinity",
}
_BOOLS: Final = (
    ("true", True, 1),
    ("false", False, 1),
    ("yes", True, 1),
    ("no", False, 1),
    ("on", True, 2),
    ("off", False, 2),
    ("1", True, 1),
    ("0", False, 1),
)
_DATE_RE: Final = r"(?P<y>[0-9]{4,})-(?P<m>[0-9]{1,2})-(?P<d>[0-9]{1,2})"
_TIME_RE: Final = r"(?P<H>[0-9]{1,2}):(?P<M>[0-9]{2})(?::(?P<S>[0-9]{2})(?:\.(?P<f>[0-9]+))?)?"
_ZONE_RE: Final = r"(?P<z>Z|UTC|GMT|(?P<zsign>[+-])(?P<zh>[0-9]{1,2})(?::?(?P<zm>[0-9]{2})(?::?(?P<zs>[0-9]{2}))?)?)"
_TS_RE: Final = re.compile(
    rf"\s*{_DATE_RE}(?:(?:\s+|T){_TIME_RE})?\s*{_ZONE_RE}?(?:\s*(?P<bc>BC|AD))?\s*", re.IGNORECASE
)
_TIME_ONLY_RE: Final = re.compile(rf"\s*{_TIME_RE}\s*{_ZONE_RE}?\s*", re.IGNORECASE)
_IV_TIME_RE: Final = re.compile(r"([+-]?)([0-9]+):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]{1,6}))?)?")
_UUID_RE: Final = re.compile(r"[0-9a-fA-F]{4}(?:-?[0-9a-fA-F]{4}){7}")
_CLOCK_WORDS: Final = frozenset({"now", "today", "tomorrow", "yesterday", "allballs"})
# interval unit -> (field: 0 months, 1 days, 2 µs; multiplier)
_IV_UNITS: Final[dict[str, tuple[int, int]]] = {
    unit: field
    for units, field in (
        (("microsecond", "microseconds", "us", "usec", "usecs", "microsecon"), (2, 1)),
        (("millisecond", "milliseconds", "ms", "msec", "msecs"), (2, 1_000)),
        (("second", "seconds", "s", "sec", "secs"), (2, 1_000_000)),
        (("minute", "minutes", "m", "min", "mins"), (2, 60_000_000)),
        (("hour", "hours", "h", "hr", "hrs"), (2, 3_600_000_000)),
        (("day", "days", "d"), (1, 1)),
        (("week", "weeks", "w"), (1, 7)),
        (("month", "months", "mon", "mons"), (0, 1)),
        (("year", "years", "y", "yr", "yrs"), (0, 12)),
        (("decade", "decades"), (0, 120)),
        (("century", "centuries"), (0, 1200)),
        (("millennium", "millennia"), (0, 12000)),
    )
    for unit in units
}


class BadInput(ValueError):
    """A literal PostgreSQL (or cdcd) cannot read as the type."""


def _input_int(type_name: str) -> Callable[[str], int]:
    lo, hi, _ = INT_LIMITS[type_name]

    def parse(s: str) -> int:
        m = _INT_RE.fullmatch(s)
        if m is None:
            raise BadInput(f'invalid input syntax for type {DISPLAY[type_name]}: "{s}"')
        v = int(m.group(1))
        if not lo <= v <= hi:
            raise BadInput(f'value "{s}" is out of range for type {DISPLAY[type_name]}')
        return v

    return parse


def _input_oid(s: str) -> int:
    m = _INT_RE.fullmatch(s)
    if m is None or not -(2**31) <= int(m.group(1)) <= 0xFFFFFFFF:
        raise BadInput(f'invalid input syntax for type oid: "{s}"')
    return int(m.group(1)) & 0xFFFFFFFF


def _number_text(s: str, type_label: str) -> str:
    special = _SPECIALS.get(s.strip(" \t\n\r\v\f").lower())
    if special is not None:
        return special
    m = _NUM_RE.fullmatch(s)
    if m is None:
        raise BadInput(f'invalid input syntax for type {type_label}: "{s}"')
    return m.group(1)


def _input_numeric(s: str) -> Decimal:
    text = _number_text(s, "numeric")
    return dec(Decimal(text))


def _input_float(single: bool) -> Callable[[str], float]:
    label = "real" if single else "double precision"

    def parse(s: str) -> float:
        text = _number_text(s, label)
        if text in ("NaN", "Infinity", "-Infinity"):
            return float(text)
        try:
            v = f4_exact(text) if single else float(text)
        except OverflowError:
            v = math.inf
        if math.isinf(v) or (v == 0 and Decimal(text) != 0):
            raise BadInput(f'"{s}" is out of range for type {label}')
        return v

    return parse


def _input_bool(s: str) -> bool:
    v = s.strip(" \t\n\r\v\f").lower()
    for word, value, minimum in _BOOLS:
        if len(v) >= minimum and word.startswith(v):
            return value
    raise BadInput(f'invalid input syntax for type boolean: "{s}"')


def _days(y: str, m: str, d: str, bc: str | None, s: str) -> int:
    year, month, day = int(y), int(m), int(d)
    if bc and bc.upper() == "BC":
        year = 1 - year
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    month_days = (31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
    if int(y) == 0 or not 1 <= month <= 12 or not 1 <= day <= month_days[month - 1]:
        raise BadInput(f'date/time field value out of range: "{s}"')
    return days_from_civil(year, month, day)


def _time_us(groups: dict[str, str | None], s: str) -> int:
    hour, minute, second = int(groups["H"] or 0), int(groups["M"] or 0), int(groups["S"] or 0)
    fraction = groups["f"] or ""
    if len(fraction) > 6:
        raise BadInput(f'"{s}": cdcd reads at most 6 fractional digits of a second')
    us = ((hour * 60 + minute) * 60 + second) * 1_000_000 + int(fraction.ljust(6, "0"))
    if minute > 59 or second > 59 or us > US_PER_DAY:
        raise BadInput(f'date/time field value out of range: "{s}"')
    return us


def _zone_seconds(g: dict[str, str | None], s: str) -> int:
    """The UTC offset of a timestamp literal in seconds east (0 without one: read as UTC)."""
    if g["zsign"] is None:
        return 0
    hours, minutes, seconds = int(g["zh"] or 0), int(g["zm"] or 0), int(g["zs"] or 0)
    if hours > 15 or minutes > 59 or seconds > 59:
        raise BadInput(f'time zone displacement out of range: "{s}"')
    total = hours * 3600 + minutes * 60 + seconds
    return -total if g["zsign"] == "-" else total


def _special_time(s: str, type_label: str) -> int | None:
    word = s.strip().lower()
    if word in _CLOCK_WORDS:
        raise BadInput(
            f"'{s}' is not allowed: PostgreSQL would freeze it when creating the publication; write the date"
        )
    if type_label == "time":
        return None
    if word == "epoch":
        return 0
    if word in ("infinity", "+infinity"):
        return INT32_MAX if type_label == "date" else INT64_MAX
    if word == "-infinity":
        return INT32_MIN if type_label == "date" else INT64_MIN
    return None


def _input_timestamp(with_tz: bool) -> Callable[[str], int]:
    label = "timestamp with time zone" if with_tz else "timestamp without time zone"

    def parse(s: str) -> int:
        special = _special_time(s, "timestamp")
        if special is not None:
            return special
        m = _TS_RE.fullmatch(s)
        if m is None:
            raise BadInput(f'"{s}" is not an ISO 8601 {label} (cdcd reads YYYY-MM-DD[ HH:MM[:SS[.ffffff]]][+HH:MM])')
        g = m.groupdict()
        us = _days(g["y"], g["m"], g["d"], g["bc"], s) * US_PER_DAY
        if g["H"] is not None:
            us += _time_us(g, s)
        if with_tz:
            us -= _zone_seconds(g, s) * 1_000_000
        if not TS_MIN <= us < TS_END:
            raise BadInput(f'timestamp out of range: "{s}"')
        return us

    return parse


def _input_date(s: str) -> int:
    special = _special_time(s, "date")
    if special is not None:
        return special
    m = _TS_RE.fullmatch(s)
    if m is None:
        raise BadInput(f'"{s}" is not an ISO 8601 date (cdcd reads YYYY-MM-DD)')
    g = m.groupdict()
    if g["H"] is not None:
        _time_us(g, s)
    days = _days(g["y"], g["m"], g["d"], g["bc"], s)
    if days * US_PER_DAY < TS_MIN or days >= DATE_END:
        raise BadInput(f'date out of range: "{s}"')
    return days


def _input_time(s: str) -> int:
    _special_time(s, "time")
    m = _TIME_ONLY_RE.fullmatch(s)
    if m is None:
        raise BadInput(f'"{s}" is not an ISO 8601 time (cdcd reads HH:MM[:SS[.ffffff]])')
    return _time_us(m.groupdict(), s)


def _interval_part(tokens: list[str], i: int, fields: list[int], s: str) -> int:
    """Add the interval item at ``tokens[i]`` to ``fields``; return the index of the next item."""
    token = tokens[i]
    if ":" in token:
        m = _IV_TIME_RE.fullmatch(token)
        if m is None:
            raise BadInput(f'invalid input syntax for type interval (cdcd reads [-]H:MM[:SS[.ffffff]]): "{s}"')
        sign, hours, minutes, seconds, fraction = m.groups()
        if int(minutes) > 59 or int(seconds or 0) > 59:
            raise BadInput(f'interval field value out of range: "{s}"')
        us = ((int(hours) * 60 + int(minutes)) * 60 + int(seconds or 0)) * 1_000_000 + int(
            (fraction or "").ljust(6, "0")
        )
        fields[2] += -us if sign == "-" else us
        return i + 1
    m = re.fullmatch(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([a-z]*)", token)
    if m is None:
        raise BadInput(f'invalid input syntax for type interval: "{s}"')
    number, unit = Decimal(m.group(1)), m.group(2)
    if not unit and i + 1 < len(tokens) and tokens[i + 1] in _IV_UNITS:
        unit, i = tokens[i + 1], i + 1
    if not unit and len(tokens) > 1:
        raise BadInput(f'invalid input syntax for type interval (a number without a unit): "{s}"')
    field, multiplier = _IV_UNITS.get(unit or "second", (-1, 0))
    value = number * multiplier
    if field < 0 or value != int(value):
        raise BadInput(f'"{s}": cdcd reads intervals as integral counts of units (fractions only of a second)')
    fields[field] += int(value)
    return i + 1


def _input_interval(s: str) -> int:
    text = s.strip().lower()
    if text.startswith("p"):
        try:
            return _interval_key(*parse_interval_text(text.upper()))
        except ValueError:
            raise BadInput(f'invalid input syntax for type interval: "{s}"') from None
    tokens = text.split()
    if tokens[:1] == ["@"]:
        tokens = tokens[1:]
    ago = tokens[-1:] == ["ago"]
    tokens = tokens[:-1] if ago else tokens
    if not tokens:
        raise BadInput(f'invalid input syntax for type interval: "{s}"')
    fields = [0, 0, 0]
    i = 0
    while i < len(tokens):
        i = _interval_part(tokens, i, fields, s)
    key = _interval_key(*fields)
    return -key if ago else key


def _input_uuid(s: str) -> str:
    inner = s[1:-1] if s.startswith("{") and s.endswith("}") else s
    if _UUID_RE.fullmatch(inner) is None:
        raise BadInput(f'invalid input syntax for type uuid: "{s}"')
    h = inner.replace("-", "").lower()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _input_bytea(s: str) -> bytes:
    try:
        if s.startswith("\\x"):
            return bytes.fromhex(re.sub(r"[ \n\t\r]", "", s[2:]))
        if s.isascii():
            result: bytes = codec(17).from_text(s)
            return result
    except ValueError:
        pass
    raise BadInput(f'invalid input syntax for type bytea (cdcd reads \\x hex or ASCII escape format): "{s}"')


INPUT: Final[dict[str, Callable[[str], Any]]] = {
    "int2": _input_int("int2"),
    "int4": _input_int("int4"),
    "int8": _input_int("int8"),
    "oid": _input_oid,
    "numeric": _input_numeric,
    "float4": _input_float(True),
    "float8": _input_float(False),
    "bool": _input_bool,
    "text": str,
    "varchar": str,
    "bpchar": str,
    "name": to_name,
    "date": _input_date,
    "time": _input_time,
    "timestamp": _input_timestamp(False),
    "timestamptz": _input_timestamp(True),
    "interval": _input_interval,
    "uuid": _input_uuid,
    "bytea": _input_bytea,
}
