"""The primary of a standby source (``source.primary_dsn``): where cdcd writes what the standby cannot.

One connection, made when first needed and again after it was lost; queries within the source's deadline. A
lost primary is a lost source (the session reconnects); a refused query stops cdcd.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

from cdcd.config import SourceSettings
from cdcd.lsn import parse_lsn
from cdcd.source.walsender import SourceDisconnected, SourceError, Timeouts, connect, first_line

T = TypeVar("T")
Conn = psycopg.Connection[Any]


class Primary:
    """``source.primary_dsn``; the password from ``source.password_file`` when there is one (the same roles)."""

    def __init__(self, settings: SourceSettings) -> None:
        assert settings.primary_dsn is not None
        self._settings = settings
        self._dsn = settings.primary_dsn.get_secret_value()
        self._timeouts = Timeouts.of(settings, statements=True)
        self._conn: Conn | None = None

    @classmethod
    def of(cls, settings: SourceSettings) -> Primary | None:
        return None if settings.primary_dsn is None else cls(settings)

    def connect(self) -> Conn:
        """A new connection to the primary (the caller closes it)."""
        try:
            return connect(self._dsn, self._settings.read_password(), self._timeouts)
        except SourceError as exc:  # connect names source.dsn: this is the other one
            raise SourceError(str(exc).replace("source.dsn", "source.primary_dsn")) from None
        except SourceDisconnected as exc:
            raise SourceDisconnected(f"primary (source.primary_dsn): {exc}") from None

    def run(self, what: str, query: Callable[[Conn], T]) -> T:
        """``query`` on the primary's connection, within the deadline; ``what`` names it in errors."""
        if self._conn is None or self._conn.closed:
            self._conn = self.connect()
        conn = self._conn
        try:
            with self._timeouts.deadline(conn):
                return query(conn)
        except psycopg.OperationalError as exc:
            conn.close()
            raise SourceDisconnected(f"{what} on the primary failed: {first_line(exc)}") from None
        except psycopg.Error as exc:
            raise SourceError(f"{what} on the primary failed: {first_line(exc)}") from None

    def emit(self, prefix: str, content: str) -> int:
        """A non-transactional logical decoding message, flushed at once (the commit of a transaction with an xid
        and synchronous_commit on flushes the WAL, instead of the WAL writer's next round); its end LSN."""

        def emit(conn: Conn) -> int:
            with conn.transaction():
                row = conn.execute("SELECT pg_logical_emit_message(false, %s, %s)::text", [prefix, content]).fetchone()
                conn.execute("SET LOCAL synchronous_commit = on")
                conn.execute("SELECT pg_current_xact_id()")
            assert row is not None
            return parse_lsn(row[0])

        return self.run("writing a logical decoding message", emit)

    def execute(self, what: str, query: str) -> None:
        self.run(what, lambda conn: conn.execute(query.encode()))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None
