"""The JSON-lines sink: one parseable line per change, values never misrepresented."""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from cdcd.assembly import Assembler, BufferPool
from cdcd.batches import Transaction
from cdcd.cli import _sink
from cdcd.config import Settings
from cdcd.ledger import Ledger
from cdcd.pgoutput.messages import (
    UNCHANGED_TOAST,
    Begin,
    Column,
    Commit,
    LogicalMessage,
    Message,
    Relation,
    RowChange,
    Truncate,
)
from cdcd.sink import SinkFailure
from cdcd.sink.jsonl import JsonLinesSink

REL = Relation(
    16384,
    "shop",
    'we"ird',
    "d",
    (Column("id", 23, -1, True), Column("doc", 25, -1, False), Column("blob", 17, -1, False)),
)


def transaction(tmp_path: Path, *changes: Message, end_lsn: int = 0x1_0000_0180, xid: int = 77) -> Transaction:
    assembler = Assembler(BufferPool(1 << 20, tmp_path))
    assembler.feed(Begin(end_lsn - 0x80, 0, xid))
    for change in changes:
        assembler.feed(change)
    txn = assembler.feed(Commit(0, end_lsn - 0x80, end_lsn, 0))
    assert isinstance(txn, Transaction)
    return txn


def emit(tmp_path: Path, *changes: Message) -> tuple[list[dict[str, Any]], Ledger]:
    out = io.BytesIO()
    sink = JsonLinesSink(out)
    progress = Ledger()
    txn = transaction(tmp_path, *changes)
    sink.write_transaction(txn, txn.changes(), progress)
    assert progress.flushed_lsn == 0  # finished at the next poll
    sink.poll()
    return [json.loads(line) for line in out.getvalue().decode().splitlines()], progress


def row(op: str, old: Any, new: Any, old_is_key: bool = False, lsn: int = 0x10) -> RowChange:
    return RowChange(op, REL, old, new, old_is_key, None, lsn, 50)  # type: ignore[arg-type]


def test_every_change_shape(tmp_path: Path) -> None:
    lines, progress = emit(
        tmp_path,
        row("insert", None, ("1", 'quote " and \\ and é\n', None)),
        row("update", None, ("1", UNCHANGED_TOAST, b"\x00\xff")),
        row("update", ("1", None, None), ("2", "x", None), old_is_key=True),
        row("delete", ("2", "x", None), None),
        Truncate((REL,), True, False, None, 0x20),
        LogicalMessage(True, 0x30, "pfx", b"\x00bin"),
    )
    common = {"schema": "shop", "table": 'we"ird', "xid": 77, "commit_lsn": "1/100"}
    assert lines[0] == {
        **common,
        "op": "c",
        "before": None,
        "lsn": "0/10",
        "after": {"id": "1", "doc": 'quote " and \\ and é\n', "blob": None},
    }
    assert lines[1] == {
        **common,
        "op": "u",
        "before": None,
        "lsn": "0/10",
        "after": {"id": "1", "blob": "\\x00ff"},
        "unchanged_toast": ["doc"],
    }
    assert lines[2]["before"] == {"id": "1"}  # K tuple: only the replica identity
    assert lines[2]["after"] == {"id": "2", "doc": "x", "blob": None}
    assert lines[3]["before"] == {"id": "2", "doc": "x", "blob": None}  # O tuple: the whole old row
    assert lines[3]["after"] is None
    assert lines[4] == {
        **common,
        "op": "t",
        "before": None,
        "after": None,
        "lsn": "0/20",
        "cascade": True,
        "restart_identity": False,
    }
    assert lines[5]["op"] == "m"
    assert lines[5]["prefix"] == "pfx"
    assert lines[5]["content_base64"] == "AGJpbg=="
    assert lines[5]["transactional"] is True
    assert progress.flushed_lsn == 0x1_0000_0180  # confirmed only after writing


def test_truncate_of_several_tables_gives_a_line_each(tmp_path: Path) -> None:
    other = Relation(16385, "public", "t2", "d", (Column("id", 23, -1, True),))
    lines, _ = emit(tmp_path, Truncate((REL, other), False, True, None, 0x20))
    assert [(x["schema"], x["table"], x["restart_identity"]) for x in lines] == [
        ("shop", 'we"ird', True),
        ("public", "t2", True),
    ]


def test_non_transactional_message(tmp_path: Path) -> None:
    out = io.BytesIO()
    progress = Ledger()
    sink = JsonLinesSink(out)
    sink.write_message(LogicalMessage(False, 0x40, "p", b"hi"), progress)
    sink.poll()
    (line,) = [json.loads(x) for x in out.getvalue().decode().splitlines()]
    assert (line["op"], line["xid"], line["lsn"], line["content_base64"]) == ("m", None, "0/40", "aGk=")
    assert progress.flushed_lsn == 0x40


# -- durability: a position is confirmed only once its lines are fsynced ----------------------------------------


def three_transactions(tmp_path: Path) -> list[Transaction]:
    return [
        transaction(tmp_path, row("insert", None, (str(i), "x", None)), end_lsn=0x1000 * i, xid=i) for i in (1, 2, 3)
    ]


class FsyncSpy:
    """Records each fsync: a file's or a directory's, with the confirmed position and the file's size then."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, progress: Ledger, fail: bool = False) -> None:
        self.progress, self.fail = progress, fail
        self.calls: list[tuple[str, int, int]] = []
        self._real = os.fsync
        monkeypatch.setattr(os, "fsync", self)

    def __call__(self, fd: int) -> None:
        info = os.fstat(fd)
        self.calls.append(("dir" if stat.S_ISDIR(info.st_mode) else "file", self.progress.flushed_lsn, info.st_size))
        if self.fail:
            raise OSError(5, "Input/output error")
        self._real(fd)


def test_a_position_is_confirmed_only_after_its_lines_are_fsynced_once_per_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    progress = Ledger()
    spy = FsyncSpy(monkeypatch, progress)
    path = tmp_path / "out.jsonl"
    with path.open("ab") as out:
        sink = JsonLinesSink(out)
        for txn in three_transactions(tmp_path):
            sink.write_transaction(txn, txn.changes(), progress)
        assert (progress.flushed_lsn, sink.in_flight(), spy.calls) == (0, 3, [])
        sink.poll()
        size = path.stat().st_size
        # one fsync of the file for the three (then its directory, once: the file may be new), all of it written
        # before, and nothing confirmed before it
        assert spy.calls == [("file", 0, size), ("dir", 0, spy.calls[1][2])]
        assert (progress.flushed_lsn, sink.in_flight()) == (0x3000, 0)
        sink.poll()  # nothing new: no fsync
        assert len(spy.calls) == 2
        txn = transaction(tmp_path, row("insert", None, ("4", "x", None)), end_lsn=0x4000, xid=4)
        sink.write_transaction(txn, txn.changes(), progress)
        assert sink.flush(1.0)  # on stop, as poll
        assert spy.calls[2:] == [("file", 0x3000, path.stat().st_size)]
        assert progress.flushed_lsn == 0x4000
    assert len(path.read_text().splitlines()) == 4


def test_a_failed_fsync_stops_the_sink_and_confirms_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    progress = Ledger()
    FsyncSpy(monkeypatch, progress, fail=True)
    with (tmp_path / "out.jsonl").open("ab") as out:
        sink = JsonLinesSink(out)
        [txn, *_] = three_transactions(tmp_path)
        sink.write_transaction(txn, txn.changes(), progress)
        with pytest.raises(SinkFailure, match=r"cannot fsync the output file: .*Input/output error"):
            sink.poll()
    assert progress.flushed_lsn == 0


def test_fsync_off_and_a_pipe_confirm_at_the_next_round_without_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    progress = Ledger()
    spy = FsyncSpy(monkeypatch, progress)
    [one, two, three] = three_transactions(tmp_path)
    with (tmp_path / "out.jsonl").open("ab") as out:
        sink = JsonLinesSink(out, fsync=False)
        sink.write_transaction(one, one.changes(), progress)
        assert progress.flushed_lsn == 0
        sink.poll()
        assert progress.flushed_lsn == 0x1000
    read, write = os.pipe()
    with os.fdopen(write, "wb") as pipe, os.fdopen(read, "rb"):
        sink = JsonLinesSink(pipe)  # fsync asked, but a pipe has nothing to sync
        sink.write_transaction(two, two.changes(), progress)
        sink.write_transaction(three, three.changes(), progress)
        sink.poll()
    assert progress.flushed_lsn == 0x3000
    assert spy.calls == []


def test_the_fsync_setting_reaches_the_sink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = {"dsn": "host=127.0.0.1 port=9", "publications": [{"name": "p"}]}
    output = str(tmp_path / "out.jsonl")
    sink, shaper, opened = _sink(Settings(source=source), output)
    assert shaper is None  # JSON lines are not shaped
    assert isinstance(sink, JsonLinesSink)
    assert sink.fsync
    assert opened is not None
    opened.close()
    monkeypatch.setenv("CDCD_SINK__FSYNC", "false")
    sink, shaper, opened = _sink(Settings(source=source), output)
    assert shaper is None  # JSON lines are not shaped
    assert isinstance(sink, JsonLinesSink)
    assert not sink.fsync
    assert opened is not None
    opened.close()
