"""Compiled per-table Avro encoders: pgoutput tuple values in, Avro binary out, no intermediate dicts.

For each Relation the encoder generates (``exec``) one straight-line Python function per row shape (the Value
record, the Key record) that reads the tuple's values by position, converts each from PostgreSQL's text form
(``str``) or binary form (``bytes``) and appends the Avro bytes of the field to a list, which is joined once
per event. Ints go through a zigzag/varint lookup table, strings are encoded once, constants (union branch
indexes, the op, the connector/name/schema/table strings of ``source``) are prebuilt bytes.

The output is byte for byte what ``fastavro.schemaless_writer`` writes for the same schema given the datums of
``cdcd.avro.types`` (the tests check this on random relations, rows and envelopes); ``value_record``,
and ``envelope_record`` build those datum dicts (a slow reference path, also handy for JSON).

Unchanged TOAST values (``...`` in a row) are written as null and named in the envelope's
``unchanged_toast``; they are only valid in ``after`` (PostgreSQL flattens old tuples): one in ``before``, or
a NULL or unchanged value in a Key column, is a ConversionError.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from cdcd.avro.schema import ColumnSchema, RelationSchemas
from cdcd.avro.types import ConversionError, Datum, TypeMapping
from cdcd.pgoutput.messages import Row, Value
from cdcd.pgtypes import CODECS, identity

if TYPE_CHECKING:
    from cdcd.rowstage import RowStage
    from cdcd.rowstage.stage import CompiledRows, Encoded, Envelope, RowWriter

CONNECTOR: Final = "postgresql"
UNAVAILABLE: Final = "__debezium_unavailable_value"  # Debezium's unavailable.value.placeholder

# --------------------------------------------------------------------------------------------- primitives

_SMALL: Final = 1 << 14
_T14: Final[list[bytes]] = []  # varint of x (x < 2**14)
for _x in range(_SMALL):
    _T14.append(bytes([_x]) if _x < 128 else bytes([(_x & 0x7F) | 0x80, _x >> 7]))
_T14C: Final[list[bytes]] = [bytes([(x & 0x7F) | 0x80, (x >> 7) | 0x80]) for x in range(_SMALL)]  # 14 bits, more
_U14: Final[list[bytes]] = [b"\x02" + b for b in _T14]  # union branch 1, then varint of x
_M14: Final = _SMALL - 1
_F32: Final = struct.Struct("<f").pack
_F64: Final = struct.Struct("<d").pack
_LONG_LIMIT: Final = 1 << 64


def varint(z: int) -> bytes:
    """Avro varint of a zigzag-encoded value (0 <= z < 2**64)."""
    if z < _SMALL:
        if z < 0:
            raise OverflowError("value out of the Avro long range")
        return _T14[z]
    if z < 1 << 28:
        return _T14C[z & _M14] + _T14[z >> 14]
    if z < 1 << 42:
        return _T14C[z & _M14] + _T14C[(z >> 14) & _M14] + _T14[z >> 28]
    if z < 1 << 56:
        return _T14C[z & _M14] + _T14C[(z >> 14) & _M14] + _T14C[(z >> 28) & _M14] + _T14[z >> 42]
    if z < _LONG_LIMIT:
        return (
            _T14C[z & _M14]
            + _T14C[(z >> 14) & _M14]
            + _T14C[(z >> 28) & _M14]
            + _T14C[(z >> 42) & _M14]
            + _T14[z >> 56]
        )
    raise OverflowError("value out of the Avro long range")


def write_long(n: int) -> bytes:
    """Avro int/long: zigzag varint."""
    return varint((n << 1) ^ (n >> 63))


def write_string(s: str) -> bytes:
    b = s.encode()
    return varint(len(b) << 1) + b


def write_bytes(b: bytes) -> bytes:
    return varint(len(b) << 1) + b


def _write_boolean(d: bool) -> bytes:
    return b"\x01" if d else b"\x00"


def _write_float(d: float) -> bytes:
    return _F32(d)


def _write_double(d: float) -> bytes:
    return _F64(d)


_KIND_WRITERS: Final[dict[str, Callable[[Any], bytes]]] = {
    "boolean": _write_boolean,
    "int": write_long,
    "long": write_long,
    "float": _write_float,
    "double": _write_double,
    "bytes": write_bytes,
    "string": write_string,
    "record": bytes,  # a record-valued type's datum is its encoded bytes (Debezium's VariableScaleDecimal)
}


def _array_writer(mapping: TypeMapping, nullable: bool) -> Callable[[Datum], bytes]:
    """Writer of an array field's value (list -> array branch, str -> string branch), with its branch index."""
    assert mapping.element is not None
    write_item = _KIND_WRITERS[mapping.element.kind]
    array_branch = write_long(1 if nullable else 0)
    string_branch = write_long(2 if nullable else 1)
    empty = array_branch + b"\x00"

    def write(d: Datum) -> bytes:
        if d.__class__ is str:
            return string_branch + write_string(d)
        if not d:
            return empty
        parts = [array_branch, write_long(len(d))]
        for e in d:
            parts.append(b"\x00" if e is None else b"\x02" + write_item(e))
        parts.append(b"\x00")
        return b"".join(parts)

    return write


# --------------------------------------------------------------------------------------------- code generation

_INT_KINDS: Final = ("int", "long")


def _datum_expr(mapping: TypeMapping, fn: str) -> str:
    """Expression converting ``v`` (text form) to the datum; inlined for the common identity/int cases."""
    if mapping.from_text is int:
        return "int(v)"
    if mapping.from_text is identity:
        return "v"
    return f"{fn}(v)"


def _write_lines(kind: str, i: int, nullable: bool) -> list[str]:
    """Lines appending datum ``d`` of ``kind`` (with the union branch 1 prefix when nullable)."""
    u = "b'\\x02'" if nullable else "b''"
    t = "_U14" if nullable else "_T14"
    if kind == "boolean":
        one, zero = ("b'\\x02\\x01'", "b'\\x02\\x00'") if nullable else ("b'\\x01'", "b'\\x00'")
        return [f"a({one} if d else {zero})"]
    if kind in _INT_KINDS:
        return ["z = (d << 1) ^ (d >> 63)", f"a({t}[z] if 0 <= z < 16384 else {u} + varint(z))"]
    if kind == "float":
        return [f"a({u} + _F32(d))"]
    if kind == "double":
        return [f"a({u} + _F64(d))"]
    if kind == "string":
        return ["d = d.encode()", "z = len(d)", f"a({t}[z << 1] if z < 8192 else {u} + varint(z << 1))", "a(d)"]
    if kind == "bytes":
        return ["z = len(d)", f"a({t}[z << 1] if z < 8192 else {u} + varint(z << 1))", "a(d)"]
    if kind == "array":
        return [f"a(W{i}(d))"]
    if kind == "record":  # the encoded record, or None where the type has no value (NaN as a decimal)
        null = "raise ValueError('no value of the record type')" if not nullable else "a(b'\\x00')"
        return ["if d is None:", f"    {null}", "else:", f"    a({u} + d)"]
    raise AssertionError(kind)


def _compile_row(
    columns: Sequence[ColumnSchema], ncols: int, nullable: bool, name: str, defaults: Mapping[int, bytes] | None = None
) -> Callable[..., None]:
    """Generate ``name(row, a, t)``: append the Avro record of ``columns`` read from ``row`` via ``a``.

    Nullable (Value): NULL and unchanged TOAST write the null branch; unchanged ones also call ``t`` with the
    field's pre-encoded name. Not nullable (Key): either raises. ``defaults``: columns of a Value record that
    are not nullable (Debezium's NOT NULL columns) by index, with the encoded value written for a missing one.
    """
    defaults = defaults or {}
    env: dict[str, Any] = {
        "varint": varint,
        "_T14": _T14,
        "_U14": _U14,
        "_F32": _F32,
        "_F64": _F64,
        "ConversionError": ConversionError,
    }
    lines = [f"def {name}(row, a, t):", f"    if len(row) != {ncols}:", "        raise IndexError('row length')"]
    for col in columns:
        i = col.index
        m = col.mapping
        null = nullable and i not in defaults
        env[f"F{i}"] = write_string(col.field)
        if col.mask is not None and col.mask.kind == "null":  # never a value: null, whatever was sent
            lines += [f"    if row[{i}] is ...:", f"        t(F{i})", "    a(b'\\x00')"]
            continue
        env[f"P{i}"] = m.from_text
        env[f"B{i}"] = m.from_binary
        if m.kind == "array":
            env[f"W{i}"] = _array_writer(m, null)
        write = _write_lines(m.kind, i, null)
        lines.append(f"    v = row[{i}]")
        lines.append("    if v.__class__ is str:")
        lines.append(f"        d = {_datum_expr(m, f'P{i}')}")
        lines += [f"        {w}" for w in write]
        if null:
            lines += ["    elif v is None:", "        a(b'\\x00')", "    elif v is ...:", "        a(b'\\x00')"]
            lines.append(f"        t(F{i})")
        elif i in defaults:
            env[f"D{i}"] = defaults[i]
            lines += [
                "    elif v is None:",
                f"        a(D{i})",
                "    elif v is ...:",
                f"        a(D{i})",
                f"        t(F{i})",
            ]
        else:
            lines += ["    elif v is None or v is ...:", f"        raise ValueError('missing key value (column {i})')"]
        lines += ["    else:", f"        d = B{i}(v)"]
        lines += [f"        {w}" for w in write]
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<cdcd.avro {name}>", "exec"), env)
    fn: Callable[..., None] = env[name]
    return fn


# --------------------------------------------------------------------------------------------- compiled rows

# The compiled row writer's conversions (cdcd._native, native/src/convert.rs), by codec name; a column whose
# mapping has none is converted by its reference writer (``_field_writer``), called from the compiled code.
_NATIVE_CODES: Final[dict[str, int]] = {
    "bool": 1,
    "int2": 2,
    "int4": 3,
    "int8": 4,
    "oid": 5,
    "float4": 6,
    "float8": 7,
    **dict.fromkeys(("text", "varchar", "bpchar", "name", "char", "json", "xml"), 8),
    **dict.fromkeys(("timetz", "numeric"), 9),  # text forms kept; binary forms by the reference
    "jsonb": 10,
    "bytea": 11,
    "uuid": 12,
    "date": 13,
    "time": 14,
    "timestamp": 15,
    "timestamptz": 16,
}
_TEXT_ONLY, _DECIMAL, _ARRAY = 9, 17, 18
_CODECS_BY_NAME: Final = {c.name: c for c in CODECS.values()}


def native_kind(mapping: TypeMapping) -> tuple[int, int]:
    """The compiled conversion of a mapping (code, parameter); (0, 0): the reference writer's."""
    if mapping.native is not None:
        return mapping.native
    if not mapping.compiled:
        return 0, 0
    code = _NATIVE_CODES.get(mapping.pg_type)
    codec = _CODECS_BY_NAME.get(mapping.pg_type)
    if code is not None and codec is not None:
        same = mapping.from_text is codec.from_text and mapping.from_binary is codec.from_binary
        return (code, 0) if same else (0, 0)
    branch = mapping.branches[0]
    if mapping.kind == "array" and mapping.element is not None:
        code, param = native_kind(mapping.element)
        return (_ARRAY, code | param << 8) if code else (0, 0)
    if mapping.kind == "bytes" and isinstance(branch, dict) and branch.get("logicalType") == "decimal":
        return _DECIMAL, int(branch["scale"])
    if mapping.kind == "string" and mapping.from_text is identity:
        return _TEXT_ONLY, 0  # user-defined and unknown types: text form
    return 0, 0


def _field_writer(col: ColumnSchema, nullable: bool) -> Callable[[Value], bytes]:
    """The reference writer of one field's non-null value: what the generated Python code writes for it."""
    m = col.mapping
    text, binary = m.from_text, m.from_binary
    if col.mask is not None and col.mask.kind == "null":
        return lambda v: b"\x00"
    if m.kind == "array":
        write = _array_writer(m, nullable)
        return lambda v: write(text(v) if v.__class__ is str else binary(v))  # type: ignore[arg-type]
    write_kind = _KIND_WRITERS[m.kind]
    branch = b"\x02" if nullable else b""
    if m.kind == "record":
        return lambda v: _record_field(text(v) if v.__class__ is str else binary(v), nullable)  # type: ignore[arg-type]
    return lambda v: branch + write_kind(text(v) if v.__class__ is str else binary(v))  # type: ignore[arg-type]


def _record_field(d: bytes | None, nullable: bool) -> bytes:
    if d is None:
        if not nullable:
            raise ValueError("no value of the record type")
        return b"\x00"
    return b"\x02" + d if nullable else d


def _native_row(  # noqa: PLR0917
    rows: CompiledRows,
    columns: Sequence[ColumnSchema],
    ncols: int,
    nullable: bool,
    defaults: Mapping[int, bytes] | None = None,
    debezium: bool = False,
) -> RowWriter:
    """The compiled row record writer, called as the generated ``(row, append, toast)`` function is (with
    ``defaults`` as ``_compile_row``'s; ``debezium``: Debezium's placeholders for unchanged TOAST values)."""
    defaults = defaults or {}
    null = [nullable and c.index not in defaults for c in columns]
    fields = [
        (c.index, *native_kind(c.mapping), _field_writer(c, n), write_string(c.field))
        for c, n in zip(columns, null, strict=True)
    ]
    missing = [defaults.get(c.index) for c in columns]
    placeholders = [
        None if not debezium or (p := _placeholder(c)) is None else _field_writer(c, n)(p)
        for c, n in zip(columns, null, strict=True)
    ]
    masks = [None if c.mask is None else c.mask.native() for c in columns]
    return rows.row_writer(fields, ncols, nullable, missing, placeholders, masks)


# --------------------------------------------------------------------------------------------- envelope


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """The transaction-wide part of the ``source`` block; the encoder adds connector ("postgresql"), name (the
    topic prefix), schema and table, and per event the ``lsn`` and ``sequence``.

    ``ts_us`` is the commit time (µs since the Unix epoch; ts_ms is derived); ``commit_lsn`` the
    transaction's commit LSN; ``last_commit_lsn`` the first element of Debezium's ``sequence``
    (``["<last_commit_lsn>","<lsn>"]``, ``null`` first when None). Build one per transaction and pass the same
    object for all its events: the encoder caches its encoded bytes by identity.
    """

    version: str
    db: str
    ts_us: int
    snapshot: str = "false"
    tx_id: int | None = None
    commit_lsn: int | None = None
    last_commit_lsn: int | None = None
    origin: str | None = None


def sequence(last_commit_lsn: int | None, lsn: int | None) -> str | None:
    """Debezium's ``source.sequence``: a JSON array of the last commit LSN and the event's LSN, as strings."""
    if lsn is None:
        return None
    first = "null" if last_commit_lsn is None else f'"{last_commit_lsn}"'
    return f'[{first},"{lsn}"]'


@dataclass(frozen=True, slots=True)
class TxInfo:
    """Debezium's ``transaction`` block: id (e.g. ``"<xid>:<commit lsn>"``), orders within the transaction."""

    id: str
    total_order: int
    data_collection_order: int


def debezium_transaction_id(tx_id: int | None, lsn: int | None, default: str) -> str:
    """Debezium's PostgreSQL connector names a transaction ``<xid>:<LSN of the event>`` in each event."""
    return default if tx_id is None or lsn is None else f"{tx_id}:{lsn}"


class EncodeValue(Protocol):
    def __call__(  # noqa: PLR0917 - mirrors the Envelope's fields
        self,
        op: str,
        before: Row | None,
        after: Row | None,
        source: SourceInfo,
        lsn: int | None,
        ts_us: int | None,
        transaction: TxInfo | None = None,
    ) -> bytes: ...


_OPS: Final[dict[str, bytes]] = {op: write_string(op) for op in ("c", "u", "d", "r", "t")}


class EnvelopeEncoder:
    """Encodes one table's Envelope and Key records. Build one per Relation message (it compiles code).

    ``stage``: the row stage (``cdcd.rowstage.STAGE``); with its compiled rows, they encode, and hand what they
    refuse (and every error) to the Python reference built here too; None: the Python reference only.
    """

    def __init__(self, schemas: RelationSchemas, *, stage: RowStage | None = None) -> None:
        self.schemas = schemas
        cols = schemas.columns
        n = schemas.width
        self._key_columns = schemas.key_columns
        # Value columns that are not nullable (only in Debezium's layout): what a missing value becomes
        self._defaults = {c.index: default_value(c) for c in cols if c.required}
        self._value_row = _compile_row(cols, n, True, "value_row", {i: d[0] for i, d in self._defaults.items()})
        self._reference_key_row = _compile_row(self._key_columns, n, False, "key_row") if self._key_columns else None
        self._key_row = self._reference_key_row
        rel = schemas.relation
        self._connector_name = write_string(CONNECTOR) + write_string(schemas.prefix)
        self._schema_table = write_string(rel.schema or "pg_catalog") + write_string(rel.name)
        self.encode_value: EncodeValue = self._make_encode_value()
        self.encode_key: Callable[[Row], bytes] = self._encode_key
        # cdcd._native's ``Envelope.rows``: a run of one table's changes shaped and emitted in one call (shaping)
        self.rows: Callable[..., tuple[int, Sequence[int]]] | None = None
        self.snapshot_rows: Callable[..., int] | None = None  # ``Envelope.snapshot_rows``: the same for snapshots
        self.envelope: Envelope | None = None  # the compiled Envelope (also for the lane: cdcd.replication.lane)
        self.writers: tuple[RowWriter, RowWriter | None] | None = None  # its compiled value and key row writers
        self.stage = stage  # also reads its runs' changes again (cdcd.batches.EncodedRun.changes)
        self._compiled = None if stage is None else stage.rows
        if schemas.debezium:  # Debezium's layout: the envelope written here (the reference of the compiled one)
            self.encode_value = self._make_debezium_encode_value()
        if self._compiled is not None:
            self._use_native(self._compiled)

    def encoded(self, data: bytes | None = None, count: int = 0) -> Encoded:
        """A run of changes its envelope encodes as they arrive (``data``: one spilled, of ``count`` changes)."""
        assert self._compiled is not None  # only a compiled envelope encodes runs
        return self._compiled.encoded(data, count)

    def _use_native(self, compiled: CompiledRows) -> None:
        cols, debezium = self.schemas.columns, self.schemas.debezium
        defaults = {i: d[0] for i, d in self._defaults.items()}
        width = self.schemas.width
        value_row = _native_row(compiled, cols, width, True, defaults, debezium)
        key_row = _native_row(compiled, self._key_columns, width, False) if self._key_columns else None
        self._value_row, self._key_row = value_row, key_row
        constants = self._connector_name, self._schema_table
        envelope = compiled.envelope(
            value_row, key_row, *constants, self.encode_value, self._encode_key, debezium=debezium
        )
        self.encode_value = envelope.encode_value
        self.encode_key = envelope.encode_key
        self.rows = envelope.rows
        self.snapshot_rows = envelope.snapshot_rows
        self.envelope = envelope
        self.writers = value_row, key_row

    # The hot path is a closure over locals (no attribute lookups per event).
    def _make_encode_value(self) -> EncodeValue:  # noqa: PLR0915 - one closure on purpose: the hot path
        value_row = self._value_row
        connector_name = self._connector_name
        schema_table = self._schema_table
        ops = _OPS
        join = b"".join
        diagnose = self._diagnose
        # encoded parts of the last SourceInfo seen: [source, head (version..db), seq prefix, txId, tail]
        cache: list[Any] = [None, b"", "", b"", b""]
        # per-transaction values, encoded once while they repeat: [ts_us, its ts_ms + ts_us, txn id, its bytes]
        repeat: list[Any] = [None, b"", None, b""]

        def encode_source(s: SourceInfo) -> None:
            ts = s.ts_us
            cache[1] = (
                write_string(s.version)
                + connector_name
                + write_long(ts // 1000)
                + write_long(ts)
                + write_string(s.snapshot)
                + write_string(s.db)
            )
            cache[2] = "[null," if s.last_commit_lsn is None else f'["{s.last_commit_lsn}",'
            cache[3] = schema_table + _nullable_long(s.tx_id)
            cache[4] = _nullable_long(s.commit_lsn) + (
                b"\x00" if s.origin is None else b"\x02" + write_string(s.origin)
            )
            cache[0] = s

        write_rows = _rows_writer(value_row, diagnose)

        def encode_value(  # noqa: PLR0917 - flat on purpose: the hot path
            op: str,
            before: Row | None,
            after: Row | None,
            source: SourceInfo,
            lsn: int | None,
            ts_us: int | None,
            transaction: TxInfo | None = None,
        ) -> bytes:
            """The Avro binary Envelope (no Confluent header) of one event.

            ``op`` is c/u/d/r/t; ``before``/``after`` tuples in relation column order or None; ``lsn`` the
            event's LSN (source.lsn and the end of source.sequence); ``ts_us`` the processing time (µs since the
            Unix epoch, None to leave ts_ms/ts_us null).
            """
            parts: list[bytes] = []
            a = parts.append
            toast: list[bytes] = []
            write_rows(before, after, a, toast)
            if source is not cache[0]:
                encode_source(source)
            a(cache[1])
            if lsn is None:
                a(b"\x00")
                a(cache[3])
                a(b"\x00")
            else:
                seq = f'{cache[2]}"{lsn}"]'.encode()
                a(_U14[len(seq) << 1])
                a(seq)
                a(cache[3])
                a(b"\x02" + varint((lsn << 1) ^ (lsn >> 63)))
            a(cache[4])
            o = ops.get(op)
            if o is None:
                raise ConversionError(f"unknown envelope op {op!r} (expected c, u, d, r or t)", value=op)
            a(o)
            if ts_us is None:
                a(b"\x00\x00")
            else:
                if ts_us != repeat[0]:
                    repeat[0] = ts_us
                    repeat[1] = b"\x02" + write_long(ts_us // 1000) + b"\x02" + write_long(ts_us)
                a(repeat[1])
            if transaction is None:
                a(b"\x00")
            else:
                if transaction.id != repeat[2]:
                    repeat[2] = transaction.id
                    repeat[3] = b"\x02" + write_string(transaction.id)
                a(repeat[3])
                a(write_long(transaction.total_order))
                a(write_long(transaction.data_collection_order))
            if toast:
                a(varint(len(toast) << 1))
                a(join(toast))
            a(b"\x00")
            return join(parts)

        return encode_value

    def _make_debezium_encode_value(self) -> EncodeValue:  # noqa: PLR0915 - one closure, as _make_encode_value
        """``encode_value`` in Debezium's envelope layout (``kafka.envelope: debezium``): source in Debezium's
        order with ts_ns, xmin and origin_lsn (null), cdcd's commit_lsn last; the transaction block before op,
        its id ``<xid>:<event LSN>`` as Debezium's; ts_ns after ts_us; unchanged_toast last."""
        value_row = self._value_row
        diagnose = self._diagnose
        head = self._connector_name
        schema_table = self._schema_table
        cache: list[Any] = [None, b"", b"", b""]  # SourceInfo, its parts before and after the sequence, tx id
        # Debezium's placeholder for an unchanged TOAST value, by column: text (string types read as they are)
        # or the binary form (bytea); other columns stay null. Either way the column is in unchanged_toast.
        placeholders = {c.index: (p, write_string(c.field)) for c in self.schemas.columns if (p := _placeholder(c))}
        position = {write_string(c.field): c.index for c in self.schemas.columns}

        def unavailable(row: Row, toast: list[bytes]) -> Row:
            out = list(row)
            for i, v in enumerate(row):
                if v is ... and i in placeholders:
                    out[i], name = placeholders[i]
                    toast.append(name)
            return tuple(out)

        def encode_source(s: SourceInfo) -> None:
            ts = s.ts_us
            cache[1] = (
                write_string(s.version) + head + write_long(ts // 1000) + b"\x00" + write_string(s.snapshot)
            ) + write_string(s.db)
            cache[2] = b"\x02" + write_long(ts) + b"\x02" + write_long(ts * 1000) + schema_table
            cache[3] = b"\x00" + (b"\x00" if s.origin is None else b"\x02" + write_string(s.origin)) + b"\x00"
            cache[3] += _nullable_long(s.commit_lsn)
            cache[0] = s

        def row_writer(row: Row, a: Callable[[bytes], None], t: Callable[[bytes], None]) -> None:
            if not placeholders or ... not in row:
                value_row(row, a, t)
                return
            names: list[bytes] = []  # Debezium's placeholders first, then the columns left null: column order
            value_row(unavailable(row, names), a, names.append)
            for name in sorted(names, key=position.__getitem__):
                t(name)

        write_rows = _rows_writer(row_writer, diagnose)

        def encode_value(  # noqa: PLR0917 - the Envelope's fields
            op: str,
            before: Row | None,
            after: Row | None,
            source: SourceInfo,
            lsn: int | None,
            ts_us: int | None,
            transaction: TxInfo | None = None,
        ) -> bytes:
            parts: list[bytes] = []
            a = parts.append
            toast: list[bytes] = []
            write_rows(before, after, a, toast)
            if source is not cache[0]:
                encode_source(source)
            a(cache[1])
            seq = sequence(source.last_commit_lsn, lsn)
            a(b"\x00" if seq is None else b"\x02" + write_string(seq))
            a(cache[2])
            a(_nullable_long(source.tx_id))
            a(_nullable_long(lsn))
            a(cache[3])
            if transaction is None:
                a(b"\x00")
            else:
                a(b"\x02" + write_string(debezium_transaction_id(source.tx_id, lsn, transaction.id)))
                a(write_long(transaction.total_order))
                a(write_long(transaction.data_collection_order))
            o = _OPS.get(op)
            if o is None:
                raise ConversionError(f"unknown envelope op {op!r} (expected c, u, d, r or t)", value=op)
            a(o)
            if ts_us is None:
                a(b"\x00\x00\x00")
            else:
                a(b"\x02" + write_long(ts_us // 1000) + b"\x02" + write_long(ts_us))
                a(b"\x02" + write_long(ts_us * 1000))
            if toast:
                a(varint(len(toast) << 1))
                a(b"".join(toast))
            a(b"\x00")
            return b"".join(parts)

        return encode_value

    def key_json(self, row: Row) -> bytes:
        """The key of ``row`` as JSON text, as Debezium's key-change headers carry it (``{"id":10}``; bytes in
        base64, as Kafka Connect's JSON)."""
        key = {c.field: _datum(c, row[c.index]) for c in self._key_columns}
        return json.dumps(key, separators=(",", ":"), default=_json_bytes).encode()

    def _encode_key(self, row: Row) -> bytes:
        """The Avro binary Key record of ``row`` (its replica identity columns). The table must have a key."""
        key_row = self._reference_key_row
        if key_row is None:
            raise ConversionError(f"table {self.schemas.table} has no key columns", table=self.schemas.table)
        parts: list[bytes] = []
        try:
            key_row(row, parts.append, None)
        except ConversionError:
            raise
        except (ValueError, TypeError, IndexError, OverflowError, AttributeError, struct.error) as e:
            raise self._diagnose(row, None, e, key=True) from e
        return b"".join(parts)

    # ----------------------------------------------------------------------------------------- errors

    def _diagnose(
        self, before: Row | None, after: Row | None, error: BaseException, key: bool = False
    ) -> ConversionError:
        """Find the column that made the compiled code fail and describe it."""
        table = self.schemas.table
        for which, row in (("before", before), ("after", after)):
            if row is None:
                continue
            if len(row) != self.schemas.width:
                return ConversionError(
                    f"{which} row has {len(row)} values, the relation {self.schemas.width} columns",
                    table=table,
                    value=row,
                )
            for col in self._key_columns if key else self.schemas.columns:
                v = row[col.index]
                reason = None
                if v is ... and (key or which == "before"):
                    reason = "unchanged TOAST value where a full value is required"
                elif v is None and key:
                    reason = "NULL in a key column"
                else:
                    try:
                        _datum(col, v)
                    except (ValueError, TypeError, IndexError, OverflowError, AttributeError, struct.error) as e:
                        reason = str(e) or type(e).__name__
                if reason is not None:
                    return ConversionError(reason, table=table, column=col.column, pg_type=col.mapping.pg_type, value=v)
        return ConversionError(f"{type(error).__name__}: {error}", table=table)

    # ----------------------------------------------------------------------------------------- reference

    def value_record(self, row: Row) -> tuple[dict[str, Datum], list[str]]:
        """The datum dict of a Value record and the names of its unchanged-TOAST fields (slow path)."""
        out: dict[str, Datum] = {}
        toast: list[str] = []
        for col in self.schemas.columns:
            v = row[col.index]
            if v is ...:
                toast.append(col.field)
            default = self._defaults.get(col.index)
            out[col.field] = default[1] if default is not None and (v is None or v is ...) else _datum(col, v)
        return out, toast

    def envelope_record(  # noqa: PLR0917 - the same arguments as encode_value
        self,
        op: str,
        before: Row | None,
        after: Row | None,
        source: SourceInfo,
        lsn: int | None,
        ts_us: int | None,
        transaction: TxInfo | None = None,
    ) -> dict[str, Any]:
        """The datum dict ``fastavro.schemaless_writer`` needs for the same Envelope (slow reference path)."""
        rel, debezium = self.schemas.relation, self.schemas.debezium
        after_rec, toast = (None, []) if after is None else self.value_record(after)
        if debezium and after_rec is not None:  # Debezium's placeholders for unchanged TOAST values
            for col in self.schemas.columns:
                placeholder = _placeholder(col)
                if col.field in toast and placeholder is not None:
                    after_rec[col.field] = _datum(col, placeholder)
        record = {
            "before": None if before is None else self.value_record(before)[0],
            "after": after_rec,
            "source": source_datum(
                source, lsn, self.schemas.prefix, rel.schema or "pg_catalog", rel.name, debezium=debezium
            ),
            "op": op,
            "ts_ms": None if ts_us is None else ts_us // 1000,
            "ts_us": ts_us,
            "transaction": block_datum(transaction, source, lsn, debezium=debezium),
            "unchanged_toast": toast,
        }
        if debezium:
            record["ts_ns"] = None if ts_us is None else ts_us * 1000
        return record


def source_datum(
    source: SourceInfo, lsn: int | None, prefix: str, schema: str, table: str, *, debezium: bool = False
) -> dict[str, Any]:
    """The ``source`` block as a datum dict (the reference path, and message events): cdcd's, or Debezium's
    with ts_ns, xmin and origin_lsn (fastavro writes the fields in the schema's order)."""
    datum = {
        "version": source.version,
        "connector": CONNECTOR,
        "name": prefix,
        "ts_ms": source.ts_us // 1000,
        "ts_us": source.ts_us,
        "snapshot": source.snapshot,
        "db": source.db,
        "sequence": sequence(source.last_commit_lsn, lsn),
        "schema": schema,
        "table": table,
        "txId": source.tx_id,
        "lsn": lsn,
        "commit_lsn": source.commit_lsn,
        "origin": source.origin,
    }
    if debezium:
        datum.update(ts_ns=source.ts_us * 1000, xmin=None, origin_lsn=None)
    return datum


def block_datum(
    transaction: TxInfo | None, source: SourceInfo, lsn: int | None, *, debezium: bool = False
) -> dict[str, Any] | None:
    """The ``transaction`` block as a datum dict; Debezium names the transaction ``<xid>:<event LSN>``."""
    if transaction is None:
        return None
    return {
        "id": debezium_transaction_id(source.tx_id, lsn, transaction.id) if debezium else transaction.id,
        "total_order": transaction.total_order,
        "data_collection_order": transaction.data_collection_order,
    }


_DEFAULTS: Final[dict[str, Datum]] = {
    "string": "",
    "int": 0,
    "long": 0,
    "float": 0.0,
    "double": 0.0,
    "boolean": False,
    "bytes": b"",
    "array": [],
    "record": b"\x00\x02\x00",  # VariableScaleDecimal {scale 0, value 0}
}


# Debezium's zero of the string-typed logical types whose empty string is no value (checked against Debezium 3.6.3:
# a consumer that parses the field, as the Spark mirror does, cannot read '')
_STRING_DEFAULTS: Final[dict[str, str]] = {
    "io.debezium.time.ZonedTimestamp": "1970-01-01T00:00:00Z",
    "io.debezium.time.ZonedTime": "00:00:00Z",
}


def default_value(col: ColumnSchema) -> tuple[bytes, Datum]:
    """What Debezium writes for a NOT NULL column whose value a key-only old row lacks: the type's zero (``''``,
    0, false, an empty array; the epoch for a timestamptz, midnight UTC for a timetz), encoded and as a datum."""
    m = col.mapping
    branch = m.branches[0]
    decimal = m.kind == "bytes" and isinstance(branch, dict) and branch.get("logicalType") == "decimal"
    zero = _STRING_DEFAULTS.get(branch.get("connect.name", "")) if isinstance(branch, dict) else None
    datum = b"\x00" if decimal else _DEFAULTS[m.kind] if zero is None else zero
    encoded = _array_writer(m, False)(datum) if m.kind == "array" else _KIND_WRITERS[m.kind](datum)
    return encoded, datum


def _nullable_long(x: int | None) -> bytes:
    """A ["null", "long"] union's value."""
    return b"\x00" if x is None else b"\x02" + varint((x << 1) ^ (x >> 63))


def _in_before(_field: bytes) -> None:
    raise ValueError("unchanged TOAST value in the old tuple")


def _rows_writer(
    value_row: Callable[..., None], diagnose: Callable[[Row | None, Row | None, Exception], ConversionError]
) -> Callable[[Row | None, Row | None, Callable[[bytes], None], list[bytes]], None]:
    """``write_rows(before, after, a, toast)``: the envelope's before and after, each null or a Value record
    (``value_row``); an unchanged TOAST value names its field in ``toast`` (in ``before`` it is an error)."""

    def write_rows(before: Row | None, after: Row | None, a: Callable[[bytes], None], toast: list[bytes]) -> None:
        try:
            if before is None:
                a(b"\x00")
            else:
                a(b"\x02")
                value_row(before, a, _in_before)
            if after is None:
                a(b"\x00")
            else:
                a(b"\x02")
                value_row(after, a, toast.append)
        except ConversionError:
            raise
        except (ValueError, TypeError, IndexError, OverflowError, AttributeError, struct.error) as e:
            raise diagnose(before, after, e) from e

    return write_rows


def _json_bytes(value: object) -> str:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _placeholder(col: ColumnSchema) -> str | bytes | None:
    """What Debezium sends for an unchanged TOAST value of the column, as a tuple value (text for the string
    types read as they are, the binary form for bytea); None: the column stays null."""
    m = col.mapping
    if m.kind == "string" and m.from_text is identity:
        return UNAVAILABLE
    if m.kind == "bytes" and m.from_binary is bytes:
        return UNAVAILABLE.encode()
    return None


def _datum(col: ColumnSchema, v: object) -> Datum:
    if v is None or v is ...:
        return None
    if isinstance(v, str):
        return col.mapping.from_text(v)
    if isinstance(v, bytes):
        return col.mapping.from_binary(v)
    raise TypeError(f"tuple value of type {type(v).__name__}")
