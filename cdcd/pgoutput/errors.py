"""Typed decoding errors: every malformed message names its type and the byte offset of the problem."""

from __future__ import annotations


class DecodeError(ValueError):
    """A pgoutput message could not be decoded.

    ``message_type`` is the message's name (e.g. ``"Insert"``), ``offset`` the byte offset inside the
    message where decoding failed, ``wal_lsn`` the XLogData position when the caller knows it.
    """

    def __init__(self, message_type: str, offset: int, reason: str, wal_lsn: int | None = None) -> None:
        self.message_type = message_type
        self.offset = offset
        self.reason = reason
        self.wal_lsn = wal_lsn
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f" (WAL {self.wal_lsn >> 32:X}/{self.wal_lsn & 0xFFFFFFFF:X})" if self.wal_lsn is not None else ""
        return f"malformed pgoutput {self.message_type} message at byte {self.offset}{where}: {self.reason}"
