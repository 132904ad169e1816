"""The compiled lane against the Python stages it stands for: the same frames (captured pgoutput streams of
PG 14/15/17 and generated runs of small transactions) through ``ReplicationCore.frame`` + ``EventShaper`` and
through the lane (what it leaves, through the core) give the same records, byte for byte, and the same counts,
positions and xids."""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

import cdcd.replication.lane as lane_module
from cdcd.assembly import Assembler, BufferPool
from cdcd.batches import Shaped
from cdcd.columns import NO_RULES, ColumnRules, Mask, TableColumns
from cdcd.config import Publication
from cdcd.filters import FilterPlan, RowFilter
from cdcd.filters.messages import MESSAGES, MessageFilter
from cdcd.ledger import Ledger
from cdcd.patterns import Selection
from cdcd.pgoutput import DecodeError, Decoder
from cdcd.pgoutput.messages import (
    Begin,
    Column,
    Commit,
    LogicalMessage,
    Message,
    Op,
    Relation,
    Row,
    RowChange,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
)
from cdcd.plan import Plans
from cdcd.replication.core import Event, ReplicationCore, Write
from cdcd.replication.lane import MAX_CHANGES, Lane, carry_out
from cdcd.rowstage import PYTHON, STAGE
from cdcd.shaping import EventShaper
from tests.capture_pgoutput import FixtureMessage, fixture_paths, load_fixture
from tests.pgoutput_encoder import encode
from tests.unit.test_message_prefixes import _frames as message_frames
from tests.unit.test_replication_core import xlogdata
from tests.unit.test_shaping import NOW_US, Registry

# The lane is compiled code: without cdcd._native (CDCD_IMPL=python: the Makefile leaves this file out) these fail.
assert STAGE.lane is not None, "the row stage has no lane (CDCD_IMPL=python)"

FIXTURES = [load_fixture(path) for path in fixture_paths()]
STREAMS = [
    (f"{fx.path.stem}-{c.scenario}-{c.proto}", fx.stream(c.proto, c.scenario), c.options.get("streaming") == "parallel")
    for fx in FIXTURES
    for c in fx.captures
]
CASES = [pytest.param(messages, parallel, id=name) for name, messages, parallel in STREAMS]
ITEMS = Relation(
    16390, "shop", "items", "d",
    (Column("id", 23, -1, True), Column("v", 25, -1, False), Column("n", 20, -1, False), Column("b", 17, -1, False)),
)  # fmt: skip
NOTES = Relation(16391, "public", "notes", "f", (Column("id", 23, -1, False), Column("t", 25, -1, False)))


@dataclass
class Outcome:
    records: list[tuple[str, bytes | None, bytes | None]] = field(default_factory=list)
    laned: int = 0  # transactions the lane made
    error: str | None = None  # what stopped the frames (a value the encoder cannot convert, ...)


def stages(
    tmp_path: Path,
    parallel: bool,
    rowfilter: RowFilter | None = None,
    early: bool = False,
    limit: int = 1 << 20,
    *,
    debezium: bool = False,
    compiled: bool = True,
    columns: ColumnRules = NO_RULES,
) -> tuple[ReplicationCore, EventShaper]:
    """The core and the shaper; ``early``: changes encoded as they arrive, as the loop wires them with the lane;
    ``limit``: the buffers' memory (0: every change spilled at once); ``debezium``: Debezium's envelope;
    ``compiled``: False for the Python shaper (the specification); ``columns``: the column rules."""
    decoder = Decoder(parallel_streaming=parallel, stage=STAGE)
    core = ReplicationCore(decoder, Assembler(BufferPool(limit, tmp_path)), Ledger(), rowfilter=rowfilter)
    stage = STAGE if compiled else PYTHON
    shaper = EventShaper("cdc", Registry(), clock_us=lambda: NOW_US, stage=stage, debezium=debezium, columns=columns)
    shaper.start_session("shop", decoder.types, rowfilter.plans if rowfilter else Plans())
    if early:
        core.assembler.early = shaper.early
    return core, shaper


def through(core: ReplicationCore, shaper: EventShaper, frames: list[bytes], lane: Lane | None) -> Outcome:
    """The loop's work without I/O: the frames through the lane and the core (``carry_out``, as the loop does)
    or through the core alone; records collected."""
    out = Outcome()

    def emit(topic: str, key: bytes | None, value: bytes | None, headers: object) -> None:
        assert headers is None or topic.endswith(".items") or topic.endswith(".t"), headers
        out.records.append((topic, key, value))

    def act(event: Event) -> bool:
        if isinstance(event, Write):
            shaper.transaction(event.transaction, event.changes, emit)
        elif isinstance(event, Shaped):
            out.records.extend(event.records)
            out.laned += event.transactions
        return False

    try:
        if lane is None:
            for frame in frames:
                event = core.frame(frame)
                if event is not None:
                    act(event)
        else:
            carry_out(frames, core, act, lane)
    except Exception as exc:  # compared between both runs
        out.error = f"{type(exc).__name__}: {exc}"
    return out


def compare(
    tmp_path: Path,
    frames: list[bytes],
    parallel: bool = False,
    publications: list[Publication] | None = None,
    debezium: bool = False,
    *,
    columns: ColumnRules = NO_RULES,
) -> Outcome:
    """The frames through the core alone, and compared with it: through the lane and the core with changes
    encoded as they arrive (as the loop runs them), and with encoded changes alone, every change spilled.
    ``publications``: row filters applied by cdcd (None: none); ``debezium``: in Debezium's envelope, against
    the Python shaper (its specification); ``columns``: column rules, against the Python shaper too. Returns the
    lane's outcome."""
    results = []
    for name, use_lane, early, limit in MODES:
        rowfilter = None
        if publications is not None:
            rowfilter = RowFilter(FilterPlan(publications), "publish", lambda t: [], None, Plans())
        compiled = not (debezium or columns.tables) or name != MODES[0][0]
        core, shaper = stages(
            tmp_path / name, parallel, rowfilter, early, limit, debezium=debezium, compiled=compiled, columns=columns
        )
        out = through(core, shaper, frames, Lane(core, shaper) if use_lane else None)
        results.append((out, core, shaper))
    python, pcore, pshaper = results[0]
    assert pcore.stats.laned == 0
    for out, core, shaper in results[1:]:
        assert out.records == python.records
        assert out.error == python.error
        assert shaper.events == pshaper.events
        assert shaper.last_commit_lsn == pshaper.last_commit_lsn
        assert core.ledger.received_lsn == pcore.ledger.received_lsn
        assert list(core.recent_xids) == list(pcore.recent_xids)
        assert (core.stats.transactions, core.stats.changes) == (pcore.stats.transactions, pcore.stats.changes)
        assert core.stats.outcomes == pcore.stats.outcomes
        assert core.stats.laned == out.laned
    return results[1][0]


# (name, through the lane, changes encoded as they arrive, buffer memory): the first is the reference
MODES = [("core", False, False, 1 << 20), ("lane", True, True, 1 << 20), ("encoded, spilled", False, True, 0)]


@pytest.mark.parametrize(("messages", "parallel"), CASES)
def test_captured_streams_give_the_same_records(tmp_path: Path, messages: list[FixtureMessage], parallel: bool) -> None:
    compare(tmp_path, [xlogdata(m.lsn, m.data) for m in messages], parallel)


@pytest.mark.parametrize(("messages", "parallel"), CASES)
def test_captured_streams_give_the_same_records_in_debeziums_envelope(
    tmp_path: Path, messages: list[FixtureMessage], parallel: bool
) -> None:
    """The compiled Debezium envelope (rows, early encoding, the lane) against the Python one, its spec."""
    compare(tmp_path, [xlogdata(m.lsn, m.data) for m in messages], parallel, debezium=True)


def plain_small(messages: list[FixtureMessage]) -> int:
    """Plain transactions of nothing but Insert, Update and Delete messages, and not too many."""
    count = 0
    body: list[bytes] | None = None
    for m in messages:
        kind = m.data[:1]
        if kind == b"B":
            body = []
        elif kind == b"C":
            count += body is not None and set(body) <= {b"I", b"U", b"D"} and len(body) <= MAX_CHANGES
            body = None
        elif body is not None:
            body.append(kind)
    return count


TEXT_CASES = [
    pytest.param(messages, parallel, id=name)
    for name, messages, parallel in STREAMS
    if "binary" not in name and plain_small(messages)
]


@pytest.mark.parametrize(("messages", "parallel"), TEXT_CASES)
def test_the_lane_takes_the_captured_plain_transactions(
    tmp_path: Path, messages: list[FixtureMessage], parallel: bool
) -> None:
    """Not a test that passes by leaving everything to Python: the captured transactions of plain row changes
    are laned, but for those it must leave (here: a key change). (The binary-format captures stop at a value
    the encoder refuses, in both runs.)"""
    expected = plain_small(messages)
    laned = compare(tmp_path, [xlogdata(m.lsn, m.data) for m in messages], parallel).laned
    assert expected - 1 <= laned <= expected


def small_transactions(seed: int, count: int) -> tuple[list[bytes], int]:
    """Runs of small transactions on two tables (inserts, updates with and without key changes, deletes, TOAST
    left out, NULLs), a keepalive here and there, a Relation sent again midway; and how many were plain ones."""
    rng = random.Random(seed)
    lsn, xid, frames, ids = 0x1000000, 700, [], list(range(1, 40))
    messages: list[tuple[int, object]] = [(lsn, ITEMS), (lsn, NOTES)]
    for t in range(count):
        xid += 1
        begin_lsn = lsn
        body = []
        for _ in range(rng.choice((1, 1, 1, 2, 3, 8))):
            lsn += 0x40
            i = rng.choice(ids)
            blob = rng.choice((b"\x00\xff", None, ...))  # ...: unchanged TOAST
            row: Row = (str(i), rng.choice(("x", "ü€", "", None)), str(rng.randrange(-9, 9**12)), blob)
            kind = rng.random()
            if kind < 0.5:
                body.append((lsn, RowChange("insert", ITEMS, None, row, False, None, lsn, 0)))
            elif kind < 0.7:
                body.append((lsn, RowChange("update", ITEMS, None, row, False, None, lsn, 0)))
            elif kind < 0.75:  # a key change: left to the Python shaper
                old: Row | None = (str(i + 1000), None, None, None)
                body.append((lsn, RowChange("update", ITEMS, old, row, True, None, lsn, 0)))
            elif kind < 0.85:
                body.append((lsn, RowChange("delete", ITEMS, (str(i), None, None, None), None, True, None, lsn, 0)))
            else:
                note = (str(i), rng.choice(("n", None)))
                op: Op = rng.choice(("insert", "update", "delete"))
                old = note if op != "insert" else None
                body.append((lsn, RowChange(op, NOTES, old, None if op == "delete" else note, False, None, lsn, 0)))
        commit_lsn = lsn + 0x40
        lsn = commit_lsn + 0x40
        ts = 700_000_000_000_000 + t
        messages += [(begin_lsn, Begin(commit_lsn, ts, xid)), *body, (commit_lsn, Commit(0, commit_lsn, lsn, ts))]
        if t == count // 2:
            messages.append((lsn, ITEMS))
    for at, message in messages:
        frames.append(xlogdata(at, encode(message)))  # type: ignore[arg-type]
        if rng.random() < 0.02:
            frames.append(b"k" + struct.pack(">Qq?", at, 0, False))
    return frames, count


@pytest.mark.parametrize("seed", range(6))
def test_generated_small_transactions_give_the_same_records(tmp_path: Path, seed: int) -> None:
    frames, count = small_transactions(seed, 300)
    laned = compare(tmp_path, frames)
    assert laned.laned > count // 2


@pytest.mark.parametrize("seed", range(3))
def test_generated_small_transactions_in_debeziums_envelope(tmp_path: Path, seed: int) -> None:
    frames, count = small_transactions(seed, 300)
    laned = compare(tmp_path, frames, debezium=True)
    assert laned.laned > count // 2


@pytest.mark.parametrize("seed", range(2))
def test_frames_cut_anywhere_give_the_same_records(tmp_path: Path, seed: int) -> None:
    """The loop hands the lane what one read returned: a transaction may be cut by the batch's end."""
    frames, _ = small_transactions(seed, 60)
    rng = random.Random(seed)
    results = []
    for use_lane in (False, True):
        core, shaper = stages(tmp_path / str(use_lane), False, early=use_lane)
        lane = Lane(core, shaper) if use_lane else None
        out, start = Outcome(), 0
        while start < len(frames):
            stop = start + rng.randrange(1, 12)
            part = through(core, shaper, frames[start:stop], lane)
            out.records += part.records
            start = stop
        results.append(out.records)
    assert results[0] == results[1]


def test_a_filtered_table_is_left_to_python_and_the_others_to_the_lane(tmp_path: Path) -> None:
    """Row filters: transactions touching the filtered table go through the core (which filters them), the rest
    through the lane; with no rules for any table, everything plain goes through the lane."""
    frames, count = small_transactions(7, 200)
    items, notes = {"name": "shop.items"}, {"name": "public.notes", "where": "id > 20"}
    filtered = [Publication.model_validate({"name": "p", "tables": [items, notes]})]
    some = compare(tmp_path / "filtered", frames, publications=filtered).laned
    unfiltered = [Publication.model_validate({"name": "p", "tables": [items, {"name": "public.notes"}]})]
    every = compare(tmp_path / "unfiltered", frames, publications=unfiltered).laned
    assert 0 < some < every
    assert every > count // 2


def test_a_table_whose_rows_are_all_filtered_out_gets_no_topic(tmp_path: Path) -> None:
    """As in the core: a filtered table's topic and schemas are made when a row passes, not when the lane asks."""
    frames, _ = small_transactions(7, 200)
    notes = {"name": "public.notes", "where": "id > 1000"}  # no generated row passes
    publications = [Publication.model_validate({"name": "p", "tables": [{"name": "shop.items"}, notes]})]
    rowfilter = RowFilter(FilterPlan(publications), "publish", lambda t: [], None, Plans())
    core, shaper = stages(tmp_path, False, rowfilter)
    assert through(core, shaper, frames, Lane(core, shaper)).laned > 0
    registry = shaper.registry
    assert isinstance(registry, Registry)
    assert "cdc.public.notes" not in registry.topics
    assert not [subject for subject, _ in registry.ids if subject.startswith("cdc.public.notes")]


def test_already_written_transactions_are_left_to_python(tmp_path: Path) -> None:
    """An exactly-once sink's last commit: transactions at or below it go to the core (the sink skips them)."""
    frames, _ = small_transactions(3, 40)
    commits = [struct.unpack_from(">Q", f, 27)[0] for f in frames if f[:1] == b"w" and f[25:26] == b"C"]
    core, shaper = stages(tmp_path, False)
    taken = []

    class Watching(Lane):
        def take(self, frames: list[bytes], start: int) -> tuple[int, Shaped | None]:
            stop, shaped = super().take(frames, start)
            if shaped is not None:
                taken.append(struct.unpack_from(">Q", frames[start], 26)[0])  # the Begin's final LSN
            return stop, shaped

    out = through(core, shaper, frames, Watching(core, shaper, written=lambda: commits[19]))
    assert out.laned > 0
    assert taken
    assert min(taken) > commits[19]


def mutated(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    """``frames`` with a few broken: bytes flipped, cut or added, a message kind changed, a frame lost or moved."""
    frames = list(frames)
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(frames))
        data = bytearray(frames[i])
        how = rng.randrange(6)
        if how == 0:
            at = rng.randrange(len(data))
            data[at] ^= 1 << rng.randrange(8)
        elif how == 1:
            del data[rng.randrange(len(data)) :]
        elif how == 2:
            data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 5)))
        elif how == 3 and len(data) > 25:
            data[25] = rng.choice(b"BCIUDRTMkw\x00")
        elif how == 4:
            del frames[i]
            continue
        else:
            frames.insert(rng.randrange(len(frames)), frames.pop(i))
            continue
        frames[i] = bytes(data)
    return frames


@pytest.mark.parametrize("seed", range(40))
def test_broken_frames_give_the_same_records_and_the_same_error(tmp_path: Path, seed: int) -> None:
    """Malformed input never gets past the lane as something else: it leaves the transaction to the core, which
    raises its typed error; the records before it are the same both ways (and the process never crashes)."""
    frames, _ = small_transactions(seed, 30)
    rng = random.Random(seed)
    for attempt in range(10):
        compare(tmp_path / str(attempt), mutated(rng, frames))


def test_transactions_over_the_limit_are_left_to_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lane_module, "MAX_CHANGES", 2)
    frames, count = small_transactions(11, 200)
    laned = compare(tmp_path, frames).laned
    assert count // 3 < laned < count  # one, two or three changes: most; eight: never


def test_a_call_stops_after_its_share_of_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """BATCH_RECORDS bounds what one call holds; the next call goes on at the next Begin, and nothing differs."""
    monkeypatch.setattr(lane_module, "BATCH_RECORDS", 5)
    calls = []
    take = Lane.take

    def counted(self: Lane, frames: list[bytes], start: int) -> tuple[int, Shaped | None]:
        stop, shaped = take(self, frames, start)
        calls.append(0 if shaped is None else len(shaped.records))
        return stop, shaped

    monkeypatch.setattr(Lane, "take", counted)
    frames, count = small_transactions(5, 100)
    assert compare(tmp_path, frames).laned > count // 2
    assert max(calls) < 5 + 8 * 2 + 2  # one transaction past the share at most: 8 changes, tombstones, BEGIN, END
    assert sum(calls) > 100


SALT = b"salt"
# ITEMS's key hashed, a text kept in part, a column left out; NOTES's text always null
RULES = ColumnRules(
    {
        "shop.items": TableColumns(
            "shop.items", None, frozenset({"n"}), {"id": Mask("hash", salt=SALT), "v": Mask("keep_first", 1)}
        ),
        "public.notes": TableColumns("public.notes", None, frozenset(), {"t": Mask("null")}),
    }
)


@pytest.mark.parametrize("debezium", [False, True], ids=["cdcd", "debezium"])
@pytest.mark.parametrize("seed", range(3))
def test_generated_small_transactions_with_column_rules(tmp_path: Path, seed: int, debezium: bool) -> None:
    """The lane masks and leaves out columns as the Python shaper does, and still takes the plain transactions."""
    frames, count = small_transactions(seed, 300)
    laned = compare(tmp_path, frames, debezium=debezium, columns=RULES)
    assert laned.laned > count // 2
    assert laned.error is None


def test_row_filters_read_the_values_before_the_masks(tmp_path: Path) -> None:
    """A filter on a column the rules mask (NOTES's t, always null when sent) passes the same rows as without
    the rules: filters run before the row stage applies them."""
    frames, _ = small_transactions(5, 200)
    notes = {"name": "public.notes", "where": "t = 'n'"}
    publications = [Publication.model_validate({"name": "p", "tables": [{"name": "shop.items"}, notes]})]
    plain = compare(tmp_path / "plain", frames, publications=publications)
    masked = compare(tmp_path / "masked", frames, publications=publications, columns=RULES)

    def notes_keys(out: Outcome) -> list[bytes | None]:
        return [key for topic, key, _ in out.records if topic.endswith(".notes")]

    assert notes_keys(masked) == notes_keys(plain)
    assert notes_keys(plain)


def streamed_transaction(seed: int, rows: int) -> list[bytes]:
    """One streamed transaction in four blocks: inserts, updates (some changing the key, some leaving TOAST
    out), deletes on two tables, savepoints (a new subtransaction now and then; the last, in the middle of the
    last block, rolled back), a Relation sent again inside a block; then Stream Commit."""
    rng = random.Random(seed)
    top, lsn = 900, 0x2000000
    sub = top
    messages: list[object] = [ITEMS, NOTES]
    for block in range(4):
        messages.append(StreamStart(top, block == 0))
        for i in range(rows // 4):
            if rng.random() < 0.01 or (block, i) == (3, rows // 8):  # the last: rolled back, with what follows
                sub += 1
            xid = sub
            row: Row = (str(i), rng.choice(("x", "ü€", None)), str(i * 7), rng.choice((b"\x00\xff", None, ...)))
            kind = rng.random()
            lsn += 0x40
            if kind < 0.6:
                messages.append(RowChange("insert", ITEMS, None, (*row[:3], b"\x01"), False, xid, lsn, 0))
            elif kind < 0.8:
                old = (str(i + 1), None, None, None) if kind < 0.62 else None  # a key change now and then
                messages.append(RowChange("update", ITEMS, old, row, old is not None, xid, lsn, 0))
            elif kind < 0.9:
                messages.append(RowChange("delete", ITEMS, (str(i), None, None, None), None, True, xid, lsn, 0))
            else:
                messages.append(RowChange("insert", NOTES, None, (str(i), "n"), False, xid, lsn, 0))
            if i == rows // 8 and block == 2:
                messages.append(replace(ITEMS, xid=top))
        messages.append(StreamStop())
    messages.append(StreamAbort(top, sub))
    messages.append(StreamCommit(top, 0, lsn + 0x40, lsn + 0x80, 700_000_000_000_000))
    return [xlogdata(0x2000000 + n, encode(m)) for n, m in enumerate(messages)]  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(3))
def test_a_streamed_transaction_is_encoded_from_the_frames_as_it_arrives(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its records are the core's (buffered and spilled), and the lane encoded most of its changes straight from
    the frames (every change that continues a run of its table and subtransaction)."""
    encoded = []
    take = Lane.encode

    def counted(self: Lane, frames: list[bytes], start: int) -> int:
        stop = take(self, frames, start)
        encoded.append(stop - start)
        return stop

    monkeypatch.setattr(Lane, "encode", counted)
    out = compare(tmp_path, streamed_transaction(seed, 2000), parallel=False)
    assert out.error is None
    assert len(out.records) > 1500  # 1,750 changes before the rolled back subtransaction, and tombstones
    assert sum(encoded) > 1000


def test_a_streamed_transaction_with_column_rules(tmp_path: Path) -> None:
    out = compare(tmp_path, streamed_transaction(1, 600), parallel=False, columns=RULES)
    assert out.error is None
    assert len(out.records) > 400


def test_no_lane_where_the_compiled_code_would_read_the_text_otherwise() -> None:
    """The compiled code reads UTF-8: from a SQL_ASCII database (whose bytes PostgreSQL passes on unconverted, read
    as ASCII) the loop takes neither the lane nor early encoding, which would take bytes the decoder refuses."""
    shaper = EventShaper("cdc", Registry(), clock_us=lambda: NOW_US)
    assert Lane.available(shaper, Decoder("utf-8", stage=STAGE))
    assert not Lane.available(shaper, Decoder("ascii", stage=STAGE))
    assert not Lane.available(EventShaper("cdc", Registry(), stage=PYTHON), Decoder("utf-8", stage=STAGE))
    message = encode(RowChange("insert", NOTES, None, ("1", "é"), False, None, 0, 0))  # the text: C3 A9
    ascii_decoder = Decoder("ascii", stage=STAGE)
    ascii_decoder.decode(encode(NOTES))
    with pytest.raises(DecodeError, match="ascii"):
        ascii_decoder.decode(message)


# -- the user's logical decoding messages (filtered in the core: tests/unit/test_message_prefixes.py) ---------

_NOTES = Relation(16391, "public", "notes", "f", (Column("id", 23, -1, False), Column("t", 25, -1, False)))


def _with_messages(xid: int, lsn: int, *prefixes: str) -> list[tuple[int, Message]]:
    """A transaction inserting a note, then a transactional message of each prefix."""
    body: list[tuple[int, Message]] = [
        (lsn + 0x10, RowChange("insert", _NOTES, None, (str(xid), "n"), False, None, lsn, 0))
    ]
    body += [(lsn + 0x20 + i, LogicalMessage(True, lsn + 0x20 + i, p, b"x")) for i, p in enumerate(prefixes)]
    end = lsn + 0x80
    return [(lsn, Begin(end, 0, xid)), *body, (end, Commit(0, end, end + 8, 0))]


def _message_records(tmp_path: Path, frames: list[bytes], lane: bool) -> tuple[list[tuple[str, bytes | None]], int]:
    """The topics and keys of the records the frames give, through the lane and the core or the core alone; and
    how many transactions the lane made."""
    decoder = Decoder(stage=STAGE)
    messages = MessageFilter(publish=True, prefixes=Selection.of([r"app\..*"], [], ignore_case=True))
    core = ReplicationCore(decoder, Assembler(BufferPool(1 << 20, tmp_path)), Ledger(), messages=messages)
    shaper = EventShaper("cdc", Registry(), clock_us=lambda: NOW_US, stage=STAGE)
    shaper.start_session("shop", decoder.types, Plans())
    out: list[tuple[str, bytes | None]] = []

    def act(event: Event) -> bool:
        if isinstance(event, Write):
            shaper.transaction(event.transaction, event.changes, lambda t, k, v, h: out.append((t, k)))
        elif isinstance(event, Shaped):
            out.extend((t, k) for t, k, _ in event.records)
        return False

    carry_out(frames, core, act, Lane(core, shaper) if lane else None)
    assert messages.filtered == {MESSAGES: 1}
    return out, core.stats.laned


def test_the_lane_leaves_a_transaction_holding_a_message_to_the_core_which_filters_it(tmp_path: Path) -> None:
    """The compiled lane takes no transaction with a message in it: the filter in the core sees every message."""
    frames = message_frames(
        (0x100, _NOTES),
        *_with_messages(701, 0x1000, "audit.login"),
        *_with_messages(702, 0x2000, "app.orders"),
        *_with_messages(703, 0x3000),
    )
    records, laned = _message_records(tmp_path / "lane", frames, lane=True)
    assert records == _message_records(tmp_path / "core", frames, lane=False)[0]
    assert laned == 1  # the transaction without a message
    keys = [key for topic, key in records if topic == "cdc.message"]
    assert len(keys) == 1
    assert keys[0] is not None
    assert b"app.orders" in keys[0]
