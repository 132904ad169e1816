"""A nemesis run in Jepsen's shape: a workload, a seeded schedule of faults, a checker that reads the topics back.

``Nemesis.run`` starts `cdcd run` with its PostgreSQL and schema registry links through Toxiproxy proxies of its
own, and while a mixed workload writes (one-row transactions, updates of rows with an unchanged TOAST value, key
changes, streamed transactions with a rolled-back savepoint, transactions rolled back whole, an incremental
snapshot of a table being updated), a schedule drawn from ``seed`` applies faults: connection resets, silent
partitions (every byte held), latency, bandwidth limits, fragmented packets, the proxy down, the registry away,
the walsender terminated, SIGTERM and SIGKILL of cdcd, and metrics clients that connect and say nothing. Then the
faults stop, cdcd must confirm everything, and ``check`` reads the topics back (read_committed) and counts what a
consumer sees: lost, duplicated, phantom (rolled back) and out-of-order-per-key events, and whether the tables
rebuilt from the events equal PostgreSQL's. Every exit of cdcd that was not asked for is counted too.
"""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml
from confluent_kafka import Message
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cdcd.shaping import OLD_KEY_HEADER
from tests.integration import faults
from tests.integration.conftest import Database, cdcd_env
from tests.integration.kafka_harness import delete_topics, each_message
from tests.procs import spawn

SCHEMA = """
CREATE TABLE ev (id bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT now());
CREATE TABLE acct (id bigint PRIMARY KEY, n bigint NOT NULL, doc text);
ALTER TABLE acct ALTER COLUMN doc SET STORAGE EXTERNAL;
INSERT INTO acct SELECT g, 0, repeat(md5(g::text), 120) FROM generate_series(1, 50) g;
CREATE TABLE big (id bigint PRIMARY KEY, v int NOT NULL);
CREATE TABLE snap (id int PRIMARY KEY, v int NOT NULL);
INSERT INTO snap SELECT g, 0 FROM generate_series(1, SNAP_ROWS) g;
CREATE PUBLICATION cdcd_pub FOR TABLE ev, acct, big, snap;
"""
RECEIVE_TIMEOUT_S = 5.0  # cdcd's source.receive_timeout_s in these runs: a silent partition is found this soon
FLUSH_TIMEOUT_S = 10.0
# The faults: the schedule goes through all of them in rounds, each round in an order drawn from the seed.
FAULTS = (
    "pg_reset",
    "pg_partition",
    "pg_latency",
    "pg_bandwidth",
    "pg_slicer",
    "pg_down",
    "registry_down",
    "registry_latency",
    "terminate_walsender",
    "sigterm",
    "sigkill",
    "idle_clients",
)


@dataclass
class Written:
    """What the workload committed (and what it rolled back), as the checker expects to see it."""

    ev: set[int] = field(default_factory=set)
    big: set[int] = field(default_factory=set)
    acct: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))  # key -> versions n, in order
    rolled_back: int = 0  # rows of rolled-back savepoints and aborted transactions (v < 0 in big)
    streamed: int = 0  # large transactions committed
    key_changes: int = 0


@dataclass
class Report:
    """What a consumer saw, against what was committed."""

    events: int = 0
    lost: int = 0
    duplicated: int = 0
    phantom: int = 0
    out_of_order: int = 0
    unrequested_exits: list[str] = field(default_factory=list)
    tables_equal: dict[str, bool] = field(default_factory=dict)
    faults: Counter[str] = field(default_factory=Counter)
    recoveries_s: list[float] = field(default_factory=list)  # a fault's end -> cdcd confirming again
    detail: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "phantom": self.phantom,
            "out_of_order": self.out_of_order,
            "unrequested_exits": len(self.unrequested_exits),
            "tables_equal": self.tables_equal,
            "faults": dict(sorted(self.faults.items())),
            "max_recovery_s": round(max(self.recoveries_s, default=0.0), 1),
        }


class Daemon:
    """The `cdcd run` under test: restarted after each stop the nemesis asks for, and after any exit it did not
    (which is counted)."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config, self.log = config, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.unrequested: list[str] = []

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = spawn(
                [sys.executable, "-m", "cdcd", "run", "--config", str(self.config)],
                stdout=subprocess.DEVNULL,
                stderr=out,
                env=cdcd_env(),
            )

    def check(self) -> None:
        """Restart it if it exited by itself (counted, with its log's tail)."""
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log.read_text()[-1500:]
            self.unrequested.append(f"exit {self.proc.returncode}: {tail}")
            self.start()

    def stop(self, sig: int, timeout: float) -> int | None:
        """Send ``sig``; the exit code, or None if it did not exit within ``timeout`` (then it is killed)."""
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
            return None

    def metrics_port(self) -> int | None:
        for line in reversed(self.log.read_text().splitlines()):
            if line.startswith("{") and json.loads(line).get("event") == "serving metrics":
                return int(json.loads(line)["port"])
        return None


class Nemesis:
    def __init__(
        self,
        db: Database,
        env: dict[str, str],
        tmp_path: Path,
        *,
        delivery: str,
        seed: int,
        seconds: float,
        big_rows: int = 20_000,
        snap_rows: int = 20_000,
        streamed_every_s: float = 15.0,
    ) -> None:
        self.db, self.env, self.tmp_path = db, env, tmp_path
        self.delivery, self.seed, self.seconds = delivery, seed, seconds
        self.big_rows, self.snap_rows, self.streamed_every_s = big_rows, snap_rows, streamed_every_s
        self.prefix = f"nm_{db.name}"
        self.slot = f"s_{db.name}"
        self.toxiproxy = faults.Toxiproxy(env["STACK_TOXIPROXY_URL"], timeout=60)  # slow on a loaded machine
        self.written = Written()
        self.report = Report()
        self.stop = threading.Event()
        self.rng = random.Random(seed)
        self.idle: list[socket.socket] = []
        self.pg_proxy = self.registry_proxy = ""
        self.keys = list(range(1, 51))  # acct's current keys (key changes move them)

    # -- the run ----------------------------------------------------------------------------------

    def run(self) -> Report:
        self.db.execute(SCHEMA.replace("SNAP_ROWS", str(self.snap_rows)))
        pg_port = conninfo_to_dict(self.db.dsn())["port"]
        registry = self.env["CDCD_SCHEMA_REGISTRY__URL"].split("//")[1].split("/")[0]
        tag = uuid.uuid4().hex[:8]
        with (
            self.toxiproxy.temporary_proxy(f"nemesis-pg-{tag}", f"127.0.0.1:{pg_port}") as pg,
            self.toxiproxy.temporary_proxy(f"nemesis-registry-{tag}", registry) as reg,
        ):
            self.pg_proxy, self.registry_proxy = pg.name, reg.name
            daemon = Daemon(self._config(pg.port, reg.port), self.tmp_path / "cdcd.log")
            daemon.start()
            try:
                self._wait_streaming(daemon)
                self._request_snapshots()
                writer = threading.Thread(target=self._workload, name="workload", daemon=True)
                writer.start()
                self._schedule(daemon)
                self.stop.set()
                writer.join(120)
                self._heal()
                self._snapshots_done(daemon)
                self._settle(daemon)
                code = daemon.stop(signal.SIGTERM, FLUSH_TIMEOUT_S + 5)
                if code != 0:
                    daemon.unrequested.append(f"final SIGTERM: exit {code}")
            finally:
                self._close_idle()
                if daemon.proc is not None and daemon.proc.poll() is None:
                    daemon.proc.kill()
            self.report.unrequested_exits = daemon.unrequested
        self.check()
        return self.report

    def close(self) -> None:
        delete_topics(self.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"], (f"{self.prefix}.", f"__cdcd-progress-{self.prefix}"))

    def _config(self, pg_port: int, registry_port: int) -> Path:
        dsn = make_conninfo(self.db.dsn(self.db.server.streaming_options), port=pg_port)
        config = {
            "source": {
                "dsn": dsn,
                "slot": self.slot,
                "publications": [{"name": "cdcd_pub"}],
                "status_interval_s": 0.5,
                "receive_timeout_s": RECEIVE_TIMEOUT_S,
                "connect_timeout_s": 3,
                "statement_timeout_s": 10,
                "reconnect": {"initial_backoff_s": 0.2, "max_backoff_s": 2, "slot_active_wait_s": 120},
            },
            "sink": {"kind": "kafka", "flush_timeout_s": FLUSH_TIMEOUT_S},
            "kafka": {
                "bootstrap_servers": self.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"],
                "topic_prefix": self.prefix,
                "delivery": self.delivery,
                "exactly_once": {"commit_interval_ms": 200},
            },
            "schema_registry": {"url": f"http://127.0.0.1:{registry_port}/apis/ccompat/v7"},
            "buffer": {"spill_dir": str(self.tmp_path / "spill"), "memory_limit": "1MiB"},
            "snapshot": {"state_dir": str(self.tmp_path / "state"), "chunk_size": 2000, "mode": "never"},
            "log": {"format": "json"},
            "metrics": {"listen": "127.0.0.1:0"},
        }
        path = self.tmp_path / "nemesis.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def _confirmed(self) -> str | None:
        rows = self.db.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", [self.slot]
        )
        return rows[0][0] if rows else None

    def _wait_streaming(self, daemon: Daemon, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        query = "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active"
        while not self.db.execute(query, [self.slot]):
            daemon.check()
            assert time.monotonic() < deadline, f"never streamed:\n{daemon.log.read_text()[-3000:]}"
            time.sleep(0.1)

    def _request_snapshots(self) -> None:
        """Incremental snapshots of acct (its first rows) and snap (updated all along while it is read)."""
        config = self.tmp_path / "nemesis.yaml"
        for table in ("public.acct", "public.snap"):
            args = [sys.executable, "-m", "cdcd", "snapshot", "--config", str(config), "--table", table]
            result = subprocess.run(args, check=False, capture_output=True, text=True, env=cdcd_env(), timeout=60)
            assert result.returncode == 0, result.stderr

    def _snapshots_done(self, daemon: Daemon, timeout: float = 300) -> None:
        """Until the state file shows both snapshots finished (saved once Kafka has their rows)."""
        path = self.tmp_path / "state" / f"{self.slot}.snapshot.json"
        deadline = time.monotonic() + timeout
        while True:
            state = json.loads(path.read_text()) if path.exists() else {}
            if len(state.get("finished", [])) >= 2 and not state.get("queue"):
                return
            daemon.check()
            if time.monotonic() > deadline:
                self.report.detail.append(f"snapshots not finished in {timeout:g} s: {state.get('queue')}")
                return
            time.sleep(0.2)

    # -- the workload ------------------------------------------------------------------------------

    def _workload(self) -> None:
        rng = random.Random(self.seed + 1)
        next_ev, next_big, streamed_at = 1, 1, time.monotonic() + 5
        with psycopg.connect(self.db.dsn(self.db.server.streaming_options), autocommit=True) as conn:
            while not self.stop.is_set():
                roll = rng.random()
                if time.monotonic() >= streamed_at:
                    next_big = self._streamed(conn, next_big, rng)
                    every = self.streamed_every_s
                    streamed_at = time.monotonic() + rng.uniform(every / 2, every * 1.5)
                elif roll < 0.6:
                    conn.execute("INSERT INTO ev (id) VALUES (%s)", [next_ev])
                    self.written.ev.add(next_ev)
                    next_ev += 1
                elif roll < 0.9:
                    self._update(conn, rng.choice(self.keys))
                elif roll < 0.93:
                    self._key_change(conn, rng)
                elif roll < 0.96:
                    conn.execute("UPDATE snap SET v = v + 1 WHERE id = %s", [rng.randint(1, self.snap_rows)])
                else:
                    with conn.transaction(force_rollback=True):
                        conn.execute("INSERT INTO big VALUES (-%s, -2)", [next_ev])
                    self.written.rolled_back += 1
                time.sleep(rng.uniform(0.002, 0.02))

    def _update(self, conn: psycopg.Connection[Any], key: int) -> None:
        """A new version of a row whose TOASTed doc is unchanged (pgoutput sends it as unchanged)."""
        row = conn.execute("UPDATE acct SET n = n + 1 WHERE id = %s RETURNING n", [key]).fetchone()
        assert row is not None
        self.written.acct[key].append(int(row[0]))

    def _key_change(self, conn: psycopg.Connection[Any], rng: random.Random) -> None:
        """The row's key changes (its doc stays TOASTed and unchanged): a delete of the old key, a create of the
        new one carrying the doc."""
        index = rng.randrange(len(self.keys))
        old = self.keys[index]
        conn.execute("UPDATE acct SET id = %s, n = n + 1 WHERE id = %s", [old + 1_000_000, old])
        self.keys[index] = old + 1_000_000
        self.written.key_changes += 1

    def _streamed(self, conn: psycopg.Connection[Any], first: int, rng: random.Random) -> int:
        """A transaction large enough to be streamed before its commit, with a savepoint rolled back in it."""
        rows = self.big_rows
        with conn.transaction():
            conn.execute(
                "INSERT INTO big SELECT g, 1 FROM generate_series(%s::bigint, %s::bigint) g", [first, first + rows - 1]
            )
            try:
                with conn.transaction():
                    phantom = first + rows
                    conn.execute(
                        "INSERT INTO big SELECT g, -1 FROM generate_series(%s::bigint, %s::bigint) g",
                        [phantom, phantom + rows // 10 - 1],
                    )
                    raise _Rollback
            except _Rollback:
                pass
            self._update(conn, rng.choice(self.keys))
        self.written.big.update(range(first, first + rows))
        self.written.rolled_back += rows // 10
        self.written.streamed += 1
        return first + rows + rows // 10

    # -- the faults --------------------------------------------------------------------------------

    def _schedule(self, daemon: Daemon) -> None:
        end = time.monotonic() + self.seconds
        round_: list[str] = []
        while time.monotonic() < end:
            daemon.check()
            if not round_:
                round_ = self.rng.sample(FAULTS, len(FAULTS))
            name = round_.pop()
            self.report.faults[name] += 1
            getattr(self, f"_{name}")(daemon)
            pause = self.rng.uniform(1.0, 3.0)
            deadline = time.monotonic() + pause
            while time.monotonic() < deadline:
                daemon.check()
                time.sleep(0.2)

    def _lasting(self, proxy: str, fault: faults.Fault, seconds: float) -> None:
        with self.toxiproxy.fault(proxy, fault):
            time.sleep(seconds)

    def _pg_reset(self, daemon: Daemon) -> None:
        self._lasting(self.pg_proxy, faults.reset_peer(), 0.5)

    def _pg_partition(self, daemon: Daemon) -> None:
        """Every byte held both ways, the connections left open: only cdcd's receive timeout can tell."""
        seconds = self.rng.uniform(2.0, RECEIVE_TIMEOUT_S * 2)
        with (
            self.toxiproxy.fault(self.pg_proxy, faults.timeout(0, "upstream")),
            self.toxiproxy.fault(self.pg_proxy, faults.timeout(0, "downstream")),
        ):
            time.sleep(seconds)
        self._recovered(daemon)

    def _pg_latency(self, daemon: Daemon) -> None:
        self._lasting(self.pg_proxy, faults.latency(200, 50), 4.0)

    def _pg_bandwidth(self, daemon: Daemon) -> None:
        self._lasting(self.pg_proxy, faults.bandwidth(64), 4.0)

    def _pg_slicer(self, daemon: Daemon) -> None:
        self._lasting(self.pg_proxy, faults.slicer(64, 32, 100), 4.0)

    def _pg_down(self, daemon: Daemon) -> None:
        with self.toxiproxy.down(self.pg_proxy):
            time.sleep(self.rng.uniform(1.0, 4.0))

    def _registry_down(self, daemon: Daemon) -> None:
        with self.toxiproxy.down(self.registry_proxy):
            time.sleep(self.rng.uniform(1.0, 5.0))

    def _registry_latency(self, daemon: Daemon) -> None:
        self._lasting(self.registry_proxy, faults.latency(500), 4.0)

    def _terminate_walsender(self, daemon: Daemon) -> None:
        self.db.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s AND active",
            [self.slot],
        )

    def _sigterm(self, daemon: Daemon) -> None:
        """A stop at any moment (perhaps while the producer's queue is full, or a partition holds it) ends
        within flush_timeout_s + 5 s with exit 0."""
        code = daemon.stop(signal.SIGTERM, FLUSH_TIMEOUT_S + 5)
        if code != 0:
            daemon.unrequested.append(f"SIGTERM: exit {code} (None: not within {FLUSH_TIMEOUT_S + 5:g} s)")
        daemon.start()

    def _sigkill(self, daemon: Daemon) -> None:
        daemon.stop(signal.SIGKILL, 30)
        daemon.start()

    def _idle_clients(self, daemon: Daemon) -> None:
        """Clients that connect to the metrics port and say nothing (a port scanner, a stuck probe)."""
        port = daemon.metrics_port()
        if port is None:
            return
        for _ in range(20):
            try:
                self.idle.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            except OSError:
                break

    def _close_idle(self) -> None:
        for sock in self.idle:
            sock.close()
        self.idle.clear()

    def _heal(self) -> None:
        for proxy in (self.pg_proxy, self.registry_proxy):
            for toxic in self.toxiproxy.toxics(proxy):
                self.toxiproxy.remove(proxy, toxic.name)
            self.toxiproxy.enable(proxy)

    def _recovered(self, daemon: Daemon, timeout: float = 120) -> None:
        """Time from a healed fault until cdcd confirms a position written after it."""
        healed = time.monotonic()
        lsn = self.db.execute("SELECT pg_logical_emit_message(true, 'nemesis', 'healed')")[0][0]
        query = "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s"
        while not self.db.execute(query, [lsn, self.slot])[0][0]:
            daemon.check()
            if time.monotonic() - healed > timeout:
                self.report.detail.append(f"not recovered {timeout:g} s after a healed partition")
                return
            time.sleep(0.1)
        self.report.recoveries_s.append(time.monotonic() - healed)

    def _settle(self, daemon: Daemon, timeout: float = 300) -> None:
        """Every committed change confirmed: Kafka has all of it."""
        self._recovered(daemon, timeout)

    # -- the checker -------------------------------------------------------------------------------

    def check(self) -> None:
        bootstrap = self.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"]
        deserialize = AvroDeserializer(SchemaRegistryClient({"url": self.env["CDCD_SCHEMA_REGISTRY__URL"]}))
        by_table: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
        timeout = max(300.0, self.seconds)  # a soak's millions of messages
        for message in each_message(bootstrap, self.prefix, "read_committed", timeout):
            table, value = _decoded(message, self.prefix, deserialize)
            if table is None or value is None:
                continue
            self.report.events += 1
            moved = dict(message.headers() or []).get(OLD_KEY_HEADER)
            if moved is not None:  # a key change's create: the old key, whose row has the unchanged values
                key = deserialize(moved, SerializationContext(str(message.topic()), MessageField.KEY))
                value["moved_from"] = key
            by_table[table].append((value["op"], _compact(table, value)))
        self._check_inserts("ev", by_table["ev"], self.written.ev)
        self._check_inserts("big", by_table["big"], self.written.big)
        self._check_versions(by_table["acct"])
        self._check_rebuilt("acct", by_table["acct"], "SELECT id, n, doc FROM acct")
        self._check_rebuilt("snap", by_table["snap"], "SELECT id, v FROM snap")

    def _check_inserts(self, table: str, events: list[tuple[str, dict[str, Any]]], committed: set[int]) -> None:
        seen = Counter(int(v["after"]["id"]) for op, v in events if op == "c")
        phantom = {key for key in seen if key not in committed}
        lost = committed - set(seen)
        self.report.lost += len(lost)
        self.report.phantom += len(phantom)
        self.report.duplicated += sum(count - 1 for count in seen.values())
        if lost:
            self.report.detail.append(f"{table}: lost {sorted(lost)[:10]}...")
        if phantom:
            self.report.detail.append(f"{table}: phantom {sorted(phantom)[:10]}...")

    def _check_versions(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        """Each key's versions (n) in the order a consumer reads them, a repeat of an earlier one being a
        duplicate: each must be newer than the one before; every committed version must be there."""
        seen: dict[int, list[int]] = defaultdict(list)
        for op, value in events:
            if op == "u":
                seen[int(value["after"]["id"])].append(int(value["after"]["n"]))
        for key, versions in seen.items():
            first: list[int] = []
            for n in versions:
                if n in first:
                    self.report.duplicated += 1
                    continue
                if first and n < first[-1]:
                    self.report.out_of_order += 1
                    self.report.detail.append(f"acct {key}: version {n} after {first[-1]}")
                first.append(n)
        for key, committed in self.written.acct.items():
            missing = set(committed) - set(seen.get(key, []))
            self.report.lost += len(missing)
            if missing:
                self.report.detail.append(f"acct {key}: versions {sorted(missing)[:10]} lost")

    def _check_rebuilt(self, table: str, events: list[tuple[str, dict[str, Any]]], query: str) -> None:
        """The table a consumer rebuilds by applying the events in order (an unchanged TOAST value kept from
        the row it had) equals PostgreSQL's."""
        rows: dict[int, dict[str, Any]] = {}
        gone: dict[int, dict[str, Any]] = {}  # deleted rows, for a key change's create that follows
        for op, value in events:
            if op == "d":
                key = int(value["before"]["id"])
                if key in rows:  # a delete delivered again must not forget the row it removed the first time
                    gone[key] = rows.pop(key)
            elif op in ("c", "u", "r"):
                after = dict(value["after"])
                moved = value.get("moved_from")
                # a key change's create takes unchanged values from the old key's row (or, delivered again, from
                # the row it made the first time)
                kept = rows.get(int(after["id"])) or (gone.get(int(moved["id"]), {}) if moved else {})
                for name in value.get("unchanged_toast") or ():
                    after[name] = kept.get(name)
                rows[int(after["id"])] = after
        with self.db.connect() as conn:
            cursor = conn.execute(query)
            names = [c.name for c in cursor.description or ()]
            source = {int(r[0]): dict(zip(names, r, strict=True)) for r in cursor.fetchall()}
        rebuilt = {key: {name: row.get(name) for name in names} for key, row in rows.items()}
        equal = rebuilt == source
        self.report.tables_equal[table] = equal
        if not equal:
            differ = sorted(k for k in source.keys() | rebuilt.keys() if source.get(k) != rebuilt.get(k))
            self.report.detail.append(f"{table}: {len(differ)} rows differ, e.g. {differ[:5]}")


class _Rollback(Exception):
    pass


def _compact(table: str, value: dict[str, Any]) -> dict[str, Any]:
    """What the checker needs of an event (a soak reads millions): the row images and the key change's old key."""
    if table == "big":  # insert-only: the id is all
        return {"after": {"id": value["after"]["id"]} if value.get("after") else None}
    return {name: value.get(name) for name in ("before", "after", "unchanged_toast", "moved_from")}


def _decoded(
    message: Message, prefix: str, deserialize: Callable[[bytes, SerializationContext], Any]
) -> tuple[str | None, dict[str, Any] | None]:
    topic = str(message.topic())
    parts = topic[len(prefix) + 1 :].split(".")
    raw = message.value()
    if len(parts) != 2 or raw is None:
        return None, None
    return parts[1], deserialize(raw, SerializationContext(topic, MessageField.VALUE))


def lines(report: Report) -> Iterator[str]:
    yield json.dumps(report.summary())
    yield from report.detail[:20]
    yield from (exit_[:500] for exit_ in report.unrequested_exits[:5])
