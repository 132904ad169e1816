"""From the Avro envelope schemas of cdcd (both its envelopes) and of Debezium's PostgreSQL connector to the
mirror's Spark columns, and aligning old writer schemas to the newest.

A table's Value record (the ``before`` field's record) has one field per column. The mirror column types (Spark
SQL DDL), from Avro's own types and logical types:

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
array of E                            array<E> (Debezium's arrays)
record                                struct of its fields (Debezium's geometry types)
====================================  ==============================================================

and from Debezium's semantic types (the ``connect.name`` of a field's type), converted by SQL after decoding
(:data:`SEMANTIC`): ZonedTimestamp (ISO-8601 text in UTC) as timestamp; MicroTimestamp, Timestamp and
NanoTimestamp as timestamp_ntz; Date as date; MicroTime, Time, NanoTime as bigint microseconds since midnight;
MicroDuration as bigint microseconds; VariableScaleDecimal (a record of scale and unscaled bytes) as string, the
exact number; Kafka Connect's Decimal is Avro's decimal already. Every other semantic type (Uuid, Enum, Json, Xml,
ZonedTime, Bits...) keeps its Avro type.

Every function here is pure: it turns schemas into SQL expression text the Spark side evaluates.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

# Columns the job adds to every mirror table: the stream position of the event that last wrote the row.
COMMIT_LSN: Final = "_cdc_commit_lsn"
LSN: Final = "_cdc_lsn"
META_COLUMNS: Final = (COMMIT_LSN, LSN)

VALUE: Final = "{v}"  # in a conversion's SQL: the decoded value
UNAVAILABLE: Final = "__debezium_unavailable_value"  # Debezium's default unavailable.value.placeholder
NATIVE, DEBEZIUM = "native", "debezium"  # envelope layouts

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
    ("long", "timestamp-millis"): "timestamp",
    ("long", "local-timestamp-micros"): "timestamp_ntz",
    ("long", "local-timestamp-millis"): "timestamp_ntz",
    ("long", "time-micros"): "bigint",
    ("string", "uuid"): "string",
}
_EPOCH_NTZ: Final = "TIMESTAMP_NTZ'1970-01-01 00:00:00'"


def _floor_div(divisor: int) -> str:
    return f"(({VALUE} - pmod({VALUE}, {divisor})) div {divisor})"


# connect.name -> (Spark type, SQL of the value from the decoded Avro value)
SEMANTIC: Final[dict[str, tuple[str, str]]] = {
    "io.debezium.time.ZonedTimestamp": (
        "timestamp",
        f"CASE {VALUE} WHEN 'infinity' THEN timestamp_micros(9223372036854775807) "
        f"WHEN '-infinity' THEN timestamp_micros(-9223372036854775808) ELSE CAST({VALUE} AS timestamp) END",
    ),
    "io.debezium.time.MicroTimestamp": ("timestamp_ntz", f"timestampadd(MICROSECOND, {VALUE}, {_EPOCH_NTZ})"),
    "io.debezium.time.Timestamp": ("timestamp_ntz", f"timestampadd(MILLISECOND, {VALUE}, {_EPOCH_NTZ})"),
    "io.debezium.time.NanoTimestamp": (
        "timestamp_ntz",
        f"timestampadd(MICROSECOND, {_floor_div(1000)}, {_EPOCH_NTZ})",
    ),
    "io.debezium.time.Date": ("date", f"date_from_unix_date({VALUE})"),
    "io.debezium.time.MicroTime": ("bigint", VALUE),
    "io.debezium.time.Time": ("bigint", f"CAST({VALUE} AS bigint) * 1000"),
    "io.debezium.time.NanoTime": ("bigint", _floor_div(1000)),
    "io.debezium.time.MicroDuration": ("bigint", VALUE),
}
VARIABLE_SCALE_DECIMAL: Final = "io.debezium.data.VariableScaleDecimal"


class UnsupportedSchema(ValueError):
    """An Avro type the mirror has no column type for, or an envelope it cannot read."""


def quote(name: str) -> str:
    """A Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def literal(text: str) -> str:
    """A Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True, slots=True)
class Mapped:
    """One Avro type's mirror type (``ddl``), the type ``from_avro`` decodes it to (``raw``) and the SQL that turns
    the one into the other (``convert``, :data:`VALUE` standing for the decoded value)."""

    ddl: str
    raw: str
    convert: str = VALUE

    def apply(self, expr: str) -> str:
        return self.convert.replace(VALUE, expr)


def _lambda(mapped: Mapped, depth: int) -> str:
    name = f"x{depth}"
    return f"{name} -> {mapped.apply(name)}"


def mapping(avro: Any, depth: int = 0) -> Mapped:
    """The :class:`Mapped` of one non-null Avro type (or of the branches of a union without null)."""
    if isinstance(avro, list):
        return _union(avro, depth)
    if isinstance(avro, str):
        if avro in _PRIMITIVES:
            return Mapped(_PRIMITIVES[avro], _PRIMITIVES[avro])
        raise UnsupportedSchema(f"Avro type {avro!r}")
    base, logical, semantic = avro.get("type"), avro.get("logicalType"), avro.get("connect.name")
    if base == "array":
        items = mapping(avro["items"], depth + 1)
        convert = VALUE if items.convert == VALUE else f"transform({VALUE}, {_lambda(items, depth)})"
        return Mapped(f"array<{items.ddl}>", f"array<{items.raw}>", convert)
    if base == "record":
        return _record(avro, depth)
    if logical == "decimal" and base in ("bytes", "fixed"):
        precision, scale = int(avro["precision"]), int(avro.get("scale", 0))
        if precision > 38:
            raise UnsupportedSchema(f"decimal({precision},{scale}): Spark decimals hold at most 38 digits")
        return Mapped(f"decimal({precision},{scale})", f"decimal({precision},{scale})")
    if (base, logical) in _LOGICAL:
        return Mapped(_LOGICAL[base, logical], _LOGICAL[base, logical])
    raw = mapping(base, depth)
    if semantic in SEMANTIC:
        ddl, convert = SEMANTIC[semantic]
        return Mapped(ddl, raw.raw, convert)
    return raw


def _union(branches: list[Any], depth: int) -> Mapped:
    present = [b for b in branches if b != "null"]
    if len(present) == 1:
        return mapping(present[0], depth)
    if len(present) == 2 and isinstance(present[0], dict) and present[0].get("type") == "array":
        # cdcd's arrays: from_avro decodes the union to struct<member0, member1>; a cast renames the fields
        array, text = mapping(present[0], depth), mapping(present[1], depth)
        ddl = f"struct<elements: {array.ddl}, text: {text.ddl}>"
        raw = f"struct<member0: {array.raw}, member1: {text.raw}>"
        if array.convert == VALUE:
            return Mapped(ddl, raw)
        elements = array.apply(f"{VALUE}.member0")
        return Mapped(ddl, raw, f"named_struct('elements', {elements}, 'text', {VALUE}.member1)")
    raise UnsupportedSchema(f"union {branches!r}")


def _record(avro: dict[str, Any], depth: int) -> Mapped:
    fields = [(f["name"], mapping(f["type"], depth + 1)) for f in avro["fields"]]
    raw = "struct<" + ", ".join(f"{quote(n)}: {m.raw}" for n, m in fields) + ">"
    if avro.get("connect.name") == VARIABLE_SCALE_DECIMAL:
        return Mapped("string", raw, variable_scale_decimal_sql(VALUE))
    ddl = "struct<" + ", ".join(f"{quote(n)}: {m.ddl}" for n, m in fields) + ">"
    if all(m.convert == VALUE for _, m in fields):
        return Mapped(ddl, raw)
    named = ", ".join(f"{literal(n)}, {m.apply(f'{VALUE}.{quote(n)}')}" for n, m in fields)
    return Mapped(ddl, raw, f"CASE WHEN {VALUE} IS NULL THEN NULL ELSE named_struct({named}) END")


def unscaled_sql(data: str) -> str:
    """SQL: the integer whose big-endian two's complement bytes are ``data`` (Java's BigInteger.toByteArray), as
    decimal(38,0): the first byte signed, the others unsigned (an error beyond 38 digits)."""
    byte = f"CAST(conv(hex(substring({data}, i, 1)), 16, 10) AS int)"
    signed = f"CASE WHEN i = 1 AND {byte} >= 128 THEN {byte} - 256 ELSE {byte} END"
    step = f"CAST(acc * 256 + {signed} AS decimal(38,0))"
    return f"aggregate(sequence(1, length({data})), CAST(0 AS decimal(38,0)), (acc, i) -> {step})"


def variable_scale_decimal_sql(record: str) -> str:
    """SQL: Debezium's VariableScaleDecimal ``{scale, value}`` as the exact decimal text (``-0.000001``)."""
    digits = "CAST(abs(r.n) AS string)"  # lpad cuts a longer text: padded to at least scale + 1 digits only
    padded = f"lpad({digits}, greatest(length({digits}), r.s + 1), '0')"
    fraction = (
        f"concat(CASE WHEN r.n < 0 THEN '-' ELSE '' END, element_at(transform(array({padded}), "
        "p -> concat(substr(p, 1, length(p) - r.s), '.', substr(p, length(p) - r.s + 1))), 1))"
    )
    whole = "concat(CAST(r.n AS string), CASE WHEN r.n = 0 THEN '' ELSE repeat('0', -r.s) END)"
    bound = f"named_struct('n', {unscaled_sql(record + '.value')}, 's', {record}.scale)"
    text = f"CASE WHEN r.s <= 0 THEN {whole} ELSE {fraction} END"
    return f"CASE WHEN {record} IS NULL THEN NULL ELSE element_at(transform(array({bound}), r -> {text}), 1) END"


def spark_type(avro: Any) -> str:
    """The Spark DDL type of one non-null Avro type (or of the branches of a union without null)."""
    return mapping(avro).ddl


# -- Debezium's unchanged-TOAST placeholder ------------------------------------------------------------------


def _java_uuid3(data: bytes) -> str:
    """Java's UUID.nameUUIDFromBytes: an MD5 name-based (version 3) UUID of ``data``."""
    digest = bytearray(hashlib.md5(data).digest())
    digest[6] = (digest[6] & 0x0F) | 0x30
    digest[8] = (digest[8] & 0x3F) | 0x80
    return str(uuid.UUID(bytes=bytes(digest)))


def placeholder_sql(raw: str, text: str = UNAVAILABLE) -> str | None:
    """SQL true when a decoded value of Spark type ``raw`` is the form Debezium's PostgreSQL connector gives
    placeholder ``text`` in a column of that type (an unchanged TOAST value: the text in string columns, its
    bytes in bytea, a one-element array in text and bytea arrays, a UUID of it in uuid arrays, its bytes as
    numbers in int and bigint arrays, a JSON object in hstore); None for a type it is never sent in."""
    data = text.encode()
    hex_bytes = f"X'{data.hex()}'"
    numbers = ", ".join(str(b - 256 if b > 127 else b) for b in data)  # Java bytes are signed
    forms = {
        "string": [literal(text), literal('{"' + text + '":"' + text + '"}')],
        "binary": [hex_bytes],
        "array<string>": [f"array({literal(text)})", f"array({literal(_java_uuid3(data))})"],
        "array<binary>": [f"array({hex_bytes})"],
        "array<int>": [f"array({numbers})"],
        "array<bigint>": [f"CAST(array({numbers}) AS array<bigint>)"],
    }.get(raw)
    if forms is None:
        return None
    return "(" + " OR ".join(f"{VALUE} <=> {form}" for form in forms) + ")"


# -- tables and envelopes ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Column:
    name: str  # the Avro field name (cdcd keeps PostgreSQL's column name when it is a valid Avro name)
    ddl: str
    convert: str = VALUE  # SQL of the mirror's value from the decoded one (VALUE)
    raw: str = ""  # the decoded value's Spark type when it is not ``ddl``

    def value(self, expr: str) -> str:
        return self.convert.replace(VALUE, expr)

    @property
    def decoded(self) -> str:
        return self.raw or self.ddl


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


@dataclass(frozen=True, slots=True)
class Envelope:
    """What the job reads from one writer schema of a table's topic: its columns and its layout. ``native`` is
    cdcd's own envelope; ``debezium`` is Debezium's, written by cdcd (``kafka.envelope: debezium``) or by
    Debezium itself. Events order by ``source.commit_lsn`` then ``source.lsn`` when the source block has
    ``commit_lsn`` (cdcd, both layouts), by ``source.lsn`` alone otherwise (Debezium: one row's changes are in
    commit order in the WAL, as PostgreSQL's row locks make them). Unchanged TOAST columns are named in
    ``unchanged_toast`` when the envelope has it (cdcd), else recognized by Debezium's placeholder."""

    table: TableSchema
    layout: str
    commit_lsn: bool
    unchanged_toast: bool


def _column(field: dict[str, Any]) -> Column:
    m = mapping(field["type"])
    return Column(field["name"], m.ddl, m.convert, "" if m.raw == m.ddl else m.raw)


def value_record(envelope: dict[str, Any]) -> dict[str, Any]:
    """The Value record inside an Envelope schema (the ``before`` field's non-null branch)."""
    for field in envelope.get("fields", []):
        if field["name"] == "before":
            return next(b for b in field["type"] if isinstance(b, dict))
    raise UnsupportedSchema(f"{envelope.get('name')}: not a change event envelope (no 'before' field)")


def envelope(schema: dict[str, Any], expected: str = "auto") -> Envelope:
    """The :class:`Envelope` of an Envelope schema; ``expected`` (``auto``, ``native`` or ``debezium``) the
    layout the job was told to read: another is an error."""
    columns = tuple(_column(f) for f in value_record(schema)["fields"])
    clash = {c.name for c in columns} & set(META_COLUMNS)
    if clash:
        raise UnsupportedSchema(f"column {sorted(clash)[0]!r} is reserved for the mirror's own bookkeeping")
    fields = {f["name"]: f for f in schema["fields"]}
    layout = NATIVE if "unchanged_toast" in fields and "ts_ns" not in fields else DEBEZIUM
    if expected not in ("auto", layout):
        raise UnsupportedSchema(f"{schema.get('name')}: a {layout} envelope, but the job reads {expected} ones")
    source = fields.get("source", {}).get("type", {})
    source_fields = {f["name"] for f in source.get("fields", [])} if isinstance(source, dict) else set()
    return Envelope(TableSchema(columns), layout, "commit_lsn" in source_fields, "unchanged_toast" in fields)


def table_schema(schema: dict[str, Any]) -> TableSchema:
    return envelope(schema).table


def key_columns(key_schema: dict[str, Any]) -> tuple[str, ...]:
    """The replica identity columns named by a Key schema."""
    return tuple(f["name"] for f in key_schema["fields"])


def key_json_ddl(key_schema: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    """How to read a key from the JSON text of Debezium's key-change headers (``{"id":10}``: Kafka Connect's
    text of the key struct): the Spark schema to parse it with, and per key column its name and the SQL of
    its mirror value from the parsed one. Decimals are parsed as text (Connect writes numbers)."""
    fields, values = [], []
    for field in key_schema["fields"]:
        m = mapping(field["type"])
        if m.raw.startswith("decimal"):
            fields.append(f"{quote(field['name'])}: string")
            values.append((field["name"], f"try_cast({VALUE} AS {m.ddl})"))
        else:
            fields.append(f"{quote(field['name'])}: {m.raw}")
            values.append((field["name"], m.convert))
    return "struct<" + ", ".join(fields) + ">", values


def aligned_struct(source: str, writer: TableSchema, target: TableSchema, unchanged: str | None = None) -> str:
    """SQL for the record ``source`` (of the writer's Value type) as a struct of the target's columns.

    A column the writer lacks (added later) is null; one the target lacks (dropped) is left out; a kept column
    is converted from its decoded type (:class:`Column`) and cast to the target's type (a no-op unless the type
    changed). With ``unchanged`` (a placeholder text), a value that is Debezium's placeholder for an unchanged
    TOAST value is null.
    """
    have = {c.name: c for c in writer.columns}
    fields = []
    for col in target.columns:
        value = "NULL"
        if col.name in have:
            decoded = f"{source}.{quote(col.name)}"
            value = have[col.name].value(decoded)
            check = None if unchanged is None else placeholder_sql(have[col.name].decoded, unchanged)
            if check is not None:
                value = f"CASE WHEN {check.replace(VALUE, decoded)} THEN NULL ELSE {value} END"
        fields.append(f"{literal(col.name)}, CAST({value} AS {col.ddl})")
    return f"CASE WHEN {source} IS NULL THEN NULL ELSE named_struct({', '.join(fields)}) END"


def unchanged_sql(source: str, writer: TableSchema, text: str = UNAVAILABLE) -> str:
    """SQL: the names of the columns of record ``source`` that hold Debezium's placeholder ``text`` for an
    unchanged TOAST value (an empty array when no column's type can hold it)."""
    named = []
    for col in writer.columns:
        check = placeholder_sql(col.decoded, text)
        if check is not None:
            named.append(
                f"CASE WHEN {check.replace(VALUE, f'{source}.{quote(col.name)}')} THEN {literal(col.name)} END"
            )
    empty = "CAST(array() AS array<string>)"
    if not named:
        return empty
    return f"CASE WHEN {source} IS NULL THEN {empty} ELSE array_compact(array({', '.join(named)})) END"


def union(schemas: Iterable[TableSchema]) -> TableSchema:
    """Every column of ``schemas`` in first-seen order: what one batch's events are decoded to before the mirror
    takes its columns from it. One name with two types is an error (the mirror cannot follow a type change)."""
    columns: dict[str, Column] = {}
    for schema in schemas:
        for col in schema.columns:
            seen = columns.setdefault(col.name, col)
            if seen.ddl != col.ddl:
                raise UnsupportedSchema(f"column {col.name!r} changed type from {seen.ddl} to {col.ddl}")
    return TableSchema(tuple(columns.values()))
