"""cdcd.spark.merge without Spark: the SQL each micro-batch runs for one table."""

from __future__ import annotations

import pytest

from cdcd.spark.merge import (
    evolve_sql,
    first_conflict_sql,
    keyed_events_sql,
    latest_sql,
    merge_sql,
    movable_sql,
    move_sql,
    moves_sql,
    newer,
    position_after,
    truncate_sql,
    window_sql,
)
from cdcd.spark.schema import Column, TableSchema

SCHEMA = TableSchema((Column("id", "int"), Column("big", "string")))


def test_positions_order_by_commit_lsn_then_lsn() -> None:
    assert position_after("c", "l", (5, 7)) == "(c > 5 OR (c = 5 AND l > 7))"
    assert (
        newer() == "(s._commit_lsn > t._cdc_commit_lsn OR (s._commit_lsn = t._cdc_commit_lsn AND s._lsn > t._cdc_lsn))"
    )


def test_latest_sql_picks_the_newest_event_per_key_and_the_newest_sent_value_per_column() -> None:
    sql = latest_sql("ev", ["id"], SCHEMA, None)
    order = "struct(_commit_lsn, _lsn, _offset)"
    assert f"max_by(struct(_op, _commit_lsn, _lsn), {order}) AS _last" in sql
    # big: a value counts only where it was sent (not a delete, not listed as unchanged TOAST)
    assert (
        "max_by(struct(after.`big` AS v), CASE WHEN _op = 'd' OR array_contains(_unchanged_toast, 'big') "
        f"THEN NULL ELSE {order} END) AS `_v_big`"
    ) in sql
    assert "`_v_big` IS NULL AS `_keep_big`" in sql  # never sent in the batch: the mirror keeps its value
    assert "false AS `_keep_id`" in sql  # a key column's value is the key itself
    assert "`_v_id`" not in sql
    assert keyed_events_sql("ev", ["id"]) in sql
    assert "GROUP BY `id`" in sql


def test_keyed_events_take_the_key_of_the_old_row_for_deletes_and_delete_moved_keys() -> None:
    sql = keyed_events_sql("ev", ["a", "b"])
    assert sql.startswith(
        "SELECT CASE WHEN _op = 'd' THEN before.`a` ELSE after.`a` END AS `a`, "
        "CASE WHEN _op = 'd' THEN before.`b` ELSE after.`b` END AS `b`, _op, "
        "_commit_lsn, _lsn, _offset, _unchanged_toast, after FROM ev WHERE TRUE UNION ALL "
    )
    assert sql.endswith(
        "SELECT before.`a` AS `a`, before.`b` AS `b`, 'd' AS _op, _commit_lsn, _lsn, _offset, _unchanged_toast, "
        "after FROM ev WHERE TRUE AND _op = 'u' AND before IS NOT NULL "
        "AND NOT (before.`a` <=> after.`a` AND before.`b` <=> after.`b`)"
    )


def test_latest_sql_drops_events_before_a_truncate() -> None:
    sql = latest_sql("ev", ["a", "b"], SCHEMA, (100, 90))
    assert keyed_events_sql("ev", ["a", "b"], (100, 90)) in sql
    assert sql.count("WHERE (_commit_lsn > 100 OR (_commit_lsn = 100 AND _lsn > 90))") == 2
    assert "GROUP BY `a`, `b`" in sql


def test_merge_sql_deletes_updates_when_newer_and_inserts() -> None:
    sql = merge_sql("delta.`/m/t`", "latest", ["id"], SCHEMA)
    guard = newer()
    assert sql.startswith("MERGE INTO delta.`/m/t` AS t USING latest AS s ON t.`id` <=> s.`id` ")
    assert f"WHEN MATCHED AND s._op = 'd' AND {guard} THEN DELETE " in sql
    assert f"WHEN MATCHED AND s._op <> 'd' AND {guard} THEN UPDATE SET " in sql
    assert "t.`big` = CASE WHEN s.`_keep_big` THEN t.`big` ELSE s.`big` END" in sql
    assert "t._cdc_commit_lsn = s._commit_lsn, t._cdc_lsn = s._lsn" in sql
    assert sql.endswith(
        "WHEN NOT MATCHED AND s._op <> 'd' THEN INSERT (`id`, `big`, _cdc_commit_lsn, _cdc_lsn) "
        "VALUES (s.`id`, s.`big`, s._commit_lsn, s._lsn)"
    )


def test_truncate_deletes_rows_written_up_to_its_position() -> None:
    assert truncate_sql("m", (10, 4)) == (
        "DELETE FROM m WHERE NOT (_cdc_commit_lsn > 10 OR (_cdc_commit_lsn = 10 AND _cdc_lsn > 4))"
    )


def test_evolve_adds_and_drops_columns() -> None:
    target = TableSchema((Column("id", "int"), Column("note", "string"), Column("day", "date")))
    assert evolve_sql("m", SCHEMA, target) == [
        "ALTER TABLE m ADD COLUMNS (`note` string, `day` date)",
        "ALTER TABLE m DROP COLUMNS (`big`)",
    ]
    assert evolve_sql("m", SCHEMA, SCHEMA) == []
    with pytest.raises(ValueError, match="type of column"):
        evolve_sql("m", SCHEMA, TableSchema((Column("id", "bigint"),)))


def test_window_sql_bounds_events_by_position() -> None:
    assert window_sql("ev", None, None, None) == "SELECT * FROM ev WHERE TRUE"
    sql = window_sql("ev", (1, 2), (3, 4), (5, 6))
    assert sql == (
        "SELECT * FROM ev WHERE TRUE AND (_commit_lsn > 1 OR (_commit_lsn = 1 AND _lsn > 2))"  # after the truncate
        " AND NOT (3 > _commit_lsn OR (3 = _commit_lsn AND 4 > _lsn))"  # from start on
        " AND (5 > _commit_lsn OR (5 = _commit_lsn AND 6 > _lsn))"  # before end
    )


def test_moves_sql_takes_a_key_change_from_either_half() -> None:
    sql = moves_sql("ev", ["a"])
    assert sql == (
        "SELECT _moved_from.`a` AS `_old_a`, after.`a` AS `_new_a`, _commit_lsn, _lsn FROM ev "
        "WHERE _op = 'c' AND _moved_from IS NOT NULL UNION "  # UNION: both halves give one row
        "SELECT before.`a` AS `_old_a`, _moved_to.`a` AS `_new_a`, _commit_lsn, _lsn FROM ev "
        "WHERE _op = 'd' AND _moved_to IS NOT NULL"
    )


def test_first_conflict_looks_for_earlier_events_on_the_old_or_the_new_key() -> None:
    sql = first_conflict_sql("ev", "mv", ["a"])
    earlier = "(m._commit_lsn > e._commit_lsn OR (m._commit_lsn = e._commit_lsn AND m._lsn > e._lsn))"
    assert f"JOIN ({keyed_events_sql('ev', ['a'])}) e ON e.`a` <=> m.`_old_a` AND {earlier}" in sql
    assert f"JOIN ({keyed_events_sql('ev', ['a'])}) e ON e.`a` <=> m.`_new_a` AND {earlier}" in sql
    assert sql.startswith("SELECT min(struct(_commit_lsn, _lsn)) AS first FROM (")


def test_move_sql_moves_older_rows_just_before_the_change() -> None:
    sql = move_sql("delta.`/m/t`", "mv", ["id"], SCHEMA)
    older = "(m._commit_lsn > o._cdc_commit_lsn OR (m._commit_lsn = o._cdc_commit_lsn AND m._lsn > o._cdc_lsn))"
    assert (
        movable_sql("delta.`/m/t`", "mv", ["id"]) == f"mv m JOIN delta.`/m/t` o ON o.`id` <=> m.`_old_id` AND {older}"
    )
    # the row under the new key, one byte of WAL before the change, with the old row's values
    assert "SELECT m.`_new_id`, o.`big`, 'u' AS _action, m._commit_lsn, m._lsn - 1 FROM mv m JOIN" in sql
    # the row under the old key goes, once however many changes name it
    assert "SELECT o.`id`, o.`big`, 'd', o._cdc_commit_lsn, o._cdc_lsn FROM delta.`/m/t` o LEFT SEMI JOIN mv m" in sql
    assert "WHEN MATCHED AND s._action = 'd' THEN DELETE" in sql
    assert f"WHEN MATCHED AND s._action = 'u' AND {newer()} THEN UPDATE SET t.`big` = s.`big`" in sql
    assert "WHEN NOT MATCHED AND s._action = 'u' THEN INSERT (`id`, `big`, _cdc_commit_lsn, _cdc_lsn)" in sql
