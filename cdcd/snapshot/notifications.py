"""Debezium's snapshot notifications (``notifications.kafka.topic``): what a snapshot tells its watchers. Pure.

A notification is Debezium's record: ``id``, ``aggregate_type`` (``Incremental Snapshot`` or
``Initial Snapshot``), ``type`` (STARTED, IN_PROGRESS, TABLE_SCAN_COMPLETED, COMPLETED, ABORTED, PAUSED,
RESUMED), ``additional_data`` (a string map: ``connector_name``, ``data_collections`` comma-separated,
``current_collection_in_progress``, ``last_processed_key``, ``scanned_collection``, ``total_rows_scanned``,
``status``; cdcd adds ``estimated_rows`` where the planner's estimate is known) and ``timestamp`` (ms).
An incremental snapshot's notifications carry its id (the signal's id: Debezium's correlation id); the
initial snapshot's, the id of that snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cdcd.batches import Notification

__all__ = ["INCREMENTAL", "INITIAL", "Notices", "Notification"]

INCREMENTAL = "Incremental Snapshot"
INITIAL = "Initial Snapshot"


Notify = Callable[[Notification], None]


def _key(values: Sequence[str | None] | None) -> str:
    """A chunk key as Debezium shows one: its values comma-separated, ``<null>`` for a null."""
    if values is None:
        return "<none>"
    return ",".join("<null>" if v is None else v for v in values)


@dataclass
class Notices:
    """Makes notifications for one connector and keeps them until ``take`` (the loop writes them to the sink at a
    point where writing is safe: never from inside a sink's acknowledgement)."""

    connector: str
    clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000
    pending: list[Notification] = field(default_factory=list)

    def take(self) -> list[Notification]:
        out, self.pending = self.pending, []
        return out

    def _add(self, snapshot_id: str, aggregate: str, kind: str, data: dict[str, str]) -> None:
        self.pending.append(
            Notification(snapshot_id, aggregate, kind, {**data, "connector_name": self.connector}, self.clock_ms())
        )

    # -- incremental ------------------------------------------------------------------------------

    def started(self, snapshot_id: str, tables: Sequence[str]) -> None:
        self._add(snapshot_id, INCREMENTAL, "STARTED", {"data_collections": ",".join(tables)})

    def in_progress(
        self,
        snapshot_id: str,
        tables: Sequence[str],
        table: str,
        last_key: Sequence[str | None] | None,
        *,
        rows: int,
        estimated: int | None,
    ) -> None:
        data = {
            "data_collections": ",".join(tables),
            "current_collection_in_progress": table,
            "last_processed_key": _key(last_key),
            "total_rows_scanned": str(rows),
        }
        if estimated is not None:
            data["estimated_rows"] = str(estimated)
        self._add(snapshot_id, INCREMENTAL, "IN_PROGRESS", data)

    def table_done(self, snapshot_id: str, tables: Sequence[str], table: str, rows: int, status: str) -> None:
        """TABLE_SCAN_COMPLETED; ``status``: SUCCEEDED, EMPTY (no rows), NO_PRIMARY_KEY (not snapshotted)."""
        data = {
            "data_collections": ",".join(tables),
            "scanned_collection": table,
            "total_rows_scanned": str(rows),
            "status": status,
        }
        self._add(snapshot_id, INCREMENTAL, "TABLE_SCAN_COMPLETED", data)

    def completed(self, snapshot_id: str) -> None:
        self._add(snapshot_id, INCREMENTAL, "COMPLETED", {})

    def aborted(self, snapshot_id: str, tables: Sequence[str]) -> None:
        self._add(snapshot_id, INCREMENTAL, "ABORTED", {"data_collections": ",".join(tables)} if tables else {})

    def paused(self, snapshot_id: str, tables: Sequence[str]) -> None:
        self._add(snapshot_id, INCREMENTAL, "PAUSED", {"data_collections": ",".join(tables)})

    def resumed(self, snapshot_id: str, tables: Sequence[str]) -> None:
        self._add(snapshot_id, INCREMENTAL, "RESUMED", {"data_collections": ",".join(tables)})

    # -- initial ----------------------------------------------------------------------------------

    def initial(self, snapshot_id: str, kind: str, data: dict[str, str] | None = None) -> None:
        """An initial snapshot's STARTED, IN_PROGRESS, TABLE_SCAN_COMPLETED, COMPLETED or ABORTED."""
        self._add(snapshot_id, INITIAL, kind, data or {})
