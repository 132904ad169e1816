"""cdcd._native (Rust) against the Python reference it implements: the same bytes, the same typed errors.

The row writer is compared with the generated Python row code on random relations of every mapped type, with
values in text and binary form, NULLs and unchanged TOAST values, and with values mangled into forms
PostgreSQL does not print (which the compiled code must hand back to the reference). The tuple reader is
compared with the Python decoder on captured and generated messages, whole, truncated and mutated.
``benchmarks/fuzz.py`` runs the same comparisons over millions of mutated messages.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cdcd.rowstage
from cdcd.avro import EnvelopeEncoder, build_schemas
from cdcd.avro.debezium import debezium_mapping
from cdcd.avro.encoder import native_kind
from cdcd.avro.types import type_mapping
from cdcd.batches import SnapshotBatch, Transaction
from cdcd.columns import NO_RULES, ColumnRules, Mask, TableColumns
from cdcd.pgoutput import DecodeError, Decoder
from cdcd.pgoutput.messages import Change, Column, LogicalMessage, Relation, Row, RowChange, Truncate, Type, Value
from cdcd.plan import Plans
from cdcd.rowstage import PYTHON, STAGE
from cdcd.shaping import EventShaper
from tests.unit.test_avro_encoder import ALL_TYPES, ENUM_OID, SCALARS, SOURCES, TXS, Case, ColType, cases, draw_row
from tests.unit.test_decoder_properties import CAPTURED, State, mutate

SETTINGS = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TYPES = {ENUM_OID: Type(ENUM_OID, "public", "mood")}


@pytest.fixture(autouse=True)
def _compiled_module_loaded() -> None:
    """Every test here compares cdcd._native with the Python reference: under CDCD_IMPL=python both would be Python."""
    assert STAGE.name == "native", "parity tests need the compiled row stage (unset CDCD_IMPL)"


def test_native_module_is_built_and_chosen_by_cdcd_impl() -> None:
    """`make venv` builds it; CDCD_IMPL picks it (native, or unset) or the Python reference alone (python)."""
    from cdcd import _native  # noqa: PLC0415 - built by maturin

    assert cdcd.rowstage.load("").name == cdcd.rowstage.load("native").name == "native"
    assert cdcd.rowstage.load("native").change_reader("UTF8") is _native.read_change
    assert cdcd.rowstage.load("python") is PYTHON
    assert (PYTHON.rows, PYTHON.lane, PYTHON.change_reader("UTF8")) == (None, None, None)
    with pytest.raises(cdcd.rowstage.ImplementationError, match="CDCD_IMPL='rust' is not an implementation"):
        cdcd.rowstage.load("rust")
    assert STAGE.name == cdcd.rowstage.IMPL


def test_every_scalar_but_interval_has_a_compiled_conversion() -> None:
    compiled = {c.name: native_kind(type_mapping(c.oid, c.typmod, "public.mood")) for c in SCALARS}
    assert {name for name, kind in compiled.items() if kind == (0, 0)} == {"interval"}
    assert compiled["numeric(12,2)"] == (17, 2)
    assert compiled["mood (enum)"] == compiled["point (unknown)"] == (9, 0)
    assert native_kind(type_mapping(1231, ((12 << 16) | 2) + 4)) == (18, 17 | 2 << 8)  # numeric(12,2)[]
    assert native_kind(type_mapping(1187)) == (0, 0)  # interval[]


def test_every_debezium_scalar_has_a_compiled_conversion() -> None:
    """Debezium's forms too (ZonedTimestamp, MicroDuration, ZonedTime...): none is left to the Python reference."""
    compiled = {c.name: native_kind(debezium_mapping(c.oid, c.typmod, "public.mood")) for c in SCALARS}
    assert {name for name, kind in compiled.items() if kind == (0, 0)} == set()
    assert compiled["timetz"] == (26, 0)


# -- row writer -------------------------------------------------------------------------------------------------


MANGLE = st.sampled_from(["space", "plus", "unicode digit", "empty", "junk", "cut", "extend", "nan", "digit"])


AT = st.tuples(st.integers(0, 40), st.integers(0, 9))


def mangle(value: Value, how: str, junk: str, extra: bytes, at: tuple[int, int]) -> Value:
    """A value PostgreSQL would not send for the type (or an unusual form of one, or an out-of-range one)."""
    if isinstance(value, str):
        if how == "digit":  # a month 13, a day 00, an hour 99...
            i = at[0] % (len(value) or 1)
            return value[:i] + str(at[1]) + value[i + 1 :]
        return {
            "space": f" {value} ",
            "plus": f"+{value}",
            "unicode digit": value.replace("1", "\u0661"),
            "empty": "",
            "junk": junk,
            "cut": value[: len(value) // 2],
            "extend": value + junk,
            "nan": "NaN",
        }[how]
    if isinstance(value, bytes):
        return {"cut": value[:-1], "extend": value + extra, "empty": b"", "nan": b"\x7f\xc0\x00\x01"}.get(how, extra)
    return value


def outcome(writer: Any, row: Row, nullable: bool) -> tuple[str, Any]:
    parts: list[bytes] = []
    toast: list[bytes] = []
    try:
        writer(row, parts.append, toast.append if nullable else None)
    except Exception as exc:
        return "raised", type(exc).__name__
    return "wrote", (b"".join(parts), toast)


LAYOUTS = pytest.mark.parametrize("debezium", [False, True], ids=["cdcd", "debezium"])


def writers(
    case: Case, debezium: bool = False, rules: TableColumns | None = None
) -> tuple[EnvelopeEncoder, EnvelopeEncoder]:
    """Compiled and Python encoders of the case's table; ``debezium``: in Debezium's envelope and type map;
    ``rules``: the table's column rules."""
    schemas = build_schemas(case.relation, "srv", TYPES, debezium=debezium, rules=rules)
    return EnvelopeEncoder(schemas, stage=STAGE), EnvelopeEncoder(schemas)


@LAYOUTS
@SETTINGS
@given(data=st.data(), case=cases())
def test_row_writer_equals_the_python_reference(data: st.DataObject, case: Case, debezium: bool) -> None:
    compiled, reference = writers(case, debezium)
    # Debezium's placeholders for unchanged TOAST values are the envelope's (compared there), not the row's
    drawn = draw_row(data.draw, case, toast=not debezium)
    row = list(drawn.row)
    for i in data.draw(st.lists(st.integers(0, len(row) - 1), max_size=3)):
        junk, extra = data.draw(st.text(max_size=8)), data.draw(st.binary(max_size=8))
        row[i] = mangle(row[i], data.draw(MANGLE), junk, extra, data.draw(AT))
    for name in ("_value_row", "_key_row"):
        fast, slow = getattr(compiled, name), getattr(reference, name)
        if slow is not None:
            nullable = name == "_value_row"
            assert outcome(fast, tuple(row), nullable) == outcome(slow, tuple(row), nullable)


@LAYOUTS
@pytest.mark.parametrize("coltype", ALL_TYPES, ids=lambda t: t.name)
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_each_type_equals_the_python_reference(coltype: ColType, data: st.DataObject, debezium: bool) -> None:
    """One type at a time (its valid forms, and each mangled), as a Value and as a Key column (in Debezium's
    layout the Value column is then not nullable, and an unchanged one takes the type's zero)."""
    relation = Relation(1, "public", "t", "d", (Column("k", coltype.oid, coltype.typmod, True),))
    compiled, reference = writers(Case(relation, [coltype]), debezium)
    sample = data.draw(coltype.values)
    value: Value = sample.binary if sample.binary is not None and data.draw(st.booleans()) else sample.text
    for _ in range(data.draw(st.integers(0, 2))):
        junk, extra = data.draw(st.text(max_size=8)), data.draw(st.binary(max_size=8))
        value = mangle(value, data.draw(MANGLE), junk, extra, data.draw(AT))
    assert outcome(compiled._value_row, (value,), True) == outcome(reference._value_row, (value,), True)
    assert outcome(compiled._key_row, (value,), False) == outcome(reference._key_row, (value,), False)


def raised_or_returned(call: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "returned", call(*args)
    except Exception as exc:
        return "raised", f"{type(exc).__name__}: {exc}"


LONGS = st.none() | st.integers(-(2**63), 2**63 - 1) | st.sampled_from([2**63, -(2**63) - 1])


@LAYOUTS
@SETTINGS
@given(data=st.data(), case=cases(), op=st.sampled_from(["c", "u", "d", "r", "t", "x"]))
def test_envelope_and_key_bytes_equal_the_python_reference(
    data: st.DataObject, case: Case, op: str, debezium: bool
) -> None:
    compiled, reference = writers(case, debezium)
    before = data.draw(st.none() | st.just(draw_row(data.draw, case, toast=data.draw(st.booleans())).row))
    after = data.draw(st.none() | st.just(draw_row(data.draw, case, toast=True).row))
    args = (op, before, after, data.draw(SOURCES), data.draw(LONGS), data.draw(LONGS), data.draw(TXS))
    assert raised_or_returned(compiled.encode_value, *args) == raised_or_returned(reference.encode_value, *args)
    for row in (before, after):
        if row is not None:
            assert raised_or_returned(compiled.encode_key, row) == raised_or_returned(reference.encode_key, row)


# -- column rules ---------------------------------------------------------------------------------------------------

_KEY_RULES = st.sampled_from(["keep", "hash"])
_RULES = st.sampled_from(["keep", "out", "hash", "keep_first", "keep_last", "stars", "constant", "null", "truncate"])


def _mask(draw: st.DrawFn, kind: str) -> Mask:
    if kind == "hash":
        return Mask("hash", salt=draw(st.text(min_size=1, max_size=80)).encode())
    if kind == "constant":
        return Mask("constant", constant=draw(st.text(max_size=20)))
    if kind == "null":
        return Mask("null")
    return Mask(kind, draw(st.integers(0 if kind != "stars" else 1, 12)))  # type: ignore[arg-type]


@st.composite
def table_rules(draw: st.DrawFn, relation: Relation) -> TableColumns:
    """Rules any table may have: key columns hashed or kept, the others left out, kept or masked by any rule."""
    exclude, masks = set(), {}
    for column in relation.columns:
        kind = draw(_KEY_RULES if column.is_key else _RULES)
        if kind == "out":
            exclude.add(column.name)
        elif kind != "keep":
            masks[column.name] = _mask(draw, kind)
    return TableColumns(f"{relation.schema or 'pg_catalog'}.{relation.name}", None, frozenset(exclude), masks)


TEXTS = st.text(max_size=200) | st.sampled_from(["", "é" * 63, "x" * 55, "x" * 56, "x" * 64, "ü€😀" * 30])


@LAYOUTS
@SETTINGS
@given(data=st.data(), case=cases())
def test_masked_rows_and_envelopes_equal_the_python_reference(data: st.DataObject, case: Case, debezium: bool) -> None:
    """Any rules on random tables: rows, envelopes and keys written alike (hashes of texts across SHA-256's block
    boundaries, characters beyond ASCII, binary forms a rule cannot read, NULL and unchanged TOAST values)."""
    rules = data.draw(table_rules(case.relation))
    compiled, reference = writers(case, debezium, rules)
    assert compiled.envelope is not None
    rows: list[Row] = []
    for toast in (False, True):
        values = list(draw_row(data.draw, case, toast=toast and not debezium).row)
        for i in data.draw(st.lists(st.integers(0, len(values) - 1), max_size=3)):
            values[i] = data.draw(TEXTS)
        rows.append(tuple(values))
    for row in rows:
        for name in ("_value_row", "_key_row"):
            fast, slow = getattr(compiled, name), getattr(reference, name)
            if slow is not None:
                nullable = name == "_value_row"
                assert outcome(fast, row, nullable) == outcome(slow, row, nullable)
        assert raised_or_returned(compiled.encode_key, row) == raised_or_returned(reference.encode_key, row)
    args = ("u", rows[0], rows[1], data.draw(SOURCES), data.draw(LONGS), data.draw(LONGS), data.draw(TXS))
    assert raised_or_returned(compiled.encode_value, *args) == raised_or_returned(reference.encode_value, *args)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=150), TEXTS)
def test_the_compiled_hash_is_sha256(salt: bytes, text: str) -> None:
    """native/src/mask.rs's SHA-256 against hashlib, through a one-field row writer."""
    assert STAGE.rows is not None
    fields = [(0, 8, 0, lambda v: b"", b"\x02v")]
    writer = STAGE.rows.row_writer(fields, 1, False, None, None, [Mask("hash", salt=salt).native()])
    parts: list[bytes] = []
    writer((text,), parts.append, None)  # type: ignore[arg-type]
    assert parts == [b"\x80\x01" + hashlib.sha256(salt + text.encode()).hexdigest().encode()]


def test_row_of_the_wrong_length_or_a_null_key_is_refused_by_both() -> None:
    int4 = next(t for t in ALL_TYPES if t.name == "int4")
    relation = Relation(1, "public", "t", "d", (Column("a", 23, -1, True), Column("b", 23, -1, False)))
    for encoder in writers(Case(relation, [int4, int4])):
        assert outcome(encoder._value_row, ("1",), True) == ("raised", "IndexError")
        assert outcome(encoder._key_row, (None, "2"), False) == ("raised", "ValueError")
        assert outcome(encoder._key_row, (..., "2"), False) == ("raised", "ValueError")


# -- tuple reader -----------------------------------------------------------------------------------------------


def decoded(state: State, data: bytes, native: bool) -> tuple[str, Any]:
    decoder = Decoder(parallel_streaming=state.parallel, stage=STAGE if native else None)
    decoder.in_stream = state.in_stream
    decoder.relations = dict(state.relations)
    try:
        return "decoded", decoder.decode(data, 0)
    except DecodeError as exc:
        return "DecodeError", str(exc)


def same_outcome(state: State, data: bytes) -> None:
    assert decoded(state, data, native=True) == decoded(state, data, native=False)


@pytest.mark.parametrize("index", range(len(CAPTURED)))
def test_captured_messages_whole_and_truncated(index: int) -> None:
    data, state = CAPTURED[index]
    for cut in range(len(data) + 1):
        same_outcome(state, data[:cut])


_MESSAGES = st.sampled_from(CAPTURED)


@settings(max_examples=3000, deadline=None)
@given(_MESSAGES, st.integers(0, 10_000), st.integers(0, 255))
def test_mutated_captured_messages(message: tuple[bytes, State], position: int, value: int) -> None:
    data, state = message
    same_outcome(state, mutate(data, position, value))


@settings(max_examples=1000, deadline=None)
@given(_MESSAGES, st.sampled_from(b"IUD"), st.binary(max_size=64))
def test_random_change_bodies(message: tuple[bytes, State], kind: int, body: bytes) -> None:
    _, state = message
    relation_ids = [rid for rid, _ in state.relations] or [0]
    head = bytes([kind]) + relation_ids[0].to_bytes(4, "big") + (b"N" if kind == ord("I") else b"")
    same_outcome(state, head + body)


def test_fuzz_short_run() -> None:
    """benchmarks/fuzz.py's own loop on 30,000 mutated captured messages (it runs 1,000,000 by default)."""
    spec = importlib.util.spec_from_file_location("fuzz", Path(__file__).parents[2] / "benchmarks" / "fuzz.py")
    assert spec is not None
    assert spec.loader is not None
    fuzz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fuzz)
    assert fuzz.run(30_000, seed=11) == 0


# -- shaping runs of changes ------------------------------------------------------------------------------------

TABLES = [
    Relation(16_384, "public", "t", "d", (Column("id", 23, -1, True), Column("v", 25, -1, False))),
    # REPLICA IDENTITY FULL as the decoder gives it: keyed by the primary key (id), or by nothing without one.
    Relation(16_385, "public", "f", "f", (Column("id", 23, -1, True), Column("v", 25, -1, False))),
    Relation(16_388, "public", "g", "f", (Column("id", 23, -1, False), Column("v", 25, -1, False))),
    Relation(
        16_386, "s", "two", "i", (Column("a", 20, -1, True), Column("b", 1184, -1, True), Column("c", 17, -1, False))
    ),
    Relation(16_387, "public", "n", "n", (Column("x", 701, -1, False),)),
]
# Key values by type, now and then one the column's type refuses (the reference raises: both must stop alike).
KEYS = {
    20: st.sampled_from(["1", "2", "3", "-7"] * 8 + ["x"]),
    23: st.sampled_from(["1", "2", "3", "-7"] * 8 + [""]),
    25: st.sampled_from(["a", "b", ""]),
    1184: st.sampled_from(["2024-05-03 12:00:00+00", "2024-05-03 12:00:00.5+02", "infinity"]),
}
VALUES = st.none() | st.just(...) | st.sampled_from(["a", "2024-05-03 12:00:00+00", "\\x0aff", "1.5", "NaN"])


@st.composite
def changes(draw: st.DrawFn) -> RowChange:
    relation = draw(st.sampled_from(TABLES))
    width = len(relation.columns)

    def row(key_only: bool = False) -> tuple[Value, ...]:
        return tuple(
            draw(KEYS[c.type_oid]) if c.is_key else None if key_only else draw(VALUES) for c in relation.columns
        )

    op = draw(st.sampled_from(["insert", "update", "delete"]))
    old_kind = draw(st.sampled_from(["none", "key", "full"])) if op != "insert" else "none"
    if op == "delete" and old_kind == "none":
        old_kind = "key"
    old = None if old_kind == "none" else row(key_only=old_kind == "key")
    new = None if op == "delete" else row()
    assert old is None or len(old) == width
    return RowChange(op, relation, old, new, old_kind == "key", None, draw(st.integers(1, 2**40)), 10)  # type: ignore[arg-type]


class _Registry:
    def schema_id(self, subject: str, schema: object) -> int:
        return len(subject)

    def ensure_topic(self, topic: str) -> None:
        return None


class _Buffer:
    def __init__(self, items: list[Change]) -> None:
        self.items, self.count = items, len(items)

    def __iter__(self) -> Iterator[Change]:
        return iter(self.items)

    def close(self) -> None:
        """Nothing to release."""


def shaped(  # noqa: PLR0917
    items: list[Change],
    native: bool,
    tombstones: bool,
    many: bool = False,
    debezium: bool = False,
    columns: ColumnRules = NO_RULES,
) -> tuple[str, Any]:
    """What the shaper emits; ``many``: the compiled shaper's records through ``emit_many``, a list at a time."""
    shaper = EventShaper(
        "cdcd",
        _Registry(),
        tombstones_on_delete=tombstones,
        clock_us=lambda: 1_700_000_000_000_000,
        stage=STAGE if native else PYTHON,
        debezium=debezium,
        columns=columns,
    )
    shaper.start_session("db", {}, Plans())
    records: list[Any] = []
    txn = Transaction(77, 0x500, 0x508, 0, False, _Buffer(items))
    try:
        for _ in range(2):  # a second transaction: last_commit_lsn, and caches reused
            emit_many = (lambda made: records.extend((*r, None) for r in made)) if many else None
            shaper.transaction(txn, iter(items), lambda *record: records.append(record), emit_many)
    except Exception as exc:
        return "raised", (type(exc).__name__, str(exc), records)
    return "emitted", (records, sorted(shaper.events.items()))


@LAYOUTS
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(changes() | st.sampled_from(["truncate", "message"]), max_size=40), st.booleans(), st.booleans())
def test_compiled_shaper_emits_what_the_python_shaper_emits(
    debezium: bool, items: list[Any], tombstones: bool, many: bool
) -> None:
    """Runs of changes (key changes, refused values, tombstones, every replica identity) between truncates and
    messages: the same records in the same order, the same transaction orders and the same event counts, with
    the compiled shaper's records handed over one by one or a list at a time (``many``)."""
    made: list[Change] = []
    for item in items:
        if item == "truncate":
            made.append(Truncate((TABLES[0],), False, False, None, 5))
        elif item == "message":
            made.append(LogicalMessage(True, 6, "p", b"m"))
        else:
            made.append(item)
    compiled = shaped(made, native=True, tombstones=tombstones, many=many, debezium=debezium)
    assert compiled == shaped(made, native=False, tombstones=tombstones, debezium=debezium)


@LAYOUTS
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(changes(), max_size=30), st.data())
def test_compiled_shaper_with_column_rules_emits_what_the_python_shaper_emits(
    debezium: bool, items: list[RowChange], data: st.DataObject
) -> None:
    """The same with rules on every table: key changes (before images, key headers), deletes with key-only old
    rows, unchanged TOAST values, refused values."""
    columns = ColumnRules({f"{t.schema}.{t.name}": data.draw(table_rules(t)) for t in TABLES})
    made: list[Change] = list(items)
    compiled = shaped(made, native=True, tombstones=True, debezium=debezium, columns=columns)
    assert compiled == shaped(made, native=False, tombstones=True, debezium=debezium, columns=columns)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["BEGIN", "END", "é"]),
    st.text(max_size=30),
    st.integers(-(2**63), 2**63 - 1),
    st.none() | st.integers(0, 2**40),
    st.none() | st.lists(st.tuples(st.text(max_size=20), st.integers(0, 2**40)), max_size=4).map(tuple),
    st.booleans(),
)
def test_transaction_events_equal_the_python_reference(  # noqa: PLR0917 - hypothesis gives each field
    status: str,
    txn_id: str,
    ts_ms: int,
    count: int | None,
    collections: tuple[tuple[str, int], ...] | None,
    debezium: bool,
) -> None:
    compiled, reference = STAGE.transaction_fields_encoder(), PYTHON.transaction_fields_encoder()
    assert compiled is not reference
    fields = status, txn_id, ts_ms, count, collections, debezium
    assert compiled(*fields) == reference(*fields)


# -- COPY text lines (snapshots) --------------------------------------------------------------------------------

FIELD_BYTES = st.sampled_from(
    [b"a", b"\\N", b"\\\\", b"\\x", b"\\", b"\xc3\xa9", b"\xff", b"N", b"\t", b"\\\xc3\xa9"]
    + [b"\\" + bytes([c]) for c in b"tnrbfv"]
)


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.lists(FIELD_BYTES, max_size=4).map(b"".join), min_size=1, max_size=5), st.integers(1, 5))
def test_copy_lines_read_as_the_python_reference_reads_them(fields: list[bytes], width: int) -> None:
    """Escapes COPY writes and ones it does not, NULLs, tabs, invalid UTF-8, the wrong number of fields."""
    data = b"\t".join(fields) + b"\n"
    assert raised_or_returned(STAGE.copy_row_reader(), data, width) == raised_or_returned(
        PYTHON.copy_row_reader(), data, width
    )


@settings(max_examples=1000, deadline=None)
@given(
    st.lists(st.lists(st.lists(FIELD_BYTES, max_size=4).map(b"".join), min_size=1, max_size=5), max_size=6),
    st.integers(1, 5),
    st.booleans(),
)
def test_copy_line_batches_read_as_the_python_reference_reads_them(
    lines: list[list[bytes]], width: int, unterminated: bool
) -> None:
    """Many lines in one call (parsed without the GIL), the unusual ones given back to the reference one by one;
    the same rows, or the same error, as the reference reads them; also without the last newline."""
    data = b"".join(b"\t".join(fields) + b"\n" for fields in lines)
    if unterminated and data:
        data = data[:-1]
    assert raised_or_returned(STAGE.copy_rows_reader(), data, width) == raised_or_returned(
        PYTHON.copy_rows_reader(), data, width
    )


@LAYOUTS
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(TABLES),
    st.data(),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["true", "incremental"]),
)
def test_compiled_snapshot_rows_equal_the_python_shaper(  # noqa: PLR0917 - the drawn parts
    debezium: bool, relation: Relation, data: st.DataObject, first: bool, last: bool, marker: str
) -> None:
    """Snapshot batches (the first and last rows of a whole snapshot marked, refused values) shaped alike, with
    column rules now and then."""
    rules = data.draw(st.none() | table_rules(relation))
    columns = NO_RULES if rules is None else ColumnRules({rules.table: rules})
    rows = data.draw(
        st.lists(
            st.tuples(*(KEYS[c.type_oid] if c.is_key else VALUES for c in relation.columns)).map(
                lambda r: tuple(None if v is ... else v for v in r)
            ),
            max_size=12,
        )
    )

    def shape(native: bool) -> tuple[str, Any]:
        clock = lambda: 1_700_000_000_000_000  # noqa: E731
        stage = STAGE if native else PYTHON
        shaper = EventShaper("cdcd", _Registry(), clock_us=clock, stage=stage, debezium=debezium, columns=columns)
        shaper.start_session("db", {}, Plans())
        records: list[Any] = []
        batch = SnapshotBatch(relation, rows, 0x900, 1_600_000_000_000_000, marker, first, last)  # type: ignore[arg-type]
        try:
            shaper.snapshot(batch, lambda *record: records.append(record))
        except Exception as exc:
            return "raised", (type(exc).__name__, str(exc), records)
        return "emitted", (records, sorted(shaper.events.items()))

    assert shape(native=True) == shape(native=False)
