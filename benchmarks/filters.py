"""Row-filter evaluation: compiled ``cdcd.filters.expr`` predicates on text-form rows, evaluations/s on one core.

For the table ``(a int, b int, c text, ts timestamptz, n numeric)`` as pgoutput delivers its rows (text form),
times ``--n`` calls of the predicate of each filter over rows that cycle through matching and non-matching
values, best and median of ``--repeat``:

* ``1 clause``   ``a > 5``
* ``3 clauses``  ``a > 5 AND c = 'NSW' AND b <> 7`` (the seed example plus one)
* a few others for scale: IN list, timestamp and numeric comparisons, LIKE, a function

Run from the repository root::

    .venv/bin/python benchmarks/filters.py                 # 1,000,000 evaluations per filter, best of 5
    .venv/bin/python benchmarks/filters.py --n 100000 --repeat 2
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from collections.abc import Callable

from avro import timed  # benchmarks/ is on sys.path when run as a script

from cdcd.filters.expr import ColumnType, compile_filter, parse_filter
from cdcd.pgoutput.messages import Row

COLUMNS = [
    ColumnType("a", 23, -1),
    ColumnType("b", 23, -1),
    ColumnType("c", 25, -1),
    ColumnType("ts", 1184, -1),
    ColumnType("n", 1700, -1),
]
FILTERS = [
    ("1 clause", "a > 5"),
    ("3 clauses", "a > 5 AND c = 'NSW' AND b <> 7"),
    ("seed example", "a > 5 AND c = 'NSW'"),
    ("IN list", "c IN ('NSW', 'QLD', 'VIC')"),
    ("timestamptz", "ts >= '2024-05-03 12:00:00+00'"),
    ("numeric", "n > 10.5"),
    ("LIKE", "c LIKE 'N%'"),
    ("function", "lower(c) = 'nsw'"),
]
STATES = ("NSW", "QLD", "VIC", "ACT", "NT")


def make_rows(count: int) -> list[Row]:
    return [
        (str(i % 11), str(i % 9), STATES[i % 5], f"2024-05-03 {i % 24:02d}:{i % 60:02d}:00.{i:06d}+00", f"{i % 20}.50")
        for i in range(count)
    ]


def run(predicate: Callable[[Row], bool | None], rows: list[Row], n: int) -> int:
    matched = 0
    per_round = len(rows)
    for _ in range(n // per_round):
        for row in rows:
            if predicate(row) is True:
                matched += 1
    return matched


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--n", type=int, default=1_000_000, help="evaluations per filter (a multiple of 1,000)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    rows = make_rows(1000)
    n = max(args.n // len(rows), 1) * len(rows)
    print("| filter | expression | evaluations/s (best) | evaluations/s (median) | µs/evaluation (best) | matched |")
    print("|---|---|---|---|---|---|")
    for label, text in FILTERS:
        predicate = compile_filter(parse_filter(text), COLUMNS)
        matched = run(predicate, rows, len(rows))
        times = timed(functools.partial(run, predicate, rows, n), args.repeat)
        best, median = min(times), statistics.median(times)
        print(
            f"| {label} | `{text}` | {n / best:,.0f} | {n / median:,.0f} | {best / n * 1e6:.3f} | "
            f"{matched / len(rows):.0%} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
