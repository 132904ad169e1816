"""How a replication session starts: which slot to open and how, where to resume, what to snapshot, and whether
the server was promoted since the last session. Decisions; the I/O is the walsender's, passed in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog

from cdcd.lsn import format_lsn
from cdcd.sink import Committed
from cdcd.snapshot.state import SnapshotState, StateError, StateStore
from cdcd.source.failover import FAILOVER_VERSION, PromotionError, SlotSync, check_promotion, switch_point
from cdcd.source.walsender import SessionInfo, SourceError

log = structlog.get_logger("cdcd.replication")


@dataclass(frozen=True)
class SlotRequest:
    """How to open the slot: export a snapshot (a new slot gets an initial snapshot), replace a lost slot, or
    require that it exists (``must_exist`` says why)."""

    export_snapshot: bool
    replace_lost: bool
    must_exist: str | None


def slot_request(mode: str, saved: SnapshotState | None, state_path: Path) -> SlotRequest:
    """``mode``: snapshot.mode; ``saved``: the snapshot state of an earlier run (None: none, or a temporary slot)."""
    must_exist = None
    if saved is not None and not saved.fresh_slot and mode != "when_needed":
        must_exist = f"{state_path} shows cdcd streamed from it"
    return SlotRequest(export_snapshot=mode != "never", replace_lost=mode == "when_needed", must_exist=must_exist)


def committed_snapshot(committed: Committed, saved: SnapshotState | None, store: StateStore) -> SnapshotState | None:
    """Exactly-once: the snapshot state committed with the data wins over the state file's own (which may be
    ahead of it: it is saved before the Kafka transaction commits). The progress record names it and the file
    keeps it (``StateStore.stage``); a version 1 record carried it whole. Without one, the file's own (a switch
    from at-least-once)."""
    snapshot, slot = committed.snapshot, store.slot
    if snapshot is None:
        return saved
    if "digest" in snapshot:
        snapshot = store.committed_state(snapshot)
    try:
        state = SnapshotState.from_json(dict(snapshot))
    except TypeError as exc:
        raise StateError(f"the progress topic's snapshot state has an unexpected layout: {exc}") from None
    if state.slot != slot:
        raise StateError(f"the progress topic's snapshot state belongs to slot {state.slot!r}, not {slot!r}")
    return state


def resumable(saved: SnapshotState | None, info: SessionInfo, slot: str) -> SnapshotState | None:
    """The saved state still applies, unless the slot was made anew (it was lost: its changes are gone)."""
    if saved is not None and info.slot_created:
        if not saved.fresh_slot:  # else nothing was read from it: the plan of a slot dropped before it was used
            log.error("the slot was lost or invalidated: changes it held are gone; snapshotting again", slot=slot)
        return None
    return saved


class Promotions(Protocol):
    """What the walsender tells about a promotion."""

    def timeline_history(self, timeline: int) -> str: ...
    def slot_sync(self) -> SlotSync | None: ...


def check_timeline(
    previous: int,
    info: SessionInfo,
    source: Promotions,
    published_lsn: int,
    flushed_lsn: int,
    *,
    standby_slot: bool = False,
) -> None:
    """After a promotion (``previous`` timeline -> ``info.timeline``), the slot must have been synced and hold
    nothing cdcd published beyond the new primary's history; a synced slot a little behind cdcd is normal:
    streaming starts at cdcd's position. ``standby_slot``: the last session read a slot cdcd made on this server
    while it was a standby (promoted since, or following a new primary): the same slot, not a copy, on any
    version; it decoded only WAL this server has (its walsender goes on across the promotion, onto the new
    timeline, and a standby cannot follow a history that forked before what it replayed), so there is no switch
    point to check. Raises SourceError otherwise."""
    if not previous or previous == info.timeline or info.slot_created:
        return
    if info.server_version < FAILOVER_VERSION and not standby_slot:
        return
    switch = None if standby_slot else switch_point(source.timeline_history(info.timeline), previous)
    try:
        lag = check_promotion(source.slot_sync(), published_lsn, flushed_lsn, switch, standby_slot)
    except PromotionError as exc:
        raise SourceError(f"after a failover (timeline {previous} -> {info.timeline}): {exc}") from None
    log.warning(
        "the server's timeline changed; going on from cdcd's own position"
        if info.standby
        else "the server was promoted; going on from cdcd's own position",
        previous_timeline=previous,
        timeline=info.timeline,
        slot=lag,
        start_lsn=format_lsn(flushed_lsn),
    )
