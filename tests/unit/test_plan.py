"""One plan per table version: shared by the stages, kept when a Relation is sent again unchanged."""

from __future__ import annotations

from cdcd.pgoutput.messages import Column, Relation
from cdcd.plan import FilterRules, Plans

COLUMNS = (Column("id", 23, -1, True), Column("v", 25, -1, False))


def relation(columns: tuple[Column, ...] = COLUMNS, xid: int | None = None, identity: str = "d") -> Relation:
    return Relation(16384, "public", "t", identity, columns, xid)  # type: ignore[arg-type]


def test_a_relation_sent_again_unchanged_keeps_its_plan_and_what_the_stages_built() -> None:
    plans = Plans()
    first = plans.get(relation())
    first.filter, first.filtered = FilterRules(None, None, None), True
    again = relation(xid=77)  # the same version, sent again inside a streamed block
    plan = plans.get(again)
    assert plan is first
    assert plan.relation is again
    assert plan.filtered
    assert plans.get(again) is plan


def test_a_new_table_version_gets_a_new_plan() -> None:
    plans = Plans()
    old = plans.get(relation())
    old.filtered = True
    new = plans.get(relation((*COLUMNS, Column("w", 20, -1, False))))
    assert new is not old
    assert not new.filtered
    assert new.wire is None
    assert new.json is None
    assert plans.get(relation(identity="f")) is not new  # the replica identity is part of the version


def test_what_every_stage_reads() -> None:
    plan = Plans().get(Relation(1, "shop", "orders", "d", (Column("a", 25, -1, False), *COLUMNS)))
    assert plan.table == "shop.orders"
    assert plan.key_positions == (1,)
