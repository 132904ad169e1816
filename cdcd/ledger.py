"""The position ledger: the one owner of what was received, handed to the sink, made durable by it, and what
may be confirmed to PostgreSQL. Pure: no I/O (what must survive a restart is saved through ``Positions``).

Transactions, messages and snapshot batches are handed to the sink in order. Each gets an entry that counts the
sink's outstanding work (messages not yet acknowledged) and is sealed once all its work was handed over.
The confirmable (flush) LSN is the end LSN of the longest prefix of entries that are sealed with nothing
outstanding: never past anything the sink has not finished. The position of a server keepalive may be
confirmed once nothing received before it is pending, so that an idle or fully filtered database does not pin WAL.

A replication session that ends, for any reason, ends with ``end_session``: an entry it left unsealed (its write
was interrupted: a lost connection, a stop request while waiting for Kafka) is dropped, never finished, never
confirmed, its ``done`` never called; the server sends its transaction again. A sink that drops work it had
handed over whole (an aborted Kafka transaction) drops those entries with ``drop``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Positions:
    """What the ledger keeps across restarts (in the state file, ``StateStore``): the server's timeline at the
    last session, the highest position handed to the sink, and whether the server was a standby, for the promotion
    check of the next process."""

    timeline: int = 0
    published_lsn: int = 0
    standby: bool = False  # the server was a hot standby, where cdcd made its slot (not a synced copy)


class Entry:
    __slots__ = ("commit_times", "done", "dropped", "end_lsn", "outstanding", "sealed")

    def __init__(self, end_lsn: int, commit_times: Sequence[float], done: Callable[[], None] | None = None) -> None:
        self.done = done  # called once the entry is finished (after every entry before it)
        self.end_lsn = end_lsn
        # unix seconds of the commit on the server of each transaction of the entry (none when not known)
        self.commit_times = commit_times
        self.outstanding = 0  # messages handed over and not acknowledged yet: the sink counts them up itself
        self.sealed = False
        self.dropped = False  # its session ended before it was whole, or the sink dropped it: never finished

    @property
    def commit_time(self) -> float | None:
        """The first (oldest) commit time, for lag."""
        return self.commit_times[0] if self.commit_times else None


class Ledger:
    def __init__(self, start_lsn: int = 0, on_done: Callable[[float], None] | None = None) -> None:
        self.received_lsn = start_lsn  # highest WAL position received from the server
        self.published_lsn = start_lsn  # highest end position handed to the sink (for the promotion check)
        self.timeline = 0  # the server's timeline in the current (or last) session: a new one means a promotion
        self.flushed_lsn = start_lsn  # highest position the sink has finished with
        self.on_done = on_done  # called with the commit time of each finished transaction that has one
        self._entries: deque[Entry] = deque()
        self._idle_lsn = 0  # a keepalive's position, confirmable once the entries pending when it came are finished

    def oldest_commit_time(self) -> float | None:
        """Commit time of the oldest transaction not finished yet (for lag in seconds)."""
        try:
            return self._entries[0].commit_time  # read from the metrics thread: no iteration
        except IndexError:
            return None

    @property
    def pending(self) -> int:
        """Transactions handed to the sink and not yet finished."""
        return len(self._entries)

    def received(self, lsn: int) -> None:
        self.received_lsn = max(self.received_lsn, lsn)

    def open(
        self,
        end_lsn: int,
        commit_time: float | None = None,
        done: Callable[[], None] | None = None,
        *,
        commit_times: Sequence[float] = (),
    ) -> Entry:
        """Start tracking a transaction that ends at ``end_lsn`` (or several, whose ``commit_times`` are given);
        call ``seal`` when all its work is handed over. ``done`` is called when it is finished."""
        entry = Entry(end_lsn, commit_times if commit_time is None else (commit_time,), done)
        self._entries.append(entry)
        self.published_lsn = max(self.published_lsn, end_lsn)
        return entry

    def ack(self, entry: Entry, count: int = 1) -> None:
        entry.outstanding -= count
        if entry.dropped:
            return
        if entry.outstanding < 0:
            raise RuntimeError("acknowledged more work than was handed to the sink")
        if entry.sealed and entry.outstanding == 0 and self._entries and self._entries[0] is entry:
            self._advance()

    def seal(self, entry: Entry) -> None:
        entry.sealed = True
        if entry.outstanding == 0:
            self._advance()

    def idle(self, wal_end: int, in_transaction: bool) -> None:
        """A keepalive says the server has sent everything up to ``wal_end``; confirm it if nothing is pending, or
        once the entries pending now are finished (every transaction that ends before it is among them)."""
        self.received(wal_end)
        if in_transaction or wal_end <= self.flushed_lsn:
            return
        if self._entries:
            self._idle_lsn = max(self._idle_lsn, wal_end)
        else:
            self.flushed_lsn = wal_end

    def resume_at(self, lsn: int) -> None:
        """The sink committed everything up to ``lsn`` in an earlier run (exactly-once): confirmable."""
        self.received(lsn)
        self.flushed_lsn = max(self.flushed_lsn, lsn)

    def drop(self, entries: Iterable[Entry]) -> None:
        """The sink dropped ``entries`` (an aborted Kafka transaction): never finished; the server sends them
        again. Acknowledgements that still come for them change nothing."""
        gone = {id(entry) for entry in entries}
        if gone:
            self._idle_lsn = 0  # the server sends the dropped ones again: the keepalive's position is not whole
        for entry in self._entries:
            if id(entry) in gone:
                entry.dropped = True
        self._entries = deque(entry for entry in self._entries if not entry.dropped)
        self._advance()

    def end_session(self) -> int:
        """The replication session ended: drop the entries it did not hand over whole (how many)."""
        unsealed = [entry for entry in self._entries if not entry.sealed]
        self.drop(unsealed)
        return len(unsealed)

    def _advance(self) -> None:
        entries = self._entries
        while entries and entries[0].sealed and entries[0].outstanding == 0:
            entry = entries.popleft()
            self.flushed_lsn = max(self.flushed_lsn, entry.end_lsn)
            if self.on_done is not None:
                for commit_time in entry.commit_times:
                    self.on_done(commit_time)
            if entry.done is not None:
                entry.done()
        if not entries and self._idle_lsn:
            self.flushed_lsn = max(self.flushed_lsn, self._idle_lsn)
            self._idle_lsn = 0
