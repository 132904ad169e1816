"""The pure parts of snapshots: COPY text rows, snapshot-xid visibility, the DBLog window, saved progress,
and what to snapshot at start."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdcd.ledger import Positions
from cdcd.pgoutput.messages import UNCHANGED_TOAST, Column, Relation, RowChange, Truncate
from cdcd.snapshot.copy import CopyFormatError, parse_line
from cdcd.snapshot.runner import key_values, start_state
from cdcd.snapshot.state import SnapshotState, StateError, StateStore, TableProgress
from cdcd.snapshot.window import ChunkWindow
from cdcd.snapshot.xids import SnapshotXids

INT4, TEXT, INT8 = 23, 25, 20


def _copy_escape(value: str | None) -> str:
    """What COPY TO's text format writes for a value (PostgreSQL's CopyAttributeOutText)."""
    if value is None:
        return "\\N"
    out = value.replace("\\", "\\\\")
    for char, esc in (("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r"), ("\b", "\\b"), ("\f", "\\f"), ("\v", "\\v")):
        out = out.replace(char, esc)
    return out


@given(st.lists(st.one_of(st.none(), st.text()), min_size=1, max_size=6))
def test_copy_line_round_trips_any_values(values: list[str | None]) -> None:
    line = "\t".join(_copy_escape(v) for v in values)
    assert parse_line(line, len(values)) == tuple(values)


def test_copy_line_cases() -> None:
    assert parse_line("1\t\\N\tx", 3) == ("1", None, "x")
    assert parse_line("a\\\\N\t\\\\", 2) == ("a\\N", "\\")  # an escaped backslash before N is not NULL
    assert parse_line("", 1) == ("",)
    with pytest.raises(CopyFormatError, match="2 fields, expected 3"):
        parse_line("1\t2", 3)
    with pytest.raises(CopyFormatError, match=r"unexpected escape \\q"):
        parse_line("a\\qb", 1)


def test_xids_visibility() -> None:
    snap = SnapshotXids.parse("100:105:100,103")
    assert [x for x in range(95, 110) if snap.invisible(x)] == [100, 103, 105, 106, 107, 108, 109]
    wrapped = SnapshotXids.parse(f"{2**32 - 2}:{2**32 + 3}:")  # the epoch is dropped: xmax is 3
    assert [wrapped.invisible(x) for x in (3, 10, 2, 2**32 - 5)] == [True, True, False, False]
    with pytest.raises(ValueError, match="pg_current_snapshot"):
        SnapshotXids.parse("nonsense")


REL = Relation(16400, "public", "t", "d", (Column("id", INT4, -1, True), Column("v", TEXT, -1, False)))


def _window(ids: range) -> ChunkWindow:
    return ChunkWindow.open(("public", "t"), REL, ("id",), [(str(i), f"v{i}") for i in ids], "wm")


def _change(op: str, old: tuple[object, ...] | None, new: tuple[object, ...] | None, rel: Relation = REL) -> RowChange:
    return RowChange(op, rel, old, new, False, 1, 0, 0)  # type: ignore[arg-type]


def test_window_drops_rows_whose_key_the_stream_touched() -> None:
    window = _window(range(1, 6))
    window.observe(_change("update", None, ("2", "new")))
    window.observe(_change("delete", ("4", None), None))
    window.observe(_change("insert", None, ("9", "x")))  # not in the chunk: nothing to drop
    other = Relation(16401, "public", "other", "d", REL.columns)
    window.observe(_change("update", None, ("1", "x"), other))  # another table
    assert list(window.rows) == [(1,), (3,), (5,)]
    assert window.dropped == 2


def test_window_key_change_drops_old_and_new_key() -> None:
    window = _window(range(1, 6))
    window.observe(_change("update", ("1", None), ("5", "moved")))
    assert list(window.rows) == [(2,), (3,), (4,)]


def test_window_matches_binary_stream_values_and_survives_schema_versions() -> None:
    window = _window(range(1, 4))
    widened = Relation(16400, "public", "t", "d", (Column("v", TEXT, -1, False), Column("id", INT8, -1, True)))
    window.observe(_change("update", None, ("x", (2).to_bytes(8, "big")), widened))  # binary int8 key, moved column
    window.observe(_change("delete", (None, "3"), None, widened))
    assert list(window.rows) == [(1,)]


def test_window_truncate_and_lost_key_column() -> None:
    window = _window(range(1, 4))
    window.observe(Truncate((REL,), False, False, 1, 0))
    assert (window.rows, window.dropped) == ({}, 3)
    window = _window(range(1, 4))
    renamed = Relation(16400, "public", "t", "d", (Column("ident", INT4, -1, True), Column("v", TEXT, -1, False)))
    window.observe(_change("insert", None, ("1", "x"), renamed))
    assert window.invalid


def test_window_admits_only_snapshots_that_saw_every_emitted_transaction() -> None:
    snap = SnapshotXids.parse("100:105:102")
    assert ChunkWindow.admits(snap, [90, 99, 101, 104])
    assert not ChunkWindow.admits(snap, [90, 102])  # committed in the WAL, not yet visible to the snapshot
    assert not ChunkWindow.admits(snap, [106])


def test_key_values_are_the_text_of_the_key_columns() -> None:
    assert key_values(REL, ("id",), ("7", "x")) == ["7"]


def test_state_store_round_trip_and_errors(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state", "s1")
    assert store.load() is None
    state = SnapshotState("s1", initial="running", consistent_point=42, queue=[TableProgress("public.t", "initial")])
    store.save(state)
    loaded = store.load()
    assert loaded == state
    store.path.write_text("{not json")
    with pytest.raises(StateError, match="not valid JSON"):
        store.load()
    store.path.write_text(json.dumps({"slot": "other"}))
    with pytest.raises(StateError, match="belongs to slot 'other'"):
        store.load()
    blocked = StateStore(store.path / "dir", "s1")  # parent is a file
    with pytest.raises(StateError, match="cannot write"):
        blocked.save(state)


def test_the_ledgers_positions_are_kept_beside_the_state_as_last_saved(tmp_path: Path) -> None:
    """The timeline and published position (for the promotion check of a later process) share the state file;
    saving them writes the state as last saved, never the one in memory (an exactly-once sink's commit may not have
    caught up with it)."""
    store = StateStore(tmp_path, "s1")
    state = SnapshotState("s1", queue=[TableProgress("public.t", "incremental")])
    store.save(state)
    state.queue[0].rows = 500  # in memory only
    store.save_positions(Positions(timeline=2, published_lsn=0x500))
    again = StateStore(tmp_path, "s1")
    loaded = again.load()
    assert again.positions == Positions(2, 0x500)
    assert loaded is not None
    assert loaded.queue[0].rows == 0
    legacy = json.loads(store.path.read_text())
    del legacy["positions"]
    store.path.write_text(json.dumps(legacy))  # written before positions were kept
    older = StateStore(tmp_path, "s1")
    assert older.load() is not None
    assert older.positions == Positions()


def test_enqueue_skips_duplicates_and_finish_remembers() -> None:
    state = SnapshotState("s")
    first = TableProgress("public.t", "incremental")
    assert state.enqueue(first)
    assert not state.enqueue(TableProgress("public.t", "incremental"))
    assert state.enqueue(TableProgress("public.t", "incremental", where="id > 5"))
    state.finish(first)
    assert state.finished == [first.id]
    assert len(state.queue) == 1


def test_start_state_new_slot_snapshots_every_table_unless_never() -> None:
    state = start_state(None, "s", "initial", 1000, ["public.a", "public.b"])
    assert (state.initial, state.consistent_point) == ("running", 1000)
    assert [(p.table, p.kind) for p in state.queue] == [("public.a", "initial"), ("public.b", "initial")]
    never = start_state(None, "s", "never", 1000, ["public.a"])
    assert (never.queue, never.initial, never.known_tables) == ([], "none", ["public.a"])


def test_start_state_resumes_an_interrupted_initial_snapshot_incrementally() -> None:
    saved = SnapshotState("s", initial="running", consistent_point=10, known_tables=["public.a", "public.b"])
    saved.queue = [TableProgress("public.b", "initial", last_key=["77"], rows=77)]
    state = start_state(saved, "s", "initial", None, ["public.a", "public.b", "public.c"])
    assert state.initial == "done"
    assert [(p.table, p.kind, p.last_key, p.resumed_initial) for p in state.queue] == [
        ("public.b", "incremental", ["77"], True),
        ("public.c", "incremental", None, False),  # newly captured
    ]
    assert state.known_tables == ["public.a", "public.b", "public.c"]


def test_start_state_follows_renamed_tables_by_relation_id() -> None:
    """A table renamed (or moved to another schema) since the last start keeps its queued snapshot's progress and
    is not newly captured: the state tracked tables by name, so it was re-read in full under its new name."""
    plan = start_state(None, "s", "initial", 10, ["public.a", "public.b"], relations={"public.a": 1, "public.b": 2})
    assert [(p.table, p.relation_id) for p in plan.queue] == [("public.a", 1), ("public.b", 2)]
    plan.queue[1].last_key, plan.queue[1].rows = ["77"], 77
    plan.queue = plan.queue[1:]
    renamed = {"public.a2": 1, "other.b": 2, "public.c": 3}
    state = start_state(plan, "s", "initial", None, list(renamed), relations=renamed)
    assert [(p.table, p.kind, p.last_key, p.rows) for p in state.queue] == [
        ("other.b", "incremental", ["77"], 77),
        ("public.c", "incremental", None, 0),  # newly captured: its id was not known
    ]
    assert (state.known_tables, state.known_relations) == (list(renamed), renamed)
    recreated = {"public.a2": 4, "other.b": 2, "public.c": 3}  # a2 dropped and made again: a new table
    again = start_state(state, "s", "initial", None, list(recreated), relations=recreated)
    assert [(p.table, p.relation_id) for p in again.queue][-1] == ("public.a2", 4)


def test_a_state_file_without_relation_ids_loads_and_tables_go_by_name(tmp_path: Path) -> None:
    store = StateStore(tmp_path, "s")
    old = {"slot": "s", "known_tables": ["public.a"], "queue": [{"table": "public.a", "kind": "incremental"}]}
    store.path.write_text(json.dumps(old))
    loaded = store.load()
    assert loaded is not None
    assert (loaded.known_relations, loaded.queue[0].relation_id) == ({}, None)
    relations = {"public.a": 1, "public.b": 2}
    state = start_state(loaded, "s", "initial", None, list(relations), relations=relations)
    assert [(p.table, p.relation_id) for p in state.queue] == [("public.a", None), ("public.b", 2)]


def test_start_state_existing_slot_without_state_snapshots_nothing() -> None:
    state = start_state(None, "s", "initial", None, ["public.a"])
    assert (state.queue, state.known_tables) == ([], ["public.a"])


def test_window_merges_an_update_that_left_toasted_values_out() -> None:
    """The stream's row lacks the TOASTed value: the chunk row is kept, updated, with the chunk's value."""
    window = _window(range(1, 4))
    window.observe(_change("update", None, ("2", UNCHANGED_TOAST)))
    assert window.rows[(2,)] == ("2", "v2")
    assert (window.merged, window.dropped) == (1, 0)
    three = Relation(16400, "public", "t", "d", (*REL.columns, Column("w", TEXT, -1, False)))
    window.observe(_change("update", None, ("3", UNCHANGED_TOAST, "w"), three))  # another layout: read again
    assert window.invalid
    window = _window(range(1, 4))
    window.observe(_change("update", ("1", None), ("9", UNCHANGED_TOAST)))  # key changed: dropped as usual
    assert list(window.rows) == [(2,), (3,)]


def test_state_dir_problem_names_the_directory(tmp_path: Path) -> None:
    from cdcd.snapshot.state import state_dir_problem  # noqa: PLC0415

    assert state_dir_problem(tmp_path / "new" / "dir") is None
    (tmp_path / "file").write_text("")
    problem = state_dir_problem(tmp_path / "file" / "sub")
    assert problem is not None
    assert f"snapshot.state_dir {tmp_path / 'file' / 'sub'} is not writable" in problem


def test_the_state_file_and_the_json_lines_output_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    """They hold chunk keys and rows in clear: a hashed key column's too."""
    from cdcd.cli import _sink  # noqa: PLC0415
    from cdcd.config import Settings  # noqa: PLC0415

    store = StateStore(tmp_path / "state", "s1")
    old = os.umask(0o022)
    try:
        store.path.parent.mkdir()
        store.path.write_text("{}")  # as an older cdcd left it: 0644
        store.save(SnapshotState("s1", queue=[TableProgress("public.t", "initial", last_key=["secret"])]))
        output = tmp_path / "out.jsonl"
        _, _, out = _sink(Settings.model_validate({"source": {"dsn": "host=x"}}), str(output))
        assert out is not None
        out.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(output.stat().st_mode) == 0o600
