"""The server's WAL position now, read without writing anything: the bound of a read-only snapshot window.

Every transaction a snapshot taken before this call sees has its commit record before the position returned
(``cdcd.snapshot.window``). On a primary that is the insert position (``pg_current_wal_insert_lsn``), not
``pg_current_wal_lsn``, the *write* position: a transaction committed with ``synchronous_commit = off`` is
visible before its commit record is written out. On a standby (``pg_is_in_recovery()``) it is the replay
position (``pg_last_wal_replay_lsn``): a standby's snapshot sees a transaction once its commit is replayed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

_SHORT_PAGE_HEADER, _LONG_PAGE_HEADER = 24, 40  # SizeOfXLogShortPHD, SizeOfXLogLongPHD (MAXALIGNed)

_POSITION = (
    "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_insert_lsn() END"
    " - '0/0'::pg_lsn, current_setting('wal_block_size')::int, pg_size_bytes(current_setting('wal_segment_size'))"
)


def wal_position(conn: psycopg.Connection[Any]) -> int:
    """The WAL position up to which everything committed (visible to snapshots taken before) was written."""
    row = conn.execute(_POSITION).fetchone()
    if row is None or row[0] is None:
        raise ValueError("the server reports no WAL position (a standby that replayed nothing yet)")
    return record_end(int(row[0]), int(row[1]), int(row[2]))


def record_end(position: int, block_size: int, segment_size: int) -> int:
    """``position`` as the end of the record before it. At a page boundary the insert position points past the
    page's header, where the next record will start, while the walsender reports the end of the last record
    read: the page boundary itself. Without this, an idle server's keepalives would never reach the position."""
    if position % segment_size == _LONG_PAGE_HEADER:
        return position - _LONG_PAGE_HEADER
    if position % block_size == _SHORT_PAGE_HEADER:
        return position - _SHORT_PAGE_HEADER
    return position
