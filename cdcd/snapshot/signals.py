"""Debezium's signals, as read from a Kafka signal topic (``signals.kafka.topic``): what a record says. Pure.

A signal record is keyed by the connector's name (cdcd's ``kafka.topic_prefix``) and its value is JSON::

    {"id": "...", "type": "execute-snapshot",
     "data": {"data-collections": ["public.orders", "public\\\\.t.*"], "type": "incremental",
              "additional-conditions": [{"data-collection": "public.orders", "filter": "id > 100"}]}}

``stop-snapshot`` takes the same ``data`` (``data-collections`` optional: none stops every incremental
snapshot), ``pause-snapshot`` and ``resume-snapshot`` none, ``log`` a ``message``. ``data`` may also be a JSON
string, as in Debezium's signal table. Whatever else a record holds is ``Ignored`` with the reason: logged, counted
and skipped, never an error. Anyone who may write to the topic can send a record, so its JSON, patterns and
conditions are read with ``cdcd.snapshot.untrusted``'s bounds: a pattern is an RE2 expression (linear time), a
condition one expression of the row-filter grammar, rendered by cdcd.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cdcd.snapshot import untrusted
from cdcd.snapshot.untrusted import Rejected

MAX_COLLECTIONS = 1000  # data collections (and additional conditions) one signal may name


@dataclass(frozen=True)
class SignalRecord:
    """A record of the signal topic, as the Kafka edge read it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class SignalSource(Protocol):
    """Where signal records come from (``cdcd.sink.signal_topic.SignalTopic``)."""

    def start(self, offsets: Mapping[str, int]) -> None:
        """Read from ``offsets`` (partition -> next offset) on."""

    def poll(self) -> list[SignalRecord]:
        """The records that arrived since the last poll; never blocks for long."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class ExecuteSnapshot:
    id: str
    collections: tuple[str, ...]  # names or regular expressions of schema.table, as Debezium's
    conditions: tuple[tuple[str, str], ...] = ()  # (data collection, filter): a WHERE condition for those tables


@dataclass(frozen=True)
class StopSnapshot:
    id: str
    collections: tuple[str, ...] = ()  # none: every incremental snapshot


@dataclass(frozen=True)
class PauseSnapshot:
    id: str


@dataclass(frozen=True)
class ResumeSnapshot:
    id: str


@dataclass(frozen=True)
class LogSignal:
    id: str
    message: str


@dataclass(frozen=True)
class Ignored:
    """A record that is not a signal cdcd acts on, and why."""

    reason: str
    elsewhere: bool = False  # addressed to another connector (a shared signal topic): not worth a warning
    label: str = "invalid"  # the reason's kind, as cdcd_control_rejected_total counts it
    id: str | None = None  # the snapshot it would have been, when known: told ABORTED


Signal = ExecuteSnapshot | StopSnapshot | PauseSnapshot | ResumeSnapshot | LogSignal


def parse(key: bytes | None, value: bytes | None, name: str, default_id: str) -> Signal | Ignored:
    """The signal in a record of the signal topic; ``name``: the connector's name its key must be;
    ``default_id``: the signal's id when it has none (e.g. its topic position)."""
    if key is None or key.decode("utf-8", "replace") != name:
        shown = None if key is None else key.decode("utf-8", "replace")[:100]
        return Ignored(f"its key {shown!r} is not this connector's name {name!r}", elsewhere=True)
    if not value:
        return Ignored("it has no value")
    document = _json_object(value, "value")
    if isinstance(document, Ignored):
        return document
    kind, own_id = document.get("type"), document.get("id")
    own_id = str(own_id) if isinstance(own_id, str | int) and str(own_id) else None
    signal_id = own_id or default_id
    data = _data(document.get("data"))
    if isinstance(data, Ignored):
        return data
    if kind == "execute-snapshot":
        executed = _execute(signal_id, data)
        if isinstance(executed, Ignored):  # a requester that gave an id is watching for it: told ABORTED
            return Ignored(executed.reason, label=executed.label, id=own_id)
        return executed
    if kind == "stop-snapshot":
        return _stop(signal_id, data)
    if kind == "pause-snapshot":
        return PauseSnapshot(signal_id)
    if kind == "resume-snapshot":
        return ResumeSnapshot(signal_id)
    if kind == "log":
        message = data.get("message")
        return LogSignal(signal_id, message) if isinstance(message, str) else Ignored("a log signal needs a message")
    return Ignored(f"signal type {kind!r} is not one cdcd acts on")


def _data(raw: Any) -> dict[str, Any] | Ignored:
    """The signal's data: an object, or a JSON text of one (Debezium's form); none is an empty object."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, str):
        return _json_object(raw, "data")
    return raw if isinstance(raw, dict) else Ignored("its data is not a JSON object")


def _json_object(text: str | bytes, what: str) -> dict[str, Any] | Ignored:
    document = untrusted.json_object(text, what)
    return _ignored(document) if isinstance(document, Rejected) else document


def _ignored(rejected: Rejected) -> Ignored:
    return Ignored(rejected.detail, label=rejected.reason)


def _snapshot_type(data: dict[str, Any]) -> Ignored | None:
    kind = data.get("type", "incremental")
    if not isinstance(kind, str) or kind.lower() != "incremental":
        return Ignored(f"snapshot type {kind!r}: cdcd takes incremental snapshots only")
    return None


def _collections(data: dict[str, Any], required: bool) -> tuple[str, ...] | Ignored:
    raw = data.get("data-collections")
    if raw is None and not required:
        return ()
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw or not all(isinstance(c, str) and c for c in raw):
        return Ignored("data-collections must be a non-empty list of table names")
    if len(raw) > MAX_COLLECTIONS:
        return Ignored(f"data-collections names {len(raw)} (at most {MAX_COLLECTIONS})", label="too_large")
    for pattern in raw:
        if isinstance(matcher := untrusted.pattern(pattern), Rejected):
            return _ignored(matcher)
    return tuple(raw)


def _execute(signal_id: str, data: dict[str, Any]) -> ExecuteSnapshot | Ignored:
    refused = _snapshot_type(data)
    if refused is not None:
        return refused
    if data.get("surrogate-key"):
        return Ignored("surrogate-key is not supported: cdcd chunks a table by its primary key or replica identity")
    collections = _collections(data, required=True)
    if isinstance(collections, Ignored):
        return collections
    conditions = _conditions(data)
    if isinstance(conditions, Ignored):
        return conditions
    return ExecuteSnapshot(signal_id, collections, conditions)


def _conditions(data: dict[str, Any]) -> tuple[tuple[str, str], ...] | Ignored:
    raw = data.get("additional-conditions", [])
    if not isinstance(raw, list):
        return Ignored("additional-conditions must be a list of {data-collection, filter}")
    if len(raw) > MAX_COLLECTIONS:
        return Ignored(f"additional-conditions has {len(raw)} (at most {MAX_COLLECTIONS})", label="too_large")
    out = []
    for item in raw:
        if not isinstance(item, dict):
            return Ignored("additional-conditions must be a list of {data-collection, filter}")
        collection, condition = item.get("data-collection"), item.get("filter")
        if not isinstance(collection, str) or not collection or not isinstance(condition, str):
            return Ignored("each additional condition needs a data-collection and a filter")
        if isinstance(matcher := untrusted.pattern(collection), Rejected):
            return _ignored(matcher)
        if condition.strip():
            rendered = untrusted.condition(condition)
            if isinstance(rendered, Rejected):
                return _ignored(rendered)
            out.append((collection, rendered))
    return tuple(out)


def _stop(signal_id: str, data: dict[str, Any]) -> StopSnapshot | Ignored:
    refused = _snapshot_type(data)
    if refused is not None:
        return refused
    collections = _collections(data, required=False)
    return collections if isinstance(collections, Ignored) else StopSnapshot(signal_id, collections)


def matches(pattern: str, table: str) -> bool:
    """A data collection of a signal names ``table``: the same name, or a regular expression matching all of it
    (as Debezium's). A pattern that is not a regular expression matches only its own name."""
    return untrusted.names(pattern, table)


def select(patterns: Sequence[str], tables: Sequence[str]) -> list[str]:
    """The ``tables`` some pattern names, in the order of the patterns (each once)."""
    out: list[str] = []
    for pattern in patterns:
        out.extend(t for t in tables if matches(pattern, t) and t not in out)
    return out


def condition_for(table: str, conditions: Sequence[tuple[str, str]]) -> str | None:
    """The filters of ``conditions`` for ``table`` (each as cdcd rendered it), ANDed (None: no condition)."""
    found = [f for collection, f in conditions if matches(collection, table)]
    if not found:
        return None
    return found[0] if len(found) == 1 else " AND ".join(f"({f})" for f in found)
