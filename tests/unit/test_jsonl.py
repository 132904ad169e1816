"""The JSON-lines sink: one parseable line per change, values never misrepresented."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from cdcd.assembly import Assembler, BufferPool
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
from cdcd.sink.jsonl import JsonLinesSink

REL = Relation(
    16384,
    "shop",
    'we"ird',
    "d",
    (Column("id", 23, -1, True), Column("doc", 25, -1, False), Column("blob", 17, -1, False)),
)


def emit(tmp_path: Path, *changes: Message) -> tuple[list[dict[str, Any]], Ledger]:
    assembler = Assembler(BufferPool(1 << 20, tmp_path))
    out = io.BytesIO()
    sink = JsonLinesSink(out)
    progress = Ledger()
    assembler.feed(Begin(0x1_0000_0100, 0, 77))
    for change in changes:
        assembler.feed(change)
    txn = assembler.feed(Commit(0, 0x1_0000_0100, 0x1_0000_0180, 0))
    assert txn is not None
    assert not isinstance(txn, LogicalMessage)
    sink.write_transaction(txn, txn.changes(), progress)
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
    JsonLinesSink(out).write_message(LogicalMessage(False, 0x40, "p", b"hi"), progress)
    (line,) = [json.loads(x) for x in out.getvalue().decode().splitlines()]
    assert (line["op"], line["xid"], line["lsn"], line["content_base64"]) == ("m", None, "0/40", "aGk=")
    assert progress.flushed_lsn == 0x40
