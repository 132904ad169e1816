"""Changes encoded as they arrive (``EventShaper.early``): buffered in runs, spilled and read back, cut by
subtransaction aborts, decoded again for the stages that need values. Compiled only (the Python reference keeps
every change decoded); the records they make are compared with the core's in ``test_lane.py``."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from cdcd.assembly import Assembler, BufferPool
from cdcd.assembly.buffer import SPILL_BATCH
from cdcd.batches import Buffered, EncodedRun, Transaction, decoded, observed
from cdcd.pgoutput.messages import (
    Change,
    Column,
    Relation,
    RowChange,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
)
from cdcd.plan import Plans
from cdcd.rowstage import STAGE
from cdcd.shaping import EventShaper

REL = Relation(16384, "public", "t", "d", (Column("id", 23, -1, True), Column("v", 25, -1, False)))
OTHER = Relation(16385, "public", "u", "d", (Column("id", 23, -1, True), Column("v", 25, -1, False)))


class _Registry:
    def schema_id(self, subject: str, schema: object) -> int:
        return len(subject)

    def ensure_topic(self, topic: str) -> None:
        return None


def shaper() -> EventShaper:
    made = EventShaper("cdc", _Registry(), clock_us=lambda: 1_700_000_000_000_000)
    made.start_session("db", {}, Plans())
    return made


def ins(i: int, xid: int | None = None, relation: Relation = REL) -> tuple[RowChange, bytes]:
    """An Insert as the decoder gives it, and its pgoutput message."""
    values = (str(i), f"v{i}")
    message = (
        b"I" + (b"" if xid is None else struct.pack(">I", xid)) + struct.pack(">IcH", relation.relation_id, b"N", 2)
    )
    for v in values:
        message += b"t" + struct.pack(">i", len(v)) + v.encode()
    return RowChange("insert", relation, None, values, False, xid, 1000 + i, len(message)), message


def ids(items: list[Buffered]) -> list[int]:
    out = []
    for change in decoded(items):
        assert isinstance(change, RowChange)
        assert change.new is not None
        out.append(int(str(change.new[0])))
    return out


def big_stream_txn(a: Assembler, n: int) -> None:
    a.feed(StreamStart(100, True))
    for i in range(n):
        a.feed(*ins(i, 100 if i % 3 else 101 + i // 3))  # a new subxact every third row
    a.feed(StreamStop())


def commit(a: Assembler) -> Transaction:
    txn = a.feed(StreamCommit(100, 0, 900, 910, 0))
    assert isinstance(txn, Transaction)
    return txn


def runs(items: list[Buffered]) -> list[EncodedRun]:
    return [c for c in items if isinstance(c, EncodedRun)]


@pytest.fixture(autouse=True)
def _compiled() -> None:
    assert STAGE.rows is not None, "test_encoded.py tests the compiled module (CDCD_IMPL=native)"


def test_changes_are_kept_in_runs_and_decoded_again_as_they_came(tmp_path: Path) -> None:
    pool = BufferPool(1 << 20, tmp_path)
    a = Assembler(pool, shaper().early)
    big_stream_txn(a, 10_000)
    items = list(commit(a).changes())
    made = runs(items)
    assert [r.count for r in made] == [SPILL_BATCH, SPILL_BATCH, 10_000 - 2 * SPILL_BATCH]
    again = [c for r in made for c in r.changes()]
    assert again == [ins(i, 100 if i % 3 else 101 + i // 3)[0] for i in range(10_000)]
    assert all(c.relation is REL for c in again)
    assert ids(items) == list(range(10_000))
    assert (pool.memory_bytes, pool.spilled_bytes) == (0, 0)


def test_memory_is_bounded_and_spilled_runs_replay_in_order(tmp_path: Path) -> None:
    pool = BufferPool(20_000, tmp_path)
    a = Assembler(pool, shaper().early)
    big_stream_txn(a, 3000)
    assert pool.memory_bytes <= 20_000
    assert pool.spilled_bytes > 0
    items = list(commit(a).changes())
    assert runs(items)
    assert ids(items) == list(range(3000))
    assert list(tmp_path.rglob("*.spill")) == []


@pytest.mark.parametrize("limit", [0, 20_000, 1 << 20])  # every change spilled; some; none
@pytest.mark.parametrize("abort_at", [0, 3, 300, 2001, 2997])
def test_a_subtransaction_abort_cuts_runs_in_memory_and_in_the_spill_file(
    tmp_path: Path, limit: int, abort_at: int
) -> None:
    pool = BufferPool(limit, tmp_path)
    a = Assembler(pool, shaper().early)
    big_stream_txn(a, 3000)
    a.feed(StreamAbort(100, 101 + abort_at // 3))  # row abort_at is the first of this subxact
    a.feed(StreamStart(100, False))
    a.feed(*ins(5000, 100))
    a.feed(StreamStop())
    txn = commit(a)
    assert txn.change_count == abort_at + 1
    assert ids(list(txn.changes())) == [*range(abort_at), 5000]
    assert (pool.memory_bytes, pool.spilled_bytes) == (0, 0)


def test_cutting_a_run_gives_back_its_memory(tmp_path: Path) -> None:
    pool = BufferPool(1 << 20, tmp_path)
    a = Assembler(pool, shaper().early)
    big_stream_txn(a, 30)
    whole = pool.memory_bytes
    a.feed(StreamAbort(100, 101 + 15 // 3))
    assert 0 < pool.memory_bytes < whole * 0.6
    a.feed(StreamAbort(100, 100))
    assert pool.memory_bytes == 0


def test_a_run_holds_one_table_and_other_changes_stay_between_runs(tmp_path: Path) -> None:
    a = Assembler(BufferPool(1 << 20, tmp_path), shaper().early)
    truncate = Truncate((REL,), False, False, 100, 5)
    a.feed(StreamStart(100, True))
    for change, message in [ins(1, 100), ins(2, 100, OTHER), ins(3, 100, OTHER)]:
        a.feed(change, message)
    a.feed(truncate)
    a.feed(*ins(4, 100))
    a.feed(StreamStop())
    items = list(commit(a).changes())
    assert [(type(i).__name__, getattr(i, "count", 1)) for i in items] == [
        ("EncodedRun", 1),
        ("EncodedRun", 2),
        ("Truncate", 1),
        ("EncodedRun", 1),
    ]
    assert [i.relation for i in items if isinstance(i, EncodedRun)] == [REL, OTHER, REL]


def test_changes_the_compiled_code_leaves_to_the_shaper_stay_decoded(tmp_path: Path) -> None:
    a = Assembler(BufferPool(1 << 20, tmp_path), shaper().early)
    key_change = RowChange("update", REL, ("1", None), ("2", "x"), True, None, 7, 30)
    refused = RowChange("insert", REL, None, ("not a number", "x"), False, None, 8, 30)
    a.feed(StreamStart(100, True))
    for change in (key_change, refused):
        a.feed(change, b"U")  # the bytes are not read for a change kept decoded
    a.feed(StreamStop())
    assert list(commit(a).changes()) == [key_change, refused]


def test_the_snapshot_window_sees_the_changes_decoded_and_the_shaper_gets_the_runs(tmp_path: Path) -> None:
    a = Assembler(BufferPool(0, tmp_path), shaper().early)
    big_stream_txn(a, 10)
    seen: list[Change] = []
    passed = list(observed(commit(a).changes(), seen.append))
    assert all(isinstance(c, EncodedRun) for c in passed)
    assert seen == [ins(i, 100 if i % 3 else 101 + i // 3)[0] for i in range(10)]


def test_damaged_encoded_bytes_raise_a_clear_error() -> None:
    rows = STAGE.rows
    assert rows is not None
    with pytest.raises(ValueError, match="encoded changes are corrupt"):
        rows.encoded(b"\x00\x01garbage", 1)
    with pytest.raises(ValueError, match="encoded changes are corrupt"):
        rows.encoded(b"", 1)
    assert len(rows.encoded(b"", 0)) == 0
