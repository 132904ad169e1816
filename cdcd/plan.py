"""One plan per table version: what the per-row stages know about a Relation, built once. Pure.

A ``RelationPlan`` is made the first time a stage meets a Relation (a Relation message, or a catalog description
for snapshots) and is shared by every stage of the session: the row filter's compiled predicates, the Kafka
topic, encoder and wire headers, the JSON-lines writer. Each part is filled by the stage that owns it, once per
table version; the others read it. A Relation sent again with the same definition (a new streamed block, a new
session's first change) keeps its plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cdcd.avro.encoder import EnvelopeEncoder
from cdcd.pgoutput.messages import Relation, Row

Predicate = Callable[[Row], bool | None]
# (filter text, predicate) pairs, ORed; None publishes every row.
Predicates = tuple[tuple[str, Predicate], ...] | None
RowWriter = Callable[[Row | None, bool], tuple[str, list[str]]]  # JSON of a row (key columns only?), unchanged


@dataclass(frozen=True)
class FilterRules:
    """The table's row filters per operation, compiled for this table version."""

    insert: Predicates
    update: Predicates
    delete: Predicates


@dataclass(frozen=True)
class Wire:
    """How this table version's events go to Kafka: its topic, the encoder of its rows and the Confluent wire
    headers (magic byte, schema id) of its key and value schemas. ``key_header`` None: messages have no key."""

    topic: str
    encoder: EnvelopeEncoder
    key_header: bytes | None
    value_header: bytes


@dataclass(frozen=True)
class JsonShape:
    """How this table version's changes are written as JSON lines: the row writer and each op's line opening."""

    write: RowWriter
    heads: dict[str, str]


class RelationPlan:
    __slots__ = ("encoder", "filter", "filtered", "json", "key_positions", "relation", "table", "wire")

    def __init__(self, relation: Relation) -> None:
        self.relation = relation
        self.table = f"{relation.schema}.{relation.name}"  # the metrics' and the filters' name
        self.key_positions = tuple(i for i, c in enumerate(relation.columns) if c.is_key)
        self.filtered = False  # whether ``filter`` was settled for this version
        self.filter: FilterRules | None = None  # None once settled: no filter applies
        self.encoder: EnvelopeEncoder | None = None  # made before ``wire`` when changes are encoded as they arrive
        self.wire: Wire | None = None  # its encoder is ``encoder``
        self.json: JsonShape | None = None


def definition(relation: Relation) -> tuple[object, ...]:
    """What makes two Relation messages the same table version (not the streamed block's xid)."""
    return relation.schema, relation.name, relation.replica_identity, relation.columns


class Plans:
    """The session's plans, by relation id: the latest version of each table."""

    def __init__(self) -> None:
        self._plans: dict[int, RelationPlan] = {}

    def get(self, relation: Relation) -> RelationPlan:
        plan = self._plans.get(relation.relation_id)
        if plan is not None and plan.relation is relation:
            return plan
        return self._changed(relation, plan)

    def _changed(self, relation: Relation, plan: RelationPlan | None) -> RelationPlan:
        if plan is not None and definition(plan.relation) == definition(relation):
            plan.relation = relation  # the same version sent again: keep what the stages built
            return plan
        plan = self._plans[relation.relation_id] = RelationPlan(relation)
        return plan
