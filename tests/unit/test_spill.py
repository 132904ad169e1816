"""Spill files left by a killed process are swept at the next start; a live process's files and anything that is
not a cdcd spill file are left alone."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from cdcd.assembly import Assembler, BufferPool
from cdcd.assembly.spill import PREFIX, SpillDir, Swept, sweep
from cdcd.config import Settings
from cdcd.pgoutput.messages import StreamStart, StreamStop
from cdcd.replication.loop import ReplicationLoop
from cdcd.sink.jsonl import JsonLinesSink
from tests.unit.test_assembly import ins

# A process that spills a transaction, says where, and waits to be killed.
CHILD = """
import sys
from pathlib import Path
from cdcd.assembly import Assembler, BufferPool
from cdcd.pgoutput.messages import StreamStart, StreamStop
from tests.unit.test_assembly import ins

pool = BufferPool(memory_limit=0, spill_dir=Path(sys.argv[1]))
a = Assembler(pool)
a.feed(StreamStart(100, True))
for i in range(50):
    a.feed(ins(i, 100))
a.feed(StreamStop())
print(pool.spill_path(), flush=True)
sys.stdin.read()
"""


def killed_process_spill(spill_dir: Path) -> tuple[Path, int]:
    """Run CHILD, SIGKILL it once it has spilled; its spill directory and the bytes of its spill file (what it
    had written: the rest of its buffered writes died with it)."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(spill_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    path = Path(child.stdout.readline().strip())
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    [spill_file] = path.glob("cdcd-xid100-*.spill")
    return path, spill_file.stat().st_size


def spill_a_transaction(pool: BufferPool) -> Assembler:
    a = Assembler(pool)
    a.feed(StreamStart(100, True))
    for i in range(50):
        a.feed(ins(i, 100))
    a.feed(StreamStop())
    assert pool.spilled_bytes > 0
    return a


def test_a_killed_process_s_spill_files_are_swept_and_counted(tmp_path: Path) -> None:
    left, spilled = killed_process_spill(tmp_path)
    assert left.parent == tmp_path
    assert left.name.startswith(PREFIX)
    assert spilled > 0
    pool = BufferPool(memory_limit=0, spill_dir=tmp_path)
    assert pool.sweep() == Swept(files=1, bytes=spilled, directories=1)
    assert list(tmp_path.iterdir()) == []
    assert pool.sweep() == Swept()


def test_a_live_process_s_spill_files_are_left_alone(tmp_path: Path) -> None:
    """The lock is the open directory's (flock): a second pool, as a second daemon would, cannot take it."""
    live = BufferPool(memory_limit=0, spill_dir=tmp_path)
    spill_a_transaction(live)
    own = live.spill_path()
    files = list(own.iterdir())
    assert len(files) == 1
    assert BufferPool(memory_limit=0, spill_dir=tmp_path).sweep() == Swept()
    assert list(own.iterdir()) == files
    size = files[0].stat().st_size
    live.release()  # a buffer still open (a stop mid-transaction): the directory stays, unlocked, for the next start
    assert own.exists()
    assert sweep(tmp_path) == Swept(files=1, bytes=size, directories=1)
    assert not own.exists()


def test_only_cdcd_spill_files_are_removed(tmp_path: Path) -> None:
    foreign = tmp_path / "notes.txt"
    foreign.write_text("mine")
    lookalike = tmp_path / "cdcd-xid7-abc.spill.bak"
    lookalike.write_text("x")
    legacy = tmp_path / "cdcd-xid7-abcd1234.spill"  # an earlier version's, directly in spill_dir
    legacy.write_bytes(b"12345")
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    (other_dir / "cdcd-xid8-abcd1234.spill").write_bytes(b"1")
    mixed = tmp_path / f"{PREFIX}mixed"  # a dead process's directory with someone else's file in it
    mixed.mkdir()
    (mixed / "cdcd-xid9-abcd1234.spill").write_bytes(b"123")
    (mixed / "keep.txt").write_text("keep")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "cdcd-xid10-abcd1234.spill").write_bytes(b"1")
    (tmp_path / f"{PREFIX}link").symlink_to(outside)

    assert sweep(tmp_path) == Swept(files=2, bytes=8, directories=0)
    assert not legacy.exists()
    assert sorted(p.name for p in mixed.iterdir()) == ["keep.txt"]
    for kept in (foreign, lookalike, other_dir / "cdcd-xid8-abcd1234.spill", outside / "cdcd-xid10-abcd1234.spill"):
        assert kept.exists(), kept


def test_a_directory_swept_before_its_process_locked_it_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two daemons starting at once: one sweeps the other's new directory between its making and its locking
    (empty, unlocked: it looks dead); the other notices and makes another."""
    real_flock = fcntl.flock
    swept: list[Swept] = []

    def racing_flock(fd: int, operation: int) -> None:
        if not swept:
            swept.append(Swept())  # the sweep below locks too
            swept.append(sweep(tmp_path))
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", racing_flock)
    made = SpillDir.claim(tmp_path)
    assert swept[1] == Swept(directories=1)
    assert list(tmp_path.iterdir()) == [made.path]
    assert sweep(tmp_path) == Swept()  # locked: alive
    made.release()
    assert list(tmp_path.iterdir()) == []


def test_the_loop_sweeps_at_start_and_logs_what(tmp_path: Path) -> None:
    _, spilled = killed_process_spill(tmp_path)
    settings = Settings(
        source={"dsn": "host=127.0.0.1 port=9", "publications": [{"name": "p"}]},
        buffer={"spill_dir": tmp_path},
    )
    with open(os.devnull, "wb") as out:
        loop = ReplicationLoop(settings, JsonLinesSink(out))
        with structlog.testing.capture_logs() as logs:
            loop._sweep_spill_files()
    [line] = [x for x in logs if x["event"] == "swept spill files left by stopped processes"]
    assert (line["files"], line["bytes"], line["directories"]) == (1, spilled, 1)
    assert list(tmp_path.iterdir()) == []
