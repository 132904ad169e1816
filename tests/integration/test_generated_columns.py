"""Generated columns, snapshot and stream alike. On PostgreSQL 18 a publication with ``publish_generated_columns =
stored`` (made by cdcd, or found) sends a STORED generated column like any other: the initial snapshot's records
hold it too, under the same schema (one registry version), its field marked ``pg.generated``; a VIRTUAL one is
never sent. Without the setting, and on every major before 18, no generated column is sent, by the snapshot
neither; there the setting is a configuration error (exit 2, nothing written)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from tests.integration.conftest import Database, PgServer, run_on, start_pg
from tests.integration.kafka_harness import Run
from tests.integration.test_check import run_cdcd

pytestmark = pytest.mark.integration

TABLE = """
CREATE TABLE items (
    id int PRIMARY KEY,
    price int NOT NULL,
    doubled int GENERATED ALWAYS AS (price * 2) STORED,
    {virtual}
    note text
);
INSERT INTO items (id, price, note) VALUES (1, 10, 'a'), (2, 20, 'b');
"""
VIRTUAL = "tripled int GENERATED ALWAYS AS (price * 3) VIRTUAL,"  # PostgreSQL 18's default kind
STORED = {"name": "cdcd_pub", "tables": [{"name": "public.items"}], "publish_generated_columns": "stored"}


@pytest.fixture(scope="module")
def pg18() -> PgServer:
    return start_pg("18")


@pytest.fixture
def run18(pg18: PgServer, kafka_env: dict[str, str], tmp_path: Path) -> Iterator[Run]:
    """A Run on PostgreSQL 18 whatever CDCD_TEST_PG_VERSIONS says: publishing generated columns is new in 18."""
    yield from run_on(pg18, kafka_env, tmp_path)


def _changes(run: Run) -> dict[tuple[str, int], dict[str, Any]]:
    """(op, id) -> the after image, of the snapshot's reads and the stream's changes of items."""
    topic = f"{run.prefix}.public.items"
    values = [e.value for e in run.events if e.topic == topic and e.value]
    return {(v["op"], v["after"]["id"]): v["after"] for v in values}


def _value_fields(run: Run) -> dict[str, dict[str, Any]]:
    """The fields of the items Value record in the registry, by name; its subject must hold one version (the
    snapshot's records and the stream's have one schema)."""
    registry = SchemaRegistryClient({"url": run.env["CDCD_SCHEMA_REGISTRY__URL"]})
    subject = f"{run.prefix}.public.items-value"
    assert registry.get_versions(subject) == [1]
    envelope = json.loads(registry.get_latest_version(subject).schema.schema_str or "{}")
    return {f["name"]: f for f in envelope["fields"][0]["type"][1]["fields"]}


def _snapshot_then_stream(run: Run, source: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    run.start(source=source)
    run.wait_confirmed()
    run.db.execute("INSERT INTO items (id, price, note) VALUES (3, 30, 'c'); UPDATE items SET price = 11 WHERE id = 1")
    run.sync()
    return _changes(run)


def _rows(generated: bool) -> dict[tuple[str, int], dict[str, Any]]:
    rows = {
        ("r", 1): {"id": 1, "price": 10, "doubled": 20, "note": "a"},
        ("r", 2): {"id": 2, "price": 20, "doubled": 40, "note": "b"},
        ("c", 3): {"id": 3, "price": 30, "doubled": 60, "note": "c"},
        ("u", 1): {"id": 1, "price": 11, "doubled": 22, "note": "a"},
    }
    if not generated:
        for row in rows.values():
            del row["doubled"]
    return rows


@pytest.mark.parametrize("made", ["by_cdcd", "by_hand", "without"])
def test_stored_generated_columns_arrive_alike_from_the_snapshot_and_the_stream_on_18(run18: Run, made: str) -> None:
    """``by_cdcd``: a managed publication with the setting; ``by_hand``: an existing one with it (cdcd reads
    pubgencols); ``without``: an existing one without it."""
    db = run18.db
    db.execute(TABLE.format(virtual=VIRTUAL))
    source: dict[str, Any] = {"publications": [STORED], "manage_publications": True}
    if made != "by_cdcd":
        setting = " WITH (publish_generated_columns = stored)" if made == "by_hand" else ""
        db.execute(f"CREATE PUBLICATION cdcd_pub FOR TABLE items{setting}")
        source = {}
    published = made != "without"
    assert _snapshot_then_stream(run18, source) == _rows(generated=published)
    assert db.execute("SELECT pubgencols FROM pg_publication WHERE pubname = 'cdcd_pub'") == [
        ("s" if published else "n",)
    ]
    fields = _value_fields(run18)
    assert list(fields) == ["id", "price", *(["doubled"] if published else []), "note"]  # never tripled
    assert [name for name, f in fields.items() if "pg.generated" in f] == (["doubled"] if published else [])
    if published:
        assert fields["doubled"]["pg.generated"] == "stored"
    assert run18.stop() == 0


@pytest.mark.every_pg  # the snapshot's column list, on every major
@pytest.mark.pg_before(18)  # 18: test_stored_generated_columns_arrive_alike_from_the_snapshot_and_the_stream_on_18
def test_before_18_no_generated_column_is_sent_by_the_snapshot_either(run: Run, db: Database) -> None:
    db.execute(TABLE.format(virtual="") + "CREATE PUBLICATION cdcd_pub FOR TABLE items;")
    assert _snapshot_then_stream(run, {}) == _rows(generated=False)
    assert list(_value_fields(run)) == ["id", "price", "note"]
    assert run.stop() == 0


@pytest.mark.every_pg  # the server's version decides
@pytest.mark.pg_before(18)
def test_before_18_publishing_generated_columns_is_a_config_error(db: Database, tmp_path: Path) -> None:
    db.execute(TABLE.format(virtual=""))
    source = {"dsn": db.dsn(), "slot": f"s_{db.name}", "publications": [STORED], "manage_publications": True}
    for command in ("check", "run"):
        result = run_cdcd(command, config={"source": source, "sink": {"kind": "jsonl"}}, tmp_path=tmp_path)
        assert result.returncode == 2, (command, result.stderr)
        expected = f"sets publish_generated_columns: stored, but the server is PostgreSQL {db.server.version}"
        assert expected in result.stderr, (command, result.stderr)
    assert db.execute("SELECT pubname FROM pg_publication") == []
    assert db.execute("SELECT slot_name FROM pg_replication_slots WHERE slot_name = %s", [f"s_{db.name}"]) == []
