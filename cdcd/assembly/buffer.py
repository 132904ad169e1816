"""Per-transaction change buffers under one shared memory budget, spilling to disk past it.

A buffer holds a transaction's changes in arrival order: first those spilled to its file, then those still
in memory. When the budget is exceeded the largest buffer is spilled whole (as PostgreSQL's reorder buffer
does). The file is a sequence of batches, each one marshal blob of up to ``SPILL_BATCH`` changes packed as
tuples of plain values, so spilling and replaying run mostly in C; the Relation objects changes are bound to
stay in memory in a small per-buffer table.

Memory is accounted as the wire size of each change plus a fixed per-value allowance for Python's
objects (``VALUE_OVERHEAD``, ``CHANGE_OVERHEAD``), estimated from CPython's object sizes.
"""

from __future__ import annotations

import bisect
import marshal
import os
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from cdcd.pgoutput.messages import Change, LogicalMessage, Relation, RowChange, Truncate

VALUE_OVERHEAD = 64  # CPython str header (49 B) + tuple slot (8 B), less the 5 wire bytes, rounded up
CHANGE_OVERHEAD = 200  # the change object, its tuples and the list slot

_LEN = struct.Struct(">I")
SPILL_BATCH = 4096  # changes per marshal blob: bounds the transient copy made while spilling
_ROW, _TRUNCATE, _MESSAGE = 0, 1, 2


def change_cost(change: Change) -> int:
    if isinstance(change, RowChange):
        return change.size + CHANGE_OVERHEAD + VALUE_OVERHEAD * len(change.relation.columns)
    if isinstance(change, Truncate):
        return CHANGE_OVERHEAD + 8 * len(change.relations)
    return CHANGE_OVERHEAD + len(change.content) + len(change.prefix)


class BufferPool:
    """The memory budget shared by every open transaction buffer."""

    def __init__(self, memory_limit: int, spill_dir: Path | None = None) -> None:
        if memory_limit < 0:
            raise ValueError("memory_limit must be >= 0")
        self.memory_limit = memory_limit
        self.spill_dir = spill_dir
        self.memory_bytes = 0
        self.spilled_bytes = 0
        self._open: set[ChangeBuffer] = set()

    def new_buffer(self, xid: int) -> ChangeBuffer:
        buffer = ChangeBuffer(self, xid)
        self._open.add(buffer)
        return buffer

    @property
    def open_buffers(self) -> int:
        return len(self._open)

    def _grew(self) -> None:
        while self.memory_bytes > self.memory_limit:
            largest = max(self._open, key=lambda b: b.memory_bytes)
            if largest.memory_bytes == 0:
                return
            largest.spill()

    def _closed(self, buffer: ChangeBuffer) -> None:
        self._open.discard(buffer)


class ChangeBuffer:
    """The changes of one transaction, with the positions where each subtransaction first wrote."""

    def __init__(self, pool: BufferPool, xid: int) -> None:
        self.pool = pool
        self.xid = xid
        self.count = 0
        self.memory_bytes = 0
        self._memory: list[Change] = []
        self._spilled = 0  # changes in the file; they precede those in memory
        self._file: BinaryIO | None = None
        self._file_bytes = 0
        self._path: Path | None = None
        self._subxact_first: dict[int, int] = {}  # subxid -> index of its first change
        self._batches: list[tuple[int, int]] = []  # (index of its first change, file offset) per spilled batch
        self._relations: list[Relation] = []
        self._relation_index: dict[int, int] = {}  # id(Relation) -> index in _relations

    def append(self, change: Change) -> None:
        """Add a change; its ``xid`` (set inside streamed blocks) is the subtransaction that made it."""
        subxid = change.xid
        if subxid is not None and subxid not in self._subxact_first:
            self._subxact_first[subxid] = self.count
        self._memory.append(change)
        self.count += 1
        if change.__class__ is RowChange:  # the per-row path: change_cost() inlined
            cost = change.size + CHANGE_OVERHEAD + VALUE_OVERHEAD * len(change.relation.columns)
        else:
            cost = change_cost(change)
        self.memory_bytes += cost
        pool = self.pool
        pool.memory_bytes += cost
        if pool.memory_bytes > pool.memory_limit:
            pool._grew()

    def discard_subtransaction(self, subxid: int) -> bool:
        """Drop subxid's changes and every change after them (PostgreSQL's ROLLBACK TO semantics).

        Returns False when the subtransaction wrote nothing to this buffer."""
        index = self._subxact_first.get(subxid)
        if index is None:
            return False
        if index >= self._spilled:
            self._drop_memory(index - self._spilled)
        else:
            self._drop_memory(0)
            self._truncate_file(index)
        self.count = index
        self._subxact_first = {s: i for s, i in self._subxact_first.items() if i < index}
        return True

    def _truncate_file(self, index: int) -> None:
        """Cut the spill file so that it holds exactly the changes before ``index``."""
        assert self._file is not None
        batch = bisect.bisect_right(self._batches, index, key=lambda b: b[0]) - 1
        first, offset = self._batches[batch]
        kept = self._read_batch(offset)[: index - first]
        self._file.truncate(offset)
        self.pool.spilled_bytes -= self._file_bytes - offset
        self._file_bytes = offset
        del self._batches[batch:]
        self._spilled = first
        if kept:
            self._write_batch(kept)

    def _drop_memory(self, keep: int) -> None:
        if keep == 0:
            cost = self.memory_bytes
            self._memory.clear()
        else:
            cost = sum(map(change_cost, self._memory[keep:]))
            del self._memory[keep:]
        self.memory_bytes -= cost
        self.pool.memory_bytes -= cost

    def spill(self) -> None:
        """Move the in-memory changes to the spill file."""
        if not self._memory:
            return
        pack = self._pack
        memory = self._memory
        for start in range(0, len(memory), SPILL_BATCH):
            self._write_batch([pack(change) for change in memory[start : start + SPILL_BATCH]])
        self._drop_memory(0)

    def _write_batch(self, records: list[tuple[object, ...]]) -> None:
        if self._file is None:
            self._open_file()
        assert self._file is not None
        blob = marshal.dumps(records)
        offset = self._file_bytes
        self._file.seek(offset)
        self._file.write(_LEN.pack(len(blob)))
        self._file.write(blob)
        self._batches.append((self._spilled, offset))
        self._spilled += len(records)
        self._file_bytes += 4 + len(blob)
        self.pool.spilled_bytes += 4 + len(blob)

    def _read_batch(self, offset: int) -> list[tuple[Any, ...]]:
        assert self._file is not None
        self._file.flush()
        self._file.seek(offset)
        (length,) = _LEN.unpack(self._file.read(4))
        records: list[tuple[Any, ...]] = marshal.loads(self._file.read(length))
        return records

    def _open_file(self) -> None:
        directory = self.pool.spill_dir
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f"cdcd-xid{self.xid}-", suffix=".spill", dir=directory)
        self._file = os.fdopen(fd, "w+b")
        self._path = Path(name)

    def _relation_ref(self, relation: Relation) -> int:
        index = self._relation_index.get(id(relation))
        if index is None:
            index = len(self._relations)
            self._relations.append(relation)
            self._relation_index[id(relation)] = index
        return index

    def _pack(self, change: Change) -> tuple[object, ...]:
        if isinstance(change, RowChange):
            return (
                _ROW,
                change.op,
                self._relation_ref(change.relation),
                change.old,
                change.new,
                change.old_is_key,
                change.xid,
                change.wal_lsn,
                change.size,
            )
        if isinstance(change, Truncate):
            refs = tuple(self._relation_ref(r) for r in change.relations)
            return (_TRUNCATE, refs, change.cascade, change.restart_identity, change.xid, change.wal_lsn)
        return (_MESSAGE, change.transactional, change.lsn, change.prefix, change.content, change.xid)

    def _unpack(self, record: tuple[Any, ...]) -> Change:
        kind, *fields = record
        if kind == _ROW:
            op, rel, old, new, old_is_key, xid, wal_lsn, size = fields
            return RowChange(op, self._relations[rel], old, new, old_is_key, xid, wal_lsn, size)
        if kind == _TRUNCATE:
            refs, cascade, restart, xid, wal_lsn = fields
            return Truncate(tuple(self._relations[i] for i in refs), cascade, restart, xid, wal_lsn)
        return LogicalMessage(*fields)

    def __iter__(self) -> Iterator[Change]:
        """Replay every change in order: the spilled ones from the file, then those in memory."""
        unpack = self._unpack
        for _, offset in list(self._batches):
            yield from map(unpack, self._read_batch(offset))
        yield from self._memory

    def close(self) -> None:
        """Release memory and delete the spill file. Safe to call twice."""
        self._drop_memory(0)
        if self._file is not None:
            self.pool.spilled_bytes -= self._file_bytes
            self._file_bytes = 0
            self._file.close()
            self._file = None
        if self._path is not None:
            self._path.unlink(missing_ok=True)
            self._path = None
        self.pool._closed(self)
