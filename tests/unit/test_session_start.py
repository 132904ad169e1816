"""A session's start, up to the snapshot plan, with a fake walsender and sink: the plan of a slot created now is
saved before anything else can fail, so a restart resumes it; a plan that cannot be saved drops the slot."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cdcd.config import Settings, load_settings
from cdcd.filters.plan import FilterPlan
from cdcd.ledger import Ledger
from cdcd.replication import loop
from cdcd.replication.start import slot_request
from cdcd.snapshot.runner import start_state
from cdcd.snapshot.state import StateError, StateStore
from cdcd.source.catalog import Captured
from cdcd.source.walsender import SessionInfo


class FakeWalsender:
    """A slot created now (``created``) or found, publishing ``public.t``."""

    created = True
    dropped = 0

    def __init__(self, settings: Any, push_down: Any, **kwargs: Any) -> None:
        self.settings = settings

    def __enter__(self) -> FakeWalsender:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def open(self, **kwargs: Any) -> SessionInfo:
        point, snapshot = (0x1000, "snap-1") if self.created else (None, None)
        return SessionInfo(1, "db", 170000, 4, "utf-8", self.created, "off", FilterPlan([]), "sys", point, snapshot)

    def captured(self) -> Captured:
        return Captured({"public.t": 16400}, {})

    def drop_slot(self) -> None:
        FakeWalsender.dropped += 1


class KafkaAway:
    """An exactly-once sink waiting for Kafka in ``committed`` until cdcd is stopped (SIGTERM)."""

    transactional = True

    def __init__(self, stop: Any) -> None:
        self.stop = stop
        self.asked: list[bool] = []  # slot_created, as each session asked

    def committed(self, slot: str, system_id: str, slot_created: bool, keep_alive: Callable[[], None]) -> None:
        self.asked.append(slot_created)
        self.stop.set()
        keep_alive()

    def end_session(self, ledger: Ledger) -> None: ...
    def flush(self, timeout: float) -> bool:
        return True

    def poll(self) -> None: ...


def _settings(tmp_path: Path) -> Settings:
    path = tmp_path / "cdcd.yaml"
    path.write_text(f"source: {{dsn: 'host=x', slot: s1}}\nsnapshot: {{state_dir: '{tmp_path / 'state'}'}}\n")
    return load_settings(path)


def _run(settings: Settings, created: bool, monkeypatch: pytest.MonkeyPatch) -> KafkaAway:
    monkeypatch.setattr(loop, "Walsender", FakeWalsender)
    monkeypatch.setattr(FakeWalsender, "created", created)
    replication = loop.ReplicationLoop(settings, None)  # type: ignore[arg-type]
    sink = replication.sink = KafkaAway(replication.stop)  # type: ignore[assignment]
    replication.run()
    return sink


def test_the_plan_of_a_slot_created_now_is_saved_before_kafka_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44 (5): the first run created the slot, waited for Kafka and was stopped; the restart found the slot
    without state, snapshotted nothing and streamed: the table's existing rows never reached Kafka."""
    settings = _settings(tmp_path)
    first = _run(settings, True, monkeypatch)
    assert first.asked == [True]
    store = StateStore(settings.snapshot.state_dir, "s1")
    plan = store.load()
    assert plan is not None
    assert (plan.initial, plan.consistent_point, plan.fresh_slot) == ("running", 0x1000, True)
    assert [(p.table, p.kind) for p in plan.queue] == [("public.t", "initial")]
    assert slot_request("initial", plan, store.path).must_exist is None  # a slot dropped since is made anew
    again = _run(settings, False, monkeypatch)
    assert again.asked == [True]  # nothing was written from the slot: a progress record is an older slot's
    resumed = start_state(store.load(), "s1", "initial", None, ["public.t"])
    assert [(p.table, p.kind, p.resumed_initial) for p in resumed.queue] == [("public.t", "incremental", True)]
    assert not resumed.fresh_slot


def test_a_slot_whose_plan_cannot_be_saved_is_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(store: StateStore, state: object) -> None:
        raise StateError(f"cannot write snapshot state {store.path}: No space left on device")

    monkeypatch.setattr(StateStore, "save", full)
    settings = _settings(tmp_path)
    FakeWalsender.dropped = 0
    with pytest.raises(StateError, match="cannot write"):
        _run(settings, True, monkeypatch)
    assert FakeWalsender.dropped == 1


def test_a_state_file_from_before_fresh_slot_loads(tmp_path: Path) -> None:
    store = StateStore(tmp_path, "s1")
    store.path.write_text('{"slot": "s1", "initial": "done", "queue": [{"table": "public.t", "kind": "incremental"}]}')
    loaded = store.load()
    assert loaded is not None
    assert not loaded.fresh_slot
    assert slot_request("initial", loaded, store.path).must_exist is not None
