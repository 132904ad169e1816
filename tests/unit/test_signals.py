"""Signals from the Kafka signal topic (parsing, what the snapshotter does with them, once) and Debezium's
snapshot notifications (their records, their order through an incremental snapshot)."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import structlog
from fastavro import parse_schema, schemaless_reader

from cdcd.avro.metadata import NOTIFICATION_KEY, NOTIFICATION_VALUE, encode_notification
from cdcd.batches import SnapshotBatch
from cdcd.columns import ColumnRules, Mask, TableColumns
from cdcd.filters.plan import FilterPlan
from cdcd.ledger import Ledger
from cdcd.pgoutput.messages import Column, LogicalMessage, Relation, Row, Type
from cdcd.snapshot import control
from cdcd.snapshot.notifications import INCREMENTAL, Notices, Notification
from cdcd.snapshot.runner import Snapshotter, start_state
from cdcd.snapshot.signals import (
    ExecuteSnapshot,
    Ignored,
    LogSignal,
    PauseSnapshot,
    ResumeSnapshot,
    SignalRecord,
    StopSnapshot,
    condition_for,
    parse,
    select,
)
from cdcd.snapshot.state import SnapshotState, StateStore, TableProgress
from cdcd.snapshot.xids import SnapshotXids

NAME = "cdcd"


def _parse(value: Any, key: bytes | None = NAME.encode()) -> object:
    raw = value if isinstance(value, bytes) or value is None else json.dumps(value).encode()
    return parse(key, raw, NAME, "default-id")


# -- parsing ------------------------------------------------------------------------------------------


def test_execute_snapshot_as_debezium_writes_it() -> None:
    signal = _parse(
        {
            "id": "s1",
            "type": "execute-snapshot",
            "data": {
                "data-collections": ["public.orders", "public.items"],
                "type": "INCREMENTAL",
                "additional-conditions": [{"data-collection": "public.orders", "filter": "id > 10"}],
            },
        }
    )
    assert signal == ExecuteSnapshot("s1", ("public.orders", "public.items"), (("public.orders", "id > 10"),))


def test_data_may_be_a_json_string_and_the_id_defaults() -> None:
    data = json.dumps({"data-collections": ["public.t"]})
    assert _parse({"type": "execute-snapshot", "data": data}) == ExecuteSnapshot("default-id", ("public.t",))


def test_stop_pause_resume_log() -> None:
    assert _parse({"type": "stop-snapshot", "data": {"type": "incremental"}}) == StopSnapshot("default-id", ())
    stop = _parse({"id": 7, "type": "stop-snapshot", "data": {"data-collections": ["public.t"]}})
    assert stop == StopSnapshot("7", ("public.t",))
    assert _parse({"type": "pause-snapshot"}) == PauseSnapshot("default-id")
    assert _parse({"type": "resume-snapshot", "data": {}}) == ResumeSnapshot("default-id")
    assert _parse({"type": "log", "data": {"message": "hi"}}) == LogSignal("default-id", "hi")


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"{not json", "not JSON"),
        (b"", "no value"),
        (None, "no value"),
        ([1, 2], "not a JSON object"),
        ({"type": "execute-snapshot", "data": "{oops"}, "data is not JSON"),
        ({"type": "execute-snapshot", "data": [1]}, "data is not a JSON object"),
        ({"type": "execute-snapshot", "data": {}}, "data-collections"),
        ({"type": "execute-snapshot", "data": {"data-collections": []}}, "data-collections"),
        ({"type": "execute-snapshot", "data": {"data-collections": [3]}}, "data-collections"),
        ({"type": "execute-snapshot", "data": {"data-collections": ["a.b"], "type": "blocking"}}, "incremental"),
        ({"type": "execute-snapshot", "data": {"data-collections": ["a.b"], "surrogate-key": "k"}}, "surrogate"),
        (
            {"type": "execute-snapshot", "data": {"data-collections": ["a.b"], "additional-conditions": "x"}},
            "additional-conditions",
        ),
        (
            {"type": "execute-snapshot", "data": {"data-collections": ["a.b"], "additional-conditions": [{"f": 1}]}},
            "data-collection and a filter",
        ),
        ({"type": "log", "data": {}}, "message"),
        ({"type": "schema-changes", "data": {}}, "not one cdcd acts on"),
        ({"data": {}}, "not one cdcd acts on"),
    ],
)
def test_malformed_signals_are_ignored_with_the_reason(value: Any, reason: str) -> None:
    ignored = _parse(value)
    assert isinstance(ignored, Ignored)
    assert reason in ignored.reason
    assert not ignored.elsewhere


def test_a_signal_for_another_connector_is_ignored_quietly() -> None:
    ignored = _parse({"type": "pause-snapshot"}, key=b"other")
    assert isinstance(ignored, Ignored)
    assert ignored.elsewhere
    assert isinstance(_parse({"type": "pause-snapshot"}, key=None), Ignored)


def test_data_collections_are_names_or_regular_expressions() -> None:
    tables = ["public.t1", "public.t2", "app.t1", "public.t10"]
    assert select(["public.t1"], tables) == ["public.t1"]
    assert select([r"public\.t\d", "app.*"], tables) == ["public.t1", "public.t2", "app.t1"]
    assert select(["public.t1", "public.t1"], tables) == ["public.t1"]
    assert select(["[unclosed"], tables) == []
    conditions = (("public.t1", "id > 1"), (r"public\..*", "v <> 'x'"))
    assert condition_for("public.t1", conditions) == "(id > 1) AND (v <> 'x')"
    assert condition_for("public.t2", conditions) == "v <> 'x'"
    assert condition_for("app.t1", conditions) is None


# -- notifications --------------------------------------------------------------------------------------


def test_notification_records_are_debeziums() -> None:
    notices = Notices("pfx", clock_ms=lambda: 1234)
    notices.in_progress("s1", ["public.t"], "public.t", ["7", None], rows=20, estimated=100)
    [notice] = notices.take()
    assert notice == Notification(
        "s1",
        INCREMENTAL,
        "IN_PROGRESS",
        {
            "data_collections": "public.t",
            "current_collection_in_progress": "public.t",
            "last_processed_key": "7,<null>",
            "total_rows_scanned": "20",
            "estimated_rows": "100",
            "connector_name": "pfx",
        },
        1234,
    )
    assert notices.take() == []
    key, value = encode_notification(
        notice.id, notice.type, notice.aggregate_type, notice.additional_data, notice.timestamp
    )
    assert schemaless_reader(io.BytesIO(key), parse_schema(NOTIFICATION_KEY)) == {"id": "s1"}
    decoded = schemaless_reader(io.BytesIO(value), parse_schema(NOTIFICATION_VALUE))
    assert decoded == {
        "id": "s1",
        "type": "IN_PROGRESS",
        "aggregate_type": "Incremental Snapshot",
        "additional_data": notice.additional_data,
        "timestamp": 1234,
    }


# -- the snapshotter --------------------------------------------------------------------------------------

INT4 = 23
TEXT = 25


def _relation(name: str) -> Relation:
    return Relation(16400, "public", name, "d", (Column("id", INT4, -1, True), Column("v", TEXT, -1, False)))


@dataclass
class FakeTable:
    name: str
    relation: Relation
    key_columns: tuple[str, ...] = ("id",)
    types: tuple[Type, ...] = ()


@dataclass
class FakeChunk:
    table: FakeTable
    rows: list[Row]
    watermark: str
    xids: SnapshotXids = field(default_factory=lambda: SnapshotXids(1, 1, frozenset()))
    position: int | None = None  # a watermark is written (not read-only)


class FakeReader:
    """Tables of ``rows`` rows each, read in key order."""

    def __init__(self, rows: dict[str, int]) -> None:
        self.tables = rows
        self.conditions: list[str | None] = []

    def describe(self, name: str) -> FakeTable:
        return FakeTable(name, _relation(name.split(".")[1]))

    def ancestors(self, relation_id: int) -> list[str]:
        return []

    def estimate(self, table: Any, condition: str | None, after: Sequence[str | None] | None) -> int | None:
        return self.tables[table.name]

    def last_key(self, table: Any) -> list[str | None]:
        return []

    def upper_bound(self, table: Any, until: Sequence[str | None]) -> str:
        return ""  # no bound: these tests' tables do not grow

    def chunk(
        self, name: str, condition: str | None, after: Sequence[str | None] | None, limit: int, watermark: str
    ) -> FakeChunk:
        self.conditions.append(condition)
        start = 0 if after is None else int(after[0] or 0) + 1
        ids = range(start, min(start + limit, self.tables[name]))
        return FakeChunk(self.describe(name), [(str(i), f"v{i}") for i in ids], watermark)

    def use_exported(self, snapshot_name: str) -> None: ...
    def end_transaction(self) -> None: ...
    def rows(self, table: Any, condition: str | None, after: Sequence[str | None] | None) -> Iterator[Row]:
        return iter(())


class FakeSink:
    """Writes at once: each batch is finished as it is handed over."""

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}

    def write_snapshot(self, batch: SnapshotBatch, progress: Ledger) -> None:
        self.rows[batch.relation.name] = self.rows.get(batch.relation.name, 0) + len(batch.rows)
        progress.seal(progress.open(batch.lsn, None, batch.done))


def _snapshotter(tmp_path: Path, reader: FakeReader, state: SnapshotState | None = None) -> Snapshotter:
    store = StateStore(tmp_path, "slot")
    state = state or SnapshotState("slot")
    store.save(state)
    return Snapshotter(
        reader,
        FakeSink(),
        Ledger(),
        store,
        state,
        FilterPlan([]),
        chunk_size=10,
        types={},
        notices=Notices(NAME, clock_ms=lambda: 1),
    )


def _record(offset: int, value: dict[str, Any] | bytes, key: bytes = NAME.encode()) -> SignalRecord:
    return SignalRecord(0, offset, key, value if isinstance(value, bytes) else json.dumps(value).encode())


def _run(snapshotter: Snapshotter) -> None:
    """Read chunks and bring their high watermarks until nothing is pending."""
    for _ in range(100):
        if not snapshotter.pending:
            return
        snapshotter.next_chunk([])
        if snapshotter.window is not None:
            mark = control.encode({"slot": "slot", "id": snapshotter.window.window.watermark, "mark": "high"})
            snapshotter.watermark(LogicalMessage(False, 100, control.WATERMARK_PREFIX, mark.encode()))
    raise AssertionError("the snapshot never finished")


def _kinds(snapshotter: Snapshotter) -> list[tuple[str, str]]:
    assert snapshotter.notices is not None
    return [(n.type, n.additional_data.get("scanned_collection", "")) for n in snapshotter.notices.take()]


EXECUTE = {
    "id": "sig",
    "type": "execute-snapshot",
    "data": {
        "data-collections": ["public.a", "public.b", "public.missing"],
        "additional-conditions": [{"data-collection": "public.a", "filter": "id < 15"}],
    },
}


def test_execute_snapshot_runs_with_notifications_in_order(tmp_path: Path) -> None:
    reader = FakeReader({"public.a": 25, "public.b": 0})
    snapshotter = _snapshotter(tmp_path, reader)
    snapshotter.signal(_record(4, EXECUTE), NAME, ["public.a", "public.b"])
    assert [(p.table, p.where, p.group) for p in snapshotter.state.queue] == [
        ("public.a", "id < 15", "sig"),
        ("public.b", None, "sig"),
    ]
    saved = StateStore(tmp_path, "slot").load()
    assert saved is not None
    assert saved.signal_offsets == {"0": 5}
    assert len(saved.queue) == 2
    _run(snapshotter)
    assert reader.conditions[0] == "(id < 15)"
    assert _kinds(snapshotter) == [
        ("STARTED", ""),
        ("IN_PROGRESS", ""),
        ("IN_PROGRESS", ""),
        ("IN_PROGRESS", ""),
        ("TABLE_SCAN_COMPLETED", "public.a"),
        ("IN_PROGRESS", ""),
        ("TABLE_SCAN_COMPLETED", "public.b"),
        ("COMPLETED", ""),
    ]
    assert snapshotter.state.queue == []


def test_table_scan_completed_reports_rows_and_status(tmp_path: Path) -> None:
    snapshotter = _snapshotter(tmp_path, FakeReader({"public.a": 12, "public.b": 0}))
    snapshotter.signal(_record(0, EXECUTE), NAME, ["public.a", "public.b"])
    _run(snapshotter)
    assert snapshotter.notices is not None
    done = [n.additional_data for n in snapshotter.notices.take() if n.type == "TABLE_SCAN_COMPLETED"]
    assert [(d["scanned_collection"], d["total_rows_scanned"], d["status"]) for d in done] == [
        ("public.a", "12", "SUCCEEDED"),
        ("public.b", "0", "EMPTY"),
    ]
    assert done[0]["data_collections"] == "public.a,public.b"


def test_stop_snapshot_drops_the_chunk_in_flight_and_aborts(tmp_path: Path) -> None:
    sink_rows = 25
    snapshotter = _snapshotter(tmp_path, FakeReader({"public.a": sink_rows, "public.b": 5}))
    snapshotter.signal(_record(0, EXECUTE), NAME, ["public.a", "public.b"])
    snapshotter.next_chunk([])
    assert snapshotter.window is not None
    watermark = snapshotter.window.window.watermark
    snapshotter.signal(_record(1, {"type": "stop-snapshot", "data": {"data-collections": ["public.a"]}}), NAME, [])
    assert snapshotter.window is None
    assert [p.table for p in snapshotter.state.queue] == ["public.b"]
    mark = control.encode({"slot": "slot", "id": watermark, "mark": "high"})
    snapshotter.watermark(LogicalMessage(False, 100, control.WATERMARK_PREFIX, mark.encode()))  # too late: ignored
    assert isinstance(snapshotter.sink, FakeSink)
    assert snapshotter.sink.rows == {}
    assert snapshotter.notices is not None
    [started, aborted] = snapshotter.notices.take()
    assert (started.type, aborted.type, aborted.id) == ("STARTED", "ABORTED", "sig")
    assert aborted.additional_data["data_collections"] == "public.a"
    snapshotter.signal(_record(2, {"type": "stop-snapshot"}), NAME, [])
    assert snapshotter.state.queue == []
    assert [n.type for n in snapshotter.notices.take()] == ["ABORTED"]
    assert snapshotter.state.signal_offsets == {"0": 3}


def test_pause_and_resume(tmp_path: Path) -> None:
    snapshotter = _snapshotter(tmp_path, FakeReader({"public.a": 5}))
    snapshotter.signal(_record(0, {"type": "pause-snapshot"}), NAME, [])
    snapshotter.signal(
        _record(1, {"type": "execute-snapshot", "data": {"data-collections": ["public.a"]}}), NAME, ["public.a"]
    )
    assert not snapshotter.pending
    snapshotter.next_chunk([])
    assert snapshotter.window is None
    saved = StateStore(tmp_path, "slot").load()
    assert saved is not None
    assert saved.paused
    snapshotter.signal(_record(2, {"type": "resume-snapshot"}), NAME, [])
    assert snapshotter.pending
    _run(snapshotter)
    kinds = [kind for kind, _ in _kinds(snapshotter)]
    assert kinds[0] == "RESUMED"
    assert kinds[-1] == "COMPLETED"


def test_malformed_and_foreign_records_are_skipped_and_their_offsets_kept(tmp_path: Path) -> None:
    snapshotter = _snapshotter(tmp_path, FakeReader({"public.a": 5}))
    snapshotter.signal(_record(0, b"{nope"), NAME, ["public.a"])
    snapshotter.signal(_record(1, EXECUTE, key=b"other"), NAME, ["public.a"])
    snapshotter.signal(
        _record(2, {"type": "execute-snapshot", "data": {"data-collections": ["x.y"]}}), NAME, ["public.a"]
    )
    assert snapshotter.state.queue == []
    saved = StateStore(tmp_path, "slot").load()
    assert saved is not None
    assert saved.signal_offsets == {"0": 3}


def test_a_table_without_a_key_is_reported_and_the_snapshot_completes(tmp_path: Path) -> None:
    reader = FakeReader({"public.a": 5, "public.nokey": 5})
    describe = reader.describe
    reader.describe = lambda name: FakeTable(name, _relation("nokey"), ()) if name == "public.nokey" else describe(name)  # type: ignore[method-assign]
    snapshotter = _snapshotter(tmp_path, reader)
    execute = {"id": "k", "type": "execute-snapshot", "data": {"data-collections": ["public.nokey", "public.a"]}}
    snapshotter.signal(_record(0, execute), NAME, ["public.a", "public.nokey"])
    _run(snapshotter)
    assert snapshotter.notices is not None
    notices = snapshotter.notices.take()
    done = [
        (n.additional_data["scanned_collection"], n.additional_data["status"])
        for n in notices
        if n.type == "TABLE_SCAN_COMPLETED"
    ]
    assert done == [("public.nokey", "NO_PRIMARY_KEY"), ("public.a", "SUCCEEDED")]
    assert notices[-1].type == "COMPLETED"


def _gone(reader: FakeReader, table: str) -> None:
    """``reader`` finds no table ``table`` any more (raising as its TableGone does)."""
    describe = reader.describe

    def described(name: str) -> FakeTable:
        if name == table:
            raise LookupError(f"table {name} does not exist")
        return describe(name)

    reader.describe = described  # type: ignore[method-assign]


def test_a_queued_table_dropped_meanwhile_leaves_the_queue_with_a_notification(tmp_path: Path) -> None:
    """A table dropped while queued (behind another snapshot, or between a restart's start and its turn) leaves the
    queue; the snapshot goes on with its other tables. ``describe`` raised out of the loop: exit 1 at every start."""
    reader = FakeReader({"public.a": 5, "public.gone": 5})
    _gone(reader, "public.gone")
    snapshotter = _snapshotter(tmp_path, reader)
    execute = {"id": "g", "type": "execute-snapshot", "data": {"data-collections": ["public.gone", "public.a"]}}
    snapshotter.signal(_record(0, execute), NAME, ["public.a", "public.gone"])
    _run(snapshotter)
    assert snapshotter.state.queue == []
    assert snapshotter.sink.rows == {"a": 5}  # type: ignore[attr-defined]
    saved = StateStore(tmp_path, "slot").load()
    assert saved is not None
    assert saved.queue == []
    assert snapshotter.notices is not None
    done = [
        (n.additional_data["scanned_collection"], n.additional_data["status"])
        for n in snapshotter.notices.take()
        if n.type == "TABLE_SCAN_COMPLETED"
    ]
    assert done == [("public.gone", "UNKNOWN_SCHEMA"), ("public.a", "SUCCEEDED")]


def test_a_queued_table_renamed_meanwhile_is_followed_by_relation_id(tmp_path: Path) -> None:
    reader = FakeReader({"public.new": 15})
    snapshotter = _snapshotter(tmp_path, reader)
    snapshotter.renamed = {16400: "public.new"}.get
    snapshotter.state.enqueue(TableProgress("public.old", "incremental", relation_id=16400))
    _gone(reader, "public.old")
    _run(snapshotter)
    assert snapshotter.sink.rows == {"new": 15}  # type: ignore[attr-defined]
    assert snapshotter.state.queue == []
    snapshotter.state.enqueue(TableProgress("public.new", "incremental", relation_id=16399))  # its name, not it
    _run(snapshotter)
    assert snapshotter.sink.rows == {"new": 15}  # type: ignore[attr-defined]
    assert snapshotter.state.queue == []


def test_a_stopped_snapshot_counts_as_finished(tmp_path: Path) -> None:
    """A `cdcd snapshot` request the stream sends again after a restart is not queued again once stopped."""
    snapshotter = _snapshotter(tmp_path, FakeReader({"public.a": 5}))
    snapshotter.request_key = b"k" * 32
    request = control.encode(
        control.signed({"slot": "slot", "table": "public.a", "where": None, "id": "req1"}, b"k" * 32)
    )
    message = LogicalMessage(True, 50, control.REQUEST_PREFIX, request.encode())
    snapshotter.request(message, ["public.a"])
    snapshotter.signal(_record(0, {"type": "stop-snapshot"}), NAME, [])
    snapshotter.request(message, ["public.a"])
    assert snapshotter.state.queue == []
    assert "req1" in snapshotter.state.finished


def test_the_initial_snapshot_notifies(tmp_path: Path) -> None:
    reader = FakeReader({"public.a": 15, "public.b": 0})
    reader.rows = lambda table, condition, after: iter([(str(i), f"v{i}") for i in range(reader.tables[table.name])])  # type: ignore[method-assign]
    state = SnapshotState("slot", initial="running", consistent_point=10)
    state.queue = [TableProgress("public.a", "initial"), TableProgress("public.b", "initial")]
    snapshotter = _snapshotter(tmp_path, reader, state)
    snapshotter.run_initial("exported", lambda: None)
    snapshotter.initial_finished()
    assert snapshotter.notices is not None
    notices = snapshotter.notices.take()
    assert {n.aggregate_type for n in notices} == {"Initial Snapshot"}
    assert [
        (n.type, n.additional_data.get("scanned_collection"), n.additional_data.get("total_rows_scanned"))
        for n in notices
    ] == [
        ("STARTED", None, None),
        ("IN_PROGRESS", None, "0"),
        ("TABLE_SCAN_COMPLETED", "public.a", "15"),
        ("IN_PROGRESS", None, "0"),
        ("TABLE_SCAN_COMPLETED", "public.b", "0"),
        ("COMPLETED", None, None),
    ]
    assert notices[2].additional_data["status"] == "SUCCEEDED"
    assert notices[4].additional_data["status"] == "EMPTY"


def test_no_notifications_without_a_notification_topic(tmp_path: Path) -> None:
    snapshotter = _snapshotter(tmp_path, FakeReader({"public.a": 5}))
    snapshotter.notices = None
    snapshotter.signal(_record(0, EXECUTE), NAME, ["public.a"])
    _run(snapshotter)
    assert snapshotter.state.queue == []


HASH = Mask("hash", salt=b"pepper")
HASHED_KEY = ColumnRules({"public.a": TableColumns("public.a", masks={"id": HASH})})


def test_a_key_column_masked_by_hash_leaves_cdcd_hashed_in_notifications_and_logs(tmp_path: Path) -> None:
    """The clear key stays in the state (the next chunk's query needs it); what is shown is the records' form."""
    state = SnapshotState("slot", queue=[TableProgress("public.a", "incremental", last_key=["3"], rows=4)])
    snapshotter = _snapshotter(tmp_path, FakeReader({"public.a": 16}), state)
    snapshotter.columns = HASHED_KEY
    with structlog.testing.capture_logs() as logs:
        _run(snapshotter)
    assert snapshotter.notices is not None
    keys = [n.additional_data["last_processed_key"] for n in snapshotter.notices.take() if n.type == "IN_PROGRESS"]
    assert keys == [HASH.apply("13"), HASH.apply("15")]
    [begun] = [e for e in logs if e["event"] == "snapshotting table"]
    assert begun["after_key"] == [HASH.apply("3")]


def test_an_interrupted_initial_snapshot_is_resumed_without_logging_its_key() -> None:
    saved = SnapshotState("slot", queue=[TableProgress("public.a", "initial", last_key=["4111111111111111"])])
    with structlog.testing.capture_logs() as logs:
        start_state(saved, "slot", "initial", None, ["public.a"])
    assert logs
    assert "4111111111111111" not in repr(logs)


def test_stop_snapshot_without_collections_leaves_what_an_interrupted_initial_snapshot_left(tmp_path: Path) -> None:
    resumed = TableProgress("public.a", "incremental", last_key=["4"], resumed_initial=True)
    snapshotter = _snapshotter(
        tmp_path, FakeReader({"public.a": 9, "public.b": 9}), SnapshotState("slot", queue=[resumed])
    )
    snapshotter.signal(_record(0, EXECUTE), NAME, ["public.a", "public.b"])
    snapshotter.signal(_record(1, {"type": "stop-snapshot"}), NAME, [])
    assert snapshotter.state.queue == [resumed]
    snapshotter.signal(_record(2, {"type": "stop-snapshot", "data": {"data-collections": ["public.a"]}}), NAME, [])
    assert snapshotter.state.queue == []


def test_a_key_range_of_a_table_does_not_hide_a_snapshot_of_the_whole_table() -> None:
    state = SnapshotState("slot")
    state.queue = [TableProgress("public.a", "incremental", key_range="id < 50", resumed_initial=True)]
    assert state.enqueue(TableProgress("public.a", "incremental"))
    assert not state.enqueue(TableProgress("public.a", "incremental"))
    assert not state.enqueue(TableProgress("public.a", "incremental", key_range="id < 50"))


class GrowingReader(FakeReader):
    """Rows 0..n-1 of each table, n growing by more than a chunk at each chunk read (a writer inserting at the
    key's end faster than chunks are read); bounds are ``id <= N``, as the real reader's upper_bound."""

    def last_key(self, table: Any) -> list[str | None]:
        rows = self.tables[table.name]
        return [str(rows - 1)] if rows else []

    def upper_bound(self, table: Any, until: Sequence[str | None]) -> str:
        return f"id <= {until[0]}" if until else "false"

    def chunk(
        self, name: str, condition: str | None, after: Sequence[str | None] | None, limit: int, watermark: str
    ) -> FakeChunk:
        self.conditions.append(condition)
        found = re.search(r"id <= (\d+)|false", condition or "")
        end = self.tables[name] if found is None else 0 if found[1] is None else int(found[1]) + 1
        start = 0 if after is None else int(after[0] or 0) + 1
        ids = range(start, min(start + limit, self.tables[name], end))
        self.tables[name] += limit + 5
        return FakeChunk(self.describe(name), [(str(i), f"v{i}") for i in ids], watermark)


def test_an_incremental_snapshot_ends_at_the_key_its_table_ended_at_when_it_began(tmp_path: Path) -> None:
    """A table growing at its end faster than chunks are read: the snapshot reads up to the last key at its start
    (rows after it arrive by the stream) and finishes, its bound kept with its progress."""
    reader = GrowingReader({"public.a": 25, "public.b": 0})
    snapshotter = _snapshotter(tmp_path, reader)
    tables = ["public.a", "public.b"]
    snapshotter.signal(_record(0, EXECUTE | {"data": {"data-collections": tables}}), NAME, tables)
    _run(snapshotter)
    assert snapshotter.state.queue == []
    sink = snapshotter.sink
    assert isinstance(sink, FakeSink)
    assert sink.rows == {"a": 25, "b": 0}  # ids 0..24; public.b was empty when its snapshot began
    assert reader.conditions[0] == "(id <= 24)"
    assert reader.conditions[-1] == "(false)"
