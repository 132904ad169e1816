"""The replication core without a server: captured pgoutput streams (PG 14/15/17) framed as XLogData, keepalives,
control messages, a reconnect mid-transaction and a sink that does not acknowledge."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path

import pytest

from cdcd.assembly import Assembler, BufferPool
from cdcd.batches import Transaction
from cdcd.filters import FilterPlan, RowFilter
from cdcd.filters.messages import MessageFilter
from cdcd.ledger import Ledger
from cdcd.pgoutput import DecodeError, Decoder
from cdcd.pgoutput.messages import (
    Begin,
    Change,
    Column,
    Commit,
    CommitPrepared,
    LogicalMessage,
    Message,
    Relation,
    RollbackPrepared,
    RowChange,
    StreamAbort,
    StreamCommit,
)
from cdcd.replication.core import (
    CAUGHT_UP_STATUS_S,
    STATUS_REQUESTED,
    Event,
    Publish,
    ReplicationCore,
    Silence,
    SnapshotRequest,
    Stats,
    Watermark,
    Write,
)
from cdcd.rowstage import STAGE
from cdcd.snapshot.control import REQUEST_PREFIX, WATERMARK_PREFIX
from tests.capture_pgoutput import CaptureInfo, Fixture, FixtureMessage, fixture_paths, load_fixture
from tests.pgoutput_encoder import encode

FIXTURES = [load_fixture(path) for path in fixture_paths()]
CASES = [
    pytest.param(fx, capture, id=f"{fx.path.stem}-proto{capture.proto}-{capture.scenario}")
    for fx in FIXTURES
    for capture in fx.captures
]
REL = Relation(16384, "public", "t", "d", (Column("id", 23, -1, True), Column("v", 25, -1, False)))
_STATUS = struct.Struct(">cQQQq?")


def xlogdata(lsn: int, payload: bytes) -> bytes:
    return b"w" + struct.pack(">QQq", lsn, lsn, 0) + payload


def keepalive(wal_end: int, reply: bool = False) -> bytes:
    return b"k" + struct.pack(">Qq?", wal_end, 0, reply)


def frames_of(messages: Iterable[FixtureMessage]) -> list[bytes]:
    return [xlogdata(m.lsn, m.data) for m in messages]


def built(*messages: tuple[int, Message]) -> list[bytes]:
    return [xlogdata(lsn, encode(m)) for lsn, m in messages]


def core_for(
    tmp_path: Path, capture: CaptureInfo | None = None, progress: Ledger | None = None, **options: object
) -> ReplicationCore:
    parallel = capture is not None and capture.options.get("streaming") == "parallel"
    pool = BufferPool(1 << 16, tmp_path)  # small: the bulk streams spill
    decoder = Decoder(parallel_streaming=parallel, stage=STAGE)
    return ReplicationCore(decoder, Assembler(pool), progress or Ledger(), **options)  # type: ignore[arg-type]


def run(core: ReplicationCore, frames: Iterable[bytes], ack: bool = True) -> list[Event]:
    """Feed ``frames``; hand each written transaction to a sink that finishes it at once (``ack``) or never."""
    events = []
    for frame in frames:
        event = core.frame(frame)
        if event is None:
            continue
        if isinstance(event, Write):
            changes = list(event.changes)
            event = Write(event.transaction, iter(changes))
            entry = core.ledger.open(event.transaction.end_lsn)
            entry.outstanding = len(changes)
            if ack and entry.outstanding:
                core.ledger.ack(entry, entry.outstanding)
            core.ledger.seal(entry)
        events.append(event)
    return events


def written(events: Iterable[Event]) -> list[Transaction]:
    return [e.transaction for e in events if isinstance(e, Write)]


def decoded(fx: Fixture, capture: CaptureInfo) -> list[Message]:
    decoder = Decoder(parallel_streaming=capture.options.get("streaming") == "parallel", stage=STAGE)
    return [decoder.decode(m.data, m.lsn) for m in fx.stream(capture.proto, capture.scenario)]


def status_flush(core: ReplicationCore) -> int:
    _, _, flush, apply, _, _ = _STATUS.unpack(core.status_update(0.0, 0))
    assert apply == flush
    return int(flush)


@pytest.mark.parametrize(("fx", "capture"), CASES)
def test_every_committed_transaction_is_written_once_in_commit_order(
    tmp_path: Path, fx: Fixture, capture: CaptureInfo
) -> None:
    messages = decoded(fx, capture)
    commits = [(m.commit_lsn, m.end_lsn) for m in messages if isinstance(m, Commit | StreamCommit | CommitPrepared)]
    core = core_for(tmp_path, capture, messages=MessageFilter(publish=True))
    txns = written(run(core, frames_of(fx.stream(capture.proto, capture.scenario))))
    assert [(t.commit_lsn, t.end_lsn) for t in txns] == commits
    assert core.ledger.flushed_lsn == (commits[-1][1] if commits else 0)
    assert status_flush(core) == core.ledger.flushed_lsn
    assert list(core.recent_xids) == [t.xid for t in txns]
    aborted = sum(isinstance(m, StreamAbort) and m.xid == m.subxid for m in messages)
    rolled_back = sum(isinstance(m, RollbackPrepared) for m in messages)
    assert core.stats.outcomes["streamed", "abort"] == aborted
    assert core.stats.outcomes["plain", "abort"] == rolled_back  # a prepared transaction rolled back
    assert core.assembler.aborted_transactions == aborted + rolled_back
    assert core.stats.transactions == len(commits)
    assert core.assembler.pool.memory_bytes == 0  # everything written or discarded


@pytest.mark.parametrize(("fx", "capture"), [c for c in CASES if "savepoint" in str(c.id)])
def test_rolled_back_subtransactions_are_not_written(tmp_path: Path, fx: Fixture, capture: CaptureInfo) -> None:
    messages = decoded(fx, capture)
    rolled_back = {m.subxid for m in messages if isinstance(m, StreamAbort) and m.subxid != m.xid}
    assert rolled_back
    events = run(core_for(tmp_path, capture), frames_of(fx.stream(capture.proto, capture.scenario)))
    changes = [c for e in events if isinstance(e, Write) for c in e.changes]
    assert changes
    assert not {c.xid for c in changes if isinstance(c, RowChange)} & rolled_back


@pytest.mark.parametrize(("fx", "capture"), [c for c in CASES if "stream" in str(c.id)])
def test_a_reconnect_mid_transaction_writes_each_transaction_once(
    tmp_path: Path, fx: Fixture, capture: CaptureInfo
) -> None:
    frames = frames_of(fx.stream(capture.proto, capture.scenario))
    clean = written(run(core_for(tmp_path / "clean", capture), frames))
    progress = Ledger()
    first = core_for(tmp_path, capture, progress)
    run(first, frames[: len(frames) // 2])
    first.reset()  # the connection dropped mid-stream: the unfinished transactions are dropped
    assert first.assembler.pool.memory_bytes == 0
    assert first.assembler.pool.open_buffers == 0
    confirmed = progress.flushed_lsn
    # The server sends again from the slot's position (here: from the start, as when status updates lagged).
    again = written(run(core_for(tmp_path, capture, progress), frames))
    assert [(t.commit_lsn, t.change_count) for t in again] == [(t.commit_lsn, t.change_count) for t in clean]
    assert progress.flushed_lsn >= confirmed


def test_a_keepalive_on_an_idle_slot_confirms_its_position(tmp_path: Path) -> None:
    core = core_for(tmp_path)
    assert core.frame(keepalive(0x5000)) is None
    assert core.ledger.received_lsn == core.ledger.flushed_lsn == 0x5000
    assert status_flush(core) == 0x5000
    assert core.frame(keepalive(0x6000, reply=True)) is STATUS_REQUESTED
    assert status_flush(core) == 0x6000


def test_a_keepalive_inside_a_transaction_confirms_nothing(tmp_path: Path) -> None:
    core = core_for(tmp_path)
    run(core, one_transaction(0x100)[:-1])  # Relation, Begin, Insert: no Commit yet
    assert run(core, [keepalive(0x150)]) == []
    assert core.ledger.flushed_lsn == 0
    assert core.ledger.received_lsn == 0x150


def one_transaction(first: int) -> list[bytes]:
    return built(
        (first, REL),
        (first, Begin(first + 0x100, 0, 5)),
        (first + 0x10, RowChange("insert", REL, None, ("1", "a"), False, None, first + 0x10, 10)),
        (first + 0x100, Commit(0, first + 0x100, first + 0x108, 0)),
    )


def test_the_flush_lsn_stops_before_what_the_sink_did_not_acknowledge(tmp_path: Path) -> None:
    core = core_for(tmp_path)
    run(core, one_transaction(0x1000))
    assert status_flush(core) == 0x1108
    run(core, one_transaction(0x2000), ack=False)  # the sink failed: never acknowledged
    run(core, one_transaction(0x3000))
    run(core, [keepalive(0x9000)])
    assert core.ledger.received_lsn == 0x9000
    assert status_flush(core) == 0x1108  # neither the unacknowledged transaction nor anything after it


def test_control_messages_go_to_the_snapshotter_and_user_messages_only_when_asked(tmp_path: Path) -> None:
    messages = built(
        (0x10, LogicalMessage(False, 0x10, WATERMARK_PREFIX, b'{"id": "w"}')),
        (0x20, LogicalMessage(False, 0x20, REQUEST_PREFIX, b'{"table": "public.t"}')),
        (0x30, LogicalMessage(False, 0x30, "app", b"hello")),
    )
    kinds = [type(e) for e in run(core_for(tmp_path, messages=MessageFilter(publish=True)), messages)]
    assert kinds == [Watermark, SnapshotRequest, Publish]
    assert [type(e) for e in run(core_for(tmp_path), messages)] == [Watermark, SnapshotRequest]


def test_row_filters_apply_before_assembly(tmp_path: Path) -> None:
    from cdcd.config import Publication, TableRef  # noqa: PLC0415

    publication = Publication(name="p", tables=[TableRef(name="public.t", where="id > 1")])
    stats = Stats()
    core = core_for(tmp_path, rowfilter=RowFilter(FilterPlan([publication])), stats=stats)
    frames = built(
        (0x100, REL),
        (0x100, Begin(0x200, 0, 5)),
        (0x110, RowChange("insert", REL, None, ("1", "a"), False, None, 0x110, 10)),
        (0x120, RowChange("insert", REL, None, ("2", "b"), False, None, 0x120, 10)),
        (0x200, Commit(0, 0x200, 0x208, 0)),
    )
    (write,) = run(core, frames)
    assert isinstance(write, Write)
    assert [c.new for c in write.changes if isinstance(c, RowChange)] == [("2", "b")]
    assert (stats.transactions, stats.changes) == (1, 1)


def test_watched_changes_are_shown_to_the_window_on_their_way_to_the_sink(tmp_path: Path) -> None:
    class Window:
        watching = True

        def __init__(self) -> None:
            self.seen: list[Change] = []

        def watches(self, xid: int) -> bool:
            return xid != 6

        def observe(self, change: Change) -> None:
            self.seen.append(change)

    core = core_for(tmp_path)
    core.watcher = window = Window()
    event = core.frame(one_transaction(0x100)[0])
    events = [core.frame(f) for f in one_transaction(0x100)[1:]]
    assert event is None
    write = events[-1]
    assert isinstance(write, Write)
    assert window.seen == []  # nothing seen before the sink iterates
    changes = list(write.changes)
    assert window.seen == changes
    assert len(changes) == 1
    unwatched = built(
        (0x1000, Begin(0x1100, 0, 6)),
        (0x1010, RowChange("insert", REL, None, ("2", "b"), False, None, 0x1010, 10)),
        (0x1108, Commit(0, 0x1100, 0x1108, 0)),
    )
    (other,) = written(run(core, unwatched))
    assert other.xid == 6
    assert window.seen == changes  # a transaction the window does not watch is not shown to it
    assert core.position == 0x1108
    core.frame(keepalive(0x2000))
    assert core.position == 0x2000


def test_unknown_frames_and_bad_messages_are_decode_errors_with_their_position(tmp_path: Path) -> None:
    core = core_for(tmp_path)
    with pytest.raises(DecodeError, match="unknown replication frame type 'x'"):
        core.frame(b"x")
    with pytest.raises(DecodeError) as raised:
        core.frame(xlogdata(0x4242, b"I\x00"))
    assert raised.value.wal_lsn == 0x4242


def test_a_status_update_is_due_at_the_interval_and_once_the_sink_caught_up(tmp_path: Path) -> None:
    """Every ``status_interval_s``; sooner only when the sink has finished all it was handed and that moved the
    flush position (then not more often than CAUGHT_UP_STATUS_S): a caught-up slot shows no lag."""
    progress = Ledger()
    core = core_for(tmp_path, progress=progress, status_interval_s=10.0)
    core.status_update(100.0, 0)
    assert not core.status_due(100.5)  # nothing moved
    assert core.status_due(110.0)
    first = progress.open(0x100)
    first.outstanding = 1
    progress.seal(first)
    second = progress.open(0x200)
    progress.seal(second)
    assert progress.flushed_lsn == 0
    assert not core.status_due(100.5)  # the sink still works on it
    progress.ack(first)
    assert progress.flushed_lsn == 0x200
    assert core.status_due(100.5)
    assert not core.status_due(100.0 + CAUGHT_UP_STATUS_S / 2)  # too soon after the last update
    assert _STATUS.unpack(core.status_update(100.5, 0))[2] == 0x200
    assert not core.status_due(100.6)  # reported already
    core.frame(xlogdata(0x300, encode(Begin(0x400, 0, 9))))
    progress.idle(0x500, core.assembler.in_transaction)  # a keepalive while a transaction is open: not confirmable
    assert not core.status_due(101.0)


def test_a_silent_server_is_asked_for_a_keepalive_then_given_up(tmp_path: Path) -> None:
    """As PostgreSQL's walreceiver: at half of the receive timeout a status update that asks for an answer, and the
    connection is dead only once the whole timeout passed and half of it since that request."""
    core = core_for(tmp_path, receive_timeout_s=60.0)
    core.heard(1000.0)
    assert core.silence(1029.0) is None
    assert core.silence(1030.0) is Silence.PING
    ping = core.ping(1030.0, 0)
    assert ping[0:1] == b"r"
    assert ping[-1] == 1  # reply requested
    assert core.silence(1059.0) is None
    assert core.silence(1060.0) is Silence.LOST
    core.heard(1061.0)  # the answer came after all
    assert core.silence(1062.0) is None
    assert core_for(tmp_path, receive_timeout_s=0.0).silence(1e9) is None  # 0: never


def test_a_keepalive_request_after_a_long_wait_elsewhere_gets_its_time_to_be_answered(tmp_path: Path) -> None:
    """The loop did not read for long (the sink waited for Kafka): the server is asked first, not given up at once."""
    core = core_for(tmp_path, receive_timeout_s=60.0)
    core.heard(0.0)
    assert core.silence(500.0) is Silence.PING
    core.ping(500.0, 0)
    assert core.silence(529.0) is None
    assert core.silence(530.0) is Silence.LOST
