"""SIGTERM under load: `cdcd run` to Kafka stops cleanly within sink.flush_timeout_s, and after a restart every
committed row is in Kafka (nothing lost across the stop)."""

from __future__ import annotations

import signal
import threading
import time

import psycopg
import pytest

from tests.integration.conftest import Database
from tests.integration.kafka_harness import Run
from tests.integration.workload import SCHEMA

pytestmark = pytest.mark.integration

ROWS, PER_TXN = 20_000, 50
FLUSH_TIMEOUT_S = 20  # Run.start's sink.flush_timeout_s


class Workload(threading.Thread):
    """Inserts ROWS rows into items, PER_TXN per transaction, counting what committed."""

    def __init__(self, db: Database) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.committed = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.db.dsn()) as conn:
                for start in range(0, ROWS, PER_TXN):
                    with conn.transaction(), conn.cursor() as cur:
                        cur.executemany(
                            "INSERT INTO items (id, v, n) VALUES (%s, %s, %s)",
                            [(i, f"v{i}", i) for i in range(start, start + PER_TXN)],
                        )
                    self.committed = start + PER_TXN
                    time.sleep(0.002)  # a steady stream, not one burst
        except BaseException as exc:
            self.error = exc


def test_sigterm_under_load_loses_nothing(db: Database, run: Run) -> None:
    db.execute(SCHEMA)
    run.start()
    workload = Workload(db)
    workload.start()
    deadline = time.monotonic() + 60
    while workload.committed < ROWS // 4:
        assert workload.is_alive(), f"workload failed: {workload.error}"
        assert time.monotonic() < deadline, "workload stalled"
        time.sleep(0.05)

    assert run.proc is not None
    started = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    code = run.proc.wait(timeout=FLUSH_TIMEOUT_S + 15)
    elapsed = time.monotonic() - started
    log = run.log.read_text()
    assert code == 0, f"exit {code} after SIGTERM:\n{log[-3000:]}"
    assert elapsed < FLUSH_TIMEOUT_S + 10, f"took {elapsed:.1f}s to stop"
    assert '"event": "stopped"' in log
    assert workload.committed < ROWS, "the workload finished before the stop: nothing was under load"

    run.start()  # the workload goes on meanwhile: the slot keeps what cdcd has not confirmed
    workload.join(timeout=300)
    assert workload.error is None, workload.error
    assert workload.committed == ROWS
    events = run.sync(timeout=180)
    keys = {e.key["id"] for e in events if e.topic == f"{run.prefix}.public.items" and e.key is not None}
    assert len(keys) == ROWS, f"{ROWS - len(keys)} committed rows are missing from Kafka"
    assert keys == set(range(ROWS))
    assert run.stop() == 0


def test_sigterm_while_kafka_is_unreachable_stops_at_once_and_confirms_nothing(db: Database, run: Run) -> None:
    """Kafka never answers (nothing listens on the port): cdcd waits for it to create the first topic; SIGTERM
    ends that wait at once (not after the 60 s topic deadline), exit 0, and the change it was holding is not
    confirmed: the slot still has it for the next run."""
    db.execute(SCHEMA)
    run.start(bootstrap_servers="127.0.0.1:9")  # discard port: connections are refused
    # A position inside the transaction, after its insert and before its commit: confirming the transaction
    # means confirming its commit, past this. (The server's WAL write position, taken before the insert, was
    # too early: a keepalive may rightly confirm WAL inserted before the transaction and not yet written then.)
    with db.connect() as conn, conn.transaction():
        conn.execute("INSERT INTO items (id, v, n) VALUES (1, 'x', 1)")
        inside = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]  # type: ignore[index]
    assert run.proc is not None
    time.sleep(5)  # the change reaches the sink, which waits for the broker to make its topic (up to 60 s)
    run._check_alive()
    started = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    code = run.proc.wait(timeout=30)
    elapsed = time.monotonic() - started
    log = run.log.read_text()
    assert code == 0, f"exit {code} after SIGTERM:\n{log[-3000:]}"
    assert elapsed < 5, f"took {elapsed:.1f}s to stop:\n{log[-3000:]}"
    assert '"event": "stopped"' in log
    confirmed = db.execute(
        "SELECT confirmed_flush_lsn <= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s", [inside, run.slot]
    )[0][0]
    assert confirmed, "the slot was confirmed past a change Kafka never had"
