"""Which row filters apply to a published table, per operation: PostgreSQL 15's rules for combining them.

* A publication contributes only to the operations it publishes.
* It covers a table when it is FOR ALL TABLES, lists the table's schema, lists the table, matches it by pattern
  (``include_tables``: cdcd adds the matching tables to it), or does one of these for one of the table's partition
  ancestors. Only a table listed with a WHERE clause is filtered by that publication: the other ways of covering
  it publish every row (PostgreSQL looks the filter up for the published relation itself).
* The filters of all covering publications are ORed; one covering publication without a filter makes them all
  redundant.
* A publication that publishes UPDATE or DELETE may filter only on replica identity columns.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from cdcd.filters.expr import ParsedFilter, parse_filter

ROW_OPS = ("insert", "update", "delete")


class ListedTable(Protocol):
    @property
    def name(self) -> str: ...  # schema.table
    @property
    def where(self) -> str | None: ...


class Publication(Protocol):
    """A publication's definition (``cdcd.config.Publication`` is one; so is what the catalog reads)."""

    @property
    def name(self) -> str: ...
    @property
    def tables(self) -> Sequence[ListedTable]: ...
    @property
    def schemas(self) -> Sequence[str]: ...
    @property
    def all_tables(self) -> bool: ...
    @property
    def publish(self) -> Sequence[str]: ...
    @property
    def publish_via_partition_root(self) -> bool: ...
    @property
    def defined(self) -> bool: ...
    @property
    def has_patterns(self) -> bool: ...
    def matches(self, table: str) -> bool: ...  # published by pattern (include_tables/exclude_tables)


@dataclass(frozen=True)
class TableFilter:
    publication: str
    table: str
    parsed: ParsedFilter


# None: every row is published (no filter, or one covering publication has none); else the ORed filters.
OpFilters = tuple[TableFilter, ...] | None


@dataclass(frozen=True)
class RelationFilters:
    insert: OpFilters
    update: OpFilters
    delete: OpFilters
    uncovered: tuple[str, ...] = ()  # row operations no configured publication publishes for this table

    @property
    def unfiltered(self) -> bool:
        return self.insert is None and self.update is None and self.delete is None


class FilterPlan:
    """The configured publications, indexed by table. Pure: partition ancestors are passed in."""

    def __init__(self, publications: Sequence[Publication]) -> None:
        self.publications = [p for p in publications if p.defined]
        self._where: dict[tuple[str, str], ParsedFilter | None] = {}
        for publication in self.publications:
            for table in publication.tables:
                parsed = None if table.where is None else parse_filter(table.where)
                self._where[publication.name, table.name] = parsed

    @property
    def has_filters(self) -> bool:
        return any(parsed is not None for parsed in self._where.values())

    def filtered_tables(self) -> list[str]:
        return sorted({table for (_, table), parsed in self._where.items() if parsed is not None})

    def parsed(self, publication: str, table: str) -> ParsedFilter | None:
        return self._where.get((publication, table))

    def needs_ancestors(self, table: str) -> bool:
        """Whether a partition ancestor could change ``table``'s filters: it is filtered somewhere and another
        publication lists tables but does not cover it directly."""
        if table not in self.filtered_tables():
            return False
        schema = table.split(".", maxsplit=1)[0]
        return any(
            (p.tables or p.has_patterns)
            and not p.all_tables
            and schema not in p.schemas
            and (p.name, table) not in self._where
            for p in self.publications
        )

    def filters_for(self, table: str, ancestors: Sequence[str] = ()) -> RelationFilters:
        """The filters for ``schema.table`` (``ancestors``: its partition ancestors, when it is a partition)."""
        ops: dict[str, OpFilters] = {}
        uncovered: list[str] = []
        for op in ROW_OPS:
            covered, filters, unfiltered = False, [], False
            for publication in self.publications:
                if op not in publication.publish or not self._covers(publication, table, ancestors):
                    continue
                covered = True
                parsed = self._where.get((publication.name, table))
                if parsed is None:
                    unfiltered = True
                else:
                    filters.append(TableFilter(publication.name, table, parsed))
            if not covered:
                uncovered.append(op)
            ops[op] = None if unfiltered or not covered else tuple(filters)
        return RelationFilters(ops["insert"], ops["update"], ops["delete"], tuple(uncovered))

    def copy_filters(self, table: str, ancestors: Sequence[str] = ()) -> tuple[ParsedFilter, ...] | None:
        """The filters a snapshot of ``table`` applies, ORed (None: every row). As PostgreSQL's initial data
        synchronization: every covering publication counts, whatever operations it publishes."""
        filters = []
        for publication in self.publications:
            if not self._covers(publication, table, ancestors):
                continue
            parsed = self._where.get((publication.name, table))
            if parsed is None:
                return None
            filters.append(parsed)
        return tuple(filters) or None

    def _covers(self, publication: Publication, table: str, ancestors: Sequence[str]) -> bool:
        if publication.all_tables or table.split(".", maxsplit=1)[0] in publication.schemas:
            return True
        # cdcd adds what a pattern matches but never a partition: its topmost ancestor, if the pattern matches that
        if publication.matches(ancestors[-1] if ancestors else table):
            return True
        listed = {t.name for t in publication.tables}
        return table in listed or not listed.isdisjoint(ancestors)

    def replica_identity_problems(
        self, table: str, identity: Collection[str] | None, only: str | None = None
    ) -> list[str]:
        """Filters on ``table`` in publications (or publication ``only``) that publish UPDATE or DELETE must use
        only replica identity columns (``identity``; None for REPLICA IDENTITY FULL, which covers every column)."""
        if identity is None:
            return []
        problems = []
        for publication in self.publications:
            if only is not None and publication.name != only:
                continue
            parsed = self._where.get((publication.name, table))
            if parsed is None or not {"update", "delete"} & set(publication.publish):
                continue
            outside = sorted(parsed.columns - set(identity))
            if outside:
                key = ", ".join(sorted(identity)) or "none: REPLICA IDENTITY NOTHING"
                problems.append(
                    f"publication {publication.name!r} publishes UPDATE/DELETE, so its row filter on {table}"
                    f" ({parsed.text}) may use only replica identity columns ({key}); it uses {', '.join(outside)}."
                    " PostgreSQL 15+ would reject the application's UPDATE and DELETE on that table: filter on"
                    " replica identity columns, change the replica identity, or publish only insert"
                )
        return problems
