"""LSN feedback and connection loss against a real server."""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
import pytest

from cdcd.lsn import parse_lsn
from tests.integration.conftest import Database, Tail
from tests.integration.workload import SCHEMA, Model, Txn, group_by_xid

pytestmark = pytest.mark.integration


def confirmed_flush(db: Database, slot: str) -> int:
    rows = db.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", [slot])
    return parse_lsn(rows[0][0])


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_idle_slot_confirms_wal_written_elsewhere(db: Database, tail_factory: Callable[..., Tail]) -> None:
    """Changes to tables outside the publication produce nothing to emit, yet the slot must not pin WAL."""
    db.execute(SCHEMA + "; CREATE TABLE unpublished (id int PRIMARY KEY, pad text)")
    tail = tail_factory().start()
    tail.wait_streaming()
    start = confirmed_flush(db, tail.slot)
    with db.connect() as conn:
        for i in range(20):
            conn.execute(
                "INSERT INTO unpublished SELECT g, repeat('x', 500) FROM generate_series(%s::int, %s::int) g",
                [i * 100, i * 100 + 99],
            )
        target = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]
    assert target > start
    wait_until(lambda: confirmed_flush(db, tail.slot) >= target, "the slot to confirm WAL with nothing to emit")
    assert tail.lines() == []


def test_flush_lsn_follows_emitted_transactions(db: Database, tail_factory: Callable[..., Tail]) -> None:
    db.execute(SCHEMA)
    tail = tail_factory().start()
    tail.wait_streaming()
    model = Model()
    txn = Txn(db.dsn(), model)
    txn.insert_many("items", 1, 10, "x")
    txn.commit()
    lines = tail.wait_for(lambda lines: len(lines) >= 10)
    commit_lsn = parse_lsn(lines[-1]["commit_lsn"])
    wait_until(lambda: confirmed_flush(db, tail.slot) > commit_lsn, "the commit to be confirmed")


def test_reconnects_after_the_server_ends_the_connection(db: Database, tail_factory: Callable[..., Tail]) -> None:
    db.execute(SCHEMA)
    tail = tail_factory().start()
    tail.wait_streaming()
    model = Model()
    for round_ in range(3):
        txn = Txn(db.dsn(), model)
        txn.insert_many("items", round_ * 1000, 200, f"r{round_}-")
        txn.commit()
        with psycopg.connect(db.dsn(), autocommit=True) as admin:
            killed = admin.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s AND active",
                [tail.slot],
            ).fetchall()
        assert killed == [(True,)]
        tail.wait_streaming()  # back, after backoff
    expected = sum(len(changes) for _, changes in model.committed)
    lines = tail.wait_for(lambda lines: {x["xid"] for x in lines} >= {xid for xid, _ in model.committed})
    committed = dict(model.committed)
    for xid, changes in group_by_xid(lines):
        assert changes == committed[xid]  # whole, possibly repeated after a reconnect
    assert len(lines) >= expected
    assert "source disconnected; retrying" in tail.log.read_text()
    assert tail.proc is not None
    assert tail.proc.poll() is None, "the daemon keeps running through connection loss"


def test_session_settings_are_pinned_whatever_the_dsn_says(db: Database, tail_factory: Callable[..., Tail]) -> None:
    """Text values must not follow a DateStyle/IntervalStyle/bytea_output/extra_float_digits set in the DSN."""
    db.execute(
        "CREATE TABLE items (id int PRIMARY KEY, d date, ts timestamp, iv interval, b bytea, f float8);"
        "CREATE PUBLICATION cdcd_pub FOR TABLE items"
    )
    hostile = "-c DateStyle=SQL,DMY -c IntervalStyle=sql_standard -c bytea_output=escape -c extra_float_digits=-3"
    tail = tail_factory(dsn=db.dsn(hostile + " -c logical_decoding_work_mem=64kB")).start()
    tail.wait_streaming()
    db.execute("INSERT INTO items VALUES (1, '2024-02-29', '2024-02-29 13:14:15.5', '1 day 02:00:00', '\\x00ff', 0.1)")
    (line,) = tail.wait_for(lambda lines: len(lines) >= 1)
    assert line["after"] == {
        "id": "1",
        "d": "2024-02-29",
        "ts": "2024-02-29 13:14:15.5",
        "iv": "1 day 02:00:00",
        "b": "\\x00ff",
        "f": "0.1",
    }
