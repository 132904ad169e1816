"""Control input from outside the configuration, tried as an attacker would against a running `cdcd run` to Kafka:
a database role with no privilege on anything writes snapshot requests into the WAL (``pg_logical_emit_message``
is executable by PUBLIC), and signal records carry SQL in their conditions, patterns that backtrack and JSON
nested past Python's recursion limit. Nothing of it runs as SQL, no row the publication's row filter keeps out
reaches Kafka, cdcd keeps running, and requests signed with the key (``cdcd snapshot``) and well-formed signals are
still acted on."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest

from tests.integration.conftest import Database, cdcd_env
from tests.integration.kafka_harness import Event, Run
from tests.integration.test_kafka_signals import _notices, _send, signal_topic

pytestmark = pytest.mark.integration
REQUEST = ["--table", "public.acct", "--where", "id <= 4"]
__all__ = ["signal_topic"]  # the fixture, used by name

SCHEMA = """
CREATE TABLE acct (id int PRIMARY KEY, tenant text NOT NULL, secret text NOT NULL);
INSERT INTO acct SELECT i, CASE WHEN i % 2 = 0 THEN 'public' ELSE 'other' END, 'secret' || i
  FROM generate_series(1, 10) i;
ALTER TABLE acct REPLICA IDENTITY FULL;
CREATE TABLE victim (id int PRIMARY KEY);
CREATE PUBLICATION cdcd_pub FOR TABLE acct WHERE (tenant = 'public');
"""


@pytest.fixture
def mallory(db: Database) -> Iterator[str]:
    """A role that may log in and nothing else: the DSN it connects with."""
    role = f"mallory_{uuid.uuid4().hex[:8]}"
    db.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'mallory-pw'")
    yield f"{db.dsn()} user={role} password=mallory-pw"
    db.execute(f"DROP ROLE {role}")


def _emit(dsn: str, content: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_logical_emit_message(false, 'cdcd.snapshot', %s)", [content])


def _execute(signal_id: str, collections: list[str], condition: str | None = None) -> dict[str, object]:
    data: dict[str, object] = {"data-collections": collections, "type": "incremental"}
    if condition is not None:
        data["additional-conditions"] = [{"data-collection": "public.acct", "filter": condition}]
    return {"id": signal_id, "type": "execute-snapshot", "data": data}


@pytest.mark.full_pg_only
@pytest.mark.pg_since(15)  # publication row filters
def test_an_unprivileged_role_and_a_signal_writer_can_neither_run_sql_nor_leak_rows_nor_stop_cdcd(
    db: Database, run: Run, signal_topic: str, mallory: str
) -> None:
    db.execute(SCHEMA)
    run.start(
        extra={
            "snapshot": {"state_dir": str(run.tmp_path / "state"), "chunk_size": 3},
            "signals": {"kafka": {"topic": signal_topic, "poll_interval_s": 0.2}},
            "notifications": {"kafka": {"topic": f"{run.prefix}.notifications"}},
        }
    )
    run.consume_until(lambda events: any(n["type"] == "COMPLETED" for n in _notices(run, events)))
    with psycopg.connect(mallory) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT * FROM acct")

    slot = run.slot
    _emit(mallory, f'{{"slot": "{slot}", "table": "public.acct", "where": "true) OR (true", "id": "x2"}}')
    _emit(mallory, f'{{"slot": "{slot}", "table": "public.acct", "where": null, "id": "x3"}}')
    _emit(mallory, "[" * 100_000)
    _emit(mallory, "[" * 50_000)
    _send(
        run,
        signal_topic,
        _execute("drop", ["public.acct"], "true)) ORDER BY 1; DROP TABLE public.victim; --"),
        _execute("leak", ["public.acct"], "true) OR (true"),
        _execute("subquery", ["public.acct"], "id IN (SELECT id FROM public.acct WHERE tenant = 'other')"),
        _execute("redos", ["(.|.)*Z"]),
        _execute("overflow", ["a{9999999999}"]),
        b"[" * 50_000,
        b"{" * 100_000,
    )
    subprocess.run(
        [sys.executable, "-m", "cdcd", "snapshot", "--config", str(run.tmp_path / "run.yaml"), *REQUEST],
        check=True,
        env=cdcd_env(),
        capture_output=True,
    )
    db.execute("INSERT INTO acct VALUES (11, 'public', 'secret11'), (13, 'other', 'secret13')")
    _send(run, signal_topic, _execute("fine", ["public.acct"], "id > 6"))

    def done(events: list[Event]) -> bool:
        notices = _notices(run, events)
        completed = [n for n in notices if n["type"] == "COMPLETED" and n["aggregate_type"] == "Incremental Snapshot"]
        return len(completed) == 2 and any(e.key == {"id": 11} for e in events)

    run.consume_until(done, timeout=120)
    events = run.sync(timeout=120)  # the rows before the notifications, in topics read so far or not
    assert run.proc is not None
    assert run.proc.poll() is None, f"cdcd stopped:\n{run.log.read_text()[-3000:]}"
    assert db.execute("SELECT count(*) FROM victim") == [(0,)]
    rows = [e.value for e in events if e.topic == f"{run.prefix}.public.acct" and e.value is not None]
    assert {r["after"]["tenant"] for r in rows} == {"public"}
    # 11 is streamed, and read by "fine" too unless the stream brought it while the chunk's window was open
    read = Counter(r["after"]["id"] for r in rows if r["op"] == "r" and r["after"]["id"] != 11)
    assert read == {2: 2, 4: 2, 6: 1, 8: 2, 10: 2}  # initial, `cdcd snapshot` (id <= 4), "fine" (id > 6)
    assert [r["op"] for r in rows if r["after"]["id"] == 11][:1] == ["c"]
    aborted = {n["id"] for n in _notices(run, events) if n["type"] == "ABORTED"}
    assert aborted == {"drop", "leak", "subquery"}  # the patterns are RE2's to match (no table), not refused
    assert run.stop() == 0
