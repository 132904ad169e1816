"""Where committed changes go: JSON lines (``sink/jsonl.py``) or Kafka (``sink/kafka.py``).

A sink reports finished work through ``Progress`` (synchronously, or from ``poll`` for one that delivers
asynchronously) and raises from ``poll`` once delivery has failed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from cdcd.batches import SnapshotBatch, Transaction
from cdcd.pgoutput.messages import Change, LogicalMessage, Type
from cdcd.plan import Plans
from cdcd.progress import Progress


class SinkFailure(RuntimeError):
    """The sink lost or refused data (e.g. a Kafka delivery error): the daemon must stop."""


@dataclass(frozen=True)
class SessionContext:
    """What a sink learns when a replication session starts."""

    database: str
    types: Mapping[int, Type] = field(default_factory=dict)  # the decoder's Type cache, kept current
    keep_alive: Callable[[], None] = lambda: None  # call while blocked: keeps status updates going
    plans: Plans = field(default_factory=Plans)  # the session's table plans, shared with the row filter


class Sink(Protocol):
    @property
    def events(self) -> Mapping[tuple[str, str], int]:
        """(schema.table, op code) -> events written; ("", "m") for logical decoding messages."""

    @property
    def delivery_errors(self) -> int: ...

    def in_flight(self) -> int: ...
    def ready(self) -> bool: ...
    def start_session(self, session: SessionContext) -> None: ...
    def write_transaction(self, txn: Transaction, changes: Iterable[Change], progress: Progress) -> None:
        """Write the committed ``txn``, whose changes are ``changes`` (iterated once)."""

    def write_message(self, message: LogicalMessage, progress: Progress) -> None: ...
    def write_snapshot(self, batch: SnapshotBatch, progress: Progress) -> None: ...
    def poll(self) -> None: ...
    def flush(self, timeout: float) -> bool: ...
    def close(self) -> None: ...
