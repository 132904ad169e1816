"""Exactly-once delivery without a broker: the progress record, and the transactional sink's order of work
(nothing confirmed before the Kafka commit, the record inside the transaction, skipping what was committed)
against a recording stand-in for confluent-kafka's Producer."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import structlog
from confluent_kafka import KafkaError, KafkaException

from cdcd.batches import SnapshotBatch
from cdcd.config import KafkaSettings, SchemaRegistrySettings
from cdcd.filters.plan import FilterPlan
from cdcd.ledger import Ledger
from cdcd.pgoutput.messages import RowChange
from cdcd.replication.loop import ReplicationLoop
from cdcd.replication.start import committed_snapshot
from cdcd.sink import Committed, SessionContext, SinkFailure, SinkRewind
from cdcd.sink import progress_topic as records
from cdcd.sink.kafka import KafkaSink
from cdcd.sink.registry import KafkaRegistry
from cdcd.sink.transactional import ExactlyOnceDelivery
from cdcd.sink.transport import KafkaTransport
from cdcd.snapshot.runner import BatchWriter, Reader, Snapshotter
from cdcd.snapshot.state import SnapshotState, StateError, StateStore, TableProgress
from tests.unit.test_shaping import REL, Registry, shaper, txn

SYSTEM = "7300000000000000001"


def test_progress_record_round_trip() -> None:
    committed = Committed(0x2000, 0x1FF0, {"slot": "s", "queue": []})
    key, value = records.encode("s", SYSTEM, committed)
    assert key == b"s"
    assert records.decode(value, "s", SYSTEM, "__cdcd-progress-cdcd") == committed
    assert json.loads(value)["version"] == records.VERSION


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (b"not json", "is not a cdcd progress record"),
        (b'{"version": 1}', "is not a cdcd progress record"),
        (records.encode("s", SYSTEM, Committed(1, 1, None))[1].replace(b'"version":2', b'"version":9'), "version 9"),
        (records.encode("other", SYSTEM, Committed(1, 1, None))[1], "names slot 'other'"),
        (records.encode("s", "42", Committed(1, 1, None))[1], "belongs to database system 42"),
        (
            records.encode("s", SYSTEM, Committed(1, 1, None))[1].replace(b'"snapshot":null', b'"snapshot":[1]'),
            "not an",
        ),
    ],
)
def test_a_record_cdcd_cannot_use_is_an_error_naming_it(value: bytes, error: str) -> None:
    with pytest.raises(records.ProgressTopicError, match=error):
        records.decode(value, "s", SYSTEM, "__cdcd-progress-cdcd")


def test_the_committed_snapshot_state_wins_over_the_state_file(tmp_path: Path) -> None:
    """A version 1 record carries the state itself."""
    store = StateStore(tmp_path, "s")
    file_state = SnapshotState("s", initial="done", queue=[TableProgress("public.t", "incremental", last_key=["9"])])
    kafka_state = SnapshotState("s", initial="done", queue=[TableProgress("public.t", "incremental", last_key=["5"])])
    chosen = committed_snapshot(Committed(1, 1, kafka_state.to_json()), file_state, store)
    assert chosen is not None
    assert chosen.queue[0].last_key == ["5"]
    assert committed_snapshot(Committed(1, 1, None), file_state, store) is file_state
    with pytest.raises(StateError, match="belongs to slot 's'"):
        committed_snapshot(Committed(1, 1, kafka_state.to_json()), None, StateStore(tmp_path, "other"))
    with pytest.raises(StateError, match="unexpected layout"):
        committed_snapshot(Committed(1, 1, {"slot": "s", "colour": 1}), None, store)


def test_progress_resumes_at_a_committed_position_and_drops_what_was_dropped() -> None:
    progress = Ledger()
    progress.resume_at(500)
    assert progress.flushed_lsn == progress.received_lsn == 500
    entry = progress.open(600)
    entry.outstanding += 1
    progress.seal(entry)
    progress.drop([entry])
    assert progress.pending == 0
    progress.ack(entry)  # a late acknowledgement of a dropped entry changes nothing
    assert progress.flushed_lsn == 500
    progress.idle(700, in_transaction=False)
    assert progress.flushed_lsn == 700


# -- the sink's order of work ------------------------------------------------------------------------------


class Producer:
    """Records the calls the sink makes; ``failures`` are raised by the next calls of that name."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.failures: dict[str, list[KafkaError]] = {}

    def _call(self, name: str, detail: Any = None) -> None:
        pending = self.failures.get(name)
        if pending:
            raise KafkaException(pending.pop(0))
        self.calls.append((name, detail))

    def begin_transaction(self) -> None:
        self._call("begin")

    def commit_transaction(self, timeout: float) -> None:
        self._call("commit")

    def abort_transaction(self, timeout: float) -> None:
        self._call("abort")

    def produce(  # noqa: PLR0917 - confluent-kafka's signature, which the sink calls positionally
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        callback: Any = None,
        on_delivery: Any = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        assert callback is None  # no report per message in a Kafka transaction
        assert on_delivery is None
        self.calls.append(("produce", (topic, key, value)))

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0

    def __len__(self) -> int:
        return 0

    def names(self) -> list[str]:
        return [name if name != "produce" else f"produce {detail[0]}" for name, detail in self.calls]


def exactly_once(kafka: KafkaSettings) -> KafkaSink:
    """The sink as ``cli.py`` wires it for exactly-once delivery, with an in-memory registry for the shaper."""
    transport = KafkaTransport(kafka)
    topics = KafkaRegistry(kafka, SchemaRegistrySettings(url="http://127.0.0.1:9"), transport)
    delivery = ExactlyOnceDelivery(kafka, transport, topics)
    return KafkaSink(kafka, shaper(Registry(), transaction_topic=False), transport, topics, delivery)


def strategy(sink: KafkaSink) -> ExactlyOnceDelivery:
    assert isinstance(sink.delivery, ExactlyOnceDelivery)
    return sink.delivery


def sink(
    snapshot_state: Callable[[], dict[str, Any] | None] = lambda: None,
    snapshot_committed: Callable[[], None] = lambda: None,
) -> tuple[KafkaSink, Producer]:
    kafka = KafkaSettings(
        bootstrap_servers="127.0.0.1:9",
        delivery="exactly_once",
        transaction_topic=False,
        exactly_once={"commit_interval_ms": 60_000, "max_messages": 1_000_000},
    )
    out = exactly_once(kafka)
    producer = Producer()
    out.transport.producer = producer  # type: ignore[assignment]
    delivery = strategy(out)
    delivery._emit = out.transport.producing(None, None)  # what `committed` sets up with the real producer
    delivery._emit_many = out.transport.producing_many(None, None)
    delivery.slot, delivery.system_id = "s", SYSTEM
    out.start_session(SessionContext("shop", snapshot_state=snapshot_state, snapshot_committed=snapshot_committed))
    return out, producer


# A Kafka transaction begins with the last commit's record: the progress topic's partition joins it at once
BEGUN = ["begin", "produce __cdcd-progress-cdcd"]


def insert(key: int) -> RowChange:
    return RowChange("insert", REL, None, (str(key), "x"), False, None, 0x80, 10)


def test_nothing_is_confirmed_before_the_kafka_commit_which_carries_the_position() -> None:
    out, producer = sink()
    progress = Ledger()
    out.write_transaction(txn(insert(1), commit_lsn=0x100), [insert(1)], progress)
    out.write_transaction(txn(insert(2), commit_lsn=0x200), [insert(2)], progress)
    assert progress.flushed_lsn == 0
    assert progress.pending == 2
    assert producer.names() == [*BEGUN, "produce cdcd.public.t", "produce cdcd.public.t"]
    _, (_, _, value) = producer.calls[1]
    assert records.decode(value, "s", SYSTEM, "__cdcd-progress-cdcd") == Committed(0, -1, None)  # the last commit's
    out.flush(1.0)
    assert producer.names()[-2:] == ["produce __cdcd-progress-cdcd", "commit"]
    _, (_, key, value) = producer.calls[-2]
    assert key == b"s"
    assert records.decode(value, "s", SYSTEM, "__cdcd-progress-cdcd") == Committed(0x208, 0x200, None)
    assert progress.flushed_lsn == 0x208
    assert progress.pending == 0


def test_what_the_last_commit_covered_is_not_written_again() -> None:
    out, producer = sink()
    strategy(out)._committed = Committed(0x208, 0x200, None)
    progress = Ledger()
    seen: list[RowChange] = []

    def changes(change: RowChange) -> Iterator[RowChange]:
        seen.append(change)
        yield change

    for lsn in (0x100, 0x200, 0x300):
        out.write_transaction(txn(insert(lsn), commit_lsn=lsn), changes(insert(lsn)), progress)
    assert len(seen) == 3  # every transaction's changes are still read (a snapshot window sees them)
    assert producer.names() == [*BEGUN, "produce cdcd.public.t"]
    assert progress.flushed_lsn == 0x208  # the skipped ones are finished; the written one waits for the commit


def test_snapshot_progress_goes_into_the_record_of_the_transaction_holding_the_rows() -> None:
    state = {"rows": 0}
    saved_after: list[list[str]] = []
    out, producer = sink(lambda: dict(state), lambda: saved_after.append(producer.names()))
    progress = Ledger()

    def done() -> None:
        state["rows"] += 2

    batch = SnapshotBatch(REL, [("1", "a"), ("2", "b")], 0x50, 0, "true", done=done)
    out.write_snapshot(batch, progress)
    assert state["rows"] == 0
    out.flush(1.0)
    _, (_, _, value) = producer.calls[-2]
    assert records.decode(value, "s", SYSTEM, "__cdcd-progress-cdcd").snapshot == {"rows": 2}
    assert [names[-1] for names in saved_after] == ["commit"]  # the state file: only once Kafka committed
    assert progress.flushed_lsn == 0x50


def test_an_abortable_commit_failure_aborts_and_rewinds_without_confirming() -> None:
    out, producer = sink()
    progress = Ledger()
    out.write_transaction(txn(insert(1), commit_lsn=0x100), [insert(1)], progress)
    producer.failures["commit"] = [KafkaError(KafkaError._TIMED_OUT, "broker away", retriable=True)]
    producer.failures["commit"].append(KafkaError(KafkaError._OUTDATED, "lost", txn_requires_abort=True))
    with structlog.testing.capture_logs() as logs, pytest.raises(SinkRewind, match="lost"):
        out.flush(1.0)
    assert [e["error"] for e in logs if e["event"] == "waiting for Kafka"] == ["broker away"]  # the retried one
    assert producer.names()[-1] == "abort"
    assert progress.flushed_lsn == 0
    out.write_transaction(txn(insert(1), commit_lsn=0x100), [insert(1)], Ledger())
    assert producer.names()[-3:-1] == BEGUN  # a new Kafka transaction, after the abort


def test_a_fenced_producer_stops_with_a_message_naming_the_cause() -> None:
    out, producer = sink()
    producer.failures["begin"] = [KafkaError(KafkaError._FENCED, "fenced", fatal=True)]
    with pytest.raises(SinkFailure, match="took over \\(fenced\\): is a second cdcd running"):
        out.write_transaction(txn(insert(1), commit_lsn=0x100), [insert(1)], Ledger())


def test_a_new_session_aborts_what_the_last_session_left_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole or not, what an ended session left in the open Kafka transaction is aborted, never committed: the
    promotion check comes later, and the server sends it again."""
    out, producer = sink()
    monkeypatch.setattr(records, "read_last", lambda *_: None)
    progress = Ledger()
    out.write_transaction(txn(insert(1), commit_lsn=0x100), [insert(1)], progress)
    assert (
        out.committed("s", SYSTEM, slot_created=False, keep_alive=lambda: None) is None
    )  # no record yet: the slot's position
    assert producer.names()[-1] == "abort"
    assert "commit" not in producer.names()
    assert progress.flushed_lsn == 0
    assert progress.pending == 0


class Interrupted(Exception):
    """What a stop request or a lost connection raises from a sink's wait for room in the producer's queue."""


def interrupted_after(count: int) -> Iterator[RowChange]:
    for key in range(count):
        yield insert(key)
    raise Interrupted


def test_an_interrupted_transaction_is_aborted_at_the_sessions_end_and_never_confirmed() -> None:
    out, producer = sink()
    progress = Ledger()
    out.write_transaction(txn(insert(1), commit_lsn=0x100), [insert(1)], progress)  # whole
    with pytest.raises(Interrupted):
        out.write_transaction(txn(insert(2), insert(3), commit_lsn=0x200), interrupted_after(1), progress)
    assert progress.pending == 2
    out.end_session(progress)
    assert progress.end_session() == 0  # the sink dropped both: its Kafka transaction is aborted
    assert producer.names()[-1] == "abort"
    assert progress.pending == 0
    out.flush(1.0)  # a stop: nothing left to commit
    assert "commit" not in producer.names()
    assert progress.flushed_lsn == 0


def test_a_session_ending_between_whole_writes_leaves_them_for_the_stops_flush() -> None:
    out, producer = sink()
    progress = Ledger()
    out.write_transaction(txn(insert(1), commit_lsn=0x100), [insert(1)], progress)
    out.end_session(progress)
    assert progress.end_session() == 0
    out.flush(1.0)
    assert producer.names()[-1] == "commit"
    assert progress.flushed_lsn == 0x108


def test_a_partial_snapshot_batch_is_never_committed_nor_marked_done() -> None:
    """A stop during the initial snapshot, while the sink waited for Kafka: the batch's rows are partly written."""
    out, producer = sink()
    progress = Ledger()
    finished: list[int] = []
    whole = SnapshotBatch(REL, [("1", "a")], 0x50, 0, "true", done=lambda: finished.append(1))
    out.write_snapshot(whole, progress)
    calls = len(producer.calls)

    def produce_then_stop(*args: Any) -> None:
        if len(producer.calls) > calls:
            raise Interrupted
        producer.calls.append(("produce", args[:1] + args[2:3] + args[1:2]))

    producer.produce = produce_then_stop  # type: ignore[method-assign,assignment]
    strategy(out)._emit = out.transport.producing(None, None)
    partial = SnapshotBatch(REL, [("2", "b"), ("3", "c")], 0x50, 0, "true", done=lambda: finished.append(2))
    with pytest.raises(Interrupted):
        out.write_snapshot(partial, progress)
    out.flush(1.0)  # the guard: a Kafka transaction holding part of a batch is aborted, whatever asks to commit
    assert producer.names()[-1] == "abort"
    assert finished == []  # not even the whole batch before it: it was in the same aborted Kafka transaction
    assert progress.pending == 0  # both dropped from the ledger with the Kafka transaction
    assert progress.flushed_lsn == 0


def test_after_an_abort_the_next_record_does_not_claim_what_was_aborted() -> None:
    out, producer = sink()
    strategy(out)._committed = Committed(0x108, 0x100, None)
    progress = Ledger()
    out.write_transaction(txn(insert(3), commit_lsn=0x300), [insert(3)], progress)
    with pytest.raises(Interrupted):
        out.write_transaction(txn(insert(4), insert(5), commit_lsn=0x400), interrupted_after(1), progress)
    out.end_session(progress)
    progress.end_session()
    out.write_snapshot(SnapshotBatch(REL, [("9", "z")], 0x50, 0, "incremental"), progress)
    out.flush(1.0)
    _, (_, _, value) = producer.calls[-2]
    # 0x300 was aborted: a record claiming it would make a restart skip it
    assert records.decode(value, "s", SYSTEM, "__cdcd-progress-cdcd").position == 0x100


def test_before_its_first_session_the_sink_is_not_ready_and_holds_nothing() -> None:
    kafka = KafkaSettings(bootstrap_servers="127.0.0.1:9", delivery="exactly_once")
    out = exactly_once(kafka)
    assert not out.ready()
    assert out.in_flight() == 0
    out.close()


def test_an_unreachable_broker_is_a_wait_not_a_definite_error() -> None:
    with pytest.raises(records.ProgressTopicUnreachable, match="cannot read progress topic p"):
        records.read_last({"bootstrap.servers": "127.0.0.1:9", "log_level": 0}, "p", "s", timeout=1)


def test_a_session_start_waits_for_kafka_to_read_the_progress_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    out, _ = sink()
    answers: list[Exception | bytes] = [
        records.ProgressTopicUnreachable("cannot read progress topic p: no answer within 10 s"),
        records.ProgressTopicUnreachable("cannot read progress topic p: Local: Broker transport failure"),
        records.encode("s", SYSTEM, Committed(0x208, 0x200, None))[1],
    ]

    def read_last(*_: Any) -> bytes:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(records, "read_last", read_last)
    pauses: list[float] = []
    monkeypatch.setattr(time, "sleep", pauses.append)
    beats: list[int] = []
    with structlog.testing.capture_logs() as logs:
        found = out.committed("s", SYSTEM, slot_created=False, keep_alive=lambda: beats.append(1))
    assert found == Committed(0x208, 0x200, None)
    assert len(beats) == 2  # a stop request ends the wait
    assert pauses == [1.0, 1.0]  # paced: an error that comes back at once is not retried at once
    assert [e["error"] for e in logs if e["event"] == "waiting for Kafka"] == [
        "cannot read progress topic p: no answer within 10 s"
    ]  # logged once per 30 s


def test_a_definite_progress_topic_error_stops_the_session_start(monkeypatch: pytest.MonkeyPatch) -> None:
    out, _ = sink()

    def read_last(*_: Any) -> bytes:
        raise records.ProgressTopicError("cannot read progress topic p: Broker: Topic authorization failed")

    monkeypatch.setattr(records, "read_last", read_last)
    with pytest.raises(records.ProgressTopicError, match="authorization"):
        out.committed("s", SYSTEM, slot_created=False, keep_alive=lambda: None)


def test_only_a_fatal_epoch_error_of_the_client_stops_it() -> None:
    out, _ = sink()
    out.transport.client_error(KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, "epoch bumped"))  # told by the calls
    assert out.transport._failure is None
    out.transport.client_error(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    assert "took over (fenced)" in str(out.transport._failure)


# -- the snapshot state the record names --------------------------------------------------------------------

CARD = "4111111111111111"  # a chunk key: the value of a key column masked by hash


def snapshotter(tmp_path: Path, tables: int) -> Snapshotter:
    """An exactly-once sink's snapshotter with ``tables`` tables queued (newly captured by a pattern)."""
    names = [f"public.table_{i:05}" for i in range(tables)]
    queue = [TableProgress(name, "incremental") for name in names]
    state = SnapshotState("s", initial="done", known_tables=names, queue=queue)
    store = StateStore(tmp_path, "s")
    store.save(state)
    nothing = cast(Any, None)  # neither reads nor writes here
    return Snapshotter(
        cast(Reader, nothing), cast(BatchWriter, nothing), Ledger(), store, state, FilterPlan([]), 10, {}
    )


def test_the_progress_record_stays_small_with_6000_queued_tables_and_holds_no_chunk_key(tmp_path: Path) -> None:
    snapshots = snapshotter(tmp_path, 6000)
    loop = cast(ReplicationLoop, SimpleNamespace(snapshotter=snapshots))
    out, producer = sink(*ReplicationLoop._snapshot_hooks(loop))  # the hooks as the loop hands them over
    first = snapshots.state.queue[0]

    def done() -> None:
        first.last_key, first.rows = [CARD], 2

    out.write_snapshot(SnapshotBatch(REL, [("1", "a"), ("2", "b")], 0x50, 0, "incremental", done=done), Ledger())
    out.flush(1.0)
    _, (topic, _, value) = producer.calls[-2]
    assert topic == "__cdcd-progress-cdcd"
    assert len(value) < 1_000_000  # message.max.bytes (1 MB): above it, produce fails with MSG_SIZE_TOO_LARGE
    assert CARD.encode() not in value
    restarted = StateStore(tmp_path, "s")
    state = committed_snapshot(records.decode(value, "s", SYSTEM, "__cdcd-progress-cdcd"), restarted.load(), restarted)
    assert state is not None
    assert len(state.queue) == 6000
    assert (state.queue[0].last_key, state.queue[0].rows) == ([CARD], 2)


def test_a_restart_finds_the_state_kafka_committed_whether_the_last_commit_went_through_or_not(tmp_path: Path) -> None:
    store = snapshotter(tmp_path, 1).store
    state = store.load()
    assert state is not None
    before = store.stage(state)
    store.save(state, committed=True)
    state.queue[0].last_key = ["7"]
    after = store.stage(state)  # written before the Kafka commit: the process may die before or after it
    for reference, key in ((before, None), (after, ["7"])):
        restarted = StateStore(tmp_path, "s")
        chosen = committed_snapshot(Committed(1, 1, reference), restarted.load(), restarted)
        assert chosen is not None
        assert chosen.queue[0].last_key == key
    state.queue[0].last_key = ["9"]
    store.stage(state)  # the commit of ``after`` failed (a rewind): the one before is still what Kafka has
    assert set(json.loads(store.path.read_text())["committed"]) == {before["digest"], store.stage(state)["digest"]}
    with pytest.raises(StateError, match="does not hold"):
        committed_snapshot(Committed(1, 1, {"digest": "0" * 64}), None, StateStore(tmp_path, "s"))
