"""Avro Key / Value / Envelope schemas of a table, built from its pgoutput Relation message.

Names: the Value, Key and Envelope records are ``<prefix>.<schema>.<table>.Value`` (``.Key``,
``.Envelope``), as Debezium names them; ``Relation.schema == ""`` (pg_catalog) is written ``pg_catalog``.
Every name part and every field name is sanitized to Avro's ``[A-Za-z_][A-Za-z0-9_]*``: each invalid
character becomes ``_`` and a leading digit gets a ``_`` prefix (the empty name becomes ``_``). A field whose
name was changed keeps the column's real name in the property ``"pg.column"``. Two columns of one table
whose names sanitize to the same field name are a SchemaError (no silent renaming that would shift when
columns are added or dropped).

Value: every column sent, each ``["null", T]`` with default null (pgoutput does not say which columns are NOT
NULL, and a key column can be null in ``before`` when the old tuple only carries the key). Key: the columns
flagged ``is_key`` (the replica identity; under FULL the primary key), not nullable; None when there are none.
The table's column rules (``cdcd.columns``) leave columns out (no field) and mask others (a string field, with
``"cdcd.mask"`` naming the rule); the field's ``index`` stays its place in the row tuple. A STORED generated
column (sent by PostgreSQL 18 under ``publish_generated_columns = stored``) is a field like any other, marked
``"pg.generated": "stored"``; a virtual generated column is never sent, so it has no field.

Envelope fields, in order: before, after (["null", Value]), source, op, ts_ms, ts_us (["null", "long"],
Debezium's processing time), transaction (["null", event.block]), unchanged_toast (array of the Value field
names of columns whose unchanged TOASTed value PostgreSQL did not send: they are null in ``after`` and the
consumer must keep the old value; Debezium consumers ignore this extra field).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from cdcd.avro.debezium import debezium_mapping
from cdcd.avro.types import AvroSchema, ConversionError, Datum, TypeMapping, type_mapping
from cdcd.pgoutput.messages import Relation, Type

if TYPE_CHECKING:
    from cdcd.columns import Mask, TableColumns

_INVALID = re.compile(r"[^A-Za-z0-9_]")

SOURCE_NAME = "io.debezium.connector.postgresql.Source"
BLOCK_NAME = "event.block"

# (name, Avro type, default or absent) in the order the encoder writes them
SOURCE_FIELDS: tuple[dict[str, Any], ...] = (
    {"name": "version", "type": "string"},
    {"name": "connector", "type": "string"},
    {"name": "name", "type": "string"},
    {"name": "ts_ms", "type": "long"},
    {"name": "ts_us", "type": "long"},
    {
        "name": "snapshot",
        "type": {
            "type": "string",
            "connect.name": "io.debezium.data.Enum",
            "connect.parameters": {"allowed": "true,first,first_in_data_collection,last,false,incremental"},
        },
        "default": "false",
    },
    {"name": "db", "type": "string"},
    {"name": "sequence", "type": ["null", "string"], "default": None},
    {"name": "schema", "type": "string"},
    {"name": "table", "type": "string"},
    {"name": "txId", "type": ["null", "long"], "default": None},
    {"name": "lsn", "type": ["null", "long"], "default": None},
    {"name": "commit_lsn", "type": ["null", "long"], "default": None},
    {"name": "origin", "type": ["null", "string"], "default": None},
)


# Debezium 3.x's Source record, in its order, with cdcd's commit_lsn added last (kafka.envelope: debezium)
_NULL_LONG: Final = ["null", "long"]
DEBEZIUM_SOURCE_FIELDS: tuple[dict[str, Any], ...] = (
    {"name": "version", "type": "string"},
    {"name": "connector", "type": "string"},
    {"name": "name", "type": "string"},
    {"name": "ts_ms", "type": "long"},
    {
        "name": "snapshot",
        "type": [
            {
                "type": "string",
                "connect.version": 1,
                "connect.parameters": {
                    "allowed": "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"
                },
                "connect.default": "false",
                "connect.name": "io.debezium.data.Enum",
            },
            "null",
        ],
        "default": "false",
    },
    {"name": "db", "type": "string"},
    {"name": "sequence", "type": ["null", "string"], "default": None},
    {"name": "ts_us", "type": _NULL_LONG, "default": None},
    {"name": "ts_ns", "type": _NULL_LONG, "default": None},
    {"name": "schema", "type": "string"},
    {"name": "table", "type": "string"},
    {"name": "txId", "type": _NULL_LONG, "default": None},
    {"name": "lsn", "type": _NULL_LONG, "default": None},
    {"name": "xmin", "type": _NULL_LONG, "default": None},
    {"name": "origin", "type": ["null", "string"], "default": None},
    {"name": "origin_lsn", "type": _NULL_LONG, "default": None},
    {"name": "commit_lsn", "type": _NULL_LONG, "default": None},
)


class SchemaError(ValueError):
    """The table cannot be given an Avro schema (e.g. two columns sanitize to the same field name)."""


def sanitize(name: str) -> str:
    """An Avro name for ``name``: invalid characters -> ``_``, ``_`` prefixed before a leading digit."""
    out = _INVALID.sub("_", name)
    if not out or out[0].isdigit():
        out = "_" + out
    return out


def namespace(prefix: str, relation: Relation) -> str:
    parts = [*prefix.split("."), relation.schema or "pg_catalog", relation.name]
    return ".".join(sanitize(p) for p in parts)


@dataclass(frozen=True, slots=True)
class ColumnSchema:
    """One column as the encoder needs it: its field name, mapping and position in the tuple."""

    index: int
    column: str  # the PostgreSQL column name
    field: str  # the Avro field name
    is_key: bool
    mapping: TypeMapping
    required: bool = False  # not nullable in the Value record (kafka.envelope: debezium, NOT NULL columns)
    mask: Mask | None = None  # its mask rule (cdcd.columns): ``mapping`` is then the rule's, a string
    generated: bool = False  # a STORED generated column (published on PostgreSQL 18 with publish_generated_columns)


@dataclass(frozen=True, slots=True)
class RelationSchemas:
    """The schemas of one Relation. ``key`` is None when the table has no key columns."""

    relation: Relation
    prefix: str
    namespace: str
    columns: tuple[ColumnSchema, ...]
    key: dict[str, Any] | None
    value: dict[str, Any]
    envelope: dict[str, Any]
    debezium: bool = False  # Debezium's type map and envelope layout (kafka.envelope: debezium)

    @property
    def table(self) -> str:
        return f"{self.relation.schema or 'pg_catalog'}.{self.relation.name}"

    @property
    def width(self) -> int:
        """Values in a row tuple: every column of the relation, also those left out of the records."""
        return len(self.relation.columns)

    @property
    def key_columns(self) -> tuple[ColumnSchema, ...]:
        return tuple(c for c in self.columns if c.is_key)


def _field(col: ColumnSchema, nullable: bool) -> dict[str, Any]:
    branches: list[AvroSchema] = list(col.mapping.branches)
    single: AvroSchema = branches[0] if len(branches) == 1 else branches
    typ: AvroSchema = ["null", *branches] if nullable else single
    f: dict[str, Any] = {"name": col.field, "type": typ}
    if nullable:
        f["default"] = None
    if col.field != col.column:
        f["pg.column"] = col.column
    if col.mapping.doc:
        f["doc"] = col.mapping.doc
    if col.mask is not None:
        f["cdcd.mask"] = col.mask.kind
    if col.generated:
        f["pg.generated"] = "stored"
    return f


def _no_value(value: bytes) -> Datum:
    return None


def _masked_binary(value: bytes) -> Datum:
    raise ConversionError("a masked column reads the value's text form, and this one is in binary form")


def masked_mapping(mask: Mask, pg_type: str) -> TypeMapping:
    """A masked column's mapping: its text form masked (``Mask.apply``), sent as a string."""
    binary = _no_value if mask.kind == "null" else _masked_binary
    return TypeMapping(pg_type, ("string",), "string", mask.apply, binary, compiled=False)


def source_schema(*, debezium: bool = False) -> dict[str, Any]:
    fields = DEBEZIUM_SOURCE_FIELDS if debezium else SOURCE_FIELDS
    schema: dict[str, Any] = {"type": "record", "name": SOURCE_NAME, "fields": [dict(f) for f in fields]}
    if debezium:
        schema["connect.version"] = 1
        schema["connect.name"] = SOURCE_NAME
    return schema


def block_schema() -> dict[str, Any]:
    return {
        "type": "record",
        "name": BLOCK_NAME,
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "total_order", "type": "long"},
            {"name": "data_collection_order", "type": "long"},
        ],
    }


def build_schemas(
    relation: Relation,
    prefix: str,
    types: dict[int, Type] | None = None,
    *,
    debezium: bool = False,
    rules: TableColumns | None = None,
) -> RelationSchemas:
    """Key, Value and Envelope schemas for ``relation``.

    ``prefix`` is the topic prefix (Debezium's ``topic.prefix``); ``types`` the pgoutput Type messages seen so
    far by OID: a column of such a user type (enum, domain, ...) is a string whose field documents the type.
    ``debezium``: columns in Debezium's type map (``cdcd.avro.debezium``, ``kafka.envelope: debezium``).
    ``rules``: the table's column rules (``cdcd.columns``, checked by the caller): a column left out has no
    field, a masked one the rule's type.
    """
    types = types or {}
    ns = namespace(prefix, relation)
    columns: list[ColumnSchema] = []
    seen: dict[str, str] = {}
    for i, col in enumerate(relation.columns):
        if rules is not None and not rules.sent(col.name):
            continue
        fname = sanitize(col.name)
        if fname in seen:
            raise SchemaError(
                f"table {relation.schema}.{relation.name}: columns {seen[fname]!r} and {col.name!r} both become "
                f"the Avro field name {fname!r}; rename one of them"
            )
        seen[fname] = col.name
        t = types.get(col.type_oid)
        user = f"{t.schema or 'pg_catalog'}.{t.name}" if t is not None else None
        if debezium:
            m = debezium_mapping(col.type_oid, col.type_modifier, user, None if t is None else t.labels)
        else:
            m = type_mapping(col.type_oid, col.type_modifier, user)
        required = debezium and (col.is_key or col.not_null)  # Debezium: NOT NULL columns are not nullable
        mask = None if rules is None else rules.masks.get(col.name)
        if mask is not None:
            m = masked_mapping(mask, m.pg_type)
            required = required and mask.kind != "null"
        columns.append(ColumnSchema(i, col.name, fname, col.is_key, m, required, mask, col.generated))
    value = {
        "type": "record",
        "name": "Value",
        "namespace": ns,
        "connect.name": f"{ns}.Value",
        "fields": [_field(c, not c.required) for c in columns],
    }
    keys = [c for c in columns if c.is_key]
    key = (
        {
            "type": "record",
            "name": "Key",
            "namespace": ns,
            "connect.name": f"{ns}.Key",
            "fields": [_field(c, False) for c in keys],
        }
        if keys
        else None
    )
    envelope = {
        "type": "record",
        "name": "Envelope",
        "namespace": ns,
        "connect.name": f"{ns}.Envelope",
        "fields": _debezium_envelope_fields(value) if debezium else _envelope_fields(value, ns),
    }
    return RelationSchemas(relation, prefix, ns, tuple(columns), key, value, envelope, debezium)


_UNCHANGED_TOAST: Final = {"name": "unchanged_toast", "type": {"type": "array", "items": "string"}, "default": []}


def _envelope_fields(value: dict[str, Any], ns: str) -> list[dict[str, Any]]:
    return [
        {"name": "before", "type": ["null", value], "default": None},
        {"name": "after", "type": ["null", f"{ns}.Value"], "default": None},
        {"name": "source", "type": source_schema()},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
        {"name": "ts_us", "type": ["null", "long"], "default": None},
        {"name": "transaction", "type": ["null", block_schema()], "default": None},
        dict(_UNCHANGED_TOAST),
    ]


def _debezium_envelope_fields(value: dict[str, Any]) -> list[dict[str, Any]]:
    """Debezium's order (transaction before op; ts_ns), unchanged_toast added last."""
    return [
        {"name": "before", "type": ["null", value], "default": None},
        {"name": "after", "type": ["null", value["namespace"] + ".Value"], "default": None},
        {"name": "source", "type": source_schema(debezium=True)},
        {"name": "transaction", "type": ["null", block_schema()], "default": None},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": _NULL_LONG, "default": None},
        {"name": "ts_us", "type": _NULL_LONG, "default": None},
        {"name": "ts_ns", "type": _NULL_LONG, "default": None},
        dict(_UNCHANGED_TOAST),
    ]


def column_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """How the columns of two versions of a table's Envelope (or Key) schema differ, for error messages."""

    def columns(schema: dict[str, Any]) -> dict[str, Any]:
        record = schema
        for f in schema.get("fields", []):
            if f["name"] == "before":  # an Envelope: the columns are the Value record's
                record = f["type"][1]
        return {f.get("pg.column", f["name"]): f["type"] for f in record.get("fields", [])}

    before, after = columns(old), columns(new)
    changes = [f"column {c} dropped" for c in before if c not in after]
    changes += [f"column {c} added" for c in after if c not in before]
    changes += [
        f"column {c} changed type from {_type_name(before[c])} to {_type_name(after[c])}"
        for c in before
        if c in after and before[c] != after[c]
    ]
    return changes


def _type_name(avro: Any) -> str:
    if isinstance(avro, list):
        return " or ".join(_type_name(t) for t in avro if t != "null")
    if isinstance(avro, dict):
        return str(avro.get("logicalType") or avro.get("connect.name") or avro.get("type"))
    return str(avro)
