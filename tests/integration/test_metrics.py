"""`cdcd run` serves Prometheus metrics, /healthz and /readyz that follow a real workload."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from cdcd.lsn import parse_lsn
from tests.http import get, scrape
from tests.integration.conftest import Database
from tests.integration.kafka_harness import Run
from tests.integration.workload import SCHEMA

pytestmark = pytest.mark.integration


def test_metrics_follow_a_workload(run: Run, db: Database) -> None:
    db.execute(SCHEMA)
    run.start()
    base = run.metrics_url()
    deadline = time.monotonic() + 30
    while get(base + "/readyz")[0] != 200:
        assert time.monotonic() < deadline, "never ready"
        time.sleep(0.2)
    assert get(base + "/healthz")[0] == 200
    db.execute("INSERT INTO items SELECT g, 'v' || g, g FROM generate_series(1, 500) g")
    db.execute("UPDATE items SET n = -n WHERE id <= 10")
    db.execute("DELETE FROM items WHERE id > 495")
    run.sync()
    synced = parse_lsn(
        db.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", [run.slot])[0][0]
    )
    got = scrape(base)
    table = ("table", "public.items")
    assert got["cdcd_events_total", (("op", "c"), table)] == 500
    assert got["cdcd_events_total", (("op", "u"), table)] == 10
    assert got["cdcd_events_total", (("op", "d"), table)] == 5
    # plain or streamed: on PostgreSQL 16+ the test DSN makes the server stream every transaction
    commits = [v for (name, labels), v in got.items() if name == "cdcd_transactions_total" and labels[1][1] == "commit"]
    assert sum(commits) >= 3
    assert got["cdcd_flushed_lsn", ()] >= synced
    assert got["cdcd_replication_lag_seconds", ()] == 0  # everything acknowledged
    assert got["cdcd_slot_retained_wal_bytes", ()] > 0
    assert got["cdcd_commit_to_ack_seconds_count", ()] >= 3
    assert got["cdcd_connected", (("target", "postgresql"),)] == 1
    assert got["cdcd_connected", (("target", "sink"),)] == 1
    assert got["cdcd_delivery_errors_total", ()] == 0
    assert run.stop() == 0


def test_systemd_notifications_ready_watchdog_stopping(
    run: Run, db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under systemd (Type=notify), READY=1 comes once streaming, WATCHDOG=1 while running, STOPPING=1 on SIGTERM."""
    db.execute(SCHEMA)
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(30)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        monkeypatch.setenv("WATCHDOG_USEC", "1000000")  # a ping at least every 0.5 s
        monkeypatch.delenv("WATCHDOG_PID", raising=False)
        run.start()
        received = [sock.recv(4096).decode()]
        while not any("READY=1" in m for m in received) or sum("WATCHDOG=1" in m for m in received) < 2:
            received.append(sock.recv(4096).decode())
        slot_active = db.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", [run.slot])
        assert slot_active == [(True,)]
        assert run.stop() == 0
        received += [m.decode() for m in iter(lambda: _recv(sock), b"")]
    # READY=1 comes when the initial snapshot starts (it can take hours: systemd must not time out the start),
    # with a status; once streaming, the status says so.
    ready = [m for m in received if "READY=1" in m]
    assert "STATUS=initial snapshot" in ready[0]
    assert f"STATUS=streaming from slot {run.slot}" in ready[-1]
    assert any("STOPPING=1" in m for m in received)


def _recv(sock: socket.socket) -> bytes:
    sock.settimeout(0.5)
    try:
        return sock.recv(4096)
    except TimeoutError:
        return b""
