"""Applying row filters to decoded changes, as PostgreSQL 15's pgoutput does. No I/O.

* INSERT is published when the new row matches, DELETE when the old row (key or full) matches.
* UPDATE evaluates both rows: both match -> UPDATE; only the new one -> INSERT of the new row; only the old
  one -> DELETE of the old row; neither -> dropped. Without an old tuple (replica identity unchanged) only the
  new row is evaluated. An unchanged TOAST value in the new row takes the old row's value when it has one.
* NULL is not a match. TRUNCATE is never filtered (it is not a row change and never reaches this stage).
* A filter that cannot be evaluated for a row (an unchanged TOAST value it needs, a division by zero...) is
  settled by ``unevaluable``: publish (the default: never lose a change), drop, or fail. It is logged and counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import structlog

from cdcd.filters.expr import ColumnType, FilterError, Unevaluable, compile_filter
from cdcd.filters.plan import FilterPlan, OpFilters, RelationFilters
from cdcd.pgoutput.messages import UNCHANGED_TOAST, Op, Relation, Row, RowChange
from cdcd.plan import FilterRules, Plans, Predicates, RelationPlan

log = structlog.get_logger("cdcd.filters")

Policy = Literal["publish", "drop", "fail"]


@dataclass
class FilterStats:
    """Counters that outlive one replication session."""

    filtered: Counter[str] = field(default_factory=Counter)  # changes dropped, by schema.table
    transformed: Counter[str] = field(default_factory=Counter)  # updates published as "insert" or "delete"
    unevaluated: Counter[str] = field(default_factory=Counter)  # filters that could not be evaluated, by table


class FilterFailure(RuntimeError):
    """A row filter could not be evaluated and filters.unevaluable is "fail"; or a table changed so that its
    filter no longer applies (a referenced column dropped, the replica identity changed)."""


class RowFilter:
    """``apply(change)`` returns the change to publish (maybe turned into an INSERT or DELETE) or None."""

    def __init__(
        self,
        plan: FilterPlan,
        unevaluable: Policy = "publish",
        ancestors: Callable[[Relation], Sequence[str]] | None = None,
        stats: FilterStats | None = None,
        plans: Plans | None = None,
    ) -> None:
        self.plan = plan
        self.plans = plans or Plans()
        self.unevaluable = unevaluable
        self.ancestors = ancestors
        self.stats = stats or FilterStats()
        self.filtered, self.transformed, self.unevaluated = (
            self.stats.filtered,
            self.stats.transformed,
            self.stats.unevaluated,
        )
        self._warned: set[tuple[str, str]] = set()

    def apply(self, change: RowChange) -> RowChange | None:
        relation = change.relation
        plan = self.plans.get(relation)
        rules = plan.filter if plan.filtered else self._compile(plan)
        if rules is None:
            return change
        if change.op == "insert":
            return change if self._matches(rules.insert, change.new, relation) else self._drop(relation)
        if change.op == "delete":
            return change if self._matches(rules.delete, change.old, relation) else self._drop(relation)
        return self._update(rules, change, plan.key_positions)

    def _update(self, rules: FilterRules, change: RowChange, key_positions: tuple[int, ...]) -> RowChange | None:
        relation, old, new = change.relation, change.old, change.new
        assert new is not None
        if rules.update is None:
            return change
        if old is None:
            return change if self._matches(rules.update, new, relation) else self._drop(relation)
        new = _fill_unchanged(new, old, key_positions if change.old_is_key else None)
        old_match = self._matches(rules.update, old, relation)
        new_match = self._matches(rules.update, new, relation)
        if old_match and new_match:
            return change if new is change.new else _replace(change, "update", old, new)
        if new_match:
            self.transformed["insert"] += 1
            return _replace(change, "insert", None, new)
        if old_match:
            self.transformed["delete"] += 1
            return _replace(change, "delete", old, None)
        return self._drop(relation)

    def _matches(self, filters: Predicates, row: Row | None, relation: Relation) -> bool:
        if filters is None:
            return True
        assert row is not None
        for text, predicate in filters:
            try:
                if predicate(row) is True:
                    return True
            except Unevaluable as exc:
                if self._on_unevaluable(relation, text, exc):
                    return True
        return False

    def _on_unevaluable(self, relation: Relation, text: str, exc: Unevaluable) -> bool:
        table = f"{relation.schema}.{relation.name}"
        self.unevaluated[table] += 1
        if self.unevaluable == "fail":
            raise FilterFailure(f"row filter ({text}) on {table} cannot be evaluated: {exc}") from None
        if (table, text) not in self._warned:
            self._warned.add((table, text))
            log.warning(
                "row filter cannot be evaluated; applying filters.unevaluable",
                table=table,
                filter=text,
                reason=str(exc),
                decision=self.unevaluable,
            )
        return self.unevaluable == "publish"

    def _drop(self, relation: Relation) -> RowChange | None:
        self.filtered[f"{relation.schema}.{relation.name}"] += 1
        return None

    def _compile(self, plan: RelationPlan) -> FilterRules | None:
        relation, table = plan.relation, plan.table
        ancestors: Sequence[str] = ()
        if self.ancestors is not None and self.plan.needs_ancestors(table):
            ancestors = self.ancestors(relation)
        filters = self.plan.filters_for(table, ancestors)
        rules = None if filters.unfiltered else self._rules_for(relation, table, filters)
        if filters.uncovered and (table, "uncovered") not in self._warned:
            self._warned.add((table, "uncovered"))
            log.warning(
                "no configured publication publishes these operations on the table; the server sent"
                " them, so cdcd passes them unfiltered",
                table=table,
                operations=filters.uncovered,
            )
        plan.filter, plan.filtered = rules, True
        return rules

    def _rules_for(self, relation: Relation, table: str, filters: RelationFilters) -> FilterRules:
        identity = None if relation.replica_identity == "f" else [c.name for c in relation.key_columns]
        problems = self.plan.replica_identity_problems(table, identity)
        if problems:
            raise FilterFailure("; ".join(problems))
        columns = [ColumnType(c.name, c.type_oid, c.type_modifier) for c in relation.columns]
        try:
            return FilterRules(
                _compile_op(filters.insert, columns),
                _compile_op(filters.update, columns),
                _compile_op(filters.delete, columns),
            )
        except FilterError as exc:
            raise FilterFailure(f"table {table} as replicated now: {exc}") from None


def _compile_op(filters: OpFilters, columns: Sequence[ColumnType]) -> Predicates:
    if filters is None:
        return None
    return tuple((f.parsed.text, compile_filter(f.parsed, columns)) for f in filters)


def _fill_unchanged(new: Row, old: Row, key_positions: tuple[int, ...] | None) -> Row:
    """The new row with unchanged TOAST values taken from the old tuple (only its key columns when it is a
    key tuple: its other columns are not sent)."""
    if UNCHANGED_TOAST not in new:
        return new
    usable = range(len(new)) if key_positions is None else key_positions
    filled = list(new)
    for i in usable:
        if filled[i] is UNCHANGED_TOAST and old[i] is not UNCHANGED_TOAST:
            filled[i] = old[i]
    return tuple(filled)


def _replace(change: RowChange, op: Op, old: Row | None, new: Row | None) -> RowChange:
    old_is_key = change.old_is_key if old is not None else False
    return RowChange(op, change.relation, old, new, old_is_key, change.xid, change.wal_lsn, change.size)
