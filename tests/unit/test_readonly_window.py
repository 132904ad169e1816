"""Read-only incremental snapshot windows (``snapshot.read_only``), without a server: the window is touched only by
transactions its snapshot did not see (by their top-level xid, also streamed ones), closes once the stream's
position (a keepalive's, a record's) passes the WAL position read with the chunk, merges unchanged TOAST and
drops all on a truncate, as the DBLog window does; and the position read with a chunk is an end of record."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from cdcd.assembly import Assembler, BufferPool
from cdcd.batches import SnapshotBatch
from cdcd.config import Settings
from cdcd.filters import FilterPlan
from cdcd.ledger import Ledger
from cdcd.pgoutput import Decoder
from cdcd.pgoutput.messages import (
    UNCHANGED_TOAST,
    Begin,
    Column,
    Commit,
    Message,
    Relation,
    Row,
    RowChange,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
)
from cdcd.replication.core import ReplicationCore, Write
from cdcd.replication.loop import POSITION_ASK_S, ReplicationLoop
from cdcd.rowstage import STAGE
from cdcd.sink.jsonl import JsonLinesSink
from cdcd.snapshot.position import record_end
from cdcd.snapshot.runner import Snapshotter
from cdcd.snapshot.state import SnapshotState, StateStore, TableProgress
from cdcd.snapshot.window import ChunkWindow
from cdcd.snapshot.xids import SnapshotXids
from tests.pgoutput_encoder import encode
from tests.unit.test_replication_core import keepalive, xlogdata

REL = Relation(
    16400, "public", "t", "d", (Column("id", 23, -1, True), Column("v", 25, -1, False), Column("doc", 25, -1, False))
)
SNAPSHOT = "100:105:100,102"  # saw every transaction before 100, and 101, 103, 104; not 100, 102, nor 105 on
UNTIL = 0x5000  # the WAL position read with the chunk


def _window(**read_only: Any) -> ChunkWindow:
    rows: list[Row] = [(str(i), f"v{i}", "d") for i in range(1, 4)]
    return ChunkWindow.open(("public", "t"), REL, ("id",), rows, "wm", **read_only)


def test_only_transactions_the_snapshot_did_not_see_touch_a_read_only_window() -> None:
    window = _window(until=UNTIL, snapshot=SnapshotXids.parse(SNAPSHOT))
    assert [x for x in (99, 100, 101, 102, 103, 104, 105, 4000) if window.concerns(x)] == [100, 102, 105, 4000]
    assert all(_window().concerns(x) for x in (99, 101, 105))  # the DBLog window: every transaction in it


def test_on_a_standby_every_transaction_from_xmin_on_may_be_unseen() -> None:
    """A standby's pg_current_snapshot() lists no running transaction (755 ran on the primary: the primary said
    755:757:755, the standby 755:757:): each transaction at or after xmin touches the window, none before."""
    standby = SnapshotXids.parse("755:757:", running_known=False)
    window = _window(until=UNTIL, snapshot=standby)
    assert [x for x in (754, 755, 756, 757, 4000) if window.concerns(x)] == [755, 756, 757, 4000]
    assert ChunkWindow.admits(standby, [754, 755, 756])  # emitted ones were replayed first: visible to it
    assert not ChunkWindow.admits(standby, [757])


def test_a_read_only_window_closes_once_the_stream_passed_its_position() -> None:
    window = _window(until=UNTIL, snapshot=SnapshotXids.parse(SNAPSHOT))
    assert (window.reached(UNTIL - 1), window.reached(UNTIL), window.reached(UNTIL + 8)) == (False, True, True)
    assert not _window().reached(1 << 40)  # the DBLog window closes at its watermark only
    with pytest.raises(ValueError, match="both"):
        _window(until=UNTIL)


@pytest.mark.parametrize(
    ("position", "end"),
    [
        (0x1_0000_5010, 0x1_0000_5010),  # inside a page
        (0x1_0000_6018, 0x1_0000_6000),  # just past a page's short header: the end of the page before
        (0x1_0100_0028, 0x1_0100_0000),  # just past a segment's long header (16 MiB segments)
        (0x1_0000_2028, 0x1_0000_2028),  # 40 bytes into a page that does not start a segment: a position
    ],
)
def test_the_position_read_with_a_chunk_is_the_end_of_a_record(position: int, end: int) -> None:
    assert record_end(position, 8192, 16 << 20) == end


# -- through the replication core ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Table:
    name: str
    relation: Relation = REL
    key_columns: tuple[str, ...] = ("id",)
    types: tuple[Type, ...] = ()


@dataclass(frozen=True)
class _Chunk:
    table: _Table
    rows: list[Row]
    xids: SnapshotXids
    watermark: str
    position: int | None


@dataclass
class _Reader:
    """Reads ``public.t`` rows 1..6 in snapshot SNAPSHOT at position UNTIL, writing nothing (no watermark)."""

    chunks: int = 0

    def describe(self, name: str) -> _Table:
        return _Table(name)

    def ancestors(self, relation_id: int) -> list[str]:
        return []

    def estimate(self, table: Any, condition: str | None, after: Sequence[str | None] | None) -> int | None:
        return 6

    def last_key(self, table: Any) -> list[str | None]:
        return []

    def upper_bound(self, table: Any, until: Sequence[str | None]) -> str:
        return ""  # no bound: these tests' tables do not grow

    def chunk(
        self, name: str, condition: str | None, after: Sequence[str | None] | None, limit: int, watermark: str
    ) -> _Chunk:
        self.chunks += 1
        rows: list[Row] = [(str(i), f"v{i}", f"doc{i}") for i in range(1, 7)]
        return _Chunk(_Table(name), rows, SnapshotXids.parse(SNAPSHOT), watermark, UNTIL)

    def use_exported(self, snapshot_name: str) -> None: ...
    def end_transaction(self) -> None: ...
    def rows(self, table: Any, condition: str | None, after: Sequence[str | None] | None) -> Iterator[Row]:
        return iter(())


@dataclass
class _Sink:
    batches: list[SnapshotBatch] = field(default_factory=list)

    def write_snapshot(self, batch: SnapshotBatch, progress: Ledger) -> None:
        self.batches.append(batch)
        progress.seal(progress.open(batch.lsn, None, batch.done))


def _opened(tmp_path: Path) -> tuple[Snapshotter, ReplicationCore, _Sink]:
    """A snapshotter whose read-only chunk of public.t (rows 1..6) is open, watching a replication core."""
    store, sink, ledger = StateStore(tmp_path, "slot"), _Sink(), Ledger()
    state = SnapshotState("slot", queue=[TableProgress("public.t", "incremental")])
    snapshotter = Snapshotter(_Reader(), sink, ledger, store, state, FilterPlan([]), 10, {})
    core = ReplicationCore(Decoder(stage=STAGE), Assembler(BufferPool(1 << 20, tmp_path)), ledger)
    core.watcher = snapshotter
    snapshotter.next_chunk([])
    assert snapshotter.awaiting == UNTIL
    return snapshotter, core, sink


def _feed(core: ReplicationCore, snapshotter: Snapshotter, frames: list[bytes]) -> None:
    """What the loop does with a read's frames: each event carried out, then the window closes if passed."""
    for frame in frames:
        event = core.frame(frame)
        if isinstance(event, Write):
            list(event.changes)  # the sink writes them: the window sees them on the way
    snapshotter.reached(core.position)


def _txn(xid: int, at: int, *changes: RowChange | Truncate) -> list[bytes]:
    """Committed transaction ``xid``, first record at ``at``, commit record ending at ``at + 0x108``, in frames at the
    positions the walsender gives them (Begin: its first record; a change: its own; Commit: the commit's end)."""
    frames = [xlogdata(at, encode(Begin(at + 0x100, 0, xid)))]
    frames += [xlogdata(c.wal_lsn, encode(c)) for c in changes]
    return [*frames, xlogdata(at + 0x108, encode(Commit(0, at + 0x100, at + 0x108, 0)))]


def _update(key: int, value: str, at: int, doc: object = "new doc") -> RowChange:
    return RowChange("update", REL, None, (str(key), value, doc), False, None, at, 0)  # type: ignore[arg-type]


def _rows(sink: _Sink) -> dict[str, object]:
    """The values of the chunk's rows written at its close, by key."""
    (batch,) = sink.batches
    return {str(row[0]): row[1] for row in batch.rows}


def test_visible_transactions_leave_the_chunk_alone_invisible_ones_drop_and_a_keepalive_closes_it(
    tmp_path: Path,
) -> None:
    snapshotter, core, sink = _opened(tmp_path)
    frames = [
        xlogdata(0, encode(REL)),
        *_txn(101, 0x1000, _update(1, "seen by the chunk", 0x1010)),  # visible: the chunk holds it already
        *_txn(102, 0x2000, _update(2, "running then", 0x2010)),  # in xip: not seen, the stream's row is newer
        *_txn(99, 0x3000, _update(3, "committed before", 0x3010)),  # below xmin: seen
        *_txn(107, 0x4000, RowChange("delete", REL, ("4", None, None), None, True, None, 0x4010, 0)),  # after xmax
    ]
    _feed(core, snapshotter, frames)
    assert core.position == 0x4108 < UNTIL
    assert sink.batches == []  # the stream has not passed the chunk's position: the window stays open
    _feed(core, snapshotter, [keepalive(UNTIL - 1)])
    assert sink.batches == []
    _feed(core, snapshotter, [keepalive(UNTIL)])  # an idle server: its keepalive closes the window
    assert snapshotter.awaiting is None
    assert _rows(sink) == {"1": "v1", "3": "v3", "5": "v5", "6": "v6"}
    assert sink.batches[0].lsn == UNTIL


def test_a_record_past_the_position_closes_the_window_after_the_frames_before_it(tmp_path: Path) -> None:
    snapshotter, core, sink = _opened(tmp_path)
    frames = [xlogdata(0, encode(REL)), *_txn(110, UNTIL - 0x100, _update(5, "x", UNTIL - 0xF0))]
    _feed(core, snapshotter, frames)  # its commit ends at UNTIL + 8: invisible, and past the position
    assert _rows(sink) == {"1": "v1", "2": "v2", "3": "v3", "4": "v4", "6": "v6"}


def test_unchanged_toast_of_an_invisible_transaction_merges_a_visible_ones_changes_nothing(tmp_path: Path) -> None:
    snapshotter, core, sink = _opened(tmp_path)
    frames = [
        xlogdata(0, encode(REL)),
        *_txn(102, 0x1000, _update(2, "changed by 102", 0x1010, UNCHANGED_TOAST)),  # not seen: merged
        *_txn(103, 0x2000, _update(3, "changed by 103", 0x2010, UNCHANGED_TOAST)),  # seen: the chunk has it
        keepalive(UNTIL),
    ]
    _feed(core, snapshotter, frames)
    (batch,) = sink.batches
    rows = {row[0]: row for row in batch.rows}
    assert len(rows) == 6
    assert rows["2"] == ("2", "changed by 102", "doc2")  # the stream's values, the TOASTed one from the chunk
    assert rows["3"] == ("3", "v3", "doc3")


def test_a_truncate_drops_the_chunk_only_when_the_snapshot_did_not_see_it(tmp_path: Path) -> None:
    snapshotter, core, sink = _opened(tmp_path)
    seen = Truncate((REL,), False, False, None, 0x1010)
    _feed(core, snapshotter, [xlogdata(0, encode(REL)), *_txn(104, 0x1000, seen), keepalive(UNTIL)])
    assert len(_rows(sink)) == 6
    snapshotter, core, sink = _opened(tmp_path / "again")
    unseen = Truncate((REL,), False, False, None, 0x1010)
    _feed(core, snapshotter, [xlogdata(0, encode(REL)), *_txn(105, 0x1000, unseen), keepalive(UNTIL)])
    assert _rows(sink) == {}


def test_a_streamed_transaction_is_judged_by_its_top_level_xid(tmp_path: Path) -> None:
    """pg_current_snapshot() lists top-level xids only: subtransaction 103 of running 102 looks committed by
    itself. The stream's commit names 102, and so the window judges it."""
    snapshotter, core, sink = _opened(tmp_path)
    change = RowChange("update", REL, None, ("2", "in a subtransaction", "d"), False, 103, 0x1010, 0)
    messages: list[Message] = [StreamStart(102, True), change, StreamStop(), StreamCommit(102, 0, 0x1100, 0x1108, 0)]
    frames = [xlogdata(0, encode(REL)), *(xlogdata(0x1000 + i, encode(m)) for i, m in enumerate(messages))]
    _feed(core, snapshotter, [*frames, keepalive(UNTIL)])
    assert "2" not in _rows(sink)


# -- the loop asks an idle server for its position ----------------------------------------------------------------


class _Walsender:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, frame: bytes) -> None:
        self.sent.append(frame)


def test_the_loop_asks_the_server_for_its_position_while_a_read_only_window_waits(tmp_path: Path) -> None:
    settings = Settings(
        source={"dsn": "host=127.0.0.1 port=9", "publications": [{"name": "p"}]},
        snapshot={"state_dir": tmp_path, "read_only": True},
        buffer={"spill_dir": tmp_path / "spill"},
    )
    with open(os.devnull, "wb") as out:
        loop = ReplicationLoop(settings, JsonLinesSink(out))
    snapshotter, core, sink = _opened(tmp_path / "state")
    walsender = _Walsender()
    step = partial(loop._snapshot_step, walsender, core, snapshotter)  # type: ignore[arg-type]
    step()
    assert [frame[0:1] + frame[-1:] for frame in walsender.sent] == [b"r\x01"]  # a status update asking for a reply
    step()
    assert len(walsender.sent) == 1  # not again before POSITION_ASK_S
    assert 0 < loop._position_wake_in(time.monotonic()) <= POSITION_ASK_S
    time.sleep(POSITION_ASK_S)
    step()
    assert len(walsender.sent) == 2
    core.frame(keepalive(UNTIL))  # the answer
    step()  # closes the window: its rows were the table's last
    assert len(sink.batches) == 1
    assert snapshotter.awaiting is None
    assert len(walsender.sent) == 2
    assert loop._position_wake_in(time.monotonic()) == 1.0
