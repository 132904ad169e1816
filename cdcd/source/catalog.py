"""Catalog reads and publication management on a regular (non-replication) connection.

* ``describe_tables``: columns, types, collations and replica identity, for the row-filter checks.
* ``read_publication``: the server's definition of a publication the config names without defining it.
* ``sync_publications``: with ``source.manage_publications``, create or alter each defined publication to match
  the config, row filters included on PostgreSQL 15+ (``filters.push_down``). Run in one transaction, and only
  after the filters passed their checks, so cdcd never writes a filter that would make the application's
  UPDATE or DELETE fail.
* ``ancestors``: a partition's ancestors, looked up while streaming when they decide which filters apply.
* ``table_facts``, ``enum_labels``: what pgoutput does not send of a table (primary key, NOT NULL columns) and of
  an enum type (its labels), looked up when the Relation or Type message arrives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
import structlog
from psycopg import sql

from cdcd.config import ALL_OPS, Publication, TableRef
from cdcd.filters.checks import ColumnInfo, FilterReport, TableInfo, check_filters
from cdcd.filters.plan import FilterPlan
from cdcd.pgoutput.messages import TableFacts

log = structlog.get_logger("cdcd.source")

Conn = psycopg.Connection[Any]


class PublicationError(RuntimeError):
    """A publication cannot be made to match the config (e.g. FOR ALL TABLES on the server, tables in config)."""


def _split(name: str) -> tuple[str, str]:
    schema, table = name.split(".")
    return schema, table


def describe_tables(conn: Conn, names: Sequence[str]) -> dict[str, TableInfo | None]:
    return {name: describe_table(conn, name) for name in names}


def describe_table(conn: Conn, name: str) -> TableInfo | None:
    """Columns, types, collations and replica identity of the table or partitioned table ``name``."""
    row = conn.execute(
        "SELECT c.oid, c.relkind, c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
        _split(name),
    ).fetchone()
    if row is None:
        return None
    oid, relkind, identity = row
    columns = conn.execute(
        "SELECT a.attname, a.atttypid, a.atttypmod,"
        " CASE WHEN a.attcollation = 0 THEN NULL"
        "      WHEN co.collname = 'default'"
        "      THEN (SELECT datcollate FROM pg_database WHERE datname = current_database())"
        "      ELSE co.collname END"
        " FROM pg_attribute a LEFT JOIN pg_collation co ON co.oid = a.attcollation"
        " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        [oid],
    ).fetchall()
    infos = tuple(ColumnInfo(n, t, m, c) for n, t, m, c in columns)
    return TableInfo(name, relkind == "p", identity, _identity_columns(conn, oid, identity, infos), infos, oid)


def _identity_columns(conn: Conn, oid: int, identity: str, columns: tuple[ColumnInfo, ...]) -> tuple[str, ...]:
    if identity == "f":
        return tuple(c.name for c in columns)
    if identity == "n":
        return ()
    return index_columns(conn, oid, "i.indisprimary" if identity == "d" else "i.indisreplident")


def index_columns(conn: Conn, oid: int, which: str) -> tuple[str, ...]:
    """The columns, in index order, of the table's index matching ``which`` (i.indisprimary, i.indisreplident)."""
    rows = conn.execute(
        "SELECT a.attname FROM pg_index i, unnest(i.indkey) WITH ORDINALITY k(attnum, o)"
        " JOIN pg_attribute a ON a.attnum = k.attnum"
        f" WHERE i.indrelid = %s AND a.attrelid = i.indrelid AND {which} ORDER BY k.o",
        [oid],
    ).fetchall()
    return tuple(r[0] for r in rows)


def table_facts(conn: Conn, relation_id: int) -> TableFacts:
    """A table's primary key and NOT NULL columns (nothing for a table that is gone)."""
    rows = conn.execute(
        "SELECT a.attname, a.attnotnull, EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid"
        " AND i.indisprimary AND a.attnum = ANY (i.indkey))"
        " FROM pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped",
        [relation_id],
    ).fetchall()
    return TableFacts(frozenset(n for n, _, pk in rows if pk), frozenset(n for n, nn, _ in rows if nn))


def enum_labels(conn: Conn, type_oid: int) -> tuple[str, ...] | None:
    """An enum type's labels in their order; None when the type is no enum."""
    rows = conn.execute("SELECT enumlabel FROM pg_enum WHERE enumtypid = %s ORDER BY enumsortorder", [type_oid])
    labels = tuple(r[0] for r in rows.fetchall())
    return labels or None


def ancestors(conn: Conn, relation_id: int) -> list[str]:
    """``schema.table`` of each partition ancestor of the relation, nearest first (none for a plain table)."""
    rows = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_partition_ancestors(%s::oid::regclass) WITH ORDINALITY a(relid, o)"
        " JOIN pg_class c ON c.oid = a.relid JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE a.relid <> %s::oid ORDER BY a.o",
        [relation_id, relation_id],
    ).fetchall()
    return [f"{schema}.{table}" for schema, table in rows]


def read_publication(conn: Conn, name: str) -> Publication | None:
    """The server's definition of publication ``name`` (row filters on 15+), or None when it does not exist."""
    row = conn.execute(
        "SELECT oid, puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot"
        " FROM pg_publication WHERE pubname = %s",
        [name],
    ).fetchone()
    if row is None:
        return None
    oid, all_tables, *flags, via_root = row
    publish = [op for op, on in zip(ALL_OPS, flags, strict=True) if on]
    qual = "pg_get_expr(r.prqual, r.prrelid)" if conn.info.server_version >= 150000 else "NULL"
    tables = conn.execute(
        f"SELECT n.nspname || '.' || c.relname, {qual} FROM pg_publication_rel r"
        " JOIN pg_class c ON c.oid = r.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE r.prpubid = %s ORDER BY 1",
        [oid],
    ).fetchall()
    schemas: list[str] = []
    if conn.info.server_version >= 150000:
        schemas = [
            r[0]
            for r in conn.execute(
                "SELECT n.nspname FROM pg_publication_namespace p JOIN pg_namespace n ON n.oid = p.pnnspid"
                " WHERE p.pnpubid = %s ORDER BY 1",
                [oid],
            ).fetchall()
        ]
    return Publication(
        name=name,
        all_tables=all_tables,
        tables=[TableRef(name=t, where=w) for t, w in tables],
        schemas=schemas,
        publish=publish,
        publish_via_partition_root=via_root,
    )


def sync_publications(conn: Conn, publications: Sequence[Publication], push_down: bool) -> None:
    """Create or alter every defined publication so the server's definition is the config's."""
    with conn.transaction():
        # Filters are pushed down as text: a timestamptz literal without an offset is read in this session's
        # time zone when PostgreSQL stores the filter; cdcd reads such literals as UTC.
        conn.execute("SET LOCAL TimeZone = 'UTC'")
        for publication in publications:
            if publication.defined:
                _sync(conn, publication, push_down)


def _sync(conn: Conn, publication: Publication, push_down: bool) -> None:
    name = sql.Identifier(publication.name)
    version = conn.info.server_version
    options = sql.SQL("publish = {}, publish_via_partition_root = {}").format(
        sql.Literal(", ".join(publication.publish)), sql.SQL(str(publication.publish_via_partition_root).lower())
    )
    targets = _targets(conn, publication, push_down and version >= 150000)
    row = conn.execute("SELECT puballtables FROM pg_publication WHERE pubname = %s", [publication.name]).fetchone()
    if row is None:
        target = sql.SQL("FOR ALL TABLES") if publication.all_tables else _for(targets)
        conn.execute(sql.SQL("CREATE PUBLICATION {} {} WITH ({})").format(name, target, options))
        log.info("publication created", publication=publication.name)
        return
    if row[0] != publication.all_tables:
        have, want = ("FOR ALL TABLES", "a list") if row[0] else ("a list of tables", "FOR ALL TABLES")
        raise PublicationError(
            f"publication {publication.name!r} is {have} on the server but the config asks for {want};"
            " PostgreSQL cannot alter that: drop the publication (cdcd recreates it) or use another name"
        )
    if not publication.all_tables:
        _set_targets(conn, publication.name, targets)
    conn.execute(sql.SQL("ALTER PUBLICATION {} SET ({})").format(name, options))
    log.info("publication synchronised with the config", publication=publication.name)


def _targets(conn: Conn, publication: Publication, with_filters: bool) -> sql.Composable | None:
    """``TABLE a [WHERE (..)], b, TABLES IN SCHEMA s, t``: the grammar both 14 (tables only) and 15+ accept."""
    tables = list(publication.tables)
    schemas: list[str] = []
    if conn.info.server_version >= 150000:
        schemas = publication.schemas
    else:
        tables += _schema_tables(conn, publication)
    return _objects([_table(t, with_filters) for t in tables], schemas)


def _table(table: TableRef, with_filter: bool) -> sql.Composable:
    ident = sql.Identifier(*_split(table.name))
    if not with_filter or table.where is None:
        return ident
    from cdcd.filters.expr import parse_filter  # noqa: PLC0415 - only with filters

    return sql.SQL("{} WHERE ({})").format(ident, sql.SQL(parse_filter(table.where).sql))


def _objects(tables: list[sql.Composable], schemas: list[str]) -> sql.Composable | None:
    parts: list[sql.Composable] = []
    if tables:
        parts.append(sql.SQL("TABLE {}").format(sql.SQL(", ").join(tables)))
    if schemas:
        parts.append(sql.SQL("TABLES IN SCHEMA {}").format(sql.SQL(", ").join(map(sql.Identifier, schemas))))
    return sql.SQL(", ").join(parts) if parts else None


def _schema_tables(conn: Conn, publication: Publication) -> list[TableRef]:
    """PostgreSQL 14 has no FOR TABLES IN SCHEMA: publish the schema's tables as they are now."""
    if not publication.schemas:
        return []
    rows = conn.execute(
        "SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = ANY(%s) AND c.relkind IN ('r', 'p') AND NOT c.relispartition ORDER BY 1",
        [publication.schemas],
    ).fetchall()
    log.warning(
        "PostgreSQL 14 has no FOR TABLES IN SCHEMA: publishing the schemas' current tables; tables"
        " created later are added when cdcd restarts",
        publication=publication.name,
        schemas=publication.schemas,
        tables=len(rows),
    )
    return [TableRef(name=r[0]) for r in rows]


def _for(targets: sql.Composable | None) -> sql.Composable:
    return sql.SQL("") if targets is None else sql.SQL("FOR {}").format(targets)


def _set_targets(conn: Conn, publication: str, targets: sql.Composable | None) -> None:
    name = sql.Identifier(publication)
    if targets is not None:
        conn.execute(sql.SQL("ALTER PUBLICATION {} SET {}").format(name, targets))
        return
    # SET needs at least one object: empty the publication by dropping what it has.
    current = read_publication(conn, publication)
    assert current is not None
    drops = _objects([sql.Identifier(*_split(t.name)) for t in current.tables], current.schemas)
    if drops is not None:
        conn.execute(sql.SQL("ALTER PUBLICATION {} DROP {}").format(name, drops))


def resolve_publications(conn: Conn, publications: Sequence[Publication]) -> list[Publication]:
    """The configured publications, with the server's definition for those the config only names."""
    resolved = []
    for publication in publications:
        if publication.defined:
            resolved.append(publication)
            continue
        found = read_publication(conn, publication.name)
        resolved.append(found if found is not None else publication)
    return resolved


def prepare_filters(conn: Conn, publications: Sequence[Publication]) -> tuple[FilterPlan, FilterReport]:
    """The filter plan for these publications and the problems of its filters on the tables as they are."""
    plan = FilterPlan(resolve_publications(conn, publications))
    if not plan.has_filters:
        return plan, FilterReport()
    return plan, check_filters(plan, describe_tables(conn, plan.filtered_tables()))
