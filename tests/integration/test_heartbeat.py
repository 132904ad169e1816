"""Heartbeats (kafka.heartbeat) on a real stack: records on an idle database, and a slot that moves while only
another database on the server writes."""

from __future__ import annotations

import threading
import time

import pytest

from tests.integration.conftest import Database, scratch_database
from tests.integration.kafka_harness import Event, Run


def _heartbeats(run: Run, events: list[Event]) -> list[Event]:
    return [e for e in events if e.topic == f"{run.prefix}.heartbeat"]


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_heartbeats_arrive_on_an_idle_database(run: Run, db: Database, delivery: str) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION cdcd_pub FOR TABLE t")
    run.start(delivery=delivery, heartbeat={"interval_s": 0.5, "topic": f"{run.prefix}.heartbeat"})
    started_ms = time.time() * 1000
    events = run.consume_until(lambda events: len(_heartbeats(run, events)) >= 3, timeout=30)
    beats = _heartbeats(run, events)
    assert all(beat.key == {"serverName": run.prefix} for beat in beats)
    values = [beat.value for beat in beats]
    assert all(v is not None for v in values)
    stamps = [v["ts_ms"] for v in values if v is not None]
    assert stamps == sorted(stamps)
    assert stamps[0] >= started_ms - 1000
    assert stamps[-1] - stamps[0] >= 0.5 * 1000  # one per interval, not a burst
    assert all(v is not None and 0 < v["lsn"] <= v["received_lsn"] for v in values)
    assert run.stop() == 0


def _write_elsewhere(db: Database, stop: threading.Event) -> None:
    """Another database on the same server, written until ``stop``."""
    with scratch_database(db.server) as other, other.connect() as conn:
        conn.execute("CREATE TABLE busy (id serial PRIMARY KEY, filler text)")
        while not stop.is_set():
            conn.execute("INSERT INTO busy (filler) SELECT repeat('x', 200) FROM generate_series(1, 200)")
            time.sleep(0.02)


@pytest.mark.parametrize("action", [False, True], ids=["keepalives", "action_query"])
def test_the_slot_moves_while_only_another_database_writes(run: Run, db: Database, action: bool) -> None:
    """Nothing captured is written; another database is. The slot's confirmed_flush_lsn moves past what the server
    wrote: by keepalive positions (cdcd confirms them when nothing is pending), and with the action query too."""
    db.execute(
        "CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION cdcd_pub FOR TABLE t;"
        "CREATE TABLE heartbeat (id int PRIMARY KEY, at timestamptz); INSERT INTO heartbeat VALUES (1, now())"
    )
    heartbeat = {"interval_s": 0.5, "topic": f"{run.prefix}.heartbeat"}
    if action:
        heartbeat["action_query"] = "UPDATE heartbeat SET at = clock_timestamp() WHERE id = 1"
    before = db.execute("SELECT clock_timestamp()")[0][0]
    run.start(heartbeat=heartbeat)
    stop = threading.Event()
    writer = threading.Thread(target=_write_elsewhere, args=(db, stop), daemon=True)
    writer.start()
    try:
        time.sleep(1.0)
        target = db.execute("SELECT pg_current_wal_lsn()")[0][0]
        query = "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s"
        deadline = time.monotonic() + 25
        while not db.execute(query, [target, run.slot])[0][0]:
            assert time.monotonic() < deadline, f"the slot never confirmed {target}:\n{run.log.read_text()[-3000:]}"
            time.sleep(0.2)
    finally:
        stop.set()
        writer.join(timeout=30)
    if action:
        assert db.execute("SELECT at > %s FROM heartbeat", [before]) == [(True,)]  # the action query ran
    assert run.stop() == 0


def test_an_action_query_the_server_refuses_stops_cdcd_with_the_setting_named(run: Run, db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION cdcd_pub FOR TABLE t")
    run.start(heartbeat={"interval_s": 0.5, "action_query": "UPDATE no_such_table SET x = 1"})
    assert run.proc is not None
    assert run.proc.wait(timeout=30) == 1
    log = run.log.read_text()
    assert "kafka.heartbeat.action_query failed" in log
    assert "no_such_table" in log
    assert "Traceback" not in log
