"""The lifecycle nemesis, in the shape of the fault nemesis: a workload that changes the tables themselves while
snapshots run and cdcd is killed and restarted, then a checker that reads the topics back.

cdcd captures ``app\\..*`` through a managed publication (new matches added every 0.5 s, each snapshotted). A seeded
schedule creates tables (with rows written before cdcd adds them to the publication), writes rows, renames tables,
drops them (queued for a snapshot or not), moves tables with rows into the schema and out of it (``SET SCHEMA``),
adds and drops columns, asks for incremental snapshots (``cdcd snapshot``), and sends cdcd SIGKILL or SIGTERM and
starts it again. Then the faults stop, cdcd settles (its snapshot queue empty, everything confirmed), and:

* every table in ``app`` rebuilt from Kafka (the topics of each name it had, in order: a rename starts a new topic,
  and a name is never used twice) equals PostgreSQL's, column for column;
* cdcd never exited unless it was told to (a crash loop would show as exits at every start).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import psycopg
import pytest

from tests.integration.conftest import Database, cdcd_env
from tests.integration.kafka_harness import Event, Run

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("LIFECYCLE_SEED", "44"))  # the schedule; another seed: another run
STEPS = 150
ROWS = 60  # each new table's rows (a few chunks of 25)
OPS = {
    "write": 40,
    "create": 8,
    "rename": 8,
    "drop": 6,
    "move_in": 8,
    "move_out": 3,
    "add_column": 6,
    "drop_column": 4,
    "snapshot": 6,
    "attach": 5,
    "detach": 3,
    "kill": 3,
    "term": 2,
}
PART_SPAN = 1000  # each attached partition holds ids [n * PART_SPAN, (n + 1) * PART_SPAN): never used twice


@dataclass
class Table:
    """A table of the workload: the names it had in ``app`` (its topics, in order) and its extra columns."""

    names: list[str]
    columns: list[str] = field(default_factory=list)
    # a partitioned table (published as its root): its attached partitions, and those detached since (in schema
    # side, untouched after: their rows stay in the root's topic, as PostgreSQL writes no change for them)
    partitions: list[str] | None = None
    detached: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.names[-1]


@dataclass
class Lifecycle:
    db: Database
    run: Run
    rng: random.Random
    tables: list[Table] = field(default_factory=list)
    serial: int = 0
    exits: list[int] = field(default_factory=list)  # exit codes of cdcd runs nobody stopped
    done: list[str] = field(default_factory=list)  # the operations carried out, for a failure's message

    def fresh(self, schema: str = "app") -> str:
        self.serial += 1
        return f"{schema}.t{self.serial}"

    def sql(self, statement: str) -> None:
        with psycopg.connect(self.db.dsn(), autocommit=True) as conn:
            conn.execute(statement)

    def create(self, schema: str = "app") -> Table:
        name = self.fresh(schema)
        self.sql(
            f"CREATE TABLE {name} (id int PRIMARY KEY, v int NOT NULL);"
            f" INSERT INTO {name} SELECT g, g FROM generate_series(1, {ROWS}) g"
        )
        return Table([name])

    def create_partitioned(self) -> Table:
        name = self.fresh()
        self.sql(
            f"CREATE TABLE {name} (id int PRIMARY KEY, v int NOT NULL) PARTITION BY RANGE (id);"
            f" CREATE TABLE {self.fresh('side')} PARTITION OF {name} DEFAULT;"
            f" INSERT INTO {name} SELECT g, g FROM generate_series(1, {ROWS}) g"
        )
        return Table([name], partitions=[])

    def step(self, op: str) -> None:
        live = [t for t in self.tables if t.name.startswith("app.")]
        if op not in ("create", "move_in", "kill", "term") and not live:
            op = "create"
        table = self.rng.choice(live) if live else None
        getattr(self, f"_{op}")(table)
        self.done.append(op if table is None else f"{op} {table.name}")

    def _create(self, table: Table | None) -> None:
        self.tables.append(self.create())

    def _write(self, table: Table | None) -> None:
        assert table is not None
        key = self.rng.randint(1, ROWS + 20)
        kind = self.rng.choice(["upsert", "upsert", "delete"])
        if kind == "delete":
            self.sql(f"DELETE FROM {table.name} WHERE id = {key}")
        else:
            value = self.rng.randint(0, 10**6)
            self.sql(
                f"INSERT INTO {table.name} (id, v) VALUES ({key}, {value})"
                f" ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v"
            )

    def _attach(self, table: Table | None) -> None:
        """A table with rows attached as a partition: ATTACH writes no change for them (cdcd's snapshot of the
        partition through its root brings them). Without a partitioned table in app, one is made."""
        root = next((t for t in self.tables if t.partitions is not None and t.name.startswith("app.")), None)
        if root is None:
            self.tables.append(self.create_partitioned())
            return
        part, low = self.fresh("side"), (self.serial + 1) * PART_SPAN
        self.sql(
            f"CREATE TABLE {part} (LIKE {root.name}); INSERT INTO {part} (id, v)"
            f" SELECT g, g FROM generate_series({low}, {low + ROWS - 1}) g;"
            f" ALTER TABLE {root.name} ATTACH PARTITION {part} FOR VALUES FROM ({low}) TO ({low + PART_SPAN})"
        )
        assert root.partitions is not None
        root.partitions.append(part)

    def _detach(self, table: Table | None) -> None:
        root = next((t for t in self.tables if t.partitions and t.name.startswith("app.")), None)
        if root is None or not root.partitions:
            return
        part = root.partitions.pop(self.rng.randrange(len(root.partitions)))
        self.arrived(root, part)
        self.sql(f"ALTER TABLE {root.name} DETACH PARTITION {part}")
        root.detached.append(part)

    def arrived(self, root: Table, part: str, timeout: float = 90) -> None:
        """Until the rows of ``part`` (attached) are in ``root``'s topics: once detached, they are in no table
        PostgreSQL publishes, and what the checker expects of the root's topic is what arrived of them by then."""
        ids = {r[0] for r in self.db.execute(f"SELECT id FROM {part}")}
        topics = {f"{self.run.prefix}.{name}" for name in root.names}

        def seen(events: list[Event]) -> bool:
            return ids <= {e.value["after"]["id"] for e in events if e.topic in topics and e.value and e.value["after"]}

        deadline = time.monotonic() + timeout
        while not seen(self.run.events):
            self.alive()
            assert time.monotonic() < deadline, f"the rows of partition {part} never arrived: {self.done}"
            self.run.consume_until(partial(_seen_or_past, seen, time.monotonic() + 0.5), 5)

    def _rename(self, table: Table | None) -> None:
        assert table is not None
        new = self.fresh()
        self.sql(f"ALTER TABLE {table.name} RENAME TO {new.split('.')[1]}")
        table.names.append(new)

    def _drop(self, table: Table | None) -> None:
        assert table is not None
        self.sql(f"DROP TABLE {table.name}")
        self.tables.remove(table)

    def _move_in(self, table: Table | None) -> None:
        moved = self.create("side")
        self.sql(f"ALTER TABLE {moved.name} SET SCHEMA app")
        moved.names = [moved.name.replace("side.", "app.")]
        self.tables.append(moved)

    def _move_out(self, table: Table | None) -> None:
        assert table is not None
        self.sql(f"ALTER TABLE {table.name} SET SCHEMA side")
        self.tables.remove(table)

    def _add_column(self, table: Table | None) -> None:
        assert table is not None
        column = f"c{self.serial}"
        self.serial += 1
        self.sql(f"ALTER TABLE {table.name} ADD COLUMN {column} int")
        self.sql(f"UPDATE {table.name} SET {column} = id WHERE id % 3 = 0")
        table.columns.append(column)

    def _drop_column(self, table: Table | None) -> None:
        assert table is not None
        if table.columns:
            self.sql(f"ALTER TABLE {table.name} DROP COLUMN {table.columns.pop(0)}")

    def _snapshot(self, table: Table | None) -> None:
        assert table is not None
        argv = [sys.executable, "-m", "cdcd", "snapshot", "--config", str(self.run.tmp_path / "run.yaml")]
        subprocess.run([*argv, "--table", table.name], env=cdcd_env(), capture_output=True, timeout=60, check=False)

    def _kill(self, table: Table | None) -> None:
        self._restart(signal.SIGKILL)

    def _term(self, table: Table | None) -> None:
        self._restart(signal.SIGTERM)

    def _restart(self, sig: int) -> None:
        self.alive()
        code = self.run.stop(sig)
        if sig == signal.SIGTERM and code != 0:
            self.exits.append(code)
        self.start()

    def start(self) -> None:
        self.run.start(
            source={
                "publications": [
                    {"name": "cdcd_pub", "include_tables": [r"app\..*"], "publish_via_partition_root": True}
                ],
                "manage_publications": True,
                "table_check_interval_s": 0.5,
            },
            extra={"snapshot": {"state_dir": str(self.run.tmp_path / "state"), "chunk_size": 25}},
        )

    def alive(self) -> None:
        """Count an exit nobody asked for, and start cdcd again (what a supervisor would do)."""
        assert self.run.proc is not None
        code = self.run.proc.poll()
        if code is not None:
            self.exits.append(code)
            self.start()

    def settle(self, timeout: float = 180) -> None:
        """Until the snapshot queue is empty and cdcd has confirmed everything written so far."""
        path = self.run.tmp_path / "state" / f"{self.run.slot}.snapshot.json"
        deadline = time.monotonic() + timeout
        time.sleep(2)  # past a table check: the last tables made are in the publication
        while True:
            self.alive()
            state = json.loads(path.read_text()) if path.exists() else {"queue": [None]}
            if not state.get("queue"):
                break
            assert time.monotonic() < deadline, f"snapshots never finished: {state.get('queue')}"
            time.sleep(0.5)


def _seen_or_past(seen: Callable[[list[Event]], bool], until: float, events: list[Event]) -> bool:
    return seen(events) or time.monotonic() > until


def _rebuilt(events: list[Event], prefix: str, table: Table) -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    for name in table.names:
        for e in events:
            if e.topic != f"{prefix}.{name}" or e.value is None:
                continue
            if e.value["op"] == "d":
                rows.pop(e.value["before"]["id"], None)
            else:
                rows[e.value["after"]["id"]] = e.value["after"]
    return rows


def _current(db: Database, table: Table) -> dict[int, dict[str, Any]]:
    """The table's rows in PostgreSQL, with those of its partitions detached since (what its topic keeps)."""
    columns = ["id", "v", *table.columns]
    rows: dict[int, dict[str, Any]] = {}
    for name in [table.name, *table.detached]:  # a detached one lacks the columns added to the root since
        schema, relname = name.split(".")
        query = "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s"
        present = {r[0] for r in db.execute(query, [schema, relname])}
        selected = [c if c in present else f"NULL AS {c}" for c in columns]
        found = db.execute(f"SELECT {', '.join(selected)} FROM {name}")
        rows.update({r[0]: dict(zip(columns, r, strict=True)) for r in found})
    return rows


@pytest.fixture
def lifecycle(db: Database, run: Run) -> Lifecycle:
    db.execute("CREATE SCHEMA app; CREATE SCHEMA side")
    return Lifecycle(db, run, random.Random(SEED))


def test_tables_made_renamed_moved_and_dropped_under_snapshots_and_kills_arrive_whole(lifecycle: Lifecycle) -> None:
    life, run = lifecycle, lifecycle.run
    life.tables = [life.create() for _ in range(3)]  # captured at the first start: the initial snapshot
    life.tables.append(life.create_partitioned())
    life.start()
    ops, weights = list(OPS), list(OPS.values())
    for _ in range(STEPS):
        life.alive()
        life.step(life.rng.choices(ops, weights)[0])
        time.sleep(life.rng.uniform(0, 0.1))
    life.settle()
    events = run.sync(timeout=180)
    live = [t for t in life.tables if t.name.startswith("app.")]
    differ = {}
    for t in live:
        current, columns = _current(life.db, t), ["id", "v", *t.columns]
        rebuilt = {k: {c: r.get(c) for c in columns} for k, r in _rebuilt(events, run.prefix, t).items()}
        if rebuilt != current:
            differ[t.name] = (len(rebuilt), len(current))
    assert not differ, f"tables rebuilt from Kafka differ (rows in Kafka, in PostgreSQL): {differ}\n{life.done}"
    assert life.exits == [], f"cdcd exited unasked {life.exits}:\n{run.log.read_text()[-5000:]}"
    assert len(live) >= 3, life.done
    assert run.stop() == 0
