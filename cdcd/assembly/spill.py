"""Whose spill files are whose: each process spills into a directory of its own under ``buffer.spill_dir``,
``cdcd-spill-<random>/``, locked (``flock``) for as long as the process lives (the kernel lets go of the lock
when the process ends, however it ends).

A spill file is only ever read by the process that wrote it, while its transaction is open: after a kill or a
crash nothing reads it again (the server sends the transaction anew). So at start cdcd sweeps the directories
of ``spill_dir`` whose lock it can take: their process is gone. Daemons sharing a ``spill_dir`` never touch
each other's live directories. Only cdcd's own names are removed (``cdcd-xid<xid>-*.spill`` files inside a
``cdcd-spill-*`` directory, then the directory if that emptied it); anything else is left as it is.

Spill files of earlier versions lie directly in ``spill_dir`` (same name pattern, no directory): they are swept
too. A live process of such a version would not notice: it reads and writes its files through the descriptor it
holds and never opens them again by name.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path

PREFIX = "cdcd-spill-"
SPILL_FILE = re.compile(r"cdcd-xid\d+-[^/]+\.spill")


@dataclass(frozen=True)
class Swept:
    files: int = 0
    bytes: int = 0
    directories: int = 0  # of dead processes, removed

    def __add__(self, other: Swept) -> Swept:
        return Swept(self.files + other.files, self.bytes + other.bytes, self.directories + other.directories)


class SpillDir:
    """This process's directory of spill files, locked until ``release`` or the process's end."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._close = weakref.finalize(self, os.close, fd)  # lets go of the lock

    @classmethod
    def claim(cls, parent: Path) -> SpillDir:
        """A new locked directory under ``parent`` (made if missing)."""
        parent.mkdir(parents=True, exist_ok=True)
        for _ in range(10):
            path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
            try:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:  # a starting daemon swept it while it was empty and unlocked
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                made, now = os.fstat(fd), os.stat(path)
                if (made.st_dev, made.st_ino) == (now.st_dev, now.st_ino):  # locked, and not swept meanwhile
                    return cls(path, fd)
            except (BlockingIOError, FileNotFoundError):
                pass
            os.close(fd)
        raise OSError(f"cannot make a spill directory of this process in {parent}")

    def release(self) -> None:
        """Remove the directory if nothing is left in it, and let go of the lock."""
        with contextlib.suppress(OSError):  # not empty (a buffer still open): the next start sweeps it
            os.rmdir(self.path)
        self._close()


def sweep(parent: Path) -> Swept:
    """Remove the spill files of processes that are gone (see the module's doc); what was removed."""
    try:
        entries = list(os.scandir(parent))
    except FileNotFoundError:
        return Swept()
    swept = Swept()
    for entry in entries:
        if entry.name.startswith(PREFIX) and entry.is_dir(follow_symlinks=False):
            swept += _sweep_directory(Path(entry.path))
        elif SPILL_FILE.fullmatch(entry.name):
            swept += _remove_spill_files(parent, [entry])
    return swept


def _sweep_directory(path: Path) -> Swept:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return Swept()  # swept by another daemon meanwhile
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return Swept()  # its process lives
        swept = _remove_spill_files(path, list(os.scandir(path)))
        try:
            os.rmdir(path)
        except OSError:
            return swept  # something else lies in it: not ours to remove
        return swept + Swept(directories=1)
    finally:
        os.close(fd)


def _remove_spill_files(directory: Path, entries: list[os.DirEntry[str]]) -> Swept:
    files = size = 0
    for entry in entries:
        if not (SPILL_FILE.fullmatch(entry.name) and entry.is_file(follow_symlinks=False)):
            continue
        try:
            nbytes = entry.stat(follow_symlinks=False).st_size
            os.unlink(directory / entry.name)
        except FileNotFoundError:
            continue
        files, size = files + 1, size + nbytes
    return Swept(files, size)
