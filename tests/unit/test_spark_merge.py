"""cdcd.spark.merge without Spark: the SQL each micro-batch runs for one table."""

from __future__ import annotations

import pytest

from cdcd.spark.merge import evolve_sql, keyed_events_sql, latest_sql, merge_sql, newer, position_after, truncate_sql
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
