"""How far table snapshots have got: rows read against an estimate, rate, time left, and when to log it. Pure:
the caller passes the clock (monotonic seconds).

The estimate comes from the planner (``cdcd.snapshot.reader.SnapshotReader.estimate``): the table's
``pg_class.reltuples`` scaled to its current size, narrowed by the row filters and by the key range still to
read when a snapshot resumes after a saved key. It is an estimate: a table that grows during its snapshot
reads past it (the bar stays full, the time left is unknown until it finishes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def eta_seconds(done: int, estimated: int | None, rows_per_s: float | None) -> float | None:
    """Seconds until ``estimated`` rows are read at ``rows_per_s``; None when unknown (no estimate, no rate
    yet, or already past the estimate)."""
    if estimated is None or not rows_per_s or done >= estimated:
        return None
    return (estimated - done) / rows_per_s


@dataclass
class TableMeter:
    """One table snapshot as this process runs it."""

    table: str  # schema.table
    kind: str  # initial | incremental
    id: str  # the snapshot's id in the state file
    estimated: int | None  # rows in all, before the snapshot starts; None when the planner could not say
    started: float
    rows: int = 0  # rows read, including those a previous process read before a restart
    resumed_rows: int = 0  # rows read before this process took over (not part of the rate)
    finished: float | None = None  # every row acknowledged by the sink
    next_log: float = 0.0

    def rows_per_s(self, now: float) -> float | None:
        elapsed = (self.finished if self.finished is not None else now) - self.started
        return (self.rows - self.resumed_rows) / elapsed if elapsed > 0 else None

    def fraction(self) -> float | None:
        """Share of the estimate read, 0..1 (1 once finished)."""
        if self.finished is not None:
            return 1.0
        if not self.estimated:
            return None
        return min(1.0, self.rows / self.estimated)

    def eta_s(self, now: float) -> float | None:
        if self.finished is not None:
            return 0.0
        return eta_seconds(self.rows, self.estimated, self.rows_per_s(now))

    def view(self, now: float) -> dict[str, Any]:
        """The fields a progress log line and the /status document show."""
        rate, eta, fraction = self.rows_per_s(now), self.eta_s(now), self.fraction()
        return {
            "table": self.table,
            "kind": self.kind,
            "state": "done" if self.finished is not None else "running",
            "rows": self.rows,
            "estimated_rows": self.estimated,
            "percent": None if fraction is None else round(100 * fraction, 1),
            "rows_per_s": None if rate is None else round(rate, 1),
            "eta_s": None if eta is None else round(eta, 1),
            "seconds": round((self.finished if self.finished is not None else now) - self.started, 1),
        }


class SnapshotMeters:
    """Every table snapshot this process has started, by table (a new snapshot of a table replaces the
    previous one's meter), and how many finished. Written by the main loop, read by the metrics thread."""

    def __init__(self, interval_s: float = 30.0) -> None:
        self.interval_s = interval_s  # between two progress log lines of one table
        self.tables: dict[str, TableMeter] = {}
        self.done = 0

    def start(
        self, table: str, kind: str, snapshot_id: str, *, estimated: int | None, rows: int, now: float
    ) -> TableMeter:
        """The meter of snapshot ``snapshot_id`` of ``table``: the running one, or a new one when none runs."""
        meter = self.tables.get(table)
        if meter is None or meter.id != snapshot_id:
            meter = TableMeter(table, kind, snapshot_id, estimated, now, rows, rows, next_log=now + self.interval_s)
            self.tables[table] = meter
        return meter

    def running(self, table: str, snapshot_id: str) -> bool:
        meter = self.tables.get(table)
        return meter is not None and meter.id == snapshot_id and meter.finished is None

    def add(self, table: str, rows: int, now: float) -> TableMeter | None:
        """Count rows read; returns the meter when its progress line is due."""
        meter = self.tables.get(table)
        if meter is None:
            return None
        meter.rows += rows
        if now < meter.next_log:
            return None
        meter.next_log = now + self.interval_s
        return meter

    def finish(self, table: str, snapshot_id: str, now: float) -> TableMeter | None:
        meter = self.tables.get(table)
        if meter is None or meter.id != snapshot_id or meter.finished is not None:
            return None
        meter.finished = now
        self.done += 1
        return meter

    def views(self, now: float) -> list[dict[str, Any]]:
        return [m.view(now) for m in list(self.tables.values())]
