"""Exactly-once delivery (kafka.delivery: exactly_once) against the real broker: a mixed workload while cdcd is
killed with SIGKILL again and again; a read_committed consumer must find every committed change exactly once,
in commit order per key, while a read_uncommitted one shows that aborted Kafka transactions existed."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from tests.integration.conftest import STACK, Database, cdcd_env, close_bounded
from tests.integration.kafka_harness import Event, Run, read_partitions
from tests.integration.test_avroread import read_topics
from tests.integration.test_kafka import expected_events, observed
from tests.integration.test_snapshot import BIG, saved_queue, start_then_kill, topic, wait_log
from tests.integration.workload import Change, Model, Txn

SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, v text NOT NULL, n int);
CREATE TABLE audit (id int PRIMARY KEY, v text NOT NULL, n int);
ALTER TABLE audit REPLICA IDENTITY FULL;
CREATE TABLE trunc (id int PRIMARY KEY);
CREATE TABLE static (id int PRIMARY KEY, v text);
CREATE TABLE bulk (id int PRIMARY KEY);
CREATE PUBLICATION cdcd_pub FOR TABLE items, audit, trunc, static, bulk;
"""
BULK_ROWS = 200_000  # one PostgreSQL transaction, so one Kafka transaction open for about a second
STATIC_TOUCHED = range(1, 51)  # keys of `static` the workload updates while it is snapshotted
EXACTLY_ONCE: dict[str, Any] = {"delivery": "exactly_once", "exactly_once": {"commit_interval_ms": 30}}


class Workload:
    """Sequential transactions of every kind, each remembered once its COMMIT returned."""

    def __init__(self, db: Database) -> None:
        self.db, self.model = db, Model()
        self.truncates = 0
        self.trunc_keys: list[int] = []
        self.next_id = 1
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def _ids(self, count: int) -> list[int]:
        first, self.next_id = self.next_id, self.next_id + count
        return list(range(first, first + count))

    def run(self) -> None:
        try:
            i = 0
            while not self.stop.is_set():
                self.one(i)
                i += 1
                time.sleep(0.005)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def one(self, i: int) -> None:
        plain: list[Callable[[int], None]] = [self._plain] * 6
        kinds = [*plain, self._savepoints, self._rolled_back, self._truncate]
        if i % 12 == 5:
            self._streamed(i)
        else:
            kinds[i % len(kinds)](i)

    def _plain(self, i: int) -> None:
        txn = Txn(self.db.dsn(), self.model)
        for table in ("items", "audit"):
            for id_ in self._ids(2):
                txn.insert(table, id_, f"{table}-{id_}", i)
            alive = sorted(txn.rows[table])
            if len(alive) > 4:
                txn.update(table, alive[-3], f"u{i}")
                if i % 3 == 0:
                    txn.delete(table, alive[-4])
        if i % 7 == 0 and len(txn.rows["items"]) > 2:
            txn.update_key("items", sorted(txn.rows["items"])[-1], self._ids(1)[0])
        txn.commit()
        txn_static = i % len(STATIC_TOUCHED)
        self.db.execute("UPDATE static SET v = %s WHERE id = %s", [f"s{i}", STATIC_TOUCHED[txn_static]])

    def _savepoints(self, i: int) -> None:
        txn = Txn(self.db.dsn(), self.model)
        txn.insert("items", self._ids(1)[0], f"before-sp-{i}")
        txn.savepoint("a")
        txn.insert("items", self._ids(1)[0], f"rolled-back-{i}")
        txn.rollback_to("a")
        txn.insert("audit", self._ids(1)[0], f"after-sp-{i}")
        txn.commit()

    def _rolled_back(self, i: int) -> None:
        txn = Txn(self.db.dsn(), self.model)
        txn.insert("items", self._ids(1)[0], f"never-{i}")
        txn.rollback()

    def _streamed(self, i: int) -> None:
        """Larger than the walsender's logical_decoding_work_mem (64kB): streamed, with a rolled-back savepoint."""
        txn = Txn(self.db.dsn(), self.model)
        txn.insert_many("items", self._ids(600)[0], 600, f"big{i}-")
        txn.savepoint("s")
        txn.insert_many("audit", self._ids(300)[0], 300, f"gone{i}-")
        txn.rollback_to("s")
        txn.insert_many("audit", self._ids(300)[0], 300, f"kept{i}-")
        txn.commit()

    def _truncate(self, i: int) -> None:
        key = self._ids(1)[0]
        self.db.execute("INSERT INTO trunc VALUES (%s)", [key])
        self.trunc_keys.append(key)
        if i % 2 == 0:
            self.db.execute("TRUNCATE trunc")
            self.truncates += 1


def request_snapshot(run: Run, table: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cdcd", "snapshot", "--config", str(run.tmp_path / "run.yaml"), "--table", table],
        env=cdcd_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def key_of(change: Change) -> str:
    before, after = change[2], change[3]
    return (after or before or {})["id"]


def per_key(changes: list[Change]) -> dict[tuple[str, str], list[Change]]:
    out: dict[tuple[str, str], list[Change]] = defaultdict(list)
    for change in changes:
        out[change[1], key_of(change)].append(change)
    return out


def data(events: list[Event], run: Run, table: str) -> list[Event]:
    return [e for e in events if e.topic == f"{run.prefix}.public.{table}"]


def kill_inside_an_open_kafka_transaction(run: Run) -> int:
    """Commit a big transaction and SIGKILL cdcd once the broker holds some of its records but not the commit
    marker, so an aborted Kafka transaction with records surely exists (the random kills may all fall between
    short transactions). Returns how many big transactions it took (each is committed in PostgreSQL)."""
    topic = TopicPartition(f"{run.prefix}.public.bulk", 0)
    consumer = Consumer(  # read_uncommitted: its high watermark is the log end, not the last stable offset
        {
            "bootstrap.servers": run.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"],
            "group.id": "bulk-watch",
            "isolation.level": "read_uncommitted",
        }
    )
    try:
        for attempt in range(1, 4):
            first = (attempt - 1) * BULK_ROWS + 1
            run.db.execute(f"INSERT INTO bulk SELECT generate_series({first}, {first + BULK_ROWS - 1})")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    high = consumer.get_watermark_offsets(topic, timeout=5, cached=False)[1]
                except KafkaException:  # the topic is made with its first event
                    high = 0
                if 0 < high - (attempt - 1) * (BULK_ROWS + 1) < BULK_ROWS:  # under way, not committed
                    assert run.stop(signal.SIGKILL) == -signal.SIGKILL
                    return attempt
                if high - (attempt - 1) * (BULK_ROWS + 1) > BULK_ROWS:
                    break  # committed before it was seen open: once more
                time.sleep(0.01)
            else:
                raise AssertionError("the big transaction never reached Kafka")
    finally:
        close_bounded(consumer)
    raise AssertionError("three big transactions each committed before they were seen open")


KILL_ROUNDS = 14  # the incremental snapshot is requested at round 4, the kill inside a Kafka transaction is round 8


def test_sigkill_at_random_points_every_committed_change_exactly_once(run15: Run, avroread: Path) -> None:
    run, db = run15, run15.db
    db.execute(SCHEMA)
    run.start(**EXACTLY_ONCE, tombstones_on_delete=True)
    db.execute("INSERT INTO static SELECT i, 'row ' || i FROM generate_series(1, 3000) i")  # after the initial one
    workload = Workload(db)
    writer = threading.Thread(target=workload.run)
    writer.start()
    rng = random.Random(20261124)
    kills = bulk_inserts = 0
    try:
        for round_ in range(KILL_ROUNDS):
            if round_ == 4:
                request_snapshot(run, "public.static")
            if round_ == 8:
                bulk_inserts = kill_inside_an_open_kafka_transaction(run)
            else:
                time.sleep(rng.uniform(0.2, 1.5))
                assert run.stop(signal.SIGKILL) == -signal.SIGKILL
            kills += 1
            run.start(**EXACTLY_ONCE, tombstones_on_delete=True)
    finally:
        workload.stop.set()
        writer.join()
    assert workload.error is None, workload.error
    run.wait_confirmed(180)
    committed = run.read_to_end("read_committed")

    # every committed row change exactly once, in commit order per key
    expected = expected_events(workload.model)
    for table in ("items", "audit"):
        seen = observed(committed, run.prefix, table)
        assert per_key(seen) == per_key(expected[table]), table
    for table in ("items", "audit"):  # tombstones (audit: REPLICA IDENTITY FULL, keyed by its primary key)
        deletes = sum(1 for change in expected[table] if change[0] == "d")
        assert sum(1 for e in data(committed, run, table) if e.value is None) == deletes, table
    trunc = data(committed, run, "trunc")
    assert sorted(e.value["after"]["id"] for e in trunc if e.value and e.value["op"] == "c") == workload.trunc_keys
    assert sum(1 for e in trunc if e.value and e.value["op"] == "t") == workload.truncates

    # the big transactions, one of them interrupted in the middle of its Kafka transaction: each row once
    bulk = Counter(_after(e)["id"] for e in data(committed, run, "bulk") if _op(e) == "c")
    assert (len(bulk), max(bulk.values())) == (BULK_ROWS * bulk_inserts, 1)

    # the incremental snapshot (the initial one found the tables empty): each row at most once, every row nothing
    # changed during it exactly once
    snapshot_rows = Counter(_after(e)["id"] for e in data(committed, run, "static") if _op(e) == "r")
    assert max(snapshot_rows.values()) == 1
    assert set(snapshot_rows) >= set(range(STATIC_TOUCHED[-1] + 1, 3001))

    # BEGIN and END of each transaction once
    marks = Counter((_value(e)["status"], _value(e)["id"]) for e in committed if e.topic == f"{run.prefix}.transaction")
    assert marks
    assert max(marks.values()) == 1

    # the kills left aborted Kafka transactions behind: only read_uncommitted sees their records
    uncommitted = read_partitions(run.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"], run.prefix, "read_uncommitted")
    assert len(uncommitted) > len(committed), "no aborted data: the test did not exercise Kafka transactions"

    # the Go reader (franz-go, read_committed) sees exactly what the read_committed consumer saw
    read = read_topics(avroread, run.env, "-regex", f"{run.prefix}\\..*")
    assert read.returncode == 0, read.stderr
    lines = [json.loads(line) for line in read.stdout.splitlines()]
    assert sorted((x["topic"], x["partition"], x["offset"]) for x in lines) == sorted(
        (e.topic, e.partition, e.offset) for e in committed
    )
    assert run.stop() == 0
    assert kills == KILL_ROUNDS


def _op(event: Event) -> Any:
    return None if event.value is None else event.value["op"]


def _value(event: Event) -> dict[str, Any]:
    assert event.value is not None
    return event.value


def _after(event: Event) -> dict[str, Any]:
    after: dict[str, Any] = _value(event)["after"]
    return after


# stopped: a controlled shutdown (TERM); crashed: TERM and KILL at once, so the broker recovers its logs when it
# comes back and answers before every partition has a leader again.
@pytest.mark.alone
@pytest.mark.stops_kafka
@pytest.mark.parametrize("stop_timeout", ["60", "0"], ids=["stopped", "crashed"])
def test_kafka_away_for_30s_inside_a_kafka_transaction_still_exactly_once(run15: Run, stop_timeout: str) -> None:
    run, db = run15, run15.db
    db.execute(SCHEMA)
    run.start(**EXACTLY_ONCE)
    workload = Workload(db)
    writer = threading.Thread(target=workload.run)
    writer.start()
    try:
        run.wait_confirmed()  # a Kafka transaction committed; the workload goes on in the next
        subprocess.run([str(STACK), "down", "kafka"], check=True, env={**os.environ, "STOP_TIMEOUT": stop_timeout})
        for _ in range(30):
            time.sleep(1)
            run._check_alive()
    finally:
        workload.stop.set()
        writer.join()
        # a loaded CI machine's broker can take longer than the stack's 90 s to recover its logs
        subprocess.run([str(STACK), "up", "kafka"], check=True, env={**os.environ, "KAFKA_START_TIMEOUT": "300"})
    assert workload.error is None, workload.error
    run.wait_confirmed(240)
    committed = run.read_to_end("read_committed")
    expected = expected_events(workload.model)
    for table in ("items", "audit"):
        assert per_key(observed(committed, run.prefix, table)) == per_key(expected[table]), table
    assert run.stop() == 0


def test_a_second_instance_fences_the_first_whose_open_transaction_is_never_seen(run15: Run) -> None:
    run, db = run15, run15.db
    db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION cdcd_pub FOR TABLE t")
    # The first instance keeps its Kafka transaction open (it would commit after 10 minutes). Once it finds the slot
    # held by the second, it retries for reconnect.slot_active_wait_s, then stops.
    patient = {"reconnect": {"initial_backoff_s": 0.2, "max_backoff_s": 1, "slot_active_wait_s": 5}}
    run.start(patient, delivery="exactly_once", exactly_once={"commit_interval_ms": 600_000, "max_messages": 10**9})
    first = run.proc
    assert first is not None
    db.execute("INSERT INTO t SELECT generate_series(1, 10)")
    wait_for(lambda: len(data(run.read_to_end("read_uncommitted"), run, "t")) >= 10, "the first never produced")
    first.send_signal(signal.SIGSTOP)  # a paused process: its session to PostgreSQL is ended under it
    try:
        db.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s", [run.slot])
        active = "SELECT active FROM pg_replication_slots WHERE slot_name = %s"
        wait_for(lambda: not db.execute(active, [run.slot])[0][0], "the first's walsender never ended")
        run.start(**EXACTLY_ONCE)  # the second: same slot, same transactional.id
        db.execute("INSERT INTO t SELECT generate_series(11, 20)")
        run.wait_confirmed()
    finally:
        first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=60) == 1
    log = run.log.read_text()
    # It stops when it finds the slot still taken (or, had it written to Kafka first, as fenced); either way its open
    # Kafka transaction was aborted by the second's fencing, which librdkafka reports.
    assert "This instance has been fenced by a newer instance" in log
    assert "slot 's_" in log or "took over (fenced)" in log
    assert "Traceback" not in log
    committed = Counter(_after(e)["id"] for e in data(run.read_to_end(), run, "t") if _op(e) == "c")
    assert committed == Counter(range(1, 21))
    assert run.stop() == 0


def test_a_missing_progress_topic_for_an_existing_slot_stops_cdcd_at_start(run15: Run) -> None:
    run, db = run15, run15.db
    db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION cdcd_pub FOR TABLE t")
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [run.slot])
    with pytest.raises(AssertionError, match="cdcd run exited 1"):
        run.start(delivery="exactly_once", exactly_once={"progress_topic": f"missing-{run.prefix}"})
    assert f"progress topic missing-{run.prefix} does not exist, but slot {run.slot} does" in run.log.read_text()


def wait_for(condition: Callable[[], bool], what: str = "condition", timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_kill_9_during_an_exactly_once_parallel_initial_snapshot_leaves_each_row_once(run15: Run) -> None:
    """Exactly-once with two connections: a key range's progress is saved once the Kafka transaction holding its
    rows committed, so after kill -9 the unfinished ranges go on from keys whose rows a read_committed consumer
    has, and it finds every row of the table exactly once (the rows of the aborted transaction it never sees)."""
    run, db = run15, run15.db
    rows = 150_000
    db.execute(BIG.replace("ROWS", str(rows)) + "ANALYZE big; CREATE PUBLICATION cdcd_pub FOR TABLE big")
    config = {"snapshot": {"state_dir": str(run.tmp_path / "state"), "chunk_size": 500, "parallelism": 2}}
    kafka: dict[str, Any] = {"delivery": "exactly_once", "exactly_once": {"commit_interval_ms": 30}}

    def ranges_saved() -> bool:
        return any(p["last_key"] for p in saved_queue(run))

    start_then_kill(run, config, ranges_saved, "no progress of the snapshot's key ranges was ever saved", **kafka)
    assert saved_queue(run), "the snapshot finished before it could be killed"
    run.start(extra=config, **kafka)
    wait_log(run, "table snapshot finished", timeout=300)
    run.wait_confirmed(300)
    committed = [e.value for e in run.read_to_end("read_committed", timeout=300) if e.topic == topic(run)]
    counts = Counter(v["after"]["id"] for v in committed if v and v["op"] == "r")
    assert sorted(counts) == list(range(1, rows + 1))  # nothing lost
    assert [k for k, n in counts.items() if n > 1] == []  # nothing twice
