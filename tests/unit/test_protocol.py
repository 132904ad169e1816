"""Replication protocol framing and command building."""

from __future__ import annotations

import struct

import pytest

from cdcd.lsn import format_lsn, parse_lsn, pg_to_unix_us
from cdcd.pgoutput import DecodeError
from cdcd.source.protocol import (
    parse_keepalive,
    parse_xlogdata_header,
    protocol_version_for,
    standby_status_update,
    start_replication_command,
)


def test_keepalive_round_trip() -> None:
    frame = b"k" + struct.pack(">Qq?", 0x1_0000_0010, 12345, True)
    keepalive = parse_keepalive(frame)
    assert (keepalive.wal_end, keepalive.send_time, keepalive.reply_requested) == (0x1_0000_0010, 12345, True)
    with pytest.raises(DecodeError, match="keepalive"):
        parse_keepalive(frame[:-1])


def test_xlogdata_header() -> None:
    frame = b"w" + struct.pack(">QQq", 10, 20, 30) + b"B..."
    assert parse_xlogdata_header(frame) == (10, 20)
    with pytest.raises(DecodeError, match="XLogData"):
        parse_xlogdata_header(frame[:20])


def test_standby_status_update_layout() -> None:
    frame = standby_status_update(1, 2, 3, 4, reply=True)
    assert frame == b"r" + struct.pack(">QQQq?", 1, 2, 3, 4, True)


@pytest.mark.parametrize(
    ("version", "proto"), [(120000, 1), (130010, 1), (140015, 2), (150008, 3), (160004, 4), (180001, 4)]
)
def test_protocol_version_for_server(version: int, proto: int) -> None:
    assert protocol_version_for(version) == proto


def test_start_replication_command_by_protocol() -> None:
    v1 = start_replication_command("s", 0, 1, ["p"], streaming="on", messages=True, binary=True)
    assert v1 == "START_REPLICATION SLOT \"s\" LOGICAL 0/0 (proto_version '1', publication_names '\"p\"')"
    v4 = start_replication_command(
        "s", 0x1_0000_00FF, 4, ["a", 'we"ird'], streaming="parallel", messages=True, binary=False
    )
    assert v4 == (
        "START_REPLICATION SLOT \"s\" LOGICAL 1/FF (proto_version '4', "
        "publication_names '\"a\",\"we\"\"ird\"', streaming 'parallel', messages 'true')"
    )
    v2 = start_replication_command("s", 0, 2, ["p"], streaming="parallel", messages=False, binary=True)
    assert "streaming 'on'" in v2
    assert "messages 'false'" in v2
    assert "binary 'true'" in v2


def test_lsn_format_and_parse() -> None:
    assert format_lsn(0x16B3748) == "0/16B3748"
    assert parse_lsn("1/FF") == 0x1_0000_00FF
    for bad in ("", "16B3748", "x/1", "1/100000000"):
        with pytest.raises(ValueError, match="LSN"):
            parse_lsn(bad)
    assert pg_to_unix_us(0) == 946_684_800_000_000
