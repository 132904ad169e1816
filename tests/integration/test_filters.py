"""Row filters end to end: the PostgreSQL 15 documentation's worked examples through `cdcd run` to Kafka,
and bad filters refused by `cdcd check` and `cdcd run` before anything is written to the server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Database
from tests.integration.kafka_harness import Event, Run
from tests.integration.test_check import run_cdcd

pytestmark = [pytest.mark.integration, pytest.mark.every_pg]  # version-sensitive: on every major


def managed(*publications: dict[str, Any], push_down: bool = True) -> dict[str, Any]:
    return {
        "source": {"publications": list(publications), "manage_publications": True},
        "extra": {"filters": {"push_down": push_down}},
    }


def mirror(events: list[Event], topic: str) -> set[tuple[Any, ...]]:
    """The table a consumer rebuilds from one topic: upserts, deletes, truncates. Rows are identified by the
    message key, or by their values on keyless topics (REPLICA IDENTITY FULL without a primary key). As docs/kafka.md
    (Unchanged TOAST) asks of a consumer: a column in ``unchanged_toast`` keeps the row's value, and the two events of
    a key change move the row to the new key (whichever of them comes first) before they apply, so the create
    keeps those values."""
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}

    def ident(key: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(sorted(key.items()))

    for event in events:
        if event.topic != topic or event.value is None:
            continue
        op, before, after = event.value["op"], event.value["before"], event.value["after"]
        key = ident(event.key) if event.key else None
        if op == "t":
            rows.clear()
        moved_from = event.moved.get("__debezium.oldkey") if op == "c" else None
        moved_to = event.moved.get("__debezium.newkey") if op == "d" else None
        if key and (moved_from or moved_to):
            old, new = (ident(moved_from), key) if moved_from else (key, ident(moved_to or {}))
            if old in rows and new not in rows:
                rows[new] = rows.pop(old)
        if op in ("u", "d") and (key or before):
            kept = rows.pop(key or tuple(before.values()), {})
        else:
            kept = rows.get(key, {}) if key else {}
        if op in ("c", "u", "r"):
            unchanged = event.value.get("unchanged_toast") or []
            rows[key or tuple(after.values())] = {c: kept.get(c) if c in unchanged else v for c, v in after.items()}
    return {tuple(row.values()) for row in rows.values()}


SEED_TABLES = """
CREATE TABLE t1(a int, b int, c text, PRIMARY KEY(a,c));
CREATE TABLE t2(d int, e int, f int, PRIMARY KEY(d));
CREATE TABLE t3(g int, h int, i int, PRIMARY KEY(g));
"""
P1 = {"name": "p1", "tables": [{"name": "public.t1", "where": "a > 5 AND c = 'NSW'"}]}
P2 = {"name": "p2", "tables": [{"name": "public.t1"}, {"name": "public.t2", "where": "e = 99"}]}
P3 = {"name": "p3", "tables": [{"name": "public.t2", "where": "d = 10"}, {"name": "public.t3", "where": "g = 10"}]}


@pytest.mark.parametrize("push_down", [True, False], ids=["push-down", "cdcd-only"])
def test_seed_example_p1_on_t1(run: Run, db: Database, push_down: bool) -> None:
    db.execute(SEED_TABLES)
    run.start(**managed(P1, push_down=push_down))
    for values in [
        "(2, 102, 'NSW')",
        "(3, 103, 'QLD')",
        "(4, 104, 'VIC')",
        "(5, 105, 'ACT')",
        "(6, 106, 'NSW')",
        "(7, 107, 'NT')",
        "(8, 108, 'QLD')",
        "(9, 109, 'NSW')",
    ]:
        db.execute(f"INSERT INTO t1 VALUES {values}")
    assert mirror(run.sync(), f"{run.prefix}.public.t1") == {(6, 106, "NSW"), (9, 109, "NSW")}
    db.execute("UPDATE t1 SET b = 999 WHERE a = 6")  # both rows match: UPDATE
    db.execute("UPDATE t1 SET a = 555 WHERE a = 2")  # only the new row matches: INSERT
    db.execute("UPDATE t1 SET c = 'VIC' WHERE a = 9")  # only the old row matches: DELETE
    run.reread()
    events = run.sync()
    assert mirror(events, f"{run.prefix}.public.t1") == {(6, 999, "NSW"), (555, 102, "NSW")}
    ops = [e.value["op"] for e in events if e.value is not None and e.topic.endswith(".t1")]
    assert ops == ["c", "c", "u", "c", "d"]


def test_seed_publications_combined(run: Run, db: Database) -> None:
    """p1, p2 and p3 together: t1 is unfiltered (p2 has no filter for it), t2's filters are ORed. (p2 filters
    t2 on e, which is not in t2's primary key: as PostgreSQL 15 requires, t2 gets REPLICA IDENTITY FULL.)"""
    db.execute(SEED_TABLES + "ALTER TABLE t2 REPLICA IDENTITY FULL;")
    run.start(**managed(P1, P2, P3))
    db.execute("INSERT INTO t1 VALUES (1, 1, 'QLD'), (6, 6, 'NSW')")
    db.execute("INSERT INTO t2 VALUES (1, 99, 0), (10, 0, 0), (11, 0, 0), (12, NULL, 0)")
    db.execute("INSERT INTO t3 VALUES (10, 0, 0), (11, 0, 0)")
    db.execute("TRUNCATE t3")  # truncate is never filtered
    db.execute("INSERT INTO t3 VALUES (10, 1, 1)")
    events = run.sync()
    assert mirror(events, f"{run.prefix}.public.t1") == {(1, 1, "QLD"), (6, 6, "NSW")}
    assert mirror(events, f"{run.prefix}.public.t2") == {(1, 99, 0), (10, 0, 0)}
    assert mirror(events, f"{run.prefix}.public.t3") == {(10, 1, 1)}
    assert [e.value["op"] for e in events if e.value and e.topic.endswith(".t3")] == ["c", "t", "c"]


PARTITION_CASES = {
    # publish_via_partition_root: the root's filter applies, events go to the root's topic
    "via-root": (
        True,
        [{"name": "public.parent", "where": "a < 5"}, {"name": "public.child", "where": "a >= 5"}],
        "parent",
        {(2,), (3,), (4,)},
    ),
    # otherwise each partition's own filter and topic
    "via-partitions": (
        False,
        [{"name": "public.parent"}, {"name": "public.child", "where": "a >= 5"}],
        "child",
        {(5,), (6,), (7,)},
    ),
}


@pytest.mark.parametrize("case", PARTITION_CASES)
def test_seed_example_p4_partitions(run: Run, db: Database, case: str) -> None:
    via_root, tables, topic, expected = PARTITION_CASES[case]
    db.execute(
        "CREATE TABLE parent(a int PRIMARY KEY) PARTITION BY RANGE(a); CREATE TABLE child PARTITION OF parent DEFAULT"
    )
    run.start(**managed({"name": "p4", "tables": tables, "publish_via_partition_root": via_root}))
    db.execute("INSERT INTO parent VALUES (2), (4), (6)")
    db.execute("INSERT INTO child VALUES (3), (5), (7)")
    events = run.sync()
    topics = {e.topic for e in events} - {f"{run.prefix}.message", f"{run.prefix}.transaction"}
    assert topics == {f"{run.prefix}.public.{topic}"}
    assert mirror(events, f"{run.prefix}.public.{topic}") == expected


# -- bad filters: one clear message, exit 2, nothing written ------------------------------------------------


@pytest.mark.parametrize(
    ("publication", "message"),
    [
        ({"name": "bad", "tables": [{"name": "public.t1", "where": "a > > 5"}]}, "syntax error"),
        ({"name": "bad", "tables": [{"name": "public.t1", "where": "a > 5 AND random() > 0.5"}]}, "random"),
        ({"name": "bad", "tables": [{"name": "public.t1", "where": "b > 5"}]}, "it uses b"),
        ({"name": "bad", "all_tables": True, "tables": [{"name": "public.t1", "where": "a > 5"}]}, "FOR ALL TABLES"),
    ],
    ids=["syntax", "volatile", "not-replica-identity", "all-tables"],
)
def test_bad_filter_fails_check_and_run_with_exit_2(
    db: Database, tmp_path: Path, publication: dict[str, Any], message: str
) -> None:
    db.execute(SEED_TABLES)
    config = {
        "source": {"dsn": db.dsn(), "slot": f"s_{db.name}", "publications": [publication], "manage_publications": True},
        "sink": {"kind": "jsonl", "path": str(tmp_path / "changes.jsonl")},
    }
    for command in ("check", "run"):
        result = run_cdcd(command, config=config, tmp_path=tmp_path)
        assert result.returncode == 2, (command, result.stderr)
        assert message in result.stderr, (command, result.stderr)
        assert result.stderr.count("  - ") == 1, (command, result.stderr)  # one problem reported
    assert db.execute("SELECT pubname FROM pg_publication") == []
    assert db.execute("SELECT slot_name FROM pg_replication_slots WHERE slot_name = %s", [f"s_{db.name}"]) == []
