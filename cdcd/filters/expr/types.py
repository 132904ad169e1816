"""The type model: the supported built-in types as the compiler sees them (``T``), their names, oids and
groups (integers, floats, numbers, strings), and the column types of a table (``ColumnType``).

Python representation of each type's values: integers (int2/int4/int8/oid) int; numeric Decimal; float4 and
float8 float (float4 values are exactly representable in float4); text types str (bpchar with its padding);
bool bool; date int days since 1970-01-01; time int µs; timestamp/timestamptz int µs since 1970-01-01 UTC
(±infinity as cdcd.pgtypes' extremes); interval int, PostgreSQL's comparison value (months*30 days + days, in
µs); uuid canonical lower-case str; bytea bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from cdcd.pgoutput.messages import Row
from cdcd.pgtypes import codec, numeric_typmod


@dataclass(frozen=True)
class ColumnType:
    name: str
    type_oid: int
    type_modifier: int


@dataclass(frozen=True, slots=True)
class T:
    """A PostgreSQL type as the compiler sees it: internal name, typmod parameters, label for other types."""

    name: str
    mod: tuple[int, ...] = ()
    label: str = ""

    def __str__(self) -> str:
        base = self.label or DISPLAY.get(self.name, self.name)
        return f"{base}({','.join(map(str, self.mod))})" if self.mod else base

    @property
    def bare(self) -> T:
        return T(self.name) if self.mod else self


DISPLAY: Final = {
    "int2": "smallint",
    "int4": "integer",
    "int8": "bigint",
    "float4": "real",
    "float8": "double precision",
    "varchar": "character varying",
    "bpchar": "character",
    "bool": "boolean",
    "time": "time without time zone",
    "timestamp": "timestamp without time zone",
    "timestamptz": "timestamp with time zone",
}
_OIDS: Final = {
    16: "bool",
    17: "bytea",
    19: "name",
    20: "int8",
    21: "int2",
    23: "int4",
    25: "text",
    26: "oid",
    700: "float4",
    701: "float8",
    1042: "bpchar",
    1043: "varchar",
    1082: "date",
    1083: "time",
    1114: "timestamp",
    1184: "timestamptz",
    1186: "interval",
    1700: "numeric",
    2950: "uuid",
}
TYPE_OIDS: Final = {name: oid for oid, name in _OIDS.items()}
FIRST_NORMAL_OID: Final = 16384

INTS: Final = frozenset({"int2", "int4", "int8"})
FLOATS: Final = frozenset({"float4", "float8"})
NUMBERS: Final = INTS | FLOATS | {"numeric"}
STRINGS: Final = frozenset({"text", "varchar", "bpchar", "name"})
RANK: Final = {"int2": 0, "int4": 1, "int8": 2, "numeric": 3, "float4": 4, "float8": 5}
INT_LIMITS: Final = {
    "int2": (-(2**15), 2**15 - 1, "smallint out of range"),
    "int4": (-(2**31), 2**31 - 1, "integer out of range"),
    "int8": (-(2**63), 2**63 - 1, "bigint out of range"),
}
UNKNOWN: Final = T("unknown")
BOOL: Final = T("bool")
TEXT: Final = T("text")
INT4: Final = T("int4")
INT8: Final = T("int8")
NUMERIC: Final = T("numeric")
FLOAT8: Final = T("float8")


def column_type(column: ColumnType) -> T:
    name = _OIDS.get(column.type_oid)
    if name is None:
        return T("other", label=codec(column.type_oid).name)
    mod = column.type_modifier
    if name == "numeric":
        pm = numeric_typmod(mod)
        return T(name, pm or ())
    if name in ("bpchar", "varchar") and mod >= 4:
        return T(name, (mod - 4,))
    return T(name)


@dataclass(frozen=True)
class ParsedFilter:
    """A filter that passed the checks needing no column types.

    ``ordered_text_columns`` names the columns whose value reaches, through text-preserving expressions
    (columns, COALESCE, ||, casts to text, lower(), substr(), ...), an ordering comparison (<, <=, >, >=,
    BETWEEN, GREATEST, LEAST) or a case mapping (lower, upper, ILIKE) without an explicit COLLATE: their
    result depends on the column's collation, which cdcd evaluates as "C". It is computed without column
    types, so it may name columns that are not text at all (their collation is irrelevant).
    """

    text: str
    sql: str
    columns: frozenset[str]
    ordered_text_columns: frozenset[str]


Predicate = Callable[[Row], bool | None]  # a compiled filter: True, False or None (SQL NULL)
