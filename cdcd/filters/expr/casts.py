"""PostgreSQL's casts between the supported types: each one's context (implicit, assignment, explicit) and
conversion, the casts refused because they depend on the TimeZone setting, and the implicit-cast, preferred
type and category rules that resolving a common type uses."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final

from cdcd.filters.expr.arith import (
    date_to_ts,
    float_to_int,
    float_to_numeric,
    int8_to_oid,
    int_check,
    int_to_oid,
    num_to_int,
    oid_to_int4,
    to_float4,
    ts_to_date,
    ts_to_time,
)
from cdcd.filters.expr.strings import bool_to_text, rtrim_spaces, to_name
from cdcd.filters.expr.types import NUMBERS, STRINGS, T

Conv = Callable[[Any], Any]
# (source, target) -> (context: i implicit, a assignment, e explicit; conversion or None for the same value)
CASTS: Final[dict[tuple[str, str], tuple[str, Conv | None]]] = {
    ("int2", "int4"): ("i", None),
    ("int2", "int8"): ("i", None),
    ("int4", "int8"): ("i", None),
    ("int4", "int2"): ("a", int_check("int2")),
    ("int8", "int2"): ("a", int_check("int2")),
    ("int8", "int4"): ("a", int_check("int4")),
    ("int2", "numeric"): ("i", Decimal),
    ("int4", "numeric"): ("i", Decimal),
    ("int8", "numeric"): ("i", Decimal),
    ("int2", "float4"): ("i", to_float4),
    ("int4", "float4"): ("i", to_float4),
    ("int8", "float4"): ("i", to_float4),
    ("int2", "float8"): ("i", float),
    ("int4", "float8"): ("i", float),
    ("int8", "float8"): ("i", float),
    ("int2", "oid"): ("i", int_to_oid),
    ("int4", "oid"): ("i", int_to_oid),
    ("int8", "oid"): ("i", int8_to_oid),
    ("oid", "int4"): ("a", oid_to_int4),
    ("oid", "int8"): ("a", None),
    ("int4", "bool"): ("e", bool),
    ("bool", "int4"): ("e", int),
    ("numeric", "int2"): ("a", num_to_int("int2")),
    ("numeric", "int4"): ("a", num_to_int("int4")),
    ("numeric", "int8"): ("a", num_to_int("int8")),
    ("numeric", "float4"): ("i", to_float4),
    ("numeric", "float8"): ("i", float),
    ("float4", "int2"): ("a", float_to_int("int2")),
    ("float4", "int4"): ("a", float_to_int("int4")),
    ("float4", "int8"): ("a", float_to_int("int8")),
    ("float8", "int2"): ("a", float_to_int("int2")),
    ("float8", "int4"): ("a", float_to_int("int4")),
    ("float8", "int8"): ("a", float_to_int("int8")),
    ("float4", "numeric"): ("a", float_to_numeric(6)),
    ("float8", "numeric"): ("a", float_to_numeric(15)),
    ("float4", "float8"): ("i", None),
    ("float8", "float4"): ("a", to_float4),
    ("text", "varchar"): ("i", None),
    ("text", "bpchar"): ("i", None),
    ("text", "name"): ("i", to_name),
    ("varchar", "text"): ("i", None),
    ("varchar", "bpchar"): ("i", None),
    ("varchar", "name"): ("i", to_name),
    ("bpchar", "text"): ("i", rtrim_spaces),
    ("bpchar", "varchar"): ("i", rtrim_spaces),
    ("bpchar", "name"): ("i", lambda s: to_name(s.rstrip(" "))),
    ("name", "text"): ("i", None),
    ("name", "varchar"): ("a", None),
    ("name", "bpchar"): ("a", None),
    ("bool", "text"): ("a", bool_to_text),
    ("bool", "varchar"): ("a", bool_to_text),
    ("bool", "bpchar"): ("a", bool_to_text),
    ("date", "timestamp"): ("i", date_to_ts),
    ("timestamp", "date"): ("a", ts_to_date),
    ("timestamp", "time"): ("a", ts_to_time),
    ("time", "interval"): ("i", None),  # a time's comparison value as an interval is its µs
}
TZ_CASTS: Final = frozenset(
    {
        ("date", "timestamptz"),
        ("timestamp", "timestamptz"),
        ("timestamptz", "date"),
        ("timestamptz", "time"),
        ("timestamptz", "timestamp"),
    }
)

PREFERRED: Final = frozenset({"text", "float8", "oid", "timestamptz", "interval", "bool"})


def implicit(source: str, target: str) -> bool:
    """Whether PostgreSQL has an implicit cast (the timestamptz ones are not immutable: refused when used)."""
    if source == target or (target == "timestamptz" and source in ("date", "timestamp")):
        return True
    return CASTS.get((source, target), ("",))[0] == "i"


def category(t: T) -> str:
    if t.name in NUMBERS or t.name == "oid":
        return "numeric"
    if t.name in STRINGS:
        return "string"
    if t.name in ("date", "timestamp", "timestamptz", "time"):
        return "datetime"
    return t.name
