"""Transaction assembly: decoded pgoutput messages in, committed transactions out.

* Plain transactions (Begin ... Commit) are buffered and emitted at Commit, in commit order.
* Streamed transactions (protocol 2+) are buffered per top-level xid across interleaved Stream Start/Stop
  blocks and emitted whole at Stream Commit. Stream Abort with subxid = xid discards the transaction; with
  another subxid it discards that subtransaction's changes and every change after them, as PostgreSQL's own
  subscriber does for ROLLBACK TO SAVEPOINT.
* Two-phase transactions (protocol 3+) are buffered from Begin Prepare (or Stream Prepare) and emitted at
  Commit Prepared, discarded at Rollback Prepared.
* Non-transactional logical decoding messages are emitted at once.

All buffers share one BufferPool, so memory stays under its limit whatever the transactions' sizes: past it
the largest buffer spills to a file (the one I/O of this stage, ``cdcd.assembly.buffer``). With ``early`` (the
shaper's ``EventShaper.early``), row changes are buffered encoded, which is smaller and leaves less to do at
commit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdcd.assembly.buffer import BufferPool, ChangeBuffer, Early
from cdcd.batches import EncodedRun, Transaction
from cdcd.pgoutput.messages import (
    Begin,
    BeginPrepare,
    Change,
    Commit,
    CommitPrepared,
    LogicalMessage,
    Message,
    Origin,
    Prepare,
    Relation,
    RollbackPrepared,
    RowChange,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
)


class AssemblyError(RuntimeError):
    """Messages arrived in an order the protocol does not allow (or that shows lost messages)."""


Event = Transaction | LogicalMessage


@dataclass(eq=False)
class _Open:
    """A transaction whose changes are still arriving."""

    xid: int
    buffer: ChangeBuffer
    origin: str | None = None
    final_lsn: int | None = None  # from Begin, checked against Commit
    gid: str | None = None


@dataclass(frozen=True, slots=True)
class Growing:
    """``Assembler.growing``: the run, the subtransaction its next change belongs to, the memory left (bytes)."""

    run: EncodedRun
    xid: int | None
    room: int


class Assembler:
    def __init__(self, pool: BufferPool, early: Early | None = None) -> None:
        self.pool = pool
        self.early = early
        self._current: _Open | None = None  # plain or prepared transaction between its begin and end
        self._streams: dict[int, _Open] = {}  # streamed transactions by top-level xid
        self._stream: _Open | None = None  # the one whose block is open
        self._prepared: dict[str, _Open] = {}  # by GID
        self.aborted_transactions = 0
        self.aborted_subtransactions = 0

    @property
    def in_transaction(self) -> bool:
        """True between Begin and Commit of a plain transaction: its end LSN is not confirmable yet."""
        return self._current is not None

    def open_buffer(self) -> ChangeBuffer | None:
        """The buffer a row change arriving now goes to (None: no transaction open)."""
        target = self._stream or self._current
        return None if target is None else target.buffer

    def growing(self) -> Growing | None:
        """The open transaction's encoded run that its table's next change would go to (``EventShaper.early``),
        with the subtransaction it grows in and the memory left: where the lane encodes further changes."""
        buffer = self.open_buffer()
        run = None if buffer is None else buffer.growing_run()
        if run is None:
            return None
        assert buffer is not None
        pool = buffer.pool
        return Growing(run, buffer.last_xid, pool.memory_limit - pool.memory_bytes)

    def took(self, count: int, nbytes: int) -> None:
        """``count`` changes, ``nbytes`` bytes, were encoded into the ``growing`` run by the compiled code."""
        buffer = self.open_buffer()
        assert buffer is not None
        buffer.took(count, nbytes)

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def reset(self) -> None:
        """Forget all unfinished transactions (after a reconnect the server sends them again)."""
        for txn in [self._current, *self._streams.values(), *self._prepared.values()]:
            if txn is not None:
                txn.buffer.close()
        self._current = self._stream = None
        self._streams.clear()
        self._prepared.clear()

    def feed(self, message: Message, payload: bytes | None = None) -> Event | None:
        """Take one message (a row change's pgoutput bytes: ``payload``, to encode it early); return a finished
        transaction or a non-transactional message, if any."""
        if message.__class__ is RowChange or message.__class__ is Truncate:  # the per-row path
            target = self._stream or self._current or self._target(message)
            early = self.early
            if (
                early is None
                or payload is None
                or message.__class__ is not RowChange
                or not target.buffer.append_encoded(message, payload, early)
            ):
                target.buffer.append(message)
            return None
        handler = _HANDLERS.get(type(message))
        if handler is None:
            raise AssemblyError(f"unexpected message {type(message).__name__}")
        return handler(self, message)

    def _target(self, change: Change) -> _Open:
        target = self._stream or self._current
        if target is None:
            kind = type(change).__name__
            raise AssemblyError(f"{kind} outside any transaction (no Begin or Stream Start before it)")
        return target

    def _on_schema(self, message: Relation | Type) -> None:
        return None  # the decoder keeps the caches; nothing to buffer

    def _on_message(self, message: LogicalMessage) -> Event | None:
        if not message.transactional:
            return message
        self._target(message).buffer.append(message)
        return None

    def _on_begin(self, message: Begin) -> None:
        self._require_idle("Begin")
        self._current = _Open(message.xid, self.pool.new_buffer(message.xid), final_lsn=message.final_lsn)

    def _on_origin(self, message: Origin) -> None:
        target = self._stream or self._current
        if target is None:
            raise AssemblyError("Origin outside any transaction")
        target.origin = message.name

    def _on_commit(self, message: Commit) -> Transaction:
        txn = self._take_current("Commit")
        if txn.final_lsn is not None and txn.final_lsn != message.commit_lsn:
            txn.buffer.close()
            raise AssemblyError(
                f"Commit LSN {message.commit_lsn:X} differs from the final LSN {txn.final_lsn:X} announced by Begin"
            )
        return Transaction(
            txn.xid, message.commit_lsn, message.end_lsn, message.commit_time, False, txn.buffer, txn.origin
        )

    def _on_stream_start(self, message: StreamStart) -> None:
        if self._stream is not None or self._current is not None:
            raise AssemblyError(f"Stream Start for xid {message.xid} inside another transaction")
        txn = self._streams.get(message.xid)
        if txn is None:
            if not message.first_segment:
                raise AssemblyError(
                    f"Stream Start for xid {message.xid} continues a stream whose first segment was never received"
                )
            txn = self._streams[message.xid] = _Open(message.xid, self.pool.new_buffer(message.xid))
        self._stream = txn

    def _on_stream_stop(self, message: StreamStop) -> None:
        if self._stream is None:
            raise AssemblyError("Stream Stop without Stream Start")
        self._stream = None

    def _take_stream(self, xid: int, what: str) -> _Open:
        if self._stream is not None:
            raise AssemblyError(f"{what} for xid {xid} inside a streamed block")
        txn = self._streams.pop(xid, None)
        if txn is None:
            raise AssemblyError(f"{what} for xid {xid}, which never streamed")
        return txn

    def _on_stream_commit(self, message: StreamCommit) -> Transaction:
        txn = self._take_stream(message.xid, "Stream Commit")
        return Transaction(
            txn.xid, message.commit_lsn, message.end_lsn, message.commit_time, True, txn.buffer, txn.origin
        )

    def _on_stream_abort(self, message: StreamAbort) -> None:
        if self._stream is not None:
            raise AssemblyError(f"Stream Abort for xid {message.xid} inside a streamed block")
        txn = self._streams.get(message.xid)
        if txn is None:
            # The server aborts what it streamed; nothing of it reached us in this session.
            return
        if message.subxid == message.xid:
            del self._streams[message.xid]
            txn.buffer.close()
            self.aborted_transactions += 1
        elif txn.buffer.discard_subtransaction(message.subxid):
            self.aborted_subtransactions += 1

    def _on_begin_prepare(self, message: BeginPrepare) -> None:
        self._require_idle("Begin Prepare")
        self._current = _Open(message.xid, self.pool.new_buffer(message.xid), gid=message.gid)

    def _on_prepare(self, message: Prepare) -> None:
        txn = self._take_current("Prepare")
        self._park(txn, message.gid)

    def _on_stream_prepare(self, message: StreamPrepare) -> None:
        txn = self._take_stream(message.xid, "Stream Prepare")
        self._park(txn, message.gid)

    def _park(self, txn: _Open, gid: str) -> None:
        if gid in self._prepared:
            txn.buffer.close()
            raise AssemblyError(f"transaction {gid!r} prepared twice")
        txn.gid = gid
        self._prepared[gid] = txn

    def _on_commit_prepared(self, message: CommitPrepared) -> Transaction:
        self._require_idle("Commit Prepared")
        txn = self._prepared.pop(message.gid, None)
        if txn is None:
            raise AssemblyError(
                f"Commit Prepared for {message.gid!r}, whose prepared changes were not received in this session"
            )
        return Transaction(
            txn.xid, message.commit_lsn, message.end_lsn, message.commit_time, False, txn.buffer, txn.origin, txn.gid
        )

    def _on_rollback_prepared(self, message: RollbackPrepared) -> None:
        self._require_idle("Rollback Prepared")
        txn = self._prepared.pop(message.gid, None)
        if txn is not None:
            txn.buffer.close()
            self.aborted_transactions += 1

    def _require_idle(self, what: str) -> None:
        if self._current is not None:
            raise AssemblyError(f"{what} while transaction {self._current.xid} is still open (no Commit seen)")
        if self._stream is not None:
            raise AssemblyError(f"{what} inside the streamed block of xid {self._stream.xid}")

    def _take_current(self, what: str) -> _Open:
        txn = self._current
        if txn is None:
            raise AssemblyError(f"{what} without a Begin")
        self._current = None
        return txn


_HANDLERS: dict[type, Callable[[Assembler, Any], Event | None]] = {
    Relation: Assembler._on_schema,
    Type: Assembler._on_schema,
    LogicalMessage: Assembler._on_message,
    Begin: Assembler._on_begin,
    Origin: Assembler._on_origin,
    Commit: Assembler._on_commit,
    StreamStart: Assembler._on_stream_start,
    StreamStop: Assembler._on_stream_stop,
    StreamCommit: Assembler._on_stream_commit,
    StreamAbort: Assembler._on_stream_abort,
    BeginPrepare: Assembler._on_begin_prepare,
    Prepare: Assembler._on_prepare,
    StreamPrepare: Assembler._on_stream_prepare,
    CommitPrepared: Assembler._on_commit_prepared,
    RollbackPrepared: Assembler._on_rollback_prepared,
}
