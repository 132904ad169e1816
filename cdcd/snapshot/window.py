"""One incremental-snapshot chunk while its window is open: the DBLog algorithm. Pure.

A chunk is read in its own snapshot S (``pg_current_snapshot()`` is recorded with it), then a high watermark is
written to the WAL. Every transaction the stream emits from then until that watermark arrives may be newer than
what S saw, so each chunk row whose key such a transaction touched is dropped: the stream already carries a
state at least as new. An UPDATE that left unchanged TOASTed values out is merged into the chunk row instead
(the stream does not carry the whole row). A TRUNCATE of the table in the window drops them all. At the
watermark the rows left are emitted, positioned after everything S could see and before everything it could not.

Transactions the stream emitted *before* the chunk was read must all be visible in S. PostgreSQL writes a
commit record before the transaction becomes visible to new snapshots, so a transaction just emitted can still
be invisible to S: ``admits`` checks the recently emitted transaction ids, and such a chunk is read again.

**Read-only windows** (``snapshot.read_only``) write nothing: no watermark. In the chunk's transaction, right
after S is taken, the reader records L, the server's WAL position then (``cdcd.snapshot.position``: the insert
position on a primary, the replay position on a standby). The window closes once the stream has come to L
(``reached``), and only transactions S did not see touch it (``concerns``). Why the guarantees hold:

* Every transaction S saw has its commit record ending at or before L. A primary inserts the commit record
  before the transaction leaves the proc array (becomes visible), a standby replays it before; L is read after
  S. (The write position, ``pg_current_wal_lsn``, would not do: an asynchronous commit is visible before its
  record is written out.)
* The walsender decodes the WAL in order and sends each transaction at its commit, so a frame it sends for
  position p (a keepalive's end of WAL, the position of a record it decoded: a commit's end, a change's, a
  message's) comes after every transaction whose commit ends at or before p. Once the stream came to L, every
  transaction S saw has been emitted, before the chunk's rows: no row is shown before a change it already holds.
* A transaction emitted while the window is open that S did not see (its xid at or past xmax, or in xip) may
  hold a newer state than the chunk row it touches, and is emitted before the rows: that row is dropped (or
  merged, for unchanged TOAST), as with watermarks. The xid a commit carries is the top-level one, also for
  streamed and prepared transactions, and subtransactions commit with it, so it is what S is asked about (its
  xip lists top-level xids only). A transaction S saw is left alone: the chunk row holds its change already.
* Every transaction after L is invisible to S: closing late (after more frames) only drops rows the stream
  carries anyway, and every such transaction emitted after the rows follows them correctly.
* Transactions emitted before the window opened: ``admits``, as with watermarks.
* On a hot standby ``pg_current_snapshot()`` shows no running transaction (PostgreSQL keeps the primary's in the
  snapshot's subxip), so which of the transactions between xmin and xmax S saw is not known: each of them touches
  the window (``SnapshotXids.unseen``). Dropping a row for a transaction S saw is safe: that transaction is emitted
  in the window, before the rows, and the last such change to the row holds the state S read. ``admits`` needs no
  such care there: the standby replays a commit (and its snapshots see it) before its walsender decodes it.

Debezium's read-only mode for PostgreSQL (``PostgresReadOnlyIncrementalSnapshotChangeEventSource``) takes
``pg_current_snapshot()`` before and after the chunk and opens and closes the window by comparing each event's
transaction id with their xmin and xmax, dropping rows for every event in it. A transaction id is given at
a transaction's first write, not in commit order, and says nothing about how far the stream has come: when the
stream lags, a transaction S saw can still be on its way when an event (or a heartbeat) with a low id closes
Debezium's window. cdcd bounds the window by a WAL position instead, tests each emitted transaction against S
itself, and closes an idle window by the server's keepalive, where Debezium needs heartbeat events. Debezium
also calls ``pg_current_xact_id()`` when a snapshot starts, which assigns a transaction id (a commit record on a
primary, an error on a standby): cdcd's read-only chunks run in ``READ ONLY`` transactions and write none.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

from cdcd.pgoutput.messages import UNCHANGED_TOAST, Change, Relation, Row, RowChange, Truncate
from cdcd.pgtypes import codec
from cdcd.snapshot.xids import SnapshotXids

KeyOf = Callable[[Row], Hashable]


def key_function(relation: Relation, key_columns: tuple[str, ...]) -> KeyOf:
    """Normalized key of a row of ``relation``: its ``key_columns`` parsed (``cdcd.pgtypes``), so a text value
    (COPY, the stream's text mode) and a binary one (the stream's binary mode) of the same key compare equal."""
    names = [c.name for c in relation.columns]
    missing = [k for k in key_columns if k not in names]
    if missing:
        raise KeyError(f"{relation.schema}.{relation.name} has no column {', '.join(missing)}")
    picks = []
    for k in key_columns:
        i = names.index(k)
        parsers = codec(relation.columns[i].type_oid)
        picks.append((i, parsers.from_text, parsers.from_binary))

    def key(row: Row) -> Hashable:
        out: list[object] = []
        for i, from_text, from_binary in picks:
            v = row[i]
            if v is None or v is UNCHANGED_TOAST:
                out.append(v)
            else:
                datum = from_text(v) if isinstance(v, str) else from_binary(v)
                out.append(repr(datum) if isinstance(datum, (dict, list)) else datum)
        return tuple(out)

    return key


@dataclass
class ChunkWindow:
    """A chunk of ``table`` waiting for its high watermark ``watermark``, or read-only (``until`` set) for the
    stream to pass WAL position ``until``, touched only by transactions invisible in ``snapshot``."""

    table: tuple[str, str]  # (schema, name) as the stream's Relation messages name it
    key_columns: tuple[str, ...]
    watermark: str
    rows: dict[Hashable, Row]
    relation: Relation  # the layout of ``rows``
    dropped: int = 0
    merged: int = 0
    invalid: bool = False  # a key column disappeared from the table: the chunk must be read again
    until: int | None = None  # read-only: the WAL position when the chunk was read (no watermark is written)
    snapshot: SnapshotXids | None = None  # read-only: the chunk's snapshot (transactions it saw leave it alone)
    _keys: dict[int, tuple[Relation, KeyOf]] = field(default_factory=dict)

    @classmethod
    def open(
        cls,
        table: tuple[str, str],
        relation: Relation,
        key_columns: tuple[str, ...],
        rows: Iterable[Row],
        watermark: str,
        *,
        until: int | None = None,
        snapshot: SnapshotXids | None = None,
    ) -> ChunkWindow:
        """``until`` and ``snapshot`` (both or neither): a read-only window."""
        if (until is None) != (snapshot is None):
            raise ValueError("a read-only window needs both its WAL position and its snapshot")
        key = key_function(relation, key_columns)
        window = cls(table, key_columns, watermark, {key(r): r for r in rows}, relation, until=until, snapshot=snapshot)
        window._keys[relation.relation_id] = (relation, key)
        return window

    @staticmethod
    def admits(snapshot: SnapshotXids, recent_xids: Iterable[int]) -> bool:
        """False when a transaction already emitted was not visible to the chunk's snapshot (read it again)."""
        return not any(snapshot.invisible(x) for x in recent_xids)

    def concerns(self, xid: int) -> bool:
        """Whether the changes of committed transaction ``xid`` must be shown to ``observe``: every one's, unless
        read-only, where only those the chunk's snapshot did not see."""
        return self.snapshot is None or self.snapshot.unseen(xid)

    def reached(self, position: int) -> bool:
        """Whether the stream, having come to ``position`` (everything committed before it emitted), closes this
        window: a read-only one at its WAL position; one with a watermark never (its watermark does)."""
        return self.until is not None and position >= self.until

    def observe(self, change: Change) -> None:
        """A change the stream emits inside the window (call for every change of every emitted transaction)."""
        if change.__class__ is RowChange:
            assert isinstance(change, RowChange)
            rel = change.relation
            if (rel.schema, rel.name) != self.table or not self.rows:
                return
            try:
                key = self._key(rel)
            except KeyError:
                self.invalid = True
                return
            if change.new is not None and UNCHANGED_TOAST in change.new and self._merge(change, key):
                return
            for row in (change.old, change.new):
                if row is not None and self.rows.pop(key(row), None) is not None:
                    self.dropped += 1
        elif change.__class__ is Truncate:
            assert isinstance(change, Truncate)
            if any((r.schema, r.name) == self.table for r in change.relations):
                self.dropped += len(self.rows)
                self.rows.clear()

    def _merge(self, change: RowChange, key: KeyOf) -> bool:
        """An UPDATE that left TOASTed values out does not carry the whole row, so the chunk row is not dropped:
        it becomes the updated row, the values left out taken from the chunk (no later change to them was
        emitted, or it would have carried them). False when that cannot be done: drop as usual."""
        new = change.new
        assert new is not None
        k = key(new)
        current = self.rows.get(k)
        if current is None or (change.old is not None and key(change.old) != k):
            return False
        if change.relation.columns != self.relation.columns:
            self.invalid = True  # a different layout than the chunk's rows: read the chunk again
            return True
        self.rows[k] = tuple(old if v is UNCHANGED_TOAST else v for v, old in zip(new, current, strict=True))
        self.merged += 1
        return True

    def _key(self, relation: Relation) -> KeyOf:
        cached = self._keys.get(relation.relation_id)
        if cached is None or cached[0] is not relation:
            cached = self._keys[relation.relation_id] = (relation, key_function(relation, self.key_columns))
        return cached[1]
