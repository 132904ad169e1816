"""cdcd tail against a real server: interleaved streamed transactions, savepoints, aborts, restarts."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import pytest

from tests.integration.conftest import Database, Tail
from tests.integration.workload import (
    SCHEMA,
    Change,
    Model,
    Txn,
    group_by_xid,
    interleaved_workload,
    normalize,
)

pytestmark = [pytest.mark.integration, pytest.mark.every_pg]  # version-sensitive: on every major


def expected_count(model: Model) -> int:
    return sum(len(changes) for _, changes in model.committed)


def stream_stats(db: Database, slot: str) -> tuple[int, int]:
    rows = db.execute("SELECT stream_txns, stream_count FROM pg_stat_replication_slots WHERE slot_name = %s", [slot])
    return (rows[0][0], rows[0][1]) if rows else (0, 0)


def test_interleaved_streamed_transactions_match_what_was_committed(
    db: Database, tail_factory: Callable[..., Tail]
) -> None:
    db.execute(SCHEMA)
    tail = tail_factory().start()
    tail.wait_streaming()
    model = Model()
    interleaved_workload(db.dsn(), model)

    lines = tail.wait_for(lambda lines: len(lines) >= expected_count(model))
    assert group_by_xid(lines) == model.committed  # same transactions, same changes, commit order
    assert tail.stop() == 0

    streamed_txns, stream_blocks = stream_stats(db, tail.slot)
    assert streamed_txns >= 3, "the workload must make the server stream (big, savepoints, aborted)"
    assert stream_blocks > streamed_txns
    assert "doomed" not in "".join(str(line["after"]) for line in lines)
    assert not list((tail.config.parent / "spill").rglob("*.spill")), "spill files are removed after commit"


def test_streaming_off_gives_the_same_result(db: Database, tail_factory: Callable[..., Tail]) -> None:
    db.execute(SCHEMA)
    tail = tail_factory(streaming="off").start()
    tail.wait_streaming()
    model = Model()
    interleaved_workload(db.dsn(), model)
    lines = tail.wait_for(lambda lines: len(lines) >= expected_count(model))
    assert group_by_xid(lines) == model.committed
    assert stream_stats(db, tail.slot)[0] == 0


def test_kill_9_mid_stream_then_restart_loses_nothing(db: Database, tail_factory: Callable[..., Tail]) -> None:
    db.execute(SCHEMA)
    tail = tail_factory().start()
    tail.wait_streaming()
    model = Model()

    failures: list[BaseException] = []

    def workload() -> None:
        try:
            for i in range(60):
                txn = Txn(db.dsn(), model)
                txn.insert_many("items", 100_000 + i * 1000, 50 if i % 10 else 500, f"w{i}-")
                txn.commit()
            interleaved_workload(db.dsn(), model)
        except BaseException as exc:
            failures.append(exc)
            raise

    writer = threading.Thread(target=workload)
    writer.start()
    runs = []
    for attempt, kill_after in enumerate((300, 1500)):
        tail.wait_for(lambda lines, n=kill_after: len(lines) >= n)  # type: ignore[misc]
        assert tail.kill() == -9
        runs.append(tail.lines())
        tail.wait_slot_released()
        tail.start(output=tail.output.with_name(f"run{attempt + 1}.jsonl"))
    writer.join()
    assert not failures, failures
    committed = {change_key(c) for _, changes in model.committed for c in changes}
    tail.wait_for(lambda lines: {change_key(normalize(x)) for run in [*runs, lines] for x in run} >= committed)
    runs.append(tail.lines())

    emitted = {change_key(normalize(line)) for run in runs for line in run}
    assert emitted == committed  # nothing lost, nothing that was not committed
    order = {xid: i for i, (xid, _) in enumerate(model.committed)}
    expected = dict(model.committed)
    for number, run in enumerate(runs):
        groups = group_by_xid(run)
        positions = [order[xid] for xid, _ in groups]
        assert positions == sorted(set(positions)), f"run {number}: transactions out of commit order"
        for index, (xid, changes) in enumerate(groups):
            killed_here = number < len(runs) - 1 and index == len(groups) - 1
            if killed_here:  # the transaction being written when the process was killed
                assert changes == expected[xid][: len(changes)]
            else:
                assert changes == expected[xid]


def change_key(change: Change) -> tuple[str, str, str, str]:
    op, table, before, after = change
    return op, table, json.dumps(before, sort_keys=True), json.dumps(after, sort_keys=True)
