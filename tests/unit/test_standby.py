"""Capture from a hot standby: what would write to it is refused as a configuration error (exit 2, naming the
setting) before anything is written, unless ``source.primary_dsn`` takes it to the primary; after a promotion the
slot cdcd made on the standby is its own, not a synced copy."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import structlog
import yaml

from cdcd import cli, stopping
from cdcd.cli import EXIT_CONFIG
from cdcd.config import ConfigError, Settings, SourceSettings, load_settings
from cdcd.filters import FilterPlan
from cdcd.ledger import Positions
from cdcd.secrets import redact
from cdcd.snapshot import reader as reader_module
from cdcd.snapshot.state import SnapshotState, StateStore
from cdcd.source import walsender
from cdcd.source.failover import PromotionError, SlotSync, check_promotion, failover_wanted
from cdcd.source.standby import INCREMENTAL_NEEDS_PRIMARY, Writes, refusals
from cdcd.source.walsender import SessionInfo, SourceError
from tests.unit.test_failover import fresh_loop


class Standby:
    """A connection to a hot standby that answers whether it is one and fails the test on any other query: the
    refusal comes before cdcd reads or writes anything else."""

    def __init__(self, version: int = 170000) -> None:
        self.info = SimpleNamespace(server_version=version, parameter_status=lambda name: "UTF8")
        self.pgconn = SimpleNamespace(socket=-1)
        self.closed = False
        self.queries: list[str] = []

    def execute(self, query: Any, params: Any = None) -> Any:
        self.queries.append(str(query))
        assert str(query) == "SELECT pg_is_in_recovery()", f"unexpected query on the standby: {query}"
        return SimpleNamespace(fetchone=lambda: (True,))

    def close(self) -> None:
        self.closed = True


def source(**kw: object) -> SourceSettings:
    return SourceSettings.model_validate({"dsn": "host=standby", **kw})


@pytest.mark.parametrize(
    ("settings", "writes", "named"),
    [
        ({"manage_publications": True}, Writes(), "source.manage_publications is true"),
        ({}, Writes(action_query=True), "kafka.heartbeat.action_query writes: set source.primary_dsn"),
        ({}, Writes(signals=True), "signals.kafka.topic asks for incremental snapshots on a standby"),
        ({"failover": True}, Writes(), "source.failover is true"),
    ],
)
def test_what_would_write_to_a_standby_is_refused_naming_its_setting(
    settings: dict[str, Any], writes: Writes, named: str
) -> None:
    problems = refusals(source(**settings), 170000, writes)
    assert len(problems) == 1
    assert named in problems[0]


def test_with_a_primary_dsn_the_writes_go_to_the_primary() -> None:
    settings = source(manage_publications=True, primary_dsn="host=primary")
    assert refusals(settings, 160000, Writes(action_query=True, signals=True)) == []


def test_read_only_snapshots_take_signals_on_a_standby_without_a_primary() -> None:
    """snapshot.read_only's windows write nothing: a signal topic asks nothing of the standby it cannot do."""
    signals = {"kafka": {"topic": "cdcd-signals"}}
    writing = Settings.model_validate({"source": {"dsn": "host=standby"}, "signals": signals})
    reading = Settings.model_validate(
        {"source": {"dsn": "host=standby"}, "signals": signals, "snapshot": {"read_only": True}}
    )
    assert Writes.of(writing) == Writes(signals=True)
    assert Writes.of(reading) == Writes()
    assert refusals(reading.source, 170000, Writes.of(reading)) == []


def test_a_standby_before_16_cannot_decode() -> None:
    (problem,) = refusals(source(primary_dsn="host=primary"), 150007, Writes())
    assert "needs PostgreSQL 16 or later, the server is 15" in problem


def test_a_slot_on_a_standby_is_never_a_failover_slot() -> None:
    assert failover_wanted(source(), 170000, standby=True) is False
    assert failover_wanted(source(), 170000) is True


def test_primary_dsn_password_is_masked_and_a_bad_one_named(tmp_path: Path) -> None:
    source(primary_dsn="host=primary password=Pr1maryS3cret")
    assert "Pr1maryS3cret" not in redact("connecting with Pr1maryS3cret")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"source": {"dsn": "host=x", "primary_dsn": "host=x port"}}))
    with pytest.raises(ConfigError, match=r"source\.primary_dsn: Value error, not a valid connection string"):
        load_settings(path)


def run_config(tmp_path: Path, source: dict[str, Any], **sections: Any) -> Path:
    config = {
        "source": {"dsn": "host=127.0.0.1 port=9", "publications": [{"name": "p"}], **source},
        "snapshot": {"state_dir": str(tmp_path / "state")},
        "buffer": {"spill_dir": str(tmp_path / "spill")},
        "sink": {"kind": "jsonl", "path": str(tmp_path / "out.jsonl")},
        "metrics": {"listen": ""},
        "log": {"format": "json"},
        **sections,
    }
    path = tmp_path / "cdcd.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(
    ("source_keys", "sections", "named"),
    [
        ({"manage_publications": True}, {}, "source.manage_publications"),
        ({}, {"kafka": {"heartbeat": {"interval_s": 1, "action_query": "UPDATE hb SET at = now()"}}}, "action_query"),
    ],
)
def test_cdcd_run_on_a_standby_refuses_before_writing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    source_keys: dict[str, Any],
    sections: dict[str, Any],
    named: str,
) -> None:
    """`cdcd run`'s streaming, in process (without its process-wide settings: signals, gc, log output)."""
    made: list[Standby] = []

    def connect(*args: object, **kwargs: object) -> Standby:
        made.append(Standby())
        return made[-1]

    monkeypatch.setattr(walsender, "connect", connect)
    monkeypatch.setattr(stopping, "catch", lambda: None)
    monkeypatch.setattr(cli, "_tune_gc", lambda: None)
    settings = load_settings(run_config(tmp_path, source_keys, **sections))
    with structlog.testing.capture_logs() as logs:
        code = cli._stream(settings, str(tmp_path / "out.jsonl"), serve_metrics=False)
    assert code == EXIT_CONFIG
    (error,) = [line["error"] for line in logs if line["event"] == "configuration does not fit the source database"]
    assert error.startswith("source.dsn is a hot standby, which takes no writes:")
    assert named in error
    assert all(c.closed for c in made)
    assert [q for c in made for q in c.queries] == ["SELECT pg_is_in_recovery()"]


def test_cdcd_snapshot_on_a_standby_needs_the_primary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(reader_module, "connect", lambda *args, **kwargs: Standby())
    settings = load_settings(run_config(tmp_path, {}))
    settings.snapshot.request_key(create=True)  # as `cdcd run` made it
    code = cli._request_snapshot(settings, "public.t", None)
    assert code == EXIT_CONFIG
    assert INCREMENTAL_NEEDS_PRIMARY in capsys.readouterr().err


def test_an_incremental_chunk_on_a_standby_without_primary_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    standby = Standby()
    monkeypatch.setattr(reader_module, "connect", lambda *args, **kwargs: standby)
    reader = reader_module.SnapshotReader("host=standby", None, "cdcd", standby=True)
    with pytest.raises(
        ConfigError,
        match=r"incremental snapshots on a standby need snapshot\.read_only: true .* or source\.primary_dsn",
    ):
        reader.chunk("public.t", None, None, 10, "mark")
    assert standby.queries == []  # no watermark was written there


def test_the_slot_made_on_a_promoted_standby_is_cdcds_own() -> None:
    own = SlotSync(failover=False, synced=False, confirmed_flush_lsn=0x1000)
    lag = check_promotion(own, published_lsn=0x1800, flushed_lsn=0x1800, switch=0x2000, standby_slot=True)
    assert lag == "cdcd's own slot (made on the standby) at 0/1000, 2048 bytes behind cdcd's position"
    with pytest.raises(PromotionError, match="was not synchronized"):
        check_promotion(own, published_lsn=0x1800, flushed_lsn=0x1800, switch=0x2000)
    with pytest.raises(PromotionError, match="no longer exists"):
        check_promotion(None, published_lsn=0x1800, flushed_lsn=0x1800, switch=0x2000, standby_slot=True)


class PromotedStandby:
    """The walsender's answers on a standby promoted at 0/5000000 (timeline 1 -> 2): its own slot, not synced."""

    def timeline_history(self, timeline: int) -> str:
        return "1\t0/5000000\tend of WAL\n"

    def slot_sync(self) -> SlotSync | None:
        return SlotSync(failover=False, synced=False, confirmed_flush_lsn=0x4000000)


@pytest.mark.parametrize("version", [160000, 170000])
def test_a_process_started_after_the_standby_was_promoted_goes_on(tmp_path: Path, version: int) -> None:
    """The state file says the last session read a standby: after its promotion the unsynced slot is cdcd's own
    (on 16 too, which has no failover slots); had the server been a primary, the same slot stops cdcd."""
    promoted = SessionInfo(2, "db", version, 4, "utf-8", False, "on", FilterPlan([]))
    store = StateStore(tmp_path, "cdcd")
    store.save(SnapshotState("cdcd"))
    # its walsender went on across the promotion: cdcd published WAL of the new timeline, past the switch point
    store.save_positions(Positions(timeline=1, published_lsn=0x5000100, standby=True))
    store = StateStore(tmp_path, "cdcd")
    store.load()
    assert store.positions.standby
    loop = fresh_loop(tmp_path)
    loop._check_timeline(promoted, PromotedStandby(), store)  # type: ignore[arg-type]
    assert loop.ledger.timeline == 2
    assert loop._standby is False  # saved as such from now on: a later failover follows the usual rules
    if version < 170000:
        return  # no failover slots: nothing to check without a standby's slot
    store.save_positions(Positions(timeline=1, published_lsn=0x4FFFF00, standby=False))  # before the switch
    store.load()
    with pytest.raises(SourceError, match="was not synchronized"):
        fresh_loop(tmp_path)._check_timeline(promoted, PromotedStandby(), store)  # type: ignore[arg-type]


class Promoted(Standby):
    """The standby's connection once it was promoted."""

    def execute(self, query: Any, params: Any = None) -> Any:
        self.queries.append(str(query))
        return SimpleNamespace(fetchone=lambda: (False,))


class Unreachable:
    def execute(self, what: str, query: str) -> None:
        raise AssertionError(f"{what} was sent to the old primary")


def test_after_a_promotion_mid_stream_nothing_goes_to_the_old_primary() -> None:
    """The walsender goes on across the promotion: the next write ends the session instead, and the next one
    writes to the promoted server itself."""
    sender = walsender.Walsender(source(primary_dsn="host=primary"), primary=Unreachable())  # type: ignore[arg-type]
    sender.standby, sender._admin = True, Promoted()  # type: ignore[assignment]
    with pytest.raises(walsender.SourceDisconnected, match="the standby was promoted"):
        sender.run_action("UPDATE hb SET at = now()")
