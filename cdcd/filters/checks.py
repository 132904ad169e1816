"""Start-up checks of the configured row filters against the tables as the catalog describes them. Pure: the
source edge (``cdcd.source.catalog``) reads the catalog into ``TableInfo``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cdcd.filters.expr import ColumnType, FilterError, compile_filter
from cdcd.filters.plan import FilterPlan

_C_COLLATIONS = frozenset({"C", "POSIX", "ucs_basic", "pg_c_utf8"})


@dataclass(frozen=True)
class ColumnInfo:
    name: str
    type_oid: int
    type_modifier: int
    collation: str | None  # the collation's name (lc_collate for "default"), None for non-collatable types
    generated: str = ""  # pg_attribute.attgenerated: "" none, "s" stored, "v" virtual (PostgreSQL 18)


@dataclass(frozen=True)
class TableInfo:
    name: str  # schema.table
    partitioned: bool
    replica_identity: str  # d, n, f, i (pg_class.relreplident)
    identity_columns: tuple[str, ...]  # the replica identity's columns (all of them for FULL)
    columns: tuple[ColumnInfo, ...] = field(default=())
    oid: int = 0  # pg_class oid (the Relation id pgoutput uses)


@dataclass
class FilterReport:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def check_filters(plan: FilterPlan, tables: Mapping[str, TableInfo | None]) -> FilterReport:
    """Every problem of every filtered table: missing table, unknown column, type error, replica identity,
    a filter on a partitioned table not published via its root; warnings for text ordering under a collation
    cdcd does not reproduce."""
    report = FilterReport()
    for publication in plan.publications:
        for table in publication.tables:
            if table.where is None:
                continue
            info = tables.get(table.name)
            if info is None:
                report.errors.append(f"publication {publication.name!r}: filtered table {table.name} does not exist")
                continue
            where = f"publication {publication.name!r}, table {table.name}"
            if info.partitioned and not publication.publish_via_partition_root:
                report.errors.append(
                    f"{where}: a row filter on a partitioned table applies only with publish_via_partition_root:"
                    " true (otherwise each partition's own filter is used); set it, or filter the partitions"
                )
            if _check_expression(plan, publication.name, table.name, info, report):
                identity = None if info.replica_identity == "f" else info.identity_columns
                report.errors.extend(plan.replica_identity_problems(table.name, identity, only=publication.name))
    return report


def _check_expression(plan: FilterPlan, publication: str, table: str, info: TableInfo, report: FilterReport) -> bool:
    parsed = plan.parsed(publication, table)
    assert parsed is not None
    try:
        compile_filter(parsed, [ColumnType(c.name, c.type_oid, c.type_modifier) for c in info.columns])
    except FilterError as exc:
        report.errors.append(f"publication {publication!r}, table {table}: {exc}")
        return False
    collations = {c.name: c.collation for c in info.columns}
    for column in sorted(parsed.ordered_text_columns):
        collation = collations.get(column)
        if collation is not None and collation not in _C_COLLATIONS:
            report.warnings.append(
                f"publication {publication!r}, table {table}: the filter ({parsed.text}) orders text column"
                f" {column}, whose collation is {collation!r}; cdcd compares text by code point (collation C),"
                " so rows near the boundary can be filtered differently than PostgreSQL would. Write"
                f' {column} COLLATE "C" in the filter to get the same result everywhere'
            )
    return True
