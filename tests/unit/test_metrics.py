"""Metrics, /healthz and /readyz over real HTTP, from a pipeline state and a sink stand-in."""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from cdcd.ledger import Ledger
from cdcd.metrics import Metrics, State
from cdcd.secrets import register_secret
from tests.http import get, scrape


class FakeSink:
    def __init__(self) -> None:
        self.events: Counter[tuple[str, str]] = Counter()
        self.delivery_errors = 0
        self.waiting = 0
        self.ok = True

    def in_flight(self) -> int:
        return self.waiting

    def ready(self) -> bool:
        return self.ok


Served = tuple[Metrics, State, FakeSink, Ledger, str]


@pytest.fixture
def served() -> Iterator[Served]:
    progress = Ledger()
    state = State(oldest_unacked_commit=progress.oldest_commit_time)
    sink = FakeSink()
    metrics = Metrics(state, sink, health_timeout_s=5)
    progress.on_done = metrics.observe_done
    port = metrics.serve("127.0.0.1", 0)
    yield metrics, state, sink, progress, f"http://127.0.0.1:{port}"
    metrics.close()


def test_lag_throughput_and_buffers_are_read_at_scrape_time(
    served: Served,
) -> None:
    _, state, sink, progress, base = served
    state.received_lsn, state.flushed_lsn = 5000, 1200
    sink.events["public.t", "c"] = 7
    sink.events["public.t", "d"] = 2
    state.filtered["public.t"] = 3
    state.transactions["streamed", "abort"] = 1
    state.buffer_bytes = lambda: (4096, 1 << 20)
    state.snapshot_tables_pending = lambda: 2
    progress.open(100, commit_time=time.time() - 42)
    got = scrape(base)
    assert got["cdcd_replication_lag_bytes", ()] == 3800
    assert 41 <= got["cdcd_replication_lag_seconds", ()] < 50
    assert got["cdcd_events_total", (("op", "c"), ("table", "public.t"))] == 7
    assert got["cdcd_events_total", (("op", "d"), ("table", "public.t"))] == 2
    assert got["cdcd_filtered_events_total", (("table", "public.t"),)] == 3
    assert got["cdcd_transactions_total", (("kind", "streamed"), ("outcome", "abort"))] == 1
    assert got["cdcd_buffer_bytes", (("state", "spilled"),)] == 1 << 20
    assert got["cdcd_snapshot_tables_pending", ()] == 2
    assert ("cdcd_slot_retained_wal_bytes", ()) not in got  # not known yet: absent rather than 0


def test_lag_seconds_is_zero_when_everything_is_delivered(
    served: Served,
) -> None:
    _, _, _, progress, base = served
    entry = progress.open(100, commit_time=time.time() - 3)
    progress.seal(entry)
    got = scrape(base)
    assert got["cdcd_replication_lag_seconds", ()] == 0
    assert got["cdcd_commit_to_ack_seconds_count", ()] == 1
    assert got["cdcd_commit_to_ack_seconds_bucket", (("le", "2.5"),)] == 0
    assert got["cdcd_commit_to_ack_seconds_bucket", (("le", "5.0"),)] == 1


def test_health_follows_the_main_loop_and_readiness_the_connections(
    served: Served,
) -> None:
    _, state, sink, _, base = served
    assert get(base + "/healthz")[0] == 200
    assert get(base + "/readyz")[0] == 503  # not streaming yet
    state.streaming = True
    assert get(base + "/readyz")[0] == 200
    sink.ok = False
    assert get(base + "/readyz")[0] == 503
    state.heartbeat = time.monotonic() - 10  # the loop stalled longer than health_timeout_s
    assert get(base + "/healthz")[0] == 503


def test_label_values_are_redacted(served: Served) -> None:
    _, state, sink, _, base = served
    register_secret("label-Secret-5")
    sink.events["public.label-Secret-5", "c"] = 1
    state.filtered["password=hunter22"] = 1
    text = get(base + "/metrics")[1]
    assert "label-Secret-5" not in text
    assert "hunter22" not in text
    assert 'table="public.***"' in text


def test_idle_clients_block_neither_the_probes_nor_the_stop() -> None:
    """Clients that connect and send nothing: /healthz, /readyz and /metrics answer at once, and close()
    returns at once and closes their connections (a single-threaded server waits on the first of them)."""
    metrics = Metrics(State(), FakeSink(), health_timeout_s=5)
    port = metrics.serve("127.0.0.1", 0)
    base = f"http://127.0.0.1:{port}"
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(20)]
    try:
        started = time.monotonic()
        assert get(base + "/healthz", timeout=3)[0] == 200
        assert get(base + "/readyz", timeout=3)[0] == 503  # not streaming
        assert get(base + "/metrics", timeout=3)[0] == 200
        assert time.monotonic() - started < 2
        closing = threading.Thread(target=metrics.close, daemon=True)
        started = time.monotonic()
        closing.start()
        closing.join(timeout=3)
        assert not closing.is_alive(), "close() waits on idle clients"
        assert time.monotonic() - started < 1
        assert all(sock.recv(1) == b"" for sock in idle)  # closed by the server
    finally:
        for sock in idle:
            sock.close()
