"""Transaction assembly: ordering, streamed buffering, (sub)transaction aborts, two-phase, spill to disk."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cdcd.assembly import Assembler, AssemblyError, BufferPool
from cdcd.assembly.buffer import VALUE_OVERHEAD, change_cost
from cdcd.batches import Transaction
from cdcd.pgoutput.messages import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    LogicalMessage,
    Message,
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
)

REL = Relation(16384, "public", "t", "d", (Column("id", 23, -1, True), Column("v", 25, -1, False)))


def ins(i: int, xid: int | None = None) -> RowChange:
    return RowChange("insert", REL, None, (str(i), f"v{i}"), False, xid, 1000 + i, 30)


def ids(txn: Transaction) -> list[int]:
    out = []
    for change in txn.changes():
        assert isinstance(change, RowChange)
        assert change.new is not None
        out.append(int(str(change.new[0])))
    return out


def feed_all(assembler: Assembler, messages: list[Message]) -> list[Transaction | LogicalMessage]:
    events = []
    for message in messages:
        event = assembler.feed(message)
        if event is not None:
            events.append(event)
    return events


@pytest.fixture
def pool(tmp_path: Path) -> BufferPool:
    return BufferPool(memory_limit=1 << 30, spill_dir=tmp_path)


def test_plain_transactions_emitted_at_commit_in_order(pool: BufferPool) -> None:
    a = Assembler(pool)
    assert a.feed(Begin(500, 1, 10)) is None
    assert a.feed(ins(1)) is None
    assert a.in_transaction
    (t1,) = feed_all(a, [ins(2), Commit(0, 500, 510, 7)])
    (t2,) = feed_all(a, [Begin(600, 2, 11), ins(3), Commit(0, 600, 610, 8)])
    assert isinstance(t1, Transaction)
    assert isinstance(t2, Transaction)
    assert (t1.xid, t1.commit_lsn, t1.end_lsn, t1.commit_time, t1.streamed) == (10, 500, 510, 7, False)
    assert ids(t1) == [1, 2]
    assert ids(t2) == [3]
    assert not a.in_transaction
    assert pool.memory_bytes == 0
    assert pool.open_buffers == 0


def test_commit_lsn_must_match_begin(pool: BufferPool) -> None:
    a = Assembler(pool)
    a.feed(Begin(500, 1, 10))
    with pytest.raises(AssemblyError, match="differs from the final LSN"):
        a.feed(Commit(0, 501, 510, 7))


def test_non_transactional_message_passes_through(pool: BufferPool) -> None:
    message = LogicalMessage(False, 42, "p", b"x")
    assert Assembler(pool).feed(message) is message


def test_transactional_message_is_buffered(pool: BufferPool) -> None:
    a = Assembler(pool)
    message = LogicalMessage(True, 42, "p", b"x")
    (txn,) = feed_all(a, [Begin(9, 0, 1), message, Commit(0, 9, 10, 0)])
    assert isinstance(txn, Transaction)
    assert list(txn.changes()) == [message]


def stream(xid: int, first: bool, *changes: RowChange) -> list[Message]:
    return [StreamStart(xid, first), *changes, StreamStop()]


def test_interleaved_streams_emitted_whole_at_stream_commit(pool: BufferPool) -> None:
    a = Assembler(pool)
    messages: list[Message] = [
        *stream(100, True, ins(1, 100), ins(2, 100)),
        *stream(200, True, ins(10, 200)),
        *stream(100, False, ins(3, 100)),
        # a plain transaction committed between stream blocks is emitted at once
        Begin(700, 0, 300),
        ins(50),
        Commit(0, 700, 710, 0),
        *stream(200, False, ins(11, 200)),
        StreamCommit(200, 0, 800, 810, 5),
        StreamCommit(100, 0, 900, 910, 6),
    ]
    events = feed_all(a, messages)
    assert [(e.xid, e.streamed) for e in events if isinstance(e, Transaction)] == [
        (300, False),
        (200, True),
        (100, True),
    ]
    assert [ids(e) for e in events if isinstance(e, Transaction)] == [[50], [10, 11], [1, 2, 3]]
    assert a.open_streams == 0


def test_stream_abort_whole_transaction(pool: BufferPool) -> None:
    a = Assembler(pool)
    feed_all(a, stream(100, True, ins(1, 100)))
    assert a.feed(StreamAbort(100, 100)) is None
    assert a.open_streams == 0
    assert a.aborted_transactions == 1
    assert pool.memory_bytes == 0


def test_stream_abort_subtransaction_drops_it_and_what_followed(pool: BufferPool) -> None:
    # BEGIN; insert 1; SAVEPOINT a (xid 101); insert 2; SAVEPOINT b (102); insert 3; RELEASE b; insert 4;
    # ROLLBACK TO a -> subxacts 102 and 101 aborted; then insert 5 in the top level; COMMIT.
    a = Assembler(pool)
    feed_all(a, stream(100, True, ins(1, 100), ins(2, 101), ins(3, 102), ins(4, 101)))
    a.feed(StreamAbort(100, 102))
    a.feed(StreamAbort(100, 101))
    feed_all(a, stream(100, False, ins(5, 100)))
    (txn,) = feed_all(a, [StreamCommit(100, 0, 900, 910, 0)])
    assert isinstance(txn, Transaction)
    assert ids(txn) == [1, 5]
    assert a.aborted_subtransactions == 2


def test_stream_abort_of_subtransaction_that_wrote_nothing_keeps_everything(pool: BufferPool) -> None:
    a = Assembler(pool)
    feed_all(a, stream(100, True, ins(1, 100)))
    a.feed(StreamAbort(100, 555))
    (txn,) = feed_all(a, [StreamCommit(100, 0, 900, 910, 0)])
    assert isinstance(txn, Transaction)
    assert ids(txn) == [1]
    assert a.aborted_subtransactions == 0


def test_stream_abort_for_unknown_xid_is_ignored(pool: BufferPool) -> None:
    assert Assembler(pool).feed(StreamAbort(7, 7, 99, 99)) is None


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ([ins(1)], "outside any transaction"),
        ([Commit(0, 1, 2, 3)], "Commit without a Begin"),
        ([Begin(1, 0, 1), Begin(2, 0, 2)], "still open"),
        ([StreamStart(1, False)], "first segment was never received"),
        ([StreamStop()], "Stream Stop without Stream Start"),
        ([StreamCommit(1, 0, 1, 2, 0)], "never streamed"),
        ([StreamStart(1, True), StreamCommit(1, 0, 1, 2, 0)], "inside a streamed block"),
        ([CommitPrepared(0, 1, 2, 3, 4, "g")], "were not received"),
    ],
)
def test_protocol_order_violations_raise(pool: BufferPool, messages: list[Message], error: str) -> None:
    a = Assembler(pool)
    with pytest.raises(AssemblyError, match=error):
        feed_all(a, messages)


def test_two_phase_commit_and_rollback(pool: BufferPool) -> None:
    a = Assembler(pool)
    feed_all(a, [BeginPrepare(100, 110, 0, 5, "g1"), ins(1), Prepare(0, 100, 110, 0, 5, "g1")])
    feed_all(a, [BeginPrepare(200, 210, 0, 6, "g2"), ins(2), Prepare(0, 200, 210, 0, 6, "g2")])
    assert a.feed(RollbackPrepared(0, 210, 220, 0, 0, 6, "g2")) is None
    (txn,) = feed_all(a, [CommitPrepared(0, 300, 310, 9, 5, "g1")])
    assert isinstance(txn, Transaction)
    assert (txn.gid, txn.commit_lsn, txn.end_lsn) == ("g1", 300, 310)
    assert ids(txn) == [1]


def test_stream_prepare_then_commit_prepared(pool: BufferPool) -> None:
    a = Assembler(pool)
    feed_all(a, [*stream(100, True, ins(1, 100)), StreamPrepare(0, 100, 110, 0, 100, "sg")])
    assert a.open_streams == 0
    (txn,) = feed_all(a, [CommitPrepared(0, 300, 310, 9, 100, "sg")])
    assert isinstance(txn, Transaction)
    assert ids(txn) == [1]


def test_truncate_is_buffered_in_the_transaction(pool: BufferPool) -> None:
    a = Assembler(pool)
    truncate = Truncate((REL,), True, False, None, 77)
    (txn,) = feed_all(a, [Begin(9, 0, 1), truncate, Commit(0, 9, 10, 0)])
    assert isinstance(txn, Transaction)
    assert list(txn.changes()) == [truncate]


# -- spilling --------------------------------------------------------------------------------------


def big_stream_txn(a: Assembler, n: int) -> None:
    a.feed(StreamStart(100, True))
    for i in range(n):
        a.feed(ins(i, 100 if i % 3 else 101 + i // 3))  # a new subxact every third row
    a.feed(StreamStop())


def test_memory_limit_spills_to_disk_and_replays_in_order(tmp_path: Path) -> None:
    pool = BufferPool(memory_limit=20_000, spill_dir=tmp_path)
    a = Assembler(pool)
    big_stream_txn(a, 1000)
    assert pool.memory_bytes <= 20_000
    assert pool.spilled_bytes > 0
    spill_files = list(tmp_path.rglob("*.spill"))
    assert len(spill_files) == 1
    (txn,) = feed_all(a, [StreamCommit(100, 0, 900, 910, 0)])
    assert isinstance(txn, Transaction)
    assert ids(txn) == list(range(1000))
    assert list(tmp_path.rglob("*.spill")) == []
    assert pool.spilled_bytes == 0
    assert pool.memory_bytes == 0


@pytest.mark.parametrize("abort_at", [3, 300, 990])  # in the spilled part and in the in-memory part
def test_subtransaction_abort_truncates_spill_file(tmp_path: Path, abort_at: int) -> None:
    pool = BufferPool(memory_limit=20_000, spill_dir=tmp_path)
    a = Assembler(pool)
    big_stream_txn(a, 1000)
    subxid = 101 + abort_at // 3  # row abort_at is the first of this subxact
    a.feed(StreamAbort(100, subxid))
    feed_all(a, stream(100, False, ins(5000, 100)))
    (txn,) = feed_all(a, [StreamCommit(100, 0, 900, 910, 0)])
    assert isinstance(txn, Transaction)
    assert ids(txn) == [*range(abort_at), 5000]


def test_abort_deletes_spill_file(tmp_path: Path) -> None:
    pool = BufferPool(memory_limit=1_000, spill_dir=tmp_path)
    a = Assembler(pool)
    big_stream_txn(a, 100)
    assert list(tmp_path.rglob("*.spill"))
    a.feed(StreamAbort(100, 100))
    assert list(tmp_path.rglob("*.spill")) == []
    assert (pool.memory_bytes, pool.spilled_bytes) == (0, 0)


def test_largest_buffer_is_spilled_first(tmp_path: Path) -> None:
    pool = BufferPool(memory_limit=5 * change_cost(ins(0)), spill_dir=tmp_path)
    a = Assembler(pool)
    feed_all(a, stream(1, True, ins(1, 1)))
    feed_all(a, stream(2, True, *(ins(i, 2) for i in range(10))))
    assert len(list(tmp_path.rglob("cdcd-xid2-*.spill"))) == 1
    assert list(tmp_path.rglob("cdcd-xid1-*.spill")) == []


def test_spill_preserves_every_value_kind(tmp_path: Path) -> None:
    pool = BufferPool(memory_limit=0, spill_dir=tmp_path)
    a = Assembler(pool)
    rel2 = Relation(16385, "s", "u", "f", (Column("a", 17, -1, False), Column("b", 25, -1, False)))
    changes: list[RowChange | Truncate | LogicalMessage] = [
        RowChange("update", REL, ("1", None), ("1", UNCHANGED_TOAST), False, 100, 5, 40),
        RowChange("delete", rel2, (b"\x00\xff", "é"), None, True, 101, 6, 40),
        Truncate((REL, rel2), True, True, 100, 7),
        LogicalMessage(True, 8, "pfx", b"\x00content", 100),
    ]
    a.feed(StreamStart(100, True))
    for change in changes:
        a.feed(change)
    a.feed(StreamStop())
    (txn,) = feed_all(a, [StreamCommit(100, 0, 900, 910, 0)])
    assert isinstance(txn, Transaction)
    replayed = list(txn.changes())
    assert replayed == changes
    assert replayed[1].relation is rel2  # type: ignore[union-attr]


def test_reset_releases_everything(tmp_path: Path) -> None:
    pool = BufferPool(memory_limit=0, spill_dir=tmp_path)
    a = Assembler(pool)
    big_stream_txn(a, 10)
    a.feed(Begin(1, 0, 7))
    a.feed(ins(1))
    a.reset()
    assert (pool.memory_bytes, pool.spilled_bytes, pool.open_buffers) == (0, 0, 0)
    assert list(tmp_path.rglob("*.spill")) == []
    assert not a.in_transaction


def _deep_size(obj: object, seen: set[int]) -> int:
    if id(obj) in seen or obj is None or obj is ... or isinstance(obj, Relation):
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, tuple | list):
        size += sum(_deep_size(item, seen) for item in obj)
    elif isinstance(obj, RowChange):
        size += sum(_deep_size(getattr(obj, f), seen) for f in ("old", "new", "op", "wal_lsn", "size", "xid"))
    return size


def test_memory_accounting_covers_the_real_object_size() -> None:
    """The budget counts at least what the change objects really occupy (so the limit is a real bound)."""
    row = tuple(f"value-{i:04d}" for i in range(20))
    relation = Relation(1, "s", "t", "d", tuple(Column(f"c{i}", 25, -1, i == 0) for i in range(20)))
    wire_size = 1 + 4 + 1 + 2 + sum(1 + 4 + len(v) for v in row)
    change = RowChange("insert", relation, None, row, False, None, 0, wire_size)
    container = [(None, change)]
    real = _deep_size(change, set()) + sys.getsizeof(container[0]) + 8
    assert change_cost(change) >= real
    assert change_cost(change) < 2 * real  # and does not overstate it wildly
    assert VALUE_OVERHEAD > 0


@pytest.mark.parametrize("batch", [4096, 100])  # one batch per spill, or several
@pytest.mark.parametrize("abort_at", [0, 1, 99, 100, 101, 650, 999, 1100])
def test_subtransaction_abort_inside_large_spill_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: int, abort_at: int
) -> None:
    monkeypatch.setattr("cdcd.assembly.buffer.SPILL_BATCH", batch)
    pool = BufferPool(memory_limit=1000 * change_cost(ins(0)) - 1, spill_dir=tmp_path)
    a = Assembler(pool)
    big_stream_txn(a, 1200)  # the 1000th change spills the first 1000 at once; 200 stay in memory
    assert pool.spilled_bytes > 0
    a.feed(StreamAbort(100, 101 + abort_at // 3))
    feed_all(a, stream(100, False, ins(5000, 100)))
    (txn,) = feed_all(a, [StreamCommit(100, 0, 900, 910, 0)])
    assert isinstance(txn, Transaction)
    first_of_subxact = abort_at - abort_at % 3  # row 3k is the first change of subxid 101 + k
    assert ids(txn) == [*range(first_of_subxact), 5000]
