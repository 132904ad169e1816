"""Heartbeats: when one is due, what it says, its record, and that it never confirms anything new."""

from __future__ import annotations

import io
import math

from fastavro import parse_schema, schemaless_reader

from cdcd.avro.metadata import HEARTBEAT_KEY, HEARTBEAT_VALUE
from cdcd.heartbeat import Heartbeat, HeartbeatClock
from cdcd.ledger import Ledger
from cdcd.shaping import EventShaper
from tests.unit.test_shaping import Registry


def test_off_never_due() -> None:
    clock = HeartbeatClock(0, now=100.0)
    assert not clock.due(1e12)
    assert clock.wake_in(100.0) == math.inf


def test_due_every_interval_from_the_last_beat() -> None:
    ledger = Ledger(start_lsn=10)
    ledger.received(30)
    clock = HeartbeatClock(5, now=100.0)
    assert not clock.due(104.9)
    assert clock.wake_in(103.0) == 2.0
    assert clock.due(105.0)
    beat = clock.beat(107.0, ledger, unix_ms=1234)  # came late: the next is 5 s after this one
    assert beat == Heartbeat(1234, 10, 30)
    assert not clock.due(111.9)
    assert clock.due(112.0)
    assert clock.wake_in(113.0) == 0.0


def test_record_is_debeziums_keyed_by_the_server_name() -> None:
    registry = Registry()
    shaper = EventShaper("shop", registry)
    records: list[tuple[str, bytes | None, bytes | None, object]] = []
    shaper.heartbeat("__debezium-heartbeat.shop", Heartbeat(1234, 0x100, 0x200), lambda *r: records.append(r))
    [(topic, key, value, headers)] = records
    assert topic == "__debezium-heartbeat.shop"
    assert headers is None
    assert registry.topics == ["__debezium-heartbeat.shop"]
    assert key is not None
    assert value is not None
    key_id, value_id = int.from_bytes(key[1:5], "big"), int.from_bytes(value[1:5], "big")
    assert registry.schemas[key_id]["connect.name"] == "io.debezium.connector.common.ServerNameKey"
    assert registry.schemas[value_id]["connect.name"] == "io.debezium.connector.common.Heartbeat"
    assert schemaless_reader(io.BytesIO(key[5:]), parse_schema(HEARTBEAT_KEY)) == {"serverName": "shop"}
    decoded = schemaless_reader(io.BytesIO(value[5:]), parse_schema(HEARTBEAT_VALUE))
    assert decoded == {"ts_ms": 1234, "lsn": 0x100, "received_lsn": 0x200}


def test_a_heartbeat_entry_confirms_nothing_new() -> None:
    """As the sinks write it: an entry at the confirmable position, behind a pending transaction."""
    ledger = Ledger(start_lsn=10)
    txn = ledger.open(500)
    txn.outstanding += 1
    ledger.seal(txn)
    beat = ledger.open(ledger.flushed_lsn)
    beat.outstanding += 1
    ledger.seal(beat)
    ledger.ack(beat)
    assert ledger.flushed_lsn == 10  # the transaction before it is not in Kafka yet
    ledger.ack(txn)
    assert ledger.flushed_lsn == 500
