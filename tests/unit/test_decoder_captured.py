"""The decoder against pgoutput bytes captured from real servers (tests/capture_pgoutput.py, fixtures/pgoutput/).

Every captured stream is decoded in order with one Decoder per (protocol, scenario), and the decoded values are
compared with what the capture workload did, built from the workload constants of the capture module. Relation and
Type messages are compared with the catalog rows the capture recorded. A fixture that is absent is simply not
parametrized; nothing is skipped.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import pytest

from cdcd.pgoutput import Decoder
from cdcd.pgoutput.messages import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    LogicalMessage,
    Message,
    Origin,
    Prepare,
    Relation,
    RollbackPrepared,
    RowChange,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Value,
)
from cdcd.rowstage import STAGE
from tests.capture_pgoutput import (
    BULK,
    CHILD,
    CHILD_ROWS,
    DOC_NEW_TITLE,
    DOC_ROW,
    DOCS,
    ENUM_TABLES,
    ENUM_TYPE,
    EVENTS,
    FULL_ROW,
    FULL_ROW_NEW_AMOUNT,
    FULL_ROWS,
    GID_COMMIT,
    GID_ROLLBACK,
    GID_STREAM,
    ITEM_DELETE_ID,
    ITEM_PK_CHANGE,
    ITEM_QTY_UPDATE,
    ITEM_ROWS,
    ITEM_WITH_MESSAGE,
    ITEMS,
    NONTX_MESSAGE,
    ORIGIN_ITEM,
    ORIGIN_LSN,
    ORIGIN_NAME,
    ORIGIN_TIMESTAMP,
    PARENT,
    PARENT_NAMES,
    SAVEPOINT_SUB_IDS,
    SAVEPOINT_TAIL_IDS,
    SAVEPOINT_TOP_IDS,
    SCHEMA,
    SCRATCH,
    STREAM_ABORT_IDS,
    STREAM_COMMIT_DELETE_ID,
    STREAM_COMMIT_IDS,
    STREAM_COMMIT_UPDATE,
    STREAM_MESSAGE,
    STREAM_PREPARE_IDS,
    TWOPHASE_ROWS,
    TX_MESSAGE,
    CaptureInfo,
    Fixture,
    FixtureMessage,
    Row,
    Table,
    bulk_row,
    fixture_paths,
    load_fixture,
    max_proto_version,
    pg_timestamp_us,
    scenarios_for,
)

FIXTURES = [load_fixture(path) for path in fixture_paths()]

# Every message type each protocol version must have been captured with.
REQUIRED_TYPES: dict[int, frozenset[str]] = {1: frozenset("BCORYIUDTM")}
REQUIRED_TYPES[2] = REQUIRED_TYPES[1] | frozenset("SEcA")
REQUIRED_TYPES[3] = REQUIRED_TYPES[2] | frozenset("bPKrp")
REQUIRED_TYPES[4] = REQUIRED_TYPES[3]


@dataclass(frozen=True)
class Decoded:
    row: FixtureMessage
    msg: Message


def decode_capture(fx: Fixture, proto: int, scenario: str) -> list[Decoded]:
    decoder = Decoder(
        parallel_streaming=fx.capture(proto, scenario).options.get("streaming") == "parallel", stage=STAGE
    )
    return [Decoded(m, decoder.decode(m.data, m.lsn)) for m in fx.stream(proto, scenario)]


# -- expected values, from the workload constants ------------------------------------------------------------------


def render(kind: str, value: int | str | bool | None, binary: bool) -> Value:
    """The TupleData value PostgreSQL sends for a workload value: text output, or the binary send format."""
    if value is None:
        return None
    if isinstance(value, bool):
        assert kind == "bool"
        return (b"\x01" if value else b"\x00") if binary else ("t" if value else "f")
    if isinstance(value, int):
        if binary:
            return struct.pack(">i" if kind == "int4" else ">q", value)
        return str(value)
    assert kind == "text"
    return value.encode() if binary else value


def row_of(table: Table, values: Row, binary: bool = False) -> tuple[Value, ...]:
    assert len(values) == len(table.columns)
    return tuple(render(c.kind, v, binary) for c, v in zip(table.columns, values, strict=True))


def key_of(table: Table, values: Row, binary: bool = False) -> tuple[Value, ...]:
    """A 'K' tuple: the primary key columns, every other column NULL."""
    return tuple(
        render(c.kind, v, binary) if "PRIMARY KEY" in c.sql_type else None
        for c, v in zip(table.columns, values, strict=True)
    )


def with_value(table: Table, values: Row, column: str, value: int | str | bool | None) -> Row:
    index = table.column_names.index(column)
    return (*values[:index], value, *values[index + 1 :])


Event = tuple[object, ...]


def event(msg: Message) -> Event | None:
    """A decoded message as a comparable tuple; schema messages (checked separately) give None."""
    if isinstance(msg, Begin):
        return ("begin",)
    if isinstance(msg, Commit):
        return ("commit",)
    if isinstance(msg, Origin):
        return ("origin", msg.name, msg.commit_lsn)
    if isinstance(msg, RowChange):
        old_kind = None if msg.old is None else "K" if msg.old_is_key else "O"
        if msg.op == "insert":
            assert msg.old is None
            return ("insert", msg.relation.name, msg.new)
        if msg.op == "update":
            return ("update", msg.relation.name, old_kind, msg.old, msg.new)
        assert msg.new is None
        return ("delete", msg.relation.name, old_kind, msg.old)
    if isinstance(msg, Truncate):
        return ("truncate", frozenset(r.name for r in msg.relations), msg.cascade, msg.restart_identity)
    if isinstance(msg, LogicalMessage):
        return ("message", msg.transactional, msg.prefix, msg.content)
    if isinstance(msg, BeginPrepare):
        return ("begin prepare", msg.gid)
    if isinstance(msg, Prepare):
        return ("prepare", msg.gid)
    if isinstance(msg, CommitPrepared):
        return ("commit prepared", msg.gid)
    if isinstance(msg, RollbackPrepared):
        return ("rollback prepared", msg.gid)
    if isinstance(msg, Relation | Type):
        return None
    raise AssertionError(f"unexpected message outside a stream: {msg!r}")


def events(decoded: Iterable[Decoded]) -> list[Event]:
    return [e for e in (event(d.msg) for d in decoded) if e is not None]


def insert(table: Table, values: Row, binary: bool = False) -> Event:
    return ("insert", table.name, row_of(table, values, binary))


def expected_basic(binary: bool) -> list[Event]:
    def row(table: Table, values: Row) -> tuple[Value, ...]:
        return row_of(table, values, binary)

    item1, item2 = ITEM_ROWS
    qty_id, qty = ITEM_QTY_UPDATE
    assert item1[0] == qty_id
    old_id, new_id = ITEM_PK_CHANGE
    assert item2[0] == old_id
    item2_moved = with_value(ITEMS, item2, "id", new_id)
    assert new_id == ITEM_DELETE_ID
    full_new = with_value(FULL_ROWS, FULL_ROW, "amount", FULL_ROW_NEW_AMOUNT)
    doc_new = (*row(DOCS, with_value(DOCS, DOC_ROW, "title", DOC_NEW_TITLE))[:-1], UNCHANGED_TOAST)
    parents = [(i, name) for i, name in enumerate(PARENT_NAMES, start=1)]  # fresh bigserial: 1, 2, ...
    children = [(i, parent_id, name) for i, (parent_id, name) in enumerate(CHILD_ROWS, start=1)]
    b, c = ("begin",), ("commit",)
    return [
        *(b, insert(ITEMS, item1, binary), insert(ITEMS, item2, binary), c),
        *(b, ("update", "items", None, None, row(ITEMS, with_value(ITEMS, item1, "qty", qty))), c),
        *(b, ("update", "items", "K", key_of(ITEMS, item2, binary), row(ITEMS, item2_moved)), c),
        *(b, ("delete", "items", "K", key_of(ITEMS, item2_moved, binary)), c),
        b,
        insert(FULL_ROWS, FULL_ROW, binary),
        ("update", "full_rows", "O", row(FULL_ROWS, FULL_ROW), row(FULL_ROWS, full_new)),
        ("delete", "full_rows", "O", row(FULL_ROWS, full_new)),
        c,
        *(b, insert(DOCS, DOC_ROW, binary), c),
        *(b, ("update", "docs", None, None, doc_new), c),
        *(b, *(insert(PARENT, p, binary) for p in parents), *(insert(CHILD, ch, binary) for ch in children), c),
        *(b, ("truncate", frozenset({"parent", "child"}), True, True), c),
        *(b, ("truncate", frozenset({"full_rows"}), False, False), c),
        *(b, insert(ITEMS, ITEM_WITH_MESSAGE, binary), ("message", True, *TX_MESSAGE), c),
        ("message", False, *NONTX_MESSAGE),
        *(b, ("origin", ORIGIN_NAME, ORIGIN_LSN), insert(ITEMS, ORIGIN_ITEM, binary), c),
    ]


# -- checks shared by the scenarios --------------------------------------------------------------------------------


def check_schema(fx: Fixture, decoded: Sequence[Decoded]) -> None:
    """Relation and Type messages match the catalog; changes are bound to the latest Relation of their table."""
    latest: dict[int, Relation] = {}
    stream_xid: int | None = None
    for i, d in enumerate(decoded):
        msg = d.msg
        if isinstance(msg, StreamStart):
            stream_xid = msg.xid
        elif isinstance(msg, StreamStop):
            stream_xid = None
        elif isinstance(msg, Type):
            assert (msg.type_oid, msg.schema, msg.name, msg.xid) == (fx.types[ENUM_TYPE], SCHEMA, ENUM_TYPE, stream_xid)
            following = decoded[i + 1].msg
            assert isinstance(following, Relation), "a Type message precedes the Relation that uses the type"
            assert fx.types[ENUM_TYPE] in {col.type_oid for col in following.columns}
        elif isinstance(msg, Relation):
            info = fx.relations[msg.name]
            assert msg.relation_id == info.oid
            assert (msg.schema, msg.replica_identity, msg.xid) == (SCHEMA, info.replica_identity, stream_xid)
            expected = tuple(Column(*col) for col in info.columns)
            if info.replica_identity == "f":  # pgoutput flags every column; the decoder keeps none without `keys`
                assert all(c.is_key for c in expected)
                expected = tuple(replace(c, is_key=False) for c in expected)
            assert msg.columns == expected
            if msg.name in ENUM_TABLES:
                previous = decoded[i - 1].msg
                assert isinstance(previous, Type), f"no Type message before the Relation of {msg.name}"
            latest[msg.relation_id] = msg
        elif isinstance(msg, RowChange):
            assert msg.relation is latest[msg.relation.relation_id]
            assert msg.wal_lsn == d.row.lsn
            assert msg.size == len(d.row.data)
            # inside a stream a change carries the xid of its (sub)transaction: the scenarios check which
            assert (msg.xid is None) == (stream_xid is None)
        elif isinstance(msg, Truncate):
            assert all(r is latest[r.relation_id] for r in msg.relations)
            assert (msg.xid is None) == (stream_xid is None)
        elif isinstance(msg, LogicalMessage):
            assert msg.lsn == d.row.lsn, "a Message row is reported at the message's own LSN"
            assert (msg.xid is None) == (stream_xid is None or not msg.transactional)


def check_transactions(decoded: Sequence[Decoded]) -> None:
    """Begin/Commit pairs agree with each other and with the capture's xid column."""
    begin: Begin | None = None
    for d in decoded:
        msg = d.msg
        if isinstance(msg, Begin):
            assert begin is None
            begin = msg
            assert msg.xid == d.row.xid
        elif isinstance(msg, Commit):
            assert begin is not None
            assert msg.flags == 0
            assert msg.commit_lsn == begin.final_lsn
            assert msg.end_lsn == d.row.lsn > msg.commit_lsn
            assert msg.commit_time == begin.commit_time
            assert d.row.xid == begin.xid
            begin = None
        elif begin is not None:
            assert d.row.xid == begin.xid


@dataclass
class Streamed:
    """A streamed capture split into stream blocks and the messages between them."""

    starts: list[StreamStart]
    blocks: list[list[Decoded]]
    outside: list[Decoded]

    @property
    def changes(self) -> list[tuple[int, RowChange | Truncate | LogicalMessage]]:
        """In-block changes with the index of their block."""
        return [
            (i, d.msg)
            for i, block in enumerate(self.blocks)
            for d in block
            if isinstance(d.msg, RowChange | Truncate | LogicalMessage)
        ]


def split_streamed(decoded: Sequence[Decoded]) -> Streamed:
    result = Streamed([], [], [])
    block: list[Decoded] | None = None
    for d in decoded:
        msg = d.msg
        assert not isinstance(msg, Begin | Commit), "no Begin/Commit around a streamed transaction"
        if isinstance(msg, StreamStart):
            assert block is None
            result.starts.append(msg)
            block = []
        elif isinstance(msg, StreamStop):
            assert block is not None
            result.blocks.append(block)
            block = None
        elif block is not None:
            block.append(d)
        else:
            result.outside.append(d)
    assert block is None, "stream not closed"
    return result


def check_stream_starts(streamed: Streamed, xid: int, min_blocks: int = 2) -> None:
    assert len(streamed.blocks) >= min_blocks
    assert [s.xid for s in streamed.starts] == [xid] * len(streamed.starts)
    assert [s.first_segment for s in streamed.starts] == [True] + [False] * (len(streamed.starts) - 1)


def bulk_inserts(streamed: Streamed) -> list[tuple[int, int, RowChange]]:
    """(block, id, change) of the bulk-table inserts, checking each row's values against ``bulk_row``."""
    result = []
    for block, msg in streamed.changes:
        if isinstance(msg, RowChange) and msg.op == "insert" and msg.relation.name == BULK.name:
            assert msg.new is not None
            row_id = int(str(msg.new[0]))
            assert msg.new == row_of(BULK, bulk_row(row_id))
            result.append((block, row_id, msg))
    return result


def check_kept_ids(ids: list[int], expected: range) -> None:
    """The inserts kept in the fixture are in workload order, start with the first row, and are workload rows."""
    assert ids == sorted(set(ids))
    assert ids[0] == expected[0]
    assert set(ids) <= set(expected)


def check_abort_fields(abort: Decoded, capture: CaptureInfo, window: tuple[int, int], last_change_lsn: int) -> None:
    """Abort LSN and timestamp are sent with protocol 4 and streaming = parallel only."""
    msg = abort.msg
    assert isinstance(msg, StreamAbort)
    if capture.proto >= 4 and capture.options.get("streaming") == "parallel":
        assert msg.abort_lsn is not None
        assert msg.abort_time is not None
        assert msg.abort_lsn == abort.row.lsn > last_change_lsn, "the message is written at the abort's LSN"
        assert window[0] <= msg.abort_time <= window[1]
    else:
        assert (msg.abort_lsn, msg.abort_time) == (None, None)


# -- per-scenario checks -------------------------------------------------------------------------------------------


def check_basic(fx: Fixture, capture: CaptureInfo, decoded: list[Decoded]) -> None:
    binary = capture.options.get("binary") == "true"
    assert events(decoded) == expected_basic(binary)
    check_transactions(decoded)
    low, high = fx.workloads["basic"]
    begins = [d.msg for d in decoded if isinstance(d.msg, Begin)]
    origin_index = next(i for i, d in enumerate(decoded) if isinstance(d.msg, Origin))
    origin_begin = decoded[origin_index - 1].msg
    assert isinstance(origin_begin, Begin), "Origin follows its transaction's Begin"
    # A transaction replayed from an origin carries the origin's commit timestamp (pg_replication_origin_xact_setup)
    assert origin_begin.commit_time == pg_timestamp_us(ORIGIN_TIMESTAMP)
    for begin in begins:
        if begin is not origin_begin:
            assert low <= begin.commit_time <= high
    assert len({b.xid for b in begins}) == len(begins)
    assert [b.final_lsn for b in begins] == sorted(b.final_lsn for b in begins)


def check_stream_commit(fx: Fixture, capture: CaptureInfo, decoded: list[Decoded]) -> None:
    streamed = split_streamed(decoded)
    xid = streamed.starts[0].xid
    assert {d.row.xid for d in decoded} == {xid}
    check_stream_starts(streamed, xid)
    assert all(msg.xid == xid for _, msg in streamed.changes)
    inserts = bulk_inserts(streamed)
    check_kept_ids([i for _, i, _ in inserts], STREAM_COMMIT_IDS)
    assert len(inserts) + capture.elided_inserts.get(xid, 0) == len(STREAM_COMMIT_IDS)
    assert set(capture.elided_inserts) <= {xid}
    assert {block for block, _, _ in inserts} == set(range(len(streamed.blocks))), "each block starts with inserts"
    rest = [d for block in streamed.blocks for d in block if not isinstance(d.msg, RowChange) or d.msg.op != "insert"]
    update_id, update_v = STREAM_COMMIT_UPDATE
    first = bulk_row(update_id)
    deleted = bulk_row(STREAM_COMMIT_DELETE_ID)
    assert events(rest) == [
        ("update", BULK.name, None, None, row_of(BULK, with_value(BULK, first, "v", update_v))),
        ("delete", BULK.name, "K", key_of(BULK, deleted)),
        ("message", True, *STREAM_MESSAGE),
        ("truncate", frozenset({SCRATCH.name}), False, False),
    ]
    is_insert = [isinstance(msg, RowChange) and msg.op == "insert" for _, msg in streamed.changes]
    assert is_insert == sorted(is_insert, reverse=True), "the update, delete, message and truncate follow the inserts"
    [commit] = streamed.outside
    assert isinstance(commit.msg, StreamCommit)
    low, high = fx.workloads["stream_commit"]
    assert (commit.msg.xid, commit.msg.flags) == (xid, 0)
    assert commit.msg.end_lsn == commit.row.lsn > commit.msg.commit_lsn > max(m.wal_lsn for _, _, m in inserts)
    assert low <= commit.msg.commit_time <= high


def check_stream_abort(fx: Fixture, capture: CaptureInfo, decoded: list[Decoded]) -> None:
    streamed = split_streamed(decoded)
    # captured through walsender sessions: the xid column is the one the workload's transaction reported
    [xid] = {d.row.xid for d in decoded}
    check_stream_starts(streamed, xid)
    inserts = bulk_inserts(streamed)
    assert len(inserts) == len(streamed.changes), "only the bulk inserts were streamed"
    assert all(m.xid == xid for _, _, m in inserts)
    check_kept_ids([i for _, i, _ in inserts], STREAM_ABORT_IDS)
    assert len(inserts) + capture.elided_inserts.get(xid, 0) <= len(STREAM_ABORT_IDS)
    [abort_row] = streamed.outside
    abort = abort_row.msg
    assert isinstance(abort, StreamAbort)
    assert (abort.xid, abort.subxid) == (xid, xid), "a whole transaction aborted: subxid is the xid"
    check_abort_fields(abort_row, capture, fx.workloads["stream_abort"], max(m.wal_lsn for _, _, m in inserts))


def check_stream_savepoint(fx: Fixture, capture: CaptureInfo, decoded: list[Decoded]) -> None:
    streamed = split_streamed(decoded)
    xid = streamed.starts[0].xid
    check_stream_starts(streamed, xid)
    abort_index, commit_index = (i for i, d in enumerate(streamed.outside))
    abort, commit = streamed.outside[abort_index].msg, streamed.outside[commit_index].msg
    assert isinstance(abort, StreamAbort)
    assert isinstance(commit, StreamCommit)
    subxid = abort.subxid
    assert abort.xid == xid != subxid, "a rolled-back savepoint aborts the subtransaction only"
    assert commit.xid == xid
    all_inserts = bulk_inserts(streamed)
    assert len(all_inserts) == len(streamed.changes)
    assert {m.xid for _, _, m in all_inserts} == {xid, subxid}
    top = [(b, i) for b, i, m in all_inserts if m.xid == xid and i in SAVEPOINT_TOP_IDS]
    tail = [(b, i) for b, i, m in all_inserts if m.xid == xid and i in SAVEPOINT_TAIL_IDS]
    sub = [(b, i) for b, i, m in all_inserts if m.xid == subxid]
    assert len(top) + len(tail) == sum(1 for _, _, m in all_inserts if m.xid == xid)
    check_kept_ids([i for _, i in top], SAVEPOINT_TOP_IDS)
    check_kept_ids([i for _, i in sub], SAVEPOINT_SUB_IDS)
    assert [i for _, i in tail] == list(SAVEPOINT_TAIL_IDS)
    # the Stream Abort comes after the blocks holding subtransaction changes and before the tail's block
    blocks_before_abort = sum(
        1 for s in decoded[: decoded.index(streamed.outside[abort_index])] if isinstance(s.msg, StreamStop)
    )
    assert max(b for b, _ in top + sub) < blocks_before_abort <= min(b for b, _ in tail)
    assert len(top) + len(tail) + capture.elided_inserts.get(xid, 0) == len(SAVEPOINT_TOP_IDS) + len(SAVEPOINT_TAIL_IDS)
    assert len(sub) + capture.elided_inserts.get(subxid, 0) <= len(SAVEPOINT_SUB_IDS)
    window = fx.workloads["stream_savepoint"]
    last_sub_lsn = max(m.wal_lsn for _, _, m in all_inserts if m.xid == subxid)
    check_abort_fields(streamed.outside[abort_index], capture, window, last_sub_lsn)
    assert window[0] <= commit.commit_time <= window[1]
    assert commit.commit_lsn > max(m.wal_lsn for _, _, m in all_inserts)


def check_twophase(fx: Fixture, capture: CaptureInfo, decoded: list[Decoded]) -> None:
    row_commit, row_rollback = TWOPHASE_ROWS
    assert events(decoded) == [
        ("begin prepare", GID_COMMIT),
        insert(EVENTS, row_commit),
        ("prepare", GID_COMMIT),
        ("commit prepared", GID_COMMIT),
        ("begin prepare", GID_ROLLBACK),
        insert(EVENTS, row_rollback),
        ("prepare", GID_ROLLBACK),
        ("rollback prepared", GID_ROLLBACK),
    ]
    low, high = fx.workloads["twophase"]
    msgs = [d.msg for d in decoded if not isinstance(d.msg, Relation | Type)]
    bp1, _, p1, cp, bp2, _, p2, rp = msgs
    assert isinstance(bp1, BeginPrepare)
    assert isinstance(bp2, BeginPrepare)
    assert isinstance(p1, Prepare)
    assert isinstance(p2, Prepare)
    assert isinstance(cp, CommitPrepared)
    assert isinstance(rp, RollbackPrepared)
    assert bp1.xid == p1.xid == cp.xid != bp2.xid == p2.xid == rp.xid
    for d in decoded:
        assert d.row.xid in (bp1.xid, bp2.xid)
    for bp, p in ((bp1, p1), (bp2, p2)):
        assert (bp.prepare_lsn, bp.end_lsn, bp.prepare_time) == (p.prepare_lsn, p.end_lsn, p.prepare_time)
        assert p.flags == 0
        assert p.prepare_lsn < p.end_lsn
        assert low <= p.prepare_time <= high
    assert cp.flags == 0
    assert p1.end_lsn <= cp.commit_lsn < cp.end_lsn
    assert p1.prepare_time <= cp.commit_time <= high
    assert rp.flags == 0
    assert rp.prepare_end_lsn == p2.end_lsn < rp.rollback_end_lsn
    assert rp.prepare_time == p2.prepare_time <= rp.rollback_time <= high


def check_stream_prepare(fx: Fixture, capture: CaptureInfo, decoded: list[Decoded]) -> None:
    streamed = split_streamed(decoded)
    xid = streamed.starts[0].xid
    assert {d.row.xid for d in decoded} == {xid}
    check_stream_starts(streamed, xid)
    inserts = bulk_inserts(streamed)
    assert len(inserts) == len(streamed.changes)
    assert all(m.xid == xid for _, _, m in inserts)
    check_kept_ids([i for _, i, _ in inserts], STREAM_PREPARE_IDS)
    assert len(inserts) + capture.elided_inserts.get(xid, 0) == len(STREAM_PREPARE_IDS)
    prepare, commit = (d.msg for d in streamed.outside)
    assert isinstance(prepare, StreamPrepare)
    assert isinstance(commit, CommitPrepared)
    assert (prepare.xid, prepare.gid, prepare.flags) == (xid, GID_STREAM, 0)
    assert (commit.xid, commit.gid, commit.flags) == (xid, GID_STREAM, 0)
    assert max(m.wal_lsn for _, _, m in inserts) < prepare.prepare_lsn < prepare.end_lsn <= commit.commit_lsn
    low, high = fx.workloads["stream_prepare"]
    assert low <= prepare.prepare_time <= commit.commit_time <= high


CHECKS = {
    "basic": check_basic,
    "basic_binary": check_basic,
    "stream_commit": check_stream_commit,
    "stream_abort": check_stream_abort,
    "stream_abort_parallel": check_stream_abort,
    "stream_savepoint": check_stream_savepoint,
    "stream_savepoint_parallel": check_stream_savepoint,
    "twophase": check_twophase,
    "stream_prepare": check_stream_prepare,
}

CASES = [
    pytest.param(fx, capture, id=f"{fx.path.stem}-proto{capture.proto}-{capture.scenario}")
    for fx in FIXTURES
    for capture in fx.captures
]


@pytest.mark.parametrize(("fx", "capture"), CASES)
def test_captured_stream_decodes_to_the_workload(fx: Fixture, capture: CaptureInfo) -> None:
    decoded = decode_capture(fx, capture.proto, capture.scenario)
    check_schema(fx, decoded)
    CHECKS[capture.scenario](fx, capture, decoded)


@pytest.mark.parametrize("fx", [pytest.param(fx, id=fx.path.stem) for fx in FIXTURES])
def test_fixture_covers_every_message_type(fx: Fixture) -> None:
    assert fx.protos == tuple(range(1, max_proto_version(fx.server_version_num) + 1))
    assert f"pg{fx.server_version_num // 10_000}" == fx.path.stem
    for proto in fx.protos:
        assert {c.scenario for c in fx.captures if c.proto == proto} == set(scenarios_for(proto))
        kinds = {chr(m.data[0]) for m in fx.messages if m.proto == proto}
        assert kinds >= REQUIRED_TYPES[proto], f"proto {proto} lacks {sorted(REQUIRED_TYPES[proto] - kinds)}"
        decoded = [d.msg for c in fx.captures if c.proto == proto for d in decode_capture(fx, proto, c.scenario)]
        changes = [m for m in decoded if isinstance(m, RowChange)]
        values = [v for m in changes for row in (m.old, m.new) if row is not None for v in row]
        assert {type(v) for v in values} == {type(None), type(UNCHANGED_TOAST), str, bytes}  # n u t b
        assert {(m.op, None if m.old is None else m.old_is_key) for m in changes} == {
            ("insert", None),
            ("update", None),
            ("update", True),
            ("update", False),
            ("delete", True),
            ("delete", False),
        }
        truncates = {(m.cascade, m.restart_identity) for m in decoded if isinstance(m, Truncate)}
        assert {(True, True), (False, False)} <= truncates
        assert {m.transactional for m in decoded if isinstance(m, LogicalMessage)} == {True, False}
        aborts = [m for m in decoded if isinstance(m, StreamAbort)]
        if proto >= 2:
            assert {m.xid == m.subxid for m in aborts} == {True, False}
            assert {m.abort_lsn is not None for m in aborts} == ({True, False} if proto >= 4 else {False})
