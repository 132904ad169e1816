"""The compiled lane: whole plain transactions from walsender frames to Kafka records in one call.

``ReplicationCore.frame`` takes one frame at a time and ``EventShaper.transaction`` makes one record at a time;
for a stream of small transactions that per-frame and per-record Python is most of cdcd's CPU. ``Lane.take``
hands a batch of frames to ``cdcd._native.plain_transactions``, which does for every whole plain transaction
what the core, the decoder, the assembler and the shaper do (Begin, Insert/Update/Delete, Commit; tables
without a row filter, with a compiled envelope; no snapshot window watching), byte for byte, and stops at the
first transaction it leaves to them: the caller feeds that one to ``ReplicationCore.frame`` and tries the lane
again at the next Begin. What the lane made is an event of the core, ``Shaped``: the sink writes it as one unit
(one progress entry). The lane reads the core through a few methods (``between_transactions``, ``relations``,
``growing``) and reports to it (``written``, ``encoded``).

Inside a transaction the lane does not take (a large or streamed one above all), ``Lane.encode`` does what the
core, the decoder and ``EventShaper.early`` do for its row changes: from the second change of a run of one
table's changes on, the compiled code encodes them from the frames straight into that run, with none of the
per-change Python.

The Python stages stay the specification: ``tests/unit/test_lane.py`` runs both on the same frames and compares
every record. The row stage (``cdcd.rowstage``) has the lane or not (``RowStage.lane``: None in the Python
specification, ``CDCD_IMPL=python``); in Debezium's layout there is none either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from cdcd import __version__
from cdcd.assembly.buffer import SPILL_BATCH
from cdcd.batches import Shaped
from cdcd.pgoutput import Decoder
from cdcd.pgoutput.messages import Relation
from cdcd.replication.core import Event, ReplicationCore
from cdcd.rowstage import Lane as Compiled
from cdcd.shaping import EventShaper

if TYPE_CHECKING:
    from cdcd.rowstage.stage import LaneTable

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
        assert shaper.stage.lane is not None, "the row stage has no lane (Lane.available)"
        self.compiled: Compiled = shaper.stage.lane
        self.core = core
        self.shaper = shaper
        self.written = written
        # relation id -> LaneTable, or the Relation whose table the lane leaves to Python (refused until the
        # decoder holds another version of it)
        self.tables: dict[int, LaneTable | Relation] = {}

    @staticmethod
    def available(shaper: EventShaper, decoder: Decoder) -> bool:
        """Whether the lane can stand for the stages: a row stage with a lane (either layout), and UTF-8 text on
        the wire, which the compiled code reads (not a SQL_ASCII database's bytes: ``wire_encoding``)."""
        return shaper.stage.lane is not None and decoder.compiled

    def take(self, frames: list[bytes], start: int) -> tuple[int, Shaped | None]:
        """The transactions from ``frames[start]`` (a Begin) on that the lane makes, up to the first it leaves
        to the Python stages: the index of that frame, and what was made (None: nothing)."""
        core, shaper = self.core, self.shaper
        if not core.between_transactions():
            return start, None
        while True:
            stop, received, records, xids, changes, last_commit, end_lsn, commit_times, events, ask = (
                self.compiled.plain_transactions(
                    frames,
                    start,
                    core.relations,
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
        assert last_commit is not None  # set by the transactions made
        core.written(xids, changes, received)
        shaper.shaped(last_commit, events)
        return stop, Shaped(records, last_commit, end_lsn, commit_times)

    def encode(self, frames: list[bytes], start: int) -> int:
        """The row changes of ``frames[start:]`` that continue the open transaction's growing encoded run (its
        table, its subtransaction), encoded into it by the compiled code as the core would add them one by one
        (``EventShaper.early``); returns the index of the first frame left to the core."""
        core = self.core
        growing = core.growing()
        if growing is None:
            return start
        run = growing.run
        relation = run.relation
        envelope = run.encoder.envelope
        assert envelope is not None  # it encoded the run
        positions = self.shaper.plans.get(relation).key_positions
        before = run.nbytes
        stop, taken, received = envelope.prepare_frames(
            frames,
            start,
            relation.relation_id,
            len(relation.columns),
            growing.xid,
            positions,
            SPILL_BATCH - run.count,
            growing.room,
            run.rows,
        )
        if taken:
            core.encoded(taken, run.nbytes - before, received)
        return stop

    def _add(self, relation_id: int) -> bool:
        """Settle whether the lane takes the table: True when the lane should try again."""
        relation = self.core.relations.get(relation_id)
        if relation is None:
            return False  # the decoder names the problem
        shaper = self.shaper
        plan = shaper.plans.get(relation)
        if self.core.filters_rows and not plan.filtered:
            return False  # the row filter settles its rules for this table at the first change
        if plan.filter is not None:  # the core filters it (and makes its topic only when a row passes)
            self.tables[relation_id] = relation
            return True
        wire = plan.wire or shaper.wire(plan)
        envelope = wire.encoder.envelope
        if envelope is None:
            self.tables[relation_id] = relation
            return True
        self.tables[relation_id] = self.compiled.table(
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


def carry_out(
    frames: list[bytes], core: ReplicationCore, act: Callable[[Event], bool], lane: Lane | None = None
) -> bool:
    """A read's frames carried out: with a lane, from each Begin, what it takes is an event (``Shaped``); every
    other frame goes through ``core.frame``; each event goes to ``act``. True when ``act`` said the server asked
    for a status update."""
    frame, reply, index = core.frame, False, 0
    while index < len(frames):
        data = frames[index]
        if lane is not None and begins(data):
            index, shaped = lane.take(frames, index)
            if shaped is not None:
                reply = act(shaped) or reply
                continue
        elif lane is not None and changes(data):
            taken = lane.encode(frames, index)
            if taken > index:
                index = taken
                continue
        event = frame(data)
        index += 1
        if event is not None:
            reply = act(event) or reply
    return reply
