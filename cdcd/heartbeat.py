"""Heartbeats (``kafka.heartbeat``): when one is due and what it says. Pure: ``now`` is passed in.

A heartbeat record says, every ``interval_s``, that cdcd is alive and where it is in the WAL: consumers and
monitors tell an idle source from a stuck pipeline. It is written as a ledger entry at the position that is
confirmable already (``Ledger.flushed_lsn``), so finishing it confirms nothing new.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cdcd.ledger import Ledger


@dataclass(frozen=True, slots=True)
class Heartbeat:
    ts_ms: int  # when it was made (unix milliseconds)
    lsn: int  # the confirmable (flush) position then: everything before it is in Kafka
    received_lsn: int  # the highest position received from the server then


class HeartbeatClock:
    """When the next heartbeat is due (monotonic seconds); ``interval_s`` 0: never."""

    def __init__(self, interval_s: float, now: float) -> None:
        self.interval_s = interval_s
        self.next_at = now + interval_s if interval_s else math.inf

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def wake_in(self, now: float) -> float:
        """Seconds until the next heartbeat (``inf``: none)."""
        return max(0.0, self.next_at - now)

    def beat(self, now: float, ledger: Ledger, unix_ms: int) -> Heartbeat:
        """The heartbeat due now; the next one is due ``interval_s`` later (not sooner if this one came late)."""
        self.next_at = now + self.interval_s
        return Heartbeat(unix_ms, ledger.flushed_lsn, ledger.received_lsn)
