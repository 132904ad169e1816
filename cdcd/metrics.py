"""Prometheus metrics, /status (JSON for `cdcd status`), /healthz and /readyz, served by ``cdcd.httpd`` (its own
threads; no client can stall them or the daemon's stop).

Values are read from the pipeline's own state when Prometheus scrapes (a custom collector), so the per-change
path pays only for plain counters it keeps anyway. Only the commit-to-acknowledgement latency is a histogram,
observed once per transaction. The events rate of /status comes from a sample of the events counter every few
seconds, taken by a thread of its own.
"""

from __future__ import annotations

import json
import platform
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import make_wsgi_app
from prometheus_client.registry import Collector

from cdcd import __version__
from cdcd.httpd import HttpServer
from cdcd.lsn import format_lsn
from cdcd.secrets import redact
from cdcd.snapshot.meter import SnapshotMeters
from cdcd.status import RateWindow

HEALTH_PATHS = frozenset({"/healthz", "/readyz"})  # cheap, never blocking: answered without a worker

# Commit-to-acknowledgement latency buckets, seconds: sub-second when keeping up, minutes when Kafka is away.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


@dataclass
class State:
    """What the pipeline reports; read by the collector at scrape time (plain values: no locking needed)."""

    received_lsn: int = 0  # highest server WAL position seen (XLogData or keepalive wal_end)
    flushed_lsn: int = 0  # confirmed to PostgreSQL
    oldest_unacked_commit: Callable[[], float | None] = lambda: None  # unix seconds, None when nothing pending
    slot_retained_wal_bytes: int | None = None
    transactions: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind, outcome) -> count
    open_streamed: Callable[[], int] = lambda: 0
    buffer_bytes: Callable[[], tuple[int, int]] = lambda: (0, 0)  # (memory, spilled)
    filtered: dict[str, int] = field(default_factory=dict)  # by table
    control_rejected: dict[tuple[str, str], int] = field(default_factory=dict)  # (source, reason): refused input
    snapshot_tables_pending: Callable[[], int] = lambda: 0  # queued table snapshots not finished
    snapshot_meters: SnapshotMeters = field(default_factory=SnapshotMeters)  # table snapshots of this process
    phase: str = "starting"  # starting, initial snapshot, streaming, reconnecting, stopping
    slot: str = ""
    server: str = ""  # host:port/database, no credentials
    server_version: str = ""
    postgresql_up: bool = False
    streaming: bool = False  # streaming, or reading the initial snapshot: the daemon is at work
    heartbeat: float = field(default_factory=time.monotonic)  # the main loop's last pass


class SinkMetrics(Protocol):
    """The part of ``cdcd.sink.Sink`` metrics read."""

    @property
    def events(self) -> Mapping[tuple[str, str], int]: ...
    @property
    def delivery_errors(self) -> int: ...

    def in_flight(self) -> int: ...
    def ready(self) -> bool: ...


class PipelineCollector(Collector):
    def __init__(self, state: State, sink: SinkMetrics) -> None:
        self.state, self.sink = state, sink

    def collect(self) -> Iterator[Metric]:
        s = self.state
        yield _gauge("cdcd_build_info", "cdcd version", 1, version=__version__, python=platform.python_version())
        yield _gauge("cdcd_received_lsn", "Highest WAL position received from the server", s.received_lsn)
        yield _gauge(
            "cdcd_flushed_lsn", "WAL position confirmed to PostgreSQL (everything before it delivered)", s.flushed_lsn
        )
        yield _gauge(
            "cdcd_replication_lag_bytes",
            "Server WAL end minus the confirmed position",
            max(0, s.received_lsn - s.flushed_lsn),
        )
        oldest = s.oldest_unacked_commit()
        lag_s = 0.0 if oldest is None else max(0.0, time.time() - oldest)
        yield _gauge(
            "cdcd_replication_lag_seconds",
            "Age of the oldest committed change not yet acknowledged by the sink; 0 when everything is delivered",
            lag_s,
        )
        if s.slot_retained_wal_bytes is not None:
            yield _gauge(
                "cdcd_slot_retained_wal_bytes",
                "WAL the slot keeps on the server (current WAL - restart_lsn)",
                s.slot_retained_wal_bytes,
            )
        yield _labelled(
            CounterMetricFamily("cdcd_events", "Change events written, by table and op", labels=["table", "op"]),
            self.sink.events,
        )
        filtered = {(table,): count for table, count in list(s.filtered.items())}
        yield _labelled(
            CounterMetricFamily(
                "cdcd_filtered_events",
                'Changes dropped by row filters, by table; table="": logical decoding messages source.message_prefixes'
                " left out",
                labels=["table"],
            ),
            filtered,
        )
        yield _labelled(
            CounterMetricFamily(
                "cdcd_control_rejected",
                "Control input cdcd did not act on (snapshot requests in the WAL, signal records, snapshot conditions),"
                " by source and reason",
                labels=["source", "reason"],
            ),
            dict(s.control_rejected),
        )
        yield _labelled(
            CounterMetricFamily("cdcd_transactions", "Transactions by kind and outcome", labels=["kind", "outcome"]),
            s.transactions,
        )
        yield _gauge(
            "cdcd_snapshot_tables_pending",
            'Table snapshots queued or running, not yet acknowledged (their rows count in cdcd_events_total{op="r"})',
            s.snapshot_tables_pending(),
        )
        yield from self._snapshot_tables()
        yield _gauge(
            "cdcd_open_streamed_transactions", "Streamed transactions buffered until commit", s.open_streamed()
        )
        memory, spilled = s.buffer_bytes()
        buffers = GaugeMetricFamily("cdcd_buffer_bytes", "Buffered changes of open transactions", labels=["state"])
        buffers.add_metric(["memory"], memory)
        buffers.add_metric(["spilled"], spilled)
        yield buffers
        yield _gauge(
            "cdcd_in_flight_messages", "Messages handed to the sink and not yet acknowledged", self.sink.in_flight()
        )
        errors = CounterMetricFamily("cdcd_delivery_errors", "Messages the sink failed to deliver")
        errors.add_metric([], self.sink.delivery_errors)
        yield errors
        up = GaugeMetricFamily("cdcd_connected", "1 when connected", labels=["target"])
        up.add_metric(["postgresql"], int(s.postgresql_up))
        up.add_metric(["sink"], int(self.sink.ready()))
        yield up

    def _snapshot_tables(self) -> Iterator[Metric]:
        meters = self.state.snapshot_meters
        views = list(meters.tables.values())
        rows = GaugeMetricFamily(
            "cdcd_snapshot_rows",
            "Rows read by the latest snapshot of each table (a resumed one counts the rows read before the restart)",
            labels=["table"],
        )
        estimated = GaugeMetricFamily(
            "cdcd_snapshot_rows_estimated",
            "The planner's estimate of the rows of each table's latest snapshot, taken when it started",
            labels=["table"],
        )
        for meter in views:
            rows.add_metric([redact(meter.table)], meter.rows)
            if meter.estimated is not None:
                estimated.add_metric([redact(meter.table)], meter.estimated)
        yield rows
        yield estimated
        done = meters.done
        yield _gauge(
            "cdcd_snapshot_tables",
            "Table snapshots of this process: finished plus still queued or running",
            done + self.state.snapshot_tables_pending(),
        )
        yield _gauge(
            "cdcd_snapshot_tables_done", "Table snapshots this process finished (every row acknowledged)", done
        )


def _gauge(name: str, doc: str, value: float, **labels: str) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(name, doc, labels=list(labels))
    gauge.add_metric([redact(v) for v in labels.values()], value)
    return gauge


def _labelled(family: CounterMetricFamily, values: Mapping[Any, int]) -> CounterMetricFamily:
    for labels, value in list(values.items()):
        family.add_metric([redact(str(label)) for label in labels], value)
    return family


class Metrics:
    """The registry, the latency histogram and the HTTP endpoint."""

    def __init__(self, state: State, sink: SinkMetrics, health_timeout_s: float) -> None:
        self.state, self.sink, self.health_timeout_s = state, sink, health_timeout_s
        self.registry = CollectorRegistry()
        self.registry.register(PipelineCollector(state, sink))
        self.latency = Histogram(
            "cdcd_commit_to_ack_seconds",
            "From a transaction's commit on the server until it and every earlier one are acknowledged by the sink",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._server: HttpServer | None = None
        self.events_rate = RateWindow()
        self._closing = threading.Event()

    def observe_done(self, commit_unix_s: float) -> None:
        self.latency.observe(max(0.0, time.time() - commit_unix_s))

    def healthy(self) -> bool:
        return time.monotonic() - self.state.heartbeat < self.health_timeout_s

    def ready(self) -> bool:
        return self.healthy() and self.state.streaming and self.sink.ready()

    def _events_total(self) -> int:
        return sum(list(self.sink.events.values()))

    def status(self) -> dict[str, Any]:
        """The /status document (rendered by ``cdcd.status.render``)."""
        s, now = self.state, time.monotonic()
        self.events_rate.add(now, self._events_total())
        rate = self.events_rate.rate()
        oldest = s.oldest_unacked_commit()
        memory, spilled = s.buffer_bytes()
        meters = s.snapshot_meters
        pending = s.snapshot_tables_pending()
        return {
            "version": __version__,
            "state": s.phase,
            "healthy": self.healthy(),
            "ready": self.ready(),
            "slot": s.slot,
            "server": s.server,
            "server_version": s.server_version,
            "received_lsn": format_lsn(s.received_lsn),
            "flushed_lsn": format_lsn(s.flushed_lsn),
            "lag_bytes": max(0, s.received_lsn - s.flushed_lsn),
            "lag_seconds": 0.0 if oldest is None else round(max(0.0, time.time() - oldest), 3),
            "slot_retained_wal_bytes": s.slot_retained_wal_bytes,
            "events_per_s": None if rate is None else round(rate[0], 1),
            "events_window_s": None if rate is None else round(rate[1], 1),
            "events_total": self._events_total(),
            "in_flight_messages": self.sink.in_flight(),
            "buffer_memory_bytes": memory,
            "buffer_spilled_bytes": spilled,
            "snapshot": {
                "tables_total": meters.done + pending,
                "tables_done": meters.done,
                "tables_pending": pending,
                "tables": meters.views(now),
            },
        }

    def _sample_events(self, every_s: float) -> None:
        while not self._closing.wait(every_s):
            self.events_rate.add(time.monotonic(), self._events_total())

    def serve(self, host: str, port: int, sample_every_s: float = 5.0) -> int:
        """Start serving (from the server's own threads); return the bound port (``port`` 0 picks a free one)."""
        metrics_app = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path in HEALTH_PATHS:
                ok = self.healthy() if path == "/healthz" else self.ready()
                start("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
                return [b"ok\n" if ok else b"not ready\n"]
            if path == "/status":
                start("200 OK", [("Content-Type", "application/json")])
                return [redact(json.dumps(self.status())).encode() + b"\n"]
            return metrics_app(environ, start)  # type: ignore[no-any-return]

        self._server = HttpServer(host, port, app, inline=HEALTH_PATHS)
        port = self._server.start()
        self.events_rate.add(time.monotonic(), self._events_total())
        threading.Thread(target=self._sample_events, args=(sample_every_s,), name="rate", daemon=True).start()
        return port

    def close(self) -> None:
        """Stop serving; returns at once whatever the clients do (connections are closed, not waited for)."""
        self._closing.set()
        if self._server is not None:
            self._server.close()
