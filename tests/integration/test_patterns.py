"""Tables by pattern (``include_tables``/``exclude_tables`` with ``manage_publications``) on a real stack: the
pattern picks the existing tables it matches, and a table created while cdcd streams is added to the publication:
its rows arrive, those written before it was added too when ``snapshot.new_tables`` is on."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Database
from tests.integration.kafka_harness import Run
from tests.integration.test_check import run_cdcd

pytestmark = [pytest.mark.integration, pytest.mark.every_pg]  # 14 keeps the list itself, as 15+ does

SHOP = r"shop\..*"
TMP = r"shop\.tmp_.*"


def _ids(run: Run, table: str, op: str | None = None) -> list[int]:
    found = [e.value for e in run.events if e.topic == f"{run.prefix}.{table}" and e.value]
    return sorted(v["after"]["id"] for v in found if op is None or v["op"] == op)


def _topics(run: Run) -> set[str]:
    return {e.topic.removeprefix(f"{run.prefix}.") for e in run.events}


def _published(db: Database) -> list[str]:
    rows = db.execute("SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = 'cdcd_pub'")
    return sorted(r[0] for r in rows)


def _wait_logged(run: Run, event: str, count: int = 1, timeout: float = 60, **fields: Any) -> None:
    deadline = time.monotonic() + timeout
    while True:
        lines = [json.loads(x) for x in run.log.read_text().splitlines() if x.startswith("{")]
        found = [x for x in lines if x.get("event") == event and all(x.get(k) == v for k, v in fields.items())]
        if len(found) >= count:
            return
        run._check_alive()
        assert time.monotonic() < deadline, f"no {event!r} {fields} logged:\n{run.log.read_text()[-3000:]}"
        time.sleep(0.1)


def _start(run: Run, new_tables: bool = True, delivery: str = "at_least_once") -> None:
    publication = {"name": "cdcd_pub", "include_tables": [SHOP, r"^audit\..*_log$"], "exclude_tables": [TMP]}
    run.start(
        source={"publications": [publication], "manage_publications": True, "table_check_interval_s": 0.3},
        extra={"snapshot": {"state_dir": str(run.tmp_path / "state"), "new_tables": new_tables}},
        delivery=delivery,
    )


def _schema(db: Database) -> None:
    db.execute(
        "CREATE SCHEMA shop; CREATE SCHEMA audit; CREATE SCHEMA shopping;"
        "CREATE TABLE shop.orders (id int PRIMARY KEY); CREATE TABLE shop.tmp_scratch (id int PRIMARY KEY);"
        "CREATE TABLE audit.login_log (id int PRIMARY KEY); CREATE TABLE audit.login (id int PRIMARY KEY);"
        "CREATE TABLE shopping.cart (id int PRIMARY KEY); CREATE TABLE public.other (id int PRIMARY KEY);"
        "INSERT INTO shop.orders SELECT generate_series(1, 5); INSERT INTO audit.login_log VALUES (1);"
        "INSERT INTO shop.tmp_scratch VALUES (1); INSERT INTO audit.login VALUES (1); INSERT INTO shopping.cart"
        " VALUES (1); INSERT INTO public.other VALUES (1)"
    )


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_patterns_pick_existing_tables_and_new_ones_while_streaming(run: Run, db: Database, delivery: str) -> None:
    _schema(db)
    _start(run, delivery=delivery)
    assert _published(db) == ["audit.login_log", "shop.orders"]
    db.execute("INSERT INTO shop.orders VALUES (6); INSERT INTO public.other VALUES (2)")
    # Rows written before the table is in the publication: only its snapshot brings them.
    db.execute(
        "BEGIN; CREATE TABLE shop.late (id int PRIMARY KEY); INSERT INTO shop.late VALUES (1), (2);"
        "CREATE TABLE shop.tmp_late (id int PRIMARY KEY); INSERT INTO shop.tmp_late VALUES (1);"
        "CREATE TABLE public.late (id int PRIMARY KEY); INSERT INTO public.late VALUES (1); COMMIT"
    )
    _wait_logged(run, "table added to the publication", table="shop.late")
    db.execute(
        "INSERT INTO shop.late VALUES (3); INSERT INTO shop.tmp_late VALUES (2); INSERT INTO public.late VALUES (2)"
    )
    _wait_logged(run, "table snapshot finished", table="shop.late")
    run.wait_confirmed()
    run.events = run.read_to_end()  # what a read_committed consumer sees, with either delivery
    assert _ids(run, "shop.orders", "r") == [1, 2, 3, 4, 5]
    assert _ids(run, "shop.orders", "c") == [6]
    assert _ids(run, "audit.login_log", "r") == [1]
    assert _ids(run, "shop.late", "c") == [3]  # streamed: written after the ALTER PUBLICATION
    assert set(_ids(run, "shop.late", "r")) >= {1, 2}  # the snapshot (it may read 3 as well)
    assert _topics(run) <= {"shop.orders", "audit.login_log", "shop.late", "transaction", "message"}
    assert _published(db) == ["audit.login_log", "shop.late", "shop.orders"]
    assert run.stop() == 0


def test_without_new_table_snapshots_only_what_follows_the_alter_arrives(run: Run, db: Database) -> None:
    _schema(db)
    _start(run, new_tables=False)
    db.execute("BEGIN; CREATE TABLE audit.pay_log (id int PRIMARY KEY); INSERT INTO audit.pay_log VALUES (1); COMMIT")
    _wait_logged(run, "table added to the publication", table="audit.pay_log")
    db.execute("INSERT INTO audit.pay_log VALUES (2)")
    run.sync()
    assert _ids(run, "audit.pay_log") == [2]
    assert "incremental" not in {e.value["source"]["snapshot"] for e in run.events if e.value and "source" in e.value}
    assert run.stop() == 0


def test_a_listed_table_keeps_its_row_filter_and_a_schema_takes_new_tables(run: Run, db: Database) -> None:
    """A table both listed (with a filter) and matched is published once, filtered. A schema's table created while
    streaming arrives whole: on 15+ through FOR TABLES IN SCHEMA, on 14 added by cdcd and snapshotted."""
    db.execute(
        "CREATE SCHEMA shop; CREATE SCHEMA sales; CREATE TABLE shop.orders (id int PRIMARY KEY);"
        "CREATE TABLE shop.items (id int PRIMARY KEY); INSERT INTO shop.orders SELECT generate_series(1, 6);"
        "INSERT INTO shop.items VALUES (1)"
    )
    publication = {
        "name": "cdcd_pub",
        "tables": [{"name": "shop.orders", "where": "id > 3"}],
        "include_tables": [SHOP],
        "schemas": ["sales"],
    }
    run.start(source={"publications": [publication], "manage_publications": True, "table_check_interval_s": 0.3})
    db.execute("BEGIN; CREATE TABLE sales.deals (id int PRIMARY KEY); INSERT INTO sales.deals VALUES (1); COMMIT")
    if db.server.version == 14:
        _wait_logged(run, "table added to the publication", table="sales.deals")
        _wait_logged(run, "table snapshot finished", table="sales.deals")
    else:
        time.sleep(1)  # as long as three checks: none adds it (FOR TABLES IN SCHEMA holds it)
    db.execute("INSERT INTO sales.deals VALUES (2); INSERT INTO shop.orders VALUES (0), (7)")
    run.sync()
    assert _ids(run, "shop.orders") == [4, 5, 6, 7]  # the snapshot and the stream, filtered
    assert _ids(run, "shop.items") == [1]
    assert set(_ids(run, "sales.deals")) == {1, 2}
    added = '"table added to the publication"' in run.log.read_text()
    assert added is (db.server.version == 14)
    assert run.stop() == 0


def test_check_names_a_matched_table_without_replica_identity(db: Database, tmp_path: Path) -> None:
    db.execute(
        "CREATE SCHEMA shop; CREATE TABLE shop.orders (id int PRIMARY KEY); CREATE TABLE shop.notes (body text);"
        "ALTER TABLE shop.notes REPLICA IDENTITY NOTHING; CREATE TABLE public.t (v text);"
        "ALTER TABLE public.t REPLICA IDENTITY NOTHING"
    )
    publication = {"name": "p", "include_tables": [SHOP]}
    source = {"dsn": db.dsn(), "slot": f"s_{db.name}", "publications": [publication], "manage_publications": True}
    result = run_cdcd("check", config={"source": source}, tmp_path=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "table shop.notes has REPLICA IDENTITY NOTHING" in result.stderr
    assert "public.t" not in result.stderr
