"""The operator view's pure parts: snapshot meters (rate, ETA, when to log), the events rate window, formatting,
the progress bar and the rendered summary; and /status served from a pipeline state over real HTTP."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdcd.metrics import Metrics, State
from cdcd.snapshot.meter import SnapshotMeters, eta_seconds
from cdcd.status import (
    RateWindow,
    format_bytes,
    format_duration,
    progress_bar,
    render,
    status_url,
    table_line,
)
from cdcd.status_client import StatusUnavailable, fetch_status
from tests.http import get, scrape
from tests.unit.test_metrics import FakeSink


def test_eta_is_rows_left_over_rate_and_unknown_without_estimate_rate_or_once_past_the_estimate() -> None:
    assert eta_seconds(250, 1000, 50.0) == 15.0
    assert eta_seconds(250, None, 50.0) is None
    assert eta_seconds(250, 1000, None) is None
    assert eta_seconds(250, 1000, 0.0) is None
    assert eta_seconds(1200, 1000, 50.0) is None  # the table grew past the planner's estimate


def test_meter_counts_rows_and_says_when_a_progress_line_is_due() -> None:
    meters = SnapshotMeters(interval_s=10)
    meters.start("public.t", "initial", "a1", estimated=1000, rows=0, now=100.0)
    assert meters.running("public.t", "a1")
    assert not meters.running("public.t", "other")
    assert meters.add("public.t", 100, 105.0) is None  # not due yet
    due = meters.add("public.t", 100, 110.0)
    assert due is not None
    assert due.view(110.0) | {"seconds": 0} == {
        "table": "public.t",
        "kind": "initial",
        "state": "running",
        "rows": 200,
        "estimated_rows": 1000,
        "percent": 20.0,
        "rows_per_s": 20.0,
        "eta_s": 40.0,
        "seconds": 0,
    }
    assert meters.add("public.t", 100, 115.0) is None  # the next one 10 s later
    assert meters.add("public.t", 100, 120.0) is not None
    assert meters.add("public.nope", 5, 500.0) is None
    finished = meters.finish("public.t", "a1", 130.0)
    assert finished is not None
    view = finished.view(999.0)
    assert (view["state"], view["percent"], view["eta_s"], view["seconds"]) == ("done", 100.0, 0.0, 30.0)
    assert meters.finish("public.t", "a1", 140.0) is None  # once
    assert meters.done == 1


def test_a_resumed_snapshot_counts_earlier_rows_but_not_in_its_rate_and_a_new_one_replaces_the_meter() -> None:
    meters = SnapshotMeters(interval_s=10)
    meters.start("public.t", "incremental", "a1", estimated=1000, rows=600, now=0.0)
    meters.add("public.t", 100, 10.0)
    meter = meters.tables["public.t"]
    assert (meter.rows, meter.rows_per_s(10.0), meter.fraction()) == (700, 10.0, 0.7)
    assert meters.start("public.t", "incremental", "a1", estimated=5, rows=0, now=20.0) is meter  # the running one
    again = meters.start("public.t", "incremental", "b2", estimated=None, rows=0, now=30.0)
    assert again is not meter
    assert meters.tables == {"public.t": again}
    assert (again.fraction(), again.eta_s(40.0)) == (None, None)


def test_rate_window_keeps_the_last_minute() -> None:
    window = RateWindow(window_s=60)
    assert window.rate() is None
    window.add(0.0, 0)
    assert window.rate() is None
    window.add(30.0, 3000)
    assert window.rate() == (100.0, 30.0)
    for t in range(35, 200, 5):  # 10 events/s from t=30 on
        window.add(float(t), 3000 + (t - 30) * 10)
    rate = window.rate()
    assert rate is not None
    assert rate[0] == pytest.approx(10.0)
    assert 60 <= rate[1] <= 65


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "?"), (0, "0.0s"), (4.25, "4.2s"), (42, "42s"), (725, "12m05s"), (11040, "3h04m"), (183600, "2d03h")],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("n", "text"),
    [(None, "?"), (0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (12 << 20, "12.0 MiB"), (3 << 40, "3.0 TiB")],
)
def test_format_bytes(n: int | None, text: str) -> None:
    assert format_bytes(n) == text


@given(st.floats(min_value=-1, max_value=2), st.integers(min_value=1, max_value=80))
def test_progress_bar_has_its_width_and_fills_with_the_share(fraction: float, width: int) -> None:
    bar = progress_bar(fraction, width)
    assert len(bar) == width + 2
    assert bar.count("#") == round(max(0.0, min(1.0, fraction)) * width)


def test_progress_bar_examples() -> None:
    assert progress_bar(0.5, 10) == "[#####.....]"
    assert progress_bar(None, 4) == "[????]"


def _document() -> dict[str, object]:
    return {
        "state": "streaming",
        "healthy": True,
        "slot": "cdcd",
        "server": "db1:5432/app",
        "server_version": "15.4",
        "received_lsn": "0/3000100",
        "flushed_lsn": "0/3000000",
        "lag_bytes": 256,
        "lag_seconds": 0.4,
        "slot_retained_wal_bytes": 3 << 20,
        "events_per_s": 1234.56,
        "events_window_s": 60.0,
        "in_flight_messages": 12,
        "buffer_memory_bytes": 4096,
        "buffer_spilled_bytes": 0,
        "snapshot": {
            "tables_total": 2,
            "tables_done": 1,
            "tables_pending": 1,
            "tables": [
                {
                    "table": "app.orders",
                    "kind": "initial",
                    "state": "done",
                    "rows": 5000,
                    "estimated_rows": 4900,
                    "percent": 100.0,
                    "rows_per_s": 2500.0,
                    "eta_s": 0.0,
                    "seconds": 2.0,
                },
                {
                    "table": "app.big",
                    "kind": "incremental",
                    "state": "running",
                    "rows": 90_000,
                    "estimated_rows": 200_000,
                    "percent": 45.0,
                    "rows_per_s": 5000.0,
                    "eta_s": 22.0,
                    "seconds": 18.0,
                },
            ],
        },
    }


def test_render_shows_every_line_of_the_summary() -> None:
    text = render(_document())
    assert text.splitlines() == [
        "state      streaming",
        "slot       cdcd",
        "server     db1:5432/app (PostgreSQL 15.4)",
        "received   0/3000100",
        "flushed    0/3000000",
        "lag        256 B, 0.4s",
        "slot WAL   3.0 MiB retained on the server",
        "events     1,235 events/s over the last 1m00s",
        "in flight  12 messages",
        "buffers    4.0 KiB in memory, 0 B spilled",
        "snapshots  1 of 2 tables done, 1 pending",
        "  app.orders [########################] 100.0%  5,000 / ~4,900 rows  2,500 rows/s  done in 2.0s  (initial)",
        "  app.big    [###########.............]  45.0%  90,000 / ~200,000 rows  5,000 rows/s  ETA 22s  (incremental)",
    ]


def test_render_of_a_daemon_just_started_or_stalled() -> None:
    text = render({"state": "starting", "healthy": False, "received_lsn": "0/0", "flushed_lsn": "0/0"})
    assert "state      starting  NOT HEALTHY" in text
    assert "events     ? (not measured yet)" in text
    assert "slot WAL   ? retained" in text
    assert "snapshots" not in text
    line = table_line(
        {
            "table": "t",
            "kind": "incremental",
            "state": "running",
            "rows": 3,
            "estimated_rows": None,
            "percent": None,
            "rows_per_s": None,
            "eta_s": None,
        }
    )
    # no estimate (a table PostgreSQL has no statistics for): said so, not guessed
    assert line == "[????????????????????????]     ?%  3 rows, total unknown  ?  ETA ?  (incremental)"


def test_status_url_from_metrics_listen() -> None:
    assert status_url(("0.0.0.0", 9187)) == "http://127.0.0.1:9187"
    assert status_url(("::", 9187)) == "http://[::1]:9187"
    assert status_url(("10.0.0.5", 80)) == "http://10.0.0.5:80"
    with pytest.raises(ValueError, match=r"metrics\.listen is empty"):
        status_url(None)
    with pytest.raises(ValueError, match="port 0"):
        status_url(("127.0.0.1", 0))


def test_status_document_and_snapshot_metrics_over_http() -> None:
    meters = SnapshotMeters()
    state = State(
        slot="s1",
        server="h:5432/app",
        server_version="15.4",
        phase="streaming",
        snapshot_meters=meters,
        snapshot_tables_pending=lambda: 1,
    )
    state.received_lsn, state.flushed_lsn = 0x3000100, 0x3000000
    sink = FakeSink()
    metrics = Metrics(state, sink, health_timeout_s=5)
    port = metrics.serve("127.0.0.1", 0, sample_every_s=0.05)
    try:
        now = time.monotonic()
        meters.start("public.a", "initial", "x", estimated=100, rows=0, now=now - 10)
        meters.add("public.a", 100, now)
        meters.finish("public.a", "x", now)
        meters.start("public.b", "incremental", "y", estimated=1000, rows=0, now=now - 10)
        meters.add("public.b", 250, now)
        sink.events["public.a", "r"] = 100
        time.sleep(0.3)
        sink.events["public.b", "c"] = 500
        code, body = get(f"http://127.0.0.1:{port}/status")
        assert code == 200
        doc = json.loads(body)
        fetched = fetch_status(f"127.0.0.1:{port}", 5)  # no scheme: http
        assert (fetched.keys(), fetched["slot"]) == (doc.keys(), "s1")
        got = scrape(f"http://127.0.0.1:{port}")
    finally:
        metrics.close()
    assert (doc["state"], doc["slot"], doc["server"]) == ("streaming", "s1", "h:5432/app")
    assert (doc["received_lsn"], doc["flushed_lsn"], doc["lag_bytes"]) == ("0/3000100", "0/3000000", 256)
    assert doc["events_total"] == 600
    assert doc["events_per_s"] > 0
    assert 0.2 <= doc["events_window_s"] < 5
    snapshot = doc["snapshot"]
    assert (snapshot["tables_total"], snapshot["tables_done"], snapshot["tables_pending"]) == (2, 1, 1)
    b = snapshot["tables"][1]
    assert (b["table"], b["state"], b["rows"], b["percent"]) == ("public.b", "running", 250, 25.0)
    assert b["eta_s"] == pytest.approx(30, rel=0.1)
    assert got["cdcd_snapshot_rows", (("table", "public.b"),)] == 250
    assert got["cdcd_snapshot_rows_estimated", (("table", "public.b"),)] == 1000
    assert got["cdcd_snapshot_tables", ()] == 2
    assert got["cdcd_snapshot_tables_done", ()] == 1


def test_fetch_status_names_the_address_and_the_reason_when_nothing_answers() -> None:
    with pytest.raises(StatusUnavailable, match=r"no answer from http://127\.0\.0\.1:9: .*refused"):
        fetch_status("http://127.0.0.1:9", 2)
    with pytest.raises(StatusUnavailable, match=r"http://user:\*\*\*@127\.0\.0\.1:9") as failed:
        fetch_status("http://user:secret@127.0.0.1:9", 2)
    assert "secret" not in str(failed.value)
