"""Where to cut a table into key ranges for a parallel initial snapshot. Pure.

A table is cut on the first column of its chunk key (the primary key, or the replica identity index, both NOT
NULL): range *i* is ``cut[i-1] <= k1 < cut[i]``, the first open below and the last open above. Whatever the
cuts, every row is in exactly one range, so bounds that are off (stale statistics, rows written since) only
make the ranges uneven, never lose or repeat a row. A composite key is cut on its first column alone: rows
that share it stay in one range, which each reader reads in full key order.

The cuts come from the server (``SnapshotReader.split``):

* an integer column (``smallint``, ``integer``, ``bigint``): evenly between its current min and max, two
  index probes that need no statistics and see the rows loaded since the last ANALYZE (serial and identity
  keys, the common case, are dense);
* any other type: the column's histogram in ``pg_stats`` (``histogram_bounds``: equal-frequency bounds, as the
  planner sees the column), every type with a sort order; a column without one (never analyzed) is not cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import TypeVar

T = TypeVar("T")

INTEGER_TYPES = frozenset({"smallint", "integer", "bigint"})
RANGES_PER_CONNECTION = 4  # a range that reads slower (hot pages, wide rows) does not leave the others idle


def parts_for(estimated: int | None, chunk_size: int, parallelism: int) -> int:
    """How many ranges to cut a table of ``estimated`` rows into: up to ``RANGES_PER_CONNECTION`` per
    connection, none expected smaller than a chunk (a saved step). A table of unknown size is large (the reader
    counts the rows of a small one without statistics): as many as for a large one."""
    most = RANGES_PER_CONNECTION * parallelism
    if parallelism < 2:
        return 1
    return most if estimated is None else max(1, min(most, estimated // chunk_size))


def integer_cuts(low: int, high: int, parts: int) -> list[int]:
    """Up to ``parts - 1`` increasing cuts spreading ``[low, high]`` evenly (fewer when the span is short)."""
    span = high - low
    return sorted({low + span * i // parts for i in range(1, parts)} - {low})


def histogram_cuts(bounds: Sequence[str], parts: int) -> list[str]:
    """Up to ``parts - 1`` of a histogram's inner bounds, evenly spaced: about as many rows between two cuts."""
    buckets = len(bounds) - 1
    if buckets < 2 or parts < 2:
        return []
    picked = (bounds[round(buckets * i / parts)] for i in range(1, parts))
    return [b for b in dict.fromkeys(picked) if b not in (bounds[0], bounds[-1])]


def key_ranges(cuts: Sequence[T]) -> list[tuple[T | None, T | None]]:
    """``(lower, upper)`` of each range the ``cuts`` make (None: open), ``lower <= k < upper``."""
    edges: list[T | None] = [None, *cuts, None]
    return list(pairwise(edges))
