"""cdcd run to Kafka on the real stack: a consumer reading through the schema registry sees exactly what
the database committed, in order, with typed values; the flush LSN follows Kafka's acknowledgements."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from confluent_kafka.schema_registry import SchemaRegistryClient

from cdcd.lsn import parse_lsn
from tests.integration.conftest import STACK, Database, PgServer, scratch_database
from tests.integration.kafka_harness import Event, Run
from tests.integration.workload import SCHEMA, Change, Model, Txn, interleaved_workload

pytestmark = pytest.mark.integration


def text_row(record: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if record is None else {k: None if v is None else str(v) for k, v in record.items()}


def expected_events(model: Model) -> dict[str, list[Change]]:
    """Per table, what the envelopes must say: a key change is a delete plus a create (Debezium's way)."""
    out: dict[str, list[Change]] = {"items": [], "audit": []}
    for _, changes in model.committed:
        for op, table, before, after in changes:
            if op == "u" and before is not None and after is not None and before["id"] != after["id"]:
                out[table] += [("d", table, before, None), ("c", table, None, after)]
            else:
                out[table].append((op, table, before, after))
    return out


def observed(events: list[Event], prefix: str, table: str) -> list[Change]:
    rows = []
    for e in events:
        if e.topic != f"{prefix}.public.{table}" or e.value is None:
            continue
        before, after = text_row(e.value["before"]), text_row(e.value["after"])
        if table == "items" and before is not None:  # default replica identity: the key only
            before = {"id": before["id"]}
        rows.append((e.value["op"], table, before, after))
    return rows


def data_events(events: list[Event], prefix: str) -> list[Event]:
    return [e for e in events if e.topic in (f"{prefix}.public.items", f"{prefix}.public.audit")]


# Transactions of at least this many changes acknowledged whole (kafka.whole_transaction_changes): "whole" makes
# the workloads' larger transactions take that path and its smaller ones the one of a report per message.
WHOLE = pytest.mark.parametrize("whole", [{}, {"whole_transaction_changes": 3}], ids=["each", "whole"])


@WHOLE
def test_committed_changes_arrive_in_order_with_tombstones_and_transactions(
    run: Run, db: Database, whole: dict[str, Any]
) -> None:
    db.execute(SCHEMA + "; CREATE TABLE unpublished (id int PRIMARY KEY)")
    run.start(**whole)
    model = Model()
    db.execute("INSERT INTO unpublished VALUES (1)")  # PostgreSQL 14 sends it as an empty transaction
    interleaved_workload(db.dsn(), model)
    expected = expected_events(model)
    total = sum(len(v) for v in expected.values())
    deletes = sum(1 for table in ("items", "audit") for c in expected[table] if c[0] == "d")  # each: a tombstone
    run.consume_until(lambda events: len(data_events(events, run.prefix)) >= total + deletes)
    for table in ("items", "audit"):
        assert observed(run.events, run.prefix, table) == expected[table]
    for e in run.events:  # keyed by the primary key, REPLICA IDENTITY FULL (audit) too
        if e.topic.endswith((".audit", ".items")):
            assert e.key is not None
            if e.value is not None:
                row = e.value["before"] if e.value["op"] == "d" else e.value["after"]
                assert e.key == {"id": row["id"]}
    # Each keyed delete is followed by a tombstone with the same key.
    for topic in {e.topic for e in data_events(run.events, run.prefix)}:
        stream = [e for e in run.events if e.topic == topic]
        for i, event in enumerate(stream):
            if event.value is not None and event.value["op"] == "d" and event.key is not None:
                assert stream[i + 1].value is None
                assert stream[i + 1].key == event.key

    # The transaction topic: BEGIN and END per transaction; END counts the data events.
    def transaction_ends(events: list[Event]) -> dict[str, dict[str, Any]]:
        values = [e.value for e in events if e.topic.endswith(".transaction") and e.value is not None]
        return {v["id"]: v for v in values if v["status"] == "END"}

    ends = transaction_ends(run.consume_until(lambda events: len(transaction_ends(events)) >= len(model.committed)))
    for e in data_events(run.events, run.prefix):
        if e.value is not None:
            assert e.value["transaction"]["id"] in ends
    per_txn: dict[str, int] = {}
    for e in data_events(run.events, run.prefix):
        if e.value is not None:
            per_txn[e.value["transaction"]["id"]] = per_txn.get(e.value["transaction"]["id"], 0) + 1
    assert {k: v["event_count"] for k, v in ends.items()} == per_txn  # and no END for a transaction without events
    assert run.stop() == 0
    # With the threshold of 3, the transactions of 3 changes or more went to Kafka whole, the others message by message.
    logged = [json.loads(line) for line in run.log.read_text().splitlines() if "large transaction in Kafka" in line]
    large = {xid for xid, changes in model.committed if len(changes) >= 3} if whole else set()
    assert {entry["xid"] for entry in logged} == large
    # The confirmed position covers the last commit: Kafka acknowledged everything.
    last_commit = max(e.value["source"]["commit_lsn"] for e in data_events(run.events, run.prefix) if e.value)
    confirmed = db.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", [run.slot]
    )[0][0]
    assert parse_lsn(confirmed) > last_commit


def test_small_transactions_go_through_the_compiled_lane_and_arrive_whole(run: Run, db: Database) -> None:
    """One-row and few-row transactions committed while cdcd is stopped: a backlog, read many whole transactions
    at a time, where the compiled lane takes them (when cdcd keeps up, a transaction's frames come in separate
    reads and the core takes them). After each table's first transaction (whose Relation message the core takes)
    the lane takes all (the ``stopped`` line counts them; none with ``CDCD_IMPL=python``). Every event arrives
    in order with its transaction's BEGIN and END; the lane's bytes are the Python stages' own (unit tests)."""
    db.execute(SCHEMA)
    plain = {"dsn": db.dsn()}  # not the harness's settings that make even small transactions stream
    run.start(plain)  # makes the slot
    assert run.stop() == 0
    with db.connect() as conn:
        for i in range(1, 41):
            conn.execute("INSERT INTO items VALUES (%s, %s, %s)", [i, f"v{i}", i])  # autocommit: one per row
        for i in range(1, 41, 4):
            with conn.transaction():
                conn.execute("UPDATE items SET n = n + 100 WHERE id = %s", [i])
                conn.execute("DELETE FROM items WHERE id = %s", [i + 1])
                conn.execute("INSERT INTO audit VALUES (%s, 'moved', %s)", [i, i])
    run.start(plain)
    events = run.consume_until(lambda events: len(data_events(events, run.prefix)) >= 40 + 10 * 4)
    items = [(e.value["op"], e.value["after"] or e.value["before"]) for e in data_events(events, run.prefix)
             if e.topic.endswith(".items") and e.value is not None]  # fmt: skip
    assert [(op, row["id"]) for op, row in items[:40]] == [("c", i) for i in range(1, 41)]
    assert [(op, row["id"]) for op, row in items[40:]] == [x for i in range(1, 41, 4) for x in (("u", i), ("d", i + 1))]
    assert [row["n"] for op, row in items[40:] if op == "u"] == [i + 100 for i in range(1, 41, 4)]
    ends = [e.value for e in events if e.topic.endswith(".transaction") and e.value and e.value["status"] == "END"]
    assert [end["event_count"] for end in ends] == [1] * 40 + [3] * 10
    assert run.stop() == 0
    stopped = run.logged("stopped")
    assert stopped["transactions"] == 50, stopped
    if os.environ.get("CDCD_IMPL") == "python":
        assert stopped["laned"] == 0, stopped
    else:
        # All but each table's first transaction (48), less those a read of the backlog happened to cut (the core
        # takes a transaction whose frames end a read): a loaded machine reads in smaller pieces.
        assert stopped["laned"] >= 40, stopped


def test_typed_values_truncate_and_messages(run: Run, db: Database) -> None:
    db.execute(
        "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');"
        "CREATE TABLE typed (id bigint PRIMARY KEY, b bool, i2 smallint, i4 int, f4 real, f8 double precision,"
        " n numeric(10,3), nu numeric, t text, vc varchar(10), bp char(3), by bytea, u uuid, d date, tm time,"
        " ts timestamp, tz timestamptz, iv interval, j json, jb jsonb, ai int[], at text[], m mood);"
        "CREATE TABLE items (id int PRIMARY KEY);"
        "CREATE PUBLICATION cdcd_pub FOR TABLE typed, items"
    )
    run.start()
    u = uuid.uuid4()
    db.execute(
        "INSERT INTO typed VALUES (1, true, -7, 2147483647, 1.5, 2.25, 1234.567, 3.14159265358979323846, 'héllo',"
        " 'vc', 'ab', '\\x00ff'::bytea, %s, '2024-02-29', '13:14:15.5', '2024-02-29 13:14:15.123456',"
        " '2024-02-29 13:14:15.123456+02', '1 day 02:03:04', '{\"a\": 1}', '{\"b\": [1, 2]}',"
        " '{1,NULL,3}', '{\"x,y\",\"NULL\",NULL}', 'happy'), (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
        " NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
        [u],
    )
    db.execute("INSERT INTO items VALUES (1); TRUNCATE items")
    db.execute("SELECT pg_logical_emit_message(false, 'audit', 'hello')")
    events = run.consume_until(
        lambda ev: (
            any(e.topic.endswith(".message") for e in ev)
            and any(e.value and e.value.get("op") == "t" for e in ev)
            and sum(1 for e in ev if e.topic.endswith(".typed")) >= 2
        )
    )
    typed = [e.value["after"] for e in events if e.topic == f"{run.prefix}.public.typed" and e.value]
    row = typed[0]
    assert row["id"] == 1
    assert row["b"] is True
    assert (row["i2"], row["i4"]) == (-7, 2147483647)
    assert (row["f4"], row["f8"]) == (1.5, 2.25)
    assert row["n"] == decimal.Decimal("1234.567")
    assert decimal.Decimal(str(row["nu"])) == decimal.Decimal("3.14159265358979323846")
    assert (row["t"], row["vc"], row["bp"]) == ("héllo", "vc", "ab ")
    assert row["by"] == b"\x00\xff"
    assert str(row["u"]) == str(u)
    assert row["d"] == dt.date(2024, 2, 29)
    assert row["tz"] == dt.datetime(2024, 2, 29, 11, 14, 15, 123456, tzinfo=dt.UTC)
    assert row["ai"] == [1, None, 3]
    assert row["at"] == ["x,y", "NULL", None]
    assert row["m"] == "happy"
    assert '"a"' in row["j"]
    assert '"b"' in row["jb"]
    assert all(v is None for k, v in typed[1].items() if k != "id")
    truncates = [e for e in events if e.value and e.value.get("op") == "t"]
    assert [e.topic for e in truncates] == [f"{run.prefix}.public.items"]
    (message,) = [e for e in events if e.topic == f"{run.prefix}.message"]
    assert message.value is not None
    assert message.value["message"] == {"prefix": "audit", "content": b"hello"}
    assert run.stop() == 0


def test_kill_9_at_several_points_loses_nothing(run: Run, db: Database) -> None:
    db.execute(SCHEMA)
    run.start()
    # streaming: a kill during the initial snapshot would have it go on incrementally at the restart, reading the
    # rows written meanwhile as well (events this test does not expect; they are right)
    run.wait_confirmed()
    model = Model()
    for round_ in range(3):
        for i in range(10):
            txn = Txn(db.dsn(), model)
            txn.insert_many("items", 100_000 + round_ * 10_000 + i * 100, 40, f"k{round_}-")
            txn.commit()
        time.sleep(0.3 * round_)  # kill at different points: mid-production, after acks, ...
        assert run.stop(signal.SIGKILL) == -9
        run.start()
    expected = expected_events(model)["items"]
    run.consume_until(lambda events: set(map(repr, observed(events, run.prefix, "items"))) >= set(map(repr, expected)))
    seen = observed(run.events, run.prefix, "items")
    assert set(map(repr, seen)) == set(map(repr, expected))  # nothing lost, nothing extra (duplicates allowed)
    assert run.stop() == 0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.alone
@pytest.mark.stops_kafka
def test_kafka_away_for_a_minute_daemon_waits_bounded_and_loses_nothing(run: Run, db: Database) -> None:
    """Kafka away for longer than one topic-creation request waits (found by CI: a table first written while the
    broker was away stopped cdcd after 60 s): the daemon waits with bounded memory, loses nothing, creates the
    new table's topic once Kafka is back, and confirms nothing Kafka did not acknowledge."""
    db.execute(SCHEMA)
    run.start()
    model = Model()
    stop_writing = threading.Event()

    def workload() -> None:
        i = 0
        while not stop_writing.is_set():
            txn = Txn(db.dsn(), model)
            txn.insert_many("items", 200_000 + i * 100, 50, f"o{i}-")
            txn.commit()
            i += 1
            time.sleep(0.02)

    writer = threading.Thread(target=workload)
    writer.start()
    try:
        run.wait_confirmed()  # some of the workload is in Kafka and confirmed before it goes
        subprocess.run([str(STACK), "down", "kafka"], check=True)
        down_lsn = parse_lsn(db.execute("SELECT pg_current_wal_insert_lsn()::text")[0][0])
        first_while_away = Txn(db.dsn(), model)  # a table without a topic yet
        first_while_away.insert_many("audit", 1, 20, "away-")
        first_while_away.commit()
        assert run.proc is not None
        rss = [rss_kib(run.proc.pid)]
        for _ in range(65):  # the database keeps committing
            time.sleep(1)
            run._check_alive()
            rss.append(rss_kib(run.proc.pid))
        confirmed_while_down = db.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", [run.slot]
        )[0][0]
    finally:
        stop_writing.set()
        writer.join()
        # beside the unit tests in make test, a loaded machine's broker can take longer than the stack's 90 s
        subprocess.run([str(STACK), "up", "kafka"], check=True, env={**os.environ, "KAFKA_START_TIMEOUT": "300"})
    run.reread()  # the verdict must not depend on this test's consumer surviving the broker restart
    assert max(rss) < 400 * 1024, f"memory grew while Kafka was away: {rss}"
    expected = expected_events(model)
    tables = ("items", "audit")

    def seen(events: list[Event]) -> dict[str, set[str]]:
        return {t: set(map(repr, observed(events, run.prefix, t))) for t in tables}

    want = {t: set(map(repr, expected[t])) for t in tables}
    run.consume_until(lambda ev: all(got >= want[t] for t, got in seen(ev).items()), 180)
    assert seen(run.events) == want
    # Nothing committed after Kafka went away (the audit row at least) was confirmed while it was away.
    first_after = min(
        e.value["source"]["commit_lsn"]
        for e in data_events(run.events, run.prefix)
        if e.value and e.value["source"]["commit_lsn"] >= down_lsn
    )
    assert parse_lsn(confirmed_while_down) <= first_after
    assert run.stop() == 0


@pytest.mark.alone
@pytest.mark.stops_kafka
@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_topics_asked_for_while_the_broker_stops_are_made_once_it_is_back(
    run: Run, db: Database, delivery: str
) -> None:
    """New tables while the broker shuts down (found by CI: a broker in controlled shutdown answers a topic's
    creation with INVALID_REPLICATION_FACTOR, "All brokers are currently fenced", and cdcd stopped): the creation
    is waited for like Kafka away, and each table's row arrives once the broker is back (read_committed): as it
    was inserted, and perhaps again as the incremental snapshot of the table newly captured reads it."""
    db.execute(SCHEMA)
    run.start(delivery=delivery, exactly_once={"commit_interval_ms": 30})
    made: list[str] = []
    making = threading.Event()
    done = threading.Event()

    def make_tables() -> None:  # each a topic to create: cdcd is asking for one while the broker goes
        while not done.is_set():
            if making.wait(0.1):
                name = f"fresh{len(made)}"
                db.execute(
                    f"CREATE TABLE {name} (id int PRIMARY KEY, v text); ALTER PUBLICATION cdcd_pub ADD TABLE {name};"
                    f" INSERT INTO {name} VALUES (1, '{name}')"
                )
                made.append(name)
                time.sleep(0.1)

    maker = threading.Thread(target=make_tables)
    maker.start()
    try:
        run.wait_confirmed()
        making.set()
        time.sleep(2)
        subprocess.run([str(STACK), "down", "kafka"], check=True)
        time.sleep(2)
        making.clear()
        run._check_alive()
    finally:
        done.set()
        maker.join()
        subprocess.run([str(STACK), "up", "kafka"], check=True, env={**os.environ, "KAFKA_START_TIMEOUT": "300"})
    run.reread()
    want = {f"{run.prefix}.public.{name}": [{"id": 1, "v": name}] for name in made}

    def rows(events: list[Event]) -> dict[str, list[dict[str, Any] | None]]:
        """Each topic's rows (once each: a snapshot's read may repeat the insert's)."""
        found = {topic: [e.value["after"] for e in events if e.topic == topic and e.value] for topic in want}
        return {
            topic: [json.loads(a) for a in dict.fromkeys(map(json.dumps, values))] for topic, values in found.items()
        }

    run.consume_until(lambda ev: all(rows(ev).values()), 240)
    assert rows(run.events) == want
    ops = {(e.topic, e.value["op"]) for e in run.events if e.topic in want and e.value}
    assert {topic for topic, op in ops if op == "c"} == set(want)  # each insert streamed
    assert {op for _, op in ops} <= {"c", "r"}
    assert run.stop() == 0


def test_alter_table_registers_a_new_schema_version_before_its_first_event(run: Run, db: Database) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text); CREATE PUBLICATION cdcd_pub FOR TABLE items")
    run.start()
    db.execute("INSERT INTO items VALUES (1, 'before')")
    db.execute("ALTER TABLE items ADD COLUMN added numeric(6,2)")
    db.execute("INSERT INTO items VALUES (2, 'after', 12.5)")
    db.execute("ALTER TABLE items DROP COLUMN v")
    db.execute("INSERT INTO items VALUES (3, 7.25)")
    topic = f"{run.prefix}.public.items"
    events = run.consume_until(lambda ev: sum(1 for e in ev if e.topic == topic) >= 3)
    afters = [e.value["after"] for e in events if e.topic == topic and e.value]
    assert afters == [
        {"id": 1, "v": "before"},
        {"id": 2, "v": "after", "added": decimal.Decimal("12.50")},
        {"id": 3, "added": decimal.Decimal("7.25")},
    ]
    registry = SchemaRegistryClient({"url": run.env["CDCD_SCHEMA_REGISTRY__URL"]})
    assert registry.get_versions(f"{topic}-value") == [1, 2, 3]
    assert run.stop() == 0


@pytest.mark.parametrize("whole", [{}, {"whole_transaction_changes": 1}], ids=["each", "whole"])
def test_a_delivery_error_stops_the_daemon_and_the_transaction_is_not_lost(
    run: Run, db: Database, whole: dict[str, Any]
) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text); CREATE PUBLICATION cdcd_pub FOR TABLE items")
    run.start(topic_config={"max.message.bytes": "2000"}, transaction_topic=False, **whole)
    db.execute("INSERT INTO items VALUES (1, 'fits')")
    # 32 kB of random hex: larger than the topic accepts even after lz4 compression
    db.execute("INSERT INTO items SELECT 2, string_agg(md5(random()::text), '') FROM generate_series(1, 1000)")
    assert run.proc is not None
    assert run.proc.wait(timeout=60) == 1
    log = run.log.read_text()
    assert "sink failed; stopping" in log
    assert f"delivery to {run.prefix}.public.items failed: Broker: Message size too large" in log
    # Let the topic take it and restart: the slot still holds the failed transaction.
    topic = f"{run.prefix}.public.items"
    admin = AdminClient({"bootstrap.servers": run.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"]})
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[ConfigEntry("max.message.bytes", "1048576", incremental_operation=AlterConfigOpType.SET)],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    run.start(topic_config={"max.message.bytes": "2000"}, transaction_topic=False, **whole)
    events = run.consume_until(lambda ev: any(e.value and e.value["after"]["id"] == 2 for e in ev if e.topic == topic))
    assert len(next(e.value["after"]["v"] for e in events if e.value and e.value["after"]["id"] == 2)) == 32_000
    assert run.stop() == 0


def test_replica_identity_full_is_keyed_by_the_primary_key(run: Run, db: Database) -> None:
    """Under REPLICA IDENTITY FULL pgoutput flags every column as identity; events are keyed by the primary key
    read from the catalog (a composite one here, declared in another order than the columns), in the initial
    snapshot and the stream: tombstones and key changes as for any keyed table. Without a primary key: no key."""
    db.execute(
        "CREATE TABLE f (a int, b text, v text, PRIMARY KEY (b, a)); ALTER TABLE f REPLICA IDENTITY FULL;"
        "CREATE TABLE g (v text); ALTER TABLE g REPLICA IDENTITY FULL;"
        "INSERT INTO f VALUES (1, 'x', 'snap'); INSERT INTO g VALUES ('snap');"
        "CREATE PUBLICATION cdcd_pub FOR TABLE f, g"
    )
    run.start()
    db.execute("INSERT INTO f VALUES (2, 'y', 'new'), (3, 'z', 'gone'); INSERT INTO g VALUES ('new')")
    db.execute("UPDATE f SET v = 'changed' WHERE a = 2; UPDATE g SET v = 'changed'")
    db.execute("UPDATE f SET a = 20 WHERE a = 1")  # a key change: delete + tombstone + create
    db.execute("DELETE FROM f WHERE a = 3; DELETE FROM g")
    events = run.sync()
    f = [
        (e.key, e.value and e.value["op"], e.value and (e.value["after"] or e.value["before"])["v"], e.moved)
        for e in events
        if e.topic == f"{run.prefix}.public.f"
    ]
    one, two, three, moved = {"a": 1, "b": "x"}, {"a": 2, "b": "y"}, {"a": 3, "b": "z"}, {"a": 20, "b": "x"}
    assert f == [
        (one, "r", "snap", {}),
        (two, "c", "new", {}),
        (three, "c", "gone", {}),
        (two, "u", "changed", {}),
        (one, "d", "snap", {"__debezium.newkey": moved}),
        (one, None, None, {}),
        (moved, "c", "snap", {"__debezium.oldkey": one}),
        (three, "d", "gone", {}),
        (three, None, None, {}),
    ]
    g = [(e.key, e.value and e.value["op"]) for e in events if e.topic == f"{run.prefix}.public.g"]
    assert g == [(None, "r"), (None, "c"), (None, "u"), (None, "u"), (None, "d"), (None, "d")]  # no tombstones
    assert run.stop() == 0


@pytest.mark.parametrize("encoding", ["LATIN1", "WIN1252"])
def test_text_of_a_database_in_another_encoding_arrives_as_written(
    pg15: PgServer, kafka_env: dict[str, str], tmp_path: Path, encoding: str
) -> None:
    """PostgreSQL converts text to the client encoding cdcd pins (UTF8) in COPY and in pgoutput alike: a LATIN1 or
    WIN1252 database's text arrives as written, in the initial snapshot, one-row transactions (the lane) and a
    large transaction (streamed and spilled: encoded as it arrives)."""
    words = ["café", "Ã©", "naïve", *(["€ 5"] if encoding == "WIN1252" else [])]  # the euro sign: WIN1252 only
    with scratch_database(pg15, encoding) as database:
        run = Run(database, kafka_env, tmp_path)
        try:
            database.execute(
                "CREATE TABLE items (id int PRIMARY KEY, v text); CREATE PUBLICATION cdcd_pub FOR TABLE items;"
                "INSERT INTO items VALUES (0, 'déjà')"
            )
            run.start()
            for i, word in enumerate(words, 1):
                database.execute("INSERT INTO items VALUES (%s, %s)", [i, word])
            database.execute("INSERT INTO items SELECT i, 'größe ' || i FROM generate_series(10, 5009) i")
            topic = f"{run.prefix}.public.items"
            events = run.consume_until(lambda ev: sum(1 for e in ev if e.topic == topic) >= 5004, 120)
            got = {e.value["after"]["id"]: e.value["after"]["v"] for e in events if e.topic == topic and e.value}
            assert got == {0: "déjà", **dict(enumerate(words, 1)), **{i: f"größe {i}" for i in range(10, 5010)}}
            assert run.stop() == 0
        finally:
            run.close()
