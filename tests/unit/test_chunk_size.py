"""The size of incremental chunks, without a server: a chunk that outlasts its connection's deadline (a selective
condition, a standby's replay lag) is read again with fewer rows in the next session, halving down to a floor,
instead of the same chunk timing out for ever; after fast chunks the size grows back to snapshot.chunk_size."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cdcd.batches import SnapshotBatch
from cdcd.filters import FilterPlan
from cdcd.ledger import Ledger
from cdcd.pgoutput.messages import Column, Relation, Row
from cdcd.snapshot import runner
from cdcd.snapshot.reader import ChunkDeadline, ChunkTooSlow
from cdcd.snapshot.runner import Snapshotter
from cdcd.snapshot.sizing import FLOOR, ChunkSize
from cdcd.snapshot.state import SnapshotState, StateStore, TableProgress
from cdcd.snapshot.xids import SnapshotXids
from cdcd.source.walsender import SourceDisconnected
from tests.unit.test_readonly_window import _Chunk, _Table

REL = Relation(16400, "public", "t", "d", (Column("id", 23, -1, True), Column("v", 25, -1, False)))
DEADLINE_S = 65.0
ROWS = 2000
UNTIL = 0x5000


@dataclass
class Clock:
    """The runner's clock: a chunk's read moves it on by what the chunk took."""

    now: float = 0.0

    def monotonic(self) -> float:
        return self.now

    def time_ns(self) -> int:
        return time.time_ns()


@dataclass
class _Reader:
    """Read-only chunks of ``public.t`` (ids 1..ROWS) under a condition that holds for few of the first 300
    rows (0.5 s of scanning a row) and for most of the rest (0.01 s): a chunk that takes longer than the deadline
    ends in ``ChunkDeadline``, as the reader's does when the deadline gives its connection up."""

    clock: Clock
    asked: list[int] = field(default_factory=list)
    cancels: bool = False  # the server's statement_timeout cancels a slow chunk (ChunkTooSlow), the session goes on
    slow_s: float = 0.5  # what scanning one of the first 300 rows takes

    def chunk(
        self, name: str, condition: str | None, after: Sequence[str | None] | None, limit: int, watermark: str
    ) -> _Chunk:
        self.asked.append(limit)
        first = int(after[0] or 0) + 1 if after else 1
        ids = range(first, min(first + limit, ROWS + 1))
        took = sum(self.slow_s if i <= 300 else 0.01 for i in ids)
        if took > DEADLINE_S:
            self.clock.now += DEADLINE_S
            slow = ChunkTooSlow if self.cancels else ChunkDeadline
            raise slow(f"a chunk of {limit} rows of {name} took more than {DEADLINE_S:g} s")
        self.clock.now += took
        rows: list[Row] = [(str(i), f"v{i}") for i in ids]
        return _Chunk(_Table(name, REL), rows, SnapshotXids.parse("100:100:"), watermark, UNTIL)

    def describe(self, name: str) -> _Table:
        return _Table(name, REL)

    def ancestors(self, relation_id: int) -> list[str]:
        return []

    def estimate(self, table: Any, condition: str | None, after: Sequence[str | None] | None) -> int | None:
        return None

    def last_key(self, table: Any) -> list[str | None]:
        return []

    def upper_bound(self, table: Any, until: Sequence[str | None]) -> str:
        return ""  # no bound: these tests' tables do not grow

    def use_exported(self, snapshot_name: str) -> None: ...
    def end_transaction(self) -> None: ...
    def rows(self, table: Any, condition: str | None, after: Sequence[str | None] | None) -> Iterator[Row]:
        return iter(())


@dataclass
class _Sink:
    """Acknowledges each batch at once: its progress is saved before the next chunk."""

    rows: int = 0

    def write_snapshot(self, batch: SnapshotBatch, progress: Ledger) -> None:
        self.rows += len(batch.rows)
        assert batch.done is not None
        batch.done()


def test_a_chunk_that_outlasts_its_deadline_is_read_again_smaller_and_fast_chunks_grow_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(runner, "time", clock)
    reader, sink, store = _Reader(clock), _Sink(), StateStore(tmp_path, "slot")
    state = SnapshotState("slot", queue=[TableProgress("public.t", "incremental")])
    sizes = ChunkSize(1000, DEADLINE_S)  # what the loop keeps across sessions
    for _session in range(30):  # bounded: the old code read the same 1000 rows again in every session
        snapshotter = Snapshotter(reader, sink, Ledger(), store, state, FilterPlan([]), 1000, {}, sizes=sizes)
        try:
            for _chunk in range(30):
                if not snapshotter.pending:
                    break
                snapshotter.next_chunk([])
                snapshotter.reached(UNTIL)
        except SourceDisconnected:  # the deadline gave the connection up: the loop starts a new session
            continue
        break
    # halved while chunks time out; 125 rows of the selective part take 62.5 s: not fast, the size stays;
    # then 125 rows take 1.25 s, and the size doubles back to chunk_size
    assert reader.asked == [1000, 500, 250, 125, 125, 125, 125, 250, 500, 1000]
    assert sink.rows == ROWS
    assert not state.queue


def test_the_chunk_size_halves_down_to_its_floor_and_doubles_up_to_chunk_size() -> None:
    sizes = ChunkSize(10, DEADLINE_S)
    assert [sizes.timed_out() for _ in range(5)] == [5, 2, 1, 1, 1]
    assert FLOOR == 1
    sizes.took(DEADLINE_S / 4)  # not fast enough: the next chunk could take half of the deadline and more
    assert sizes.rows == 1
    for _ in range(5):
        sizes.took(1.0)
    assert sizes.rows == 10
    fixed = ChunkSize(10, 0.0)  # no deadline: the size stays chunk_size
    fixed.took(0.0)
    assert fixed.rows == 10


def test_a_chunk_the_server_cancels_is_read_again_smaller_in_the_same_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within the chunk's statement_timeout the server cancels it: the session (its stream) goes on."""
    clock = Clock()
    monkeypatch.setattr(runner, "time", clock)
    reader, sink, store = _Reader(clock, cancels=True), _Sink(), StateStore(tmp_path, "slot")
    state = SnapshotState("slot", queue=[TableProgress("public.t", "incremental")])
    sizes = ChunkSize(1000, DEADLINE_S)
    snapshotter = Snapshotter(reader, sink, Ledger(), store, state, FilterPlan([]), 1000, {}, sizes=sizes)
    for _chunk in range(40):
        if not snapshotter.pending:
            break
        snapshotter.next_chunk([])
        snapshotter.reached(UNTIL)
    assert reader.asked == [1000, 500, 250, 125, 125, 125, 125, 250, 500, 1000]
    assert sink.rows == ROWS
    assert not state.queue


def test_a_table_whose_single_row_outlasts_a_chunks_time_leaves_the_queue_and_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asking again would time out again, for ever: its snapshot is aborted (counted, notified), streaming goes
    on, and the next queued table is read."""
    clock = Clock()
    monkeypatch.setattr(runner, "time", clock)
    reader, sink, store = _Reader(clock, cancels=True, slow_s=DEADLINE_S + 1), _Sink(), StateStore(tmp_path, "slot")
    state = SnapshotState("slot", queue=[TableProgress("public.t", "incremental", id="slow")])
    snapshotter = Snapshotter(
        reader, sink, Ledger(), store, state, FilterPlan([]), 8, {}, sizes=ChunkSize(8, DEADLINE_S)
    )
    for _chunk in range(10):
        snapshotter.next_chunk([])
    assert reader.asked == [8, 4, 2, 1]
    assert (state.queue, state.finished) == ([], ["slow"])
    assert snapshotter.rejections.counts == {("snapshot", "too_slow"): 1}
    assert "public.t" not in snapshotter.meters.tables  # no snapshot shown as running in the metrics
    assert sink.rows == 0
