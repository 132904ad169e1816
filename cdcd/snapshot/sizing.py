"""How many rows an incremental chunk asks for: ``snapshot.chunk_size`` at most. A chunk that outlasts its
connection's deadline (a selective condition scanning far for its rows, a standby's replay lag) is read again with
half as many rows, down to ``FLOOR``, where reading the same chunk again would time out again, for ever. A chunk
read in under a quarter of the deadline doubles the size back: its time grows with its rows, so the next chunk
stays within half of the deadline and the size does not swing between the two."""

from __future__ import annotations

from dataclasses import dataclass, field

FLOOR = 1


@dataclass
class ChunkSize:
    """The rows the next chunk asks for; kept across sessions (a deadline ends its session)."""

    most: int  # snapshot.chunk_size
    deadline_s: float  # the reading connection's deadline (``Timeouts.deadline_s``); 0: none, the size stays
    rows: int = field(init=False)

    def __post_init__(self) -> None:
        self.rows = self.most

    def timed_out(self) -> int:
        """A chunk of ``rows`` outlasted the deadline: the size for the next try."""
        self.rows = max(min(FLOOR, self.most), self.rows // 2)
        return self.rows

    def took(self, seconds: float) -> None:
        """A chunk of ``rows`` was read in ``seconds``."""
        if seconds < self.deadline_s / 4:
            self.rows = min(self.most, self.rows * 2)
