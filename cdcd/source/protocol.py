"""The streaming replication protocol's framing, as pure functions (no I/O).

Inside COPY BOTH the server sends XLogData ('w') and primary keepalive ('k') messages; the client sends
standby status updates ('r'). See PostgreSQL's "Streaming Replication Protocol" chapter.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from cdcd.pgoutput.errors import DecodeError

_XLOG_HEADER = struct.Struct(">QQq")  # dataStart, walEnd, sendTime
_KEEPALIVE = struct.Struct(">Qq?")  # walEnd, sendTime, replyRequested
_STATUS = struct.Struct(">cQQQq?")


@dataclass(frozen=True, slots=True)
class Keepalive:
    wal_end: int
    send_time: int
    reply_requested: bool


def parse_keepalive(frame: bytes) -> Keepalive:
    if len(frame) != 1 + _KEEPALIVE.size:
        raise DecodeError("primary keepalive", 1, f"expected {1 + _KEEPALIVE.size} bytes, got {len(frame)}")
    wal_end, send_time, reply = _KEEPALIVE.unpack_from(frame, 1)
    return Keepalive(wal_end, send_time, reply)


def parse_xlogdata_header(frame: bytes) -> tuple[int, int]:
    """Return (dataStart, walEnd) of an XLogData frame; its payload starts at byte 25."""
    if len(frame) < 1 + _XLOG_HEADER.size:
        raise DecodeError("XLogData", 1, f"truncated header: {len(frame)} bytes")
    data_start, wal_end, _ = _XLOG_HEADER.unpack_from(frame, 1)
    return data_start, wal_end


XLOGDATA_PAYLOAD_OFFSET = 1 + _XLOG_HEADER.size


def standby_status_update(write: int, flush: int, apply: int, now_pg_us: int, reply: bool = False) -> bytes:
    return _STATUS.pack(b"r", write, flush, apply, now_pg_us, reply)


def protocol_version_for(server_version_num: int) -> int:
    """The highest pgoutput protocol version a server supports: 1 (≤13), 2 (14), 3 (15), 4 (16+)."""
    major = server_version_num // 10000
    if major >= 16:
        return 4
    return {15: 3, 14: 2}.get(major, 1)


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def start_replication_command(
    slot: str,
    start_lsn: int,
    proto_version: int,
    publications: list[str],
    *,
    streaming: str,
    messages: bool,
    binary: bool,
) -> str:
    """Build START_REPLICATION with the options the negotiated protocol version allows."""
    options = [
        f"proto_version {quote_literal(str(proto_version))}",
        f"publication_names {quote_literal(','.join(quote_ident(p) for p in publications))}",
    ]
    if proto_version >= 2 and streaming != "off":
        mode = "parallel" if streaming == "parallel" and proto_version >= 4 else "on"
        options.append(f"streaming {quote_literal(mode)}")
    if proto_version >= 2:  # messages and binary exist from PostgreSQL 14 (protocol 2) on
        options.append(f"messages {quote_literal('true' if messages else 'false')}")
        if binary:
            options.append("binary 'true'")
    lsn = f"{start_lsn >> 32:X}/{start_lsn & 0xFFFFFFFF:X}"
    return f"START_REPLICATION SLOT {quote_ident(slot)} LOGICAL {lsn} ({', '.join(options)})"
