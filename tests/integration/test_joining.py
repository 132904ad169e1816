"""Tables whose rows join the capture while cdcd streams, on publications cdcd does not manage: a table added to a
publication by hand (ALTER PUBLICATION ADD TABLE) and a table with rows attached as a partition, both ways a
partitioned table is published (its leaves under their own names, or everything as its root with
``publish_via_partition_root``). PostgreSQL writes no change for the rows they held: they arrive only because cdcd
looks up what it captures every ``source.table_check_interval_s`` and snapshots what is new
(``snapshot.new_tables``)."""

from __future__ import annotations

import pytest

from tests.integration.conftest import Database
from tests.integration.kafka_harness import Run
from tests.integration.test_patterns import _wait_logged

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TABLE orders (id int, region text, v text, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE orders_eu PARTITION OF orders FOR VALUES IN ('eu');
CREATE TABLE later (id int PRIMARY KEY, v text);
INSERT INTO orders VALUES (1, 'eu', 'a'), (2, 'eu', 'b');
INSERT INTO later VALUES (1, 'x'), (2, 'y');
-- rows in a table of their own, then attached: ATTACH writes nothing for them
CREATE TABLE orders_us (id int, region text, v text, PRIMARY KEY (id, region));
INSERT INTO orders_us VALUES (10, 'us', 'c'), (11, 'us', 'd');
"""


def _start(run: Run, via_root: bool) -> None:
    run.db.execute(f"CREATE PUBLICATION cdcd_pub FOR TABLE orders WITH (publish_via_partition_root = {via_root})")
    run.start(source={"table_check_interval_s": 0.3})


def _rows(run: Run, table: str) -> dict[int, str]:
    """The table's rows as a consumer that applies its topic in order sees them: id -> v."""
    rows: dict[int, str] = {}
    for e in run.events:
        if e.topic == f"{run.prefix}.public.{table}" and e.value and e.value["after"]:
            rows[e.value["after"]["id"]] = e.value["after"]["v"]
    return rows


def _reads(run: Run, table: str) -> list[int]:
    """The ids of the table's snapshot reads, in order."""
    found = [e.value for e in run.events if e.topic == f"{run.prefix}.public.{table}" and e.value]
    return [v["after"]["id"] for v in found if v["op"] == "r"]


@pytest.mark.every_pg  # the catalog's view of partitions, on every major
@pytest.mark.parametrize("via_root", [True, False], ids=["via_root", "leaves"])
def test_an_attached_partitions_rows_arrive(run: Run, db: Database, via_root: bool) -> None:
    db.execute(SCHEMA)
    _start(run, via_root)
    run.wait_confirmed()
    db.execute("ALTER TABLE orders ATTACH PARTITION orders_us FOR VALUES IN ('us')")
    queued = "partition attached: its rows queued" if via_root else "table newly captured: queued"
    _wait_logged(run, f"{queued} for an incremental snapshot")
    db.execute("INSERT INTO orders VALUES (12, 'us', 'e'), (3, 'eu', 'f')")
    _wait_logged(run, "table snapshot finished", count=2)  # the initial one, and the attached rows'
    run.sync()
    if via_root:  # all under the root's name; of the root only the attached partition is read again
        assert _rows(run, "orders") == {1: "a", 2: "b", 10: "c", 11: "d", 12: "e", 3: "f"}
        assert sorted(_reads(run, "orders"))[:4] == [1, 2, 10, 11]
        assert set(_reads(run, "orders")) <= {1, 2, 10, 11, 12}
        assert _reads(run, "orders").count(1) == 1
    else:
        assert _rows(run, "orders_eu") == {1: "a", 2: "b", 3: "f"}
        assert _rows(run, "orders_us") == {10: "c", 11: "d", 12: "e"}
        assert {10, 11} <= set(_reads(run, "orders_us"))
    assert run.stop() == 0


def test_a_partition_attached_while_cdcd_is_stopped_arrives_at_its_start(run: Run, db: Database) -> None:
    db.execute(SCHEMA)
    _start(run, via_root=True)
    run.wait_confirmed()
    assert run.stop() == 0
    db.execute("ALTER TABLE orders ATTACH PARTITION orders_us FOR VALUES IN ('us')")
    run.start(source={"table_check_interval_s": 0})
    db.execute("INSERT INTO orders VALUES (12, 'us', 'e')")
    _wait_logged(run, "table snapshot finished", count=2)
    run.sync()
    assert _rows(run, "orders") == {1: "a", 2: "b", 10: "c", 11: "d", 12: "e"}
    assert _reads(run, "orders").count(1) == 1
    assert {10, 11} <= set(_reads(run, "orders"))
    assert run.stop() == 0


def test_a_table_added_to_a_publication_by_hand_arrives_whole(run: Run, db: Database) -> None:
    db.execute(SCHEMA)
    _start(run, via_root=True)
    run.wait_confirmed()
    db.execute("ALTER PUBLICATION cdcd_pub ADD TABLE later")
    _wait_logged(run, "table newly captured: queued for an incremental snapshot", table="public.later")
    db.execute("UPDATE later SET v = 'z' WHERE id = 2")
    _wait_logged(run, "table snapshot finished", table="public.later")
    run.sync()
    assert _rows(run, "later") == {1: "x", 2: "z"}
    assert run.stop() == 0
