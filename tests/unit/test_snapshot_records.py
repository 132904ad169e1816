"""An initial snapshot's rows made into Kafka records where they are read (``cdcd.shaping.SnapshotEncoder``, a
parallel initial snapshot's reader threads): the compiled ``copy_records`` against the Python specification and
both against the records ``EventShaper.snapshot`` makes of the same rows, in either envelope, with column rules;
the parallel snapshot handing them to the sink; and their bulk acknowledgement (``AtLeastOnceDelivery.write_bulk``)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcd.batches import Plain, SnapshotBatch
from cdcd.columns import NO_RULES, ColumnRules
from cdcd.config import KafkaSettings
from cdcd.filters.plan import FilterPlan
from cdcd.ledger import Entry, Ledger
from cdcd.pgoutput.messages import Relation, Row
from cdcd.plan import Plans
from cdcd.rowstage import PYTHON, STAGE, RowStage
from cdcd.shaping import EventShaper
from cdcd.sink.delivery import AtLeastOnceDelivery, Delivery
from cdcd.sink.kafka import KafkaSink
from cdcd.sink.registry import KafkaRegistry
from cdcd.sink.transport import KafkaTransport, Shape
from cdcd.snapshot.runner import Parallel, Snapshotter
from cdcd.snapshot.state import StateStore
from tests.unit.test_native import KEYS, LAYOUTS, TABLES, TEXTS, _Registry, table_rules
from tests.unit.test_parallel_snapshot import FakeConnection, _fresh

NOW_US = 1_700_000_000_123_456
LSN = 0x900
# Values as COPY prints them, and ones the compiled conversions refuse (the specification then encodes or raises).
VALUES = st.none() | TEXTS | st.sampled_from(["a\tb\nc\\d\r", "2024-05-03 12:00:00+00", "\\x0aff", "1.5", "NaN"])
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\b": "\\b", "\f": "\\f", "\v": "\\v"})


def copy_line(row: Sequence[str | None]) -> bytes:
    """A row as ``COPY ... TO STDOUT`` (text format) writes it."""
    return ("\t".join("\\N" if v is None else v.translate(_ESCAPES) for v in row) + "\n").encode()


def _shaper(stage: RowStage, debezium: bool, columns: ColumnRules) -> EventShaper:
    shaper = EventShaper("cdcd", _Registry(), clock_us=lambda: NOW_US, stage=stage, debezium=debezium, columns=columns)
    shaper.start_session("db", {}, Plans())
    return shaper


def encoded(  # noqa: PLR0917 - the drawn parts
    stage: RowStage, relation: Relation, data: bytes, first: bool, last: bool, debezium: bool, columns: ColumnRules
) -> tuple[str, Any]:
    """The records of ``data`` made where they are read, then emitted as the sink does (the ends marked)."""
    shaper = _shaper(stage, debezium, columns)
    records: list[Plain] = []
    try:
        made = shaper.snapshot_encoder(relation, LSN)(data)
        batch = SnapshotBatch(relation, (), LSN, made.ts_us, "true", first, last, None, made)
        shaper.snapshot_records(batch, records.extend)
    except Exception as exc:
        return "raised", f"{type(exc).__name__}: {exc}"
    return "emitted", (records, sorted(shaper.events.items()))


def shaped(  # noqa: PLR0917
    relation: Relation, rows: list[Row], first: bool, last: bool, debezium: bool, columns: ColumnRules
) -> tuple[str, Any]:
    """What ``EventShaper.snapshot`` makes of the same rows (the specification's shaper)."""
    shaper = _shaper(PYTHON, debezium, columns)
    records: list[Plain] = []
    try:
        batch = SnapshotBatch(relation, rows, LSN, NOW_US, "true", first, last)
        shaper.snapshot(batch, lambda topic, key, value, _: records.append((topic, key, value)))
    except Exception as exc:
        return "raised", f"{type(exc).__name__}: {exc}"
    return "emitted", (records, sorted(shaper.events.items()))


@LAYOUTS
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(TABLES), st.data(), st.booleans(), st.booleans())
def test_records_made_from_copy_lines_equal_the_shapers(
    debezium: bool, relation: Relation, data: st.DataObject, first: bool, last: bool
) -> None:
    """Rows with escapes, NULLs, refused and malformed values, the ends of the whole snapshot marked, column rules
    now and then: the compiled records equal the specification's, and both equal the shaper's of the rows."""
    rules = data.draw(st.none() | table_rules(relation))
    columns = NO_RULES if rules is None else ColumnRules({rules.table: rules})
    rows: list[Row] = data.draw(
        st.lists(st.tuples(*(KEYS[c.type_oid] if c.is_key else VALUES for c in relation.columns)), min_size=1)
    )
    text = b"".join(copy_line(row) for row in rows)  # type: ignore[arg-type]
    malformed = data.draw(st.integers(0, 9)) == 0
    if malformed:  # a line COPY does not write: an unknown escape
        text += b"\\q" + b"\t" * (len(relation.columns) - 1) + b"\n"
    reference = encoded(PYTHON, relation, text, first, last, debezium, columns)
    if STAGE.rows is not None:
        assert encoded(STAGE, relation, text, first, last, debezium, columns) == reference
    if malformed:
        assert reference == ("raised", "CopyFormatError: unexpected escape \\q in COPY text output")
    elif reference[0] == "emitted" or shaped(relation, rows, first, last, debezium, columns)[0] == "emitted":
        assert reference == shaped(relation, rows, first, last, debezium, columns)


def test_the_ends_of_the_whole_snapshot_are_marked_as_the_shaper_marks_them() -> None:
    """One row, first and last: first (as ``SnapshotBatch.row_marker``); and a batch's first and last apart."""
    relation, shaper = TABLES[0], _shaper(STAGE, False, NO_RULES)
    data = copy_line(["1", "a"]) + copy_line(["2", "b"]) + copy_line(["3", "c"])
    for rows, first, last, markers in [
        (copy_line(["1", "a"]), True, True, [b"first"]),
        (data, True, True, [b"first", b"true", b"last"]),
        (data, False, True, [b"true", b"true", b"last"]),
    ]:
        made = shaper.snapshot_encoder(relation, LSN)(rows)
        records: list[Plain] = []
        shaper.snapshot_records(
            SnapshotBatch(relation, (), LSN, NOW_US, "true", first, last, None, made), records.extend
        )
        assert [next(m for m in (b"first", b"last", b"true") if m in (r[2] or b"")) for r in records] == markers


# -- the parallel snapshot hands them over ----------------------------------------------------------------------


class RecordSink:
    """The Kafka sink's way with snapshot batches: records made by the shaper, or where they were read."""

    def __init__(self, shaper: EventShaper) -> None:
        self.shaper, self.records, self.encoded = shaper, list[Plain](), 0

    def write_snapshot(self, batch: SnapshotBatch, progress: Ledger) -> None:
        entry = progress.open(batch.lsn, None, batch.done)
        if batch.encoded is not None:
            self.encoded += 1
            self.shaper.snapshot_records(batch, self.records.extend)
        else:
            self.shaper.snapshot(batch, lambda topic, key, value, _: self.records.append((topic, key, value)))
        progress.seal(entry)

    def snapshot_encoder(self, relation: Relation, lsn: int) -> Any:
        return self.shaper.snapshot_encoder(relation, lsn)


def _run(tmp_path: Path, encode: bool, monkeypatch: pytest.MonkeyPatch) -> RecordSink:
    monkeypatch.setattr(time, "time_ns", lambda: NOW_US * 1000)  # the batches' source time (runner)
    tables = {"public.big": 230, "public.small": 3}
    state = _fresh(tables)
    store = StateStore(tmp_path, "slot")
    sink = RecordSink(_shaper(STAGE, False, NO_RULES))
    main = FakeConnection(tables)
    parallel = Parallel(2, lambda: FakeConnection(tables), main.split, sink.snapshot_encoder if encode else None)
    snapshotter = Snapshotter(main, sink, Ledger(), store, state, FilterPlan([]), 10, {}, parallel=parallel)
    snapshotter.run_initial("snap", lambda: None)
    assert snapshotter.state.queue == []  # every part finished
    return sink


def test_a_parallel_snapshot_with_an_encoder_writes_the_records_the_shaper_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every row's record once, the same bytes as the rows shaped by the sink, one first and one last mark."""
    made = _run(tmp_path / "a", True, monkeypatch)
    rows = _run(tmp_path / "b", False, monkeypatch)
    assert made.encoded > 20
    assert rows.encoded == 0
    assert len(made.records) == len(rows.records) == 233
    assert sorted(r[1] or b"" for r in made.records) == sorted(r[1] or b"" for r in rows.records)  # each row once
    unmarked = []
    for sink in (made, rows):
        values = [r[2] or b"" for r in sink.records]
        assert [b"\x0afirst" in v for v in values].count(True) == [b"\x08last" in v for v in values].count(True) == 1
        unmarked.append(Counter(r for r in sink.records if b"\x08true" in (r[2] or b"")))
    # parts interleave otherwise in each run: the ends of the whole snapshot may be other rows
    assert unmarked[0].total() == 231
    assert (unmarked[0] & unmarked[1]).total() >= 229  # the same bytes


# -- bulk acknowledgement -----------------------------------------------------------------------------------------


class BulkTransport(KafkaTransport):
    """A transport whose two bulk producers Kafka empties when told."""

    def __init__(self) -> None:
        super().__init__(KafkaSettings(bootstrap_servers="localhost:1"))
        self.bulk: tuple[list[Plain], list[Plain]] = ([], [])
        self.drains = 0

    def start(self, fixed: dict[str, Any]) -> Any:
        return None

    def produce_bulk(self, shape: Shape, lane: int) -> None:
        shape(lambda *_: None, self.bulk[lane].extend)

    def bulk_drained(self, lane: int) -> bool:
        return not self.bulk[lane]

    def drain_bulk(self) -> None:
        self.drains += 1
        for producer in self.bulk:
            producer.clear()


def test_bulk_entries_are_finished_once_kafka_has_all_their_producer_was_given() -> None:
    transport, ledger, done = BulkTransport(), Ledger(), list[int]()
    delivery = AtLeastOnceDelivery(KafkaSettings(bootstrap_servers="localhost:1"), transport)

    def write(i: int) -> None:
        entry = ledger.open(0x10 + i, None, lambda: done.append(i))
        delivery.write_bulk(ledger, entry, lambda _, many: many([("t", None, bytes([i]))]))

    write(0)
    write(1)
    delivery.poll()  # the other producer is empty: the next batches go there
    write(2)
    assert [len(b) for b in transport.bulk] == [2, 1]
    delivery.poll()
    assert done == []  # produced, not yet in Kafka: nothing finished, no progress saved
    assert ledger.flushed_lsn == 0
    transport.bulk[0].clear()  # Kafka has the first producer's
    delivery.poll()
    assert done == [0, 1]
    assert ledger.flushed_lsn == 0x11
    write(3)  # the first producer's turn again, while the second empties
    assert [len(b) for b in transport.bulk] == [1, 1]
    transport.bulk[1].clear()
    delivery.poll()
    assert done == [0, 1, 2]
    delivery.flush()
    assert done == [0, 1, 2, 3]
    assert ledger.flushed_lsn == 0x13
    assert delivery.wake_in() > 0.01  # nothing held: the transport's own wait (nothing in flight)


def test_a_flush_waits_for_the_bulk_and_finishes_it() -> None:
    transport, ledger, done = BulkTransport(), Ledger(), list[int]()
    delivery = AtLeastOnceDelivery(KafkaSettings(bootstrap_servers="localhost:1"), transport)
    entry = ledger.open(0x20, None, lambda: done.append(1))
    delivery.write_bulk(ledger, entry, lambda _, many: many([("t", None, b"x")]))
    assert delivery.wake_in() == pytest.approx(0.01)  # polled soon while the bulk waits
    delivery.flush()
    assert transport.drains == 1
    assert done == [1]


class Steps:
    """A delivery that records what the sink asks of it."""

    transactional = False

    def __init__(self) -> None:
        self.steps: list[str] = []

    def write_bulk(self, progress: Ledger, entry: Entry, shape: Shape) -> None:
        records: list[Plain] = []
        shape(lambda *_: None, records.extend)
        marks = [m for r in records for m in ("first", "last") if bytes([2 * len(m)]) + m.encode() in (r[2] or b"")]
        self.steps.append("bulk" + "".join(f" {m}" for m in marks))
        progress.seal(entry)

    def flush(self) -> None:
        self.steps.append("flush")


def test_the_batches_of_the_first_and_last_records_are_written_alone() -> None:
    """The two bulk producers' records may overtake each other: everything before the last record is in Kafka
    before it is produced, and the first record before anything after it."""
    relation, shaper, steps = TABLES[0], _shaper(STAGE, False, NO_RULES), Steps()
    kafka = KafkaSettings(bootstrap_servers="localhost:1")
    sink = KafkaSink(kafka, shaper, KafkaTransport(kafka), cast(KafkaRegistry, None), cast(Delivery, steps))
    encode = sink.snapshot_encoder(relation, LSN)
    for i, (first, last) in enumerate([(True, False), (False, False), (False, True)]):
        made = encode(copy_line([str(2 * i), "a"]) + copy_line([str(2 * i + 1), "b"]))
        sink.write_snapshot(SnapshotBatch(relation, (), LSN, NOW_US, "true", first, last, None, made), Ledger())
    assert steps.steps == ["bulk first", "flush", "bulk", "flush", "bulk last"]
