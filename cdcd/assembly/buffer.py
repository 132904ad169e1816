"""Per-transaction change buffers under one shared memory budget, spilling to disk past it.

A buffer holds a transaction's changes in arrival order: first those spilled to its file, then those still
in memory. When the budget is exceeded the largest buffer is spilled whole (as PostgreSQL's reorder buffer
does). The file is a sequence of batches, each one marshal blob of about ``SPILL_BATCH`` changes packed as
tuples of plain values, so spilling and replaying run mostly in C; the Relation objects changes are bound to
stay in memory in a small per-buffer table.

Row changes the shaper encodes as they arrive (``append_encoded``) are kept in runs (``EncodedRun``) of up to
``SPILL_BATCH`` changes of one table version: bytes, spilled and read back as one blob each.

Memory is accounted as the wire size of each decoded change plus a fixed per-value allowance for Python's
objects (``VALUE_OVERHEAD``, ``CHANGE_OVERHEAD``), estimated from CPython's object sizes; an encoded change as
its bytes plus ``ENCODED_OVERHEAD``, a run as ``RUN_OVERHEAD``.
"""

from __future__ import annotations

import bisect
import marshal
import os
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from cdcd.assembly.spill import SpillDir, Swept, sweep
from cdcd.batches import Buffered, EncodedRun
from cdcd.pgoutput.messages import Change, LogicalMessage, RowChange, Truncate

VALUE_OVERHEAD = 64  # CPython str header (49 B) + tuple slot (8 B), less the 5 wire bytes, rounded up
CHANGE_OVERHEAD = 200  # the change object, its tuples and the list slot

ENCODED_OVERHEAD = 24  # an encoded change's record header (its bytes are counted as they are)
RUN_OVERHEAD = 300  # an EncodedRun, its compiled object and the list slot

_LEN = struct.Struct(">I")
SPILL_BATCH = 4096  # changes per marshal blob and per encoded run: bounds the transient copy made while spilling
_ROW, _TRUNCATE, _MESSAGE, _ENCODED = 0, 1, 2, 3

# Encodes a row change into the run given (None: a new one), as the shaper does it (``EventShaper.early``): the
# run it went to, or None when the change stays decoded.
Early = Callable[[RowChange, bytes, EncodedRun | None], EncodedRun | None]


def change_cost(change: Buffered) -> int:
    if isinstance(change, EncodedRun):
        return change.nbytes + ENCODED_OVERHEAD * change.count + RUN_OVERHEAD
    if isinstance(change, RowChange):
        return change.size + CHANGE_OVERHEAD + VALUE_OVERHEAD * len(change.relation.columns)
    if isinstance(change, Truncate):
        return CHANGE_OVERHEAD + 8 * len(change.relations)
    return CHANGE_OVERHEAD + len(change.content) + len(change.prefix)


class BufferPool:
    """The memory budget shared by every open transaction buffer, and the directory they spill to (this
    process's own, under ``spill_dir``: ``cdcd.assembly.spill``)."""

    def __init__(self, memory_limit: int, spill_dir: Path | None = None) -> None:
        if memory_limit < 0:
            raise ValueError("memory_limit must be >= 0")
        self.memory_limit = memory_limit
        self.spill_dir = spill_dir  # None: the system's temporary directory
        self.memory_bytes = 0
        self.spilled_bytes = 0
        self._open: set[ChangeBuffer] = set()
        self._own: SpillDir | None = None  # made at the first spill

    def sweep(self) -> Swept:
        """Remove the spill files that processes now gone left in ``spill_dir``."""
        return sweep(self._parent())

    def spill_path(self) -> Path:
        """This process's spill directory."""
        if self._own is None:
            self._own = SpillDir.claim(self._parent())
        return self._own.path

    def release(self) -> None:
        """Give up this process's spill directory (removed if empty); a later spill makes a new one."""
        if self._own is not None:
            self._own.release()
            self._own = None

    def _parent(self) -> Path:
        return self.spill_dir if self.spill_dir is not None else Path(tempfile.gettempdir())

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
        self._memory: list[Buffered] = []
        self._spilled = 0  # changes in the file; they precede those in memory
        self._file: BinaryIO | None = None
        self._file_bytes = 0
        self._path: Path | None = None
        self._subxact_first: dict[int, int] = {}  # subxid -> index of its first change
        self.last_xid: int | None = None  # of the last change added
        self._batches: list[tuple[int, int]] = []  # (index of its first change, file offset) per spilled batch
        self._refs: list[Any] = []  # the Relations (and encoders) of spilled changes
        self._ref_index: dict[int, int] = {}  # id(object) -> index in _refs

    def append(self, change: Change) -> None:
        """Add a change; its ``xid`` (set inside streamed blocks) is the subtransaction that made it."""
        subxid = self.last_xid = change.xid
        if subxid is not None and subxid not in self._subxact_first:
            self._subxact_first[subxid] = self.count
        self._memory.append(change)
        self.count += 1
        if change.__class__ is RowChange:  # the per-row path: change_cost() inlined
            cost = change.size + CHANGE_OVERHEAD + VALUE_OVERHEAD * len(change.relation.columns)
        else:
            cost = change_cost(change)
        self._grown(cost)

    def append_encoded(self, change: RowChange, payload: bytes, early: Early) -> bool:
        """Add a row change encoded by ``early`` (its pgoutput message: ``payload``); False when ``early``
        leaves it decoded (nothing added: ``append`` it)."""
        memory = self._memory
        last = memory[-1] if memory else None
        run = self.growing_run()
        if run is not None and run.relation is not change.relation:
            run = None
        before = 0 if run is None else run.nbytes
        made = early(change, payload, run)
        if made is None:
            return False
        cost = made.nbytes - before + ENCODED_OVERHEAD
        if made is not run:
            if isinstance(last, EncodedRun):
                last.rows.shrink()  # it is done growing: give back the spare capacity
            memory.append(made)
            cost += RUN_OVERHEAD
        subxid = self.last_xid = change.xid
        if subxid is not None and subxid not in self._subxact_first:
            self._subxact_first[subxid] = self.count
        self.count += 1
        self._grown(cost)
        return True

    def growing_run(self) -> EncodedRun | None:
        """The run the next encoded change of its table would go to (None: the next one starts a new run)."""
        last = self._memory[-1] if self._memory else None
        return last if isinstance(last, EncodedRun) and last.count < SPILL_BATCH else None

    def took(self, count: int, nbytes: int) -> None:
        """``count`` changes of subtransaction ``last_xid``, ``nbytes`` bytes, were encoded into ``growing_run``
        by the compiled code (``cdcd.replication.lane``)."""
        self.count += count
        self._grown(nbytes + ENCODED_OVERHEAD * count)

    def _grown(self, cost: int) -> None:
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
        self.last_xid = None  # the next change goes through append or append_encoded, which note its xid
        return True

    def _truncate_file(self, index: int) -> None:
        """Cut the spill file so that it holds exactly the changes before ``index``."""
        assert self._file is not None
        batch = bisect.bisect_right(self._batches, index, key=lambda b: b[0]) - 1
        first, offset = self._batches[batch]
        kept, _ = _cut(list(map(self._unpack, self._read_batch(offset))), index - first)
        self._file.truncate(offset)
        self.pool.spilled_bytes -= self._file_bytes - offset
        self._file_bytes = offset
        del self._batches[batch:]
        self._spilled = first
        if kept:
            self._write_batch([self._pack(item) for item in kept], index - first)

    def _drop_memory(self, keep: int) -> None:
        if keep == 0:
            cost = self.memory_bytes
            self._memory.clear()
        else:
            self._memory, cost = _cut(self._memory, keep)
        self.memory_bytes -= cost
        self.pool.memory_bytes -= cost

    def spill(self) -> None:
        """Move the in-memory changes to the spill file, in batches of about ``SPILL_BATCH`` changes."""
        if not self._memory:
            return
        pack = self._pack
        batch: list[tuple[object, ...]] = []
        count = 0
        for item in self._memory:
            batch.append(pack(item))
            count += item.count if isinstance(item, EncodedRun) else 1
            if count >= SPILL_BATCH:
                self._write_batch(batch, count)
                batch, count = [], 0
        if batch:
            self._write_batch(batch, count)
        self._drop_memory(0)

    def _write_batch(self, records: list[tuple[object, ...]], count: int) -> None:
        """Append one batch of packed items, ``count`` changes in all."""
        if self._file is None:
            self._open_file()
        assert self._file is not None
        blob = marshal.dumps(records)
        offset = self._file_bytes
        self._file.seek(offset)
        self._file.write(_LEN.pack(len(blob)))
        self._file.write(blob)
        self._batches.append((self._spilled, offset))
        self._spilled += count
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
        fd, name = tempfile.mkstemp(prefix=f"cdcd-xid{self.xid}-", suffix=".spill", dir=self.pool.spill_path())
        self._file = os.fdopen(fd, "w+b")
        self._path = Path(name)

    def _ref(self, obj: object) -> int:
        index = self._ref_index.get(id(obj))
        if index is None:
            index = len(self._refs)
            self._refs.append(obj)
            self._ref_index[id(obj)] = index
        return index

    def _pack(self, change: Buffered) -> tuple[object, ...]:
        if isinstance(change, EncodedRun):
            owners = self._ref(change.relation), self._ref(change.encoder)
            return (_ENCODED, *owners, change.count, change.rows.data(), change.encoding)
        if isinstance(change, RowChange):
            return (
                _ROW,
                change.op,
                self._ref(change.relation),
                change.old,
                change.new,
                change.old_is_key,
                change.xid,
                change.wal_lsn,
                change.size,
            )
        if isinstance(change, Truncate):
            refs = tuple(self._ref(r) for r in change.relations)
            return (_TRUNCATE, refs, change.cascade, change.restart_identity, change.xid, change.wal_lsn)
        return (_MESSAGE, change.transactional, change.lsn, change.prefix, change.content, change.xid)

    def _unpack(self, record: tuple[Any, ...]) -> Buffered:
        kind, *fields = record
        if kind == _ROW:
            op, rel, old, new, old_is_key, xid, wal_lsn, size = fields
            return RowChange(op, self._refs[rel], old, new, old_is_key, xid, wal_lsn, size)
        if kind == _ENCODED:
            rel, ref, count, data, encoding = fields
            encoder = self._refs[ref]
            return EncodedRun(self._refs[rel], encoder, encoder.encoded(data, count), encoding)
        if kind == _TRUNCATE:
            refs, cascade, restart, xid, wal_lsn = fields
            return Truncate(tuple(self._refs[i] for i in refs), cascade, restart, xid, wal_lsn)
        return LogicalMessage(*fields)

    def __iter__(self) -> Iterator[Buffered]:
        """Replay every change in order, once: the spilled ones from the file, then those in memory, each let go
        as it is handed over (a large transaction's memory is given back while it is produced; ``close`` settles
        the account)."""
        unpack = self._unpack
        for _, offset in list(self._batches):
            yield from map(unpack, self._read_batch(offset))
        memory = self._memory
        memory.reverse()
        while memory:
            yield memory.pop()

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


def _cut(items: list[Buffered], keep: int) -> tuple[list[Buffered], int]:
    """The first ``keep`` changes of ``items`` (the run holding the cut cut in two) and the cost of the rest."""
    kept: list[Buffered] = []
    cost = seen = 0
    for item in items:
        size = item.count if isinstance(item, EncodedRun) else 1
        if seen >= keep:
            cost += change_cost(item)
        else:
            kept.append(item)
            if seen + size > keep:
                assert isinstance(item, EncodedRun)
                cost += item.rows.truncate(keep - seen) + ENCODED_OVERHEAD * (seen + size - keep)
        seen += size
    return kept, cost
