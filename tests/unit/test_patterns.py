"""Tables by pattern: Debezium's matching rules, the configuration's checks, which tables a publication captures
beyond those it lists, the filter plan's coverage, and what is snapshotted when a table becomes captured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdcd.cli import main
from cdcd.config import ConfigError, Publication, load_settings
from cdcd.filters import FilterPlan
from cdcd.snapshot.runner import Snapshotter, start_state
from cdcd.snapshot.state import SnapshotState, StateStore
from cdcd.source.catalog import implied_tables, tracks_new_tables


def publication(**fields: Any) -> Publication:
    return Publication.model_validate({"name": "p", **fields})


@pytest.mark.parametrize(
    ("include", "exclude", "table", "matched"),
    [
        ([r"shop\..*"], [], "shop.orders", True),
        ([r"shop\..*"], [], "shopping.cart", False),  # the dot is escaped: the schema is shop
        (["shop.*"], [], "shopping.cart", True),  # Debezium's regex: an unescaped dot and .* match more
        ([r"shop\..*"], [], "SHOP.Orders", True),  # case-insensitive, as Debezium
        ([r"shop\..*"], [r"shop\.tmp_.*"], "shop.tmp_x", False),
        ([r"^audit\..*_log$"], [], "audit.login_log", True),
        ([r"audit\..*_log"], [], "audit.login_log_old", False),  # anchored on the whole name
        ([r"audit\..*_log"], [], "xaudit.a_log", False),
        (["orders"], [], "shop.orders", False),  # the whole schema.table, not a part of it
        ([], [r"public\..*"], "shop.orders", True),  # only exclusions: every other table
        ([], [r"public\..*"], "public.t", False),
        ([r"a\.x", r"b\.y"], [], "b.y", True),
    ],
)
def test_patterns_match_the_whole_name_ignoring_case(
    include: list[str], exclude: list[str], table: str, matched: bool
) -> None:
    assert publication(include_tables=include, exclude_tables=exclude).matches(table) is matched


def test_a_publication_without_patterns_matches_nothing() -> None:
    assert not publication(tables=[{"name": "public.t"}]).matches("public.t")
    assert not publication(all_tables=True).matches("public.t")
    assert publication(exclude_tables=["x"]).defined


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cdcd.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("publication_yaml", "fragments"),
    [
        (
            "{name: p, include_tables: ['shop\\.(orders']}",
            ["include_tables", "'shop\\\\.(orders'", "not a valid regular"],
        ),
        ("{name: p, exclude_tables: ['*x']}", ["exclude_tables", "'*x'", "not a valid regular"]),
        ("{name: p, all_tables: true, include_tables: ['a\\..*']}", ["mutually exclusive"]),
        (
            "{name: p, tables: [{name: shop.tmp_a}], exclude_tables: ['shop\\.tmp_.*']}",
            ["shop.tmp_a listed in tables but matched by exclude_tables"],
        ),
    ],
)
def test_bad_patterns_are_configuration_errors(tmp_path: Path, publication_yaml: str, fragments: list[str]) -> None:
    text = f"source: {{dsn: 'host=x', manage_publications: true, publications: [{publication_yaml}]}}\n"
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text))
    for fragment in fragments:
        assert fragment in str(info.value)


def test_patterns_need_managed_publications(tmp_path: Path) -> None:
    text = "source: {dsn: 'host=x', publications: [{name: p, include_tables: ['a\\..*']}]}\n"
    with pytest.raises(ConfigError, match="set manage_publications: true"):
        load_settings(write(tmp_path, text))


def test_an_invalid_pattern_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = "source: {dsn: 'host=x', manage_publications: true, publications: [{name: p, include_tables: ['(']}]}\n"
    assert main(["check", "--config", str(write(tmp_path, text))]) == 2
    assert "include_tables: '(' is not a valid regular expression" in capsys.readouterr().err


CANDIDATES = ["audit.a_log", "public.t", "shop.orders", "shop.tmp_x", "shopping.cart"]


def test_implied_tables_are_the_pattern_matches_beyond_the_listed_ones() -> None:
    pub = publication(
        tables=[{"name": "shop.orders", "where": "id > 1"}], include_tables=[r"shop\..*"], exclude_tables=[r".*tmp.*"]
    )
    assert implied_tables(pub, CANDIDATES, 170000) == []  # shop.orders is listed (with its filter)
    pub = publication(include_tables=[r"shop\..*", r"audit\..*"])
    assert implied_tables(pub, CANDIDATES, 140000) == ["audit.a_log", "shop.orders", "shop.tmp_x"]


def test_schemas_are_kept_by_cdcd_on_14_only() -> None:
    pub = publication(schemas=["shop"], include_tables=[r".*\.t"])
    assert implied_tables(pub, CANDIDATES, 140000) == ["public.t", "shop.orders", "shop.tmp_x"]
    assert implied_tables(pub, CANDIDATES, 150000) == ["public.t"]  # FOR TABLES IN SCHEMA shop holds the rest
    schemas_only = publication(schemas=["shop"])
    assert tracks_new_tables(schemas_only, 140000)
    assert not tracks_new_tables(schemas_only, 150000)
    assert tracks_new_tables(publication(include_tables=["x"]), 170000)
    assert not tracks_new_tables(publication(tables=[{"name": "a.b"}]), 140000)


def test_a_pattern_covers_its_tables_in_the_filter_plan() -> None:
    filtered = publication(name="f", tables=[{"name": "shop.orders", "where": "id > 10"}])
    patterned = publication(name="g", include_tables=[r"shop\..*"], exclude_tables=[r"shop\.orders"])
    assert FilterPlan([filtered, patterned]).filters_for("shop.orders").insert is not None  # excluded: filtered
    every_row = publication(name="g", include_tables=[r"shop\..*"])
    plan = FilterPlan([filtered, every_row])
    assert plan.filters_for("shop.orders").unfiltered  # another publication publishes every row of it
    assert plan.copy_filters("shop.orders") is None
    assert plan.filters_for("shop.new").uncovered == ()
    # A pattern never adds a partition, only its root: the partition is covered when the pattern matches the root.
    parts = publication(name="g", include_tables=[r"shop\.part_.*"])
    partition = FilterPlan([publication(name="h", tables=[{"name": "shop.part_1", "where": "id > 1"}]), parts])
    assert partition.needs_ancestors("shop.part_1")
    assert partition.filters_for("shop.part_1", ancestors=["shop.parent"]).insert is not None
    assert partition.filters_for("shop.part_1", ancestors=["shop.part_mid", "shop.part_root"]).unfiltered
    assert partition.filters_for("shop.part_1").unfiltered  # not a partition: matched itself


def test_new_tables_off_snapshots_no_newly_captured_table_at_start() -> None:
    saved = SnapshotState("s", initial="done", known_tables=["public.a"])
    state = start_state(saved, "s", "initial", None, ["public.a", "public.b"], new_tables=False)
    assert (state.queue, state.known_tables) == ([], ["public.a", "public.b"])
    saved = SnapshotState("s", initial="done", known_tables=["public.a"])
    state = start_state(saved, "s", "initial", None, ["public.a", "public.b"])
    assert [p.table for p in state.queue] == ["public.b"]


@pytest.mark.parametrize("snapshot", [True, False])
def test_a_table_captured_while_streaming_is_known_and_queued_when_asked(tmp_path: Path, snapshot: bool) -> None:
    store = StateStore(tmp_path, "s")
    state = SnapshotState("s", initial="done", known_tables=["public.a"], known_relations={"public.a": 10})
    snapshotter = Snapshotter(None, None, None, store, state, FilterPlan([]), 100, {})  # type: ignore[arg-type]
    snapshotter.captured_now({"public.a": 10, "shop.late": 11}, {}, snapshot)
    saved = store.load()
    assert saved is not None
    assert saved.known_tables == ["public.a", "shop.late"]
    assert [(p.table, p.kind) for p in saved.queue] == ([("shop.late", "incremental")] if snapshot else [])
    assert snapshotter.pending is snapshot


def test_a_table_renamed_while_streaming_is_known_under_its_new_name_and_not_queued(tmp_path: Path) -> None:
    store = StateStore(tmp_path, "s")
    state = SnapshotState("s", initial="done", known_tables=["public.a"], known_relations={"public.a": 10})
    snapshotter = Snapshotter(None, None, None, store, state, FilterPlan([]), 100, {})  # type: ignore[arg-type]
    snapshotter.captured_now({"public.b": 10}, {}, True)
    assert (state.known_tables, state.queue) == (["public.b"], [])


ROOT, OLD, NEW = 20, 21, 22
BOUNDS = {OLD: "((id IS NOT NULL) AND (id < 100))", NEW: "((id IS NOT NULL) AND (id >= 100) AND (id < 200))"}


def test_a_partition_attached_to_a_table_published_as_its_root_is_snapshotted_through_the_root(
    tmp_path: Path,
) -> None:
    """ATTACH writes no change for the rows the partition holds: they are read by an incremental snapshot of the
    root restricted to the partition (its constraint), once; a partition seen before is not read again."""
    store = StateStore(tmp_path, "s")
    relations = {"shop.orders": ROOT}
    state = start_state(None, "s", "initial", 1000, list(relations), relations=relations, partitions={ROOT: {}})
    state.queue = []
    snapshotter = Snapshotter(None, None, None, store, state, FilterPlan([]), 100, {})  # type: ignore[arg-type]
    snapshotter.captured_now(relations, {ROOT: {OLD: BOUNDS[OLD]}}, True)
    snapshotter.captured_now(relations, {ROOT: dict(BOUNDS)}, True)
    snapshotter.captured_now(relations, {ROOT: dict(BOUNDS)}, True)
    saved = store.load()
    assert saved is not None
    assert [(p.table, p.kind, p.key_range, p.relation_id) for p in saved.queue] == [
        ("shop.orders", "incremental", BOUNDS[OLD], ROOT),
        ("shop.orders", "incremental", BOUNDS[NEW], ROOT),
    ]
    assert saved.known_partitions == {str(ROOT): [OLD, NEW]}


def test_partitions_attached_while_cdcd_was_stopped_are_queued_at_start_and_a_detached_one_is_forgotten() -> None:
    saved = SnapshotState("s", initial="done", known_tables=["shop.orders"], known_relations={"shop.orders": ROOT})
    saved.known_partitions = {str(ROOT): [OLD, 99]}
    relations = {"shop.orders": ROOT}
    state = start_state(saved, "s", "initial", None, list(relations), relations=relations, partitions={ROOT: BOUNDS})
    assert [(p.table, p.key_range) for p in state.queue] == [("shop.orders", BOUNDS[NEW])]
    assert state.known_partitions == {str(ROOT): [OLD, NEW]}


@pytest.mark.parametrize("created", [1000, None])
def test_the_partitions_of_a_root_seen_for_the_first_time_are_only_remembered(created: int | None) -> None:
    """Its own snapshot (or the stream, for a slot without a plan) has their rows."""
    relations = {"shop.orders": ROOT}
    state = start_state(None, "s", "initial", created, list(relations), relations=relations, partitions={ROOT: BOUNDS})
    assert [p.key_range for p in state.queue] == ([None] if created else [])
    assert state.known_partitions == {str(ROOT): [OLD, NEW]}


def test_no_partition_is_queued_with_new_tables_off() -> None:
    saved = SnapshotState("s", initial="done", known_tables=["shop.orders"], known_relations={"shop.orders": ROOT})
    saved.known_partitions = {str(ROOT): [OLD]}
    relations = {"shop.orders": ROOT}
    state = start_state(
        saved, "s", "initial", None, list(relations), relations=relations, partitions={ROOT: BOUNDS}, new_tables=False
    )
    assert (state.queue, state.known_partitions) == ([], {str(ROOT): [OLD, NEW]})
