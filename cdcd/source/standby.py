"""Capture from a hot standby (PostgreSQL 16+): the standby decodes its own WAL, but takes no writes.

Whatever cdcd would write besides its slot is refused there with a configuration error naming the setting, or
written on the primary through ``source.primary_dsn`` (``cdcd.source.primary``): a logical message emitted on the
primary reaches the standby's WAL, and so the stream, once the standby has replayed it. A slot created on a
standby waits for a running-xacts record from the primary; ``pg_log_standby_snapshot()`` there writes one now.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
import structlog

from cdcd.config import ConfigError, Settings, SourceSettings
from cdcd.lsn import format_lsn

log = structlog.get_logger("cdcd.source")

STANDBY_VERSION = 160000  # logical decoding on a standby
INCREMENTAL_NEEDS_PRIMARY = (
    "incremental snapshots on a standby need snapshot.read_only: true (watermarks that write nothing) or"
    " source.primary_dsn (watermarks written on the primary as logical messages, which reach the standby's WAL)"
)
NUDGE_INTERVAL_S = 1.0  # how often a slot being created on the standby asks the primary for a running-xacts record


def in_recovery(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server is a standby (in recovery)."""
    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    return bool(row and row[0])


@dataclass(frozen=True)
class Writes:
    """What the configuration would write to the source outside the source section, by setting."""

    action_query: bool = False  # kafka.heartbeat.action_query
    signals: bool = False  # signals.kafka.topic: incremental snapshots on request (none with snapshot.read_only)

    @classmethod
    def of(cls, settings: Settings) -> Writes:
        signals = settings.signals.kafka.topic is not None and not settings.snapshot.read_only
        return cls(settings.kafka.heartbeat.action_query is not None, signals)


def refusals(settings: SourceSettings, server_version: int, writes: Writes) -> list[str]:
    """What the configuration asks of a standby that it cannot do; none when it fits."""
    problems = []
    if server_version < STANDBY_VERSION:
        problems.append(
            f"logical decoding on a standby needs PostgreSQL 16 or later, the server is {server_version // 10000}:"
            " point source.dsn at the primary"
        )
    if settings.failover:
        problems.append(
            "source.failover is true, but a slot created on a standby cannot be a failover slot (set it false or"
            " leave it unset: cdcd enables it if the standby is promoted)"
        )
    if settings.primary_dsn is not None:
        return problems
    if settings.manage_publications:
        problems.append(
            "source.manage_publications is true: create the publications on the primary (they reach the standby),"
            " or set source.primary_dsn for cdcd to manage them there"
        )
    if writes.action_query:
        problems.append("kafka.heartbeat.action_query writes: set source.primary_dsn to run it on the primary")
    if writes.signals:
        problems.append(f"signals.kafka.topic asks for {INCREMENTAL_NEEDS_PRIMARY}")
    return problems


def check_standby(settings: SourceSettings, server_version: int, writes: Writes) -> None:
    """Raise ConfigError listing what the configuration asks of the standby ``source.dsn`` that it cannot do."""
    problems = refusals(settings, server_version, writes)
    if problems:
        raise ConfigError("source.dsn is a hot standby, which takes no writes:\n  - " + "\n  - ".join(problems))


def wait_replayed(conn: psycopg.Connection[Any], lsn: int, poll_s: float = 0.01) -> bool:
    """Wait until the standby on ``conn`` has replayed the WAL up to ``lsn`` (what the primary wrote before it is
    then visible there): True; False when the server is no longer a standby (promoted: it never will)."""
    query = "SELECT pg_is_in_recovery(), coalesce(pg_last_wal_replay_lsn() >= %s::pg_lsn, false)"
    while True:
        row = conn.execute(query, [format_lsn(lsn)]).fetchone()
        assert row is not None
        recovering, replayed = row
        if replayed or not recovering:
            return bool(replayed)
        time.sleep(poll_s)


class Connects(Protocol):
    def connect(self) -> psycopg.Connection[Any]: ...


class Nudger:
    """While a slot is created on the standby: ``pg_log_standby_snapshot()`` on the primary every second, so the
    running-xacts record the slot waits for comes now (the primary writes one by itself every 15 s, and only when
    it was not idle). In a thread of its own, on a connection of its own; best effort: a failure is logged."""

    def __init__(self, primary: Connects) -> None:
        self._primary = primary
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="standby-snapshot", daemon=True)

    def __enter__(self) -> Nudger:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            conn = self._primary.connect()
        except Exception as exc:  # whatever it is, the slot's creation waits on regardless: said once
            log.warning("cannot ask the primary for a running-xacts record", error=str(exc))
            return
        with conn:
            while True:
                try:
                    conn.execute("SELECT pg_log_standby_snapshot()")
                except psycopg.Error as exc:
                    log.warning("cannot ask the primary for a running-xacts record", error=str(exc).strip())
                    return
                if self._done.wait(NUDGE_INTERVAL_S):
                    return
