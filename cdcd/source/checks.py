"""``cdcd check``: everything about the source database that would stop streaming, found in one pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from cdcd.config import ConfigError, SourceSettings
from cdcd.source import failover
from cdcd.source.catalog import prepare_filters
from cdcd.source.walsender import SourceDisconnected, SourceError, connect


@dataclass
class Findings:
    problems: list[str] = field(default_factory=list)  # the server is not ready
    config_errors: list[str] = field(default_factory=list)  # the config cannot work with this database
    warnings: list[str] = field(default_factory=list)


def check_source(settings: SourceSettings) -> Findings:
    """Every problem found (none when the source is ready)."""
    try:
        conn = connect(settings.dsn.get_secret_value(), settings.read_password())
    except ConfigError as exc:
        return Findings(config_errors=[str(exc)])
    except (SourceDisconnected, SourceError) as exc:
        return Findings([str(exc)])
    with conn:
        findings = Findings()
        for check in (_server, _role, _publications, _slot):
            findings.problems.extend(check(conn, settings))
        _, report = prepare_filters(conn, settings.publications)
        findings.config_errors, findings.warnings = report.errors, report.warnings
        try:
            findings.warnings.extend(failover.readiness(conn, settings))
        except ConfigError as exc:
            findings.config_errors.append(str(exc))
        return findings


def _one(conn: psycopg.Connection[Any], query: str, params: list[Any] | None = None) -> Any:
    row = conn.execute(query, params).fetchone()
    return row[0] if row else None


def _server(conn: psycopg.Connection[Any], settings: SourceSettings) -> list[str]:
    problems = []
    wal_level = _one(conn, "SHOW wal_level")
    if wal_level != "logical":
        problems.append(f"wal_level is {wal_level!r}; set wal_level = logical and restart PostgreSQL")
    if int(_one(conn, "SHOW max_replication_slots")) < 1:
        problems.append("max_replication_slots is 0; raise it and restart PostgreSQL")
    if int(_one(conn, "SHOW max_wal_senders")) < 1:
        problems.append("max_wal_senders is 0; raise it and restart PostgreSQL")
    encoding = conn.info.parameter_status("server_encoding")
    if encoding not in ("UTF8", "SQL_ASCII", "LATIN1", "WIN1252", "EUC_JP"):
        problems.append(f"database encoding {encoding} is not supported (use UTF8)")
    return problems


def _role(conn: psycopg.Connection[Any], settings: SourceSettings) -> list[str]:
    row = conn.execute("SELECT rolreplication, rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    if row is None or not (row[0] or row[1]):
        return [f"role {conn.info.user!r} lacks the REPLICATION attribute (ALTER ROLE ... REPLICATION)"]
    return []


def _publications(conn: psycopg.Connection[Any], settings: SourceSettings) -> list[str]:
    problems = []
    for publication in settings.publications:
        exists = _one(conn, "SELECT count(*) FROM pg_publication WHERE pubname = %s", [publication.name])
        if not exists and not settings.manage_publications:
            problems.append(f"publication {publication.name!r} does not exist (create it or set manage_publications)")
        for table in publication.tables:
            problems.extend(_table(conn, table.name))
    names = [p.name for p in settings.publications]
    unreadable = conn.execute(
        "SELECT DISTINCT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = ANY(%s)"
        " AND NOT has_table_privilege(quote_ident(schemaname) || '.' || quote_ident(tablename), 'SELECT')",
        [names],
    ).fetchall()
    problems.extend(f"no SELECT privilege on published table {r[0]}" for r in unreadable)
    return problems


def _table(conn: psycopg.Connection[Any], name: str) -> list[str]:
    schema, table = name.split(".")
    found = _one(
        conn,
        "SELECT c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
        [schema, table],
    )
    if found is None:
        return [f"table {name} does not exist"]
    if found == "n":
        return [f"table {name} has REPLICA IDENTITY NOTHING: updates and deletes cannot be captured"]
    return []


def _slot(conn: psycopg.Connection[Any], settings: SourceSettings) -> list[str]:
    row = conn.execute(
        "SELECT plugin, database, active, active_pid FROM pg_replication_slots WHERE slot_name = %s", [settings.slot]
    ).fetchone()
    if row is None:
        return [] if settings.create_slot else [f"slot {settings.slot!r} does not exist and create_slot is false"]
    plugin, database, active, pid = row
    problems = []
    if plugin != "pgoutput":
        problems.append(f"slot {settings.slot!r} uses plugin {plugin!r}, not pgoutput")
    if database != conn.info.dbname:
        problems.append(f"slot {settings.slot!r} belongs to database {database!r}, not {conn.info.dbname!r}")
    if active:
        problems.append(f"slot {settings.slot!r} is active: another consumer (pid {pid}) is streaming from it")
    return problems
