"""Failover slots: the setting's default per server version, timeline history parsing, and the decision after
a promotion (go on from cdcd's position, or stop when the slot was not synced or published WAL is gone)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cdcd.config import ConfigError, Settings, SourceSettings
from cdcd.filters import FilterPlan
from cdcd.ledger import Positions
from cdcd.replication.loop import ReplicationLoop
from cdcd.sink.jsonl import JsonLinesSink
from cdcd.snapshot.state import SnapshotState, StateStore
from cdcd.source.failover import PromotionError, SlotSync, check_promotion, failover_wanted, switch_point
from cdcd.source.walsender import SessionInfo, SourceError


def source(**kw: object) -> SourceSettings:
    return SourceSettings.model_validate({"dsn": "host=x", **kw})


@pytest.mark.parametrize(
    ("setting", "version", "wanted"),
    [(None, 170000, True), (None, 180000, True), (None, 160000, False), (False, 170000, False), (True, 170004, True)],
)
def test_failover_defaults_to_on_where_the_server_has_it(setting: bool | None, version: int, wanted: bool) -> None:
    assert failover_wanted(source(failover=setting), version) is wanted


def test_failover_asked_for_on_an_older_server_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"source\.failover is true but the server is PostgreSQL 16"):
        failover_wanted(source(failover=True), 160002)


def test_temporary_slots_are_never_failover_slots() -> None:
    assert failover_wanted(source(temporary_slot=True), 170000) is False


def test_switch_point_of_a_timeline() -> None:
    history = "1\t0/5000060\tno recovery target specified\n\n2\t0/7A0B1C8\tno recovery target specified\n"
    assert switch_point(history, 1) == 0x5000060
    assert switch_point(history, 2) == 0x7A0B1C8
    assert switch_point(history, 3) is None


def test_a_synced_slot_behind_cdcd_is_expected() -> None:
    slot = SlotSync(failover=True, synced=True, confirmed_flush_lsn=0x1000)
    assert check_promotion(slot, published_lsn=0x1800, flushed_lsn=0x1800, switch=0x2000) == (
        "synced slot at 0/1000, 2048 bytes behind cdcd's position"
    )


@pytest.mark.parametrize(
    ("slot", "published", "message"),
    [
        (None, 0x10, "does not exist on the promoted server"),
        (SlotSync(True, False, 0x10), 0x10, "was not synchronized from the old primary"),
        (SlotSync(True, True, 0x10), 0x2001, "published changes up to 0/2001 but .* left the old timeline at 0/2000"),
    ],
)
def test_promotion_problems_stop_cdcd(slot: SlotSync | None, published: int, message: str) -> None:
    with pytest.raises(PromotionError, match=message):
        check_promotion(slot, published_lsn=published, flushed_lsn=0x10, switch=0x2000)


class Promoted:
    """The walsender's answers on a server promoted at 0/5000000 (timeline 1 -> 2), its slot synced."""

    def timeline_history(self, timeline: int) -> str:
        return "1\t0/5000000\tno recovery target specified\n"

    def slot_sync(self) -> SlotSync | None:
        return SlotSync(failover=True, synced=True, confirmed_flush_lsn=0x4000000)


def info(timeline: int) -> SessionInfo:
    return SessionInfo(timeline, "db", 170000, 4, "utf-8", False, "on", FilterPlan([]))


def fresh_loop(tmp_path: Path) -> ReplicationLoop:
    settings = Settings(
        source={"dsn": "host=127.0.0.1 port=9", "publications": [{"name": "p"}]},
        snapshot={"state_dir": tmp_path},
        buffer={"spill_dir": tmp_path / "spill"},
    )
    with open(os.devnull, "wb") as out:
        return ReplicationLoop(settings, JsonLinesSink(out))


def test_a_process_started_after_a_promotion_checks_it_from_the_state_file(tmp_path: Path) -> None:
    """The timeline and what was published survive a restart (in the state file): a cdcd that starts after the
    promotion, not only one that reconnects to it, finds published changes the new primary does not have."""
    before = StateStore(tmp_path, "cdcd")
    before.save(SnapshotState("cdcd"))
    before.save_positions(Positions(timeline=1, published_lsn=0x5000100))  # past the switch point
    store = StateStore(tmp_path, "cdcd")
    store.load()
    with pytest.raises(SourceError, match=r"after a failover \(timeline 1 -> 2\).*published changes up to 0/5000100"):
        fresh_loop(tmp_path)._check_timeline(info(2), Promoted(), store)  # type: ignore[arg-type]
    store.save_positions(Positions(timeline=1, published_lsn=0x4FFFF00))  # before it: goes on
    store.load()
    loop = fresh_loop(tmp_path)
    loop._check_timeline(info(2), Promoted(), store)  # type: ignore[arg-type]
    assert loop.ledger.timeline == 2
