"""cdcd's topics read by software nobody here wrote: tools/avroread (Go: franz-go, its registry client, hamba/avro)
decodes every topic of a run — tables with every mapped type, the transaction and message topics, tombstones,
a truncate, a schema change — and what it prints must equal PostgreSQL's rows and what the Python consumer
(confluent_kafka's AvroDeserializer, i.e. fastavro) decoded, message by message and field by field.

One representation, avroread's JSON (documented in tools/avroread/tojson.go), is the yardstick: ``avro_json``
turns Python values (fastavro's and psycopg's) into it by their Python type only — Decimal to plain notation with
its own exponent's digits, bytes to base64, datetimes to ISO text (aware ones in UTC with Z), UUID to text,
floats kept floats, NaN/±Infinity to those strings. Values are compared as canonical JSON text, so 1 never equals
1.0 or true. On the PostgreSQL side, columns whose Avro form is PostgreSQL's text form are selected as ``::text``,
float4 as ``::float8`` (exact), intervals built from their fields into Debezium's ISO-8601 shape, and an array
column as JSON (a JSON array, or its text form when it has no Avro array shape): see ``EXPECTED``.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.conftest import Database, PgServer
from tests.integration.kafka_harness import Event, Run, scratch_run

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN positive AS int CHECK (VALUE > 0);
CREATE TABLE typed (id bigint PRIMARY KEY, b bool, i2 smallint, i4 int, i8 bigint, o oid, f4 real,
    f8 double precision, n numeric(12,3), n0 numeric(5,0), nu numeric, t text, vc varchar(10), bp char(3), nm name,
    ch "char", by bytea, u uuid, d date, tm time, ts timestamp, tz timestamptz, tt timetz, iv interval, j json,
    jb jsonb, x xml, ai int[], at text[], an numeric(6,2)[], ats timestamptz[], md int[], m mood, pos positive,
    pt point);
CREATE TABLE pairs (a int, b text, v text, PRIMARY KEY (a, b));
CREATE TABLE nokey (v text);
ALTER TABLE nokey REPLICA IDENTITY FULL;
CREATE PUBLICATION cdcd_pub FOR TABLE typed, pairs, nokey;
"""

TYPED_ROWS = """
INSERT INTO typed VALUES
 (1, true, -7, 2147483647, 9000000000, 4294967295, 1.1, 2.25, 1234567.891, 12345, 3.14159265358979323846264,
  'héllo ✓ 😀', 'vc', 'ab', 'a name', 'q', '\\x00ff10'::bytea, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
  '2024-02-29', '13:14:15.5', '2024-02-29 13:14:15.123456', '2024-02-29 13:14:15.123456+02', '13:14:15+05:30',
  '1 year 2 mons 3 days 04:05:06.5', '{"a": [1, 2.5, "x"]}', '{"b": {"c": null}}', '<a x="1">t</a>',
  '{1,NULL,3}', '{"x,y","NULL",NULL,""}', '{1.5,-0.25,NULL}', '{"2024-01-01 00:00:00+00",NULL}', '{4,5}',
  'happy', 42, '(1.5,-2)'),
 (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
 (3, false, 0, -2147483648, -9223372036854775808, 0, 'NaN', '-Infinity', -0.001, -99999, 'NaN', '', '', '',
  '', 'x', '\\x'::bytea, '00000000-0000-0000-0000-000000000000', '0001-01-01', '23:59:59.999999',
  '1969-12-31 23:59:59.999999', '1969-12-31 23:59:59.999999+00', '00:00:00-12', '-1 years -2 mons +3 days -04:05:06.25',
  '[]', '[]', '', '{}', '{}', '{}', '{}', '{{1,2},{3,4}}', 'sad', 1, '(0,0)'),
 (4, true, 32767, 1, 1, 1, 3.4028235e38, 5e-324, 0, 0, 0.000000001, E'quote " backslash \\\\ newline \\n tab \\t',
  'z', 'abc', 'n', 'z', decode(repeat('ff', 300), 'hex'), 'ffffffff-ffff-ffff-ffff-ffffffffffff', '9999-12-31',
  '00:00:00', '9999-12-31 23:59:59.999999', '2262-04-11 23:47:16.854775+00', '23:59:59.999999+14', '0 seconds',
  '1', '"s"', '<empty/>', '{-1}', '{"\\\\"}', '{0.01}', '{"1969-12-31 23:59:59.999999+00"}', '[0:1]={7,8}',
  'ok', 2147483647, '(1e300,-1e-300)'),
 (5, true, 5, 5, 5, 5, 1, 1, 1, 1, 1, 'five', 'five', 'f', 'five', 'f', '\\x05'::bytea, gen_random_uuid(),
  '1970-01-01', '12:00:00', '1970-01-01 00:00:00', '1970-01-01 00:00:00+00', '12:00:00+00', '1 day',
  'null', 'null', '<five/>', '{5}', '{five}', '{5}', '{}', '{}', 'ok', 5, '(5,5)')
"""

# The Avro-JSON form of each column as PostgreSQL computes it (see the module docstring); others as selected.
EXPECTED = {
    "f4": "f4::float8",
    "iv": "CASE WHEN iv IS NOT NULL THEN format('P%sY%sM%sDT%sH%sM%sS', extract(year FROM iv),"
    " extract(month FROM iv), extract(day FROM iv), extract(hour FROM iv), extract(minute FROM iv),"
    " trim_scale(extract(second FROM iv))) END",
    "md": "CASE WHEN array_ndims(md) > 1 OR array_lower(md, 1) <> 1 THEN to_jsonb(md::text) ELSE to_jsonb(md) END",
    **{c: f"{c}::text" for c in ("nu", "tt", "j", "jb", "x", "m", "pos", "pt")},
}
TABLE_KEYS = {"typed": ("id",), "pairs": ("a", "b")}


def avro_json(value: Any) -> Any:
    """A Python value (fastavro's or psycopg's) in avroread's JSON form (tools/avroread/tojson.go)."""
    if value is None or isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        return value if math.isfinite(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            return _iso(value)
        return _iso(value.astimezone(dt.UTC)) + "Z"
    if isinstance(value, dt.date):
        return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
    if isinstance(value, dt.time) and value.tzinfo is None:
        return f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}.{value.microsecond:06d}"
    if isinstance(value, list):
        return [avro_json(v) for v in value]
    if isinstance(value, dict):
        return {k: avro_json(v) for k, v in value.items()}
    raise TypeError(f"no Avro-JSON form for {type(value).__name__} {value!r}")


def _iso(value: dt.datetime) -> str:
    return f"{value.year:04d}-{value.month:02d}-{value.day:02d}T{value:%H:%M:%S}.{value.microsecond:06d}"


def assert_same(path: str, got: Any, want: Any) -> None:
    """Equal as canonical JSON, recursively, naming the first path that differs."""
    if isinstance(got, dict) and isinstance(want, dict):
        assert sorted(got) == sorted(want), f"{path}: fields {sorted(got)} != {sorted(want)}"
        for k in got:
            assert_same(f"{path}.{k}", got[k], want[k])
    elif isinstance(got, list) and isinstance(want, list):
        assert len(got) == len(want), f"{path}: {len(got)} items != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(f"{path}[{i}]", g, w)
    else:
        assert json.dumps(got) == json.dumps(want), f"{path}: avroread {got!r} != {want!r}"


def read_topics(binary: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    kafka, registry = env["CDCD_KAFKA__BOOTSTRAP_SERVERS"], env["CDCD_SCHEMA_REGISTRY__URL"]
    command = [str(binary), "-bootstrap-servers", kafka, "-registry-url", registry, "-timeout", "60s", *args]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)


@pytest.fixture
def run15(pg15: PgServer, kafka_env: dict[str, str], tmp_path: Path) -> Iterator[Run]:
    with scratch_run(pg15, SCHEMA, kafka_env, tmp_path) as r:
        yield r


def workload(db: Database) -> dict[int, dict[str, int]]:
    """Changes of every kind; returns, per transaction id, the rows PostgreSQL says each statement changed."""
    counts: dict[int, dict[str, int]] = {}
    with db.connect() as conn:
        conn.execute("BEGIN")
        xid = conn.execute("SELECT txid_current()").fetchone()[0]  # type: ignore[index]
        typed = conn.execute(TYPED_ROWS).rowcount
        pairs = conn.execute("INSERT INTO pairs VALUES (1, 'a', 'x'), (1, 'b', 'y'), (2, 'a', 'z')").rowcount
        nokey = conn.execute("INSERT INTO nokey VALUES ('one'), ('two')").rowcount
        conn.execute("COMMIT")
        counts[xid] = {"typed": typed, "pairs": pairs, "nokey": nokey}

        conn.execute("BEGIN")
        xid = conn.execute("SELECT txid_current()").fetchone()[0]  # type: ignore[index]
        typed = conn.execute("UPDATE typed SET t = 'updated', f8 = 0.1 WHERE id = 1").rowcount
        typed += 2 * conn.execute("UPDATE typed SET id = 40 WHERE id = 4").rowcount  # key change: delete + create
        typed += conn.execute("DELETE FROM typed WHERE id = 5").rowcount
        pairs = conn.execute("UPDATE pairs SET v = 'changed' WHERE a = 1").rowcount
        pairs += conn.execute("DELETE FROM pairs WHERE a = 2").rowcount
        nokey = conn.execute("UPDATE nokey SET v = 'uno' WHERE v = 'one'").rowcount
        nokey += conn.execute("DELETE FROM nokey WHERE v = 'two'").rowcount
        conn.execute("SELECT pg_logical_emit_message(true, 'app', '\\x00ff41'::bytea)")
        conn.execute("COMMIT")
        counts[xid] = {"typed": typed, "pairs": pairs, "nokey": nokey}

        conn.execute("SELECT pg_logical_emit_message(false, 'app', 'outside')")
        conn.execute("TRUNCATE pairs")
        conn.execute("INSERT INTO pairs VALUES (3, 'c', 'after truncate')")
        conn.execute("ALTER TABLE typed ADD COLUMN note text")
        conn.execute("UPDATE typed SET note = 'note ' || id")
    return counts


def source_rows(db: Database, table: str) -> dict[str, dict[str, Any]]:
    """PostgreSQL's rows in Avro-JSON form, by key (canonical JSON of the key columns)."""
    with db.connect() as conn:
        names = [c.name for c in conn.execute(f"SELECT * FROM {table} LIMIT 0").description or []]
        select = ", ".join(f'{EXPECTED.get(c, c)} AS "{c}"' for c in names)
        rows = conn.execute(f"SELECT {select} FROM {table}").fetchall()
    out = {}
    for row in rows:
        record = {c: avro_json(v) for c, v in zip(names, row, strict=True)}
        out[json.dumps({k: record[k] for k in TABLE_KEYS[table]}, sort_keys=True)] = record
    return out


def mirrored_rows(lines: list[dict[str, Any]], topic: str) -> dict[str, dict[str, Any]]:
    """A table rebuilt from avroread's lines of its topic (one partition, in offset order)."""
    rows: dict[str, dict[str, Any]] = {}
    for line in lines:
        if line["topic"] != topic or line["value"] is None:
            continue
        op, key = line["value"]["op"], json.dumps(line["key"], sort_keys=True)
        if op == "t":
            rows.clear()
        elif op == "d":
            del rows[key]
        else:
            rows[key] = line["value"]["after"]
    return rows


def test_go_reader_agrees_with_postgres_and_python(run15: Run, avroread: Path) -> None:
    db, prefix = run15.db, run15.prefix
    run15.start()
    counts = workload(db)
    events = run15.sync()
    moved = ("-avro-header", "__debezium.oldkey", "-avro-header", "__debezium.newkey")
    result = read_topics(avroread, run15.env, *moved, "-regex", re.escape(prefix) + r"\..*")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]

    # Every message the Python consumer decoded, decoded alike by avroread, field by field.
    python: dict[tuple[str, int, int], Event] = {(e.topic, e.partition, e.offset): e for e in events}
    assert sorted(python) == sorted((g["topic"], g["partition"], g["offset"]) for g in lines)
    for line in lines:
        event = python[line["topic"], line["partition"], line["offset"]]
        where = f"{line['topic']}@{line['offset']}"
        assert_same(f"{where} key", line["key"], avro_json(event.key))
        assert_same(f"{where} value", line["value"], avro_json(event.value))
        assert_same(f"{where} headers", {h["key"]: h["value"] for h in line["headers"]}, avro_json(event.moved))
    assert {h["key"] for line in lines for h in line["headers"]} == {"__debezium.oldkey", "__debezium.newkey"}
    topics = {line["topic"] for line in lines}
    assert topics == {
        f"{prefix}.{t}" for t in ("public.typed", "public.pairs", "public.nokey", "transaction", "message")
    }
    assert {line["partition"] for line in lines} == {0}

    # The tables, rebuilt from avroread's lines, equal PostgreSQL's rows; the schema change is visible.
    for table in TABLE_KEYS:
        expected, mirrored = source_rows(db, table), mirrored_rows(lines, f"{prefix}.public.{table}")
        assert sorted(mirrored) == sorted(expected), table
        for key, row in expected.items():
            assert_same(f"{table} {key}", mirrored[key], row)
    typed = [line for line in lines if line["topic"] == f"{prefix}.public.typed" and line["value"]]
    assert len({line["value_schema_id"] for line in typed}) == 2
    assert "note" not in typed[0]["value"]["after"]
    assert typed[-1]["value"]["after"]["note"] == "note 40"
    nokey = [line for line in lines if line["topic"] == f"{prefix}.public.nokey"]
    assert [line["key"] for line in nokey] == [None] * 4  # REPLICA IDENTITY FULL, no primary key: no key
    changes = [(line["value"]["op"], line["value"]["before"]) for line in nokey]
    assert changes == [("c", None), ("c", None), ("u", {"v": "one"}), ("d", {"v": "two"})]

    # A tombstone (null value, same key) follows each keyed delete.
    for topic in (f"{prefix}.public.typed", f"{prefix}.public.pairs"):
        stream = [line for line in lines if line["topic"] == topic]
        deletes = [i for i, line in enumerate(stream) if line["value"] and line["value"]["op"] == "d"]
        assert deletes
        for i in deletes:
            assert stream[i + 1]["value"] is None
            assert stream[i + 1]["value_schema_id"] is None
            assert stream[i + 1]["key"] == stream[i]["key"]

    # The transaction topic: BEGIN and END of each transaction, END counting what PostgreSQL changed.
    ends = {
        int(line["value"]["id"].split(":")[0]): line["value"]
        for line in lines
        if line["topic"] == f"{prefix}.transaction" and line["value"]["status"] == "END"
    }
    for xid, changed in counts.items():
        collections = {c["data_collection"]: c["event_count"] for c in ends[xid]["data_collections"]}
        assert collections == {f"{prefix}.public.{t}": n for t, n in changed.items()}
        assert ends[xid]["event_count"] == sum(changed.values())

    # The message topic: pg_logical_emit_message's prefix and bytes, transactional or not.
    messages = [line for line in lines if line["topic"] == f"{prefix}.message" and line["key"]["prefix"] == "app"]
    assert [m["value"]["message"] for m in messages] == [
        {"prefix": "app", "content": base64.b64encode(b"\x00\xffA").decode()},
        {"prefix": "app", "content": base64.b64encode(b"outside").decode()},
    ]
    assert all(m["value"]["op"] == "m" for m in messages)


def test_go_reader_refuses_what_is_not_confluent_avro(avroread: Path, kafka_env: dict[str, str]) -> None:
    name = f"avroread_{uuid.uuid4().hex[:8]}"
    bad_magic, unknown_id = f"{name}.magic", f"{name}.unknown"
    admin = AdminClient({"bootstrap.servers": kafka_env["CDCD_KAFKA__BOOTSTRAP_SERVERS"]})
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in (bad_magic, unknown_id)]).values():
        future.result(timeout=30)
    producer = Producer({"bootstrap.servers": kafka_env["CDCD_KAFKA__BOOTSTRAP_SERVERS"]})
    producer.produce(bad_magic, value=b"\x01\x00\x00\x00\x01\x02")
    producer.produce(unknown_id, key=None, value=b"\x00\x7f\xff\xff\xf0\x02")
    assert producer.flush(30) == 0

    result = read_topics(avroread, kafka_env, bad_magic)
    assert result.returncode == 1
    assert f"topic {bad_magic} partition 0 offset 0: value: not the Confluent wire format" in result.stderr
    assert "it starts 01 00 00 00 01" in result.stderr
    result = read_topics(avroread, kafka_env, unknown_id)
    assert result.returncode == 1
    assert f"topic {unknown_id} partition 0 offset 0: value: schema id 2147483632 is unknown to the registry" in (
        result.stderr
    )
    result = read_topics(avroread, kafka_env, "-regex", f"{name}_nothing.*")
    assert (result.returncode, result.stderr.strip()) == (1, f'avroread: no topic matches -regex "{name}_nothing.*"')
    result = subprocess.run(
        [str(avroread)], check=False, capture_output=True, text=True, env={"PATH": os.environ["PATH"]}
    )
    assert result.returncode == 2
    assert "no Kafka: give -bootstrap-servers or set CDCD_KAFKA__BOOTSTRAP_SERVERS" in result.stderr
