"""The Kafka sink's pure parts: topic names, key-change detection, transaction ordering."""

from __future__ import annotations

from cdcd.pgoutput.messages import Column, Relation, RowChange
from cdcd.progress import Progress
from cdcd.sink.kafka import _definition, _Emit, _key_changed, topic_name

REL = Relation(1, "public", "t", "d", (Column("id", 23, -1, True), Column("v", 25, -1, False)))


def test_topic_names_are_kafka_legal() -> None:
    assert topic_name("cdcd", "public", "orders") == "cdcd.public.orders"
    assert topic_name("cdcd", "", "pg_class") == "cdcd.pg_catalog.pg_class"
    assert topic_name("p", "Sales Dept", 'we"ird/tbl') == "p.Sales_Dept.we_ird_tbl"


def update(old: tuple[str, str] | None, new: tuple[str, str], old_is_key: bool = False) -> RowChange:
    return RowChange("update", REL, old, new, old_is_key, None, 0, 0)


def test_key_change_detection() -> None:
    assert _key_changed(update(("1", None), ("2", "x"), old_is_key=True))  # type: ignore[arg-type]
    assert not _key_changed(update(("1", "a"), ("1", "b")))  # full old row, same key
    assert _key_changed(update(("1", "a"), ("2", "a")))


def test_definition_ignores_the_streamed_xid() -> None:
    streamed = Relation(1, "public", "t", "d", REL.columns, xid=777)
    assert _definition(streamed) == _definition(REL)
    assert _definition(Relation(1, "public", "t", "f", REL.columns)) != _definition(REL)


def test_transaction_order_counts_per_topic_and_in_total() -> None:
    progress = Progress()
    ctx = _Emit(progress, progress.open(10), lambda topic, error: None, "5:99", 0)
    orders = [ctx.order(topic) for topic in ("a", "b", "a", "a", "b")]
    assert [(o.total_order, o.data_collection_order) for o in orders] == [(1, 1), (2, 1), (3, 2), (4, 3), (5, 2)]
    assert {o.id for o in orders} == {"5:99"}
    assert dict(ctx.counts) == {"a": 3, "b": 2}
