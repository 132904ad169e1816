"""cdcd's per-change path without a server: decode, assemble (in memory and spilling), JSON-lines sink.

Builds realistic pgoutput Insert messages (the bytes PostgreSQL sends) for a 4-column and a 20-column
table, then times each stage with ``time.perf_counter`` over several repetitions and prints the best and
the median, as rows/s and µs/row:

* ``decode``            ``cdcd.pgoutput.Decoder.decode`` of every message
* ``decode+assemble``   the same fed to ``cdcd.assembly.Assembler`` with a pool too large to spill
* ``  ...spilling``     the same with a small memory limit (``--spill-limit``): spilled bytes and MiB/s
* ``replay spill``      iterating the spilled transaction's changes back (marshal from the spill file)
* ``jsonl sink``        ``JsonLinesSink.write_transaction`` of an assembled transaction to /dev/null
* ``full path``         XLogData frames through ``ReplicationCore.frame`` (header parse, decode, assemble with
                        cdcd's default 64 MiB limit, sink to /dev/null): what ``cdcd tail`` does per change,
                        minus the socket
* ``frame→records``     the same frames through ``ReplicationCore.frame`` and ``EventShaper`` (Debezium rules,
                        Avro key and envelope, transaction topic on) to a function that counts the Kafka
                        records: what ``cdcd run`` does per change, minus the socket and the producer
* ``1-row txns``        as many one-row transactions (Begin, Insert, Commit) to records, handed over 300 frames
                        at a time as reads return them: through the core and the shaper (``stages``), and,
                        compiled, through the lane first (``lane``, ``cdcd.replication.lane``); µs/row is
                        µs per transaction

Each stage runs with the compiled row stage (cdcd._native) and with the Python reference alone (``--impl``).

The garbage collector stays on (as in cdcd; ``--no-gc`` turns it off to show its share);
``gc.collect()`` runs before each timed repetition.

Run from the repository root::

    .venv/bin/python benchmarks/core.py                  # 200,000 rows per table, 5 repetitions
    .venv/bin/python benchmarks/core.py --rows 20000 --repeat 3   # quick
    .venv/bin/python benchmarks/core.py --streamed       # changes inside a streamed block (carry an Xid)
    .venv/bin/python benchmarks/core.py --impl native    # only the compiled row stage

Exits non-zero if any stage produces the wrong number of changes or lines.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import cdcd.rowstage
from cdcd.assembly import Assembler, BufferPool
from cdcd.batches import Buffered, Shaped, Transaction
from cdcd.config import parse_size
from cdcd.ledger import Ledger
from cdcd.pgoutput import Decoder
from cdcd.plan import Plans
from cdcd.replication.core import Event, ReplicationCore, Write
from cdcd.replication.lane import Lane, carry_out
from cdcd.shaping import EventShaper
from cdcd.sink.jsonl import JsonLinesSink

XID = 7_654_321
BASE_LSN = 0x1_6B37_4800
PG_TS = 768_000_000_000_000  # 2024-05-03, µs since 2000-01-01
HUGE = 1 << 62

# (name, type oid, is key, value for row i) -- values in PostgreSQL's text form
ColumnSpec = tuple[str, int, bool, Callable[[int], str | None]]

TABLE_4: list[ColumnSpec] = [
    ("id", 23, True, str),
    ("v", 25, False, lambda i: f"{i * 2654435761 & 0xFFFFFFFF:08x}{i:024x}"),  # md5-like, 32 chars
    ("n", 23, False, lambda i: str(i % 1000)),
    ("ts", 1184, False, lambda i: f"2024-05-03 12:{i // 60 % 60:02d}:{i % 60:02d}.{i % 1_000_000:06d}+00"),
]

TABLE_20: list[ColumnSpec] = [
    ("id", 20, True, lambda i: str(1_000_000_000 + i)),
    ("customer_id", 20, False, lambda i: str(i * 7 % 100_003)),
    ("status", 25, False, lambda i: ("pending", "paid", "shipped", "delivered")[i % 4]),
    ("amount", 1700, False, lambda i: f"{i % 100_000}.{i % 100:02d}"),
    ("currency", 1042, False, lambda i: ("EUR", "USD", "GBP")[i % 3]),
    ("created_at", 1184, False, lambda i: f"2024-05-03 12:{i // 60 % 60:02d}:{i % 60:02d}.{i % 999_983:06d}+00"),
    ("updated_at", 1184, False, lambda i: f"2024-05-04 08:{i // 60 % 60:02d}:{i % 60:02d}.{i % 999_979:06d}+00"),
    ("note", 25, False, lambda i: f"order {i} left at the front door, customer asked for a call first"),
    ("gift", 16, False, lambda i: "t" if i % 5 == 0 else "f"),
    ("qty", 23, False, lambda i: str(i % 12 + 1)),
    ("unit_price", 1700, False, lambda i: f"{i % 997}.{i % 89:02d}"),
    ("sku", 1043, False, lambda i: f"SKU-{i % 50_000:06d}-{i % 7}"),
    ("email", 25, False, lambda i: f"customer{i * 7 % 100_003}@example.com"),
    ("country", 1042, False, lambda i: ("DE", "FR", "GB", "US", "NL")[i % 5]),
    ("city", 25, False, lambda i: ("Berlin", "Paris", "London", "New York", "Amsterdam")[i % 5]),
    ("zip", 25, False, lambda i: f"{10_000 + i % 89_999}"),
    ("score", 701, False, lambda i: repr(i / 7919)),
    ("tags", 1009, False, lambda i: "{web,promo}" if i % 3 else "{app}"),
    ("version", 23, False, lambda i: str(i % 17 + 1)),
    ("deleted_at", 1184, False, lambda i: None),
]

_u8 = struct.Struct(">B").pack
_i16 = struct.Struct(">h").pack
_i32 = struct.Struct(">i").pack
_u32 = struct.Struct(">I").pack
_u64 = struct.Struct(">Q").pack
_i64 = struct.Struct(">q").pack
_XLOG = struct.Struct(">cQQq")


@dataclass
class Workload:
    """The wire messages of one transaction inserting ``rows`` rows into one table."""

    label: str
    columns: int
    rows: int
    streamed: bool
    head: list[bytes]  # Begin, or Stream Start
    relation: bytes  # sent inside the transaction, before its first change (as PostgreSQL does)
    inserts: list[bytes]
    tail: list[bytes]  # Commit, or Stream Stop + Stream Commit
    insert_bytes: int = 0
    frames: list[bytes] = field(default_factory=list)  # head + inserts + tail as XLogData frames
    small: list[bytes] = field(default_factory=list)  # each insert in a transaction of its own, as XLogData frames

    def messages(self) -> list[bytes]:
        return [*self.head, self.relation, *self.inserts, *self.tail]

    def lsn(self, index: int) -> int:
        return BASE_LSN + 64 * index


def _cstring(text: str) -> bytes:
    return text.encode() + b"\0"


def _tuple_data(values: Sequence[str | None]) -> bytes:
    out = [_i16(len(values))]
    for value in values:
        if value is None:
            out.append(b"n")
        else:
            data = value.encode()
            out.append(b"t" + _i32(len(data)) + data)
    return b"".join(out)


def build_workload(label: str, spec: list[ColumnSpec], rows: int, relation_id: int, streamed: bool) -> Workload:
    xid_part = _u32(XID) if streamed else b""
    columns = b"".join(_u8(1 if key else 0) + _cstring(name) + _u32(oid) + _i32(-1) for name, oid, key, _ in spec)
    relation = (
        b"R"
        + xid_part
        + _u32(relation_id)
        + _cstring("public")
        + _cstring(label.replace(" ", "_"))
        + b"d"
        + _i16(len(spec))
        + columns
    )
    prefix = b"I" + xid_part + _u32(relation_id) + b"N"
    makers = [make for _, _, _, make in spec]
    inserts = [prefix + _tuple_data([make(i) for make in makers]) for i in range(rows)]
    end = BASE_LSN + 64 * (rows + 4)
    if streamed:
        head = [b"S" + _u32(XID) + _u8(1)]
        tail = [b"E", b"c" + _u32(XID) + _u8(0) + _u64(end - 40) + _u64(end) + _i64(PG_TS)]
    else:
        head = [b"B" + _u64(end - 40) + _i64(PG_TS) + _u32(XID)]
        tail = [b"C" + _u8(0) + _u64(end - 40) + _u64(end) + _i64(PG_TS)]
    workload = Workload(label, len(spec), rows, streamed, head, relation, inserts, tail)
    workload.insert_bytes = sum(map(len, inserts))
    workload.frames = [
        _XLOG.pack(b"w", workload.lsn(i), workload.lsn(i), PG_TS) + m for i, m in enumerate(workload.messages())
    ]
    workload.small = [] if streamed else _one_row_transactions(relation, inserts)
    return workload


def _one_row_transactions(relation: bytes, inserts: list[bytes]) -> list[bytes]:
    frames, lsn = [], BASE_LSN
    for i, insert in enumerate(inserts):
        end = lsn + 200
        messages = [b"B" + _u64(end - 40) + _i64(PG_TS) + _u32(1000 + i), *([relation] if i == 0 else []), insert]
        messages.append(b"C" + _u8(0) + _u64(end - 40) + _u64(end) + _i64(PG_TS))
        frames += [_XLOG.pack(b"w", lsn + j * 8, lsn + j * 8, PG_TS) + m for j, m in enumerate(messages)]
        lsn = end + 8
    return frames


class Failure(RuntimeError):
    """A stage produced a wrong result."""


def _expect(what: str, got: int, want: int) -> None:
    if got != want:
        raise Failure(f"{what}: got {got}, expected {want}")


class NullRegistry:
    """Schema ids and topics for the shaper, without a registry or Kafka."""

    def schema_id(self, subject: str, schema: object) -> int:
        return 1

    def ensure_topic(self, topic: str) -> None:
        return None


def assemble(workload: Workload, decoder: Decoder, pool: BufferPool) -> Transaction:
    """Decode and feed every message; return the committed transaction."""
    assembler = Assembler(pool)
    feed = assembler.feed
    decode = decoder.decode
    event = None
    for index, message in enumerate(workload.messages()):
        event = feed(decode(message, BASE_LSN + 64 * index))
    if not isinstance(event, Transaction):
        raise Failure(f"the last message gave {event!r}, not a Transaction")
    _expect("changes in the transaction", event.change_count, workload.rows)
    return event


@dataclass
class Result:
    label: str
    stage: str
    rows: int
    times: list[float]
    extra: str = ""

    @property
    def best(self) -> float:
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)


GC_ENABLED = True  # --no-gc turns the collector off during the timed repetitions


def timed(repeat: int, run: Callable[[], float | None]) -> list[float]:
    """Run ``repeat`` times; ``run`` returns its own elapsed time, or None to be timed as a whole."""
    times = []
    for _ in range(repeat):
        gc.collect()
        if not GC_ENABLED:
            gc.disable()
        try:
            start = time.perf_counter()
            elapsed = run()
            times.append(elapsed if elapsed is not None else time.perf_counter() - start)
        finally:
            gc.enable()
    return times


class Stages:
    """The timed stages for one workload; each method returns one or more Results."""

    def __init__(self, workload: Workload, repeat: int, spill_dir: Path, devnull: BinaryIO, native: bool) -> None:
        self.workload = workload
        self.repeat = repeat
        self.spill_dir = spill_dir
        self.devnull = devnull
        self.native = native
        self.stage = cdcd.rowstage.STAGE if native else cdcd.rowstage.PYTHON

    def result(self, stage: str, times: list[float], extra: str = "") -> Result:
        label = f"{self.workload.label} {'native' if self.native else 'python'}"
        return Result(label, stage, self.workload.rows, times, extra)

    def decoder(self) -> Decoder:
        return Decoder("utf-8", stage=self.stage)

    def decode(self) -> Result:
        workload = self.workload

        def run() -> float:
            decode = self.decoder().decode
            for message in [*workload.head, workload.relation]:
                decode(message)
            lsn = BASE_LSN
            start = time.perf_counter()
            for message in workload.inserts:
                decode(message, lsn)
            return time.perf_counter() - start

        return self.result("decode", timed(self.repeat, run))

    def assemble_in_memory(self) -> Result:
        def run() -> float:
            pool = BufferPool(HUGE, self.spill_dir)
            start = time.perf_counter()
            txn = assemble(self.workload, self.decoder(), pool)
            elapsed = time.perf_counter() - start
            _expect("bytes spilled with a huge memory limit", pool.spilled_bytes, 0)
            txn.release()
            return elapsed

        return self.result("decode+assemble (memory)", timed(self.repeat, run))

    def assemble_spilling(self, limit: int, in_memory: Result) -> list[Result]:
        """Decode and assemble under ``limit`` (timed), then replay the transaction's changes (timed apart)."""
        rows = self.workload.rows
        spilled: list[int] = []
        replay_times: list[float] = []

        def run() -> float:
            pool = BufferPool(limit, self.spill_dir)
            start = time.perf_counter()
            txn = assemble(self.workload, self.decoder(), pool)
            elapsed = time.perf_counter() - start
            spilled.append(pool.spilled_bytes)
            gc.collect()
            start = time.perf_counter()
            count = sum(1 for _ in txn.changes())
            replay_times.append(time.perf_counter() - start)
            _expect("changes replayed", count, rows)
            return elapsed

        times = timed(self.repeat, run)
        mib = spilled[0] / 2**20
        extra_us = (min(times) - in_memory.best) / rows * 1e6
        note = f"spilled {mib:.1f} MiB, {mib / min(times):.0f} MiB/s of stage time; {extra_us:+.2f} µs/row vs memory"
        return [
            self.result(f"decode+assemble (spill, {limit / 2**20:g} MiB)", times, note),
            self.result("replay spilled changes", replay_times, f"{mib / min(replay_times):.0f} MiB/s read"),
        ]

    def sink(self) -> Result:
        def run() -> float:
            txn = assemble(self.workload, self.decoder(), BufferPool(HUGE, self.spill_dir))
            sink = JsonLinesSink(self.devnull)
            gc.collect()
            start = time.perf_counter()
            sink.write_transaction(txn, txn.changes(), Ledger())
            elapsed = time.perf_counter() - start
            _expect("lines written", sink.rows_written, self.workload.rows)
            return elapsed

        return self.result("jsonl sink (/dev/null)", timed(self.repeat, run))

    def drive(self, limit: int, write: Callable[[Transaction, Iterator[Buffered]], None]) -> None:
        """Every frame through ``ReplicationCore.frame``; each ``Write`` event to ``write``."""
        core = ReplicationCore(self.decoder(), Assembler(BufferPool(limit, self.spill_dir)), Ledger())
        frame = core.frame
        for data in self.workload.frames:
            event = frame(data)
            if event.__class__ is Write:
                assert isinstance(event, Write)
                write(event.transaction, event.changes)

    def full_path(self, limit: int) -> Result:
        """The per-frame work of the replication loop: ``ReplicationCore.frame`` on every frame, its ``Write``
        events handed to the sink."""

        def run() -> None:
            sink = JsonLinesSink(self.devnull)
            progress = Ledger()
            self.drive(limit, lambda txn, changes: sink.write_transaction(txn, changes, progress))
            _expect("lines written", sink.rows_written, self.workload.rows)

        return self.result(f"full path frame→sink ({limit / 2**20:g} MiB limit)", timed(self.repeat, run))

    def records(self, limit: int) -> Result:
        """What ``cdcd run`` does per frame before the producer: core, Debezium shaping, Avro encoding."""
        count = [0]

        def emit(topic: str, key: bytes | None, value: bytes | None, headers: object) -> None:
            count[0] += 1

        def run() -> None:
            count[0] = 0
            shaper = EventShaper("bench", NullRegistry(), stage=self.stage)
            shaper.start_session("bench", {}, Plans())
            self.drive(limit, lambda txn, changes: shaper.transaction(txn, changes, emit))
            _expect("Kafka records (rows + BEGIN + END)", count[0], self.workload.rows + 2)

        return self.result(f"frame→records ({limit / 2**20:g} MiB limit)", timed(self.repeat, run))

    def one_row_transactions(self, limit: int) -> list[Result]:
        """One-row transactions to records, 300 frames per read: through the stages, and through the lane."""
        count = [0]

        def emit(topic: str, key: bytes | None, value: bytes | None, headers: object) -> None:
            count[0] += 1

        def run(lane: bool) -> None:
            count[0] = 0
            shaper = EventShaper("bench", NullRegistry(), stage=self.stage)
            shaper.start_session("bench", {}, Plans())
            core = ReplicationCore(self.decoder(), Assembler(BufferPool(limit, self.spill_dir)), Ledger())

            def act(event: Event) -> bool:
                if isinstance(event, Write):
                    shaper.transaction(event.transaction, event.changes, emit)
                elif isinstance(event, Shaped):
                    count[0] += len(event.records)
                return False

            frames, taking = self.workload.small, Lane(core, shaper) if lane else None
            for start in range(0, len(frames), 300):
                read = frames[start : start + 300]
                if taking is not None:
                    carry_out(read, core, act, taking)
                else:
                    for data in read:
                        event = core.frame(data)
                        if event is not None:
                            act(event)
            _expect("Kafka records (BEGIN, row, END per transaction)", count[0], 3 * self.workload.rows)

        results = [self.result("1-row txns frame→records (stages)", timed(self.repeat, lambda: run(False)))]
        if self.native and Lane.available(EventShaper("bench", NullRegistry()), self.decoder()):
            results.append(self.result("1-row txns frame→records (lane)", timed(self.repeat, lambda: run(True))))
        return results


def bench_workload(  # noqa: PLR0917 - the command line's choices
    workload: Workload, repeat: int, spill_limit: int, full_limit: int, spill_dir: Path, native: bool
) -> list[Result]:
    with open("/dev/null", "wb") as devnull:
        stages = Stages(workload, repeat, spill_dir, devnull, native)
        in_memory = stages.assemble_in_memory()
        return [
            stages.decode(),
            in_memory,
            *stages.assemble_spilling(spill_limit, in_memory),
            stages.sink(),
            stages.full_path(full_limit),
            stages.records(full_limit),
            *([] if workload.streamed else stages.one_row_transactions(full_limit)),
        ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=200_000, help="rows per table (default 200000)")
    parser.add_argument("--repeat", type=int, default=5, help="timed repetitions per stage (default 5)")
    parser.add_argument("--streamed", action="store_true", help="wrap the changes in a streamed block")
    parser.add_argument("--spill-limit", default="8MiB", help="memory limit of the spilling stage (default 8MiB)")
    parser.add_argument("--full-limit", default="64MiB", help="memory limit of the full path (default 64MiB)")
    parser.add_argument("--tables", default="4,20", help="which tables: 4, 20 or 4,20 (default)")
    parser.add_argument("--no-gc", action="store_true", help="disable the garbage collector while timing")
    parser.add_argument("--impl", default="native,python", help="native, python or native,python (default)")
    args = parser.parse_args(argv)
    global GC_ENABLED  # noqa: PLW0603 -- a command-line switch
    GC_ENABLED = not args.no_gc
    if args.rows < 1 or args.repeat < 1:
        parser.error("--rows and --repeat must be >= 1")
    spill_limit, full_limit = parse_size(args.spill_limit), parse_size(args.full_limit)
    specs = {"4": TABLE_4, "20": TABLE_20}
    chosen = [t.strip() for t in args.tables.split(",")]
    if not chosen or any(t not in specs for t in chosen):
        parser.error("--tables takes 4, 20 or 4,20")
    impls = [i.strip() for i in args.impl.split(",")]
    if not impls or any(i not in ("native", "python") for i in impls):
        parser.error("--impl takes native, python or native,python")
    if "native" in impls and cdcd.rowstage.STAGE.rows is None:
        parser.error(f"cdcd._native is not loaded ({cdcd.rowstage.VARIABLE}={cdcd.rowstage.IMPL}, or not built)")

    print(
        f"cdcd core benchmark: python {sys.version.split()[0]}, {args.rows:,} rows per table, "
        f"best/median of {args.repeat}, {'streamed block' if args.streamed else 'plain transaction'}, "
        f"gc {'off' if args.no_gc else 'on'}"
    )
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="cdcd-bench-core-") as tmp:
        for relation_id, key in enumerate(chosen, start=16_384):
            spec = specs[key]
            started = time.perf_counter()
            workload = build_workload(f"{len(spec)} col", spec, args.rows, relation_id, args.streamed)
            print(
                f"built {workload.label}: {args.rows:,} Insert messages, "
                f"{workload.insert_bytes / args.rows:.0f} B/message, {workload.insert_bytes / 2**20:.1f} MiB, "
                f"in {time.perf_counter() - started:.1f} s"
            )
            try:
                for impl in impls:
                    native = impl == "native"
                    results += bench_workload(workload, args.repeat, spill_limit, full_limit, Path(tmp), native)
            except Failure as exc:
                print(f"FAILED ({workload.label}): {exc}", file=sys.stderr)
                return 1
            del workload
            gc.collect()

    print()
    header = f"{'table':<14} {'stage':<38} {'best s':>8} {'median s':>9} {'rows/s':>11} {'µs/row':>8}  notes"
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r.label:<14} {r.stage:<38} {r.best:>8.3f} {r.median:>9.3f} {r.rows / r.best:>11,.0f} "
            f"{r.best / r.rows * 1e6:>8.2f}  {r.extra}"
        )
    print("rows/s and µs/row from the best repetition")
    return 0


if __name__ == "__main__":
    sys.exit(main())
