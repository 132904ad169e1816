"""Logical decoding messages by prefix (Debezium's message.prefix.include.list / exclude.list): the matching, the
configuration's checks, the filter in the replication core on decoded messages, cdcd's own control messages
untouched whatever the lists say, and the count of what was left out."""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from cdcd.assembly import Assembler, BufferPool
from cdcd.config import ConfigError, MessagePrefixes, Settings, load_settings
from cdcd.filters.messages import MESSAGES, MessageFilter
from cdcd.ledger import Ledger
from cdcd.patterns import MAX_PATTERN, PatternError, Selection, whole
from cdcd.pgoutput import Decoder
from cdcd.pgoutput.messages import Begin, Commit, LogicalMessage, Message
from cdcd.replication import loop
from cdcd.replication.core import Event, Publish, ReplicationCore, SnapshotRequest, Watermark, Write
from cdcd.rowstage import STAGE
from cdcd.snapshot.control import REQUEST_PREFIX, WATERMARK_PREFIX
from tests.pgoutput_encoder import encode

# -- matching ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("include", "exclude", "prefix", "selected"),
    [
        ([r"app\..*"], [], "app.orders", True),
        ([r"app\..*"], [], "APP.Orders", True),  # ignoring case, as Debezium
        ([r"app\..*"], [], "apps.orders", False),  # the dot is escaped
        (["app"], [], "app.orders", False),  # the whole prefix, not a part of it
        (["app"], [], "my-app", False),
        (["a", "b.*"], [], "bee", True),
        ([], [r"audit\..*"], "audit.login", False),
        ([], [r"audit\..*"], "app.orders", True),  # only exclusions: every other prefix
        ([], [], "anything", True),
        (["café"], [], "CAFÉ", True),  # RE2 folds case beyond ASCII
    ],
)
def test_prefixes_are_matched_whole_ignoring_case(
    include: list[str], exclude: list[str], prefix: str, selected: bool
) -> None:
    assert Selection.of(include, exclude, ignore_case=True)(prefix) is selected
    assert MessagePrefixes(include=include, exclude=exclude).selection()(prefix) is selected


def test_a_backtracking_pattern_matches_a_long_prefix_in_linear_time() -> None:
    """Any database role chooses the prefix: a pattern must not take exponential time on it."""
    selection = Selection.of([], ["(a+)+$", "(.|.)*Z"], ignore_case=True)
    start = time.thread_time()
    assert selection("a" * 100_000 + "!")
    assert time.thread_time() - start < 1.0


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("(", "missing )"),
        ("(?=app).*", "invalid perl operator"),  # look-around: RE2 has none
        (r"(a)\1", "invalid escape"),  # back-references neither
        ("a{1001}", "invalid repetition size"),
        ("x" * (MAX_PATTERN + 1), f"at most {MAX_PATTERN}"),
    ],
)
def test_a_pattern_cdcd_cannot_match_in_linear_time_is_refused(pattern: str, reason: str) -> None:
    with pytest.raises(PatternError, match=re.escape(reason)):
        whole(pattern, ignore_case=True)


# -- configuration ----------------------------------------------------------------------------------------


def _settings(tmp_path: Path, prefixes: str) -> Settings:
    path = tmp_path / "cdcd.yaml"
    path.write_text(f"source:\n  dsn: host=x\n  message_prefixes: {prefixes}\n")
    return load_settings(path)


def _load(tmp_path: Path, prefixes: str) -> MessagePrefixes:
    return _settings(tmp_path, prefixes).source.message_prefixes


def test_the_default_publishes_every_prefix(tmp_path: Path) -> None:
    path = tmp_path / "cdcd.yaml"
    path.write_text("source: {dsn: host=x}\n")
    prefixes = load_settings(path).source.message_prefixes
    assert (prefixes.include, prefixes.exclude) == ([], [])
    assert prefixes.selection()("any.prefix")


def test_either_list_loads_from_the_file_or_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _load(tmp_path, r"{include: ['app\..*', 'billing']}").include == [r"app\..*", "billing"]
    monkeypatch.setenv("CDCD_SOURCE__MESSAGE_PREFIXES__EXCLUDE", '["audit\\\\..*"]')
    assert _load(tmp_path, "{}").exclude == [r"audit\..*"]


def test_include_and_exclude_together_are_refused_naming_both(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as error:
        _load(tmp_path, "{include: [app], exclude: [audit]}")
    message = str(error.value)
    assert "message_prefixes.include and message_prefixes.exclude are exclusive" in message
    assert "message.prefix.include.list and message.prefix.exclude.list" in message


@pytest.mark.parametrize(("key", "pattern"), [("include", "("), ("exclude", "(?<=x)y")])
def test_an_invalid_pattern_is_a_configuration_error_naming_its_key(tmp_path: Path, key: str, pattern: str) -> None:
    with pytest.raises(ConfigError) as error:
        _load(tmp_path, f"{{{key}: ['ok', '{pattern}']}}")
    assert f"source.message_prefixes.{key}: Value error, {pattern!r} is not a regular expression" in str(error.value)
    assert f"CDCD_SOURCE__MESSAGE_PREFIXES__{key.upper()}" in str(error.value)


def test_the_loop_counts_what_the_prefixes_leave_out_with_the_filtered_rows(tmp_path: Path) -> None:
    replication = loop.ReplicationLoop(_settings(tmp_path, "{exclude: [audit]}"), None)  # type: ignore[arg-type]
    assert replication.messages.publish
    assert not replication.messages.keeps("AUDIT")
    assert replication.state.filtered == {MESSAGES: 1}


# -- the replication core ---------------------------------------------------------------------------------


def _frames(*messages: tuple[int, Message]) -> list[bytes]:
    return [b"w" + struct.pack(">QQq", lsn, lsn, 0) + encode(m) for lsn, m in messages]


def _core(tmp_path: Path, messages: MessageFilter) -> ReplicationCore:
    return ReplicationCore(Decoder(stage=STAGE), Assembler(BufferPool(1 << 16, tmp_path)), Ledger(), messages=messages)


def _events(core: ReplicationCore, frames: Iterable[bytes]) -> list[Event]:
    return [e for e in map(core.frame, frames) if e is not None]


def _published(events: list[Event]) -> list[tuple[bool, str]]:
    """(transactional, prefix) of the messages that go to the message topic, in order."""
    out = []
    for event in events:
        if isinstance(event, Publish):
            out.append((False, event.message.prefix))
        elif isinstance(event, Write):
            out.extend((True, c.prefix) for c in event.changes if isinstance(c, LogicalMessage))
    return out


def _user_messages() -> list[bytes]:
    return _frames(
        (0x10, LogicalMessage(False, 0x10, "app.orders", b"a")),
        (0x20, LogicalMessage(False, 0x20, "audit.login", b"b")),
        (0x100, Begin(0x200, 0, 7)),
        (0x110, LogicalMessage(True, 0x110, "audit.login", b"c", None)),
        (0x120, LogicalMessage(True, 0x120, "APP.invoices", b"d", None)),
        (0x200, Commit(0, 0x200, 0x208, 0)),
    )


@pytest.mark.parametrize(
    "prefixes", [MessagePrefixes(include=[r"app\..*"]), MessagePrefixes(exclude=[r"audit\..*", "other"])]
)
def test_messages_whose_prefix_is_left_out_are_dropped_transactional_or_not(
    tmp_path: Path, prefixes: MessagePrefixes
) -> None:
    messages = MessageFilter(publish=True, prefixes=prefixes.selection())
    core = _core(tmp_path, messages)
    assert _published(_events(core, _user_messages())) == [(False, "app.orders"), (True, "APP.invoices")]
    assert messages.filtered == {MESSAGES: 2}
    assert core.ledger.received_lsn == 0x200  # consumed: the position moves past them


def test_without_messages_nothing_is_published_nor_counted(tmp_path: Path) -> None:
    messages = MessageFilter(publish=False, prefixes=Selection.of(["app.*"], [], ignore_case=True))
    assert _published(_events(_core(tmp_path, messages), _user_messages())) == []
    assert messages.filtered == {}


@pytest.mark.parametrize(
    "messages",
    [
        MessageFilter(publish=True, prefixes=Selection.of([r"app\..*"], [], ignore_case=True)),
        MessageFilter(publish=True, prefixes=Selection.of([], [r"cdcd\..*", ".*"], ignore_case=True)),
        MessageFilter(publish=False),
    ],
)
def test_cdcds_own_control_messages_reach_the_snapshotter_whatever_the_lists_say(
    tmp_path: Path, messages: MessageFilter
) -> None:
    frames = _frames(
        (0x10, LogicalMessage(False, 0x10, WATERMARK_PREFIX, b'{"id": "w"}')),
        (0x20, LogicalMessage(False, 0x20, REQUEST_PREFIX, b'{"table": "public.t"}')),
    )
    events = _events(_core(tmp_path, messages), frames)
    assert [type(e) for e in events] == [Watermark, SnapshotRequest]
    assert messages.filtered == {}
