"""WAL positions (LSNs) and PostgreSQL timestamps: the two scalar types every stage passes around."""

from __future__ import annotations

import time

# PostgreSQL timestamps count microseconds from 2000-01-01 00:00:00 UTC.
PG_EPOCH_OFFSET_US = 946_684_800 * 1_000_000


def format_lsn(lsn: int) -> str:
    """Render an LSN the way PostgreSQL prints it, e.g. ``0/16B3748``."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """Parse ``X/Y`` (hexadecimal halves) into an integer LSN."""
    high, sep, low = text.strip().partition("/")
    if not sep:
        raise ValueError(f"not an LSN (expected X/Y in hexadecimal): {text!r}")
    try:
        hi, lo = int(high, 16), int(low, 16)
    except ValueError:
        raise ValueError(f"not an LSN (expected X/Y in hexadecimal): {text!r}") from None
    if not (0 <= hi <= 0xFFFFFFFF and 0 <= lo <= 0xFFFFFFFF):
        raise ValueError(f"LSN halves out of range: {text!r}")
    return (hi << 32) | lo


def pg_to_unix_us(pg_us: int) -> int:
    """Convert a PostgreSQL timestamp (µs since 2000-01-01) to µs since the Unix epoch."""
    return pg_us + PG_EPOCH_OFFSET_US


def pg_now_us() -> int:
    """The current time as a PostgreSQL timestamp, for standby status updates."""
    return time.time_ns() // 1000 - PG_EPOCH_OFFSET_US
