"""The compiled lane: whole plain transactions from walsender frames to Kafka records in one call.

``ReplicationCore.frame`` takes one frame at a time and ``EventShaper.transaction`` makes one record at a time;
for a stream of small transactions that per-frame and per-record Python is most of cdcd's CPU. ``Lane.take``
hands a batch of frames to ``cdcd._native.plain_transactions``, which does for every whole plain transaction
what the core, the decoder, the assembler and the shaper do (Begin, Insert/Update/Delete, Commit; tables
without a row filter, with a compiled envelope; no snapshot window watching), byte for byte, and stops at the
first transaction it leaves to them: the caller feeds that one to ``ReplicationCore.frame`` and tries the lane
again at the next Begin. What the lane made goes to the sink as one ``Shaped`` unit (one progress entry).

Inside a transaction the lane does not take (a large or streamed one above all), ``Lane.encode`` does what the
core, the decoder and ``EventShaper.early`` do for its row changes: from the second change of a run of one
table's changes on, the compiled code encodes them from the frames straight into that run, with none of the
per-change Python.

The Python stages stay the specification: ``tests/unit/test_lane.py`` runs both on the same frames and compares
every record. Without the compiled module (``CDCD_IMPL=python``) or in Debezium's layout there is no lane.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cdcd import __version__
from cdcd.assembly.buffer import SPILL_BATCH
from cdcd.batches import Shaped
from cdcd.native import native
from cdcd.pgoutput import Decoder
from cdcd.replication.core import Event, ReplicationCore
from cdcd.shaping import EventShaper

# Larger transactions take the Python stages (which shape them in compiled runs). A transaction the lane takes is
# whole in one read's frames, which the socket buffer bounds, so this is a guard more than a memory limit.
MAX_CHANGES = 10_000
BATCH_RECORDS = 4_096  # records made per call, at most (plus one transaction's): produced before the next call
_BEGIN = ord("B")
_CHANGES = frozenset(b"IUD")
_PAYLOAD = 25  # XLogData header: 'w', data start, WAL end, send time


def begins(frame: bytes) -> bool:
    """Whether ``frame`` is an XLogData frame holding a Begin: where the lane can start."""
    return len(frame) > _PAYLOAD and frame[_PAYLOAD] == _BEGIN


def changes(frame: bytes) -> bool:
    """Whether ``frame`` is an XLogData frame holding an Insert, Update or Delete."""
    return len(frame) > _PAYLOAD and frame[_PAYLOAD] in _CHANGES


class Lane:
    """The lane for one replication session. ``written``: transactions committed at or below this LSN are in
    Kafka already (an exactly-once sink's last commit): those are left to the Python stages, which skip them."""

    def __init__(self, core: ReplicationCore, shaper: EventShaper, written: Callable[[], int] = lambda: 0) -> None:
        self.core = core
        self.shaper = shaper
        self.written = written
        # relation id -> LaneTable, or the Relation whose table the lane leaves to Python (refused until the
        # decoder holds another version of it)
        self.tables: dict[int, Any] = {}

    @staticmethod
    def available(shaper: EventShaper, decoder: Decoder) -> bool:
        """Whether the lane can stand for the stages: compiled shaping (either layout), and UTF-8 text on the
        wire, which the compiled code reads (not a SQL_ASCII database's bytes: ``wire_encoding``)."""
        return native is not None and shaper.native and decoder.compiled

    def take(self, frames: list[bytes], start: int) -> tuple[int, Shaped | None]:
        """The transactions from ``frames[start]`` (a Begin) on that the lane makes, up to the first it leaves
        to the Python stages: the index of that frame, and what was made (None: nothing)."""
        core, shaper = self.core, self.shaper
        watcher = core.watcher
        if core.assembler.in_transaction or core.decoder.in_stream or (watcher is not None and watcher.watching):
            return start, None
        assert native is not None
        while True:
            stop, received, records, xids, changes, last_commit, end_lsn, commit_times, events, ask = (
                native.plain_transactions(
                    frames,
                    start,
                    core.decoder.relations,
                    self.tables,
                    __version__,
                    shaper.database,
                    shaper.transaction_headers(),
                    shaper.tombstones,
                    self.written(),
                    shaper.last_commit_lsn,
                    shaper.clock_us(),
                    MAX_CHANGES,
                    BATCH_RECORDS,
                    debezium=shaper.debezium,
                )
            )
            if stop > start or ask is None or not self._add(ask):
                break
        if not xids:
            return start, None
        core.written(xids, changes, received)
        shaper.shaped(last_commit, events)
        return stop, Shaped(records, last_commit, end_lsn, commit_times)

    def encode(self, frames: list[bytes], start: int) -> int:
        """The row changes of ``frames[start:]`` that continue the open transaction's growing encoded run (its
        table, its subtransaction), encoded into it by the compiled code as the core would add them one by one
        (``EventShaper.early``); returns the index of the first frame left to the core."""
        core = self.core
        buffer = core.assembler.open_buffer()
        run = None if buffer is None else buffer.growing_run()
        if run is None:
            return start
        assert buffer is not None
        relation = run.relation
        xid = buffer.last_xid
        pool = buffer.pool
        room = pool.memory_limit - pool.memory_bytes
        if (
            core.decoder.relations.get(relation.relation_id) is not relation
            or (xid is None) == core.decoder.in_stream
            or room <= 0
        ):
            return start
        positions = self.shaper.plans.get(relation).key_positions
        before = run.nbytes
        envelope = run.encoder.envelope  # type: ignore[attr-defined]
        stop, taken, received = envelope.prepare_frames(
            frames,
            start,
            relation.relation_id,
            len(relation.columns),
            xid,
            positions,
            SPILL_BATCH - run.count,
            room,
            run.rows,
        )
        if taken:
            buffer.took(taken, run.nbytes - before)
            core.ledger.received(received)
        return int(stop)

    def _add(self, relation_id: int) -> bool:
        """Settle whether the lane takes the table: True when the lane should try again."""
        relation = self.core.decoder.relations.get(relation_id)
        if relation is None:
            return False  # the decoder names the problem
        shaper = self.shaper
        plan = shaper.plans.get(relation)
        if self.core.rowfilter is not None and not plan.filtered:
            return False  # the row filter settles its rules for this table at the first change
        if plan.filter is not None:  # the core filters it (and makes its topic only when a row passes)
            self.tables[relation_id] = relation
            return True
        wire = plan.wire or shaper.wire(plan)
        envelope = wire.encoder.envelope
        if envelope is None:
            self.tables[relation_id] = relation
            return True
        assert native is not None
        self.tables[relation_id] = native.LaneTable(
            relation,
            envelope,
            wire.topic,
            plan.table,
            wire.key_header,
            wire.value_header,
            list(plan.key_positions),
            shaper.collection(wire.topic),
        )
        return True


Laned = tuple[Lane, Callable[[Shaped], None]]  # the lane, and what writes what it made


def carry_out(
    frames: list[bytes], core: ReplicationCore, act: Callable[[Event], bool], laned: Laned | None = None
) -> bool:
    """A read's frames carried out: with a lane, from each Begin, what it takes goes to its writer; every other
    frame goes through ``core.frame`` and its event to ``act``. True when ``act`` said the server asked for a
    status update."""
    frame, reply, index = core.frame, False, 0
    while index < len(frames):
        data = frames[index]
        if laned is not None and begins(data):
            index, shaped = laned[0].take(frames, index)
            if shaped is not None:
                laned[1](shaped)
                continue
        elif laned is not None and changes(data):
            taken = laned[0].encode(frames, index)
            if taken > index:
                index = taken
                continue
        event = frame(data)
        index += 1
        if event is not None:
            reply = act(event) or reply
    return reply
