"""The operator's summary (`cdcd status`): the events rate over the last minute, and the /status document as a
few lines for a terminal. Pure: the clock is passed in, nothing is read or written here.

The daemon builds the document (``cdcd.metrics.Metrics.status``); the command fetches and renders it.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

RATE_WINDOW_S = 60.0
BAR_WIDTH = 24


class RateWindow:
    """A counter's rate over the last ``window_s``, from samples taken now and then (thread-safe: sampled by one
    thread, read by another)."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()

    def add(self, now: float, count: int) -> None:
        with self._lock:
            samples = self._samples
            samples.append((now, count))
            while len(samples) > 2 and samples[1][0] <= now - self.window_s:
                samples.popleft()  # keep one sample at or before the window's start

    def rate(self) -> tuple[float, float] | None:
        """(per second, over how many seconds) between the oldest and the newest sample; None before two."""
        with self._lock:
            if len(self._samples) < 2:
                return None
            (t0, c0), (t1, c1) = self._samples[0], self._samples[-1]
        return ((c1 - c0) / (t1 - t0), t1 - t0) if t1 > t0 else None


def format_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_duration(seconds: float | None) -> str:
    """``42s``, ``12m05s``, ``3h04m``, ``2d03h``; ``?`` when unknown."""
    if seconds is None:
        return "?"
    s = round(seconds)
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def format_rate(per_s: float | None, unit: str) -> str:
    if per_s is None:
        return "?"
    return f"{per_s:,.1f} {unit}/s" if per_s < 100 else f"{per_s:,.0f} {unit}/s"


def progress_bar(fraction: float | None, width: int = BAR_WIDTH) -> str:
    """``[#########.......]``; all ``?`` when the share is unknown."""
    if fraction is None:
        return "[" + "?" * width + "]"
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def render(status: dict[str, Any]) -> str:
    """The /status document as lines for a terminal (see docs/operations.md, "cdcd status")."""
    health = "" if status.get("healthy", True) else "  NOT HEALTHY (main loop stalled)"
    server = status.get("server") or "?"
    if status.get("server_version"):
        server += f" (PostgreSQL {status['server_version']})"
    rate = status.get("events_per_s")
    events = (
        "? (not measured yet)"
        if rate is None
        else (f"{format_rate(rate, 'events')} over the last {format_duration(status.get('events_window_s'))}")
    )
    lines = [
        ("state", f"{status.get('state', '?')}{health}"),
        ("slot", str(status.get("slot") or "?")),
        ("server", server),
        ("received", str(status.get("received_lsn"))),
        ("flushed", str(status.get("flushed_lsn"))),
        ("lag", f"{format_bytes(status.get('lag_bytes'))}, {format_duration(status.get('lag_seconds'))}"),
        ("slot WAL", f"{format_bytes(status.get('slot_retained_wal_bytes'))} retained on the server"),
        ("events", events),
        ("in flight", f"{status.get('in_flight_messages', 0):,} messages"),
        (
            "buffers",
            f"{format_bytes(status.get('buffer_memory_bytes'))} in memory,"
            f" {format_bytes(status.get('buffer_spilled_bytes'))} spilled",
        ),
    ]
    snapshot = status.get("snapshot") or {}
    tables = snapshot.get("tables") or []
    if tables or snapshot.get("tables_pending"):
        lines.append(
            (
                "snapshots",
                f"{snapshot.get('tables_done', 0)} of {snapshot.get('tables_total', 0)} tables"
                f" done, {snapshot.get('tables_pending', 0)} pending",
            )
        )
    out = [f"{label:<10} {value}" for label, value in lines]
    width = max((len(t["table"]) for t in tables), default=0)
    out += [f"  {t['table']:<{width}} {table_line(t)}" for t in tables]
    return "\n".join(out) + "\n"


def table_line(table: dict[str, Any]) -> str:
    """One table snapshot: bar, percent, rows of the estimate, rate, time left (or taken, when done)."""
    percent = table.get("percent")
    fraction = None if percent is None else percent / 100
    estimated = table.get("estimated_rows")
    rows = f"{table['rows']:,} rows, total unknown" if estimated is None else f"{table['rows']:,} / ~{estimated:,} rows"
    shown = "    ?%" if percent is None else f"{percent:5.1f}%"
    rate = format_rate(table.get("rows_per_s"), "rows")
    if table.get("state") == "done":
        when = f"done in {format_duration(table.get('seconds'))}"
    else:
        when = f"ETA {format_duration(table.get('eta_s'))}"
    return f"{progress_bar(fraction)} {shown}  {rows}  {rate}  {when}  ({table.get('kind')})"


def status_url(address: tuple[str, int] | None) -> str:
    """The URL to ask a daemon whose ``metrics.listen`` is ``address`` (a wildcard host is asked locally)."""
    if address is None:
        raise ValueError("metrics.listen is empty: the daemon serves no status; pass --url")
    host, port = address
    if port == 0:
        raise ValueError(
            "metrics.listen has port 0 (a free port picked at start): pass --url with the port the"
            " daemon logged in its 'serving metrics' line"
        )
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
