"""Input from outside the configuration: snapshot requests in the WAL (any database role can write one), signal
records, and the JSON, patterns and conditions they carry. None of it runs as SQL, asks for a snapshot without the
request key, or raises out of the snapshotter; each call is cheap whatever it is given."""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcd.pgoutput.messages import LogicalMessage
from cdcd.snapshot import control, signals, untrusted
from cdcd.snapshot.runner import Snapshotter
from cdcd.snapshot.signals import ExecuteSnapshot, Ignored
from cdcd.snapshot.state import SnapshotState, TableProgress
from cdcd.snapshot.untrusted import Rejected
from tests.unit.test_signals import NAME, FakeReader, _record, _run, _snapshotter

KEY = b"k" * 32
CAPTURED = ["public.a"]
HOSTILE_CONDITIONS = [
    "true)) ORDER BY 1; DROP TABLE s.victim; --",
    "true) OR (true",
    "1=1; DROP TABLE x",
    "id IN (SELECT id FROM public.secret)",
    "EXISTS (SELECT 1)",
    "pg_sleep(10) IS NULL",
    "current_setting('is_superuser') = 'on'",
    "v = (SELECT string_agg(v, ',') FROM public.a)",
]


# -- bounded JSON ---------------------------------------------------------------------------------------


def test_deep_nesting_is_refused_before_parsing() -> None:
    refused = untrusted.json_object("[" * 50_000, "content")
    assert isinstance(refused, Rejected)
    assert refused.reason == "too_deep"
    assert isinstance(control.decode(b"[" * 100_000), Rejected)  # the message: too large first


def test_a_large_document_is_refused() -> None:
    refused = untrusted.json_object(b'{"a": "' + b"x" * untrusted.MAX_DOCUMENT_BYTES + b'"}', "value")
    assert isinstance(refused, Rejected)
    assert refused.reason == "too_large"


def test_brackets_inside_strings_are_not_nesting() -> None:
    text = json.dumps({"a": "[" * 100, "b": '\\"[{'})
    assert untrusted.json_object(text, "value") == json.loads(text)


# -- patterns ---------------------------------------------------------------------------------------------


def test_a_backtracking_pattern_matches_in_linear_time() -> None:
    """Python's re takes tens of seconds (doubling per character) for this pattern on a 29-character name."""
    start = time.thread_time()
    assert not signals.matches("(.|.)*Z", "a" * 29)
    assert not signals.matches("(a+)+$", "a" * 5000 + "!")
    assert time.thread_time() - start < 1.0


@pytest.mark.parametrize("pattern", ["a{9999999999}", "a{1001}", "(?=public).*", "(a)\\1", "x" * 10_000, "[", ""])
def test_a_pattern_cdcd_cannot_read_names_only_itself_and_never_raises(pattern: str) -> None:
    assert not signals.matches(pattern, "public.a")
    assert signals.matches(pattern, pattern)
    parsed = signals.parse(NAME.encode(), _execute([pattern]), NAME, "d")
    assert isinstance(parsed, Ignored | ExecuteSnapshot)


def test_an_overlong_or_invalid_pattern_refuses_the_signal() -> None:
    for pattern in ["x" * 10_000, "(?=public).*"]:
        parsed = signals.parse(NAME.encode(), _execute([pattern]), NAME, "d")
        assert isinstance(parsed, Ignored)
        assert parsed.label == "pattern"
        assert parsed.id == "sig"


# -- conditions -------------------------------------------------------------------------------------------


def _execute(collections: list[str], condition: str | None = None) -> bytes:
    data: dict[str, Any] = {"data-collections": collections}
    if condition is not None:
        data["additional-conditions"] = [{"data-collection": collections[0], "filter": condition}]
    return json.dumps({"id": "sig", "type": "execute-snapshot", "data": data}).encode()


@pytest.mark.parametrize("condition", HOSTILE_CONDITIONS)
def test_a_signal_condition_outside_the_filter_grammar_is_refused(condition: str) -> None:
    parsed = signals.parse(NAME.encode(), _execute(["public.a"], condition), NAME, "d")
    assert isinstance(parsed, Ignored)
    assert parsed.label == "condition"
    assert parsed.id == "sig"


def test_a_signal_condition_reaches_the_server_as_cdcd_renders_it() -> None:
    parsed = signals.parse(NAME.encode(), _execute(["public.a"], "ID>10 and v = 'it''s'"), NAME, "d")
    assert parsed == ExecuteSnapshot("sig", ("public.a",), (("public.a", "id > 10 AND v = 'it''s'"),))


def test_a_refused_signal_is_counted_and_told_aborted(tmp_path: Path) -> None:
    snapshotter = _snapshotter(tmp_path, FakeReader({"public.a": 5}))
    snapshotter.signal(_record(0, _execute(["public.a"], "true) OR (true")), NAME, CAPTURED)
    assert snapshotter.state.queue == []
    assert snapshotter.state.signal_offsets == {"0": 1}
    assert snapshotter.rejections.counts == {("signal", "condition"): 1}
    assert snapshotter.notices is not None
    assert [(n.id, n.type) for n in snapshotter.notices.take()] == [("sig", "ABORTED")]


def test_a_queued_condition_is_checked_against_the_table_when_read(tmp_path: Path) -> None:
    """Whatever queued it (a state file written by an older cdcd, too): a condition outside the grammar or naming
    no column of the table is never sent; its snapshot leaves the queue, ABORTED, and the others go on."""
    reader = FakeReader({"public.a": 5})
    state = SnapshotState("slot")
    state.queue = [
        TableProgress("public.a", "incremental", "true) OR (true", id="old"),
        TableProgress("public.a", "incremental", "nope > 1", id="nocolumn"),
        TableProgress("public.a", "incremental", "id >= 3", id="fine"),
    ]
    snapshotter = _snapshotter(tmp_path, reader, state)
    _run(snapshotter)
    assert reader.conditions == ["(id >= 3)"]
    assert snapshotter.state.queue == []
    assert snapshotter.rejections.counts == {("snapshot", "condition"): 2}
    assert snapshotter.notices is not None
    aborted = [n.id for n in snapshotter.notices.take() if n.type == "ABORTED"]
    assert aborted == ["old", "nocolumn"]


# -- snapshot requests in the WAL -------------------------------------------------------------------------


def _request(content: dict[str, Any] | bytes) -> LogicalMessage:
    raw = content if isinstance(content, bytes) else json.dumps(content).encode()
    return LogicalMessage(True, 50, control.REQUEST_PREFIX, raw)


def _keyed(tmp_path: Path, key: bytes | None = KEY) -> Snapshotter:
    snapshotter = _snapshotter(tmp_path, FakeReader({"public.a": 5}))
    snapshotter.request_key = key
    return snapshotter


def test_a_request_signed_with_the_key_is_queued(tmp_path: Path) -> None:
    snapshotter = _keyed(tmp_path)
    body = {"slot": "slot", "table": "public.a", "where": "id > 2", "id": "r1"}
    snapshotter.request(_request(control.signed(body, KEY)), CAPTURED)
    assert [(p.table, p.where, p.id) for p in snapshotter.state.queue] == [("public.a", "id > 2", "r1")]
    assert snapshotter.rejections.counts == {}


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ({"slot": "slot", "table": "public.a", "where": "true) OR (true", "id": "x2"}, "unsigned"),
        (control.signed({"slot": "slot", "table": "public.a", "where": None, "id": "x"}, b"z" * 32), "bad_signature"),
        (
            {**control.signed({"slot": "slot", "table": "public.a", "where": None, "id": "x"}, KEY), "id": "y"},
            "bad_signature",
        ),
        (control.signed({"slot": "slot", "table": "public.a", "where": "true) OR (true", "id": "x"}, KEY), "condition"),
        (control.signed({"slot": "slot", "table": "public.b", "where": None, "id": "x"}, KEY), "not_captured"),
        (control.signed({"slot": "slot", "table": ["public.a"], "where": None, "id": "x"}, KEY), "not_captured"),
        (control.signed({"slot": "slot", "table": "public.a", "where": 1, "id": "x"}, KEY), "invalid"),
        (b"[" * 50_000, "too_deep"),
        (b"[" * 100_000, "too_large"),
        (b"\xff\xfe", "not_json"),
    ],
)
def test_a_request_cdcd_cannot_act_on_is_counted_and_passed_by(
    tmp_path: Path, content: dict[str, Any] | bytes, reason: str
) -> None:
    snapshotter = _keyed(tmp_path)
    snapshotter.request(_request(content), CAPTURED)
    assert snapshotter.state.queue == []
    assert snapshotter.rejections.counts == {("wal", reason): 1}


def test_requests_for_another_slot_are_another_cdcds(tmp_path: Path) -> None:
    snapshotter = _keyed(tmp_path)
    snapshotter.request(_request({"slot": "other", "table": "public.a", "id": "x"}), CAPTURED)
    assert snapshotter.state.queue == []
    assert snapshotter.rejections.counts == {}


def test_with_requests_off_none_is_acted_on(tmp_path: Path) -> None:
    snapshotter = _keyed(tmp_path, None)
    body = {"slot": "slot", "table": "public.a", "where": None, "id": "r1"}
    snapshotter.request(_request(control.signed(body, KEY)), CAPTURED)
    assert snapshotter.state.queue == []
    assert snapshotter.rejections.counts == {("wal", "requests_off"): 1}


def test_a_defect_while_acting_on_a_signal_does_not_stop_the_stream(tmp_path: Path) -> None:
    snapshotter = _keyed(tmp_path)

    def broken(*args: object) -> None:
        raise KeyError("a defect")

    snapshotter._execute = broken  # type: ignore[method-assign,assignment]
    snapshotter.signal(_record(3, _execute(["public.a"])), NAME, CAPTURED)
    assert snapshotter.state.signal_offsets == {"0": 4}
    assert snapshotter.rejections.counts == {("signal", "internal"): 1}


# -- fuzz: nothing raises, nothing is slow ----------------------------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=20), inner, max_size=4),
    max_leaves=20,
)
_FIELDS = st.sampled_from(["public.a", "public.b", "(.|.)*Z", "a{9999999999}", "[", "", *HOSTILE_CONDITIONS])
_SIGNAL = st.fixed_dictionaries(
    {
        "id": st.text(max_size=10) | st.integers(),
        "type": st.sampled_from(["execute-snapshot", "stop-snapshot", "pause-snapshot", "resume-snapshot", "log"]),
        "data": st.fixed_dictionaries(
            {},
            optional={
                "data-collections": st.lists(_FIELDS, max_size=3) | _FIELDS,
                "additional-conditions": st.lists(
                    st.fixed_dictionaries({"data-collection": _FIELDS, "filter": _FIELDS | st.text(max_size=30)})
                    | _JSON,
                    max_size=3,
                ),
                "type": st.sampled_from(["incremental", "blocking"]) | _JSON,
                "message": _JSON,
            },
        )
        | _JSON,
    }
)
_REQUEST = st.fixed_dictionaries(
    {"slot": st.just("slot")},
    optional={"table": _FIELDS | _JSON, "where": _FIELDS | _JSON, "id": st.text(max_size=10) | _JSON},
)
_CONTENT = (
    st.binary(max_size=200)
    | _JSON.map(lambda v: json.dumps(v).encode())
    | st.integers(1, 200_000).map(lambda n: b"[" * n)
    | st.integers(1, 10_000).map(lambda n: b'{"a":' * n)
)


def _cheap(call: Any) -> None:
    """``call`` costs its thread under 0.1 s of CPU (a record that backtracks or recurses costs seconds); the
    collector stays out of the measure (a full collection of the property tests' garbage once took 0.5 s)."""
    gc.collect()
    gc.disable()
    try:
        start = time.thread_time()
        call()
        assert time.thread_time() - start < 0.1
    finally:
        gc.enable()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(record=_SIGNAL.map(lambda v: json.dumps(v).encode()) | _CONTENT, key=st.sampled_from([NAME.encode(), None]))
def test_any_signal_record_is_consumed_quickly(tmp_path: Path, record: bytes, key: bytes | None) -> None:
    snapshotter = _keyed(tmp_path)
    offset = len(snapshotter.state.signal_offsets)
    _cheap(lambda: snapshotter.signal(_record(offset, record, key or b"other"), NAME, CAPTURED))
    assert snapshotter.state.signal_offsets["0"] == offset + 1
    for item in snapshotter.state.queue:
        assert item.where is None or isinstance(untrusted.condition(item.where), str)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=_REQUEST.map(lambda v: json.dumps(v).encode()) | _CONTENT, sign=st.booleans())
def test_any_request_is_consumed_quickly(tmp_path: Path, content: bytes, sign: bool) -> None:
    snapshotter = _keyed(tmp_path)
    document = untrusted.json_object(content, "content")
    if sign and isinstance(document, dict):
        content = json.dumps(control.signed(document, KEY)).encode()
    _cheap(lambda: snapshotter.request(_request(content), CAPTURED))
    for item in snapshotter.state.queue:
        assert item.table in CAPTURED
        assert item.where is None or isinstance(untrusted.condition(item.where), str)
