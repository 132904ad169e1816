"""Failover slots (PostgreSQL 17+): whether the slot is failover-ready, and what a promotion left cdcd.

A logical slot created with FAILOVER is copied to physical standbys that run with ``sync_replication_slots``;
``synchronized_standby_slots`` on the primary holds logical walsenders back until those standbys have the WAL,
so nothing cdcd publishes can be missing from a promoted standby. After a promotion (the timeline changed
between two sessions) the synced slot is usually a little behind what cdcd confirmed: cdcd goes on from its
own position. A slot that was not synced, or WAL cdcd published past the point where the new primary's
history left the old timeline, stops cdcd: going on would silently skip or invent changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from cdcd.config import ConfigError, SourceSettings
from cdcd.lsn import format_lsn, parse_lsn

FAILOVER_VERSION = 170000
NOT_AVAILABLE = "failover slots are not available before PostgreSQL 17 (server {}): after a failover the slot is lost"


class PromotionError(RuntimeError):
    """The server cdcd reconnected to after a promotion cannot go on from cdcd's position."""


def failover_wanted(settings: SourceSettings, server_version: int, standby: bool = False) -> bool:
    """Whether the slot should have FAILOVER: ``source.failover``, by default on where the server has it; never on
    a ``standby`` (PostgreSQL refuses it there; ``cdcd.source.standby`` refuses ``source.failover: true`` on one)."""
    if settings.failover and server_version < FAILOVER_VERSION:
        raise ConfigError(
            f"source.failover is true but the server is PostgreSQL {server_version // 10000}: failover slots"
            " need PostgreSQL 17 or later (set source.failover: false)"
        )
    if settings.temporary_slot or standby:
        return False  # PostgreSQL refuses FAILOVER for temporary slots; nothing resumes from them anyway
    return server_version >= FAILOVER_VERSION if settings.failover is None else settings.failover


@dataclass(frozen=True)
class SlotSync:
    failover: bool
    synced: bool  # copied from a primary by a standby's slot sync (stays true after promotion)
    confirmed_flush_lsn: int


def read_slot_sync(conn: psycopg.Connection[Any], slot: str) -> SlotSync | None:
    """The slot's failover state (before PostgreSQL 17: neither failover nor synced), None when it does not
    exist."""
    state = "failover, synced" if conn.info.server_version >= FAILOVER_VERSION else "false, false"
    row = conn.execute(
        f"SELECT {state}, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", [slot]
    ).fetchone()
    if row is None:
        return None
    return SlotSync(bool(row[0]), bool(row[1]), parse_lsn(row[2]) if row[2] else 0)


def switch_point(history: str, timeline: int) -> int | None:
    """Where ``timeline`` ended, from a timeline history file (``<tli>\\t<lsn>\\t<reason>`` lines)."""
    for line in history.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0].isdigit() and int(fields[0]) == timeline:
            return parse_lsn(fields[1])
    return None


def check_promotion(
    slot: SlotSync | None, published_lsn: int, flushed_lsn: int, switch: int | None, standby_slot: bool = False
) -> str:
    """After a promotion: a description of how far the synced slot lags cdcd, or PromotionError. ``standby_slot``:
    cdcd made and read the slot on this very server while it was a standby (``source.dsn`` named the standby), so
    the slot is cdcd's own, not a copy: it need not be synced."""
    if slot is None:
        if standby_slot:
            raise PromotionError("the slot cdcd read on this server while it was a standby no longer exists")
        raise PromotionError("the slot does not exist on the promoted server: it was not synchronized to it")
    if not slot.synced and not standby_slot:
        raise PromotionError(
            "the slot on the promoted server was not synchronized from the old primary (synced is false): its"
            " position is not cdcd's. Create the slot with failover (source.failover) and run the standby with"
            " sync_replication_slots = on"
        )
    if switch is not None and published_lsn > switch:
        raise PromotionError(
            f"cdcd published changes up to {format_lsn(published_lsn)} but the promoted server's history left the"
            f" old timeline at {format_lsn(switch)}: changes after that were published and are not on the new"
            " primary. Set synchronized_standby_slots on the primary so this cannot happen"
        )
    behind = max(0, flushed_lsn - slot.confirmed_flush_lsn)
    kind = "cdcd's own slot (made on the standby)" if standby_slot and not slot.synced else "synced slot"
    return f"{kind} at {format_lsn(slot.confirmed_flush_lsn)}, {behind} bytes behind cdcd's position"


def readiness(conn: psycopg.Connection[Any], settings: SourceSettings) -> list[str]:
    """Warnings for ``cdcd check``: what keeps the slot from surviving a failover (none when it is ready)."""
    version = conn.info.server_version
    wanted = failover_wanted(settings, version)  # ConfigError: asked for where the server has none
    if version < FAILOVER_VERSION:
        return [NOT_AVAILABLE.format(version // 10000)]
    if not wanted:
        return ["source.failover is false: the slot is not synchronized to standbys and a failover loses it"]
    warnings = []
    slot = read_slot_sync(conn, settings.slot)
    if slot is not None and not slot.failover:
        warnings.append(f"slot {settings.slot!r} was created without failover (cdcd enables it when it starts)")
    names = _setting(conn, "synchronized_standby_slots")
    if not names:
        warnings.append(
            "synchronized_standby_slots is empty: cdcd may publish changes a standby does not have yet, and"
            " after a failover to it those changes are published but lost"
        )
    elif not _one(conn, _STANDBYS, [[n.strip() for n in names.split(",") if n.strip()]]):
        warnings.append(
            "no standby named in synchronized_standby_slots is streaming (pg_stat_replication): no server is"
            " ready to take over the slot"
        )
    if not _one(conn, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE '%%slotsync worker'"):
        warnings.append("no standby's slot sync worker is connected: is sync_replication_slots on on the standby?")
    return warnings


_STANDBYS = (
    "SELECT count(*) FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid"
    " WHERE s.slot_type = 'physical' AND s.slot_name = ANY(%s) AND r.state = 'streaming'"
)


def _setting(conn: psycopg.Connection[Any], name: str) -> str:
    return str(_one(conn, "SELECT current_setting(%s, true)", [name]) or "")


def _one(conn: psycopg.Connection[Any], query: str, params: list[Any] | None = None) -> Any:
    row = conn.execute(query, params).fetchone()
    return row[0] if row else None
