"""Snapshot progress: what is queued, how far each table got. Persisted as JSON in the state directory.

A table's progress advances only after Kafka (or the JSON lines file) has every row up to ``last_key``, so a
restart resumes after the last finished chunk. A table read in key ranges (a parallel initial snapshot) is one
entry per range: a finished range leaves the queue, so a restart reads only the ranges left, each after its
own last key. The file is replaced atomically (write, fsync, rename), readable by its owner only (0600).

With an exactly-once sink, the state committed with the data is kept here too, and the progress record in
Kafka only names it (``StateStore.stage``): that record is written in every Kafka transaction and read by
whoever may read the topic, so it carries neither the whole state (6,000 queued tables made it pass
``message.max.bytes``) nor a chunk key, which is in clear here (the next chunk's query needs it).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from cdcd.ledger import Positions

Kind = Literal["initial", "incremental"]


class StateError(RuntimeError):
    """The state directory cannot be read or written, or holds a file cdcd cannot use."""


@dataclass
class TableProgress:
    """One table's snapshot: ``last_key`` is the chunk key (text values) of the last row delivered."""

    table: str  # schema.table
    kind: Kind
    where: str | None = None  # an extra condition (cdcd snapshot --where), ANDed with the row filters
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    last_key: list[str | None] | None = None
    rows: int = 0
    chunks: int = 0
    resumed_initial: bool = False  # what an interrupted initial snapshot left, continued incrementally
    group: str | None = None  # the snapshot it is part of (a signal's id), when not a snapshot of its own
    # A key range of the table (SQL, ANDed with the other conditions): one part of a table an initial snapshot
    # read on several connections (``snapshot.parallelism``); its ``group`` is the table's snapshot id
    key_range: str | None = None
    relation_id: int | None = None  # the table's oid, which a rename keeps (None: queued before it was kept)
    # An incremental snapshot's end: the chunk key of the table's last row when it began ([] for an empty table;
    # None: not looked up yet). Rows inserted after it with higher keys arrive by the stream; without the bound a
    # table that grows at its end faster than chunks are read is never finished (Debezium bounds it the same way).
    until_key: list[str | None] | None = None

    @property
    def snapshot(self) -> str:
        """The id of the snapshot it is part of: what its notifications carry."""
        return self.group or self.id


@dataclass
class SnapshotState:
    slot: str
    system_id: str = ""  # never set yet; kept: state files written since the field was added hold it
    initial: Literal["none", "running", "done"] = "none"
    consistent_point: int | None = None
    queue: list[TableProgress] = field(default_factory=list)  # unfinished snapshots, in order
    known_tables: list[str] = field(default_factory=list)  # captured tables seen at the last start
    known_relations: dict[str, int] = field(default_factory=dict)  # their relation ids, by name (renames)
    # the leaf partitions of those published as their root (publish_via_partition_root), by the root's relation
    # id (text): a partition attached since holds rows the stream never sends
    known_partitions: dict[str, list[int]] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)  # ids of finished snapshots (latest 100)
    paused: bool = False  # incremental snapshots paused by a signal (pause-snapshot until resume-snapshot)
    signal_offsets: dict[str, int] = field(default_factory=dict)  # signal topic partition -> next offset to act on
    # The plan saved as the slot was created, before the session's first start: nothing was written from the
    # slot yet (nothing is in Kafka; a progress topic's record is an older slot's)
    fresh_slot: bool = False

    def enqueue(self, progress: TableProgress) -> bool:
        """Queue a snapshot unless the same table with the same condition is already queued (a key range of it
        is not the same: it holds part of the table only)."""
        if any(_same_rows(p, progress) for p in self.queue):
            return False
        self.queue.append(progress)
        return True

    def finish(self, progress: TableProgress) -> None:
        self.queue = [p for p in self.queue if p.id != progress.id]
        self.finished = [*self.finished[-99:], progress.id]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SnapshotState:
        queue = [TableProgress(**p) for p in data.pop("queue", [])]
        return cls(**data, queue=queue)


def _same_rows(a: TableProgress, b: TableProgress) -> bool:
    return (a.table, a.where, a.key_range) == (b.table, b.where, b.key_range)


def _private(path: Path) -> IO[str]:
    """``path`` opened for writing, readable by its owner only whatever the umask: the state holds chunk keys in
    clear (a hashed key column's too: the next chunk's query needs them)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a file left by an older cdcd keeps its mode otherwise
    return os.fdopen(fd, "w")


def state_dir_problem(state_dir: Path) -> str | None:
    """Why cdcd could not keep snapshot progress in ``state_dir`` (None: it can)."""
    probe = state_dir / f".cdcd-check-{uuid.uuid4().hex[:8]}"
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        return f"snapshot.state_dir {state_dir} is not writable: {exc.strerror}"
    return None


class StateStore:
    """``<state_dir>/<slot>.snapshot.json``: the snapshot state and, beside it (``positions``), what the position
    ledger keeps across restarts."""

    def __init__(self, state_dir: Path, slot: str) -> None:
        self.path = state_dir / f"{slot}.snapshot.json"
        self.slot = slot
        self.positions = Positions()
        self._saved: dict[str, Any] | None = None  # the state as last saved or loaded
        # exactly-once: the states a progress record may name, by digest: the one committed last and the one the
        # Kafka transaction being committed names (``stage``); a restart finds either
        self.committed: dict[str, dict[str, Any]] = {}
        self._committed_digest: str | None = None
        self._staged: str | None = None

    def load(self) -> SnapshotState | None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateError(f"cannot read snapshot state {self.path}: {exc.strerror}") from None
        except ValueError as exc:
            raise StateError(f"snapshot state {self.path} is not valid JSON: {exc}") from None
        try:
            self.positions = Positions(**data.pop("positions", {}))
            self.committed = dict(data.pop("committed", {}))
            self._saved = dict(data)
            state = SnapshotState.from_json(data)
        except TypeError as exc:
            raise StateError(f"snapshot state {self.path} has an unexpected layout: {exc}") from None
        if state.slot != self.slot:
            raise StateError(f"snapshot state {self.path} belongs to slot {state.slot!r}, not {self.slot!r}")
        return state

    def save(self, state: SnapshotState, *, committed: bool = False) -> None:
        """Save ``state``; ``committed``: the state ``stage`` named last is now committed in Kafka (the only one
        a progress record names from now on)."""
        if committed and self._staged is not None:
            self._committed_digest = self._staged
            self.committed = {self._staged: self.committed[self._staged]}
        self._write(state.to_json())

    def stage(self, state: SnapshotState) -> dict[str, Any]:
        """What an exactly-once progress record carries for ``state``: its digest (and a summary, for whoever
        reads the topic), a few dozen bytes however large the state. ``state`` is written to the file first,
        beside the state committed last, so that a restart finds whichever of the two Kafka committed."""
        data = state.to_json()
        digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
        self._staged = digest
        if digest not in self.committed:
            kept = self._committed_digest
            self.committed = {d: s for d, s in self.committed.items() if d == kept} | {digest: data}
            self._write(data if self._saved is None else self._saved)
        return {"digest": digest, "queued": len(state.queue), "initial": state.initial}

    def committed_state(self, reference: dict[str, Any]) -> dict[str, Any]:
        """The state a progress record names (``stage``)."""
        digest = reference.get("digest")
        data = self.committed.get(str(digest))
        if data is None:
            raise StateError(
                f"the progress topic's last record names snapshot state {digest}, which {self.path} does not hold:"
                " exactly-once delivery keeps the snapshot state there (was the file removed or replaced?). Restore"
                " it, or drop the slot and the progress topic's record to start again"
            )
        self._committed_digest = str(digest)
        return data

    def save_positions(self, positions: Positions) -> None:
        """Save ``positions`` beside the state as last saved (never the state in memory, which may be ahead of
        what an exactly-once sink committed), if they changed."""
        if positions == self.positions or self._saved is None:
            return
        self.positions = positions
        self._write(self._saved)

    def _write(self, state: dict[str, Any]) -> None:
        self._saved = state
        tmp = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with _private(tmp) as f:
                committed = {"committed": self.committed} if self.committed else {}
                json.dump({**state, "positions": asdict(self.positions), **committed}, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(self.path)
        except OSError as exc:
            raise StateError(f"cannot write snapshot state {self.path}: {exc.strerror}") from None
