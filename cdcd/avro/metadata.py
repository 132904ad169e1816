"""Fixed-schema events beside the per-table envelopes: logical decoding messages and transaction metadata.

Both follow Debezium's layouts so its consumers work: ``<prefix>.message`` carries pg_logical_emit_message()
messages (key: prefix), ``<prefix>.transaction`` a BEGIN and an END event per transaction (key: its id) with
the END's event counts per table. These are a few events per transaction, so fastavro's writer is fast enough.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from cdcd.avro.encoder import SourceInfo, TxInfo, block_datum, source_datum, write_long, write_string
from cdcd.avro.schema import block_schema, source_schema
from cdcd.pgoutput.messages import LogicalMessage

_PG: Final = "io.debezium.connector.postgresql"


def _field(name: str, kind: str, nullable: bool) -> dict[str, Any]:
    return {"name": name, "type": ["null", kind], "default": None} if nullable else {"name": name, "type": kind}


def _connect(schema: dict[str, Any], full_name: str) -> dict[str, Any]:
    """The schema with Kafka Connect's name and version, as Debezium's converter registers it."""
    return {**schema, "connect.version": 1, "connect.name": full_name}


_COMMON: Final = "io.debezium.connector.common"


def _common_record(name: str, fields: list[dict[str, Any]]) -> dict[str, Any]:
    """A record of Debezium's common namespace, with Kafka Connect's name (heartbeats, notifications)."""
    schema = {"type": "record", "name": name, "namespace": _COMMON, "fields": fields}
    return _connect(schema, f"{_COMMON}.{name}")


def message_key_schema(*, debezium: bool = False) -> dict[str, Any]:
    """The message topic's Key: the message prefix (nullable in Debezium's layout)."""
    schema = {
        "type": "record",
        "name": "MessageKey",
        "namespace": _PG,
        "fields": [_field("prefix", "string", debezium)],
    }
    return _connect(schema, f"{_PG}.MessageKey") if debezium else schema


def message_value_schema(*, debezium: bool = False) -> dict[str, Any]:
    """The message topic's Value; Debezium's layout adds the transaction block and makes prefix and content
    nullable."""
    message = {
        "type": "record",
        "name": "Message",
        "fields": [_field("prefix", "string", debezium), _field("content", "bytes", debezium)],
    }
    fields: list[dict[str, Any]] = [
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
        {"name": "source", "type": source_schema(debezium=debezium)},
    ]
    if debezium:
        fields.append({"name": "transaction", "type": ["null", block_schema()], "default": None})
        message = _connect(message, f"{_PG}.Message")
    fields.append({"name": "message", "type": message})
    schema = {"type": "record", "name": "MessageValue", "namespace": _PG, "fields": fields}
    return _connect(schema, f"{_PG}.MessageValue") if debezium else schema


MESSAGE_KEY: Final[dict[str, Any]] = message_key_schema()


_COLLECTION_FIELDS: Final = [{"name": "data_collection", "type": "string"}, {"name": "event_count", "type": "long"}]

TRANSACTION_KEY: Final[dict[str, Any]] = {
    "type": "record",
    "name": "TransactionMetadataKey",
    "namespace": "io.debezium.connector.common",
    "fields": [{"name": "id", "type": "string"}],
}

TRANSACTION_VALUE: Final[dict[str, Any]] = {
    "type": "record",
    "name": "TransactionMetadataValue",
    "namespace": "io.debezium.connector.common",
    "fields": [
        {"name": "status", "type": "string"},
        {"name": "id", "type": "string"},
        {"name": "event_count", "type": ["null", "long"], "default": None},
        {
            "name": "data_collections",
            "type": [
                "null",
                {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "ConnectDefault",
                        "namespace": "io.confluent.connect.avro",
                        "fields": _COLLECTION_FIELDS,
                    },
                },
            ],
            "default": None,
        },
        {"name": "ts_ms", "type": "long"},
    ],
}

# Debezium's own layouts of the same events (kafka.envelope: debezium)
DEBEZIUM_MESSAGE_KEY: Final[dict[str, Any]] = message_key_schema(debezium=True)
DEBEZIUM_MESSAGE_VALUE: Final[dict[str, Any]] = message_value_schema(debezium=True)


DEBEZIUM_TRANSACTION_KEY: Final = _connect(TRANSACTION_KEY, "io.debezium.connector.common.TransactionMetadataKey")
DEBEZIUM_TRANSACTION_VALUE: Final[dict[str, Any]] = {
    **TRANSACTION_VALUE,
    "fields": [
        *TRANSACTION_VALUE["fields"][:3],
        {
            "name": "data_collections",
            "type": [
                "null",
                {
                    "type": "array",
                    "items": [
                        "null",
                        {
                            "type": "record",
                            "name": "collection",
                            "namespace": "event",
                            "fields": _COLLECTION_FIELDS,
                            "connect.version": 1,
                            "connect.name": "event.collection",
                        },
                    ],
                },
            ],
            "default": None,
        },
        TRANSACTION_VALUE["fields"][4],
    ],
    "connect.version": 1,
    "connect.name": "io.debezium.connector.common.TransactionMetadataValue",
}

_PARSED: dict[str, Any] = {}


def _encode(name: str, schema: dict[str, Any], datum: dict[str, Any]) -> bytes:
    from fastavro import parse_schema, schemaless_writer  # noqa: PLC0415 - a 0.1 s import start-up does not need

    parsed = _PARSED.get(name)
    if parsed is None:
        parsed = _PARSED[name] = parse_schema(schema)
    out = io.BytesIO()
    schemaless_writer(out, parsed, datum)
    return out.getvalue()


def encode_message(prefix_name: str, message: LogicalMessage, source: SourceInfo, ts_ms: int) -> tuple[bytes, bytes]:
    """Key and value of a logical decoding message event (its source has empty schema and table)."""
    key = _encode("message_key", MESSAGE_KEY, {"prefix": message.prefix})
    value = _encode(
        "message_value",
        message_value_schema(),
        {
            "op": "m",
            "ts_ms": ts_ms,
            "source": source_datum(source, message.lsn, prefix_name, "", ""),
            "message": {"prefix": message.prefix, "content": message.content},
        },
    )
    return key, value


def encode_debezium_message(
    prefix_name: str, message: LogicalMessage, source: SourceInfo, ts_ms: int, transaction: TxInfo | None
) -> tuple[bytes, bytes]:
    """Key and value of a logical decoding message event in Debezium's layout (a transactional message carries
    the transaction block, its id ``<xid>:<message LSN>``)."""
    key = _encode("debezium_message_key", DEBEZIUM_MESSAGE_KEY, {"prefix": message.prefix})
    lsn = message.lsn
    datum = {
        "op": "m",
        "ts_ms": ts_ms,
        "source": source_datum(source, lsn, prefix_name, "", "", debezium=True),
        "transaction": block_datum(transaction, source, lsn, debezium=True),
        "message": {"prefix": message.prefix, "content": message.content},
    }
    return key, _encode("debezium_message_value", DEBEZIUM_MESSAGE_VALUE, datum)


@dataclass(frozen=True)
class TransactionEvent:
    status: str  # BEGIN or END
    id: str
    ts_ms: int
    event_count: int | None = None
    data_collections: tuple[tuple[str, int], ...] | None = None
    debezium: bool = False  # Debezium's layout: DEBEZIUM_TRANSACTION_VALUE, its collection records nullable


def encode_transaction(event: TransactionEvent) -> tuple[bytes, bytes]:
    """Key and value of a transaction metadata event: two per transaction, so written by hand with the
    encoder's primitives (byte-identical to fastavro, tests/unit/test_avro_metadata.py)."""
    return encode_transaction_fields(
        event.status, event.id, event.ts_ms, event.event_count, event.data_collections, event.debezium
    )


_BEGIN = write_string("BEGIN")
_END = write_string("END")


def encode_transaction_fields(  # noqa: PLR0917 - the compiled transaction_event's positional signature
    status: str,
    txn_id: str,
    ts_ms: int,
    event_count: int | None,
    data_collections: tuple[tuple[str, int], ...] | None,
    debezium: bool,
) -> tuple[bytes, bytes]:
    """``encode_transaction`` of the event's fields (no event object on the per-transaction path). The Python
    reference of cdcd._native's ``transaction_event`` (the row stage's ``transaction_fields_encoder``)."""
    key = write_string(txn_id)
    count = b"\x00" if event_count is None else b"\x02" + write_long(event_count)
    if data_collections is None:
        collections = b"\x00"
    elif not data_collections:
        collections = b"\x02\x00"  # union branch 1, an empty array
    else:
        branch = b"\x02" if debezium else b""  # Debezium's items are a union with null: its branch 1
        items = b"".join(branch + write_string(name) + write_long(n) for name, n in data_collections)
        collections = b"\x02" + write_long(len(data_collections)) + items + b"\x00"
    head = _BEGIN if status == "BEGIN" else _END if status == "END" else write_string(status)
    return key, head + key + count + collections + write_long(ts_ms)


TransactionFieldsEncoder = Callable[
    [str, str, int, int | None, tuple[tuple[str, int], ...] | None, bool], tuple[bytes, bytes]
]


def encode_transaction_reference(event: TransactionEvent) -> tuple[bytes, bytes]:
    """The same with fastavro from the schemas: the reference the hand-written encoding is tested against."""
    debezium = event.debezium
    key_schema = DEBEZIUM_TRANSACTION_KEY if debezium else TRANSACTION_KEY
    value_schema = DEBEZIUM_TRANSACTION_VALUE if debezium else TRANSACTION_VALUE
    layout = "debezium_" if event.debezium else ""
    key = _encode(f"{layout}transaction_key", key_schema, {"id": event.id})
    collections = (
        None
        if event.data_collections is None
        else [{"data_collection": name, "event_count": count} for name, count in event.data_collections]
    )
    value = _encode(
        f"{layout}transaction_value",
        value_schema,
        {
            "status": event.status,
            "id": event.id,
            "event_count": event.event_count,
            "data_collections": collections,
            "ts_ms": event.ts_ms,
        },
    )
    return key, value


# Heartbeats (kafka.heartbeat): Debezium's key and value (io.debezium.connector.common.ServerNameKey, Heartbeat),
# the value with two fields more: the positions cdcd had then.
HEARTBEAT_KEY: Final = _common_record("ServerNameKey", [{"name": "serverName", "type": "string"}])
HEARTBEAT_VALUE: Final = _common_record(
    "Heartbeat",
    [
        {"name": "ts_ms", "type": "long"},
        {"name": "lsn", "type": "long", "doc": "the WAL position cdcd may confirm: everything before is in Kafka"},
        {"name": "received_lsn", "type": "long", "doc": "the highest WAL position received from the server"},
    ],
)


def encode_heartbeat(server_name: str, ts_ms: int, lsn: int, received_lsn: int) -> tuple[bytes, bytes]:
    """Key and value of a heartbeat record."""
    key = _encode("heartbeat_key", HEARTBEAT_KEY, {"serverName": server_name})
    value = _encode("heartbeat_value", HEARTBEAT_VALUE, {"ts_ms": ts_ms, "lsn": lsn, "received_lsn": received_lsn})
    return key, value


# Snapshot notifications (notifications.kafka.topic): Debezium's key and value
# (io.debezium.connector.common.NotificationKey, Notification).
NOTIFICATION_KEY: Final = _common_record("NotificationKey", [{"name": "id", "type": "string"}])
NOTIFICATION_VALUE: Final = _common_record(
    "Notification",
    [
        {"name": "id", "type": "string"},
        {"name": "type", "type": "string"},
        {"name": "aggregate_type", "type": "string"},
        {"name": "additional_data", "type": ["null", {"type": "map", "values": "string"}], "default": None},
        {"name": "timestamp", "type": "long"},
    ],
)


def encode_notification(
    notification_id: str, kind: str, aggregate_type: str, additional_data: dict[str, str], timestamp: int
) -> tuple[bytes, bytes]:
    """Key and value of a notification record."""
    key = _encode("notification_key", NOTIFICATION_KEY, {"id": notification_id})
    value = _encode(
        "notification_value",
        NOTIFICATION_VALUE,
        {
            "id": notification_id,
            "type": kind,
            "aggregate_type": aggregate_type,
            "additional_data": additional_data,
            "timestamp": timestamp,
        },
    )
    return key, value
