"""Snapshots: existing rows as ``op = r`` events. Pure parts: COPY text parsing (``copy``), the DBLog chunk
window (``window``), snapshot-xid visibility (``xids``), persisted progress (``state``), progress meters
(``meter``) and the orchestration (``runner``); the reading itself, over psycopg, is ``reader``. The rows go to
the sink as ``cdcd.batches.SnapshotBatch``."""
