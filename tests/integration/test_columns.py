"""Column selection and masking on the real stack: what a consumer reads from Kafka (through the registry) is what
PostgreSQL itself computes for each rule (``encode(sha256(convert_to(salt || value, 'UTF8')), 'hex')`` for the
hash), the column left out is in no record and no registered schema, through an initial snapshot, inserts, an
update leaving a TOASTed value unchanged, a key change, a delete and an incremental snapshot, in either envelope."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.integration.conftest import Database
from tests.integration.kafka_harness import KEY_HEADERS, Event, Run, read_partitions
from tests.integration.test_snapshot import cdcd_snapshot, wait_log

pytestmark = pytest.mark.integration

SALT = "pepper-é"
SCHEMA = """
CREATE TABLE people (id int PRIMARY KEY, email text NOT NULL, tax_id varchar(20), photo bytea, notes text);
ALTER TABLE people ALTER notes SET STORAGE EXTERNAL;  -- TOASTed out of line, uncompressed: sent only when changed
CREATE PUBLICATION cdcd_pub FOR TABLE people;
INSERT INTO people VALUES (1, 'ann@example.com', '123-45-6789', '\\x00ff', 'snapshot row'),
                          (2, 'bob@example.com', NULL, NULL, repeat('long notes ', 2000));
"""
RULES = {
    "exclude": ["photo"],
    "mask": {"id": "hash", "email": "hash", "tax_id": {"keep_last": 4}, "notes": {"truncate": 10}},
}


def start(run: Run, tmp_path: Path, envelope: str, rules: dict[str, Any]) -> Run:
    salt = tmp_path / "salt"
    salt.write_text(SALT + "\n")
    columns = {"hash_salt_file": str(salt), "tables": {"public.people": rules}}
    return run.start(extra={"columns": columns}, envelope=envelope, transaction_topic=False)


def expected(db: Database, ids: list[int]) -> dict[int, dict[str, Any]]:
    """What PostgreSQL computes for each rule over the rows as they are now."""
    rows = db.execute(
        "SELECT id, encode(sha256(convert_to(%s || id::text, 'UTF8')), 'hex'),"
        " encode(sha256(convert_to(%s || email, 'UTF8')), 'hex'),"
        " repeat('*', greatest(length(tax_id) - 4, 0)) || right(tax_id, 4), left(notes, 10)"
        " FROM people WHERE id = ANY(%s)",
        [SALT, SALT, ids],
    )
    return {r[0]: {"id": r[1], "email": r[2], "tax_id": r[3], "notes": r[4]} for r in rows}


def people(run: Run) -> list[Event]:
    """The table's records once cdcd confirmed everything committed; the key-change headers decoded as either
    envelope writes them (cdcd's: Avro keys; Debezium's: JSON)."""
    run.wait_confirmed()
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": run.env["CDCD_SCHEMA_REGISTRY__URL"]}))
    topic = f"{run.prefix}.public.people"
    keys, values = SerializationContext(topic, MessageField.KEY), SerializationContext(topic, MessageField.VALUE)
    events = []
    for m in read_partitions(run.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"], run.prefix):
        if m.topic() != topic:
            continue
        key, value = m.key(), m.value()
        headers: list[tuple[str, bytes]] = m.headers() or []  # type: ignore[assignment]
        moved = {
            name: json.loads(raw) if raw[:1] == b"{" else deserialize(raw, keys)
            for name, raw in headers
            if raw and name in KEY_HEADERS
        }
        decoded = (
            None if key is None else deserialize(key, keys),
            None if value is None else deserialize(value, values),
        )
        events.append(Event(topic, *decoded, moved))
    return events


@pytest.mark.parametrize("envelope", ["native", "debezium"])
def test_masked_and_excluded_columns_in_kafka_and_the_registry(
    run: Run, db: Database, tmp_path: Path, envelope: str
) -> None:
    db.execute(SCHEMA)
    start(run, tmp_path, envelope, RULES)
    snapshot = expected(db, [1, 2])
    db.execute("INSERT INTO people VALUES (3, 'cy@example.com', 'AB12', '\\x01', 'new')")
    inserted = expected(db, [3])
    db.execute("UPDATE people SET email = 'bob@example.org' WHERE id = 2")  # notes: an unchanged TOAST value
    updated = expected(db, [2])
    db.execute("UPDATE people SET id = 20 WHERE id = 1")  # a key change: delete, tombstone, create
    moved = expected(db, [20])
    db.execute("DELETE FROM people WHERE id = 3")
    events = people(run)
    assert all("photo" not in (e.value["after"] or e.value["before"]) for e in events if e.value)
    afters = [(e.value["op"], e.key, e.value["after"]) for e in events if e.value and e.value["after"]]
    assert afters == [
        ("r", {"id": snapshot[1]["id"]}, snapshot[1]),
        ("r", {"id": snapshot[2]["id"]}, snapshot[2]),
        ("c", {"id": inserted[3]["id"]}, inserted[3]),
        # unchanged TOAST: null (Debezium's layout: no placeholder for a masked column), named as such
        ("u", {"id": updated[2]["id"]}, {**updated[2], "notes": None}),
        ("c", {"id": moved[20]["id"]}, moved[20]),
    ]
    update = next(e.value for e in events if e.value and e.value["op"] == "u")
    assert update["unchanged_toast"] == ["notes"]
    key_change = [e for e in events if e.value and e.value["op"] == "d" and e.key == {"id": snapshot[1]["id"]}]
    assert len(key_change) == 1
    assert key_change[0].value is not None
    assert key_change[0].value["before"]["id"] == snapshot[1]["id"]  # the before image: the old key, hashed
    assert key_change[0].moved == {"__debezium.newkey": {"id": moved[20]["id"]}}
    created = next(e for e in events if e.value and e.value["op"] == "c" and e.key == {"id": moved[20]["id"]})
    assert created.moved == {"__debezium.oldkey": {"id": snapshot[1]["id"]}}
    deleted = [e for e in events if e.key == {"id": inserted[3]["id"]} and (e.value is None or e.value["op"] == "d")]
    assert [e.value is None for e in deleted] == [False, True]  # the delete and its tombstone
    # an incremental snapshot (cdcd snapshot): its rows masked alike
    result = cdcd_snapshot(run, "public.people")
    assert result.returncode == 0, result.stderr
    wait_log(run, "table snapshot finished", count=2)  # the initial one, then this one
    now = expected(db, [2, 20])
    incremental = [e for e in people(run) if e.value and e.value["source"]["snapshot"] == "incremental"]
    got = {(e.key or {}).get("id"): e.value["after"] for e in incremental if e.value}
    assert got == {now[i]["id"]: now[i] for i in (2, 20)}
    registry = SchemaRegistryClient({"url": run.env["CDCD_SCHEMA_REGISTRY__URL"]})
    topic = f"{run.prefix}.public.people"
    value = json.loads(registry.get_latest_version(f"{topic}-value").schema.schema_str or "{}")
    fields = {f["name"]: f for f in value["fields"][0]["type"][1]["fields"]}
    assert list(fields) == ["id", "email", "tax_id", "notes"]
    assert fields["email"]["type"] == ("string" if envelope == "debezium" else ["null", "string"])
    assert fields["email"]["cdcd.mask"] == "hash"
    key = json.loads(registry.get_latest_version(f"{topic}-key").schema.schema_str or "{}")
    assert [(f["name"], f["type"]) for f in key["fields"]] == [("id", "string")]
    assert "pepper" not in run.log.read_text()  # the salt is never logged
    assert run.stop() == 0


def test_a_key_column_left_out_stops_cdcd_with_exit_2(run: Run, db: Database, tmp_path: Path) -> None:
    db.execute(SCHEMA)
    with contextlib.suppress(AssertionError):  # "cdcd run exited 2" before its slot was active, or after
        start(run, tmp_path, "native", {"exclude": ["id"]})
    assert run.proc is not None
    assert run.proc.wait(timeout=60) == 2
    assert "columns.tables.public.people: key column 'id' cannot be left out" in run.log.read_text()
