"""``cdcd check``: everything about the source database that would stop streaming, found in one pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from cdcd.config import ConfigError, SourceSettings
from cdcd.source import failover
from cdcd.source.catalog import candidate_tables, implied_tables, prepare_filters, version_refusals
from cdcd.source.standby import Writes, in_recovery, refusals
from cdcd.source.walsender import SourceDisconnected, SourceError, connect, first_line


@dataclass
class Findings:
    problems: list[str] = field(default_factory=list)  # the server is not ready
    config_errors: list[str] = field(default_factory=list)  # the config cannot work with this database
    warnings: list[str] = field(default_factory=list)


def check_source(settings: SourceSettings, writes: Writes | None = None) -> Findings:
    """Every problem found (none when the source is ready). ``writes``: what the rest of the configuration writes
    to the source (refused on a standby without ``source.primary_dsn``)."""
    try:
        conn = connect(settings.dsn.get_secret_value(), settings.read_password())
    except ConfigError as exc:
        return Findings(config_errors=[str(exc)])
    except (SourceDisconnected, SourceError) as exc:
        return Findings([str(exc)])
    with conn:
        findings = Findings()
        for what, check in CHECKS:
            try:
                findings.problems.extend(check(conn, settings))
            except psycopg.Error as exc:  # e.g. a catalog the role may not read: named, never a traceback
                findings.problems.append(f"cannot check {what}: {first_line(exc)}")
        try:
            _, report = prepare_filters(conn, settings.publications)
        except psycopg.Error as exc:
            findings.problems.append(f"cannot check the row filters: {first_line(exc)}")
        else:
            findings.config_errors, findings.warnings = report.errors, report.warnings
        if settings.manage_publications:
            findings.config_errors.extend(version_refusals(settings.publications, conn.info.server_version))
        try:
            standby = in_recovery(conn)
        except psycopg.Error as exc:
            findings.problems.append(f"cannot check whether the server is a standby: {first_line(exc)}")
            return findings
        if standby:
            findings.config_errors.extend(refusals(settings, conn.info.server_version, writes or Writes()))
            findings.warnings.extend(_standby_warnings(conn))
            return findings  # a slot made on a standby is no failover slot
        try:
            findings.warnings.extend(failover.readiness(conn, settings))
        except ConfigError as exc:
            findings.config_errors.append(str(exc))
        except psycopg.Error as exc:
            findings.warnings.append(f"cannot check whether the slot survives a failover: {first_line(exc)}")
        return findings


def _standby_warnings(conn: psycopg.Connection[Any]) -> list[str]:
    """What a standby needs for its slot to keep working (docs/operations.md: Capturing from a standby)."""
    warnings = []
    if _one(conn, "SHOW hot_standby_feedback") != "on":
        warnings.append(
            "hot_standby_feedback is off on the standby: the primary may remove catalog rows the slot needs, and"
            " the slot is then invalidated (rows_removed)"
        )
    if not _one(conn, "SHOW primary_slot_name"):
        warnings.append(
            "primary_slot_name is not set on the standby: without a physical slot on the primary,"
            " hot_standby_feedback does not hold the catalog rows while the standby is disconnected"
        )
    return warnings


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
        if settings.manage_publications and publication.has_patterns:
            # the tables its patterns match now: cdcd adds them to the publication when it starts
            for name in implied_tables(publication, candidate_tables(conn), conn.info.server_version):
                problems.extend(_table(conn, name))
    names = settings.publication_names
    for table, schema_usage, select in conn.execute(_PRIVILEGES, [names]).fetchall():
        if not schema_usage:
            problems.append(f"no USAGE privilege on the schema of published table {table}")
        if not select:
            problems.append(f"no SELECT privilege on published table {table}")
    return problems


# The published tables first (materialized), then their privileges by oid: a check by name could run on any
# row of pg_class the plan scans first (pg_toast's included: "permission denied for schema pg_toast"), and the
# oid forms never raise for a missing privilege.
_PRIVILEGES = """
WITH published AS MATERIALIZED (
    SELECT DISTINCT schemaname, tablename FROM pg_publication_tables WHERE pubname = ANY(%s)
)
SELECT p.schemaname || '.' || p.tablename, has_schema_privilege(n.oid, 'USAGE'), has_table_privilege(c.oid, 'SELECT')
FROM published p
JOIN pg_namespace n ON n.nspname = p.schemaname
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename
WHERE NOT (has_schema_privilege(n.oid, 'USAGE') AND has_table_privilege(c.oid, 'SELECT'))
ORDER BY 1
"""


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


CHECKS = (
    ("the server settings", _server),
    ("the role", _role),
    ("the publications", _publications),
    ("the replication slot", _slot),
)
