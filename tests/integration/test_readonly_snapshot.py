"""Read-only incremental snapshots (``snapshot.read_only``) on the real stack: started by a Kafka signal, under a
concurrent writer (updates, deletes, inserts, key changes into and out of the chunks' ranges), the table rebuilt
from Kafka equals the source, and the source's WAL over the snapshot holds nothing cdcd wrote (pg_walinspect: no
logical message of its slot, no record in the database under a transaction that is not the writer's); on an idle
database the windows close by the server's keepalives; `cdcd snapshot` refuses, naming the signal topic.

What the WAL check cannot see: a transaction that writes no block (an xid assigned, then committed) is not tied
to a database in the WAL, and other tests write to the same server; cdcd's DBLog watermarks do carry the slot."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

from tests.integration.conftest import Database
from tests.integration.kafka_harness import Event, Run, delete_topics
from tests.integration.test_snapshot import BIG, assert_equal_rows, cdcd_snapshot, rebuild, source_rows, topic

pytestmark = pytest.mark.integration

ROWS = 20_000


@pytest.fixture
def signal_topic(run15: Run) -> Iterator[str]:
    name = f"{run15.prefix}-signal"
    yield name
    delete_topics(run15.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"], (name,))


def _start(run: Run, signal_topic: str, chunk_size: int) -> None:
    run.start(
        extra={
            "snapshot": {
                "state_dir": str(run.tmp_path / "state"),
                "chunk_size": chunk_size,
                "mode": "never",
                "read_only": True,
            },
            "signals": {"kafka": {"topic": signal_topic, "poll_interval_s": 0.2}},
            "notifications": {"kafka": {"topic": f"{run.prefix}.notifications"}},
        }
    )


def _signal(run: Run, signal_topic: str, table: str) -> None:
    producer = Producer({"bootstrap.servers": run.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"]})
    value = {"id": "ro-1", "type": "execute-snapshot", "data": {"data-collections": [table], "type": "incremental"}}
    producer.produce(signal_topic, key=run.prefix, value=json.dumps(value))
    assert producer.flush(30) == 0


def _completed(run: Run, timeout: float) -> list[Event]:
    notices = f"{run.prefix}.notifications"
    return run.consume_until(
        lambda events: any(e.topic == notices and e.value and e.value["type"] == "COMPLETED" for e in events), timeout
    )


def _insert_lsn(db: Database) -> str:
    return str(db.execute("SELECT pg_current_wal_insert_lsn()")[0][0])


class KeyWriter(threading.Thread):
    """Small transactions on ``big`` until stopped: updates, a delete, an insert past the end, and key changes
    (to a key the chunks have passed, and to a deleted key further on); each one's xid recorded."""

    def __init__(self, dsn: str, rows: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rows, self.random = dsn, rows, random.Random(33)
        self.halt = threading.Event()
        self.xids: set[int] = set()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                next_id, moved = self.rows + 1, -1
                while not self.halt.is_set():
                    with conn.transaction():
                        self.xids.add(int(conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0]) % 2**32)  # type: ignore[index]
                        next_id, moved = self._one(conn, next_id, moved)
                    time.sleep(0.002)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def _one(self, conn: psycopg.Connection[Any], next_id: int, moved: int) -> tuple[int, int]:
        pick = self.random.randint
        for _ in range(3):
            conn.execute("UPDATE big SET v = v + 1, s = %s WHERE id = %s", ["u", pick(1, self.rows)])
        gone = pick(1, self.rows)
        conn.execute("DELETE FROM big WHERE id = %s", [gone])
        conn.execute("INSERT INTO big VALUES (%s, -1, 'new', NULL)", [next_id])
        # a key change of a row with a TOASTed value would leave it out of the new key's event (Debezium's
        # unavailable value): only rows without one move
        conn.execute("UPDATE big SET id = %s WHERE id = %s AND doc IS NULL", [moved, pick(1, self.rows)])
        conn.execute("UPDATE big SET id = %s WHERE id = %s AND doc IS NULL", [gone, pick(1, self.rows)])
        return next_id + 1, moved - 1

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)
        assert self.error is None, f"workload failed: {self.error!r}"
        assert len(self.xids) > 20


def _wal_written(db: Database, start: str, end: str, slot: str, allowed: set[int]) -> list[str]:
    """The WAL records between ``start`` and ``end`` a read-only snapshot must not cause: a logical message whose
    payload names ``slot`` (cdcd's watermarks and requests do), or a record on a block of this database under a
    transaction id not in ``allowed``."""
    oid, empty = db.execute(
        "SELECT oid, %s::pg_lsn >= %s::pg_lsn FROM pg_database WHERE datname = current_database()", [start, end]
    )[0]
    if empty:
        return []  # no WAL at all since ``start``
    records = db.execute(
        "SELECT start_lsn::text, xid::text::bigint, resource_manager, description, coalesce(block_ref, '')"
        " FROM pg_get_wal_records_info(%s, %s)",
        [start, end],
    )
    # An autovacuum ANALYZE (of a catalog: the per-table setting does not reach those) writes pg_statistic and
    # pg_class under its own xid (CI run 13); a transaction that writes nothing else is the server's own.
    analyze = {
        f"/{oid}/{node} "
        for (node,) in db.execute(
            "SELECT pg_relation_filenode(c) FROM unnest(ARRAY['pg_statistic', 'pg_class']::regclass[]) c"
        )
    }
    by_xid: dict[int, list[str]] = {}
    found = []
    for lsn, xid, manager, description, blocks in records:
        payload = description.partition("): ")[2]
        if manager == "LogicalMessage" and slot.encode().hex(" ").upper() in payload:
            found.append(f"{lsn} {description}")
        elif xid and xid not in allowed and f"/{oid}/" in blocks:
            by_xid.setdefault(xid, []).append(f"{lsn} xid {xid} {manager}: {description} {blocks}")
    for written in by_xid.values():
        if not all(any(node in line for node in analyze) for line in written):
            found += written
    return found


def test_a_read_only_snapshot_under_key_changes_converges_and_writes_nothing(run15: Run, signal_topic: str) -> None:
    run, db = run15, run15.db
    db.execute(
        BIG.replace("ROWS", str(ROWS))
        + "ALTER TABLE big SET (autovacuum_enabled = false);"  # an ANALYZE would write under its own xid
        + "CREATE PUBLICATION cdcd_pub FOR TABLE big; CREATE EXTENSION pg_walinspect"
    )
    _start(run, signal_topic, chunk_size=1000)
    writer = KeyWriter(db.dsn(), ROWS)
    writer.start()
    time.sleep(0.5)
    start = _insert_lsn(db)
    _signal(run, signal_topic, "public.big")
    _completed(run, timeout=240)
    writer.stop()
    time.sleep(1)  # the WAL written so far reaches the disk (asynchronous commits)
    end = str(db.execute("SELECT pg_current_wal_flush_lsn()")[0][0])

    events = run.sync(timeout=240)
    assert_equal_rows(rebuild(events, topic(run)), source_rows(db))
    read = [e.value for e in events if e.topic == topic(run) and e.value and e.value["op"] == "r"]
    assert {v["source"]["snapshot"] for v in read} == {"incremental"}
    assert len({v["after"]["id"] for v in read}) == len(read) > ROWS / 2  # each row once, some left to the stream
    assert _wal_written(db, start, end, run.slot, writer.xids) == []

    # The check finds what it looks for: a watermark of this slot, and a write from another connection.
    start = _insert_lsn(db)
    db.execute("SELECT pg_logical_emit_message(false, 'cdcd.watermark', %s)", [json.dumps({"slot": run.slot})])
    db.execute("UPDATE big SET v = 0 WHERE id = (SELECT min(id) FROM big WHERE id > 0)")
    time.sleep(1)
    end = str(db.execute("SELECT pg_current_wal_flush_lsn()")[0][0])
    found = _wal_written(db, start, end, run.slot, writer.xids)
    assert [line.split()[1] for line in found][:1] == ["non-transactional,"], found
    assert any("Heap" in line for line in found), found
    assert run.stop() == 0


@pytest.mark.every_pg  # how far the walsender's keepalives tell it has come, and when it sends them
def test_on_an_idle_database_keepalives_close_the_windows(run: Run, db: Database) -> None:
    """Nothing changes while the table is read: no transaction reaches the stream, only the server's keepalives
    (its own, and answers to cdcd's requests) tell that it passed each chunk's position."""
    db.execute(BIG.replace("ROWS", "4500") + "CREATE PUBLICATION cdcd_pub FOR TABLE big")
    signal_topic = f"{run.prefix}-signal"
    try:
        _idle_snapshot(run, db, signal_topic)
    finally:
        delete_topics(run.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"], (signal_topic,))


def _idle_snapshot(run: Run, db: Database, signal_topic: str) -> None:
    _start(run, signal_topic, chunk_size=1000)
    _signal(run, signal_topic, "public.big")
    _completed(run, timeout=120)
    events = run.sync()
    notices = [e.value["type"] for e in events if e.topic == f"{run.prefix}.notifications" and e.value]
    assert notices.count("IN_PROGRESS") == 5  # chunks of 1000, 1000, 1000, 1000, 500
    assert {e.value["op"] for e in events if e.topic == topic(run) and e.value} == {"r"}
    assert_equal_rows(rebuild(events, topic(run)), source_rows(db))
    assert run.stop() == 0


def test_cdcd_snapshot_refuses_and_names_the_signal_topic(run15: Run, signal_topic: str) -> None:
    run, db = run15, run15.db
    db.execute(
        "CREATE TABLE k (id int PRIMARY KEY); CREATE PUBLICATION cdcd_pub FOR TABLE k; CREATE EXTENSION pg_walinspect"
    )
    _start(run, signal_topic, chunk_size=100)
    start = _insert_lsn(db)
    result = cdcd_snapshot(run, "public.k", "id > 1")
    assert result.returncode == 2, result
    assert f"signal topic {signal_topic}" in result.stderr
    assert '"additional-conditions": [{"data-collection": "public.k", "filter": "id > 1"}]' in result.stderr
    time.sleep(0.5)
    assert _wal_written(db, start, str(db.execute("SELECT pg_current_wal_flush_lsn()")[0][0]), run.slot, set()) == []
    assert run.stop() == 0
