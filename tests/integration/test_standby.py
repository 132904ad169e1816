"""Capture from a hot standby (PostgreSQL 16+) on the stack's pg-ha pair: cdcd's slot made on the standby, its
initial snapshot and its stream read there (a row filter applied), an incremental snapshot whose watermarks are
written on the primary through source.primary_dsn, then the primary stopped hard and the standby promoted
mid-stream: cdcd goes on from the same slot, and the tables rebuilt from Kafka equal the promoted server's."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

from cdcd.snapshot.reader import SnapshotReader
from cdcd.snapshot.window import ChunkWindow
from tests.integration.conftest import VERSIONS, Database, PgServer
from tests.integration.kafka_harness import Run, delete_topics
from tests.integration.test_check import run_cdcd
from tests.integration.test_failover import (
    Pair,
    Workload,
    duplicates,
    fresh_pair,
    rebuild,
    table,
    wait,
)
from tests.integration.test_snapshot import cdcd_snapshot, wait_log

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("pg-ha")]  # one worker: see conftest.py

STANDBY_VERSIONS = [v for v in VERSIONS if int(v) >= 16]  # logical decoding on a standby (16: no failover slots)

SEED_ROWS = 200
# items: a row filter on a column updates change (so rows move in and out of it: REPLICA IDENTITY FULL)
SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, v text NOT NULL, n int);
ALTER TABLE items REPLICA IDENTITY FULL;
CREATE TABLE audit (id int PRIMARY KEY, v text NOT NULL, n int);
ALTER TABLE audit REPLICA IDENTITY FULL;
CREATE PUBLICATION cdcd_pub FOR TABLE items WHERE (n % 3 <> 0), audit;
"""


def on(pair: Pair, role: str) -> Database:
    """The test's database on one server of the pair."""
    dsn = f"host=127.0.0.1 port={pair.ports[role]} user=postgres password=postgres"
    return Database(PgServer(int(pair.version), {"CDCD_SOURCE__DSN": dsn}), pair.db.name)


class StandbyRun(Run):
    """A Run reading the standby (``db``): what the harness writes to know cdcd caught up goes to ``writer``,
    the primary (the standby once promoted)."""

    def __init__(self, db: Database, writer: Database, env: dict[str, str], tmp_path: Path) -> None:
        super().__init__(db, env, tmp_path)
        self.writer = writer

    def writes_to(self) -> Database:
        return self.writer


@pytest.fixture(params=STANDBY_VERSIONS, ids=lambda v: f"pg{v}")
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    yield from fresh_pair(str(request.param))


@pytest.fixture
def standby_run(pair: Pair, kafka_env: dict[str, str], tmp_path: Path) -> Iterator[StandbyRun]:
    primary, standby = on(pair, "primary"), on(pair, "standby")
    primary.execute(SCHEMA)
    primary.execute("INSERT INTO items SELECT i, 'seed', i FROM generate_series(1, %s) i", [SEED_ROWS])
    primary.execute("INSERT INTO audit SELECT i, 'seed', 0 FROM generate_series(1, 20) i")
    wait(lambda: _count(standby, "audit") == 20, "the standby to replay the schema and the seed")
    r = StandbyRun(standby, primary, kafka_env, tmp_path)
    yield r
    r.close()


def _count(db: Database, name: str) -> int:
    try:
        return int(db.execute(f"SELECT count(*) FROM {name}")[0][0])
    except (psycopg.OperationalError, psycopg.errors.UndefinedTable):  # the database or table not replayed yet
        return -1


def filtered(db: Database) -> dict[int, tuple[Any, ...]]:
    return {k: v for k, v in table(db, "items").items() if v[1] % 3 != 0}


def refused(run: StandbyRun, command: str, **config: Any) -> str:
    """What `cdcd <command>` on the standby without source.primary_dsn says, exiting 2."""
    source = {"dsn": run.db.dsn(), "slot": run.slot, "publications": [{"name": "cdcd_pub"}], **config.pop("source", {})}
    dirs = {
        "snapshot": {"state_dir": str(run.tmp_path / "state")},
        "buffer": {"spill_dir": str(run.tmp_path / "spill")},
        "sink": {"kind": "jsonl", "path": str(run.tmp_path / "refused.jsonl")},
    }
    result = run_cdcd(command, config={"source": source, **dirs, **config}, tmp_path=run.tmp_path)
    assert result.returncode == 2, result
    return result.stderr


def test_capture_from_a_standby_then_its_promotion(pair: Pair, standby_run: StandbyRun) -> None:
    run, primary, standby = standby_run, standby_run.writer, standby_run.db
    assert "source.manage_publications is true" in refused(run, "check", source={"manage_publications": True})
    heartbeat = {"heartbeat": {"interval_s": 1, "action_query": "SELECT pg_logical_emit_message(false, 'hb', '')"}}
    assert "kafka.heartbeat.action_query writes" in refused(run, "run", kafka=heartbeat)
    assert standby.execute("SELECT count(*) FROM pg_replication_slots") == [(0,)]  # refused before making one
    reconnect = {"initial_backoff_s": 0.2, "max_backoff_s": 1}
    run.start(source={"primary_dsn": primary.dsn(), "reconnect": reconnect})
    wait_log(run, "streaming", timeout=60)
    assert run.logged("connected")["slot_created"] is True
    failover = "failover" if int(pair.version) >= 17 else "false"  # 16 has no failover slots
    query = f"SELECT slot_type, {failover} FROM pg_replication_slots WHERE slot_name = %s"
    assert standby.execute(query, [run.slot]) == [("logical", False)]
    assert primary.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", [run.slot]) == [(0,)]

    workload = Workload(pair.db)  # through the multi-host DSN: the primary, then the promoted standby
    workload.start()
    wait(lambda: workload.committed >= 20, "the workload")
    result = cdcd_snapshot(run, "public.audit")
    assert result.returncode == 0, result.stderr
    wait_log(run, "table snapshot finished", count=3)  # items and audit initially, then audit incrementally

    before = workload.committed
    pair.ctl("primary", "stop", "-m", "immediate")
    pair.ctl("standby", "promote", "-w")
    run.writer = standby
    wait(lambda: workload.committed >= before + 30, "the workload on the promoted standby", timeout=120)
    workload.stop.set()
    workload.join(timeout=30)
    assert workload.error is None, workload.error
    events = run.sync(timeout=120)

    assert rebuild(events, f"{run.prefix}.public.items") == filtered(standby), "items differ"
    assert rebuild(events, f"{run.prefix}.public.audit") == table(standby, "audit"), "audit differs"
    snapshots = [e.value for e in events if e.value and e.value.get("op") == "r"]
    initial = [v for v in snapshots if v["source"]["snapshot"] != "incremental"]
    assert sorted(v["after"]["id"] for v in initial if v["source"]["table"] == "items") == [
        i for i in range(1, SEED_ROWS + 1) if i % 3 != 0
    ]
    assert any(v["source"]["table"] == "audit" for v in snapshots if v["source"]["snapshot"] == "incremental")
    log = run.log.read_text()
    reconnected = "the server was promoted; going on from cdcd's own position" in log
    print(
        f"\npg{pair.version} standby capture: {workload.committed} transactions, {len(events)} events,"
        f" {duplicates(events)} duplicates, {'reconnected' if reconnected else 'same walsender'} after the promotion"
    )

    # A process started after the promotion: the state file says the slot was made on the standby, so the
    # unsynced slot on the promoted server is cdcd's own; it goes on from there.
    assert run.stop() == 0
    standby.execute("INSERT INTO items SELECT i, 'after', i FROM generate_series(900001, 900010) i")
    run.start(source={"primary_dsn": primary.dsn(), "reconnect": reconnect})
    events = run.sync(timeout=120)
    assert rebuild(events, f"{run.prefix}.public.items") == filtered(standby), "items differ after the restart"
    log = run.log.read_text()
    assert "the server was promoted; going on from cdcd's own position" in log, log[-3000:]
    assert log.count('"slot_created": true') == 1, "a new slot was made after the promotion"
    assert run.stop() == 0


def test_managed_publications_of_a_standby_are_made_on_the_primary(standby_run: StandbyRun) -> None:
    run, primary, standby = standby_run, standby_run.writer, standby_run.db
    managed = [{"name": "managed_pub", "tables": [{"name": "public.audit", "where": "n > 0"}]}]
    run.start(source={"primary_dsn": primary.dsn(), "publications": managed, "manage_publications": True})
    wait_log(run, "streaming", timeout=60)
    for server in (primary, standby):  # made on the primary, read on the standby
        assert server.execute("SELECT pubname FROM pg_publication WHERE pubname = 'managed_pub'") == [("managed_pub",)]
    primary.execute("INSERT INTO audit VALUES (101, 'in', 1), (102, 'out', 0)")
    events = run.sync()
    assert sorted(e.key["id"] for e in events if e.key and e.topic.endswith(".audit")) == [101]
    assert run.stop() == 0


def test_a_read_only_incremental_snapshot_on_a_standby_needs_no_primary(pair: Pair, standby_run: StandbyRun) -> None:
    """snapshot.read_only on a standby without source.primary_dsn: an incremental snapshot asked for on the signal
    topic, its windows closed at the standby's replay position, under the workload on the primary; the table
    rebuilt from Kafka equals the standby's, and cdcd had no way to write anywhere (it knows no primary)."""
    run, primary, standby = standby_run, standby_run.writer, standby_run.db
    signals = f"{run.prefix}-signal"
    try:
        nudged = threading.Event()

        def nudge() -> None:  # a slot made on a standby waits for a running-xacts record of the primary's
            while not nudged.wait(0.5):
                primary.execute("SELECT pg_log_standby_snapshot()")

        nudging = threading.Thread(target=nudge, daemon=True)
        nudging.start()
        run.start(
            extra={
                "snapshot": {"state_dir": str(run.tmp_path / "state"), "chunk_size": 40, "read_only": True},
                "signals": {"kafka": {"topic": signals, "poll_interval_s": 0.2}},
            }
        )
        wait_log(run, "streaming", timeout=90)
        nudged.set()
        workload = Workload(pair.db)
        workload.start()
        wait(lambda: workload.committed >= 10, "the workload")
        producer = Producer({"bootstrap.servers": run.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"]})
        request = {"type": "execute-snapshot", "data": {"data-collections": ["public.items"], "type": "incremental"}}
        producer.produce(signals, key=run.prefix, value=json.dumps({"id": "standby-ro", **request}))
        assert producer.flush(30) == 0
        wait_log(run, "table snapshot finished", count=3, timeout=180)  # initial items and audit, then items
        workload.stop.set()
        workload.join(timeout=30)
        assert workload.error is None, workload.error
        events = run.sync(timeout=120)
        assert rebuild(events, f"{run.prefix}.public.items") == filtered(standby), "items differ"
        incremental = [
            e.value["after"]["id"]
            for e in events
            if e.value and e.value.get("op") == "r" and e.value["source"]["snapshot"] == "incremental"
        ]
        assert len(incremental) > 40, "the incremental snapshot took more than one window"
        assert run.stop() == 0
    finally:
        delete_topics(run.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"], (signals,))


def _passed(primary: Database, standby: Database, xid: int) -> bool:
    """Whether the standby's current snapshot has its xmax beyond ``xid``; if not, the primary commits an xid."""
    xmax = standby.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")[0][0]
    if (int(xmax) & 0xFFFFFFFF) > xid:
        return True
    primary.execute("SELECT pg_current_xact_id()")
    return False


@pytest.mark.parametrize("pair", ["18"], indirect=True, ids=["pg18"])
def test_a_chunk_read_on_a_standby_has_not_seen_what_runs_on_the_primary(pair: Pair, standby_run: StandbyRun) -> None:
    """A transaction held open on the primary across a chunk read on the standby: pg_current_snapshot() on the
    standby does not list it (PostgreSQL keeps the primary's running transactions in the snapshot's subxip), so
    cdcd counts every transaction from the snapshot's xmin on as unseen, and the window drops the row it updates
    rather than writing the stale chunk row after the update."""
    primary, standby = standby_run.writer, standby_run.db
    with psycopg.connect(primary.dsn()) as held:
        xid = held.execute("UPDATE items SET v = 'held' WHERE id = 1 RETURNING pg_current_xact_id()::text::bigint")
        running = int(xid.fetchone()[0]) & 0xFFFFFFFF  # type: ignore[index]
        primary.execute("UPDATE items SET v = 'later' WHERE id = 2")  # commits after it: xmax passes it
        primary.execute("SELECT pg_log_standby_snapshot()")  # the standby learns what runs on the primary
        at = primary.execute("SELECT pg_current_wal_lsn()")[0][0]
        wait(lambda: standby.execute("SELECT pg_last_wal_replay_lsn() >= %s", [at])[0][0], "the standby to replay")
        # the standby's snapshots pass the held transaction (xmax beyond it) once it replayed a later commit: a
        # commit more (an xid of its own) each time it does not yet (it did not once in CI: xmin = xmax = running)
        wait(lambda: _passed(primary, standby, running), "the standby's snapshot to pass the held transaction")
        reader = SnapshotReader(standby.dsn(), None, "unused", read_only=True, standby=True)
        try:
            chunk = reader.chunk("public.items", None, None, 10, "wm")
        finally:
            reader.close()
    assert chunk.xids.xmin <= running < chunk.xids.xmax
    assert running not in chunk.xids.xip, "PostgreSQL lists the primary's running transactions on a standby now"
    assert chunk.xids.unseen(running)
    relation = chunk.table.relation
    window = ChunkWindow.open(
        ("public", "items"),
        relation,
        chunk.table.key_columns,
        chunk.rows,
        "wm",
        until=chunk.position,
        snapshot=chunk.xids,
    )
    assert window.concerns(running)
    assert not window.concerns((chunk.xids.xmin - 1) & 0xFFFFFFFF)
