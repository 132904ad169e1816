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

    @classmethod
    def parse(cls, text: str) -> SnapshotXids:
        """From the text of ``pg_current_snapshot()``, e.g. ``"748:752:748,750"``."""
        try:
            xmin, xmax, xip = text.split(":")
            return cls(int(xmin) & _MASK, int(xmax) & _MASK, frozenset(int(x) & _MASK for x in xip.split(",") if x))
        except ValueError:
            raise ValueError(f"not a pg_current_snapshot() value: {text!r}") from None

    def invisible(self, xid: int) -> bool:
        """Whether transaction ``xid`` had not committed for this snapshot: running, or not started yet."""
        return xid in self.xip or ((xid - self.xmax) & _MASK) < _HALF
