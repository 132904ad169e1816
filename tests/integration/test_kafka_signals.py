"""Snapshots driven by Debezium's Kafka signals and watched on its notification topic: an execute-snapshot record
starts an incremental snapshot (its notifications come in order, its rows reach the tables' topics), a
stop-snapshot record aborts one, a malformed record is skipped, and a restart does not act on a consumed signal
again (its offset is kept with the snapshot state: the state file, or the progress record under exactly-once)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.integration.conftest import Database, cdcd_env
from tests.integration.kafka_harness import Event, Run, delete_topics

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TABLE big (id int PRIMARY KEY, v text NOT NULL);
CREATE TABLE small (id int PRIMARY KEY, v text NOT NULL);
INSERT INTO big SELECT i, 'v' || i FROM generate_series(1, {big}) i;
INSERT INTO small SELECT i, 'v' || i FROM generate_series(1, 50) i;
CREATE PUBLICATION cdcd_pub FOR TABLE big, small;
"""


@pytest.fixture
def signal_topic(run: Run) -> Iterator[str]:
    topic = f"{run.prefix}-signal"  # Debezium's default name; outside the prefix's (Avro) topics
    yield topic
    delete_topics(run.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"], (topic,))


def _start(run: Run, signal_topic: str, chunk_size: int, delivery: str = "at_least_once") -> None:
    run.start(
        delivery=delivery,
        extra={
            "snapshot": {"state_dir": str(run.tmp_path / "state"), "chunk_size": chunk_size, "mode": "never"},
            "signals": {"kafka": {"topic": signal_topic, "poll_interval_s": 0.2}},
            "notifications": {"kafka": {"topic": f"{run.prefix}.notifications"}},
        },
    )


def _send(run: Run, topic: str, *values: dict[str, Any] | bytes) -> None:
    producer = Producer({"bootstrap.servers": run.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"]})
    for value in values:
        producer.produce(topic, key=run.prefix, value=value if isinstance(value, bytes) else json.dumps(value))
    assert producer.flush(30) == 0


def _notices(run: Run, events: list[Event]) -> list[dict[str, Any]]:
    return [e.value for e in events if e.topic == f"{run.prefix}.notifications" and e.value is not None]


def _read(run: Run, events: list[Event], table: str) -> list[int]:
    topic = f"{run.prefix}.public.{table}"
    return [e.value["after"]["id"] for e in events if e.topic == topic and e.value and e.value["op"] == "r"]


def _everything(run: Run) -> list[Event]:
    """Every record cdcd committed so far, read to the end of each topic (read_committed: a Kafka transaction's
    markers keep a partition's end offset past its last record, so ``Run.sync`` does not fit exactly-once)."""
    run.wait_confirmed()
    return run.read_to_end()


def _reading_signals(run: Run, count: int, timeout: float = 30) -> dict[str, Any]:
    """The ``count``-th "reading signals" line of the log (one per start), once it is there."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [json.loads(x) for x in run.log.read_text().splitlines() if '"reading signals"' in x]
        if len(lines) >= count:
            return lines[count - 1]  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, f"no 'reading signals' line:\n{run.log.read_text()[-3000:]}"
        time.sleep(0.1)


def _until_notice(run: Run, kind: str, timeout: float = 120) -> list[Event]:
    return run.consume_until(lambda events: any(n["type"] == kind for n in _notices(run, events)), timeout)


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_execute_snapshot_signal_notifies_in_order_and_once(
    db: Database, run: Run, signal_topic: str, delivery: str
) -> None:
    db.execute(SCHEMA.format(big=5000))
    _start(run, signal_topic, chunk_size=1000, delivery=delivery)
    execute = {
        "id": "snap-1",
        "type": "execute-snapshot",
        "data": {
            "data-collections": ["public.small", r"public\.b.*"],
            "type": "incremental",
            "additional-conditions": [{"data-collection": "public.big", "filter": "id <= 3500"}],
        },
    }
    _send(run, signal_topic, b"{not json", {"type": "execute-snapshot", "data": {}}, execute)
    events = _until_notice(run, "COMPLETED")
    notices = _notices(run, events)
    assert {n["id"] for n in notices} == {"snap-1"}
    assert {n["aggregate_type"] for n in notices} == {"Incremental Snapshot"}
    kinds = [(n["type"], n["additional_data"].get("scanned_collection")) for n in notices]
    assert kinds == [
        ("STARTED", None),
        ("IN_PROGRESS", None),
        ("TABLE_SCAN_COMPLETED", "public.small"),
        *[("IN_PROGRESS", None)] * 4,
        ("TABLE_SCAN_COMPLETED", "public.big"),
        ("COMPLETED", None),
    ], kinds
    assert notices[0]["additional_data"]["data_collections"] == "public.small,public.big"
    progress = [n["additional_data"] for n in notices if n["type"] == "IN_PROGRESS"]
    assert [p["total_rows_scanned"] for p in progress] == ["50", "1000", "2000", "3000", "3500"]
    assert all(p["connector_name"] == run.prefix for p in progress)
    assert progress[-1]["last_processed_key"] == "3500"
    big_done = notices[-2]["additional_data"]
    assert (big_done["total_rows_scanned"], big_done["status"]) == ("3500", "SUCCEEDED")

    events = _everything(run)
    assert sorted(_read(run, events, "small")) == list(range(1, 51))
    assert sorted(_read(run, events, "big")) == list(range(1, 3501))
    skipped = [line for line in run.log.read_text().splitlines() if '"signal record skipped"' in line]
    assert len(skipped) == 2, skipped

    assert run.stop() == 0
    _start(run, signal_topic, chunk_size=1000, delivery=delivery)
    assert _reading_signals(run, 2)["offsets"] == {"0": 3}
    time.sleep(2)  # several polls of the signal topic
    db.execute("INSERT INTO small VALUES (51, 'after the restart')")
    events = _everything(run)
    small = [e.value["op"] for e in events if e.value and e.topic == f"{run.prefix}.public.small"]
    assert small == ["r"] * 50 + ["c"]
    assert len(_read(run, events, "big")) == 3500
    assert _notices(run, events) == notices
    assert run.stop() == 0


def test_stop_snapshot_signal_aborts_it(db: Database, run: Run, signal_topic: str) -> None:
    db.execute(SCHEMA.format(big=100_000))
    _start(run, signal_topic, chunk_size=200)
    _send(run, signal_topic, {"type": "execute-snapshot", "data": {"data-collections": ["public.big"]}})
    _until_notice(run, "IN_PROGRESS")
    _send(run, signal_topic, {"id": "stop-1", "type": "stop-snapshot", "data": {"type": "INCREMENTAL"}})
    _until_notice(run, "ABORTED")
    time.sleep(1)  # a chunk already handed to Kafka still arrives; nothing after it
    events = _everything(run)
    notices = _notices(run, events)
    kinds = [n["type"] for n in notices]
    assert kinds[0] == "STARTED", kinds
    assert kinds[-1] == "ABORTED", kinds
    assert set(kinds[1:-1]) == {"IN_PROGRESS"}
    assert notices[-1]["additional_data"]["data_collections"] == "public.big"
    assert len({n["id"] for n in notices}) == 1  # the snapshot's id (the offset of a signal without one)
    read = _read(run, events, "big")
    assert 0 < len(read) < 100_000
    assert run.logged("incremental snapshot stopped")["table"] == "public.big"
    time.sleep(1)
    assert len(_read(run, _everything(run), "big")) == len(read)
    assert run.stop() == 0


def test_the_initial_snapshot_notifies_and_cdcd_snapshot_requests_too(
    db: Database, run: Run, signal_topic: str
) -> None:
    """No signal topic needed for notifications: the initial snapshot's (aggregate type Initial Snapshot) and
    those of an incremental snapshot `cdcd snapshot` asked for."""
    db.execute(SCHEMA.format(big=2500))
    run.start(
        extra={
            "snapshot": {"state_dir": str(run.tmp_path / "state"), "chunk_size": 1000},
            "notifications": {"kafka": {"topic": f"{run.prefix}.notifications"}},
        }
    )
    events = _until_notice(run, "COMPLETED")
    initial = _notices(run, events)
    assert {n["aggregate_type"] for n in initial} == {"Initial Snapshot"}
    assert len({n["id"] for n in initial}) == 1
    kinds = [(n["type"], n["additional_data"].get("scanned_collection")) for n in initial]
    done = {table for kind, table in kinds if kind == "TABLE_SCAN_COMPLETED"}
    assert kinds[0] == ("STARTED", None)
    assert kinds[-1] == ("COMPLETED", None)
    assert done == {"public.big", "public.small"}
    rows = {
        n["additional_data"]["scanned_collection"]: n["additional_data"]["total_rows_scanned"]
        for n in initial
        if n["type"] == "TABLE_SCAN_COMPLETED"
    }
    assert rows == {"public.big": "2500", "public.small": "50"}

    config = run.tmp_path / "run.yaml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "cdcd",
            "snapshot",
            "--config",
            str(config),
            "--table",
            "public.small",
            "--where",
            "id <= 10",
        ],
        check=True,
        env=cdcd_env(),
        capture_output=True,
    )
    events = run.consume_until(lambda evs: len([n for n in _notices(run, evs) if n["type"] == "COMPLETED"]) == 2)
    incremental = _notices(run, events)[len(initial) :]
    assert [n["type"] for n in incremental] == ["STARTED", "IN_PROGRESS", "TABLE_SCAN_COMPLETED", "COMPLETED"]
    assert incremental[2]["additional_data"]["total_rows_scanned"] == "10"
    assert {n["aggregate_type"] for n in incremental} == {"Incremental Snapshot"}
    assert run.stop() == 0


def test_pause_and_resume_signals_hold_and_release_the_snapshot(db: Database, run: Run, signal_topic: str) -> None:
    db.execute(SCHEMA.format(big=2500))  # chunks of 1000, 1000, 500
    _start(run, signal_topic, chunk_size=1000)
    _send(
        run,
        signal_topic,
        {"type": "pause-snapshot", "data": {"type": "incremental"}},
        {"id": "held", "type": "execute-snapshot", "data": {"data-collections": ["public.big"]}},
    )
    deadline = time.monotonic() + 30
    while '"incremental snapshot queued"' not in run.log.read_text():
        assert time.monotonic() < deadline, run.log.read_text()[-3000:]
        time.sleep(0.2)
    assert run.logged("incremental snapshots paused")["queued"] == 0
    # the execute-snapshot is queued while paused: nothing is read
    time.sleep(2)
    assert _read(run, _everything(run), "big") == []
    _send(run, signal_topic, {"type": "resume-snapshot", "data": {"type": "incremental"}})
    events = _until_notice(run, "COMPLETED")
    kinds = [n["type"] for n in _notices(run, events)]
    assert kinds == [
        "RESUMED",
        "STARTED",
        "IN_PROGRESS",
        "IN_PROGRESS",
        "IN_PROGRESS",
        "TABLE_SCAN_COMPLETED",
        "COMPLETED",
    ]
    assert sorted(_read(run, _everything(run), "big")) == list(range(1, 2501))
    assert run.stop() == 0
