"""Avro envelope encoding: cdcd's compiled encoder vs fastavro's generic writer, envelopes/s on one core.

For a 6-column and a 20-column table (text-form values as pgoutput delivers them), times:

* ``compiled``            ``EnvelopeEncoder.encode_value`` straight from the tuple values
* ``fastavro``            ``fastavro.schemaless_writer`` of the envelope dict, the dict built from the same rows
                          (``EnvelopeEncoder.envelope_record``: text -> datums) inside the timed loop
* ``fastavro (dict only)`` the writer alone, dicts prebuilt outside the timed loop (a lower bound for it)
* ``compiled key``        ``encode_key``

Each over ``--rows`` insert events, best and median of ``--repeat``; checks that every compiled envelope equals
fastavro's bytes first (exit 1 if not). Run from the repository root::

    .venv/bin/python benchmarks/avro.py                       # 50,000 rows, best of 5
    .venv/bin/python benchmarks/avro.py --rows 5000 --repeat 2
"""

from __future__ import annotations

import argparse
import gc
import io
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import fastavro

from cdcd.avro import EnvelopeEncoder, SourceInfo, TxInfo, build_schemas
from cdcd.pgoutput.messages import Column, Relation, Row

ColumnSpec = tuple[str, int, int, bool, Callable[[int], str | None]]


def _numeric(p: int, s: int) -> int:
    return ((p << 16) | s) + 4


def _ts(i: int, day: int = 3) -> str:
    return f"2024-05-{day:02d} 12:{i // 60 % 60:02d}:{i % 60:02d}.{i * 7919 % 1_000_000:06d}+00"


TABLE_6: list[ColumnSpec] = [
    ("id", 20, -1, True, lambda i: str(1_000_000_000 + i)),
    ("name", 25, -1, False, lambda i: f"customer {i}"),
    ("qty", 23, -1, False, lambda i: str(i % 1000)),
    ("amount", 1700, _numeric(12, 2), False, lambda i: f"{i % 100_000}.{i % 100:02d}"),
    ("created_at", 1184, -1, False, _ts),
    ("active", 16, -1, False, lambda i: "t" if i % 3 else "f"),
]

TABLE_20: list[ColumnSpec] = [
    ("id", 20, -1, True, lambda i: str(1_000_000_000 + i)),
    ("customer_id", 20, -1, False, lambda i: str(i * 7 % 100_003)),
    ("status", 25, -1, False, lambda i: ("pending", "paid", "shipped", "delivered")[i % 4]),
    ("amount", 1700, _numeric(12, 2), False, lambda i: f"{i % 100_000}.{i % 100:02d}"),
    ("currency", 1042, -1, False, lambda i: ("EUR", "USD", "GBP")[i % 3]),
    ("created_at", 1184, -1, False, _ts),
    ("updated_at", 1184, -1, False, lambda i: _ts(i, 4)),
    ("note", 25, -1, False, lambda i: f"order {i} left at the front door, customer asked for a call first"),
    ("gift", 16, -1, False, lambda i: "t" if i % 5 == 0 else "f"),
    ("qty", 23, -1, False, lambda i: str(i % 12 + 1)),
    ("unit_price", 1700, _numeric(10, 2), False, lambda i: f"{i % 997}.{i % 89:02d}"),
    ("sku", 1043, -1, False, lambda i: f"SKU-{i % 50_000:06d}-{i % 7}"),
    ("email", 25, -1, False, lambda i: f"customer{i * 7 % 100_003}@example.com"),
    ("country", 1042, -1, False, lambda i: ("DE", "FR", "GB", "US", "NL")[i % 5]),
    ("ship_date", 1082, -1, False, lambda i: f"2024-06-{i % 28 + 1:02d}"),
    ("zip", 25, -1, False, lambda i: f"{10_000 + i % 89_999}"),
    ("score", 701, -1, False, lambda i: repr(i / 7919)),
    ("tags", 1009, -1, False, lambda i: "{web,promo}" if i % 3 else "{app}"),
    ("version", 23, -1, False, lambda i: str(i % 17 + 1)),
    ("deleted_at", 1184, -1, False, lambda i: None),
]

COMMIT_US = 1_714_737_600_000_000


SOURCE = SourceInfo("0.1.0", "shop", COMMIT_US, tx_id=777, commit_lsn=9_000_000, last_commit_lsn=1_000)


def build(spec: list[ColumnSpec], rows: int) -> tuple[EnvelopeEncoder, Any, list[Row], list[int]]:
    relation = Relation(
        16_384, "public", f"bench{len(spec)}", "d", tuple(Column(n, oid, mod, key) for n, oid, mod, key, _ in spec)
    )
    schemas = build_schemas(relation, "bench", {})
    encoder = EnvelopeEncoder(schemas)
    parsed = fastavro.parse_schema(schemas.envelope)
    makers = [make for *_, make in spec]
    data: list[Row] = [tuple(make(i) for make in makers) for i in range(rows)]
    lsns = [8_000_000 + 64 * i for i in range(rows)]
    return encoder, parsed, data, lsns


def run_compiled(encoder: EnvelopeEncoder, data: list[Row], lsns: list[int]) -> list[bytes]:
    encode = encoder.encode_value
    tx = TxInfo("777:1", 1, 1)
    return [encode("c", None, row, SOURCE, lsn, COMMIT_US + 5, tx) for row, lsn in zip(data, lsns, strict=True)]


def run_fastavro(encoder: EnvelopeEncoder, parsed: Any, data: list[Row], lsns: list[int]) -> list[bytes]:
    out = []
    record = encoder.envelope_record
    writer = fastavro.schemaless_writer
    tx = TxInfo("777:1", 1, 1)
    for row, lsn in zip(data, lsns, strict=True):
        buf = io.BytesIO()
        writer(buf, parsed, record("c", None, row, SOURCE, lsn, COMMIT_US + 5, tx))
        out.append(buf.getvalue())
    return out


def run_fastavro_dicts(parsed: Any, dicts: list[dict[str, Any]]) -> list[bytes]:
    out = []
    writer = fastavro.schemaless_writer
    for d in dicts:
        buf = io.BytesIO()
        writer(buf, parsed, d)
        out.append(buf.getvalue())
    return out


def cases_for(
    encoder: EnvelopeEncoder, parsed: Any, data: list[Row], lsns: list[int], dicts: list[dict[str, Any]]
) -> list[tuple[str, Callable[[], object]]]:
    return [
        ("compiled", lambda: run_compiled(encoder, data, lsns)),
        ("fastavro (dict from rows)", lambda: run_fastavro(encoder, parsed, data, lsns)),
        ("fastavro (dict prebuilt)", lambda: run_fastavro_dicts(parsed, dicts)),
        ("compiled key", lambda: [encoder.encode_key(row) for row in data]),
    ]


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    print("| table | path | envelopes/s (best) | envelopes/s (median) | µs/envelope (best) | bytes/envelope |")
    print("|---|---|---|---|---|---|")
    for label, spec in (("6 col", TABLE_6), ("20 col", TABLE_20)):
        encoder, parsed, data, lsns = build(spec, args.rows)
        compiled = run_compiled(encoder, data, lsns)
        reference = run_fastavro(encoder, parsed, data, lsns)
        if compiled != reference:
            bad = next(i for i, (a, b) in enumerate(zip(compiled, reference, strict=True)) if a != b)
            print(f"{label}: compiled envelope {bad} differs from fastavro's", file=sys.stderr)
            return 1
        tx = TxInfo("777:1", 1, 1)
        dicts = [
            encoder.envelope_record("c", None, row, SOURCE, lsn, COMMIT_US + 5, tx)
            for row, lsn in zip(data, lsns, strict=True)
        ]
        size = statistics.mean(map(len, compiled))
        cases = cases_for(encoder, parsed, data, lsns, dicts)
        for name, fn in cases:
            times = timed(fn, args.repeat)
            best, median = min(times), statistics.median(times)
            print(
                f"| {label} | {name} | {args.rows / best:,.0f} | {args.rows / median:,.0f} | "
                f"{best / args.rows * 1e6:.2f} | {size:.0f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
