"""A parallel initial snapshot without a server: where tables are cut into key ranges, each range's progress in the
state file, a restart that reads only the ranges not finished, and the reader threads (every row once, errors
and stops reach the caller)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdcd.batches import SnapshotBatch
from cdcd.filters.plan import FilterPlan
from cdcd.ledger import Entry, Ledger
from cdcd.pgoutput.messages import Column, LogicalMessage, Relation, Row
from cdcd.snapshot import control
from cdcd.snapshot.parallel import Part, read_parts
from cdcd.snapshot.ranges import histogram_cuts, integer_cuts, key_ranges, parts_for
from cdcd.snapshot.runner import Parallel, Snapshotter, start_state
from cdcd.snapshot.state import SnapshotState, StateStore, TableProgress
from tests.unit.test_signals import FakeChunk, FakeTable

INT4, TEXT = 23, 25

# -- where to cut ---------------------------------------------------------------------------------------------


def _range_of(key: int, cuts: Sequence[int]) -> list[int]:
    """The indexes of the ranges ``key`` falls in."""
    return [
        i
        for i, (low, high) in enumerate(key_ranges(cuts))
        if (low is None or key >= low) and (high is None or key < high)
    ]


@given(st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**40), st.integers(1, 64))
def test_integer_cuts_are_increasing_inside_the_span_and_put_every_key_in_one_range(
    low: int, span: int, parts: int
) -> None:
    high = low + span
    cuts = integer_cuts(low, high, parts)
    assert cuts == sorted(set(cuts))
    assert all(low < c <= high for c in cuts)
    assert len(cuts) <= parts - 1
    for key in (low - 1, low, low + span // 2, high - 1, high, high + 1, *cuts, *(c - 1 for c in cuts)):
        assert len(_range_of(key, cuts)) == 1


def test_integer_cuts_spread_evenly() -> None:
    assert integer_cuts(1, 1_000_000, 4) == [250_000, 500_000, 750_000]
    assert integer_cuts(5, 7, 8) == [6]  # fewer cuts than asked for when the span is short
    assert integer_cuts(3, 3, 4) == []


def test_histogram_cuts_pick_evenly_spaced_inner_bounds() -> None:
    bounds = [f"k{i:03}" for i in range(101)]  # 100 buckets of about as many rows each
    assert histogram_cuts(bounds, 4) == ["k025", "k050", "k075"]
    assert histogram_cuts(bounds, 1) == []
    assert histogram_cuts(["a", "b"], 4) == []  # one bucket: nothing inside
    assert histogram_cuts(["a", "b", "b", "b", "c"], 4) == ["b"]  # repeated bounds cut once


def test_parts_follow_the_estimate_and_the_connections() -> None:
    assert parts_for(1_000_000, 10_000, 2) == 8  # up to 4 per connection
    assert parts_for(25_000, 10_000, 4) == 2  # none expected smaller than a chunk
    assert parts_for(5_000, 10_000, 4) == 1
    assert parts_for(None, 10_000, 4) == 16  # size unknown: a large table without statistics
    assert parts_for(10**9, 10_000, 1) == 1


# -- the snapshotter, on fake connections ---------------------------------------------------------------------

REL = Relation(16400, "public", "t", "d", (Column("id", INT4, -1, True), Column("v", TEXT, -1, False)))
_RANGE = re.compile(r"id >= (\d+)|id < (\d+)")


def _bounds(condition: str | None) -> tuple[int, int]:
    low, high = 0, 2**31
    for lower, upper in _RANGE.findall(condition or ""):
        low, high = (int(lower), high) if lower else (low, int(upper))
    return low, high


class FakeConnection:
    """Rows ``(id, "v<id>")`` for ids 0..rows-1 of each table; conditions are the key ranges ``split`` made."""

    def __init__(self, tables: dict[str, int], log: list[str] | None = None, fail_at: int | None = None) -> None:
        self.tables, self.log, self.fail_at = tables, log if log is not None else [], fail_at
        self.exported: str | None = None
        self.closed = False

    # the main reader (runner.Reader)
    def use_exported(self, snapshot_name: str) -> None:
        self.exported = snapshot_name

    def end_transaction(self) -> None: ...
    def close(self) -> None:
        self.closed = True

    def describe(self, name: str) -> FakeTable:
        return FakeTable(name, REL)

    def ancestors(self, relation_id: int) -> list[str]:
        return []

    def estimate(self, table: Any, condition: str | None, after: Sequence[str | None] | None) -> int | None:
        return self.tables[table.name]

    def last_key(self, table: Any) -> list[str | None]:
        return []

    def upper_bound(self, table: Any, until: Sequence[str | None]) -> str:
        return ""  # no bound: these tests' tables do not grow

    def _ids(self, name: str, condition: str | None, after: Sequence[str | None] | None) -> list[int]:
        low, high = _bounds(condition)
        start = max(low, 0 if after is None else int(after[0] or 0) + 1)
        return list(range(start, min(high, self.tables[name])))

    def rows(self, table: Any, condition: str | None, after: Sequence[str | None] | None) -> Iterator[Row]:
        return iter([(str(i), f"v{i}") for i in self._ids(table.name, condition, after)])

    def chunk(
        self, name: str, condition: str | None, after: Sequence[str | None] | None, limit: int, watermark: str
    ) -> FakeChunk:
        self.log.append(f"chunk {condition} after {after}")
        rows: list[Row] = [(str(i), f"v{i}") for i in self._ids(name, condition, after)[:limit]]
        return FakeChunk(self.describe(name), rows, watermark)

    # a part reader (parallel.PartReader)
    def row_batches(
        self, table: Any, condition: str | None, after: Sequence[str | None] | None, size: int
    ) -> Iterator[list[Row]]:
        self.log.append(f"read {condition}")
        ids = self._ids(table.name, condition, after)
        for at in range(0, len(ids), size):
            if self.fail_at is not None and ids[at] >= self.fail_at:
                raise ConnectionError("the server went away")
            yield [(str(i), f"v{i}") for i in ids[at : at + size]]

    def copy_batches(
        self, table: Any, condition: str | None, after: Sequence[str | None] | None, size: int
    ) -> Iterator[bytes]:
        """``row_batches`` as COPY text."""
        for rows in self.row_batches(table, condition, after, size):
            yield b"".join(f"{key!s}\t{value!s}\n".encode() for key, value in rows)

    def split(self, table: Any, condition: str | None, parts: int) -> list[str]:
        cuts = integer_cuts(0, self.tables[table.name] - 1, parts)
        conditions = []
        for low, high in key_ranges(cuts):
            bounds = ([] if low is None else [f"id >= {low}"]) + ([] if high is None else [f"id < {high}"])
            conditions.append(" AND ".join(bounds))
        return conditions


class HoldingSink:
    """Takes batches; acknowledges the first ``acked`` at once and keeps the rest unacknowledged (in flight)."""

    def __init__(self, acked: int | None = None) -> None:
        self.batches: list[SnapshotBatch] = []
        self.acked = acked
        self.held: list[Entry] = []
        self.thread_ids: set[int] = set()

    def write_snapshot(self, batch: SnapshotBatch, progress: Ledger) -> None:
        self.thread_ids.add(threading.get_ident())
        entry = progress.open(batch.lsn, None, batch.done)
        self.batches.append(batch)
        if self.acked is not None and len(self.batches) > self.acked:
            entry.outstanding += 1  # never acknowledged: Kafka did not confirm it before the kill
            self.held.append(entry)
        progress.seal(entry)

    def ids(self, marker: str | None = None) -> list[int]:
        return [int(str(row[0])) for b in self.batches if marker in (None, b.marker) for row in b.rows]


def _snapshotter(
    tmp_path: Path,
    tables: dict[str, int],
    sink: HoldingSink,
    state: SnapshotState,
    *,
    connections: int = 2,
    fail_at: int | None = None,
) -> tuple[Snapshotter, list[FakeConnection]]:
    store = StateStore(tmp_path, "slot")
    store.save(state)
    main = FakeConnection(tables)
    opened: list[FakeConnection] = []

    def open_reader() -> FakeConnection:
        opened.append(FakeConnection(tables, main.log, fail_at))
        return opened[-1]

    snapshotter = Snapshotter(
        main,
        sink,
        Ledger(),
        store,
        state,
        FilterPlan([]),
        chunk_size=10,
        types={},
        parallel=Parallel(connections, open_reader, main.split),
    )
    return snapshotter, opened


def _fresh(tables: dict[str, int]) -> SnapshotState:
    return start_state(None, "slot", "initial", 1000, list(tables))


def test_parallel_initial_snapshot_reads_every_row_once_in_key_ranges(tmp_path: Path) -> None:
    tables = {"public.big": 200, "public.small": 5, "public.empty": 0}
    sink = HoldingSink()
    snapshotter, opened = _snapshotter(tmp_path, tables, sink, _fresh(tables), connections=3)
    snapshotter.run_initial("snap-1", lambda: None)

    assert len(opened) == 3
    assert all(c.exported == "snap-1" and c.closed for c in opened)  # each in the slot's exported snapshot
    by_table: dict[str, list[int]] = {}
    for batch in sink.batches:
        by_table.setdefault(batch.relation.name, []).extend(int(str(r[0])) for r in batch.rows)
    assert sorted(sink.ids()) == sorted([*range(200), *range(5)])  # every row once
    assert len(sink.batches) > 20
    assert sink.thread_ids == {threading.get_ident()}  # the sink is written on the caller's thread only
    reads = [line for line in opened[0].log if line.startswith("read")]
    assert len([r for r in reads if "id" in r]) == 12  # big: 200 rows in 12 ranges (4 per connection), others whole
    markers = [b.row_marker(i) for b in sink.batches for i in range(len(b.rows))]
    assert markers.count("first") == markers.count("last") == 1
    assert markers[0] == "first"
    assert markers[-1] == "last"
    assert snapshotter.state.queue == []  # every range acknowledged: finished
    saved = StateStore(tmp_path, "slot").load()
    assert saved is not None
    assert saved.queue == []


def test_a_restart_reads_only_the_ranges_not_finished_after_their_last_saved_key(tmp_path: Path) -> None:
    tables = {"public.big": 120}
    sink = HoldingSink(acked=5)  # five batches acknowledged, then a kill -9
    snapshotter, _ = _snapshotter(tmp_path, tables, sink, _fresh(tables))
    snapshotter.run_initial("snap-1", lambda: None)
    delivered = set(sink.ids()[: sum(len(b.rows) for b in sink.batches[:5])])

    saved = StateStore(tmp_path, "slot").load()
    assert saved is not None
    ranges = [p for p in saved.queue if p.key_range is not None]
    assert len(ranges) == len(saved.queue) >= 2  # the unfinished ranges, each on its own
    assert {p.group for p in ranges} == {ranges[0].group}
    finished_ids = set(saved.finished)
    assert finished_ids  # some ranges were finished before the kill and are not read again
    progressed = {p.key_range: int(str(p.last_key[0])) for p in ranges if p.last_key is not None}
    assert progressed  # and some were partly read: they go on after their last key

    # the next process: the unfinished ranges become incremental snapshots, each from its last key
    resumed = start_state(saved, "slot", "initial", None, ["public.big"])
    assert all(p.kind == "incremental" and p.resumed_initial for p in resumed.queue)
    again = HoldingSink()
    store = StateStore(tmp_path, "slot")
    main = FakeConnection(tables)
    later = Snapshotter(main, again, Ledger(), store, resumed, FilterPlan([]), chunk_size=10, types={})
    for _ in range(200):
        if not later.pending:
            break
        later.next_chunk([])
        assert later.window is not None
        mark = control.encode({"slot": "slot", "id": later.window.window.watermark, "mark": "high"})
        later.watermark(LogicalMessage(False, 2000, control.WATERMARK_PREFIX, mark.encode()))
    assert not later.pending
    assert all("id " in line for line in main.log)  # every chunk read within its range
    reread = again.ids()
    assert set(reread) | delivered == set(range(120))  # nothing lost
    assert not set(reread) & delivered  # what Kafka had acknowledged (and the state saved) is not read again
    assert len(reread) == len(set(reread))
    for key_range, last_key in progressed.items():
        low, high = _bounds(key_range)
        assert min(i for i in reread if low <= i < high) == last_key + 1


def test_a_table_without_a_key_or_too_small_is_read_whole_on_one_connection(tmp_path: Path) -> None:
    tables = {"public.small": 15}
    sink = HoldingSink()
    snapshotter, opened = _snapshotter(tmp_path, tables, sink, _fresh(tables), connections=4)
    snapshotter.run_initial("snap-1", lambda: None)
    assert len(opened) == 1  # one part: one connection
    assert opened[0].log == ["read None"]
    assert sink.ids() == list(range(15))


def test_a_reader_error_reaches_the_caller_and_stops_the_other_threads(tmp_path: Path) -> None:
    tables = {"public.big": 400}
    sink = HoldingSink()
    snapshotter, opened = _snapshotter(tmp_path, tables, sink, _fresh(tables), fail_at=350)
    with pytest.raises(ConnectionError, match="went away"):
        snapshotter.run_initial("snap-1", lambda: None)
    assert all(c.closed for c in opened)
    assert not [t for t in threading.enumerate() if t.name.startswith("cdcd-snapshot-")]


def test_a_stop_while_reading_ends_the_threads(tmp_path: Path) -> None:
    class Stopped(Exception):
        pass

    calls = 0

    def poll() -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise Stopped

    tables = {"public.big": 10_000}
    snapshotter, opened = _snapshotter(tmp_path, tables, HoldingSink(), _fresh(tables))
    with pytest.raises(Stopped):
        snapshotter.run_initial("snap-1", poll)
    assert all(c.closed for c in opened)
    assert not [t for t in threading.enumerate() if t.name.startswith("cdcd-snapshot-")]


def test_read_parts_hands_over_each_part_in_key_order_with_its_last_batch_marked() -> None:
    tables = {"public.a": 35, "public.b": 0}
    parts = [Part("a", FakeTable("public.a", REL), None), Part("b", FakeTable("public.b", REL), None)]
    reads = [r for r in read_parts(parts, 2, lambda: FakeConnection(tables), "snap", 10) if r is not None]
    a = [r for r in reads if r.part.owner == "a"]
    assert [len(r.rows) for r in a] == [10, 10, 10, 5]
    assert [r.final for r in a] == [False, False, False, True]
    assert [(r.rows, r.final) for r in reads if r.part.owner == "b"] == [([], True)]


def test_key_ranges_are_saved_as_their_own_entries_with_the_tables_group(tmp_path: Path) -> None:
    state = SnapshotState("slot", queue=[TableProgress("public.t", "initial", key_range="id < 5", group="g")])
    store = StateStore(tmp_path, "slot")
    store.save(state)
    loaded = store.load()
    assert loaded is not None
    assert loaded.queue[0].key_range == "id < 5"
    assert loaded.queue[0].snapshot == "g"
    old = SnapshotState.from_json({"slot": "slot", "queue": [{"table": "public.t", "kind": "initial"}]})
    assert old.queue[0].key_range is None  # a state file from before key ranges


class AbsentTable(FakeConnection):
    """The exported snapshot does not hold ``public.late`` (created after its consistent point)."""

    def describe(self, name: str) -> FakeTable:
        if name == "public.late":
            raise LookupError(f"table {name} does not exist")  # as the reader's TableGone
        return super().describe(name)


@pytest.mark.parametrize("connections", [1, 2])
def test_an_initial_table_the_exported_snapshot_does_not_hold_is_queued_incrementally(
    tmp_path: Path, connections: int
) -> None:
    """A table the exported snapshot does not hold by its name now (created, or renamed or moved into a published
    schema, after the consistent point) is read by an incremental snapshot once streaming: a renamed table had rows
    then that the stream never sends. It was dropped from the queue (its rows lost); before that, every restart
    stopped on it."""
    tables = {"public.small": 5, "public.late": 3}
    store = StateStore(tmp_path, "slot")
    store.save(_fresh(tables))
    sink, main = HoldingSink(), AbsentTable(tables)
    parallel = Parallel(connections, lambda: AbsentTable(tables), main.split) if connections > 1 else None
    snapshotter = Snapshotter(main, sink, Ledger(), store, _fresh(tables), FilterPlan([]), 10, {}, parallel=parallel)
    snapshotter.run_initial("snap-1", lambda: None)
    assert sorted(sink.ids()) == list(range(5))
    assert [(p.table, p.kind, p.resumed_initial) for p in snapshotter.state.queue] == [
        ("public.late", "incremental", False)
    ]


def test_an_initial_table_whose_name_the_exported_snapshot_gives_another_table_is_queued_incrementally(
    tmp_path: Path,
) -> None:
    """A table published under a name another table had at the consistent point (renamed since): by name the
    exported snapshot holds that other table (relation 16400 here), whose rows would be written as this one's."""
    tables = {"public.small": 5, "public.swapped": 3}
    plan = start_state(
        None, "slot", "initial", 1000, list(tables), relations={"public.small": 16400, "public.swapped": 7}
    )
    store = StateStore(tmp_path, "slot")
    store.save(plan)
    sink = HoldingSink()
    snapshotter = Snapshotter(FakeConnection(tables), sink, Ledger(), store, plan, FilterPlan([]), 10, {})
    snapshotter.run_initial("snap-1", lambda: None)
    assert sorted(sink.ids()) == list(range(5))
    assert [(p.table, p.kind) for p in snapshotter.state.queue] == [("public.swapped", "incremental")]
