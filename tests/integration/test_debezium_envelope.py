"""cdcd and Debezium's PostgreSQL connector side by side: the same workload, each from its own slot made before
it, decoded the same way and compared field by field (``debezium_compare``)."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Database, PgServer, scratch_database, stack15
from tests.integration.debezium_compare import Registry, by_kind, compare_topics, read_topics, subjects, summary
from tests.integration.kafka_harness import Run, delete_topics

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE typed (
    id int PRIMARY KEY, b bool, i2 int2, i4 int4, i8 int8, o oid, f4 float4, f8 float8,
    n numeric(10, 2), nv numeric, t text NOT NULL, vc varchar(20), c char(3), nm name,
    js json, jb jsonb, x xml, tz timetz, by bytea, u uuid, d date, tm time, ts timestamp, tstz timestamptz,
    ts3 timestamp(3), tm3 time(3), iv interval, ai int4[], at text[], an numeric(6, 1)[], m mood, ip inet, big text
);
ALTER TABLE typed ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE by_index (id int PRIMARY KEY, a int NOT NULL, b text NOT NULL, v text);
CREATE UNIQUE INDEX by_index_ab ON by_index (a, b);
ALTER TABLE by_index REPLICA IDENTITY USING INDEX by_index_ab;
CREATE TABLE full_rows (id int PRIMARY KEY, v text, n numeric);
ALTER TABLE full_rows REPLICA IDENTITY FULL;
CREATE TABLE done (id int PRIMARY KEY);
CREATE PUBLICATION cdcd_pub FOR TABLE typed, by_index, full_rows, done;
"""

BIG = "x" * 9000  # stored out of line, not compressed (STORAGE EXTERNAL)

WORKLOAD = [
    "INSERT INTO typed VALUES (1, true, 2, 4, 8, 99, 1.5, 2.25, 12345678.91, 3.14159, 'text', 'varchar', 'ab',"
    " 'name', '{\"a\": 1}', '{\"b\": [1, 2]}', '<x>1</x>', '12:34:56.789+02', '\\x0102ff',"
    " 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '2024-05-03', '12:34:56.123456', '2024-05-03 12:34:56.123456',"
    " '2024-05-03 12:34:56.123456+02', '2024-05-03 12:34:56.123', '12:34:56.789', '1 year 2 mons 3 days 04:05:06.5',"
    " '{1,2,NULL}', '{a,\"b c\"}', '{1.5,NULL}', 'happy', '192.168.0.1/24', '" + BIG + "')",
    "INSERT INTO typed (id, t) VALUES (2, 'nulls')",
    "INSERT INTO typed (id, t, nv, d, ts, tstz, f8, iv) VALUES"
    " (3, 'edges', -0.000001, '0001-01-01', 'infinity', '-infinity', 'NaN', '-3 days')",
    "INSERT INTO typed (id, t, nv, d, ts, tstz, ts3, tz) VALUES"
    " (4, 'more edges', 'NaN', 'infinity', '-infinity', 'infinity', '-infinity', '00:30:00-03:30'),"
    " (5, 'whole', 100, '1970-01-01', '2024-05-03 12:00:00', '2024-05-03 12:00:00+00', '2024-05-03 12:00:00',"
    "  '12:00:00+00'),"
    " (6, 'half', 1.50, '0044-03-15 BC', '2024-05-03 12:00:00.5', '0044-03-15 12:00:00.5+00 BC', NULL, NULL),"
    " (7, 'big', -1.28, '9999-12-31', '10000-01-01 00:00:00', '10000-01-01 00:00:00.000010+00', NULL, NULL)",
    "UPDATE typed SET t = 'changed', n = -1.28 WHERE id = 1",  # big: unchanged TOAST
    "UPDATE typed SET id = 10 WHERE id = 2",  # a key change
    "DELETE FROM typed WHERE id = 3",
    "INSERT INTO by_index VALUES (1, 1, 'one', 'v'), (2, 2, 'two', 'v')",
    "UPDATE by_index SET v = 'w' WHERE id = 1",
    "UPDATE by_index SET a = 20 WHERE id = 2",  # the identity index's key changes
    "DELETE FROM by_index WHERE id = 1",
    "INSERT INTO full_rows VALUES (1, 'one', 1.5), (2, 'two', NULL)",
    "UPDATE full_rows SET v = 'uno' WHERE id = 1",
    "UPDATE full_rows SET id = 20 WHERE id = 2",
    "DELETE FROM full_rows WHERE id = 1",
    "BEGIN; INSERT INTO full_rows VALUES (3, 'tx', 3); SELECT pg_logical_emit_message(true, 'pfx', 'in a tx'); COMMIT",
    "SELECT pg_logical_emit_message(false, 'pfx', 'outside')",
    "TRUNCATE full_rows",
    "INSERT INTO done VALUES (1)",
]


# Every kind of difference found (a pattern over debezium_compare.general's paths: * any text, ? one
# character), each listed in docs/kafka.md's "Differences from Debezium" with its reason. The test fails on a
# difference not listed, and on a listed one that no longer occurs.
DELIBERATE = {
    "* value*.unchanged_toast": "cdcd names unchanged TOAST columns (an added envelope field)",
    "* value*.source.commit_lsn": "cdcd adds the transaction's commit LSN to source",
    "<table> value schema.field order": "unchanged_toast, added last",
    "* value schema.source.field order": "commit_lsn, added last",
    "<table> headers.__debezium.context.*": "Kafka Connect's per-message context headers (run and task ids)",
    "<table> value.after.nm": "Debezium sends null for columns of type name (it does not map the type)",
    "<table> value.after.d": "date ±infinity: Debezium sends an overflowed day count, cdcd the int's max/min",
    "<table> value schema.before[].a?": "arrays: cdcd's union [array, string] also carries multi-dimensional"
    " arrays and other bounds (as text), which Debezium cannot represent",
    "*value.source.sequence": "sequence's first element: cdcd the last commit's LSN, Debezium the LSN it last"
    " processed (which depends on its batching)",
    "message value.source.ts_*": "a non-transactional message has no commit time: cdcd sends its arrival time,"
    " Debezium the last commit's",
    "<table> key*": "REPLICA IDENTITY USING INDEX: cdcd keys by the identity index, which every old row carries;"
    " Debezium by the primary key, which a delete's old row lacks (its key is then id 0)",
    "<table> headers.__debezium.*key": "the same: the key-change headers name the identity index's columns",
    "transaction *.id": "END repeats BEGIN's id (they pair); Debezium's END names the LSN it had reached",
    "transaction value.data_collections[].data_collection": "a transaction's logical decoding messages are"
    " counted as the collection 'message'; Debezium names it after a Java object (LogicalDecodingMessageId@<hash>)",
}


@pytest.fixture
def side_by_side(pg15: PgServer, debezium_env: dict[str, str], tmp_path: Path) -> Iterator[tuple[Database, Run, str]]:
    """A database with the schema, cdcd's and Debezium's slots made, Debezium streaming; yields the database, the
    Run (not started) and Debezium's topic prefix. Everything made is removed afterwards."""
    with scratch_database(pg15) as db:
        db.execute(SCHEMA)
        run = Run(db, debezium_env, tmp_path)
        name = f"dbz_{db.name}"
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [name])
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [run.slot])
        try:
            stack15(
                "debezium-connector", "start", name, db.name, name, "cdcd_pub",
                "provide.transaction.metadata=true", "skipped.operations=none",
            )  # fmt: skip
            yield db, run, name
        finally:
            run.close()
            stack15("debezium-connector", "stop", name)
            delete_topics(debezium_env["CDCD_KAFKA__BOOTSTRAP_SERVERS"], (f"{name}.",))  # cdcd's: run.close()


def _wait_for_done(registry: Registry, bootstrap: str, prefix: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while "public.done" not in read_topics(bootstrap, registry, prefix):
        assert time.monotonic() < deadline, f"{prefix}: the last change never arrived"
        time.sleep(1)


def test_envelopes_equal_debeziums(side_by_side: tuple[Database, Run, str]) -> None:
    db, run, dbz_prefix = side_by_side
    for statement in WORKLOAD:
        db.execute(statement)
    run.start(extra={"snapshot": {"mode": "never", "state_dir": str(run.tmp_path / "state")}}, envelope="debezium")
    bootstrap = run.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"]
    registry = Registry(run.env["CDCD_SCHEMA_REGISTRY__URL"])
    _wait_for_done(registry, bootstrap, dbz_prefix)
    run.wait_confirmed()
    time.sleep(2)  # Debezium's other topics: produced before the last one, acknowledged by now
    mine = read_topics(bootstrap, registry, run.prefix)
    theirs = read_topics(bootstrap, registry, dbz_prefix)
    kinds = by_kind(compare_topics(mine, run.prefix, theirs, dbz_prefix))
    dump = run.tmp_path / "topics.json"
    dump.write_text(json.dumps({"cdcd": mine, "debezium": theirs}, default=_json, indent=1))
    listed = DELIBERATE
    unlisted = {k: ds for k, ds in kinds.items() if not any(_matches(k, p) for p in listed)}
    report = "\n".join(summary(unlisted))
    assert not unlisted, f"{len(unlisted)} unlisted kinds of difference (messages in {dump}):\n{report}"
    gone = [p for p in listed if not any(_matches(k, p) for k in kinds)]
    assert not gone, f"listed differences that no longer occur (update docs/kafka.md and this list): {gone}"
    assert {"<table> value.after.nm", "<table> value.after.d"} <= set(kinds)  # the comparison sees values
    # subject names: TopicNameStrategy on both sides, for every topic with keys and values
    url = run.env["CDCD_SCHEMA_REGISTRY__URL"]
    mine_subjects, their_subjects = subjects(url, run.prefix, mine), subjects(url, dbz_prefix, theirs)
    assert mine_subjects == their_subjects
    assert {"<prefix>.public.typed-key", "<prefix>.public.typed-value", "<prefix>.transaction-value"} <= mine_subjects


def _matches(kind: str, pattern: str) -> bool:
    return re.fullmatch(re.escape(pattern).replace(r"\*", ".*").replace(r"\?", "."), kind) is not None


def _json(value: object) -> object:
    if isinstance(value, bytes):
        return value.hex()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(type(value))
