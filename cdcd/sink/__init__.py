"""Where committed changes go: JSON lines (``sink/jsonl.py``) or Kafka (``sink/kafka.py``, with its transport,
registry and delivery strategies in their own modules).

A sink reports finished work through ``Ledger`` (synchronously, or from ``poll`` for one that delivers
asynchronously) and raises from ``poll`` once delivery has failed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from cdcd.batches import Buffered, Notification, Shaped, SnapshotBatch, SnapshotRecords, Transaction
from cdcd.heartbeat import Heartbeat
from cdcd.ledger import Ledger
from cdcd.pgoutput.messages import LogicalMessage, Relation, Type
from cdcd.plan import Plans


class SinkFailure(RuntimeError):
    """The sink lost or refused data (e.g. a Kafka delivery error): the daemon must stop."""


class SinkRewind(RuntimeError):
    """The sink dropped work it had not committed (an aborted Kafka transaction): start again from the position
    ``Sink.committed`` reports, as after a lost connection."""


@dataclass(frozen=True)
class Committed:
    """What an exactly-once sink committed last, atomically with the data.

    ``flush_lsn``: the WAL position to confirm. ``position``: the start LSN of the last record written (a
    transaction's commit record, a message): anything at or below it is written already, whatever the server
    sends again. ``snapshot``: what names the snapshot state as of that commit (``StateStore.stage``; in a
    version 1 record, the state itself).
    """

    flush_lsn: int
    position: int
    snapshot: dict[str, Any] | None


@dataclass(frozen=True)
class SessionContext:
    """What a sink learns when a replication session starts."""

    database: str
    types: Mapping[int, Type] = field(default_factory=dict)  # the decoder's Type cache, kept current
    keep_alive: Callable[[], None] = lambda: None  # call while blocked: keeps status updates going
    plans: Plans = field(default_factory=Plans)  # the session's table plans, shared with the row filter
    snapshot_state: Callable[[], dict[str, Any] | None] = lambda: None  # committed with the data (exactly-once)
    snapshot_committed: Callable[[], None] = lambda: None  # after such a commit: save the state file too
    encoding: str = "utf-8"  # the stream's text (``wire_encoding``): what encoded runs are decoded with again


class AtLeastOnce:
    """What a sink without atomic position commits has for ``Sink``'s exactly-once part: after a restart it may
    write again what it wrote beyond the slot's confirmed position."""

    transactional = False

    def committed(
        self, slot: str, system_id: str, slot_created: bool, keep_alive: Callable[[], None]
    ) -> Committed | None:
        return None

    def wake_in(self) -> float:
        return math.inf

    def end_session(self, ledger: Ledger) -> None:
        """Nothing held beyond the ledger's entries: it drops the unsealed ones itself."""


class Sink(Protocol):
    transactional: bool  # writes commit atomically with their position (``committed``): exactly-once

    @property
    def events(self) -> Mapping[tuple[str, str], int]:
        """(schema.table, op code) -> events written; ("", "m") for logical decoding messages."""

    @property
    def delivery_errors(self) -> int: ...

    def committed(
        self, slot: str, system_id: str, slot_created: bool, keep_alive: Callable[[], None]
    ) -> Committed | None:
        """Exactly-once sinks: what the last committed write covered (None: nothing yet, or not exactly-once).
        Called at the start of every session, before anything is written in it; ``keep_alive`` while waiting."""

    def wake_in(self) -> float:
        """Seconds until the sink wants ``poll`` again (to commit what it holds); ``inf``: no hurry."""

    def end_session(self, ledger: Ledger) -> None:
        """The replication session ended, for whatever reason, before ``ledger.end_session``: give up what is
        held and not whole (an exactly-once sink aborts its open Kafka transaction unless every entry in it was
        sealed, and drops those entries from ``ledger``). A stop's ``flush`` follows."""

    def in_flight(self) -> int: ...
    def ready(self) -> bool: ...
    def start_session(self, session: SessionContext) -> None: ...
    def write_transaction(self, txn: Transaction, changes: Iterable[Buffered], progress: Ledger) -> None:
        """Write the committed ``txn``, whose changes are ``changes`` (iterated once)."""

    def write_message(self, message: LogicalMessage, progress: Ledger) -> None: ...
    def write_snapshot(self, batch: SnapshotBatch, progress: Ledger) -> None: ...
    def poll(self) -> None: ...
    def flush(self, timeout: float) -> bool: ...
    def close(self) -> None: ...


@runtime_checkable
class ShapingSink(Sink, Protocol):
    """A sink that shapes with ``cdcd.shaping`` (Kafka) also takes transactions the lane shaped already
    (``cdcd.replication.lane``), with the shaper the pipeline's wiring gave it (``cli.py``)."""

    def write_shaped(self, shaped: Shaped, progress: Ledger) -> None:
        """Write the records of ``shaped``, finished once every one is written."""

    def already_written(self) -> int:
        """Transactions committed at or below this LSN are written already (exactly-once); 0: none known."""

    def write_heartbeat(self, beat: Heartbeat, progress: Ledger) -> None:
        """Write a heartbeat record (``kafka.heartbeat``), finished once written; it confirms nothing new."""

    def write_notification(self, topic: str, notification: Notification, progress: Ledger) -> None:
        """Write a snapshot notification (``notifications.kafka``) to ``topic``; it confirms nothing new."""


@runtime_checkable
class SnapshotEncoding(Protocol):
    """A sink whose records a parallel initial snapshot's reader threads make where they read (Kafka's): what
    ``snapshot_encoder`` returns turns COPY text lines of ``relation`` into ``SnapshotRecords``, from any thread."""

    def snapshot_encoder(self, relation: Relation, lsn: int) -> Callable[[bytes], SnapshotRecords]: ...
