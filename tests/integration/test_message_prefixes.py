"""source.message_prefixes on the real stack (Debezium's message.prefix.include.list): only the messages whose whole
prefix an include pattern matches, ignoring case, reach ``<prefix>.message``, transactional or not; the others are
consumed and counted; cdcd's own control messages (an incremental snapshot's request and watermarks, whose
prefixes the list does not name) work as before."""

from __future__ import annotations

import pytest

from tests.http import scrape
from tests.integration.conftest import Database
from tests.integration.kafka_harness import Run
from tests.integration.test_snapshot import cdcd_snapshot, wait_log

pytestmark = pytest.mark.integration


@pytest.mark.beyond_row_stage  # the core filters messages, whichever row stage runs
def test_only_messages_with_an_included_prefix_reach_the_message_topic(run: Run, db: Database) -> None:
    db.execute(
        "CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items SELECT generate_series(1, 10);"
        "CREATE PUBLICATION cdcd_pub FOR TABLE items"
    )
    run.start(source={"message_prefixes": {"include": [r"app\..*"]}})
    db.execute("SELECT pg_logical_emit_message(false, 'app.orders', 'kept')")
    db.execute("SELECT pg_logical_emit_message(false, 'audit', 'dropped')")
    db.execute("SELECT pg_logical_emit_message(false, 'app', 'dropped: the whole prefix must match')")
    db.execute(
        "BEGIN; INSERT INTO items VALUES (11);"
        " SELECT pg_logical_emit_message(true, 'audit.login', 'dropped, transactional');"
        " SELECT pg_logical_emit_message(true, 'APP.Invoices', 'kept, transactional'); COMMIT"
    )
    result = cdcd_snapshot(run, "public.items")  # a cdcd.snapshot request, then cdcd.watermark messages
    assert result.returncode == 0, result.stderr
    wait_log(run, "table snapshot finished", count=2)  # the initial snapshot, then the requested one
    events = run.sync()

    messages = [e.value["message"] for e in events if e.topic == f"{run.prefix}.message" and e.value]
    assert sorted(messages, key=lambda m: m["prefix"]) == [
        {"prefix": "APP.Invoices", "content": b"kept, transactional"},
        {"prefix": "app.orders", "content": b"kept"},
    ]
    rows = [e.value for e in events if e.topic == f"{run.prefix}.public.items" and e.value]
    assert [r["after"]["id"] for r in rows if r["op"] == "c"] == [11]
    incremental = [r["after"]["id"] for r in rows if r["op"] == "r" and r["source"]["snapshot"] == "incremental"]
    assert sorted(incremental) == list(range(1, 12))
    # the three above, and run.sync's own message (prefix 'test')
    assert scrape(run.metrics_url())["cdcd_filtered_events_total", (("table", ""),)] == 4
    assert run.stop() == 0
