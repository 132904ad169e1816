"""Snapshots: existing rows as ``op = r`` events. Pure parts: COPY text parsing (``copy``), the DBLog chunk
window (``window``), snapshot-xid visibility (``xids``), persisted progress (``state``) and the orchestration
(``runner``); the reading itself is in ``cdcd.source.snapshot``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from cdcd.pgoutput.messages import Relation, Row


@dataclass(frozen=True)
class SnapshotBatch:
    """Rows of one table to write as ``r`` events at stream position ``lsn``.

    ``lsn``: the slot's consistent point (initial snapshot) or the chunk's high watermark (incremental), so
    that ordering events by (commit LSN, LSN) puts snapshot rows after everything they already contain.
    ``first``/``last``: the first or last row of the whole initial snapshot gets ``source.snapshot`` first/last.
    ``done``: called once every row is acknowledged.
    """

    relation: Relation
    rows: Sequence[Row]
    lsn: int
    ts_us: int
    marker: Literal["true", "incremental"]
    first: bool = False
    last: bool = False
    done: Callable[[], None] | None = None

    def row_marker(self, index: int) -> str:
        """``source.snapshot`` of row ``index``: first or last at the ends of the whole initial snapshot."""
        if index == 0 and self.first:
            return "first"
        if self.last and index == len(self.rows) - 1:
            return "last"
        return self.marker
