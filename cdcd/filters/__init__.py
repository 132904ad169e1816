"""Row filters with PostgreSQL 15 semantics: expressions (``expr``), which apply where (``plan``), applying
them to changes (``rowfilter``). Pure code; the catalog facts they need are passed in."""

from cdcd.filters.expr import FilterError, ParsedFilter, Unevaluable, parse_filter
from cdcd.filters.plan import FilterPlan, RelationFilters, TableFilter
from cdcd.filters.rowfilter import FilterFailure, FilterStats, RowFilter

__all__ = [
    "FilterError",
    "FilterFailure",
    "FilterPlan",
    "FilterStats",
    "ParsedFilter",
    "RelationFilters",
    "RowFilter",
    "TableFilter",
    "Unevaluable",
    "parse_filter",
]
