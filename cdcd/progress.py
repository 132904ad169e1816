"""Which WAL position may be confirmed to PostgreSQL. Pure: no I/O.

Transactions are handed to the sink in commit order. Each gets an entry that counts the sink's
outstanding work (messages not yet acknowledged) and is sealed once all its work was handed over.
The confirmable (flush) LSN is the end LSN of the longest prefix of entries that are sealed with nothing
outstanding: never past anything the sink has not finished. When nothing at all is pending, the position
of a server keepalive may be confirmed, so that an idle or fully filtered database does not pin WAL.
"""

from __future__ import annotations

from collections import deque


class Entry:
    __slots__ = ("end_lsn", "outstanding", "sealed")

    def __init__(self, end_lsn: int) -> None:
        self.end_lsn = end_lsn
        self.outstanding = 0
        self.sealed = False


class Progress:
    def __init__(self, start_lsn: int = 0) -> None:
        self.received_lsn = start_lsn  # highest WAL position received from the server
        self.flushed_lsn = start_lsn  # highest position the sink has finished with
        self._entries: deque[Entry] = deque()

    @property
    def pending(self) -> int:
        """Transactions handed to the sink and not yet finished."""
        return len(self._entries)

    def received(self, lsn: int) -> None:
        self.received_lsn = max(self.received_lsn, lsn)

    def open(self, end_lsn: int) -> Entry:
        """Start tracking a transaction that ends at ``end_lsn``; call ``seal`` when all its work is handed over."""
        entry = Entry(end_lsn)
        self._entries.append(entry)
        return entry

    def add(self, entry: Entry, count: int = 1) -> None:
        entry.outstanding += count

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

    def _advance(self) -> None:
        entries = self._entries
        while entries and entries[0].sealed and entries[0].outstanding == 0:
            lsn = entries.popleft().end_lsn
            self.flushed_lsn = max(self.flushed_lsn, lsn)
