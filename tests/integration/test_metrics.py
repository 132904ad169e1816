"""`cdcd run` serves Prometheus metrics, /healthz and /readyz that follow a real workload."""

from __future__ import annotations

import contextlib
import selectors
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from cdcd.lsn import parse_lsn
from tests.http import get, scrape
from tests.integration.conftest import Database
from tests.integration.kafka_harness import Run
from tests.integration.workload import SCHEMA

pytestmark = pytest.mark.integration

FLUSH_TIMEOUT_S = 20  # Run.start's sink.flush_timeout_s


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


class IdleClients(threading.Thread):
    """Keeps ``count`` connections open to ``port``: half send nothing, half trickle a request head a byte every
    0.5 s (slowloris); a connection the server drops is opened again at once. ``connected`` is a momentary count
    (0 for up to 0.5 s after a wave of drops): assert on the counters, which only grow."""

    def __init__(self, port: int, count: int = 100) -> None:
        super().__init__(daemon=True)
        self.port, self.count = port, count
        self.halt = threading.Event()
        self.connected = 0
        self.connects = 0  # connections opened (the first ones and every one again after a drop)
        self.refused = 0  # connections the daemon did not take
        self.dropped = 0  # by the server

    def run(self) -> None:
        selector = selectors.DefaultSelector()
        socks: list[socket.socket | None] = [None] * self.count
        while not self.halt.wait(0.5):
            for i, sock in enumerate(socks):
                if sock is None:
                    socks[i] = self._connect(selector, i)
                elif i % 2:
                    with contextlib.suppress(OSError):  # dropped: seen below
                        sock.send(b"X")
            for key, _ in selector.select(0):  # readable: closed by the server
                selector.unregister(key.fileobj)
                socks[key.data] = None
                self.dropped += 1
                key.fileobj.close()  # type: ignore[union-attr]
            self.connected = sum(s is not None for s in socks)
        for sock in socks:
            if sock is not None:
                sock.close()

    def _connect(self, selector: selectors.BaseSelector, i: int) -> socket.socket | None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            if i % 2:
                sock.send(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
        except OSError:
            self.refused += 1
            return None  # the daemon is gone
        selector.register(sock, selectors.EVENT_READ, i)
        self.connects += 1
        return sock


@pytest.mark.alone  # 100 idle clients and time bounds: beside another test, 0 of 100 were back (CI, 2026-11-27)
def test_idle_and_slowloris_clients_block_neither_the_probes_nor_sigterm(run: Run, db: Database) -> None:
    """100 connections to the metrics port that never finish a request (the server drops each after 5 s, and it
    comes back at once): meanwhile /healthz, /readyz and /metrics answer at once and the daemon streams; SIGTERM
    ends it, exit 0, within sink.flush_timeout_s + 5 s."""
    db.execute(SCHEMA)
    run.start()
    base = run.metrics_url()
    clients = IdleClients(int(base.rsplit(":", 1)[1]))
    clients.start()
    try:
        deadline = time.monotonic() + 30
        while clients.connected < clients.count:
            assert time.monotonic() < deadline, f"{clients.connected} clients connected"
            time.sleep(0.1)
        slowest = 0.0
        while clients.dropped < clients.count:  # the server's timeout, and every one of them back again
            started = time.monotonic()
            assert get(base + "/healthz", timeout=5)[0] == 200
            slowest = max(slowest, time.monotonic() - started)
            assert time.monotonic() < deadline, f"{clients.dropped} clients dropped"
            time.sleep(0.2)
        assert slowest < 1, f"/healthz took {slowest:.2f} s"
        assert get(base + "/readyz", timeout=5)[0] == 200
        db.execute("INSERT INTO items SELECT g, 'v' || g, g FROM generate_series(1, 100) g")
        run.wait_confirmed(timeout=30)
        assert scrape(base)["cdcd_events_total", (("op", "c"), ("table", "public.items"))] == 100
        back = time.monotonic() + 10
        while clients.connects < 2 * clients.count:  # every one back after its drop, at least once
            assert time.monotonic() < back, f"{clients.connects} connections opened"
            time.sleep(0.1)
        assert clients.refused == 0

        assert run.proc is not None
        started = time.monotonic()
        run.proc.send_signal(signal.SIGTERM)
        code = run.proc.wait(timeout=FLUSH_TIMEOUT_S + 15)
        elapsed = time.monotonic() - started
    finally:
        clients.halt.set()
        clients.join(timeout=10)
    log = run.log.read_text()
    assert code == 0, f"exit {code} after SIGTERM:\n{log[-3000:]}"
    assert elapsed < FLUSH_TIMEOUT_S + 5, f"took {elapsed:.1f} s to stop"
    assert '"event": "stopped"' in log
    print(f"/healthz slowest {slowest * 1000:.0f} ms among idle clients; stopped {elapsed:.2f} s after SIGTERM")
