"""The walsender connection: slot and publication management, START_REPLICATION, COPY BOTH I/O.

This is the only place that talks the replication protocol over the network (psycopg 3, through
``conn.pgconn``). It hands raw CopyData frames to the caller and sends back standby status updates.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
import structlog
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cdcd.config import ConfigError, SourceSettings, safe_conninfo_error
from cdcd.filters.plan import FilterPlan
from cdcd.lsn import parse_lsn
from cdcd.pgoutput.messages import Relation, TableFacts, Type
from cdcd.secrets import redact
from cdcd.source.catalog import (
    Captured,
    PublicationError,
    add_new_tables,
    ancestors,
    captured,
    enum_labels,
    prepare_filters,
    sync_publications,
    table_facts,
    tables_fingerprint,
    tracks_new_tables,
)
from cdcd.source.failover import SlotSync, failover_wanted, read_slot_sync
from cdcd.source.protocol import protocol_version_for, quote_ident, start_replication_command
from cdcd.source.standby import Nudger, Writes, check_standby, in_recovery, wait_replayed

if TYPE_CHECKING:
    from cdcd.source.primary import Primary

T = TypeVar("T")
log = structlog.get_logger("cdcd.source")
_SLOT_WAIT_S = 0.2  # a slot's creation looks for a stop request and its deadline this often


def wire_encoding(server_encoding: str) -> str:
    """The Python codec of the text the walsender sends: PostgreSQL converts it to the client encoding cdcd pins
    (UTF8, ``SESSION_SETTINGS``) from any database encoding but SQL_ASCII, whose bytes it passes on as they are
    (ASCII then, and anything else is named as undecodable)."""
    return "ascii" if server_encoding == "SQL_ASCII" else "utf-8"


# wal_status of a slot whose WAL is gone, and PostgreSQL 17's invalidation_reason values
_INVALIDATED = {"lost", "wal_removed", "rows_removed", "wal_level_insufficient", "idle_timeout"}


class SourceError(RuntimeError):
    """A problem with the source database that retrying will not fix (bad slot, missing publication...)."""


class SourceDisconnected(ConnectionError):
    """The connection to the server was lost or could not be made; retrying may succeed."""


class StopRequested(Exception):
    """A stop request (SIGTERM) ended a wait on the server."""


class SlotActive(SourceDisconnected):
    """The slot is held by another connection: after a lost connection, usually this process's own earlier
    walsender, which the server keeps until its wal_sender_timeout notices; retried with backoff."""


@dataclass(frozen=True)
class SessionInfo:
    timeline: int
    database: str
    server_version: int
    protocol_version: int
    encoding: str  # the Python codec of the text the walsender sends (``wire_encoding``)
    slot_created: bool
    streaming: str
    filter_plan: FilterPlan
    system_id: str = ""  # IDENTIFY_SYSTEM's systemid: the database cluster, kept by physical standbys
    consistent_point: int | None = None  # where a slot created now starts
    exported_snapshot: str | None = None  # the snapshot it exported, valid until START_REPLICATION
    standby: bool = False  # the server is a hot standby (in recovery): cdcd writes nothing to it

    @property
    def parallel_streaming(self) -> bool:
        """Stream Abort carries abort LSN and timestamp only with streaming = parallel on protocol 4."""
        return self.protocol_version >= 4 and self.streaming == "parallel"


# pgoutput renders text values with the walsender session's settings: pin the ones the converters parse.
# They go last in `options`, so they win over the DSN's own, whose other settings still apply.
SESSION_SETTINGS = (
    "-c DateStyle=ISO -c IntervalStyle=postgres -c bytea_output=hex -c extra_float_digits=1 -c client_encoding=UTF8"
)


@dataclass(frozen=True)
class Timeouts:
    """How long a connection may wait on the network: a partition that swallows packets must end in an error, not
    in a read that never returns. ``receive_s``: TCP user timeout and keepalives (0: libpq's defaults);
    ``statement_s``: the server's statement_timeout (0: none)."""

    receive_s: float = 60.0
    connect_s: int = 10
    statement_s: float = 0.0

    @classmethod
    def of(cls, settings: SourceSettings, statements: bool = False) -> Timeouts:
        statement_s = settings.statement_timeout_s if statements else 0.0
        return cls(settings.receive_timeout_s, settings.connect_timeout_s, statement_s)

    @property
    def deadline_s(self) -> float:
        """How long a query may wait for the server before its connection is given up (``deadline``): past the
        server's own statement_timeout, so a server that is there answers first. 0: never."""
        return max(self.receive_s, self.statement_s) + 5 if self.receive_s else 0.0

    @contextlib.contextmanager
    def deadline(self, conn: psycopg.Connection[Any]) -> Iterator[threading.Event]:
        """Give up ``conn`` if the block still waits on it after ``deadline_s``: its socket is shut down, so the
        wait ends in an error. A partition holds packets without a word, and neither the server's
        statement_timeout nor TCP keepalives (answered by whatever sits in between) would end that wait. What it
        yields is set once the deadline passed (the error is then the deadline's)."""
        passed = threading.Event()
        seconds = self.deadline_s
        if not seconds:
            yield passed
            return
        timer = threading.Timer(seconds, _give_up, [conn.pgconn.socket, passed])
        timer.daemon = True
        timer.start()
        try:
            yield passed
        finally:
            timer.cancel()

    def apply(self, params: dict[str, Any]) -> None:
        """Set the libpq parameters the DSN does not set itself."""
        params.setdefault("connect_timeout", str(self.connect_s))
        if self.receive_s:
            params.setdefault("keepalives", "1")
            params.setdefault("keepalives_idle", str(max(1, int(self.receive_s / 4))))
            params.setdefault("keepalives_interval", str(max(1, int(self.receive_s / 12))))
            params.setdefault("keepalives_count", "3")
            params.setdefault("tcp_user_timeout", str(int(self.receive_s * 1000)))
        if self.statement_s:
            params["options"] = f"{params.get('options') or ''} -c statement_timeout={int(self.statement_s * 1000)}"


def connect(
    dsn: str, password: str | None = None, timeouts: Timeouts | None = None, **kwargs: Any
) -> psycopg.Connection[Any]:
    """A connection with the pinned session settings and network ``timeouts``; connection failures become
    SourceDisconnected. ``password`` (from source.password_file) overrides the DSN's. Error messages never quote
    the DSN."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise SourceError(f"source.dsn is not a valid connection string: {safe_conninfo_error(exc)}") from None
    (timeouts or Timeouts()).apply(params)
    params["options"] = f"{params.get('options') or ''} {SESSION_SETTINGS}".strip()
    if password is not None:
        params["password"] = password
    try:
        return psycopg.connect(make_conninfo(**params), autocommit=True, **kwargs)  # type: ignore[arg-type]
    except psycopg.ProgrammingError as exc:
        raise SourceError(f"source.dsn is not a valid connection string: {safe_conninfo_error(exc)}") from None
    except psycopg.OperationalError as exc:
        raise SourceDisconnected(f"cannot connect to PostgreSQL: {redact(first_line(exc))}") from None


class _Connecting:
    """``connect(...)`` in a thread of its own: the connection (or what it raised) when ``result`` is asked."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._made: psycopg.Connection[Any] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._connect, args=args, kwargs=kwargs, name="connect", daemon=True)
        self._thread.start()

    def _connect(self, *args: Any, **kwargs: Any) -> None:
        try:
            self._made = connect(*args, **kwargs)
        except BaseException as exc:  # handed to the thread that asks for the result
            self._error = exc

    def result(self) -> psycopg.Connection[Any]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._made is not None
        return self._made

    def discard(self) -> None:
        """Not wanted after all: closed once made (a failure to make it is of no interest then)."""
        self._thread.join()
        if self._made is not None:
            self._made.close()


def _give_up(fd: int, passed: threading.Event) -> None:
    passed.set()
    _shut_down(fd)


def _shut_down(fd: int) -> None:
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # closed meanwhile
        pass


def first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


class Walsender:
    """One replication session. Use as a context manager; ``start()`` then ``read()``/``send()``."""

    def __init__(
        self,
        settings: SourceSettings,
        push_down: bool = True,
        *,
        writes: Writes | None = None,
        primary: Primary | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        """``writes``: what the rest of the configuration would write to the source (refused on a standby without
        ``primary``); ``primary``: the standby's primary (``source.primary_dsn``), used while the source is one;
        ``stop``: set by a stop request, which ends the creation of the slot (``StopRequested``)."""
        self.settings = settings
        self.stop = stop or threading.Event()
        self.push_down = push_down
        self.writes = writes or Writes()
        self.primary = primary
        self.standby = False
        self._dsn = settings.dsn.get_secret_value()
        self._admin: psycopg.Connection[Any] | None = None
        self._repl: psycopg.Connection[Any] | None = None
        self._timeouts = Timeouts.of(settings, statements=True)
        self._tables_seen: tuple[int, int] | None = None  # tables_fingerprint when the publications were kept

    def __enter__(self) -> Walsender:
        return self

    def __exit__(self, *exc: object | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        for conn in (self._repl, self._admin):
            if conn is not None and not conn.closed:
                conn.close()
        self._repl = self._admin = None
        if self.primary is not None:
            self.primary.close()

    # -- setup --------------------------------------------------------------------------------

    def open(
        self, export_snapshot: bool = False, replace_lost: bool = False, must_exist: str | None = None
    ) -> SessionInfo:
        """Connect, ensure publications and slot. ``export_snapshot``: a slot created now exports its snapshot.
        ``replace_lost``: drop and recreate a slot PostgreSQL invalidated (its WAL is gone). ``must_exist``: the
        reason the slot should exist (a missing one is then an error, not created)."""
        password = self.settings.read_password()
        replication = _Connecting(self._dsn, password, Timeouts.of(self.settings), replication="database")
        try:  # the replication connection is made while the catalog connection checks the publications
            self._admin = admin = connect(self._dsn, password, self._timeouts)
            server_version = admin.info.server_version
            encoding = wire_encoding(admin.info.parameter_status("server_encoding") or "UTF8")
            self.standby = in_recovery(admin)
            if self.standby:  # before anything is written
                check_standby(self.settings, server_version, self.writes)
            plan = self._prepare_publications(admin)
        except BaseException:
            replication.discard()
            raise
        self._repl = replication.result()
        system = self._command("IDENTIFY_SYSTEM")
        created = self._ensure_slot(admin, server_version, export_snapshot, replace_lost, must_exist)
        proto = self.settings.protocol_version
        self._proto_version = protocol_version_for(server_version) if proto == "auto" else int(proto)
        return SessionInfo(
            timeline=int(system[1]),
            database=system[3],
            server_version=server_version,
            protocol_version=self._proto_version,
            encoding=encoding,
            slot_created=created is not None,
            streaming=self.settings.streaming,
            filter_plan=plan,
            system_id=system[0],
            consistent_point=None if created is None else parse_lsn(created[0]),
            exported_snapshot=None if created is None else created[1] or None,
            standby=self.standby,
        )

    def start_replication(self, start_lsn: int) -> None:
        """Enter COPY BOTH at ``start_lsn`` (0: the slot's confirmed position). Messages are always requested:
        snapshots use them as watermarks (the pipeline drops the user's when source.messages is off or
        source.message_prefixes leaves them out)."""
        command = start_replication_command(
            self.settings.slot,
            start_lsn,
            self._proto_version,
            self.settings.publication_names,
            streaming=self.settings.streaming,
            messages=True,
            binary=self.settings.binary,
        )
        result = self._pgconn.exec_(command.encode())
        if result.status != pq.ExecStatus.COPY_BOTH:
            raise SourceError(f"START_REPLICATION failed: {_result_error(result)}")

    def _prepare_publications(self, admin: psycopg.Connection[Any]) -> FilterPlan:
        """Check the row filters against the tables, then (when managed) make the publications match the config.
        Bad filters raise ConfigError before anything is written."""
        plan, report = prepare_filters(admin, self.settings.publications)
        if report.errors:
            raise ConfigError("row filters cannot be used:\n  - " + "\n  - ".join(report.errors))
        for warning in report.warnings:
            log.warning(warning)
        if self.settings.manage_publications:
            try:
                if self.standby:
                    self._sync_on_primary(admin)
                else:
                    self._tables_seen = tables_fingerprint(admin)  # before the tables are listed: none is missed
                    sync_publications(admin, self.settings.publications, self.push_down)
            except PublicationError as exc:
                raise SourceError(str(exc)) from None
            except psycopg.Error as exc:
                raise SourceError(f"cannot create or alter the publications: {first_line(exc)}") from None
        self._require_publications(admin)
        return plan

    def _sync_on_primary(self, admin: psycopg.Connection[Any]) -> None:
        """A standby's managed publications: made on its primary, then waited for until the standby has them."""
        primary = self._primary()

        def sync(conn: psycopg.Connection[Any]) -> int:
            self._tables_seen = tables_fingerprint(conn)
            sync_publications(conn, self.settings.publications, self.push_down)
            return parse_lsn(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])  # type: ignore[index]

        written = primary.run("managing the publications", sync)
        with self._timeouts.deadline(admin):
            if not wait_replayed(admin, written):
                raise SourceDisconnected("the standby was promoted while cdcd managed the publications")

    def _primary(self) -> Primary:
        """The primary, where cdcd writes while the source is a standby (``check_standby`` refused a
        configuration that would write without one). A standby promoted meanwhile (its walsender goes on) is
        written to directly from the next session on: what went to the old primary would never reach it."""
        if self.primary is None:
            raise ConfigError("source.dsn is a hot standby, which takes no writes: set source.primary_dsn")
        if not self._catalog(in_recovery):
            raise SourceDisconnected("the standby was promoted: starting a new session, which writes to it directly")
        return self.primary

    def ancestors(self, relation: Relation) -> list[str]:
        """Partition ancestors of a replicated relation (for the row filters), from the catalog connection."""
        return self._catalog(lambda conn: ancestors(conn, relation.relation_id))

    def describe(self, relation: Relation) -> TableFacts:
        """The catalog's facts of a replicated relation that pgoutput does not send (its primary key, NOT NULL
        columns), read from the catalog connection when its Relation message arrives."""
        return self._catalog(lambda conn: table_facts(conn, relation.relation_id))

    def labels(self, type_: Type) -> tuple[str, ...] | None:
        """The labels of an enum type (None for other types), when its Type message arrives."""
        return self._catalog(lambda conn: enum_labels(conn, type_.type_oid))

    def _catalog(self, query: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``query`` on the catalog connection while streaming; a failure is a lost source (reconnect)."""
        if self._admin is None:
            raise SourceDisconnected("catalog connection is not open")
        try:
            with self._timeouts.deadline(self._admin):
                return query(self._admin)
        except psycopg.Error as exc:
            raise SourceDisconnected(f"catalog query failed: {first_line(exc)}") from None

    def captured(self) -> Captured:
        """What the publications capture now (catalog connection)."""
        return self._catalog(lambda conn: captured(conn, self.settings.publication_names))

    def drop_slot(self) -> None:
        """Drop the slot (one this session created and cannot use); a failure is logged: the slot stays."""
        try:
            self._command(f"DROP_REPLICATION_SLOT {quote_ident(self.settings.slot)}", pq.ExecStatus.COMMAND_OK)
        except (SourceError, SourceDisconnected, psycopg.Error) as exc:
            log.error("cannot drop the slot created now", slot=self.settings.slot, error=first_line(exc))
            return
        log.warning("dropped the slot created now: its snapshot plan could not be saved", slot=self.settings.slot)

    @property
    def tracks_new_tables(self) -> bool:
        """cdcd keeps the table list of a managed publication (patterns, or schemas on PostgreSQL 14)."""
        if self._admin is None or not self.settings.manage_publications:
            return False
        version = self._admin.info.server_version
        return any(tracks_new_tables(p, version) for p in self.settings.publications)

    def add_new_tables(self) -> list[str]:
        """Tables created (renamed, moved) since the last look that the managed publications capture, added to them
        now. The catalog's tables are listed only when their fingerprint changed. A table the server refuses to
        add (e.g. not owned by cdcd's role) stops cdcd, as it would at start."""
        if self.standby:
            return self._primary().run("adding new tables to the publications", self._add_new_tables)
        if self._admin is None:
            raise SourceDisconnected("catalog connection is not open")
        try:
            with self._timeouts.deadline(self._admin):
                return self._add_new_tables(self._admin)
        except psycopg.OperationalError as exc:
            raise SourceDisconnected(f"catalog query failed: {first_line(exc)}") from None
        except psycopg.Error as exc:
            raise SourceError(f"cannot add a new table to the publications: {first_line(exc)}") from None

    def _add_new_tables(self, conn: psycopg.Connection[Any]) -> list[str]:
        seen = tables_fingerprint(conn)
        if seen == self._tables_seen:
            return []
        added = add_new_tables(conn, self.settings.publications)
        self._tables_seen = seen
        return added

    def run_action(self, query: str) -> None:
        """Run the heartbeat's action query (``kafka.heartbeat.action_query``) on the catalog connection, within
        its deadline (on a standby: on its primary). A lost connection is a lost source (reconnect); a query the
        server refuses stops cdcd."""
        if self.standby:
            self._primary().execute("kafka.heartbeat.action_query", query)
            return
        if self._admin is None:
            raise SourceDisconnected("catalog connection is not open")
        try:
            with self._timeouts.deadline(self._admin):
                self._admin.execute(query.encode())
        except psycopg.OperationalError as exc:
            raise SourceDisconnected(f"heartbeat action query failed: {first_line(exc)}") from None
        except psycopg.Error as exc:
            raise SourceError(f"kafka.heartbeat.action_query failed: {first_line(exc)}") from None

    def slot_retained_wal(self) -> int | None:
        """Bytes of WAL the server keeps for the slot (on a standby: from what it replayed; None when it cannot
        tell)."""
        if self._admin is None:
            return None
        try:
            with self._timeouts.deadline(self._admin):
                row = self._admin.execute(
                    "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END"
                    " - restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = %s",
                    [self.settings.slot],
                ).fetchone()
        except psycopg.Error as exc:  # a lost connection shows at the next catalog query or replication read
            log.debug("cannot read the slot's retained WAL", error=first_line(exc))
            return None
        return None if row is None or row[0] is None else int(row[0])

    @property
    def _pgconn(self) -> pq.abc.PGconn:
        if self._repl is None:
            raise SourceDisconnected("replication connection is not open")
        return self._repl.pgconn

    def _command(self, command: str, ok: pq.ExecStatus = pq.ExecStatus.TUPLES_OK) -> list[str]:
        """Run a replication command: its first row (none for a command whose ``ok`` status is COMMAND_OK)."""
        return self._row(command, self._pgconn.exec_(command.encode()), ok)

    def _row(self, command: str, result: pq.abc.PGresult | None, ok: pq.ExecStatus) -> list[str]:
        """The first row of ``command``'s ``result`` (none for a command whose ``ok`` status is COMMAND_OK)."""
        if result is None:
            raise SourceDisconnected(
                f"{command.split(maxsplit=1)[0]} got no result: {self._pgconn.get_error_message()}"
            )
        if result.status != ok:
            raise SourceError(f"{command.split(maxsplit=1)[0]} failed: {_result_error(result)}")
        return [(v or b"").decode() for v in (result.get_value(0, i) for i in range(result.nfields))]

    def _require_publications(self, admin: psycopg.Connection[Any]) -> None:
        names = self.settings.publication_names
        rows = admin.execute("SELECT pubname FROM pg_publication WHERE pubname = ANY(%s)", [names]).fetchall()
        missing = sorted(set(names) - {r[0] for r in rows})
        if missing:
            hint = "" if self.settings.manage_publications else " (create them, or set source.manage_publications)"
            raise SourceError(f"publication(s) {', '.join(missing)} do not exist{hint}")

    def _ensure_slot(
        self,
        admin: psycopg.Connection[Any],
        server_version: int,
        export: bool,
        replace_lost: bool,
        must_exist: str | None,
    ) -> tuple[str, str] | None:
        """The slot exists and fits, or is created now: then (consistent point, exported snapshot name)."""
        slot = self.settings.slot
        # 17+: a slot invalidated for another reason (e.g. a synced slot's rows removed) is as lost
        status = "coalesce(invalidation_reason, wal_status)" if server_version >= 170000 else "wal_status"
        row = admin.execute(
            f"SELECT plugin, slot_type, database, active, active_pid, {status} FROM pg_replication_slots"
            " WHERE slot_name = %s",
            [slot],
        ).fetchone()
        if row is not None:
            plugin, slot_type, database, active, active_pid, wal_status = row
            if slot_type != "logical" or plugin != "pgoutput":
                raise SourceError(
                    f"slot {slot!r} exists but is a {slot_type} slot with plugin {plugin!r}, not pgoutput"
                )
            if database != admin.info.dbname:
                raise SourceError(f"slot {slot!r} belongs to database {database!r}, not {admin.info.dbname!r}")
            if active:
                raise SlotActive(
                    f"slot {slot!r} is active: another connection (pid {active_pid}) is streaming from it (a lost"
                    " connection of this process the server has not noticed yet, or another consumer)"
                )
            if wal_status not in _INVALIDATED:
                self._refuse_synced(admin)
                self._set_failover(server_version)
                return None
            if not replace_lost:
                raise SourceError(
                    f"slot {slot!r} was invalidated ({_why(wal_status)}): the changes it held are gone. Set"
                    " snapshot.mode: when_needed to replace it with a new slot and snapshot, or drop it"
                )
            log.error(
                "slot was invalidated: the changes it held are gone; dropping it, creating a new one and snapshotting",
                slot=slot,
                reason=wal_status,
            )
            admin.execute("SELECT pg_drop_replication_slot(%s)", [slot])
        elif must_exist is not None:
            raise SourceError(
                f"slot {slot!r} no longer exists, though {must_exist}: the changes it held are lost. Set"
                " snapshot.mode: when_needed to create a new slot and snapshot again"
            )
        if not self.settings.create_slot:
            raise SourceError(f"slot {slot!r} does not exist and source.create_slot is false")
        temporary = " TEMPORARY" if self.settings.temporary_slot else ""
        failover = ", FAILOVER" if failover_wanted(self.settings, server_version, self.standby) else ""
        if server_version >= 150000:
            snapshot = f" (SNAPSHOT '{'export' if export else 'nothing'}'{failover})"
        else:
            snapshot = " EXPORT_SNAPSHOT" if export else " NOEXPORT_SNAPSHOT"
        command = f"CREATE_REPLICATION_SLOT {quote_ident(slot)}{temporary} LOGICAL pgoutput{snapshot}"
        if not self.standby:
            created = self._create_slot(command)
            return created[1], created[2]
        log.info(
            "creating the slot on a standby: it waits for a running-xacts record from the primary",
            slot=slot,
            asking_primary=self.primary is not None,  # else the primary's own, every 15 s unless it is idle
        )
        with Nudger(self.primary) if self.primary is not None else contextlib.nullcontext():
            created = self._create_slot(command)
        return created[1], created[2]

    def _create_slot(self, command: str) -> list[str]:
        """CREATE_REPLICATION_SLOT's row. It waits for the transactions running on the server to end (on a
        standby, for a running-xacts record from the primary): a stop request or ``source.slot_create_timeout_s``
        cancels it (PostgreSQL's cancel, which also drops the slot begun)."""
        pgconn, limit = self._pgconn, self.settings.slot_create_timeout_s
        deadline = time.monotonic() + limit if limit else float("inf")
        try:
            pgconn.send_query(command.encode())
            while pgconn.is_busy():
                if self.stop.is_set() or time.monotonic() >= deadline:
                    self._cancel_slot(limit)
                if select.select([pgconn.socket], [], [], _SLOT_WAIT_S)[0]:
                    pgconn.consume_input()
        except psycopg.Error as exc:
            raise SourceDisconnected(f"replication connection lost: {first_line(exc)}") from None
        result = pgconn.get_result()
        while pgconn.get_result() is not None:  # the command's end
            pass
        return self._row(command, result, pq.ExecStatus.TUPLES_OK)

    def _cancel_slot(self, limit: float) -> None:
        """Cancel the slot's creation: for a stop request (``StopRequested``) or past ``limit`` (retried)."""
        assert self._repl is not None
        with contextlib.suppress(psycopg.Error):  # a connection that is lost ends the command anyway
            self._repl.cancel_safe(timeout=5)
        if self.stop.is_set():
            raise StopRequested
        raise SourceDisconnected(
            f"CREATE_REPLICATION_SLOT did not finish within {limit:g} s (source.slot_create_timeout_s): it waits for"
            " the transactions running on the server to end (on a standby, for the primary's running-xacts record)"
        )

    def _refuse_synced(self, admin: psycopg.Connection[Any]) -> None:
        """On a standby, a slot of this name synchronized from the primary cannot be read (PostgreSQL refuses)."""
        if not self.standby or admin.info.server_version < 170000:
            return
        found = read_slot_sync(admin, self.settings.slot)
        if found is not None and found.synced:
            raise SourceError(
                f"slot {self.settings.slot!r} on the standby is a failover slot synchronized from the primary (that"
                " of a consumer of the primary): it cannot be read on the standby; set another source.slot"
            )

    def _set_failover(self, server_version: int) -> None:
        """Give an existing slot the failover setting the config asks for (17+)."""
        if server_version < 170000 or self._admin is None:
            return
        wanted, slot = failover_wanted(self.settings, server_version, self.standby), self.settings.slot
        found = read_slot_sync(self._admin, slot)
        if found is not None and found.failover != wanted and not found.synced:
            self._command(
                f"ALTER_REPLICATION_SLOT {quote_ident(slot)} (FAILOVER {str(wanted).lower()})", pq.ExecStatus.COMMAND_OK
            )
            log.info("slot failover setting changed", slot=slot, failover=wanted)

    def slot_sync(self) -> SlotSync | None:
        """The slot's failover state (17+; None when it does not exist)."""
        if self._admin is None:
            raise SourceDisconnected("catalog connection is not open")
        return read_slot_sync(self._admin, self.settings.slot)

    def timeline_history(self, timeline: int) -> str:
        """The history file of ``timeline`` (where each earlier timeline ended)."""
        return self._command(f"TIMELINE_HISTORY {int(timeline)}")[1]

    # -- streaming ----------------------------------------------------------------------------

    def read(self, timeout: float) -> list[bytes]:
        """Return the CopyData frames available now, waiting up to ``timeout`` seconds for the first."""
        pgconn = self._pgconn
        frames: list[bytes] = []
        try:
            while True:
                size, data = pgconn.get_copy_data(1)
                if size > 0:
                    frames.append(bytes(data))
                    continue
                if size < 0:
                    self._copy_ended(pgconn)
                if frames:
                    return frames
                if not select.select([pgconn.socket], [], [], timeout)[0]:
                    return frames
                pgconn.consume_input()
                timeout = 0
        except psycopg.Error as exc:
            raise SourceDisconnected(f"replication connection lost: {first_line(exc)}") from None

    def _copy_ended(self, pgconn: pq.abc.PGconn) -> None:
        result = pgconn.get_result()
        reason = _result_error(result) if result is not None else pgconn.get_error_message() or "server ended COPY"
        raise SourceDisconnected(f"replication stream ended: {reason}")

    def send(self, frame: bytes) -> None:
        pgconn = self._pgconn
        try:
            if pgconn.put_copy_data(frame) != 1 or pgconn.flush() != 0:
                raise SourceDisconnected(f"cannot send to server: {pgconn.get_error_message()}")
        except psycopg.Error as exc:
            raise SourceDisconnected(f"cannot send to server: {first_line(exc)}") from None


def _why(status: str) -> str:
    return "wal_status lost: the WAL it held was removed" if status in ("lost", "wal_removed") else status


def _result_error(result: pq.abc.PGresult) -> str:
    message = result.error_message.decode(errors="replace").strip()
    return message or f"unexpected result status {pq.ExecStatus(result.status).name}"
