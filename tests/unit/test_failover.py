"""Failover slots: the setting's default per server version, timeline history parsing, and the decision after
a promotion (go on from cdcd's position, or stop when the slot was not synced or published WAL is gone)."""

from __future__ import annotations

import pytest

from cdcd.config import ConfigError, SourceSettings
from cdcd.source.failover import PromotionError, SlotSync, check_promotion, failover_wanted, switch_point


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
