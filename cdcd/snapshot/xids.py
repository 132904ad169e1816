"""Transaction visibility against a ``pg_current_snapshot()``, in pgoutput's 32-bit transaction ids. Pure."""

from __future__ import annotations

from dataclasses import dataclass

_MASK = 0xFFFFFFFF
_HALF = 0x80000000


@dataclass(frozen=True, slots=True)
class SnapshotXids:
    """``xmin:xmax:xip`` of a snapshot, reduced to 32 bits (the epoch does not reach the stream)."""

    xmin: int
    xmax: int
    xip: frozenset[int]
    # False for a hot standby's snapshot: PostgreSQL keeps the primary's running transactions in the snapshot's
    # subxip there, which pg_current_snapshot() does not show (its xip is empty)
    running_known: bool = True

    @classmethod
    def parse(cls, text: str, running_known: bool = True) -> SnapshotXids:
        """From the text of ``pg_current_snapshot()``, e.g. ``"748:752:748,750"``."""
        try:
            xmin, xmax, xip = text.split(":")
            running = frozenset(int(x) & _MASK for x in xip.split(",") if x)
            return cls(int(xmin) & _MASK, int(xmax) & _MASK, running, running_known)
        except ValueError:
            raise ValueError(f"not a pg_current_snapshot() value: {text!r}") from None

    def invisible(self, xid: int) -> bool:
        """Whether transaction ``xid`` had not committed for this snapshot by what it shows: in xip, or not started
        yet. (A standby's snapshot shows no running transaction: see ``unseen``.)"""
        return xid in self.xip or _at_or_after(xid, self.xmax)

    def unseen(self, xid: int) -> bool:
        """Whether this snapshot may not have seen transaction ``xid``: ``invisible``, or, when the running
        transactions are not known (a standby), any transaction at or after xmin."""
        return self.invisible(xid) if self.running_known else _at_or_after(xid, self.xmin)


def _at_or_after(xid: int, bound: int) -> bool:
    return ((xid - bound) & _MASK) < _HALF
