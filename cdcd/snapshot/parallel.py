"""Reading the parts of an initial snapshot (whole tables, or key ranges of a large one) on several connections,
each in the slot's exported snapshot (``SET TRANSACTION SNAPSHOT``), so that together they read one consistent
state: what ``snapshot.parallelism`` > 1 does. No psycopg: the readers are opened by the caller's function.

Each connection has a thread that takes the next part, reads it in batches of rows and hands them over a small
queue; the caller (``Snapshotter``, on the main thread) writes them to the sink, which alone talks to Kafka and
to the position ledger. A part with ``encode`` (the Kafka sink's ``snapshot_encoder``) is read as COPY text and
made into its records on the thread (the compiled stage parses and encodes without the GIL), so that the caller
only produces them; without, its rows are decoded there and encoded by the sink. The batches of one part come in
its key order; parts interleave.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cdcd.batches import SnapshotRecords
from cdcd.pgoutput.messages import Row

POLL_S = 0.05  # how long the caller waits for a batch before it gets a None (to poll the sink meanwhile)
STOP_S = 30.0  # how long closing waits for the threads to end


class PartReader(Protocol):
    """A connection of its own that reads parts (``cdcd.snapshot.reader.SnapshotReader``)."""

    def use_exported(self, snapshot_name: str) -> None: ...
    def row_batches(
        self, table: Any, condition: str | None, after: Sequence[str | None] | None, size: int
    ) -> Iterator[list[Row]]: ...
    def copy_batches(
        self, table: Any, condition: str | None, after: Sequence[str | None] | None, size: int
    ) -> Iterator[bytes]: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class Part:
    """A table, or a key range of it (in ``condition``), to read after key ``after``; ``owner`` is the caller's."""

    owner: Any
    table: Any
    condition: str | None
    after: Sequence[str | None] | None = None
    encode: Callable[[bytes], SnapshotRecords] | None = None  # COPY lines to records, on the reading thread


@dataclass(frozen=True)
class Read:
    """Rows of ``part`` in key order (made into records when it has ``encode``); ``final``: its last (``rows`` is
    empty when the part has none)."""

    part: Part
    rows: list[Row] | SnapshotRecords
    final: bool


class _Finished:
    """A thread has no part left."""


_FINISHED = _Finished()
_Out = queue.Queue[Read | BaseException | _Finished]  # what the threads hand the caller


def read_parts(
    parts: Sequence[Part],
    connections: int,
    open_reader: Callable[[], PartReader],
    snapshot_name: str,
    size: int,
) -> Generator[Read | None, None, None]:
    """The batches of ``parts`` (up to ``size`` rows each) as the threads read them, and None whenever none came
    for ``POLL_S``. An error of a thread is raised here; closing the iterator stops the threads."""
    todo = deque(parts)
    lock = threading.Lock()
    out: _Out = queue.Queue(maxsize=2 * connections)
    halt = threading.Event()

    def take() -> Part | None:
        with lock:
            return todo.popleft() if todo else None

    threads = [
        threading.Thread(
            target=_work,
            args=(take, out, halt),
            kwargs={"open_reader": open_reader, "snapshot_name": snapshot_name, "size": size},
            name=f"cdcd-snapshot-{i}",
        )
        for i in range(min(connections, len(parts)))
    ]
    for thread in threads:
        thread.daemon = True
        thread.start()
    running = len(threads)
    try:
        while running:
            try:
                got = out.get(timeout=POLL_S)
            except queue.Empty:
                yield None
                continue
            if isinstance(got, BaseException):
                raise got
            if isinstance(got, _Finished):
                running -= 1
            else:
                yield got
    finally:
        halt.set()
        _stop(threads, out)


def _work(
    take: Callable[[], Part | None],
    out: _Out,
    halt: threading.Event,
    *,
    open_reader: Callable[[], PartReader],
    snapshot_name: str,
    size: int,
) -> None:
    try:
        reader = open_reader()
        try:
            reader.use_exported(snapshot_name)
            while not halt.is_set() and (part := take()) is not None:
                if not _read(reader, part, out, halt, size):
                    return
        finally:
            reader.close()
    except BaseException as exc:  # handed to the caller's thread, which raises it
        _put(out, exc, halt)
    finally:
        _put(out, _FINISHED, halt)


def _read(reader: PartReader, part: Part, out: _Out, halt: threading.Event, size: int) -> bool:
    """Hand over the batches of ``part``, each told whether it is the last; False when halted."""
    held: list[Row] | SnapshotRecords | None = None
    for rows in _batches(reader, part, size):
        if held is not None and not _put(out, Read(part, held, False), halt):
            return False
        held = rows
    return _put(out, Read(part, held or [], True), halt)


def _batches(reader: PartReader, part: Part, size: int) -> Iterator[list[Row]] | Iterator[SnapshotRecords]:
    if part.encode is None:
        return reader.row_batches(part.table, part.condition, part.after, size)
    return map(part.encode, reader.copy_batches(part.table, part.condition, part.after, size))


def _put(out: _Out, item: Read | BaseException | _Finished, halt: threading.Event) -> bool:
    while not halt.is_set():
        try:
            out.put(item, timeout=POLL_S)
        except queue.Full:
            continue
        return True
    return False


def _stop(threads: list[threading.Thread], out: _Out) -> None:
    """Let every thread see the halt (none stays blocked on a full queue) and end; a thread in the middle of a
    COPY ends at its next batch, its connection closed. One that does not within ``STOP_S`` (a server that does
    not answer) is left behind: a daemon thread, gone with the process."""
    deadline = time.monotonic() + STOP_S
    for thread in threads:
        while thread.is_alive() and time.monotonic() < deadline:
            try:
                while True:
                    out.get_nowait()
            except queue.Empty:
                pass
            thread.join(timeout=POLL_S)
