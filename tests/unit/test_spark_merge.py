"""cdcd.spark.merge without Spark: the SQL each micro-batch runs for one table."""

from __future__ import annotations

import pytest

from cdcd.spark.merge import (
    evolve_sql,
    first_conflict_sql,
    insert_sql,
    keyed_events_sql,
    latest_sql,
    lineage_events_sql,
    merge_sql,
    moved_latest_sql,
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


def test_insert_sql_inserts_what_is_not_deleted() -> None:
    assert insert_sql("delta.`/m/t`", "latest", ["id"], SCHEMA) == (
        "INSERT INTO delta.`/m/t` (`id`, `big`, _cdc_commit_lsn, _cdc_lsn) "
        "SELECT `id`, `big`, _commit_lsn, _lsn FROM latest WHERE _op <> 'd'"
    )


def test_first_conflict_is_an_earlier_touch_of_the_new_key_or_an_earlier_delete_or_move_of_the_old_key() -> None:
    sql = first_conflict_sql("ev", "mv", ["a"])
    earlier = "(m._commit_lsn > e._commit_lsn OR (m._commit_lsn = e._commit_lsn AND m._lsn > e._lsn))"
    touches = (
        f"SELECT `a`, _commit_lsn, _lsn, _op AS _kind FROM ({keyed_events_sql('ev', ['a'])}) UNION ALL "
        "SELECT `_old_a`, _commit_lsn, _lsn, 'moved' FROM mv UNION ALL "
        "SELECT `_new_a`, _commit_lsn, _lsn, 'moved' FROM mv"
    )
    assert sql == (
        "SELECT min(struct(_commit_lsn, _lsn)) AS first FROM ("
        f"SELECT m._commit_lsn, m._lsn FROM mv m JOIN ({touches}) e ON e.`a` <=> m.`_new_a` AND {earlier} "  # any
        f"UNION ALL SELECT m._commit_lsn, m._lsn FROM mv m JOIN ({touches}) e ON e.`a` <=> m.`_old_a` AND {earlier}"
        " AND e._kind IN ('d', 'moved'))"
    )


def test_lineage_events_add_inherited_events_a_move_and_a_delete_per_key_change() -> None:
    sql = lineage_events_sql("ev", "mv", ["id"])
    events = keyed_events_sql("ev", ["id"])
    before = "(m._commit_lsn > e._commit_lsn OR (m._commit_lsn = e._commit_lsn AND m._lsn > e._lsn))"
    # the events as they are
    assert sql.startswith(
        f"SELECT `id`, _op, _commit_lsn, _lsn, _offset, _unchanged_toast, after, NULL AS _root, false AS _inherited "
        f"FROM ({events}) UNION ALL "
    )
    # the old key's events before the change, again under the new key
    assert (
        "SELECT m.`_new_id` AS `id`, e._op, e._commit_lsn, e._lsn, e._offset, e._unchanged_toast, e.after, NULL, "
        f"true FROM ({events}) e JOIN mv m ON e.`id` <=> m.`_old_id` AND {before} UNION ALL "
    ) in sql
    # the move under the new key, one byte of WAL before the change, naming the old key and the change's position
    assert (
        "SELECT m.`_new_id` AS `id`, 'm', m._commit_lsn, m._lsn - 1, -1, CAST(array() AS array<string>) AS "
        "_unchanged_toast, NULL AS after, named_struct('id', m.`_old_id`, '_commit_lsn', m._commit_lsn, '_lsn', "
        "m._lsn), false FROM mv m UNION ALL "
    ) in sql
    # the old key deleted at the change, whichever half is in the batch
    assert sql.endswith(
        "SELECT m.`_old_id` AS `id`, 'd', m._commit_lsn, m._lsn, -1, CAST(array() AS array<string>) AS "
        "_unchanged_toast, NULL AS after, NULL, false FROM mv m"
    )


def test_moved_latest_takes_the_rows_it_moves_from_the_mirror_when_older_than_the_change() -> None:
    sql = moved_latest_sql("ev", "mv", "delta.`/m/t`", ["id"], SCHEMA)
    latest = latest_sql(f"({lineage_events_sql('ev', 'mv', ['id'])})", ["id"], SCHEMA, None, lineage=True)
    older = (
        "(s._root._commit_lsn > o._cdc_commit_lsn OR "
        "(s._root._commit_lsn = o._cdc_commit_lsn AND s._root._lsn > o._cdc_lsn))"
    )
    assert sql == (
        "SELECT s.*, o.`big` AS `_base_big`, (o._cdc_lsn IS NOT NULL OR s._inherited) AS _moved "
        f"FROM ({latest}) s LEFT JOIN delta.`/m/t` o ON o.`id` <=> s._root.`id` AND {older}"
    )
    # a move sends no value; the newest move names the row it moves from
    assert "CASE WHEN _op IN ('d', 'm') OR array_contains(_unchanged_toast, 'big') THEN NULL" in latest
    assert "max_by(_root, CASE WHEN _root IS NOT NULL THEN struct(_commit_lsn, _lsn, _offset) END) AS _root" in latest
    assert "bool_or(_inherited) AS _inherited" in latest


def test_merge_sql_of_moved_rows_keeps_the_old_rows_values() -> None:
    sql = merge_sql("delta.`/m/t`", "latest", ["id"], SCHEMA, moved=True)
    guard = newer()
    upsert = "s._op <> 'd' AND (s._op <> 'm' OR s._moved)"  # a move with nothing to move does nothing
    assert f"WHEN MATCHED AND s._op = 'd' AND {guard} THEN DELETE " in sql
    assert f"WHEN MATCHED AND {upsert} AND {guard} THEN UPDATE SET " in sql
    assert (
        "t.`big` = CASE WHEN s.`_keep_big` THEN CASE WHEN s._moved THEN s.`_base_big` ELSE t.`big` END ELSE s.`big` END"
    ) in sql
    assert "t.`id` = CASE WHEN s.`_keep_id` THEN t.`id` ELSE s.`id` END" in sql
    assert sql.endswith(
        f"WHEN NOT MATCHED AND {upsert} THEN INSERT (`id`, `big`, _cdc_commit_lsn, _cdc_lsn) VALUES (s.`id`, "
        "CASE WHEN s.`_keep_big` THEN CASE WHEN s._moved THEN s.`_base_big` ELSE NULL END ELSE s.`big` END, "
        "s._commit_lsn, s._lsn)"
    )
