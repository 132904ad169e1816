"""Row filters applied to changes: PostgreSQL 15's combining rules (plan) and UPDATE transformations."""

from __future__ import annotations

from typing import Any

import pytest

from cdcd.config import Publication
from cdcd.filters import FilterFailure, FilterPlan, RowFilter
from cdcd.filters.checks import ColumnInfo, TableInfo, check_filters
from cdcd.pgoutput.messages import UNCHANGED_TOAST, Column, Relation, Row, RowChange

INT4, TEXT = 23, 25


def pub(name: str, *tables: Any, **options: Any) -> Publication:
    refs = [{"name": t} if isinstance(t, str) else {"name": t[0], "where": t[1]} for t in tables]
    return Publication.model_validate({"name": name, "tables": refs, **options})


def relation(
    name: str = "t1", columns: str = "a:int4:k b:int4 c:text:k", identity: str = "d", rid: int = 1
) -> Relation:
    cols = []
    for spec in columns.split():
        parts = spec.split(":")
        cols.append(Column(parts[0], INT4 if parts[1] == "int4" else TEXT, -1, "k" in parts[2:]))
    return Relation(rid, "public", name, identity, tuple(cols))  # type: ignore[arg-type]


def change(op: str, rel: Relation, old: Row | None, new: Row | None, old_is_key: bool = True) -> RowChange:
    return RowChange(op, rel, old, new, old_is_key, None, 0, 0)  # type: ignore[arg-type]


# -- the seed's worked example, publication p1 on t1 ------------------------------------------------------

P1 = pub("p1", ("public.t1", "a > 5 AND c = 'NSW'"))
T1 = relation()


def seed_filter() -> RowFilter:
    return RowFilter(FilterPlan([P1]))


def test_inserts_publish_only_matching_rows() -> None:
    f = seed_filter()
    rows = [("2", "102", "NSW"), ("3", "103", "QLD"), ("6", "106", "NSW"), ("9", "109", "NSW")]
    published = [r for r in rows if f.apply(change("insert", T1, None, r))]
    assert published == [("6", "106", "NSW"), ("9", "109", "NSW")]
    assert f.filtered["public.t1"] == 2


def test_update_both_rows_match_stays_an_update() -> None:
    out = seed_filter().apply(change("update", T1, None, ("6", "999", "NSW")))
    assert out is not None
    assert (out.op, out.new) == ("update", ("6", "999", "NSW"))


def test_update_only_new_row_matches_becomes_insert() -> None:
    out = seed_filter().apply(change("update", T1, ("2", None, "NSW"), ("555", "102", "NSW")))
    assert out is not None
    assert (out.op, out.old, out.new) == ("insert", None, ("555", "102", "NSW"))


def test_update_only_old_row_matches_becomes_delete_of_the_old_row() -> None:
    out = seed_filter().apply(change("update", T1, ("9", None, "NSW"), ("9", "109", "VIC")))
    assert out is not None
    assert (out.op, out.old, out.new, out.old_is_key) == ("delete", ("9", None, "NSW"), None, True)


def test_update_neither_row_matches_is_dropped() -> None:
    assert seed_filter().apply(change("update", T1, ("2", None, "QLD"), ("3", "1", "QLD"))) is None


def test_update_without_old_tuple_evaluates_the_new_row_only() -> None:
    f = seed_filter()
    assert f.apply(change("update", T1, None, ("4", "1", "VIC"))) is None
    assert f.apply(change("update", T1, None, ("7", "1", "NSW"))) is not None


def test_delete_evaluates_the_old_key() -> None:
    f = seed_filter()
    assert f.apply(change("delete", T1, ("6", None, "NSW"), None)) is not None
    assert f.apply(change("delete", T1, ("3", None, "QLD"), None)) is None


def test_null_is_not_a_match() -> None:
    f = RowFilter(FilterPlan([pub("p", ("public.t1", "b > 5"), publish=["insert"])]))
    assert f.apply(change("insert", T1, None, ("1", None, "x"))) is None
    assert f.apply(change("insert", T1, None, ("1", "6", "x"))) is not None


# -- combining filters ------------------------------------------------------------------------------------


def test_filters_of_several_publications_are_ored() -> None:
    t2 = relation("t2", "d:int4:k e:int4 f:int4", identity="f", rid=2)
    plan = FilterPlan([pub("p2", "public.t1", ("public.t2", "e = 99")), pub("p3", ("public.t2", "d = 10"))])
    f = RowFilter(plan)
    assert f.apply(change("insert", t2, None, ("10", "1", "1"))) is not None
    assert f.apply(change("insert", t2, None, ("1", "99", "1"))) is not None
    assert f.apply(change("insert", t2, None, ("1", "1", "1"))) is None


@pytest.mark.parametrize(
    "other",
    [
        pub("p2", "public.t1"),
        Publication(name="p2", all_tables=True),
        Publication(name="p2", schemas=["public"]),
    ],
    ids=["no-filter", "all-tables", "schema"],
)
def test_one_unfiltered_publication_makes_the_other_filters_redundant(other: Publication) -> None:
    f = RowFilter(FilterPlan([P1, other]))
    assert f.apply(change("insert", T1, None, ("1", "1", "QLD"))) is not None


def test_a_publication_contributes_only_to_the_operations_it_publishes() -> None:
    inserts_only = Publication.model_validate({"name": "p2", "tables": [{"name": "public.t1"}], "publish": ["insert"]})
    f = RowFilter(FilterPlan([P1, inserts_only]))
    assert f.apply(change("insert", T1, None, ("1", "1", "QLD"))) is not None  # p2 has no filter for inserts
    assert f.apply(change("delete", T1, ("1", None, "QLD"), None)) is None  # only p1 publishes deletes


def test_partition_covered_through_its_listed_parent_is_unfiltered_by_that_publication() -> None:
    child = relation("child", "a:int4:k", rid=3)
    plan = FilterPlan([pub("p4", "public.parent", ("public.child", "a >= 5"))])
    f = RowFilter(plan, ancestors=lambda rel: ["public.parent"])
    assert f.apply(change("insert", child, None, ("3",))) is None  # p4 lists child with its own filter
    other = pub("p5", "public.parent")
    f = RowFilter(FilterPlan([pub("p4", ("public.child", "a >= 5")), other]), ancestors=lambda rel: ["public.parent"])
    assert f.apply(change("insert", child, None, ("3",))) is not None  # p5 covers child via parent, no filter


def test_unfiltered_tables_pass_untouched() -> None:
    t9 = relation("t9", rid=9)
    c = change("insert", t9, None, ("1", "1", "x"))
    assert seed_filter().apply(c) is c


# -- TOAST, unevaluable, replica identity -----------------------------------------------------------------

BIG = relation("big", "id:int4:k body:text:k", rid=4)


def test_unchanged_toast_in_new_row_takes_the_old_value() -> None:
    f = RowFilter(FilterPlan([pub("p", ("public.big", "body = 'x'"))]))
    out = f.apply(change("update", BIG, ("1", "x"), ("2", UNCHANGED_TOAST)))
    assert out is not None
    assert (out.op, out.new) == ("update", ("2", "x"))


@pytest.mark.parametrize(("policy", "published"), [("publish", True), ("drop", False)])
def test_unevaluable_filter_follows_the_policy_and_is_counted(policy: Any, published: bool) -> None:
    f = RowFilter(FilterPlan([pub("p", ("public.big", "body = 'x'"))]), unevaluable=policy)
    out = f.apply(change("update", BIG, None, ("2", UNCHANGED_TOAST)))
    assert (out is not None) is published
    assert f.unevaluated["public.big"] == 1


def test_unevaluable_filter_with_fail_policy_stops() -> None:
    f = RowFilter(FilterPlan([pub("p", ("public.big", "body = 'x'"))]), unevaluable="fail")
    with pytest.raises(FilterFailure, match=r"body = 'x'.*public\.big"):
        f.apply(change("update", BIG, None, ("2", UNCHANGED_TOAST)))


def test_filter_on_non_identity_column_with_updates_published_is_refused() -> None:
    f = RowFilter(FilterPlan([pub("p", ("public.t1", "b > 1"))]))
    with pytest.raises(FilterFailure, match=r"replica identity columns \(a, c\); it uses b"):
        f.apply(change("insert", T1, None, ("1", "2", "x")))


def test_filter_on_any_column_is_fine_when_only_inserts_are_published() -> None:
    f = RowFilter(FilterPlan([pub("p", ("public.t1", "b > 1"), publish=["insert"])]))
    assert f.apply(change("insert", T1, None, ("1", "2", "x"))) is not None


def test_a_changed_relation_is_checked_again() -> None:
    f = RowFilter(FilterPlan([P1]))
    assert f.apply(change("insert", T1, None, ("6", "1", "NSW"))) is not None
    renamed = relation(columns="a:int4:k b:int4 region:text:k")
    with pytest.raises(FilterFailure, match="c"):
        f.apply(change("insert", renamed, None, ("6", "1", "NSW")))


# -- start-up checks against the catalog --------------------------------------------------------------------


def table_info(name: str, identity: tuple[str, ...], partitioned: bool = False, collation: str = "C") -> TableInfo:
    cols = (ColumnInfo("a", INT4, -1, None), ColumnInfo("b", INT4, -1, None), ColumnInfo("c", TEXT, -1, collation))
    return TableInfo(name, partitioned, "d", identity, cols)


def test_check_reports_identity_partition_and_column_problems() -> None:
    plan = FilterPlan([pub("p", ("public.t1", "b > 1"), ("public.parent", "a < 5"), ("public.t3", "zz = 1"))])
    report = check_filters(
        plan,
        {
            "public.t1": table_info("public.t1", ("a",)),
            "public.parent": table_info("public.parent", ("a",), partitioned=True),
            "public.t3": table_info("public.t3", ("a",)),
        },
    )
    text = "\n".join(report.errors)
    assert "it uses b" in text
    assert "publish_via_partition_root" in text
    assert "zz" in text
    assert len(report.errors) == 3


def test_check_warns_about_text_ordering_under_a_non_c_collation() -> None:
    plan = FilterPlan([pub("p", ("public.t1", "c > 'M'"))])
    report = check_filters(plan, {"public.t1": table_info("public.t1", ("a", "c"), collation="en_US.UTF-8")})
    assert report.errors == []
    assert len(report.warnings) == 1
    assert "en_US.UTF-8" in report.warnings[0]
