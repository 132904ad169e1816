"""Fuzz cdcd's compiled row stage (cdcd._native) against the Python reference: same outcome, typed errors only.

Inputs: the pgoutput messages captured from real servers (tests/fixtures/pgoutput, each with the decoder state
it arrived in), mutated (1-4 random bytes replaced, inserted or deleted, the message cut short, or 1-3 bytes
replaced by characters of numbers, dates and arrays), plus random bytes after a valid change header. Each input
is decoded by a Decoder with the compiled stage and by one with the Python reference alone: both must return
equal messages, or both raise ``DecodeError`` with the same text. Any other exception, or a crash of the
process, is a failure. Every row change both decode is then encoded (Envelope and Key) by an EnvelopeEncoder
of each kind: the same bytes, or the same error. Every input that is an Insert, Update or Delete is also handed,
as a walsender frame, to the compiled code that encodes changes straight from the frames
(``Envelope.prepare_frames``, which parses the message itself): it must take exactly the changes the decoder and
``Envelope.prepare`` take, into the same bytes, and leave every other one (malformed, another table, a key
change, a value refused) to them.

    .venv/bin/python benchmarks/fuzz.py                       # 1,000,000 inputs (~30 s)
    .venv/bin/python benchmarks/fuzz.py --inputs 20000 --seed 7
    .venv/bin/python benchmarks/fuzz.py --envelope debezium   # the encoders in Debezium's envelope and type map

Prints the inputs, how many decoded / raised DecodeError / were encoded, and the time. Exits 1 on a difference.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cdcd.avro import EnvelopeEncoder, SourceInfo, TxInfo, build_schemas
from cdcd.pgoutput import DecodeError, Decoder
from cdcd.pgoutput.messages import Relation, RowChange
from cdcd.rowstage import STAGE
from tests.unit.test_decoder_properties import CAPTURED, State

SOURCE = SourceInfo("0.1.0", "fuzz", 1_700_000_000_000_000, tx_id=7, commit_lsn=99, last_commit_lsn=42)
TX = TxInfo("7:99", 1, 1)


_TEXTY = b'0123456789-+.:eE ,{}\\x"NaInfty'


def mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    how = rng.randrange(7)
    if how >= 5 and len(buf) > 12:  # a value's text changed, the message still well-formed: the encoder's turn
        for _ in range(rng.randint(1, 3)):
            buf[rng.randrange(12, len(buf))] = rng.choice(_TEXTY)
        return bytes(buf)
    if how == 0 and buf:
        return bytes(buf[: rng.randrange(len(buf))])
    if how == 1:
        kind = rng.choice(b"IUD")
        return bytes([kind]) + rng.randbytes(4) + rng.randbytes(rng.randrange(64))
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(buf) + 1)
        if how == 2 and at < len(buf):
            buf[at] = rng.randrange(256)
        elif how == 3:
            buf[at:at] = bytes([rng.randrange(256)])
        elif at < len(buf):
            del buf[at]
    return bytes(buf)


def decoder(state: State, native: bool) -> Decoder:
    d = Decoder(parallel_streaming=state.parallel, stage=STAGE if native else None)
    d.in_stream = state.in_stream
    d.relations = dict(state.relations)
    return d


def outcome(call: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", call(*args)
    except DecodeError as exc:
        return "DecodeError", str(exc)
    except (ValueError, TypeError, IndexError, OverflowError) as exc:
        return type(exc).__name__, str(exc)


class Encoders:
    """One encoder of each kind per relation (as the daemon builds one per table version)."""

    def __init__(self, debezium: bool = False) -> None:
        self.debezium = debezium
        self._made: dict[Relation, tuple[EnvelopeEncoder, EnvelopeEncoder]] = {}

    def get(self, relation: Relation) -> tuple[EnvelopeEncoder, EnvelopeEncoder]:
        pair = self._made.get(relation)
        if pair is None:
            schemas = build_schemas(relation, "fuzz", {}, debezium=self.debezium)
            pair = self._made[relation] = (EnvelopeEncoder(schemas, stage=STAGE), EnvelopeEncoder(schemas))
        return pair


def check_encoding(encoders: Encoders, change: RowChange) -> list[str]:
    compiled, reference = encoders.get(change.relation)
    problems = []
    args = ("u", change.old, change.new, SOURCE, change.wal_lsn, 1_700_000_000_000_000, TX)
    if outcome(compiled.encode_value, *args) != outcome(reference.encode_value, *args):
        problems.append(f"encode_value differs for {change!r}")
    if reference.schemas.key_columns:
        for row in (change.old, change.new):
            if row is not None and outcome(compiled.encode_key, row) != outcome(reference.encode_key, row):
                problems.append(f"encode_key differs for {row!r}")
    return problems


def frame(payload: bytes) -> bytes:
    """An XLogData frame (WAL start and end 0, as the decoder is given ``wal_lsn`` 0 here)."""
    return b"w" + bytes(24) + payload


def check_frames(
    encoders: Encoders, original: bytes, state: State, data: bytes, decoded: tuple[str, Any]
) -> tuple[str | None, int]:
    """``prepare_frames`` on ``data`` (mutated from ``original``, a change of a known table) against the decoder's
    ``decoded`` outcome then ``prepare``: the same change taken into the same bytes, or none. Returns the problem
    (None) and how many changes were taken."""
    at = 5 if state.in_stream else 1
    xid = int.from_bytes(original[1:5]) if state.in_stream else None
    relation = dict(state.relations).get(int.from_bytes(original[at : at + 4]))
    if relation is None or data[:1] not in (b"I", b"U", b"D"):
        return None, 0
    rows = STAGE.rows
    assert rows is not None
    envelope = encoders.get(relation)[0].envelope
    assert envelope is not None
    positions = tuple(i for i, c in enumerate(relation.columns) if c.is_key)
    expected = rows.encoded()
    change = decoded[1]
    if isinstance(change, RowChange) and change.relation.relation_id == relation.relation_id and change.xid == xid:
        envelope.prepare(change, data, positions, expected)
    got = rows.encoded()
    stop, taken, _ = envelope.prepare_frames([frame(data)], 0, relation.relation_id, len(relation.columns), xid,
                                             positions, 4096, 1 << 30, got)  # fmt: skip
    if (taken, stop, got.data()) != (len(expected), taken, expected.data()):
        return f"prepare_frames took {taken} change(s), decoder + prepare {len(expected)}", taken
    return None, taken


def run(inputs: int, seed: int, debezium: bool = False) -> int:
    rng = random.Random(seed)
    captured: list[tuple[bytes, State]] = CAPTURED
    encoders = Encoders(debezium)
    counts: Counter[str] = Counter()
    start = time.perf_counter()
    for i in range(inputs):
        original, state = captured[rng.randrange(len(captured))]
        data = mutate(rng, original)
        fast = outcome(decoder(state, True).decode, data, 0)
        slow = outcome(decoder(state, False).decode, data, 0)
        counts[fast[0]] += 1
        if fast != slow or fast[0] not in ("ok", "DecodeError"):
            print(f"input {i}: {data!r} in {state}\n  native: {fast}\n  python: {slow}")
            return 1
        if STAGE.rows is not None and original[:1] in (b"I", b"U", b"D"):
            counts["framed"] += 1
            problem, taken = check_frames(encoders, original, state, data, slow)
            counts["taken"] += taken
            if problem:
                print(f"input {i}: {data!r} in {state}\n  {problem}")
                return 1
        if isinstance(fast[1], RowChange):
            counts["encoded"] += 1
            problems = check_encoding(encoders, fast[1])
            if problems:
                print(f"input {i}: {data!r}\n  " + "\n  ".join(problems))
                return 1
    seconds = time.perf_counter() - start
    print(
        f"{inputs:,} inputs (seed {seed}) from {len(captured)} captured messages: {counts['ok']:,} decoded"
        f" ({counts['encoded']:,} row changes encoded), {counts['DecodeError']:,} DecodeError,"
        f" {counts['framed']:,} changes given to prepare_frames too ({counts['taken']:,} taken);"
        f" native and Python agree on every one; {seconds:.0f} s"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--envelope", choices=("cdcd", "debezium"), default="cdcd")
    args = parser.parse_args()
    return run(args.inputs, args.seed, args.envelope == "debezium")


if __name__ == "__main__":
    sys.exit(main())
