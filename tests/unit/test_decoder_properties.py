"""Property tests of the pgoutput decoder: round trips through a test-only encoder, and malformed input.

Malformed input (truncations, random bytes, single-byte mutations of captured and encoded messages) must either
decode or raise DecodeError naming the message type and an offset inside the message -- never any other exception.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcd.pgoutput import DecodeError, Decoder
from cdcd.pgoutput.messages import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    LogicalMessage,
    Message,
    Op,
    Origin,
    Prepare,
    Relation,
    ReplicaIdentity,
    RollbackPrepared,
    Row,
    RowChange,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    TableFacts,
    Truncate,
    Type,
    Value,
)
from cdcd.rowstage import STAGE
from tests import pgoutput_encoder as enc
from tests.capture_pgoutput import fixture_paths, load_fixture

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- decoder state -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class State:
    """What a decoder knows before a message: whether it is in a streamed block, and the relations it has seen."""

    in_stream: bool
    relations: tuple[tuple[int, Relation], ...]
    parallel: bool = False  # streaming = parallel: Stream Abort carries abort LSN and timestamp

    def decoder(self) -> Decoder:
        decoder = Decoder(parallel_streaming=self.parallel, stage=STAGE)
        decoder.in_stream = self.in_stream
        decoder.relations = dict(self.relations)
        return decoder


def state_of(decoder: Decoder) -> State:
    relations = tuple(sorted(decoder.relations.items(), key=lambda item: item[0]))
    return State(decoder.in_stream, relations, decoder.parallel_streaming)


def replay(messages: list[tuple[bytes, int]], parallel: bool) -> list[tuple[bytes, State]]:
    """Decode a stream in order, returning each message with the decoder state it was decoded in."""
    decoder = Decoder(parallel_streaming=parallel, stage=STAGE)
    result = []
    for data, lsn in messages:
        state = state_of(decoder)
        decoder.decode(data, lsn)
        result.append((data, state))
    return result


def load_captured() -> list[tuple[bytes, State]]:
    seen: dict[tuple[bytes, State], None] = {}
    for path in fixture_paths():
        fx = load_fixture(path)
        for capture in fx.captures:
            stream = [(m.data, m.lsn) for m in fx.stream(capture.proto, capture.scenario)]
            for item in replay(stream, capture.options.get("streaming") == "parallel"):
                seen.setdefault(item)
    return list(seen)


CAPTURED = load_captured()


def check_error(exc: DecodeError, data: bytes) -> None:
    assert isinstance(exc.message_type, str)
    assert exc.message_type
    assert isinstance(exc.offset, int)
    assert 0 <= exc.offset <= len(data), f"offset {exc.offset} outside a {len(data)}-byte message"
    assert exc.message_type in str(exc)
    assert f"byte {exc.offset}" in str(exc)


def decode_or_decode_error(state: State, data: bytes) -> Message | None:
    """Decode ``data``; a DecodeError is checked and gives None, anything else propagates and fails the test."""
    try:
        return state.decoder().decode(data, 0)
    except DecodeError as exc:
        check_error(exc, data)
        return None


def check_every_prefix_fails(state: State, data: bytes) -> None:
    for cut in range(len(data)):
        prefix = data[:cut]
        with pytest.raises(DecodeError) as info:
            state.decoder().decode(prefix)
        check_error(info.value, prefix)


# -- strategies ----------------------------------------------------------------------------------------------------

u8s = st.integers(0, 0xFF)
u32s = st.integers(0, 0xFFFFFFFF)
i32s = st.integers(-(2**31), 2**31 - 1)
u64s = st.integers(0, 2**64 - 1)
i64s = st.integers(-(2**63), 2**63 - 1)
names = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=12)
identities: st.SearchStrategy[ReplicaIdentity] = st.sampled_from(["d", "n", "f", "i"])
values: st.SearchStrategy[Value] = st.one_of(
    st.none(), st.just(UNCHANGED_TOAST), st.text(max_size=12), st.binary(max_size=12)
)
columns = st.builds(Column, names, u32s, i32s, st.booleans())


def relations(xid: int | None, relation_id: st.SearchStrategy[int] = u32s) -> st.SearchStrategy[Relation]:
    return st.builds(
        Relation, relation_id, names, names, identities, st.lists(columns, max_size=6).map(tuple), st.just(xid)
    )


def rows(relation: Relation) -> st.SearchStrategy[Row]:
    return st.tuples(*[values] * len(relation.columns))


@st.composite
def row_changes(draw: st.DrawFn, relation: Relation, xid: int | None) -> RowChange:
    op: Op = draw(st.sampled_from(["insert", "update", "delete"]))
    old: Row | None = None
    old_is_key = False
    if op == "delete" or (op == "update" and draw(st.booleans())):
        old, old_is_key = draw(rows(relation)), draw(st.booleans())
    new = None if op == "delete" else draw(rows(relation))
    return RowChange(op, relation, old, new, old_is_key, xid, draw(u64s), 0)


standalone_messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(Begin, u64s, i64s, u32s),
    st.builds(Commit, u8s, u64s, u64s, i64s),
    st.builds(Origin, u64s, names),
    st.builds(StreamCommit, u32s, u8s, u64s, u64s, i64s),
    st.builds(StreamAbort, u32s, u32s),
    st.builds(StreamAbort, u32s, u32s, u64s, i64s),
    st.builds(BeginPrepare, u64s, u64s, i64s, u32s, names),
    st.builds(Prepare, u8s, u64s, u64s, i64s, u32s, names),
    st.builds(CommitPrepared, u8s, u64s, u64s, i64s, u32s, names),
    st.builds(RollbackPrepared, u8s, u64s, u64s, i64s, i64s, u32s, names),
    st.builds(StreamPrepare, u8s, u64s, u64s, i64s, u32s, names),
)


@st.composite
def sessions(draw: st.DrawFn) -> list[tuple[Message, int]]:
    """A valid message sequence with its WAL positions: optionally one streamed block, schema first, then changes
    (each with its own subtransaction xid when streamed), Messages and Truncates; standalone messages around it."""
    in_stream = draw(st.booleans())
    top_xid = draw(u32s) if in_stream else None
    out: list[Message] = [draw(standalone_messages)]
    if in_stream:
        assert top_xid is not None
        out.append(StreamStart(top_xid, draw(st.booleans())))
    ids = draw(st.lists(u32s, min_size=1, max_size=3, unique=True))
    rels = [draw(relations(top_xid, st.just(i))) for i in ids]
    for rel in rels:
        if draw(st.booleans()):
            out.append(Type(draw(u32s), draw(names), draw(names), top_xid))
        out.append(rel)
    for _ in range(draw(st.integers(1, 6))):
        xid = draw(st.sampled_from([top_xid, draw(u32s)])) if in_stream else None
        choice = draw(st.integers(0, 3))
        if choice <= 1:
            out.append(draw(row_changes(draw(st.sampled_from(rels)), xid)))
        elif choice == 2:
            chosen = draw(st.lists(st.sampled_from(rels), max_size=3))
            out.append(Truncate(tuple(chosen), draw(st.booleans()), draw(st.booleans()), xid, draw(u64s)))
        else:
            out.append(LogicalMessage(draw(st.booleans()), draw(u64s), draw(names), draw(st.binary(max_size=16)), xid))
    if in_stream:
        out.append(StreamStop())
    out.append(draw(standalone_messages))
    # One session has one streaming mode: every Stream Abort carries the parallel fields, or none does.
    parallel = draw(st.booleans())
    out = [_abort_for_mode(m, parallel, draw) if isinstance(m, StreamAbort) else m for m in out]
    return [(m, m.wal_lsn if isinstance(m, RowChange | Truncate) else draw(u64s)) for m in out]


def _abort_for_mode(msg: StreamAbort, parallel: bool, draw: st.DrawFn) -> StreamAbort:
    if not parallel:
        return StreamAbort(msg.xid, msg.subxid)
    return StreamAbort(msg.xid, msg.subxid, draw(u64s), draw(i64s))


def decoder_for(messages: list[Message]) -> Decoder:
    """A decoder in the streaming mode the messages were encoded for."""
    parallel = any(isinstance(m, StreamAbort) and m.abort_lsn is not None for m in messages)
    return Decoder(parallel_streaming=parallel, stage=STAGE)


def as_decoded(relation: Relation) -> Relation:
    """The decoder keeps no key columns under REPLICA IDENTITY FULL without its ``keys`` lookup."""
    if relation.replica_identity != "f":
        return relation
    return dataclasses.replace(relation, columns=tuple(dataclasses.replace(c, is_key=False) for c in relation.columns))


def expected(msg: Message, data: bytes) -> Message:
    if isinstance(msg, RowChange):
        return dataclasses.replace(msg, size=len(data), relation=as_decoded(msg.relation))
    if isinstance(msg, Truncate):
        return dataclasses.replace(msg, relations=tuple(as_decoded(r) for r in msg.relations))
    return as_decoded(msg) if isinstance(msg, Relation) else msg


# -- round trips ---------------------------------------------------------------------------------------------------


@SETTINGS
@given(standalone_messages)
def test_standalone_messages_round_trip(msg: Message) -> None:
    assert decoder_for([msg]).decode(enc.encode(msg)) == msg


@SETTINGS
@given(sessions())
def test_message_sequences_round_trip(session: list[tuple[Message, int]]) -> None:
    decoder = decoder_for([m for m, _ in session])
    for msg, lsn in session:
        data = enc.encode(msg)
        decoded = decoder.decode(data, lsn)
        assert decoded == expected(msg, data)
        if isinstance(msg, Relation):
            assert decoder.relations[msg.relation_id] == as_decoded(msg)
    assert not decoder.in_stream


@SETTINGS
@given(relations(None), st.data())
def test_relations_get_the_catalogs_facts(relation: Relation, data: st.DataObject) -> None:
    """``describe`` (the catalog) flags NOT NULL columns of every relation, and under REPLICA IDENTITY FULL makes
    the primary key the key columns, unless it names a column the Relation does not have; other identities keep
    the key flags the server sent."""
    names = [c.name for c in relation.columns]
    some = st.lists(st.sampled_from(names), max_size=3) if names else st.just([])
    keys = data.draw(some | st.just(["missing"]))
    not_null = frozenset(data.draw(some))
    asked: list[Relation] = []

    def lookup(r: Relation) -> TableFacts:
        asked.append(r)
        return TableFacts(frozenset(keys), not_null)

    decoder = Decoder(describe=lookup, stage=STAGE)
    decoded = decoder.decode(enc.encode(relation))
    assert isinstance(decoded, Relation)
    assert asked == [relation]
    assert decoder.relations[relation.relation_id] == decoded
    assert [c.not_null for c in decoded.columns] == [c.name in not_null for c in relation.columns]
    if relation.replica_identity == "f":
        flagged = set(keys) if set(keys) <= set(names) else set()
        assert [c.is_key for c in decoded.columns] == [c.name in flagged for c in relation.columns]
    else:
        assert [c.is_key for c in decoded.columns] == [c.is_key for c in relation.columns]
    plain = tuple(
        dataclasses.replace(c, is_key=o.is_key, not_null=False)
        for c, o in zip(decoded.columns, relation.columns, strict=True)
    )
    assert dataclasses.replace(decoded, columns=plain) == relation


def test_enum_types_get_their_labels() -> None:
    decoder = Decoder(labels=lambda t: ("sad", "ok") if t.name == "mood" else None, stage=STAGE)
    assert decoder.decode(enc.encode(Type(16_500, "public", "mood"))) == Type(
        16_500, "public", "mood", None, ("sad", "ok")
    )
    assert decoder.types[16_500].labels == ("sad", "ok")
    assert decoder.decode(enc.encode(Type(16_501, "public", "dom"))) == Type(16_501, "public", "dom")


# -- truncation ----------------------------------------------------------------------------------------------------


def test_captured_messages_are_present() -> None:
    assert len(CAPTURED) > 100
    assert {data[:1] for data, _ in CAPTURED} >= {c.encode() for c in "BCORYIUDTMSEcAbPKrp"}


def test_every_strict_prefix_of_every_captured_message_fails() -> None:
    for data, state in CAPTURED:
        check_every_prefix_fails(state, data)


@SETTINGS
@given(sessions())
def test_every_strict_prefix_of_encoded_messages_fails(session: list[tuple[Message, int]]) -> None:
    decoder = decoder_for([m for m, _ in session])
    for msg, lsn in session:
        data = enc.encode(msg)
        check_every_prefix_fails(state_of(decoder), data)
        decoder.decode(data, lsn)


# -- random bytes and mutations ------------------------------------------------------------------------------------

TYPE_BYTES = b"BCORYIUDTMSEcAbPKrp"
STATES = sorted({state for _, state in CAPTURED}, key=lambda s: (s.in_stream, len(s.relations)))


@SETTINGS
@given(st.sampled_from([State(False, ()), *STATES]), st.binary(max_size=64))
def test_random_bytes_decode_or_raise_decode_error(state: State, data: bytes) -> None:
    decode_or_decode_error(state, data)


@SETTINGS
@given(st.sampled_from([State(False, ()), *STATES]), st.sampled_from(list(TYPE_BYTES)), st.binary(max_size=64))
def test_random_bodies_decode_or_raise_decode_error(state: State, kind: int, body: bytes) -> None:
    decode_or_decode_error(state, bytes([kind]) + body)


def mutate(data: bytes, position: int, value: int) -> bytes:
    position %= len(data)
    return data[:position] + bytes([value]) + data[position + 1 :]


@SETTINGS
@given(st.sampled_from(CAPTURED), st.integers(0, 2**16), u8s)
def test_mutated_captured_messages_decode_or_raise_decode_error(
    item: tuple[bytes, State], position: int, value: int
) -> None:
    data, state = item
    decode_or_decode_error(state, mutate(data, position, value))


def test_captured_messages_mutated_at_every_position() -> None:
    """Deterministic sweep: every byte of every short captured message, replaced by a few telling values."""
    for data, state in CAPTURED:
        if len(data) > 120:
            continue
        for position, original in enumerate(data):
            for value in {0x00, 0x01, 0x7F, 0x80, 0xFF, original ^ 0x01}:
                decode_or_decode_error(state, mutate(data, position, value))


@SETTINGS
@given(sessions(), st.data())
def test_mutated_encoded_messages_decode_or_raise_decode_error(
    session: list[tuple[Message, int]], data: st.DataObject
) -> None:
    decoder = decoder_for([m for m, _ in session])
    for msg, lsn in session:
        encoded = enc.encode(msg)
        mutated = mutate(encoded, data.draw(st.integers(0, len(encoded) - 1)), data.draw(u8s))
        decode_or_decode_error(state_of(decoder), mutated)
        decoder.decode(encoded, lsn)


# -- specific errors and their offsets -----------------------------------------------------------------------------

KNOWN = Relation(7, "public", "t", "d", (Column("id", 23, -1, True), Column("v", 25, -1, False)))
STREAM_XID = 1234


def known_state(in_stream: bool = False) -> State:
    return State(in_stream, ((KNOWN.relation_id, KNOWN),))


def raises(state: State, data: bytes) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        state.decoder().decode(data)
    check_error(info.value, data)
    return info.value


ROW = enc.tuple_data(("1", "x"))
Builder = Callable[[int], bytes]
UNKNOWN_RELATION_CASES: list[tuple[str, Builder]] = [
    ("Insert", lambda rel: b"I" + enc.u32(rel) + b"N" + ROW),
    ("Update", lambda rel: b"U" + enc.u32(rel) + b"N" + ROW),
    ("Update", lambda rel: b"U" + enc.u32(rel) + b"K" + ROW + b"N" + ROW),
    ("Delete", lambda rel: b"D" + enc.u32(rel) + b"O" + ROW),
]


@pytest.mark.parametrize(("name", "build"), UNKNOWN_RELATION_CASES)
@pytest.mark.parametrize("in_stream", [False, True])
def test_unknown_relation_id(name: str, build: Builder, in_stream: bool) -> None:
    data = build(99)
    if in_stream:
        data = data[:1] + enc.u32(STREAM_XID) + data[1:]
    error = raises(known_state(in_stream), data)
    assert (error.message_type, error.offset) == (name, 5 if in_stream else 1)
    assert "99" in error.reason
    known = build(KNOWN.relation_id)
    if in_stream:
        known = known[:1] + enc.u32(STREAM_XID) + known[1:]
    assert isinstance(known_state(in_stream).decoder().decode(known), RowChange)


@pytest.mark.parametrize("in_stream", [False, True])
def test_unknown_relation_id_in_truncate(in_stream: bool) -> None:
    xid = enc.u32(STREAM_XID) if in_stream else b""
    data = b"T" + xid + enc.i32(2) + enc.u8(3) + enc.u32(KNOWN.relation_id) + enc.u32(99)
    error = raises(known_state(in_stream), data)
    assert (error.message_type, error.offset) == ("Truncate", len(data) - 4)


def test_change_before_any_relation_message() -> None:
    error = raises(State(False, ()), b"I" + enc.u32(KNOWN.relation_id) + b"N" + ROW)
    assert (error.message_type, error.offset) == ("Insert", 1)


KNOWN_TYPES = frozenset(TYPE_BYTES)


@settings(max_examples=256, deadline=None)
@given(st.integers(0, 255).filter(lambda b: b not in KNOWN_TYPES), st.binary(max_size=16))
def test_unknown_message_type_byte(kind: int, body: bytes) -> None:
    data = bytes([kind]) + body
    error = raises(known_state(), data)
    assert error.offset == 0
    assert f"{kind:#04x}" in error.message_type


def test_empty_message() -> None:
    assert raises(State(False, ()), b"").offset == 0


BAD_KINDS = [b for b in range(256) if b not in b"ntub"]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(BAD_KINDS), st.sampled_from(["insert", "update-new", "update-old", "delete"]), st.booleans())
def test_bad_tuple_kind_byte(kind: int, where: str, in_stream: bool) -> None:
    bad_row = enc.i16(2) + b"t" + enc.i32(3) + b"abc" + bytes([kind])  # the second column's kind is bad
    head = enc.u32(STREAM_XID) if in_stream else b""
    head += enc.u32(KNOWN.relation_id)
    if where == "insert":
        data = b"I" + head + b"N" + bad_row + b"n"
        name, offset = "Insert", 1 + len(head) + 1 + 2 + 1 + 4 + 3
    elif where == "update-new":
        data = b"U" + head + b"K" + ROW + b"N" + bad_row + b"n"
        name, offset = "Update", 1 + len(head) + 1 + len(ROW) + 1 + 2 + 1 + 4 + 3
    elif where == "update-old":
        data = b"U" + head + b"O" + bad_row + b"n" + b"N" + ROW
        name, offset = "Update", 1 + len(head) + 1 + 2 + 1 + 4 + 3
    else:
        data = b"D" + head + b"K" + bad_row + b"n"
        name, offset = "Delete", 1 + len(head) + 1 + 2 + 1 + 4 + 3
    assert data[offset] == kind
    error = raises(known_state(in_stream), data)
    assert (error.message_type, error.offset) == (name, offset)


@pytest.mark.parametrize(
    ("data", "offset"),
    [
        (b"I" + enc.u32(KNOWN.relation_id) + b"K" + ROW, 5),  # an Insert has only a new tuple
        (b"U" + enc.u32(KNOWN.relation_id) + b"X" + ROW, 5),
        (b"D" + enc.u32(KNOWN.relation_id) + b"N" + ROW, 5),  # a Delete has only an old tuple
        (b"U" + enc.u32(KNOWN.relation_id) + b"K" + ROW + b"O" + ROW, 5 + len(ROW) + 1),  # never both K and O
    ],
)
def test_bad_tuple_part_byte(data: bytes, offset: int) -> None:
    assert raises(known_state(), data).offset == offset


def test_tuple_with_wrong_column_count() -> None:
    data = b"I" + enc.u32(KNOWN.relation_id) + b"N" + enc.tuple_data(("1",))
    error = raises(known_state(), data)
    assert error.message_type == "Insert"


def test_bad_replica_identity() -> None:
    data = enc.encode(KNOWN)
    position = 1 + 4 + len(b"public\0") + len(b"t\0")
    assert data[position : position + 1] == b"d"
    error = raises(State(False, ()), data[:position] + b"x" + data[position + 1 :])
    assert (error.message_type, error.offset) == ("Relation", position)


def test_trailing_bytes() -> None:
    for msg in (Begin(1, 2, 3), StreamStop(), Origin(5, "o"), KNOWN):
        data = enc.encode(msg) + b"\0"
        error = raises(State(isinstance(msg, StreamStop), ()), data)
        assert error.offset == len(data) - 1


# -- streaming mode and failed messages ----------------------------------------------------------------------------


def test_stream_abort_layout_follows_the_streaming_mode() -> None:
    short = b"A" + enc.u32(5) + enc.u32(6)
    long = short + enc.u64(7) + enc.i64(8)
    assert Decoder(stage=STAGE).decode(short) == StreamAbort(5, 6)
    assert Decoder(parallel_streaming=True, stage=STAGE).decode(long) == StreamAbort(5, 6, 7, 8)
    with pytest.raises(DecodeError, match="truncated: abort LSN") as info:
        Decoder(parallel_streaming=True, stage=STAGE).decode(short)
    assert info.value.offset == 9
    with pytest.raises(DecodeError, match="16 unexpected trailing bytes"):
        Decoder(stage=STAGE).decode(long)


def test_a_rejected_message_leaves_the_decoder_state_unchanged() -> None:
    decoder = Decoder(stage=STAGE)
    with pytest.raises(DecodeError, match="trailing"):
        decoder.decode(enc.encode(KNOWN) + b"\x00")
    assert decoder.relations == {}
    with pytest.raises(DecodeError, match="trailing"):
        decoder.decode(enc.encode(StreamStart(1, True)) + b"\x00")
    assert not decoder.in_stream
