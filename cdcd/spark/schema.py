"""From cdcd's Avro envelope schemas to the mirror's Spark columns, and aligning old writer schemas to the newest.

cdcd's Value record (cdcd/avro/schema.py, cdcd/avro/types.py) has one ``["null", T]`` field per column. The
mirror column types (Spark SQL DDL):

====================================  ==============================================================
Avro                                  Spark
====================================  ==============================================================
boolean, int, long, float, double     boolean, int, bigint, float, double
bytes / string                        binary / string (uuid, json, jsonb, xml, interval, enums too)
bytes, decimal(p, s)                  decimal(p, s) (Spark's limit: p <= 38)
int, date                             date
long, timestamp-micros                timestamp (an instant; timestamptz)
long, local-timestamp-micros          timestamp_ntz (timestamp without time zone)
long, time-micros                     bigint, microseconds since midnight (Spark 4.0 has no TIME type)
[array of ["null", E], string]        struct<elements: array<E>, text: string>: a one-dimensional array in
                                      ``elements``; a multi-dimensional one as PostgreSQL's text in ``text``
====================================  ==============================================================

Every function here is pure: it turns schemas into SQL expression text the Spark side evaluates.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

# Columns the job adds to every mirror table: the stream position of the event that last wrote the row.
COMMIT_LSN: Final = "_cdc_commit_lsn"
LSN: Final = "_cdc_lsn"
META_COLUMNS: Final = (COMMIT_LSN, LSN)

_PRIMITIVES: Final = {
    "boolean": "boolean",
    "int": "int",
    "long": "bigint",
    "float": "float",
    "double": "double",
    "bytes": "binary",
    "string": "string",
}
_LOGICAL: Final = {
    ("int", "date"): "date",
    ("long", "timestamp-micros"): "timestamp",
    ("long", "local-timestamp-micros"): "timestamp_ntz",
    ("long", "time-micros"): "bigint",
    ("string", "uuid"): "string",
}


class UnsupportedSchema(ValueError):
    """An Avro type the mirror has no column type for."""


def quote(name: str) -> str:
    """A Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def literal(text: str) -> str:
    """A Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def spark_type(avro: Any) -> str:
    """The Spark DDL type of one non-null Avro type (or of the branches of a union without null)."""
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        if len(branches) == 1:
            return spark_type(branches[0])
        if len(branches) == 2 and isinstance(branches[0], dict) and branches[0].get("type") == "array":
            return f"struct<elements: {spark_type(branches[0])}, text: {spark_type(branches[1])}>"
        raise UnsupportedSchema(f"union {avro!r}")
    if isinstance(avro, str):
        if avro in _PRIMITIVES:
            return _PRIMITIVES[avro]
        raise UnsupportedSchema(f"Avro type {avro!r}")
    base, logical = avro.get("type"), avro.get("logicalType")
    if base == "array":
        return f"array<{spark_type(avro['items'])}>"
    if logical == "decimal" and base == "bytes":
        precision, scale = int(avro["precision"]), int(avro.get("scale", 0))
        if precision > 38:
            raise UnsupportedSchema(f"decimal({precision},{scale}): Spark decimals hold at most 38 digits")
        return f"decimal({precision},{scale})"
    if (base, logical) in _LOGICAL:
        return _LOGICAL[base, logical]
    return spark_type(base)


@dataclass(frozen=True, slots=True)
class Column:
    name: str  # the Avro field name (cdcd keeps PostgreSQL's column name when it is a valid Avro name)
    ddl: str


@dataclass(frozen=True, slots=True)
class TableSchema:
    """The columns of one writer schema of a table (its Envelope's Value record)."""

    columns: tuple[Column, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def ddl(self) -> str:
        return ", ".join(f"{quote(c.name)} {c.ddl}" for c in self.columns)

    def struct_ddl(self) -> str:
        return "struct<" + ", ".join(f"{quote(c.name)}: {c.ddl}" for c in self.columns) + ">"


def value_record(envelope: dict[str, Any]) -> dict[str, Any]:
    """The Value record inside an Envelope schema (the ``before`` field's non-null branch)."""
    for field in envelope["fields"]:
        if field["name"] == "before":
            return next(b for b in field["type"] if isinstance(b, dict))
    raise UnsupportedSchema(f"{envelope.get('name')}: not a cdcd envelope (no 'before' field)")


def table_schema(envelope: dict[str, Any]) -> TableSchema:
    columns = tuple(Column(f["name"], spark_type(f["type"])) for f in value_record(envelope)["fields"])
    clash = {c.name for c in columns} & set(META_COLUMNS)
    if clash:
        raise UnsupportedSchema(f"column {sorted(clash)[0]!r} is reserved for the mirror's own bookkeeping")
    return TableSchema(columns)


def key_columns(key_schema: dict[str, Any]) -> tuple[str, ...]:
    """The replica identity columns named by a Key schema."""
    return tuple(f["name"] for f in key_schema["fields"])


def aligned_struct(source: str, writer: TableSchema, target: TableSchema) -> str:
    """SQL for the record ``source`` (of the writer's Value type) as a struct of the target's columns.

    A column the writer lacks (added later) is null; one the target lacks (dropped) is left out; a kept column
    is cast to the target's type (a no-op unless the type changed).
    """
    have = set(writer.names)
    fields = []
    for col in target.columns:
        value = f"{source}.{quote(col.name)}" if col.name in have else "NULL"
        fields.append(f"{literal(col.name)}, CAST({value} AS {col.ddl})")
    return f"CASE WHEN {source} IS NULL THEN NULL ELSE named_struct({', '.join(fields)}) END"


def union(schemas: Iterable[TableSchema]) -> TableSchema:
    """Every column of ``schemas`` in first-seen order: what one batch's events are decoded to before the mirror
    takes its columns from it. One name with two types is an error (the mirror cannot follow a type change)."""
    columns: dict[str, Column] = {}
    for schema in schemas:
        for col in schema.columns:
            seen = columns.setdefault(col.name, col)
            if seen != col:
                raise UnsupportedSchema(f"column {col.name!r} changed type from {seen.ddl} to {col.ddl}")
    return TableSchema(tuple(columns.values()))
