"""Which of the user's logical decoding messages are published (``source.messages``, ``source.message_prefixes``).
Pure.

The replication core asks before a message is assembled, so a message left out is consumed and dropped whether it
is transactional or not; the compiled lane never takes a transaction holding a message, so this is the only
place. cdcd's own control messages never come here (the core recognises them first).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from cdcd.patterns import Selection

MESSAGES = ""  # the table label messages are counted under, as in cdcd_events_total{table="", op="m"}


@dataclass(frozen=True)
class MessageFilter:
    """``publish``: the user's messages are published at all; ``prefixes``: those whose prefix it selects.
    ``filtered`` counts the messages the prefixes left out, under ``MESSAGES`` (the row filters' counter)."""

    publish: bool = False
    prefixes: Selection = field(default_factory=Selection)
    filtered: Counter[str] = field(default_factory=Counter)

    def keeps(self, prefix: str) -> bool:
        if not self.publish:
            return False
        if self.prefixes(prefix):
            return True
        self.filtered[MESSAGES] += 1
        return False
