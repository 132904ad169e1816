"""Catalog reads and publication management on a regular (non-replication) connection.

* ``captured_tables``, ``captured_relations``: the tables the publications publish (with their relation ids,
  which a rename keeps); ``partitions``: the leaf partitions of those published as their partitioned root.
* ``describe_tables``: columns, types, collations and replica identity, for the row-filter checks;
  ``published_columns``, ``publishes_generated_columns``: those of its columns pgoutput sends (a snapshot reads
  just those): no generated column, but the stored ones where a publication publishes them (PostgreSQL 18+).
* ``read_publication``: the server's definition of a publication the config names without defining it.
* ``sync_publications``: with ``source.manage_publications``, create or alter each defined publication to match
  the config, row filters included on PostgreSQL 15+ (``filters.push_down``). Run in one transaction, and only
  after the filters passed their checks, so cdcd never writes a filter that would make the application's
  UPDATE or DELETE fail. Tables captured by pattern (``include_tables``/``exclude_tables``), and on PostgreSQL 14
  by schema, are listed as they are then. ``publish_generated_columns`` is set on PostgreSQL 18+; asked for
  before, it is a configuration error (``version_refusals``) and nothing is written.
* ``add_new_tables``: while streaming, the tables such a publication captures that appeared since (found when
  ``tables_fingerprint`` changes), added to it.
* ``ancestors``: a partition's ancestors, looked up while streaming when they decide which filters apply.
* ``table_facts``, ``enum_labels``: what pgoutput does not send of a table (primary key, NOT NULL and stored
  generated columns) and of an enum type (its labels), looked up when the Relation or Type message arrives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog
from psycopg import sql

from cdcd.config import ALL_OPS, ConfigError, Publication, TableRef
from cdcd.filters.checks import ColumnInfo, FilterReport, TableInfo, check_filters
from cdcd.filters.plan import FilterPlan
from cdcd.pgoutput.messages import TableFacts

log = structlog.get_logger("cdcd.source")

Conn = psycopg.Connection[Any]


GENERATED_COLUMNS_VERSION = 180000  # publish_generated_columns


class PublicationError(RuntimeError):
    """A publication cannot be made to match the config (e.g. FOR ALL TABLES on the server, tables in config)."""


def _split(name: str) -> tuple[str, str]:
    schema, table = name.split(".")
    return schema, table


def captured_tables(conn: Conn, publications: Sequence[str]) -> list[str]:
    """``schema.table`` of every table the publications publish (partition roots under publish_via_partition_root)."""
    return list(captured_relations(conn, publications))


def captured_relations(conn: Conn, publications: Sequence[str]) -> dict[str, int]:
    """As ``captured_tables``, each with its relation id (which a rename keeps), in name order."""
    rows = conn.execute(
        "SELECT DISTINCT p.schemaname, p.tablename, c.oid FROM pg_publication_tables p"
        " JOIN pg_namespace n ON n.nspname = p.schemaname JOIN pg_class c ON c.relnamespace = n.oid"
        " AND c.relname = p.tablename WHERE p.pubname = ANY(%s) ORDER BY 1, 2",
        [list(publications)],
    ).fetchall()
    return {f"{s}.{t}": int(oid) for s, t, oid in rows}


def partitions(conn: Conn, relation_ids: Sequence[int]) -> dict[int, dict[int, str]]:
    """The leaf partitions of each partitioned table among ``relation_ids`` (those a publication publishes as their
    root, ``publish_via_partition_root``), each with its partition constraint as PostgreSQL deparses it (the
    ancestors' included): by relation id, the root's and the leaf's. A partition attached later holds rows the
    stream never sends (ATTACH writes none); its constraint reads just those through the root."""
    rows = conn.execute(
        "SELECT r.oid, t.relid::oid, pg_get_partition_constraintdef(t.relid) FROM pg_class r"
        " LEFT JOIN LATERAL pg_partition_tree(r.oid) t ON t.isleaf WHERE r.oid = ANY(%s) AND r.relkind = 'p'",
        [list(relation_ids)],
    ).fetchall()
    found: dict[int, dict[int, str]] = {}
    for root, leaf, constraint in rows:
        leaves = found.setdefault(int(root), {})  # one without partitions yet has its entry: the first counts
        if leaf is not None and constraint is not None:
            leaves[int(leaf)] = str(constraint)
    return found


@dataclass(frozen=True)
class Captured:
    """What the publications capture: each table's relation id by ``schema.table``, and the leaf partitions of
    those published as their root (``partitions``)."""

    relations: dict[str, int]
    partitions: dict[int, dict[int, str]]


def captured(conn: Conn, publications: Sequence[str]) -> Captured:
    relations = captured_relations(conn, publications)
    return Captured(relations, partitions(conn, list(relations.values())))


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
        "      ELSE co.collname END, a.attgenerated::text"
        " FROM pg_attribute a LEFT JOIN pg_collation co ON co.oid = a.attcollation"
        " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        [oid],
    ).fetchall()
    infos = tuple(ColumnInfo(n, t, m, c, g) for n, t, m, c, g in columns)
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
    """A table's primary key, NOT NULL and stored generated columns (nothing for a table that is gone)."""
    rows = conn.execute(
        "SELECT a.attname, a.attnotnull, EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid"
        " AND i.indisprimary AND a.attnum = ANY (i.indkey)), a.attgenerated = 's'"
        " FROM pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped",
        [relation_id],
    ).fetchall()
    return TableFacts(
        primary_key=frozenset(n for n, _, pk, _ in rows if pk),
        not_null=frozenset(n for n, nn, _, _ in rows if nn),
        generated=frozenset(n for n, _, _, stored in rows if stored),
    )


def published_columns(columns: Sequence[ColumnInfo], stored_generated: bool) -> tuple[ColumnInfo, ...]:
    """The columns pgoutput sends of a table: never a virtual generated column, a stored one only where a
    publication publishes them (``stored_generated``: publish_generated_columns = stored, PostgreSQL 18+)."""
    return tuple(c for c in columns if not c.generated or (stored_generated and c.generated == "s"))


def publishes_generated_columns(conn: Conn, publications: Sequence[str], name: str) -> bool:
    """Whether one of ``publications`` that publishes table ``name`` publishes its stored generated columns.
    PostgreSQL refuses to stream a table with generated columns that publications disagree on, so any will do."""
    if conn.info.server_version < GENERATED_COLUMNS_VERSION or not publications:
        return False
    row = conn.execute(
        "SELECT coalesce(bool_or(p.pubgencols = 's'), false) FROM pg_publication p"
        " JOIN pg_publication_tables t ON t.pubname = p.pubname"
        " WHERE p.pubname = ANY(%s) AND t.schemaname = %s AND t.tablename = %s",
        [list(publications), *_split(name)],
    ).fetchone()
    return bool(row and row[0])


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
    generated = "pubgencols" if conn.info.server_version >= GENERATED_COLUMNS_VERSION else "'n'"
    row = conn.execute(
        "SELECT oid, puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot,"
        f" {generated} = 's' FROM pg_publication WHERE pubname = %s",
        [name],
    ).fetchone()
    if row is None:
        return None
    oid, all_tables, *flags, via_root, stored = row
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
        publish_generated_columns="stored" if stored else "none",
    )


def sync_publications(conn: Conn, publications: Sequence[Publication], push_down: bool) -> None:
    """Create or alter every defined publication so the server's definition is the config's. ConfigError, before
    anything is written, for a setting the server does not have."""
    refusals = version_refusals(publications, conn.info.server_version)
    if refusals:
        raise ConfigError("the publications cannot be made as configured:\n  - " + "\n  - ".join(refusals))
    with conn.transaction():
        # Filters are pushed down as text: a timestamptz literal without an offset is read in this session's
        # time zone when PostgreSQL stores the filter; cdcd reads such literals as UTC.
        conn.execute("SET LOCAL TimeZone = 'UTC'")
        for publication in publications:
            if publication.defined:
                _sync(conn, publication, push_down)


def version_refusals(publications: Sequence[Publication], server_version: int) -> list[str]:
    """The settings of the defined publications that a server of ``server_version`` does not have."""
    if server_version >= GENERATED_COLUMNS_VERSION:
        return []
    return [
        f"source.publications: publication {p.name!r} sets publish_generated_columns: {p.publish_generated_columns},"
        f" but the server is PostgreSQL {server_version // 10000}: generated columns are published from PostgreSQL"
        " 18 on (set it to none, or leave it out)"
        for p in publications
        if p.defined and p.publish_generated_columns != "none"
    ]


def publication_options(publication: Publication, server_version: int) -> sql.Composable:
    """The WITH (...) options making the publication's settings the config's (publish_generated_columns from
    PostgreSQL 18 on: before, the server has no such option and publishes no generated column)."""
    options = sql.SQL("publish = {}, publish_via_partition_root = {}").format(
        sql.Literal(", ".join(publication.publish)), sql.SQL(str(publication.publish_via_partition_root).lower())
    )
    if server_version >= GENERATED_COLUMNS_VERSION:
        generated = sql.Literal(publication.publish_generated_columns)
        options += sql.SQL(", publish_generated_columns = {}").format(generated)
    return options


def _sync(conn: Conn, publication: Publication, push_down: bool) -> None:
    name = sql.Identifier(publication.name)
    version = conn.info.server_version
    options = publication_options(publication, version)
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
    version = conn.info.server_version
    tables = list(publication.tables)
    schemas = publication.schemas if version >= 150000 else []
    if tracks_new_tables(publication, version):
        implied = implied_tables(publication, candidate_tables(conn), version)
        tables += [TableRef(name=name) for name in implied]
        log.info(
            "tables captured by pattern (or, on PostgreSQL 14, by schema) listed in the publication",
            publication=publication.name,
            tables=len(implied),
        )
    return _objects([_table(t, with_filters) for t in tables], schemas)


# The tables a pattern (or, on 14, a schema) can capture: ordinary and partitioned tables, permanent (PostgreSQL
# publishes no temporary or unlogged table), no partition (published through its root), in no system schema.
_CANDIDATES = (
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE c.relkind IN ('r', 'p') AND c.relpersistence = 'p' AND NOT c.relispartition"
    " AND n.nspname <> 'information_schema' AND n.nspname !~ '^pg_'"
)


def candidate_tables(conn: Conn) -> list[str]:
    """``schema.table`` of every table a pattern may capture (a name holding a dot cannot be written so: left out)."""
    rows = conn.execute("SELECT n.nspname, c.relname" + _CANDIDATES + " ORDER BY 1, 2").fetchall()
    return [f"{schema}.{table}" for schema, table in rows if "." not in schema + table]


def tables_fingerprint(conn: Conn) -> tuple[int, int]:
    """A cheap digest of the candidate tables (count, and a sum of hashes of oid and name): it changes when one is
    created, dropped, renamed or moved to another schema, so the list is read only then."""
    row = conn.execute(
        "SELECT count(*), coalesce(sum(hashtext(c.oid::text || ' ' || n.nspname || '.' || c.relname)), 0)" + _CANDIDATES
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def tracks_new_tables(publication: Publication, server_version: int) -> bool:
    """Whether cdcd keeps the publication's table list itself: it captures tables by pattern, or by schema on
    PostgreSQL 14 (15+ publishes a schema's tables, later ones included, with FOR TABLES IN SCHEMA)."""
    return publication.has_patterns or (server_version < 150000 and bool(publication.schemas))


def implied_tables(publication: Publication, candidates: Sequence[str], server_version: int) -> list[str]:
    """The candidate tables the publication captures beyond those it lists: those its patterns match (outside
    its schemas) and, on PostgreSQL 14, its schemas' tables."""
    listed = {t.name for t in publication.tables}
    native_schemas = server_version >= 150000
    implied = []
    for name in candidates:
        if name in listed:
            continue
        in_schema = name.split(".", maxsplit=1)[0] in publication.schemas
        if (in_schema and not native_schemas) or (not in_schema and publication.matches(name)):
            implied.append(name)
    return implied


def add_new_tables(conn: Conn, publications: Sequence[Publication]) -> list[str]:
    """Add to each publication cdcd keeps the list of (``tracks_new_tables``) the tables it captures but does not
    hold yet (created, renamed or moved since): the tables added. Changes are streamed from the point each
    ALTER PUBLICATION is decoded on; a table dropped meanwhile is passed over."""
    version = conn.info.server_version
    kept = [p for p in publications if tracks_new_tables(p, version)]
    if not kept:
        return []
    candidates = candidate_tables(conn)
    added: set[str] = set()
    for publication in kept:
        held = set(_published_tables(conn, publication.name))
        for name in implied_tables(publication, candidates, version):
            if name not in held and _add_table(conn, publication.name, name):
                added.add(name)
                log.info("table added to the publication", publication=publication.name, table=name)
    return sorted(added)


def _published_tables(conn: Conn, publication: str) -> list[str]:
    rows = conn.execute(
        "SELECT n.nspname || '.' || c.relname FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid"
        " JOIN pg_class c ON c.oid = r.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE p.pubname = %s",
        [publication],
    ).fetchall()
    return [r[0] for r in rows]


def _add_table(conn: Conn, publication: str, table: str) -> bool:
    """ALTER PUBLICATION .. ADD TABLE; False when the table is gone or already there (a concurrent change)."""
    try:
        conn.execute(
            sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                sql.Identifier(publication), sql.Identifier(*_split(table))
            )
        )
    except (psycopg.errors.UndefinedTable, psycopg.errors.DuplicateObject):
        return False
    return True


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
