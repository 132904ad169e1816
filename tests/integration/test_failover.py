"""A primary failover under load (PostgreSQL 17+): the stack's pg-ha pair, a failover slot synced to the standby,
the primary stopped hard and the standby promoted mid-stream. cdcd follows through a multi-host DSN and goes on:
the tables rebuilt from Kafka equal the new primary's. Without synchronized_standby_slots, cdcd publishes changes
the standby never got: the test finds them, and cdcd stops instead of going on from a history that forked."""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.conftest import STACK, VERSIONS, Database, PgServer, stack_env
from tests.integration.kafka_harness import Event, Run
from tests.integration.test_check import run_cdcd
from tests.integration.workload import SCHEMA

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("pg-ha")]  # one worker: see conftest.py

HA_VERSIONS = [v for v in VERSIONS if int(v) >= 17]
SEED_ROWS = 200  # in the tables before cdcd starts: its initial snapshot, which must not be taken again
BIG_ROWS = 600  # a transaction this large is streamed (logical_decoding_work_mem=64kB in cdcd's DSN)


class Pair:
    """The stack's pg-ha primary + standby of one major; ``ctl`` runs pg_ctl on one of them."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.ports = {"primary": 5500 + int(version), "standby": 5600 + int(version)}
        hosts = ",".join(["127.0.0.1"] * 2)
        ports = ",".join(str(p) for p in self.ports.values())
        dsn = f"host={hosts} port={ports} user=postgres password=postgres target_session_attrs=read-write"
        env = {**stack_env(version), "CDCD_SOURCE__DSN": dsn}
        self.db = Database(PgServer(int(version), env), f"t_{uuid.uuid4().hex[:10]}")  # Kafka topics: unique names

    def stack(self, *args: str) -> None:
        subprocess.run([str(STACK), *args], check=True, env={**os.environ, "PG_VERSION": self.version})

    def ctl(self, role: str, *args: str) -> None:
        self.stack("ha-ctl", role, *args)

    def sql(self, role: str, query: str, params: Any = None, dbname: str = "") -> list[tuple[Any, ...]]:
        dsn = f"host=127.0.0.1 port={self.ports[role]} dbname={dbname or self.db.name} user=postgres password=postgres"
        with psycopg.connect(dsn, autocommit=True) as conn:
            cursor = conn.execute(query, params)
            return cursor.fetchall() if cursor.description else []


def fresh_pair(version: str) -> Iterator[Pair]:
    """The body of a ``pair`` fixture: a fresh pair (an earlier test may have promoted its standby) with the
    test's database, stopped afterwards."""
    p = Pair(version)
    p.stack("reset", "pg-ha")
    p.stack("up", "pg-ha")
    p.sql("primary", f"CREATE DATABASE {p.db.name}", dbname="postgres")
    yield p
    p.stack("down", "pg-ha")


@pytest.fixture(params=HA_VERSIONS, ids=lambda v: f"pg{v}")
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    yield from fresh_pair(str(request.param))


@pytest.fixture
def ha_run(pair: Pair, kafka_env: dict[str, str], tmp_path: Path) -> Iterator[Run]:
    pair.db.execute(SCHEMA)
    pair.db.execute("INSERT INTO items SELECT i, 'seed', i FROM generate_series(1, %s) i", [SEED_ROWS])
    r = Run(pair.db, kafka_env, tmp_path)
    yield r
    r.close()


class Workload(threading.Thread):
    """Plain transactions (insert, update, delete) and every tenth a streamed one, through the multi-host DSN:
    a lost connection is retried, so it goes on against whichever server is primary."""

    def __init__(self, db: Database) -> None:
        super().__init__(daemon=True)
        self.db, self.stop = db, threading.Event()
        self.committed = 0
        self.next_id = SEED_ROWS + 1
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(19)
        deadline = time.monotonic() + 300
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                with psycopg.connect(self.db.dsn(), connect_timeout=2) as conn:
                    while not self.stop.is_set():
                        self._transaction(conn, rng)
                        self.committed += 1
                        time.sleep(0.05)
            except psycopg.OperationalError:
                time.sleep(0.2)  # the primary is gone: the next connect finds the promoted standby
            except BaseException as exc:
                self.error = exc
                return

    def _transaction(self, conn: psycopg.Connection[Any], rng: random.Random) -> None:
        big = self.committed % 10 == 9
        count = BIG_ROWS if big else 5
        first, self.next_id = self.next_id, self.next_id + count
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(
                "INSERT INTO items SELECT i, 'w', i FROM generate_series(%s::int, %s::int) i",
                [first, first + count - 1],
            )
            cur.execute("UPDATE items SET v = v || 'u', n = n + 1 WHERE id = %s", [rng.randrange(1, first)])
            cur.execute("DELETE FROM items WHERE id = %s", [rng.randrange(1, first)])
            cur.execute(
                "INSERT INTO audit VALUES (%s, 'a', 0) ON CONFLICT (id) DO UPDATE SET n = audit.n + 1",
                [rng.randrange(1, 50)],
            )


def failover_warnings(pair: Pair, run: Run) -> list[str]:
    """What `cdcd check` warns about the slot's failover readiness."""
    config = {
        "source": {"dsn": pair.db.dsn(), "slot": run.slot, "publications": [{"name": "cdcd_pub"}]},
        "sink": {"kind": "jsonl"},  # else check warns that `cdcd run` needs one
    }
    result = run_cdcd("check", config=config, tmp_path=run.tmp_path)
    return [line for line in result.stderr.splitlines() if "warning" in line]


def rebuild(events: list[Event], topic: str) -> dict[int, tuple[Any, ...]]:
    rows: dict[int, tuple[Any, ...]] = {}
    for e in events:
        if e.topic != topic or e.value is None:
            continue
        if e.value["op"] == "d":
            rows.pop(e.value["before"]["id"], None)
        else:
            after = e.value["after"]
            rows[after["id"]] = (after["v"], after["n"])
    return rows


def table(db: Database, name: str) -> dict[int, tuple[Any, ...]]:
    return {r[0]: (r[1], r[2]) for r in db.execute(f"SELECT id, v, n FROM {name}")}


def duplicates(events: list[Event]) -> int:
    """Events Kafka holds twice (the same change of the same transaction): at-least-once delivery's cost."""
    seen = Counter(
        (e.topic, str(e.key), e.value["source"]["lsn"], e.value["op"]) for e in events if e.value and e.value.get("op")
    )
    return sum(n - 1 for n in seen.values())


def wait(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() < started + timeout, f"timed out waiting for {what}"
        time.sleep(0.1)
    print(f"waited {time.monotonic() - started:.1f}s for {what}")


def streamed(pair: Pair, role: str, slot: str) -> bool:
    """Whether the server streamed in-progress transactions to cdcd on this slot (since it became primary)."""
    query = "SELECT stream_txns > 0 FROM pg_stat_replication_slots WHERE slot_name = %s"
    return pair.sql(role, query, [slot]) == [(True,)]


def slot_synced(pair: Pair, slot: str) -> bool:
    rows = pair.sql("standby", "SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = %s", [slot])
    return bool(rows and rows[0][0])


def test_failover_mid_stream_loses_nothing(pair: Pair, ha_run: Run) -> None:
    run = ha_run
    run.start(source={"reconnect": {"initial_backoff_s": 0.2, "max_backoff_s": 1}})
    wait(lambda: slot_synced(pair, run.slot), "the standby to sync the failover slot")
    workload = Workload(pair.db)
    workload.start()
    wait(lambda: workload.committed >= 30, "the workload")
    assert pair.sql("primary", "SELECT failover FROM pg_replication_slots WHERE slot_name = %s", [run.slot]) == [
        (True,)
    ]
    assert failover_warnings(pair, run) == []
    wait(lambda: streamed(pair, "primary", run.slot), "a transaction streamed before the failover", timeout=30)
    before = workload.committed

    pair.ctl("primary", "stop", "-m", "immediate")
    pair.ctl("standby", "promote", "-w")
    wait(lambda: workload.committed >= before + 30, "the workload on the promoted standby", timeout=120)
    workload.stop.set()
    workload.join(timeout=30)
    assert workload.error is None, workload.error
    events = run.sync(timeout=120)

    log = run.log.read_text()
    assert "the server was promoted; going on from cdcd's own position" in log, log[-3000:]
    wait(lambda: streamed(pair, "standby", run.slot), "a transaction streamed after the failover", timeout=30)
    for name in ("items", "audit"):
        assert rebuild(events, f"{run.prefix}.public.{name}") == table(pair.db, name), f"{name} differs"
    snapshot_rows = sum(1 for e in events if e.topic.endswith(".items") and e.value and e.value["op"] == "r")
    assert snapshot_rows == SEED_ROWS, "a new snapshot was taken after the failover"
    assert log.count('"slot_created": true') == 1
    print(
        f"\npg{pair.version} failover: {workload.committed} transactions, {len(events)} events, "
        f"{duplicates(events)} duplicates"
    )
    assert run.stop() == 0


def test_without_synchronized_standby_slots_published_changes_are_lost(pair: Pair, ha_run: Run) -> None:
    run = ha_run
    pair.sql("primary", "ALTER SYSTEM SET synchronized_standby_slots = ''")
    pair.sql("primary", "SELECT pg_reload_conf()")
    time.sleep(0.5)  # the reload is asynchronous
    assert any("synchronized_standby_slots is empty" in w for w in failover_warnings(pair, run))
    run.start(source={"reconnect": {"initial_backoff_s": 0.2, "max_backoff_s": 1}})
    pair.db.execute("INSERT INTO items VALUES (100001, 'kept', 1)")
    run.sync()
    wait(lambda: slot_synced(pair, run.slot), "the standby to sync the failover slot")

    pair.ctl("standby", "stop", "-m", "fast")
    lost = set(range(200001, 200021))
    for i in lost:
        pair.db.execute("INSERT INTO items VALUES (%s, 'lost', 0)", [i])
    topic = f"{run.prefix}.public.items"
    run.consume_until(lambda events: lost <= {e.key["id"] for e in events if e.topic == topic and e.key})
    pair.ctl("primary", "stop", "-m", "immediate")
    pair.ctl("standby", "start", "-w")
    pair.ctl("standby", "promote", "-w")

    assert run.proc is not None
    code = run.proc.wait(timeout=60)
    log = run.log.read_text()
    assert code == 1, log[-3000:]
    assert "are not on the new primary" in log
    published_but_lost = set(rebuild(run.events, topic)) - set(table(pair.db, "items"))
    assert published_but_lost == lost
