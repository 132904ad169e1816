"""What a configuration error about an unknown key adds: the nearest key that exists where it was written ("did
you mean interval_s?"), or, for a Debezium connector property, cdcd's key for it or that it has none.

Pure: the settings model is passed in (``cdcd.config`` imports this module, not the other way round).
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Sequence

from pydantic import BaseModel


def nested_models(annotation: object) -> list[type[BaseModel]]:
    """The settings models a field's type holds: itself, or in a list, a mapping's values, an Optional."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in nested_models(arg)]


_DEFAULT_MODE = "none: kafka.envelope debezium writes what Debezium's default ({}) does; native: Avro logical types"
# Debezium PostgreSQL connector properties (as written in a connector's config) and what cdcd has for each
DEBEZIUM: dict[str, str] = {
    "slot.name": "source.slot",
    "publication.name": "source.publications[].name",
    "publication.autocreate.mode": "source.manage_publications (with the tables, schemas or patterns it lists)",
    "plugin.name": "none: cdcd always decodes pgoutput",
    "database.hostname": "source.dsn (host=… port=… dbname=… user=…)",
    "database.port": "source.dsn",
    "database.user": "source.dsn",
    "database.dbname": "source.dsn",
    "database.password": "source.password_file, or the password in source.dsn",
    "topic.prefix": "kafka.topic_prefix",
    "table.include.list": "source.publications[].include_tables",
    "table.exclude.list": "source.publications[].exclude_tables",
    "column.include.list": "columns.tables.<schema.table>.include",
    "column.exclude.list": "columns.tables.<schema.table>.exclude",
    "message.prefix.include.list": "source.message_prefixes.include",
    "message.prefix.exclude.list": "source.message_prefixes.exclude",
    "heartbeat.interval.ms": "kafka.heartbeat.interval_s (seconds)",
    "heartbeat.action.query": "kafka.heartbeat.action_query",
    "incremental.snapshot.chunk.size": "snapshot.chunk_size",
    "signal.kafka.topic": "signals.kafka.topic",
    "signal.data.collection": "none: signals come from the Kafka topic signals.kafka.topic (or `cdcd snapshot`)",
    "notification.sink.topic.name": "notifications.kafka.topic",
    "tombstones.on.delete": "kafka.tombstones_on_delete",
    "skipped.operations": "source.publications[].publish (the operations published)",
    "exactly.once.support": "kafka.delivery: exactly_once",
    "decimal.handling.mode": _DEFAULT_MODE.format("precise"),
    "time.precision.mode": _DEFAULT_MODE.format("adaptive"),
    "binary.handling.mode": _DEFAULT_MODE.format("bytes"),
    "interval.handling.mode": _DEFAULT_MODE.format("numeric"),
    "hstore.handling.mode": _DEFAULT_MODE.format("json"),
    "provide.transaction.metadata": "kafka.transaction_topic",
    "transforms": "none: cdcd has no single message transforms",
}


def unknown_key(root: type[BaseModel], loc: Sequence[str | int]) -> str:
    """The hint for the key at ``loc`` that the model does not have (empty: none to give)."""
    key = str(loc[-1])
    debezium = DEBEZIUM.get(key.lower().replace("_", ".").replace("-", "."))
    if debezium is not None:
        return f"Debezium's {key.replace('_', '.')}; cdcd: {debezium}"
    model = _model_at(root, loc[:-1])
    if model is None:
        return ""
    near = difflib.get_close_matches(key, list(model.model_fields), n=1, cutoff=0.6)
    if not near:
        return f"the keys here: {', '.join(model.model_fields)}"
    return f"did you mean {near[0]}?"


def _model_at(root: type[BaseModel], path: Sequence[str | int]) -> type[BaseModel] | None:
    """The model of the section at ``path`` (list indexes and mapping keys passed through), if it is one."""
    model: type[BaseModel] | None = root
    keyed = False  # the last field was a mapping: the next part is one of its keys (a table's name)
    for part in path:
        if model is None:
            return None
        if isinstance(part, int) or keyed:
            keyed = False
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        keyed = typing.get_origin(field.annotation) is dict
        model = next(iter(nested_models(field.annotation)), None)
    return model
