"""Which WAL position may be confirmed to PostgreSQL. Pure: no I/O.

Transactions are handed to the sink in commit order. Each gets an entry that counts the sink's
outstanding work (messages not yet acknowledged) and is sealed once all its work was handed over.
The confirmable (flush) LSN is the end LSN of the longest prefix of entries that are sealed with nothing
outstanding: never past anything the sink has not finished. When nothing at all is pending, the position
of a server keepalive may be confirmed, so that an idle or fully filtered database does not pin WAL.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence


class Entry:
    __slots__ = ("commit_times", "done", "end_lsn", "outstanding", "sealed")

    def __init__(self, end_lsn: int, commit_times: Sequence[float], done: Callable[[], None] | None = None) -> None:
        self.done = done  # called once the entry is finished (after every entry before it)
        self.end_lsn = end_lsn
        # unix seconds of the commit on the server of each transaction of the entry (none when not known)
        self.commit_times = commit_times
        self.outstanding = 0  # messages handed over and not acknowledged yet: the sink counts them up itself
        self.sealed = False

    @property
    def commit_time(self) -> float | None:
        """The first (oldest) commit time, for lag."""
        return self.commit_times[0] if self.commit_times else None


class Progress:
    def __init__(self, start_lsn: int = 0, on_done: Callable[[float], None] | None = None) -> None:
        self.received_lsn = start_lsn  # highest WAL position received from the server
        self.flushed_lsn = start_lsn  # highest position the sink has finished with
        self.on_done = on_done  # called with the commit time of each finished transaction that has one
        self._entries: deque[Entry] = deque()

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
        return entry

    def ack(self, entry: Entry, count: int = 1) -> None:
        entry.outstanding -= count
        if entry.outstanding < 0:
            raise RuntimeError("acknowledged more work than was handed to the sink")
        if entry.sealed and entry.outstanding == 0 and self._entries and self._entries[0] is entry:
            self._advance()

    def seal(self, entry: Entry) -> None:
        entry.sealed = True
        if entry.outstanding == 0:
            self._advance()

    def idle(self, wal_end: int, in_transaction: bool) -> None:
        """A keepalive says the server has sent everything up to ``wal_end``; confirm it if nothing is pending."""
        self.received(wal_end)
        if not self._entries and not in_transaction and wal_end > self.flushed_lsn:
            self.flushed_lsn = wal_end

    def resume_at(self, lsn: int) -> None:
        """The sink committed everything up to ``lsn`` in an earlier run (exactly-once): confirmable."""
        self.received(lsn)
        self.flushed_lsn = max(self.flushed_lsn, lsn)

    def discard(self) -> None:
        """The sink dropped all it had not finished (an aborted Kafka transaction): the server sends it again."""
        self._entries.clear()

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
