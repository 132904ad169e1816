"""Snapshots on the real stack: existing rows reach Kafka as ``r`` events, and the state rebuilt from Kafka
equals the source tables, with writes going on during the initial snapshot, during an incremental snapshot,
across a kill -9, and with row filters."""

from __future__ import annotations

import contextlib
import json
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from confluent_kafka.schema_registry import SchemaRegistryClient

from tests.integration.conftest import Database, Tail, cdcd_env
from tests.integration.kafka_harness import Event, Run

pytestmark = [pytest.mark.integration, pytest.mark.every_pg]  # version-sensitive: on every major

BIG = """
CREATE TABLE big (id int PRIMARY KEY, v int NOT NULL, s text, doc text);
ALTER TABLE big ALTER COLUMN doc SET STORAGE EXTERNAL;
INSERT INTO big SELECT g, g % 97, CASE WHEN g % 10 = 0 THEN NULL ELSE 's' || g END,
       CASE WHEN g % 500 = 0 THEN repeat(md5(g::text), 100) END
  FROM generate_series(1, ROWS) g;
"""  # doc: every 500th row has a 3.2 kB value stored out of line (TOAST), unchanged by the workload's updates


def rebuild(events: list[Event], topic: str) -> dict[Any, dict[str, Any]]:
    """A table's rows by key as a consumer applying the events in order builds them."""
    rows: dict[Any, dict[str, Any]] = {}
    for e in events:
        if e.topic != topic or e.value is None:
            continue
        value = e.value
        if value["op"] == "t":
            rows.clear()
        elif value["op"] == "d":
            rows.pop(value["before"]["id"], None)
        else:
            after = dict(value["after"])
            old = rows.get(after["id"], {})
            for field in value["unchanged_toast"]:
                after[field] = old.get(field)  # a row not seen yet: its snapshot event comes later
            rows[after["id"]] = after
    return rows


def source_rows(db: Database, table: str = "big") -> dict[Any, dict[str, Any]]:
    with db.connect() as conn:
        cursor = conn.execute(f"SELECT * FROM {table}")
        names = [c.name for c in cursor.description or ()]
        return {row[0]: dict(zip(names, row, strict=True)) for row in cursor.fetchall()}


def assert_equal_rows(rebuilt: dict[Any, dict[str, Any]], source: dict[Any, dict[str, Any]]) -> None:
    assert rebuilt.keys() == source.keys(), (
        f"missing {sorted(source.keys() - rebuilt.keys())[:10]}, extra {sorted(rebuilt.keys() - source.keys())[:10]}"
    )
    wrong = [k for k in source if {c: rebuilt[k].get(c) for c in source[k]} != source[k]]
    assert not wrong, f"{len(wrong)} rows differ, e.g. {rebuilt[wrong[0]]} != {source[wrong[0]]}"


class Writer(threading.Thread):
    """Updates, deletes and inserts on ``big`` until stopped, in small transactions."""

    def __init__(self, dsn: str, rows: int, seed: int = 7) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rows, self.random = dsn, rows, random.Random(seed)
        self.halt = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                next_id = self.rows + 1
                while not self.halt.is_set():
                    with conn.transaction():
                        for _ in range(5):
                            k = self.random.randint(1, self.rows)
                            conn.execute("UPDATE big SET v = v + 1, s = %s WHERE id = %s", [f"u{k}", k])
                        conn.execute("DELETE FROM big WHERE id = %s", [self.random.randint(1, self.rows)])
                        conn.execute("INSERT INTO big VALUES (%s, -1, 'new', NULL)", [next_id])
                        next_id += 1
                    self.transactions += 1
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)
        assert self.error is None, f"workload failed: {self.error!r}"
        assert self.transactions > 0


def wait_log(run: Run, event: str, timeout: float = 180, count: int = 1) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        lines = [json.loads(x) for x in run.log.read_text().splitlines() if x.startswith("{")]
        found = [x for x in lines if x.get("event") == event]
        if len(found) >= count:
            return found
        run._check_alive()
        assert time.monotonic() < deadline, f"no {event!r} logged:\n{run.log.read_text()[-3000:]}"
        time.sleep(0.2)


def topic(run: Run, table: str = "big") -> str:
    return f"{run.prefix}.public.{table}"


def snapshot_events(run: Run, table: str = "big") -> list[dict[str, Any]]:
    return [e.value for e in run.events if e.topic == topic(run, table) and e.value and e.value["op"] == "r"]


# -- initial snapshot ---------------------------------------------------------------------------------------


TYPED = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE typed (id bigint PRIMARY KEY, b bool, i2 smallint, i4 int, f4 real, f8 double precision,
  n numeric(10,3), nu numeric, t text, vc varchar(10), bp char(3), by bytea, u uuid, d date, tm time,
  ts timestamp, tz timestamptz, iv interval, j json, jb jsonb, ai int[], at text[], m mood);
CREATE TABLE typed_streamed (LIKE typed INCLUDING ALL);
INSERT INTO typed VALUES
  (1, true, -7, 2147483647, 1.5, 2.25, 1234.567, 3.14159265358979323846, E'h\\u00e9llo\\ttab\\nline\\\\',
   'vc', 'ab', '\\x00ff'::bytea, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '2024-02-29', '13:14:15.5',
   '2024-02-29 13:14:15.123456', '2024-02-29 13:14:15.123456+02', '1 day 02:03:04', '{"a": 1}', '{"b": [1, 2]}',
   '{1,NULL,3}', '{"x,y","NULL",NULL,"back\\\\slash"}', 'happy'),
  (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
   NULL, NULL, NULL, NULL, NULL),
  (3, false, 0, 0, 'NaN', '-Infinity', 0, 'NaN', '', '', '', '', NULL, '0001-01-01', '00:00', '1970-01-01',
   '1999-12-31 23:59:59.999999-12', '-1 mons', 'null', '[]', '{}', '{}', 'sad');
"""


def test_initial_snapshot_with_concurrent_writes_then_stream_equals_source(run: Run, db: Database) -> None:
    rows = 60_000
    db.execute(
        BIG.replace("ROWS", str(rows)) + TYPED + "CREATE TABLE empty (id int PRIMARY KEY);"
        "CREATE PUBLICATION cdcd_pub FOR TABLE big, typed, typed_streamed, empty"
    )
    writer = Writer(db.dsn(), rows)
    writer.start()  # before the slot exists, while it is created and while the snapshot is read
    run.start()  # returns once streaming: the initial snapshot is read by then
    time.sleep(1)
    writer.stop()
    db.execute("INSERT INTO typed_streamed SELECT * FROM typed")  # the same values, through the stream
    events = run.sync()
    assert_equal_rows(rebuild(events, topic(run)), source_rows(db))

    snap = snapshot_events(run)
    markers = [v["source"]["snapshot"] for v in snap]
    # Each row once (the writer's changes before the consistent point are in it, later ones only in the stream).
    assert len({v["after"]["id"] for v in snap}) == len(snap) > rows * 0.95
    slot_point = snap[0]["source"]["lsn"]
    assert all(v["source"]["lsn"] == slot_point == v["source"]["commit_lsn"] for v in snap)
    stream = [e.value for e in events if e.topic == topic(run) and e.value and e.value["op"] != "r"]
    assert stream
    # None from before the snapshot. The consistent point is the end of the record that made the slot consistent;
    # the server decodes every transaction whose commit record starts at or after it, so a commit may start there.
    assert all(v["source"]["commit_lsn"] >= slot_point for v in stream)
    # Snapshot events come first on the topic; the whole snapshot's first and last rows are marked.
    ops = [e.value["op"] for e in events if e.topic == topic(run) and e.value]
    assert ops[: len(snap)] == ["r"] * len(snap)
    typed = snapshot_events(run, "typed")
    all_markers = [v["source"]["snapshot"] for v in typed] + markers
    assert all_markers.count("first") == all_markers.count("last") == 1
    assert set(all_markers) == {"first", "true", "last"}
    assert not [e for e in events if e.topic == topic(run, "empty")]
    # Snapshot rows are encoded exactly as the stream encodes the same values.
    streamed = {
        v["after"]["id"]: v["after"]
        for e in events
        if e.topic == topic(run, "typed_streamed")
        for v in [e.value]
        if v and v["op"] == "c"
    }
    assert {v["after"]["id"]: repr(v["after"]) for v in typed} == {k: repr(v) for k, v in streamed.items()}
    assert len(streamed) == 3
    assert run.stop() == 0


def test_filtered_initial_snapshot_copies_rows_matching_any_filter(run: Run, db: Database) -> None:
    """The seed's "Initial Data Synchronization": rows matching any publication's filter, and a publication
    without a filter on a table copies all of it; an unpublished table is not copied."""
    db.execute(
        "CREATE TABLE f (id int PRIMARY KEY, v text); CREATE TABLE g (id int PRIMARY KEY); CREATE TABLE h (id int);"
        "INSERT INTO f SELECT i, CASE WHEN i % 7 = 0 THEN 'x' END FROM generate_series(1, 300) i;"
        "INSERT INTO g SELECT generate_series(1, 50); INSERT INTO h SELECT generate_series(1, 5)"
    )
    publications = [
        {"name": "p_div3", "tables": [{"name": "public.f", "where": "id % 3 = 0"}, {"name": "public.g"}]},
        {"name": "p_x", "tables": [{"name": "public.f", "where": "v = 'x' AND id > 100"}], "publish": ["insert"]},
    ]
    run.start(source={"publications": publications, "manage_publications": True})
    run.sync()
    copied = sorted(v["after"]["id"] for v in snapshot_events(run, "f"))
    assert copied == [i for i in range(1, 301) if i % 3 == 0 or (i % 7 == 0 and i > 100)]
    assert sorted(v["after"]["id"] for v in snapshot_events(run, "g")) == list(range(1, 51))
    assert not snapshot_events(run, "h")
    # An incremental snapshot with --where: the row filters AND the condition.
    result = cdcd_snapshot(run, "public.f", "id > 250")
    assert result.returncode == 0, result.stderr
    wait_log(run, "table snapshot finished", count=3)  # f and g in the initial snapshot, then this one
    run.sync()
    incremental = sorted(
        v["after"]["id"] for v in snapshot_events(run, "f") if v["source"]["snapshot"] == "incremental"
    )
    assert incremental == [i for i in range(251, 301) if i % 3 == 0 or i % 7 == 0]
    assert run.stop() == 0


def cdcd_snapshot(run: Run, table: str, where: str | None = None) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "cdcd", "snapshot", "--config", str(run.tmp_path / "run.yaml"), "--table", table]
    env = cdcd_env()
    return subprocess.run(
        [*args, *(["--where", where] if where else [])], check=False, capture_output=True, text=True, env=env
    )


@pytest.mark.full_pg_only  # control flow, the same on every major
@pytest.mark.beyond_row_stage
def test_snapshot_request_errors_name_the_problem(run: Run, db: Database) -> None:
    db.execute(
        "CREATE TABLE k (id int PRIMARY KEY); CREATE TABLE nokey (v int); CREATE TABLE other (id int);"
        "CREATE PUBLICATION cdcd_pub FOR TABLE k, nokey"
    )
    run.start()
    for table, where, message in (
        ("public.other", None, "public.other is not published by cdcd_pub"),
        ("public.nokey", None, "public.nokey has no primary key or replica identity index"),
        ("public.k", "nope > 1", 'column "nope" does not exist'),
        ("public.k", "random() > 0.5", "random"),
    ):
        result = cdcd_snapshot(run, table, where)
        assert result.returncode == 2, result
        assert message in result.stderr
    assert run.stop() == 0


# -- incremental snapshot -------------------------------------------------------------------------------------


def test_incremental_snapshot_of_200k_rows_under_updates_and_deletes_converges(run15: Run) -> None:
    run, db = run15, run15.db
    rows = 200_000
    db.execute(BIG.replace("ROWS", str(rows)) + "CREATE PUBLICATION cdcd_pub FOR TABLE big")
    run.start(extra={"snapshot": {"mode": "never", "state_dir": str(run.tmp_path / "state"), "chunk_size": 5000}})
    writer = Writer(db.dsn(), rows)
    writer.start()
    result = cdcd_snapshot(run, "public.big")
    assert result.returncode == 0, result.stderr
    wait_log(run, "table snapshot finished", timeout=300)
    db.execute("ALTER TABLE big ADD COLUMN extra int")  # a new schema version for the events after it
    time.sleep(0.5)
    writer.stop()
    events = run.sync(timeout=300)
    assert_equal_rows(rebuild(events, topic(run)), source_rows(db))
    snap = snapshot_events(run)
    assert {v["source"]["snapshot"] for v in snap} == {"incremental"}
    # Each row at most once (rows the stream carried inside a chunk's window were dropped from it); the chunks
    # reach the rows the writer inserted meanwhile too.
    assert rows * 0.9 < len({v["after"]["id"] for v in snap}) == len(snap)
    # Events after the ALTER decode with the new schema version (the consumer looks each one up by id).
    after_alter = [
        v for e in events if e.topic == topic(run) and (v := e.value) and v["after"] and "extra" in v["after"]
    ]
    assert after_alter
    registry = SchemaRegistryClient({"url": run.env["CDCD_SCHEMA_REGISTRY__URL"]})
    assert len(registry.get_versions(f"{topic(run)}-value")) == 2


@pytest.mark.beyond_row_stage
def test_kill_9_during_the_initial_snapshot_resumes_after_the_last_saved_chunk(run15: Run) -> None:
    run, db = run15, run15.db
    rows = 150_000
    db.execute(BIG.replace("ROWS", str(rows)) + "CREATE PUBLICATION cdcd_pub FOR TABLE big")
    config = {"snapshot": {"state_dir": str(run.tmp_path / "state"), "chunk_size": 2000}}

    def saved_key() -> int | None:
        queue = saved_queue(run)
        return int(queue[0]["last_key"][0]) if queue and queue[0]["last_key"] else None

    writer = Writer(db.dsn(), rows)
    writer.start()
    start_then_kill(run, config, lambda: (saved_key() or 0) >= 20_000, "the snapshot never saved a chunk")
    killed_at = saved_key()
    assert killed_at is not None
    assert killed_at < rows, "the snapshot finished before it could be killed"
    run.start(extra=config)
    wait_log(run, "table snapshot finished", timeout=300)
    writer.stop()
    events = run.sync(timeout=300)
    assert_equal_rows(rebuild(events, topic(run)), source_rows(db))
    resumed = [v["after"]["id"] for v in snapshot_events(run) if v["source"]["snapshot"] == "incremental"]
    assert resumed
    assert min(resumed) > killed_at  # continued after the saved chunk, not from zero
    assert "initial snapshot was interrupted: continuing it incrementally" in run.log.read_text()


# -- a parallel initial snapshot (snapshot.parallelism) ---------------------------------------------------------


# What is version-sensitive here (the slot's exported snapshot, the stream after it) the serial test above checks on
# every major; the connections that import that snapshot (SET TRANSACTION SNAPSHOT) work alike on 14-18.
@pytest.mark.full_pg_only
def test_parallel_initial_snapshot_with_concurrent_writes_then_stream_equals_source(run: Run, db: Database) -> None:
    rows = 60_000
    db.execute(
        BIG.replace("ROWS", str(rows)) + "CREATE TABLE empty (id int PRIMARY KEY);"
        "CREATE TABLE nokey (n int, t text); INSERT INTO nokey SELECT g, 't' || g FROM generate_series(1, 300) g;"
        "CREATE PUBLICATION cdcd_pub FOR TABLE big, empty, nokey"
    )
    snapshot = {"state_dir": str(run.tmp_path / "state"), "chunk_size": 2000, "parallelism": 2}
    writer = Writer(db.dsn(), rows)
    writer.start()  # before the slot exists, while it is created and while the snapshot is read
    run.start(extra={"snapshot": snapshot})
    time.sleep(1)
    writer.stop()
    events = run.sync()
    assert_equal_rows(rebuild(events, topic(run)), source_rows(db))

    assert [x["ranges"] for x in wait_log(run, "table cut into key ranges")] == [8]  # 60,000 rows, 4 per connection
    assert wait_log(run, "initial snapshot read")[0]["connections"] == 2
    snap = snapshot_events(run)
    assert len({v["after"]["id"] for v in snap}) == len(snap) > rows * 0.95  # each row once
    slot_point = snap[0]["source"]["lsn"]
    assert all(v["source"]["lsn"] == slot_point for v in snap)
    stream = [e.value for e in events if e.topic == topic(run) and e.value and e.value["op"] != "r"]
    assert stream
    assert all(v["source"]["commit_lsn"] >= slot_point for v in stream)
    ops = [e.value["op"] for e in events if e.topic == topic(run) and e.value]
    assert ops[: len(snap)] == ["r"] * len(snap)
    nokey = snapshot_events(run, "nokey")  # no key: read whole, on one of the connections
    assert sorted(v["after"]["n"] for v in nokey) == list(range(1, 301))
    markers = [v["source"]["snapshot"] for v in snap + nokey]
    assert markers.count("first") == markers.count("last") == 1
    assert not [e for e in events if e.topic == topic(run, "empty")]
    assert run.stop() == 0


_BOUND = re.compile(r"(>=|<) CAST\('(-?\d+)' AS integer\)")


def _key_range(text: str) -> tuple[int, int]:
    """``(low, high)`` of a saved key range's SQL (``low <= id < high``; an open end as +-2**31)."""
    low, high = -(2**31), 2**31
    for op, value in _BOUND.findall(text):
        low, high = (int(value), high) if op == ">=" else (low, int(value))
    return low, high


@pytest.mark.beyond_row_stage
def test_kill_9_during_a_parallel_initial_snapshot_rereads_only_the_unfinished_ranges(run15: Run) -> None:
    run, db = run15, run15.db
    rows = 150_000
    db.execute(BIG.replace("ROWS", str(rows)) + "ANALYZE big; CREATE PUBLICATION cdcd_pub FOR TABLE big")
    # small chunks: each acknowledged one is saved (fsync), which leaves time to kill it halfway
    config = {"snapshot": {"state_dir": str(run.tmp_path / "state"), "chunk_size": 500, "parallelism": 2}}

    def some_ranges_finished() -> bool:
        queue = saved_queue(run)
        return bool(queue) and all(p["key_range"] for p in queue) and len(queue) <= 6

    writer = Writer(db.dsn(), rows)
    writer.start()
    start_then_kill(run, config, some_ranges_finished, "no key range of the snapshot was ever finished")
    unfinished = {_key_range(p["key_range"]): p["last_key"] for p in saved_queue(run)}
    assert 1 <= len(unfinished) <= 6, "the snapshot finished before it could be killed"
    run.start(extra=config)
    wait_log(run, "table snapshot finished", timeout=300)
    writer.stop()
    events = run.sync(timeout=300)
    assert_equal_rows(rebuild(events, topic(run)), source_rows(db))  # nothing lost

    def unfinished_after_saved_key(key: int) -> bool:
        return any(
            low <= key < high and (last is None or key > int(last[0])) for (low, high), last in unfinished.items()
        )

    snap = snapshot_events(run)
    resumed = [v["after"]["id"] for v in snap if v["source"]["snapshot"] == "incremental"]
    assert resumed
    assert all(unfinished_after_saved_key(k) for k in resumed)  # finished ranges, saved keys: not read again
    seen: dict[int, int] = {}
    for v in snap:
        seen[v["after"]["id"]] = seen.get(v["after"]["id"], 0) + 1
    twice = [k for k, n in seen.items() if n > 1]
    assert all(unfinished_after_saved_key(k) for k in twice)  # at least once, only where nothing was saved
    assert "initial snapshot was interrupted: continuing it incrementally" in run.log.read_text()


def saved_queue(run: Run) -> list[dict[str, Any]]:
    """The snapshot queue in ``run``'s state file now ([] before cdcd first wrote it)."""
    try:
        return list(json.loads((run.tmp_path / "state" / f"{run.slot}.snapshot.json").read_text())["queue"])
    except (FileNotFoundError, ValueError):
        return []


def start_then_kill(run: Run, config: dict[str, Any], ready: Callable[[], bool], failure: str, **kafka: Any) -> None:
    """Start cdcd with ``config`` and kill it with SIGKILL as soon as ``ready`` (``failure``: if it never is)."""
    thread = threading.Thread(target=lambda: start_quietly(run, config, **kafka), daemon=True)
    thread.start()
    wait_until(ready, failure)
    assert run.proc is not None
    run.proc.send_signal(signal.SIGKILL)
    run.proc.wait()
    thread.join()


def start_quietly(run: Run, config: dict[str, Any], **kafka: Any) -> None:
    """run.start waits for streaming and fails if the process dies: here it is killed on purpose."""
    with contextlib.suppress(AssertionError):
        run.start(extra=config, **kafka)


def wait_until(condition: Callable[[], bool], failure: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, failure
        time.sleep(0.02)


@pytest.mark.full_pg_only  # control flow, the same on every major
def test_lost_slot_is_an_error_unless_when_needed_which_snapshots_again(
    db: Database, tail_factory: Callable[..., Tail]
) -> None:
    db.execute(
        "CREATE TABLE k (id int PRIMARY KEY); INSERT INTO k SELECT generate_series(1, 10);"
        "CREATE PUBLICATION cdcd_pub FOR TABLE k"
    )
    tail = tail_factory().start()
    tail.wait_for(lambda lines: len(lines) == 10)
    assert {line["snapshot"] for line in tail.lines()} == {"first", "true", "last"}
    assert tail.stop() == 0
    tail.wait_slot_released()
    db.execute("SELECT pg_drop_replication_slot(%s)", [tail.slot])
    db.execute("INSERT INTO k VALUES (11)")  # lost with the slot: only a new snapshot brings it

    proc = tail.start().proc
    assert proc is not None
    assert proc.wait(timeout=60) == 1
    assert f"slot '{tail.slot}' no longer exists" in tail.log.read_text()
    assert not db.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", [tail.slot])

    config = yaml.safe_load(tail.config.read_text())
    config["snapshot"]["mode"] = "when_needed"
    tail.config.write_text(yaml.safe_dump(config))
    tail.start()
    lines = tail.wait_for(lambda lines: len(lines) == 21)
    assert sorted(int(line["after"]["id"]) for line in lines[10:]) == list(range(1, 12))
    assert "the slot was lost or invalidated" in tail.log.read_text()


# A row filter that passes no row and takes some 50 ms a row (each replace doubles a 10 kB text): a COPY of 2000
# such rows scans for minutes without a line to send, so a stop request looked at between batches waits as long.
SLOW_FILTER = "length(" + "replace(" * 6 + "v" + ", 'x', 'xx')" * 6 + ") = 1"


def _active_copies(db: Database) -> int:
    rows = db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND state = 'active' AND query LIKE 'COPY (%%'",
        [db.name],
    )
    return int(rows[0][0])


@pytest.mark.full_pg_only  # control flow, the same on every major
@pytest.mark.pg_since(15)  # a row filter makes the COPY slow
@pytest.mark.beyond_row_stage
def test_a_stop_cancels_the_copy_of_a_serial_initial_snapshot(db: Database, tail_factory: Callable[..., Tail]) -> None:
    """SIGTERM during an initial snapshot's COPY that sends no row for minutes (a selective filter) cancels it
    (PostgreSQL's cancel): cdcd stops within seconds, and the server stops scanning."""
    db.execute(
        "CREATE TABLE slow (id int PRIMARY KEY, v text);"
        "INSERT INTO slow SELECT i, repeat('x', 10000) FROM generate_series(1, 2000) i;"
        "ANALYZE slow"  # its rows are estimated by the planner, not counted with the filter (as long as the COPY)
    )
    publications = [
        {"name": "cdcd_pub", "tables": [{"name": "public.slow", "where": SLOW_FILTER}], "publish": ["insert"]}
    ]
    tail = tail_factory(publications=publications, manage_publications=True).start()
    wait_until(lambda: _active_copies(db) == 1, "the initial snapshot's COPY never ran", timeout=60)
    time.sleep(1)  # well into its scan
    assert tail.stop() == 0  # within 30 s: the COPY alone would take minutes
    assert "initial snapshot done" not in tail.log.read_text()
    wait_until(lambda: _active_copies(db) == 0, "the COPY went on after cdcd stopped", timeout=10)


def _slot_exists(db: Database, slot: str) -> bool:
    return bool(db.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", [slot]))


@pytest.mark.full_pg_only  # control flow, the same on every major
def test_creating_the_slot_while_a_transaction_runs_has_a_deadline_and_a_stop_ends_it(
    db: Database, tail_factory: Callable[..., Tail]
) -> None:
    """CREATE_REPLICATION_SLOT waits for the transactions running on the server to end: SIGTERM cancels it (no
    slot is left), and past source.slot_create_timeout_s it is cancelled and asked again."""
    db.execute("CREATE TABLE k (id int PRIMARY KEY); CREATE PUBLICATION cdcd_pub FOR TABLE k")
    with db.connect() as running:
        running.execute("BEGIN")
        running.execute("SELECT pg_current_xact_id()")  # an xid: a new slot waits for its end
        tail = tail_factory(slot_create_timeout_s=0).start()
        wait_until(lambda: _slot_exists(db, tail.slot), "the slot's creation never began", timeout=60)
        time.sleep(1)
        assert tail.stop() == 0  # within 30 s: the transaction is still running
        wait_until(lambda: not _slot_exists(db, tail.slot), "the slot begun was left behind", timeout=10)

        config = yaml.safe_load(tail.config.read_text())
        config["source"]["slot_create_timeout_s"] = 1
        tail.config.write_text(yaml.safe_dump(config))
        tail.start()
        retried = "CREATE_REPLICATION_SLOT did not finish within 1 s (source.slot_create_timeout_s)"
        wait_until(lambda: tail.log.read_text().count(retried) >= 2, "the slot's creation was not retried", 60)
        assert tail.stop() == 0
    tail.start().wait_streaming(timeout=60)  # the transaction ended: the slot is made
    assert tail.stop() == 0


def test_an_unusable_state_file_stops_cdcd_with_the_file_named(db: Database, tail_factory: Callable[..., Tail]) -> None:
    db.execute("CREATE TABLE k (id int PRIMARY KEY); CREATE PUBLICATION cdcd_pub FOR TABLE k")
    tail = tail_factory()
    state = Path(yaml.safe_load(tail.config.read_text())["snapshot"]["state_dir"]) / f"{tail.slot}.snapshot.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text("{not json")
    proc = tail.start().proc
    assert proc is not None
    assert proc.wait(timeout=60) == 1
    log = tail.log.read_text()
    assert "snapshot cannot go on" in log
    assert f"snapshot state {state} is not valid JSON" in log
    assert "Traceback" not in log


@pytest.mark.full_pg_only  # control flow, the same on every major
def test_an_incompatible_column_type_change_stops_with_the_column_named(run: Run, db: Database) -> None:
    db.execute(
        "CREATE TABLE c (id int PRIMARY KEY, v int); INSERT INTO c VALUES (1, 1);"
        "CREATE PUBLICATION cdcd_pub FOR TABLE c"
    )
    run.start()
    run.sync()
    subject = f"{topic(run, 'c')}-value"
    registry = SchemaRegistryClient({"url": run.env["CDCD_SCHEMA_REGISTRY__URL"]})
    registry.set_compatibility(subject, "BACKWARD")
    db.execute("ALTER TABLE c ALTER COLUMN v TYPE text; INSERT INTO c VALUES (2, 'two')")
    lsn = db.execute("SELECT pg_current_wal_lsn()::text")[0][0]
    assert run.proc is not None
    assert run.proc.wait(timeout=60) == 1
    log = run.log.read_text()
    assert f"schema registry refused the new schema for {subject} (column v changed type from int to string)" in log
    confirmed = db.execute(
        "SELECT confirmed_flush_lsn < %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s", [lsn, run.slot]
    )
    assert confirmed == [(True,)]  # the insert after the change is not confirmed: a restart sends it again


def test_a_table_without_statistics_is_counted_when_small_and_unknown_when_large(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot's row estimate of a never-analyzed table: the planner's guess from its pages would be 850 rows
    for a 2-row table; cdcd counts a small one and says "unknown" (None) for a large one."""
    from cdcd.snapshot import reader as reader_module  # noqa: PLC0415 - cdcd in-process: this test only

    db.execute(
        "CREATE TABLE small (id int PRIMARY KEY, s text); INSERT INTO small VALUES (1, 'a'), (2, 'b');"
        " CREATE TABLE empty (id int PRIMARY KEY);"
        " CREATE TABLE part (id int PRIMARY KEY) PARTITION BY RANGE (id);"
        " CREATE TABLE part_a PARTITION OF part FOR VALUES FROM (0) TO (100);"
        " CREATE TABLE part_b PARTITION OF part FOR VALUES FROM (100) TO (200);"
        " INSERT INTO part SELECT generate_series(1, 150)"
    )
    reader = reader_module.SnapshotReader(db.dsn(), None, "unused")
    try:
        small = reader.describe("public.small")
        assert reader.estimate(small, None, None) == 2
        assert reader.estimate(small, "id > 1", None) == 1
        assert reader.estimate(small, None, ["1"]) == 1  # after key 1
        assert reader.estimate(reader.describe("public.empty"), None, None) == 0
        assert reader.estimate(reader.describe("public.part"), None, None) == 150
        monkeypatch.setattr(reader_module, "COUNT_ROWS_UP_TO_BYTES", 0)
        assert reader.estimate(small, None, None) is None  # too large to count: unknown
        db.execute("ANALYZE small")
        assert reader.estimate(small, None, None) == 2  # the planner's, from statistics
    finally:
        reader.close()


def test_a_column_dropped_after_the_snapshot_was_exported_is_left_out_not_fatal(db: Database) -> None:
    """The initial snapshot reads in the slot's exported snapshot, whose catalog still has a column a migration
    dropped since; queries are planned against the current catalog, so selecting it failed ("column does not
    exist") and the snapshot stopped. The column's values are gone: the snapshot reads the rest of the row."""
    from cdcd.snapshot import reader as reader_module  # noqa: PLC0415 - cdcd in-process: this test only

    db.execute(
        "CREATE TABLE items (id int PRIMARY KEY, v text, w int); INSERT INTO items SELECT i, 'v' || i, i FROM"
        " generate_series(1, 5) i"
    )
    reader = reader_module.SnapshotReader(db.dsn(), None, "unused")
    try:
        reader.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        reader.conn.execute("SELECT 1")  # the transaction's snapshot is taken here
        db.execute("ALTER TABLE items DROP COLUMN v")
        table = reader.describe("public.items")
        assert [c.name for c in table.relation.columns] == ["id", "w"]
        assert reader.estimate(table, None, None) == 5
        assert [list(r) for r in reader.rows(table, None, None)] == [[str(i), str(i)] for i in range(1, 6)]
        with pytest.raises(psycopg.errors.LockNotAvailable):  # the table stays locked against schema changes
            db.execute("SET lock_timeout = '100ms'; ALTER TABLE items DROP COLUMN w")
        reader.end_transaction()
    finally:
        reader.close()


@pytest.mark.full_pg_only  # psycopg's behaviour, the same on every major
@pytest.mark.beyond_row_stage
def test_a_column_added_while_a_table_is_snapshotted_chunk_by_chunk_is_read(db: Database) -> None:
    """Each chunk describes its table again (``SELECT * FROM t LIMIT 0``); psycopg prepares a query run five
    times, and a prepared one fails once a column is added ("cached plan must not change result type"): cdcd
    stopped in the lifecycle nemesis, at every start while the snapshot stayed queued."""
    from cdcd.snapshot import reader as reader_module  # noqa: PLC0415 - cdcd in-process: this test only

    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text); INSERT INTO items VALUES (1, 'a')")
    reader = reader_module.SnapshotReader(db.dsn(), None, "unused")
    try:
        for _ in range(6):
            assert [c.name for c in reader.describe("public.items").relation.columns] == ["id", "v"]
        db.execute("ALTER TABLE items ADD COLUMN w int")
        assert [c.name for c in reader.describe("public.items").relation.columns] == ["id", "v", "w"]
    finally:
        reader.close()


# -- session start and table lifecycle (issue 44) ---------------------------------------------------------------


@pytest.mark.full_pg_only  # control flow, the same on every major
@pytest.mark.beyond_row_stage
def test_a_first_run_stopped_while_waiting_for_kafka_snapshots_at_the_next_start(run: Run, db: Database) -> None:
    """The first run created the slot, waited for Kafka (exactly-once: the progress topic's read) and was stopped.
    The restart found the slot without snapshot state, snapshotted nothing and streamed: the table's existing rows
    never reached Kafka. The plan saved as the slot was made resumes, incrementally (its exported snapshot died)."""
    db.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 1000) g;"
        "CREATE PUBLICATION cdcd_pub FOR TABLE t"
    )
    exactly_once: dict[str, Any] = {"delivery": "exactly_once", "exactly_once": {"commit_interval_ms": 30}}
    away = threading.Thread(
        target=lambda: start_quietly(run, {}, bootstrap_servers="127.0.0.1:9", **exactly_once), daemon=True
    )
    away.start()
    wait_until(lambda: run.log.exists() and "waiting for Kafka" in run.log.read_text(), "cdcd never waited for Kafka")
    assert db.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", [run.slot])
    assert run.stop() == 0
    away.join()
    run.start(**exactly_once)
    run.consume_until(lambda events: len(snapshot_events(run, "t")) >= 1000, timeout=60)
    assert sorted(int(e["after"]["id"]) for e in snapshot_events(run, "t")) == list(range(1, 1001))
    assert "the slot exists but no snapshot state was found" not in run.log.read_text()
    assert run.stop() == 0


@pytest.mark.full_pg_only  # control flow, the same on every major
@pytest.mark.beyond_row_stage
def test_a_table_dropped_while_queued_leaves_the_queue_and_cdcd_streams_on(
    db: Database, tail_factory: Callable[..., Tail]
) -> None:
    """A table queued by `cdcd snapshot` behind a large incremental snapshot and dropped meanwhile: its turn raised
    TableGone out of the loop, and every restart died on it again."""
    db.execute(
        "CREATE TABLE big (id int PRIMARY KEY); INSERT INTO big SELECT generate_series(1, 50000);"
        "CREATE TABLE d (id int PRIMARY KEY); INSERT INTO d VALUES (1); CREATE TABLE k (id int PRIMARY KEY);"
        "CREATE PUBLICATION cdcd_pub FOR TABLE big, d, k"
    )
    tail = tail_factory()
    config = yaml.safe_load(tail.config.read_text())
    config["snapshot"].update(mode="never", chunk_size=100)
    tail.config.write_text(yaml.safe_dump(config))
    tail.start().wait_streaming()
    state = tail.config.parent / "state" / f"{tail.slot}.snapshot.json"

    def queued() -> list[str]:
        return [p["table"] for p in json.loads(state.read_text())["queue"]] if state.exists() else []

    for table in ("public.big", "public.d"):
        args = [sys.executable, "-m", "cdcd", "snapshot", "--config", str(tail.config), "--table", table]
        subprocess.run(args, check=True, capture_output=True, env=cdcd_env())

    def drained() -> bool:
        assert tail.proc is not None
        assert tail.proc.poll() is None, f"cdcd tail exited:\n{tail.log.read_text()[-3000:]}"
        return not queued()

    wait_until(lambda: queued() == ["public.big", "public.d"], "never queued both")
    db.execute("DROP TABLE d")
    db.execute("INSERT INTO k VALUES (1)")
    wait_until(drained, "the queue never emptied", timeout=90)
    tail.wait_for(lambda lines: any(line["table"] == "k" for line in lines))
    assert tail.proc is not None
    assert tail.proc.poll() is None
    log = tail.log.read_text()
    assert "a table queued for a snapshot no longer exists" in log
    assert "Traceback" not in log
    assert tail.stop() == 0


@pytest.mark.full_pg_only  # control flow, the same on every major
@pytest.mark.beyond_row_stage
def test_a_table_renamed_while_cdcd_was_stopped_is_not_snapshotted_again(
    db: Database, tail_factory: Callable[..., Tail]
) -> None:
    """The state tracked tables by name: after a restart a renamed table was 'newly captured' and re-read in full."""
    db.execute(
        "CREATE TABLE r (id int PRIMARY KEY); INSERT INTO r SELECT generate_series(1, 10);"
        "CREATE PUBLICATION cdcd_pub FOR TABLE r"
    )
    tail = tail_factory().start()
    tail.wait_for(lambda lines: len(lines) == 10)
    assert tail.stop() == 0
    tail.wait_slot_released()
    db.execute("ALTER TABLE r RENAME TO r2; INSERT INTO r2 VALUES (11)")
    tail.start()
    lines = tail.wait_for(lambda lines: len(lines) >= 11)
    tail.wait_streaming()
    db.execute("INSERT INTO r2 VALUES (12)")
    lines = tail.wait_for(lambda lines: any(line["after"]["id"] in (12, "12") for line in lines))
    assert [(line["op"], line["table"]) for line in lines[10:]] == [("c", "r2"), ("c", "r2")]
    assert "table newly captured" not in tail.log.read_text()
    assert tail.stop() == 0
